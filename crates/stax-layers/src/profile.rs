//! [`Profiler`]: the time of every layer of a step, forward and backward, as the backend ran
//! it (PyTorch's profiler grouped by module, or `jax.profiler`'s trace per op, at the layer's
//! grain).
//!
//! A context with a profiler ([`crate::Cx::with_profiler`]) puts a backend [`Mark`] before and
//! after each child layer it enters ([`crate::Cx::child`]): on CUDA, events on the compute
//! stream, so a span is the device time of the work the layer queued (and any idle time of the
//! device in between); on the CPU, the host clock. Spans nest (a `serial` holds its layers);
//! a span with no child span inside is a leaf. An activation fused into the layer before it
//! (a conv's or BatchNorm's ReLU epilogue, [`crate::Layer::fuses`]) runs inside that layer's
//! span and has none of its own. The step marks its phases too
//! ([`Profiler::set_phase`]). The marks cost a few microseconds each on CUDA, and are read only
//! after the step ([`Profiler::finish`]).

use std::sync::Mutex;

use stax_tensor::{Backend, Mark, Path, TensorError};

/// One layer's time in a step.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerTime {
    /// Where the layer is in the model (`5.serial/1.parallel/0.serial/3.conv`).
    pub path: Path,
    /// Its kind (`conv`, `batch_norm`, ...; empty for a branch of a `FanOut`).
    pub kind: &'static str,
    /// The phase it ran in ([`Profiler::set_phase`]: `forward`, `backward`, ...). Inside a
    /// [`crate::Remat`] a layer has two `backward` spans of the same path: its recomputed
    /// forward pass, then its backward pass.
    pub phase: &'static str,
    /// Milliseconds from the mark before it to the mark after it.
    pub ms: f64,
    /// Whether no other layer ran inside it (its time is its own ops').
    pub leaf: bool,
}

/// What a [`Profiler`] measured: each phase's time and each layer's.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Profile {
    /// Each phase in order with its milliseconds, from its [`Profiler::set_phase`] to the
    /// next one's (the last one's to [`Profiler::stop`]).
    pub phases: Vec<(&'static str, f64)>,
    /// Every layer's span in the order they ended (a layer before the combinator holding it).
    pub layers: Vec<LayerTime>,
}

/// Collects the phases and spans of one step (see the module docs).
#[derive(Debug, Default)]
pub struct Profiler {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Every phase begun, with its mark; the last one `""` after [`Profiler::stop`].
    phases: Vec<(&'static str, Mark)>,
    /// Spans begun so far.
    begun: usize,
    spans: Vec<Span>,
}

impl Inner {
    fn phase(&self) -> &'static str {
        self.phases.last().map_or("", |p| p.0)
    }
}

#[derive(Debug)]
struct Span {
    path: Path,
    kind: &'static str,
    phase: &'static str,
    leaf: bool,
    start: Mark,
    end: Mark,
}

/// A span begun by [`Profiler::begin`], to end with [`Profiler::end`].
#[derive(Debug)]
pub(crate) struct Open {
    index: usize,
    start: Mark,
}

impl Profiler {
    /// An empty profiler.
    pub fn new() -> Profiler {
        Profiler::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts phase `phase` (a mark on `backend`); the spans begun from now on carry its name.
    ///
    /// # Errors
    /// The backend's ([`Backend::mark`]).
    pub fn set_phase(&self, backend: &dyn Backend, phase: &'static str) -> Result<(), TensorError> {
        let mark = backend.mark()?;
        self.lock().phases.push((phase, mark));
        Ok(())
    }

    /// Ends the last phase (a mark on `backend`, after the step's work is queued).
    ///
    /// # Errors
    /// The backend's ([`Backend::mark`]).
    pub fn stop(&self, backend: &dyn Backend) -> Result<(), TensorError> {
        self.set_phase(backend, "")
    }

    /// Marks the start of a layer's span on `backend`.
    pub(crate) fn begin(&self, backend: &dyn Backend) -> Result<Open, TensorError> {
        let start = backend.mark()?;
        let mut inner = self.lock();
        inner.begun += 1;
        Ok(Open {
            index: inner.begun,
            start,
        })
    }

    /// Marks the end of the span `open` of the layer of `kind` at `path`.
    pub(crate) fn end(
        &self,
        backend: &dyn Backend,
        open: Open,
        (path, kind): (Path, &'static str),
    ) -> Result<(), TensorError> {
        let end = backend.mark()?;
        let mut inner = self.lock();
        let span = Span {
            path,
            kind,
            phase: inner.phase(),
            leaf: inner.begun == open.index,
            start: open.start,
            end,
        };
        inner.spans.push(span);
        Ok(())
    }

    /// What was measured, the profiler emptied. Waits for the device to reach the last mark.
    ///
    /// # Errors
    /// The marks' errors ([`Mark::elapsed_ms`]).
    pub fn finish(&self) -> Result<Profile, TensorError> {
        let Inner { phases, spans, .. } = std::mem::take(&mut *self.lock());
        let phases = phases
            .windows(2)
            .map(|w| Ok((w[0].0, w[0].1.elapsed_ms(&w[1].1)?)))
            .collect::<Result<_, TensorError>>()?;
        let layers = spans
            .into_iter()
            .map(|s| {
                Ok(LayerTime {
                    ms: s.start.elapsed_ms(&s.end)?,
                    path: s.path,
                    kind: s.kind,
                    phase: s.phase,
                    leaf: s.leaf,
                })
            })
            .collect::<Result<_, TensorError>>()?;
        Ok(Profile { phases, layers })
    }
}
