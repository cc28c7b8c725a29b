//! The data-parallel gradient sink: gradients all-reduced (mean) in buckets as the backward
//! pass makes them, then collected for the update.
//!
//! Each layer's gradients join the open bucket as its `vjp` hands them over; when the bucket
//! holds [`super::DataParallel::bucket_bytes`] or more it is reduced as soon as the next
//! layer hands over its gradients (the layer that filled it may still hold a view of them
//! while it does): one group of in-place all-reduces, queued on the compute stream under NCCL), while earlier layers'
//! backward passes are still to come. The last bucket is reduced when the pass ends, then
//! the sink waits for the collectives (with the communicator's deadline) and hands the
//! gradients to a [`Collect`]. Reducing in place allocates nothing, so a plan's dry run
//! (tensors of the planning backend, nothing communicated) records the same buckets and the
//! same buffers. When gradients are accumulated over micro-batches, the sums are reduced
//! once, after the last one, in the same buckets (the leaves in reverse order, as a
//! backward pass meets them).

use stax_layers::{Collect, GradSink, LayerError};
use stax_tensor::{BackendId, Grads, Params, Path, Tensor};

use super::{Bucket, DataParallel};

/// The sink of one step (see the module docs); with no [`DataParallel`], a plain [`Collect`].
pub(crate) struct ReduceSink<'a> {
    inner: Collect,
    dp: Option<&'a DataParallel>,
    /// Whether tensors are communicated (not in a plan's dry run).
    live: bool,
    summing: bool,
    open: Vec<(Path, Tensor)>,
    /// A full bucket, reduced when the next layer hands over its gradients (or the pass
    /// ends): the layer that filled it may still hold its gradients while it hands them over.
    full: Vec<(Path, Tensor)>,
    buckets: Vec<Bucket>,
}

impl<'a> ReduceSink<'a> {
    /// The sink of a step on backend `on`, summing micro-batches when `summing`.
    pub(crate) fn new(dp: Option<&'a DataParallel>, on: BackendId, summing: bool) -> Self {
        ReduceSink {
            inner: if summing {
                Collect::summing()
            } else {
                Collect::new()
            },
            live: dp.is_some_and(|d| d.collective().backend() == on),
            dp,
            summing,
            open: Vec::new(),
            full: Vec::new(),
            buckets: Vec::new(),
        }
    }

    /// Whether the step's gradients are reduced across more than one rank (then no update
    /// may happen in the backward pass: the gradient is whole only after its reduction).
    pub(crate) fn reduces(dp: Option<&DataParallel>) -> bool {
        dp.is_some_and(|d| d.world() > 1)
    }

    /// Reduces `tensors` as one bucket named by `paths`.
    fn reduce(
        &mut self,
        paths: Vec<String>,
        tensors: &mut [&mut Tensor],
    ) -> Result<(), LayerError> {
        let Some(dp) = self.dp else {
            return Ok(());
        };
        if self.live {
            dp.collective().all_reduce_mean(tensors)?;
        }
        let bytes = tensors.iter().map(|t| t.bytes() as u64).sum();
        self.buckets.push(Bucket {
            bytes,
            tensors: paths,
        });
        Ok(())
    }

    /// Reduces the full bucket, if any, and collects its gradients.
    fn flush(&mut self) -> Result<(), LayerError> {
        let mut open = std::mem::take(&mut self.full);
        if open.is_empty() {
            return Ok(());
        }
        let paths = open.iter().map(|(p, _)| p.to_string()).collect();
        let mut refs: Vec<&mut Tensor> = open.iter_mut().map(|(_, t)| t).collect();
        self.reduce(paths, &mut refs)?;
        drop(refs);
        for (path, t) in open {
            self.inner.accept(&path, Grads::leaf(t))?;
        }
        Ok(())
    }

    /// Every gradient, reduced, as a tree like `params`; the buckets are recorded on the
    /// [`DataParallel`].
    ///
    /// # Errors
    /// As [`Collect::finish`]; the collective's errors ([`stax_tensor::TensorError::Collective`]
    /// when a peer died or timed out).
    pub(crate) fn finish(mut self, params: &Params) -> Result<Grads, LayerError> {
        let Some(dp) = self.dp else {
            return std::mem::take(&mut self.inner).finish(params);
        };
        self.flush()?;
        self.full = std::mem::take(&mut self.open);
        self.flush()?;
        let mut grads = std::mem::take(&mut self.inner).finish(params)?;
        if self.summing {
            let named: Vec<String> = grads.paths().iter().map(|(p, _)| p.to_string()).collect();
            let (mut paths, mut tensors, mut bytes) = (Vec::new(), Vec::new(), 0);
            for (name, t) in named.into_iter().zip(grads.leaves_mut()).rev() {
                bytes += t.bytes() as u64;
                paths.push(name);
                tensors.push(t);
                if bytes >= dp.bucket_bytes() {
                    self.reduce(
                        std::mem::take(&mut paths),
                        &mut std::mem::take(&mut tensors),
                    )?;
                    bytes = 0;
                }
            }
            if !tensors.is_empty() {
                self.reduce(paths, &mut tensors)?;
            }
        }
        if self.live {
            dp.collective().wait()?;
        }
        dp.record_buckets(std::mem::take(&mut self.buckets));
        Ok(grads)
    }
}

impl Drop for ReduceSink<'_> {
    /// A step that failed after a bucket was queued waits for the collectives before the
    /// gradients they write are freed (their memory could be reused while NCCL writes it).
    fn drop(&mut self) {
        if self.live && !self.buckets.is_empty() {
            if let Some(dp) = self.dp {
                // the step's own error is the one reported
                let _ = dp.collective().wait();
            }
        }
    }
}

impl GradSink for ReduceSink<'_> {
    fn accept(&mut self, path: &Path, grads: Grads) -> Result<(), LayerError> {
        let Some(dp) = self.dp.filter(|_| !self.summing) else {
            return self.inner.accept(path, grads);
        };
        // the previous layer's vjp has returned: its full bucket is solely ours now
        self.flush()?;
        let leaves: Vec<Path> = grads
            .paths()
            .into_iter()
            .map(|(p, _)| path.join(&p))
            .collect();
        self.open
            .extend(leaves.into_iter().zip(grads.into_leaves()));
        let open: u64 = self.open.iter().map(|(_, t)| t.bytes() as u64).sum();
        if open >= dp.bucket_bytes() {
            self.full = std::mem::take(&mut self.open);
        }
        Ok(())
    }
}
