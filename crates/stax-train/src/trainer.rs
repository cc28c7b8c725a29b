//! The training step: forward, loss, backward, Adam, with an exact memory report.
//!
//! The step's computation is one function, `run_step`, shared by [`Trainer::step`] and the
//! memory plan's dry run ([`crate::plan::MemoryPlan`]), so the plan allocates exactly what the
//! step does. The update runs last: a step that fails (out of memory, a non-finite loss)
//! leaves parameters and optimizer state as the last finished step left them.

use crate::TrainError;
use crate::plan::{self, Feed, MemoryPlan};
use crate::report::{EvalReport, MemoryReport, StepOom, StepReport};
use crate::staging::HostStaging;
use stax_alloc::{Allocator, Category, OomReport, TraceOp};
use stax_layers::{Layer, LayerError, Params, Rng, StepContext, softmax_cross_entropy};
use stax_optim::{Adam, OptState, OptimError, Optimizer};
use stax_tensor::{Backend, Shape, Tensor, TensorError};
use std::sync::Arc;
use std::time::Instant;

/// The parts of a step, in order (the plan says in which one the peak falls).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// `apply` in training mode: activations and ReLU masks are saved.
    Forward,
    /// Softmax cross-entropy and its gradient.
    Loss,
    /// `vjp` through the model: parameter gradients; activation gradients over dead buffers.
    Backward,
    /// Adam, in place.
    Update,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(match self {
            Phase::Forward => "forward",
            Phase::Loss => "loss",
            Phase::Backward => "backward",
            Phase::Update => "update",
        })
    }
}

/// One training step's computation on placed tensors: forward, loss, backward, then (only if
/// all of that worked and the loss is finite) Adam in place. `on_phase` is called as each
/// [`Phase`] starts. Returns the loss. Every temporary is freed at its last use.
///
/// # Errors
/// [`TrainError::NonFiniteLoss`] (naming `step`); layer, tensor and optimizer errors. On any
/// error `params` and `state` are unchanged.
pub(crate) fn run_step<L: Layer + ?Sized>(
    model: &L,
    params: &mut Params,
    adam: &Adam,
    state: &mut OptState,
    batch: (&Tensor, &Tensor),
    step: u64,
    on_phase: &mut dyn FnMut(Phase),
) -> Result<f32, TrainError> {
    let (x, y) = batch;
    on_phase(Phase::Forward);
    let (loss, grads) = {
        let mut cx = StepContext::training();
        let logits = model.apply(params, x.clone(), &mut cx)?;
        on_phase(Phase::Loss);
        let (loss, dlogits) = softmax_cross_entropy(&logits, y)?;
        drop(logits);
        on_phase(Phase::Backward);
        let (_, grads) = model.vjp(params, dlogits, &mut cx, false)?;
        (loss, grads)
    };
    if !loss.is_finite() {
        return Err(TrainError::NonFiniteLoss { step, loss });
    }
    on_phase(Phase::Update);
    adam.update(state, &grads, params)?;
    drop(grads);
    Ok(loss)
}

/// Checks a model input shape: NHWC with every extent positive.
pub(crate) fn check_input_shape(input: &Shape) -> Result<(), TrainError> {
    if input.rank() != 4 || input.dims().contains(&0) {
        return Err(TrainError::BatchShape {
            what: "input shape",
            expected: "NHWC [batch, height, width, channels], all positive".into(),
            got: input.clone(),
        });
    }
    Ok(())
}

/// The allocator's diagnosis inside an error, if the error is an out-of-memory.
pub(crate) fn oom_of(e: &TrainError) -> Option<&OomReport> {
    let t = match e {
        TrainError::Tensor(t)
        | TrainError::Layer(LayerError::Tensor(t))
        | TrainError::Optim(OptimError::Tensor(t)) => t,
        _ => return None,
    };
    match t {
        TensorError::Alloc(stax_alloc::AllocError::OutOfMemory(r)) => Some(r),
        _ => None,
    }
}

/// Allocations the allocator has served, per category. (Frees are not counted: when a step
/// fails, its temporaries are freed on the way out, before the error is seen.)
fn allocations(a: &Allocator) -> [u64; 7] {
    a.stats().by_category.map(|c| c.allocs)
}

/// The plan's name for the request that failed after `done[c]` allocations of each category
/// `c` succeeded: the next planned allocation of its category. A failed workspace request is
/// named after the layer of the last other allocation made (a first step's convolution
/// algorithm search allocates workspace the plan does not hold, so workspace counts need not
/// match).
fn failed_buffer(plan: &MemoryPlan, request: &OomReport, done: [u64; 7]) -> Option<String> {
    let allocs = || {
        plan.timeline
            .events
            .iter()
            .filter(|e| e.op == TraceOp::Alloc)
    };
    let ws = Category::Workspace;
    if request.category == ws {
        let others: u64 = Category::ALL
            .iter()
            .filter(|&&c| c != ws)
            .map(|c| done[c.index()])
            .sum();
        let last = usize::try_from(others).ok()?.checked_sub(1);
        let layer = match last {
            Some(k) => allocs().filter(|e| e.category != ws).nth(k)?.name.clone(),
            None => allocs().find(|e| e.category == ws)?.name.clone(),
        };
        let layer = layer.split('.').next().unwrap_or_default();
        return Some(format!("{layer}.workspace"));
    }
    let k = usize::try_from(done[request.category.index()]).ok()?;
    allocs()
        .filter(|e| e.category == request.category)
        .nth(k)
        .filter(|e| e.bytes == request.requested)
        .map(|e| e.name.clone())
}

/// A model, its parameters and Adam state on one backend.
///
/// The step is `value_and_grad` of `mean(softmax_cross_entropy(apply(params, x), y))` followed
/// by the Adam update, as in the seed's JAX loop, but with parameters and moments updated in
/// place (what `donate_argnums` buys in JAX) and every buffer freed at its last use.
#[derive(Debug)]
pub struct Trainer<L: Layer> {
    model: L,
    params: Params,
    adam: Adam,
    state: OptState,
    backend: Arc<dyn Backend>,
    input: Shape,
    steps: u64,
    staging: HostStaging,
    feed: Feed,
}

impl<L: Layer> Trainer<L> {
    /// Initializes parameters (stax's `init_fun` with `Rng::new(seed)`) for inputs of shape
    /// `input` (NHWC with the batch axis) and Adam's state, on `backend`.
    ///
    /// # Errors
    /// Shape errors before any allocation; [`TrainError::InitOutOfMemory`] when the parameters
    /// and Adam's moments do not fit.
    pub fn new(
        model: L,
        input: Shape,
        adam: Adam,
        backend: &Arc<dyn Backend>,
        seed: u64,
    ) -> Result<Self, TrainError> {
        check_input_shape(&input)?;
        let explain = |e: TrainError| match oom_of(&e) {
            Some(request) => TrainError::InitOutOfMemory {
                state_bytes: MemoryPlan::new(&model, &input, &adam, backend).map_or(0, |p| {
                    let b = p.timeline.baseline;
                    b[Category::Parameter.index()] + b[Category::OptimizerState.index()]
                }),
                request: Box::new(request.clone()),
            },
            None => e,
        };
        let (_, params) = model
            .init(&mut Rng::new(seed), &input, backend)
            .map_err(|e| explain(e.into()))?;
        let state = adam.init(&params).map_err(|e| explain(e.into()))?;
        Ok(Trainer {
            model,
            params,
            adam,
            state,
            backend: backend.clone(),
            input,
            steps: 0,
            staging: HostStaging::new()?,
            feed: Feed::Placed,
        })
    }

    /// The model.
    pub fn model(&self) -> &L {
        &self.model
    }

    /// Current parameters.
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// Current Adam state.
    pub fn state(&self) -> &OptState {
        &self.state
    }

    /// The backend everything lives on.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    fn check_batch(&self, x: &Tensor, y: &Tensor) -> Result<Shape, TrainError> {
        let want = &self.input.dims()[1..];
        if x.dims().first().is_none_or(|&n| n == 0) || &x.dims()[1..] != want {
            return Err(TrainError::BatchShape {
                what: "images",
                expected: format!("[n, {}, {}, {}] with n > 0", want[0], want[1], want[2]),
                got: x.shape().clone(),
            });
        }
        let out = self.model.output_shape(x.shape())?;
        if y.shape() != &out {
            return Err(TrainError::BatchShape {
                what: "labels",
                expected: format!("one-hot {out}"),
                got: y.shape().clone(),
            });
        }
        Ok(out)
    }

    /// One training step on a placed batch: x NHWC `[n, h, w, c]` and one-hot labels `[n, k]`,
    /// both on this trainer's backend (any batch size `n`).
    ///
    /// The allocator's peak is reset at the start, so the report's `peak` is this step's.
    /// Nothing is updated unless the forward and backward passes succeed and the loss is finite:
    /// on error (out of memory, non-finite loss) parameters and Adam state are those of the last
    /// finished step, and the allocator is coalesced ([`stax_alloc::Allocator::coalesce`]).
    ///
    /// # Errors
    /// [`TrainError::OutOfMemory`] when any allocation of the step fails, with the breakdown,
    /// the failed request, the buffer the plan says it was, and the largest batch that fits;
    /// [`TrainError::BatchShape`], [`TrainError::NonFiniteLoss`] and other tensor errors.
    pub fn step(&mut self, x: &Tensor, y: &Tensor) -> Result<StepReport, TrainError> {
        self.step_with(x, y, &mut || {})
    }

    /// [`Trainer::step`], running `meanwhile` on the host after the step's work is queued and
    /// before waiting for the device (where the next batch is gathered).
    pub(crate) fn step_with(
        &mut self,
        x: &Tensor,
        y: &Tensor,
        meanwhile: &mut dyn FnMut(),
    ) -> Result<StepReport, TrainError> {
        self.check_batch(x, y)?;
        let allocator = self.backend.allocator().clone();
        allocator.reset_peak();
        let first = allocations(&allocator);
        let start = Instant::now();
        let step = self.steps + 1;
        let loss = run_step(
            &self.model,
            &mut self.params,
            &self.adam,
            &mut self.state,
            (x, y),
            step,
            &mut |_| {},
        )
        .map_err(|e| {
            // The failed step's buffers are freed; start the next one from the state its live
            // buffers define, not from the order the unwinding freed them in.
            allocator.coalesce();
            let now = allocations(&allocator);
            let done = std::array::from_fn(|i| now[i] - first[i]);
            self.explain(e, x.dims()[0], done)
        })?;
        meanwhile();
        self.backend.synchronize()?;
        let step_ms = start.elapsed().as_secs_f64() * 1e3;
        self.steps = step;
        Ok(StepReport {
            step,
            loss,
            step_ms,
            memory: self.memory_report()?,
        })
    }

    /// Marks this trainer as fed by [`Trainer::step_prefetched`], so that its plans
    /// ([`Trainer::plan`], [`Trainer::max_batch_that_fits`], out-of-memory diagnoses) count the
    /// prefetched batch.
    pub(crate) fn set_feed(&mut self, feed: Feed) {
        self.feed = feed;
    }

    /// How batches reach this trainer's steps (what its plans assume).
    pub fn feed(&self) -> Feed {
        self.feed
    }

    /// The memory report now: the backend's allocator (peaks since the step started), its
    /// pinned staging if any, and this trainer's host staging. Host peaks are reset after
    /// reading, so each report covers the placements since the previous one.
    ///
    /// # Errors
    /// Driver errors from [`Backend::driver_memory`].
    pub fn memory_report(&self) -> Result<MemoryReport, TrainError> {
        let report = MemoryReport::read(&*self.backend)?.with_host(self.staging.allocator());
        self.staging.allocator().reset_peak();
        if let Some(pinned) = self.backend.staging_allocator() {
            pinned.reset_peak();
        }
        Ok(report)
    }

    /// Turns an out-of-memory inside step `self.steps + 1` into [`TrainError::OutOfMemory`];
    /// other errors pass through. `done` counts the step's allocations that succeeded, per
    /// category: the failed request is the plan's next one of its category.
    fn explain(&self, e: TrainError, batch: usize, done: [u64; 7]) -> TrainError {
        let Some(request) = oom_of(&e).cloned() else {
            return e;
        };
        let memory = MemoryReport::read(&*self.backend)
            .map(|m| m.with_host(self.staging.allocator()))
            .unwrap_or_default();
        let plan = self.plan(batch);
        let (buffer, planned_peak) = match &plan {
            Ok(p) => (failed_buffer(p, &request, done), Some(p.peak.bytes)),
            Err(_) => (None, None),
        };
        let max_batch = plan::default_budget(&*self.backend)
            .ok()
            .and_then(|b| self.max_batch_that_fits(Some(b)).ok());
        TrainError::OutOfMemory(Box::new(StepOom {
            step: self.steps + 1,
            batch,
            request,
            buffer,
            memory,
            planned_peak,
            max_batch,
            last_finished_step: self.steps,
        }))
    }

    /// The trainer's input shape with batch size `batch`.
    fn input_with(&self, batch: usize) -> Shape {
        let mut d = self.input.dims().to_vec();
        d[0] = batch;
        Shape::new(d)
    }

    /// The memory plan of one step with batch size `batch` on this trainer's backend, fed as
    /// [`Trainer::feed`] says (a dry run on a planning backend: nothing is allocated here).
    ///
    /// # Errors
    /// Shape errors; [`stax_tensor::TensorError`]s when the backend cannot size a workspace.
    pub fn plan(&self, batch: usize) -> Result<MemoryPlan, TrainError> {
        MemoryPlan::with_feed(
            &self.model,
            &self.input_with(batch),
            &self.adam,
            &self.backend,
            self.feed,
        )
    }

    /// The largest batch whose step fits `budget` bytes of this backend's memory (by the
    /// plan for [`Trainer::feed`], replayed on an allocator like this one's; see
    /// [`plan::max_batch_that_fits`]).
    /// `None`: the backend's free memory plus what its allocator holds
    /// ([`plan::default_budget`]).
    ///
    /// # Errors
    /// [`TrainError::NoBudget`] when `budget` is None and the backend reports no memory size;
    /// planning errors.
    pub fn max_batch_that_fits(&self, budget: Option<u64>) -> Result<usize, TrainError> {
        plan::max_batch_that_fits(
            &self.model,
            &self.input,
            &self.adam,
            &self.backend,
            self.feed,
            budget,
        )
    }

    /// Places a batch of `dataset` for this trainer (its image size), staged through the
    /// trainer's host allocator so host bytes show in the reports.
    ///
    /// # Errors
    /// As [`HostStaging::place_batch`].
    pub fn place_batch(
        &self,
        dataset: &crate::data::Dataset,
        indices: &[usize],
    ) -> Result<(Tensor, Tensor), TrainError> {
        let d = self.input.dims();
        self.staging
            .place_batch(&self.backend, dataset, indices, (d[1], d[2], d[3]))
    }

    /// The host staging the trainer places batches through.
    pub fn staging(&self) -> &HostStaging {
        &self.staging
    }

    /// Logits for a placed batch, in inference mode (nothing saved for a backward pass).
    ///
    /// # Errors
    /// Shape, device and allocation errors.
    pub fn predict(&self, x: &Tensor) -> Result<Tensor, TrainError> {
        let mut cx = StepContext::inference();
        Ok(self.model.apply(&self.params, x.clone(), &mut cx)?)
    }

    /// Mean loss and accuracy of one placed batch: `(loss, correct)`.
    ///
    /// # Errors
    /// As [`Trainer::step`]'s checks and [`Trainer::predict`].
    pub fn eval_batch(&self, x: &Tensor, y: &Tensor) -> Result<(f32, usize), TrainError> {
        self.check_batch(x, y)?;
        let logits = self.predict(x)?;
        let (loss, _) = softmax_cross_entropy(&logits, y)?;
        let k = logits.shape().last();
        let (l, t) = (logits.to_vec()?, y.to_vec()?);
        let argmax = |row: &[f32]| {
            row.iter()
                .enumerate()
                .fold(0, |best, (i, &v)| if v > row[best] { i } else { best })
        };
        let correct = l
            .chunks_exact(k)
            .zip(t.chunks_exact(k))
            .filter(|(a, b)| argmax(a) == argmax(b))
            .count();
        Ok((loss, correct))
    }
}

/// Combines per-batch `(loss, correct, size)` into an [`EvalReport`] (loss weighted by size).
pub fn summarize(batches: &[(f32, usize, usize)]) -> EvalReport {
    let examples: usize = batches.iter().map(|b| b.2).sum();
    let loss_sum: f64 = batches.iter().map(|b| b.0 as f64 * b.2 as f64).sum();
    let correct: usize = batches.iter().map(|b| b.1).sum();
    let n = examples.max(1) as f64;
    EvalReport {
        loss: (loss_sum / n) as f32,
        accuracy: (correct as f64 / n) as f32,
        examples,
    }
}

/// Gathers the examples `indices` of `dataset` on the host (resized to `hwc`, labels one-hot)
/// and places them on `backend`, tagged [`stax_tensor::Category::Input`]: images NHWC
/// `[len, h, w, c]`, labels `[len, num_classes]`. The host buffers come from a throwaway
/// [`HostStaging`]; use [`Trainer::place_batch`] (or keep a `HostStaging`) to have them counted.
///
/// # Errors
/// Data errors from [`crate::data::loader::fill_batch`]; allocation and copy errors.
pub fn place_batch(
    backend: &Arc<dyn Backend>,
    dataset: &crate::data::Dataset,
    indices: &[usize],
    hwc: (usize, usize, usize),
) -> Result<(Tensor, Tensor), TrainError> {
    HostStaging::new()?.place_batch(backend, dataset, indices, hwc)
}

impl<L: Layer> Trainer<L> {
    /// Loss and accuracy over every example of `dataset`, in batches of at most `batch_size`.
    ///
    /// # Errors
    /// Data, shape and tensor errors.
    pub fn evaluate(
        &self,
        dataset: &crate::data::Dataset,
        batch_size: usize,
    ) -> Result<EvalReport, TrainError> {
        let loader = crate::data::Loader::new(dataset.len(), batch_size.min(dataset.len()), 0)?;
        let d = self.input.dims();
        let hwc = (d[1], d[2], d[3]);
        let mut parts = Vec::new();
        for indices in loader.eval_batches() {
            let (x, y) = self
                .staging
                .place_batch(&self.backend, dataset, &indices, hwc)?;
            let (loss, correct) = self.eval_batch(&x, &y)?;
            parts.push((loss, correct, indices.len()));
        }
        Ok(summarize(&parts))
    }

    /// The input shape `[batch, h, w, c]` the trainer was built for.
    pub fn input_shape(&self) -> &Shape {
        &self.input
    }
}
