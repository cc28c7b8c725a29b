//! The allocation trace of training the seed model (`stax_layers::models::seed_cnn`,
//! Adam(1e-3)), for allocator benchmarks (`alloc_bench`'s built-in `seed-step` trace,
//! `benches/alloc.rs`).
//!
//! The trace is recorded from the trainer's own code: [`MemoryPlan`] dry-runs `Trainer::new`
//! and two loop iterations (placement, step) on a planning backend with the target's workspace
//! sizes, so it is the real sequence of allocations and frees at full scale, without the
//! memory (at batch 100, 200x200x3: 7.4 GB planned in milliseconds).
//!
//! ```
//! use stax_tensor::{BackendOptions, Device};
//! let cpu = Device::Cpu.open(&BackendOptions::default())?;
//! let trace = stax_train::seed::seed_step_trace(&cpu, 2, (8, 8, 3))?;
//! // parameters, Adam's m and v and the two iterations' buffers, all with their sizes
//! assert_eq!(trace.events.iter().filter(|e| e.bytes == 8 * 8 * 64 * 128 * 4).count(), 3 + 4);
//! # Ok::<(), stax_train::TrainError>(())
//! ```

use std::sync::Arc;

use stax_alloc::Trace;
use stax_layers::models::seed_cnn;
use stax_optim::Adam;
use stax_tensor::{Backend, Shape};

use crate::{MemoryPlan, TrainError};

/// Every allocation and free of training the two-class seed model with Adam(1e-3) on batches
/// of `batch` images of `(h, w, c)`, as [`MemoryPlan::trace`] records them for `target`
/// (whose workspace sizes are used): the trainer's set-up (parameters, Adam's moments), then
/// placement and step, twice. Parameters and moments stay live at the end (a replay frees
/// them).
///
/// # Errors
/// Shape and planning errors of [`MemoryPlan::new`].
pub fn seed_step_trace(
    target: &Arc<dyn Backend>,
    batch: usize,
    (h, w, c): (usize, usize, usize),
) -> Result<Trace, TrainError> {
    let input = Shape::new([batch, h, w, c]);
    let plan = MemoryPlan::new(&seed_cnn(2), &input, &Adam::new(1e-3), target)?;
    Ok(plan.trace().clone())
}
