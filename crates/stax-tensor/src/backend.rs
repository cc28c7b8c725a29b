//! The `Backend` trait: a device's memory and the ops of a training step, in families.
//!
//! Ops come in families, one trait each: [`MemoryOps`] (copies, fills), [`ConvOps`]
//! (convolutions and pooling), [`MatmulOps`], [`ElementwiseOps`] (activations, binary ops,
//! bias), [`LossOps`], [`OptimOps`] and [`NormOps`] (batch normalization, channel bias). A
//! backend is all of them. Every op takes its operands
//! as a [`Checked`](crate::Checked) call that only the front end ([`crate::ops`]) can make: device (by backend
//! identity), dtype, shape and aliasing are checked there, once, so the CPU, CUDA and planning
//! backends compute (or, the planner, allocate) and check nothing again. Ops write into
//! caller-provided outputs (`&mut Tensor`), so the caller decides which buffer is reused and
//! which is fresh: that is how the training step keeps its memory minimal.

mod call;
mod families;
mod rows;
mod scratch;

pub use call::{
    Adam, AllFinite, BatchNorm, BatchNormBwd, BatchNormFold, BiasAdd, BiasGrad, Binary, Call, Cast,
    ChannelBiasAdd, ChannelBiasGrad, Concat, Conv2d, Conv2dBwdData, Conv2dBwdFilter, Copy, CopyIn,
    CopyInAsync, CopyOut, DenseAdam, DenseDx, Fill, FoldInputs, FoldOutputs, Matmul, MaxFrom,
    NormStats, Pool2d, Pool2dBwd, SoftmaxXent, Split, Unary, UnaryBwd,
};
pub use families::{ConvOps, ElementwiseOps, LossOps, MatmulOps, MemoryOps, NormOps, OptimOps};
pub use rows::{AxisDims, Dropout, DropoutBwd, IndexLossCall, Softmax, SoftmaxBwd};
pub use scratch::Scratch;

use crate::{Device, OpDesc, Shape, TensorError, WorkspaceStep};
use stax_alloc::{Allocator, Strategy};
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

/// The least headroom of [`Backend::allot_workspace`]'s `headroom` per backend key, over the
/// ops `key` keys (ops keyed alike take the least of their headrooms; the others are left out).
pub(crate) fn least_headroom<K: Eq + Hash>(
    headroom: &[(OpDesc, usize)],
    key: impl Fn(&OpDesc) -> Option<K>,
) -> HashMap<K, usize> {
    let mut least = HashMap::new();
    for (op, bytes) in headroom {
        if let Some(k) = key(op) {
            let entry = least.entry(k).or_insert(*bytes);
            *entry = (*entry).min(*bytes);
        }
    }
    least
}

/// Matrix-unit precision for conv and matmul, like `jax.default_matmul_precision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Precision {
    /// TF32 tensor cores on CUDA (JAX's default on Ampere and later); exact f32 on the CPU.
    #[default]
    Tf32,
    /// Full f32 everywhere (`precision="highest"`).
    Highest,
}

impl std::str::FromStr for Precision {
    type Err = TensorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "tf32" | "default" => Ok(Precision::Tf32),
            "highest" | "f32" => Ok(Precision::Highest),
            _ => Err(TensorError::InvalidArgument {
                op: "parse precision",
                reason: format!("{s:?} is not a precision; expected tf32 or highest"),
            }),
        }
    }
}

/// How to open a backend.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BackendOptions {
    /// Allocator strategy (`Default`: caching; [`BackendOptions::from_env`] reads
    /// `STAX_ALLOCATOR`).
    pub strategy: Strategy,
    /// Conv/matmul precision (CUDA only; the CPU always computes in f32).
    pub precision: Precision,
    /// Upper bound on the workspace bytes one cuDNN call (CUDA) or one im2col column buffer
    /// (CPU) may use. `None`: the backend's default, which favours a low peak, and more where
    /// the headroom rule allots it ([`Backend::allot_workspace`]); `Some`: caps that too.
    pub workspace_limit: Option<usize>,
}

impl BackendOptions {
    /// Default options with the strategy read from `STAX_ALLOCATOR`.
    ///
    /// # Errors
    /// [`TensorError::Alloc`] if `STAX_ALLOCATOR` is malformed.
    pub fn from_env() -> Result<Self, TensorError> {
        Ok(BackendOptions {
            strategy: Strategy::from_env()?,
            ..Default::default()
        })
    }
}

/// Hyper-parameters of one Adam step, with the bias corrections already computed.
///
/// Mirrors `optax.adam` (`scale_by_adam` then `scale_by_learning_rate`), Algorithm 1 of
/// Kingma & Ba 2014 with `eps` outside the square root:
/// `m = b1 m + (1 - b1) g`, `v = b2 v + (1 - b2) g²`,
/// `p -= lr · (m / bias_correction1) / (sqrt(v / bias_correction2 + eps_root) + eps)`,
/// where `bias_correction1 = 1 - b1^t`, `bias_correction2 = 1 - b2^t` at step `t >= 1`, and
/// `g` is the gradient read as f32 times `grad_scale` (1, or `1 / loss_scale` under dynamic
/// loss scaling: jmp's `DynamicLossScale.unscale`, done in f32 at the update).
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C)]
pub struct AdamHyper {
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay.
    pub b1: f32,
    /// Second-moment decay.
    pub b2: f32,
    /// Added to the denominator outside the square root.
    pub eps: f32,
    /// Added inside the square root (optax's `eps_root`, 0 by default).
    pub eps_root: f32,
    /// `1 - b1^t`.
    pub bias_correction1: f32,
    /// `1 - b2^t`.
    pub bias_correction2: f32,
    /// The gradient's factor, applied in f32 before anything else (1: the gradient as it is;
    /// a power of two is exact).
    pub grad_scale: f32,
}

/// The identity of one opened backend: unique in the process, so that tensors of two
/// backends opened on the same device (each with its own stream and allocator) are told apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendId(u64);

impl BackendId {
    /// A fresh id (ids count up from 1 in the order backends are opened).
    pub fn fresh() -> BackendId {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        BackendId(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }
}

impl fmt::Display for BackendId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "backend #{}", self.0)
    }
}

/// A compute backend: owns an allocator and computes the ops of a stax training step (all of
/// the op families above). Tensors are row-major.
pub trait Backend:
    MemoryOps
    + ConvOps
    + MatmulOps
    + ElementwiseOps
    + LossOps
    + OptimOps
    + NormOps
    + Send
    + Sync
    + fmt::Debug
{
    /// The device this backend computes on.
    fn device(&self) -> Device;

    /// This backend's identity ([`BackendId::fresh`] when it was opened).
    fn id(&self) -> BackendId;

    /// The allocator every tensor of this backend is allocated from.
    fn allocator(&self) -> &Arc<Allocator>;

    /// Conv/matmul precision in use.
    fn precision(&self) -> Precision;

    /// Waits until all queued work is done.
    ///
    /// # Errors
    /// The device's error for failed work.
    fn synchronize(&self) -> Result<(), TensorError>;

    /// `(free, total)` device bytes as the driver reports them (`cuMemGetInfo`); `None` on the
    /// host.
    ///
    /// # Errors
    /// Driver errors.
    fn driver_memory(&self) -> Result<Option<(u64, u64)>, TensorError>;

    /// Every workspace allocation and free (tagged [`stax_alloc::Category::Workspace`]) one
    /// call of `op` makes, in order: the one source both the op ([`Scratch`]) and a memory
    /// planner read. Pure: it never allocates. For an op whose workspace needs a device-side
    /// choice not yet made ([`Backend::calibrate`]), it is the documented bound of that op.
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] for invalid shapes.
    fn workspace_schedule(&self, op: &OpDesc) -> Result<Vec<WorkspaceStep>, TensorError>;

    /// The most workspace bytes one call of `op` holds at once: the peak of
    /// [`Backend::workspace_schedule`].
    ///
    /// # Errors
    /// As [`Backend::workspace_schedule`].
    fn workspace_bytes(&self, op: &OpDesc) -> Result<usize, TensorError> {
        Ok(WorkspaceStep::peak(&self.workspace_schedule(op)?))
    }

    /// Makes, on the device, any choice `op`'s workspace depends on (CUDA: cuDNN's algorithm
    /// search for a convolution pass, which allocates scratch buffers of the pass's shapes and
    /// its candidates' workspaces, then releases them), so that later
    /// [`Backend::workspace_schedule`]s of `op` are exact. An op that runs uncalibrated
    /// calibrates itself first. The default has nothing to choose.
    ///
    /// # Errors
    /// The device's errors; out of memory for the search's buffers.
    fn calibrate(&self, _op: &OpDesc) -> Result<(), TensorError> {
        Ok(())
    }

    /// Whether `op`'s workspace schedule is exact (see [`Backend::calibrate`]); true by
    /// default.
    fn is_calibrated(&self, _op: &OpDesc) -> bool {
        true
    }

    /// The headroom rule ("workspace that costs no peak", issue 12): lets each op of
    /// `headroom` hold up to that many bytes more workspace at once than its
    /// [`Backend::workspace_schedule`] holds now, where more workspace can make it faster. A
    /// caller that knows a step's peak passes, per op, the bytes the step has free below that
    /// peak while the op runs (`stax_train`'s `MemoryPlan::op_headroom`), so no schedule
    /// grows past the peak. Ops the backend keys alike (CUDA: one convolution pass of one
    /// geometry and dtype, with or without a bias; CPU: one pass of one geometry) get the least
    /// of their headrooms; an explicit [`BackendOptions::workspace_limit`] still caps each op;
    /// a schedule never shrinks. On CUDA a cuDNN pass is searched again within its allowance
    /// (calibrating it first if needed); on the CPU a convolution's im2col column buffer takes
    /// more output pixels per chunk. Returns how many entries of `headroom` changed schedule;
    /// [`Backend::revoke_workspace`] undoes it. The default changes nothing.
    ///
    /// # Errors
    /// As [`Backend::workspace_schedule`] and [`Backend::calibrate`] (a search that runs out
    /// of memory for its larger scratch keeps the pass's choice instead).
    fn allot_workspace(&self, _headroom: &[(OpDesc, usize)]) -> Result<usize, TensorError> {
        Ok(0)
    }

    /// Whether an allotment claimed `op` (or an op keyed alike): [`Backend::allot_workspace`]
    /// was given it, whether or not it widened it, and a revoke leaves it claimed at the
    /// backend's limit. A later plan must leave a claimed op out of its own allotment: the
    /// claimant planned with its workspace. False by default.
    fn workspace_allotted(&self, _op: &OpDesc) -> bool {
        false
    }

    /// Returns the claimed ops of `ops` (and ops keyed alike) to the backend's limit, still
    /// claimed ([`Backend::workspace_allotted`]): on CUDA each widened pass is searched again
    /// within the limit, on the CPU each column buffer returns to it; ops never allotted are
    /// left as they are. For a caller whose allotment made a run no longer fit the
    /// device's memory steadily (a larger block can make an allocator reserve more, even at
    /// the same peak), and for ops another plan's allotment widened (a plan made before it is
    /// stale: one plan must not pay for another's headroom). The default has nothing to drop.
    ///
    /// # Errors
    /// As [`Backend::calibrate`].
    fn revoke_workspace(&self, _ops: &[OpDesc]) -> Result<(), TensorError> {
        Ok(())
    }

    /// The allocator of the pinned host memory this backend copies from and to (its staging
    /// buffers are tagged [`stax_alloc::Category::Input`]): allocate
    /// [`MemoryOps::upload_async`] sources here for full-speed copies; reports show it as
    /// pinned host memory beside device memory. `None` (the default) when the backend has
    /// none (the CPU reads any host memory).
    fn staging_allocator(&self) -> Option<&Arc<Allocator>> {
        None
    }

    /// A [`Mark`](crate::Mark) after the work queued so far, for timing the work between two
    /// marks ([`Mark::elapsed_ms`](crate::Mark::elapsed_ms)). The default is the host clock,
    /// right for a backend whose ops have finished when they return (the CPU's).
    ///
    /// # Errors
    /// The device's errors (CUDA: `cuEventRecord`).
    fn mark(&self) -> Result<crate::Mark, TensorError> {
        Ok(crate::Mark::host())
    }

    /// This backend as the CUDA backend, for what only CUDA has (NCCL's communicator runs on
    /// its stream: [`crate::cuda::nccl::NcclCollective`]); `None` (the default) elsewhere.
    fn as_cuda(&self) -> Option<&crate::cuda::CudaBackend> {
        None
    }
}

/// `(m, n, k)` of a matmul's `op(a) · op(b)` for operands of shapes `a` and `b`:
/// `op(a)` is `[m, k]`, `op(b)` is `[k, n]` (shared by the backends' checks).
///
/// # Errors
/// [`TensorError::Shape`] (naming `op`) when an operand is not a matrix or the contracted
/// dimensions differ.
pub fn matmul_dims(
    op: &'static str,
    a: &Shape,
    b: &Shape,
    transpose_a: bool,
    transpose_b: bool,
) -> Result<(usize, usize, usize), TensorError> {
    let dims = |s: &Shape, what: &str| match *s.dims() {
        [r, c] => Ok((r, c)),
        _ => Err(TensorError::Shape {
            op,
            reason: format!("{what} must be a 2-D matrix"),
            got: s.clone(),
        }),
    };
    let ((ra, ca), (rb, cb)) = (dims(a, "a")?, dims(b, "b")?);
    let (m, k) = if transpose_a { (ca, ra) } else { (ra, ca) };
    let (k2, n) = if transpose_b { (cb, rb) } else { (rb, cb) };
    if k != k2 {
        return Err(TensorError::Shape {
            op,
            reason: format!("op(a) is [{m}, {k}] but op(b) is [{k2}, {n}]"),
            got: b.clone(),
        });
    }
    Ok((m, n, k))
}

/// `(n, k)` of softmax cross-entropy logits `[n, k]`: the shape check every backend shares.
///
/// # Errors
/// [`TensorError::Shape`] unless the logits are 2-D; [`TensorError::InvalidArgument`] if `n`
/// or `k` is 0 (the mean is undefined).
pub fn softmax_xent_dims(logits: &Shape) -> Result<(usize, usize), TensorError> {
    class_dims("softmax_xent", logits)
}

/// `(n, k)` of a loss' model outputs `[n, k]`, for the loss `op` (see [`softmax_xent_dims`]).
///
/// # Errors
/// As [`softmax_xent_dims`].
pub fn class_dims(op: &'static str, logits: &Shape) -> Result<(usize, usize), TensorError> {
    let &[n, k] = logits.dims() else {
        return Err(TensorError::Shape {
            op,
            reason: "logits must be [batch, classes]".into(),
            got: logits.clone(),
        });
    };
    if n == 0 || k == 0 {
        return Err(TensorError::InvalidArgument {
            op,
            reason: format!("logits {logits} have no rows or no classes"),
        });
    }
    Ok((n, k))
}
