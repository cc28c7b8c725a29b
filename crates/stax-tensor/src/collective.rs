//! Collectives across processes: the data-parallel step's all-reduce of gradients, the
//! broadcast of parameters from rank 0 and a barrier, one [`Collective`] per process (one
//! rank), as `torch.distributed` and multi-host JAX run them.
//!
//! Two implementations share the trait: [`TcpCollective`] (host memory of the CPU backend,
//! std's TCP on a star around rank 0: the CPU backend's multi-process tests) and, on CUDA,
//! [`crate::cuda::nccl::NcclCollective`] (NCCL on the backend's compute stream). Both reduce
//! in place: a collective allocates nothing from the backend's allocator; what it holds
//! outside it is [`Collective::outside_bytes`]. Every blocking wait has a deadline, so a dead
//! or stuck peer is [`TensorError::Collective`] on every live rank, never a hang.

mod tcp;

pub use tcp::{MAX_WORLD, TcpCollective, TcpRoot};

use std::fmt;
use std::time::Duration;

use std::sync::Arc;

use crate::{Backend, BackendId, DType, Tensor, TensorError};

/// Memory a communicator holds outside the backend's allocator, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommMemory {
    /// Device bytes the library took (NCCL: the driver's free memory before its
    /// communicator's set-up and first collective minus after); `None` on the host.
    pub device: Option<u64>,
    /// Host bytes of the communicator's own buffers (TCP: rank 0's receive chunk).
    pub host: u64,
}

/// One rank of a group of processes that reduce, broadcast and synchronize together. Every
/// rank must call the same collectives in the same order with tensors of the same shapes.
pub trait Collective: Send + Sync + fmt::Debug {
    /// This process's rank, `0..world`.
    fn rank(&self) -> usize;

    /// The number of ranks.
    fn world(&self) -> usize;

    /// The library under it (`tcp`, `nccl`).
    fn library(&self) -> &'static str;

    /// The backend whose tensors it communicates.
    fn backend(&self) -> BackendId;

    /// Replaces every tensor (f32, each the only handle to its buffer) by the mean over the
    /// ranks of that tensor, in place, the same values on every rank; the tensors are reduced
    /// as one group (NCCL: one `ncclGroupStart`/`End`).
    ///
    /// # Errors
    /// [`TensorError::DType`] for a tensor not f32, [`TensorError::Aliased`],
    /// [`TensorError::BackendMismatch`]; [`TensorError::Collective`] when a peer died, timed
    /// out or called another collective.
    fn all_reduce_mean(&self, tensors: &mut [&mut Tensor]) -> Result<(), TensorError>;

    /// Overwrites every tensor (any dtype, each the only handle to its buffer) with rank 0's.
    ///
    /// # Errors
    /// As [`Collective::all_reduce_mean`], any dtype accepted.
    fn broadcast(&self, tensors: &mut [&mut Tensor]) -> Result<(), TensorError>;

    /// Returns when every rank has called it.
    ///
    /// # Errors
    /// [`TensorError::Collective`] (a peer died or timed out).
    fn barrier(&self) -> Result<(), TensorError>;

    /// Waits until every collective queued so far is done (NCCL runs them on the stream;
    /// TCP's are done when they return), within the timeout.
    ///
    /// # Errors
    /// [`TensorError::Collective`] when the deadline passes (the communicator is aborted) or
    /// the library reports an asynchronous error.
    fn wait(&self) -> Result<(), TensorError>;

    /// What the communicator holds outside the allocator.
    fn outside_bytes(&self) -> CommMemory;

    /// How long a blocking wait may take before it fails.
    fn timeout(&self) -> Duration;
}

/// Checks the tensors of a collective: on `backend`, each the only handle to its buffer,
/// f32 unless `any_dtype`.
pub(crate) fn check_tensors(
    op: &'static str,
    backend: &Arc<dyn Backend>,
    tensors: &[&mut Tensor],
    any_dtype: bool,
) -> Result<(), TensorError> {
    for t in tensors {
        t.expect_on(op, backend)?;
        if !any_dtype {
            t.expect_dtype(op, DType::F32)?;
        }
        t.expect_unique(op)?;
    }
    Ok(())
}

/// A [`TensorError::Collective`] of rank `rank` in `op`.
pub(crate) fn failed(op: &'static str, rank: usize, reason: impl Into<String>) -> TensorError {
    TensorError::Collective {
        op,
        rank,
        reason: reason.into(),
    }
}
