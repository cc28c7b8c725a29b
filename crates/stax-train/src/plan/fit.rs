//! Will it fit? A plan's allocations replayed on an allocator like the target's, under a
//! memory budget; the smallest budget a plan needs; the largest batch a budget holds.
//!
//! The plan's trace holds every allocation and free of `Trainer::new` and of two loop
//! iterations (placement and step), with their exact sizes, in order. Replaying it with
//! [`stax_alloc::replay`] on a [`SimMemory`] of `budget` bytes, with the target allocator's
//! strategy, alignment and granularity, reproduces the placement decisions, rounding and
//! fragmentation of the real run, so "fits" means the real run would not run out of memory.
//!
//! Workspace is replayed as the target allocates it: every block of an op, in order
//! ([`stax_tensor::Backend::workspace_schedule`]; the CUDA convolutions cut theirs into up to
//! four: filter copy, padded input, cuDNN workspace, bias partials), so even a tight `bfc` arena
//! fragments in the replay as it does on the device.

use std::sync::Arc;

use stax_alloc::{AllocError, Allocator, SimMemory, Strategy, replay};
use stax_layers::{Layer, SoftmaxCrossEntropy};
use stax_optim::Optimizer;
use stax_tensor::{Backend, Shape, TensorError};

use super::{Feed, MemoryPlan};
use crate::TrainError;
use crate::step::Parts;

/// The largest batch size [`max_batch_that_fits`] tries.
pub const MAX_BATCH: usize = 1 << 24;

/// How the target allocator gets memory: what a replay must copy to behave like it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AllocatorModel {
    strategy: Strategy,
    alignment: usize,
    granularity: usize,
    stream_ordered: bool,
}

impl AllocatorModel {
    pub(crate) fn of(allocator: &Allocator) -> AllocatorModel {
        let raw = allocator.backend();
        AllocatorModel {
            strategy: allocator.strategy().clone(),
            alignment: raw.alignment(),
            granularity: raw.granularity(),
            stream_ordered: raw.stream_ordered(),
        }
    }

    /// A fresh allocator like the target's over `budget` bytes, or None when the strategy
    /// cannot even start in that budget (a `bfc` arena smaller than one granule).
    fn allocator(&self, budget: u64) -> Result<Option<Arc<Allocator>>, TrainError> {
        // `caching`, `expandable` and `bfc` reserve whole granules; `platform` and `async`
        // reserve each request as it is (rounded to the alignment by the allocator).
        let granularity = match self.strategy {
            Strategy::Caching | Strategy::Expandable | Strategy::Bfc { .. } => self.granularity,
            Strategy::Platform | Strategy::Async { .. } => self.alignment,
        };
        let sim = SimMemory::new(budget, granularity)
            .with_alignment(self.alignment)
            .with_stream_ordered(self.stream_ordered);
        match Allocator::new(Arc::new(sim), self.strategy.clone()) {
            Ok(a) => Ok(Some(a)),
            Err(AllocError::Unsupported { .. } | AllocError::BackendOutOfMemory { .. }) => Ok(None),
            Err(e) => Err(TensorError::from(e).into()),
        }
    }
}

impl MemoryPlan {
    /// The same plan judged under another allocator `strategy` on the same memory (for
    /// [`MemoryPlan::fits`] and [`MemoryPlan::min_budget`]): what would the run need with a
    /// `bfc` arena instead of the caching allocator, say.
    pub fn for_strategy(mut self, strategy: Strategy) -> MemoryPlan {
        self.allocator.strategy = strategy;
        self
    }

    /// Whether the planned run (trainer set-up, then placement and step, twice) fits `budget`
    /// bytes of memory under the target's allocator: the plan's trace replayed on a simulated
    /// memory of that size with the same strategy, alignment and granularity.
    ///
    /// # Errors
    /// Allocator errors other than out of memory.
    pub fn fits(&self, budget: u64) -> Result<bool, TrainError> {
        Ok(self.releases_within(budget)?.is_some())
    }

    /// As [`MemoryPlan::fits`], with how many times the replay's allocator returned memory
    /// to the device (`backend_releases`: a caching allocator emptying its cache to make room
    /// under the budget, or a strategy that releases on every free); None when the run does
    /// not fit. A run that needs more releases in the same budget churns its memory at every
    /// step.
    ///
    /// # Errors
    /// As [`MemoryPlan::fits`].
    pub fn releases_within(&self, budget: u64) -> Result<Option<u64>, TrainError> {
        let Some(allocator) = self.allocator.allocator(budget)? else {
            return Ok(None);
        };
        match replay(&self.trace, &allocator) {
            Ok(_) => Ok(Some(allocator.stats().backend_releases)),
            Err(AllocError::OutOfMemory(_)) => Ok(None),
            Err(e) => Err(TensorError::from(e).into()),
        }
    }

    /// The smallest memory, in bytes, that the planned run fits ([`MemoryPlan::fits`]): the
    /// capacity a device (or a capped host) needs for this batch under the target's allocator.
    /// At least the peak of requested bytes; more by the allocator's rounding, granules and
    /// fragmentation.
    ///
    /// # Errors
    /// As [`MemoryPlan::fits`]; [`TensorError::InvalidArgument`] if no budget up to 2^62
    /// bytes fits.
    pub fn min_budget(&self) -> Result<u64, TrainError> {
        let (mut lo, mut hi) = (self.peak.bytes.saturating_sub(1), self.peak.bytes.max(1));
        while !self.fits(hi)? {
            lo = hi;
            hi = hi.checked_mul(2).filter(|&h| h <= 1 << 62).ok_or_else(|| {
                TensorError::InvalidArgument {
                    op: "min_budget",
                    reason: "no budget up to 2^62 bytes fits the plan".into(),
                }
            })?;
        }
        // Invariant: `lo` does not fit (or is below the peak), `hi` fits.
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.fits(mid)? {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        Ok(hi)
    }
}

/// The budget [`max_batch_that_fits`] uses by default: what the driver says is free plus what
/// the backend's allocator already holds; on a host backend, the capacity of its memory if it
/// is capped.
///
/// # Errors
/// [`TrainError::NoBudget`] when the backend reports neither; driver errors.
pub fn default_budget(backend: &dyn Backend) -> Result<u64, TrainError> {
    let held = backend.allocator().stats().reserved;
    if let Some((free, _)) = backend.driver_memory()? {
        return Ok(free.saturating_add(held));
    }
    backend
        .allocator()
        .backend()
        .capacity()
        .ok_or(TrainError::NoBudget {
            device: backend.device(),
        })
}

/// The largest batch size whose run fits `budget` bytes on `target` ([`MemoryPlan::fits`]),
/// training `model` with softmax cross-entropy and `opt`, with batches fed as `feed` says:
/// `input` gives the example shape (its batch dimension is ignored). `None` uses
/// [`default_budget`]. 0 when not even a batch of one fits; at most [`MAX_BATCH`]. A batch
/// larger than one that the backend cannot plan (say, a tensor past cuDNN's 32-bit limits)
/// counts as not fitting.
///
/// # Errors
/// [`TrainError::NoBudget`]; shape and planning errors of a batch of one.
pub fn max_batch_that_fits<L: Layer, O: Optimizer>(
    model: &L,
    input: &Shape,
    opt: &O,
    target: &Arc<dyn Backend>,
    feed: Feed,
    budget: Option<u64>,
) -> Result<usize, TrainError> {
    let parts = Parts::new(model, input, &SoftmaxCrossEntropy, opt);
    largest_batch(parts, input, target, feed, budget)
}

/// [`max_batch_that_fits`] for a step of `parts`.
pub(crate) fn largest_batch(
    parts: Parts<'_>,
    input: &Shape,
    target: &Arc<dyn Backend>,
    feed: Feed,
    budget: Option<u64>,
) -> Result<usize, TrainError> {
    let budget = match budget {
        Some(b) => b,
        None => default_budget(&**target)?,
    };
    let fits = |batch: usize| -> Result<bool, TrainError> {
        let mut dims = input.dims().to_vec();
        if let Some(n) = dims.first_mut() {
            *n = batch;
        }
        MemoryPlan::of(parts, &Shape::new(dims), target, feed)?.fits(budget)
    };
    if !fits(1)? {
        return Ok(0);
    }
    // Past batch 1, a batch the backend cannot even plan does not fit: sizing a workspace
    // by trying (cuDNN) may run out of memory, or a tensor may pass a library's 32-bit limit.
    let fits = |batch: usize| fits(batch).or(Ok::<bool, TrainError>(false));
    // Invariant: `lo` fits; `hi` does not (or is past the largest size tried).
    let (mut lo, mut hi) = (1usize, 2usize);
    while hi <= MAX_BATCH && fits(hi)? {
        lo = hi;
        hi *= 2;
    }
    let mut hi = hi.min(MAX_BATCH + 1);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}

impl MemoryPlan {
    /// Reserves on `allocator` the memory the planned loop needs: its placements and steps
    /// (the trace after the set-up) allocated and freed in order, nothing computed. The
    /// allocator then holds, cached, every segment the loop's allocations are served from, so
    /// a step of this plan asks the backend for no memory and cannot run out of it. The
    /// trainer does this at set-up when its optimizer updates parameters in the backward pass
    /// (see [`crate::Trainer::with_loss`]).
    ///
    /// # Errors
    /// The allocator's out-of-memory error when the loop does not fit, before any step ran.
    pub fn rehearse(&self, allocator: &Arc<Allocator>) -> Result<(), TrainError> {
        let events = self.trace.events[self.loop_start.min(self.trace.events.len())..].to_vec();
        let trace = stax_alloc::Trace {
            events,
            marks: Vec::new(),
        };
        replay(&trace, allocator).map_err(TensorError::from)?;
        // a reservation, not a use: peaks count from here
        allocator.reset_peak();
        Ok(())
    }
}
