//! The `async` strategy: pass-through to a stream-ordered backend pool (`cuMemAllocAsync` /
//! `cuMemFreeAsync`), which does its own caching. The allocator keeps its exact counters and
//! categories; `reserved` counts what the pool has handed to live allocations. The pool's
//! release threshold is set explicitly at start-up, since CUDA's default of 0 returns memory
//! to the device at every synchronization (rapidsai/rmm#2379); `empty_cache` trims the pool.

use crate::strategy::Strategy;
use crate::strategy::platform::Direct;
use crate::{AllocError, RawMemory};

/// Builds the async pool.
///
/// # Errors
/// [`AllocError::Unsupported`] when the backend is not stream-ordered; the backend's error
/// when it refuses the release threshold.
pub(crate) fn new(
    raw: &dyn RawMemory,
    release_threshold: u64,
    strategy: &Strategy,
) -> Result<Direct, AllocError> {
    if !raw.stream_ordered() {
        return Err(AllocError::Unsupported {
            strategy: strategy.to_string(),
            backend: raw.name(),
            reason: "the backend is not a stream-ordered pool (cuMemAllocAsync); use caching or \
                     platform (or bfc, where the backend reports its free memory)"
                .into(),
        });
    }
    raw.set_release_threshold(release_threshold)?;
    Ok(Direct::new(raw, true))
}
