//! The `Backend` trait: the few ops stax needs, implemented by the CPU and CUDA backends.
//!
//! Ops write into caller-provided outputs (`&mut Tensor`), so the caller decides which buffer is
//! reused and which is freshly allocated: that is how the training step keeps its memory minimal.
//! Every op checks that all operands live on this backend's device
//! ([`TensorError::DeviceMismatch`]), that shapes and dtypes fit ([`TensorError::Shape`],
//! [`TensorError::DType`]) and that outputs are not shared ([`TensorError::Aliased`]).

use crate::upload::{Upload, host_source};
use crate::{Conv2dGeometry, Device, Shape, Tensor, TensorError};
use stax_alloc::{Allocation, Allocator, Strategy};
use std::fmt;
use std::sync::Arc;

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
    /// Upper bound on the workspace bytes one cuDNN call may use (CUDA only). `None`: the
    /// backend's default, which favours a low peak.
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
/// where `bias_correction1 = 1 - b1^t`, `bias_correction2 = 1 - b2^t` at step `t >= 1`.
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
}

/// One of the three passes of a 2-D convolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConvPass {
    /// `y = conv(x, w) + b` ([`Backend::conv2d`]).
    Forward,
    /// `dx` from `dy` and `w` ([`Backend::conv2d_bwd_data`]).
    BackwardData,
    /// `dw` and `db` from `x` and `dy` ([`Backend::conv2d_bwd_filter`]).
    BackwardFilter,
}

/// An op whose scratch memory a memory planner asks about ([`Backend::workspace_schedule`]):
/// the op and the sizes its workspace depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkspaceOp {
    /// One pass of a convolution of this geometry.
    Conv {
        /// Shapes, strides and padding.
        geometry: Conv2dGeometry,
        /// Which pass.
        pass: ConvPass,
    },
    /// [`Backend::matmul`] with `op(a)` `[m, k]`, `op(b)` `[k, n]`.
    Matmul {
        /// Rows of the product.
        m: usize,
        /// Columns of the product.
        n: usize,
        /// The contracted dimension.
        k: usize,
    },
    /// [`Backend::bias_grad`] of `dy` seen as `[rows, cols]`.
    BiasGrad {
        /// Rows summed over.
        rows: usize,
        /// Bias length.
        cols: usize,
    },
    /// [`Backend::softmax_xent`] of `[rows, classes]` logits.
    SoftmaxXent {
        /// Batch rows.
        rows: usize,
        /// Classes.
        classes: usize,
    },
}

/// One allocation or free of an op's workspace (tagged [`stax_alloc::Category::Workspace`]),
/// in the order the op makes them ([`Backend::workspace_schedule`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkspaceStep {
    /// Allocates this many bytes.
    Alloc(usize),
    /// Frees the schedule's `i`-th allocation (counting [`WorkspaceStep::Alloc`]s from 0).
    Free(usize),
}

impl WorkspaceStep {
    /// The schedule of an op that holds one buffer of `bytes` (none when 0).
    pub fn single(bytes: usize) -> Vec<WorkspaceStep> {
        if bytes == 0 {
            Vec::new()
        } else {
            vec![WorkspaceStep::Alloc(bytes), WorkspaceStep::Free(0)]
        }
    }

    /// The most bytes a schedule holds at once.
    ///
    /// ```
    /// use stax_tensor::WorkspaceStep::{Alloc, Free};
    /// // a filter copy (100), a padded input (50), then the library's workspace (30)
    /// let s = [Alloc(100), Alloc(50), Alloc(30), Free(2), Free(0), Free(1)];
    /// assert_eq!(stax_tensor::WorkspaceStep::peak(&s), 180);
    /// assert_eq!(stax_tensor::WorkspaceStep::peak(&[Alloc(8), Free(0), Alloc(5)]), 8);
    /// ```
    pub fn peak(schedule: &[WorkspaceStep]) -> usize {
        let mut sizes = Vec::new();
        let (mut live, mut peak) = (0usize, 0usize);
        for step in schedule {
            match *step {
                WorkspaceStep::Alloc(b) => {
                    sizes.push(b);
                    live += b;
                    peak = peak.max(live);
                }
                WorkspaceStep::Free(i) => live -= sizes.get(i).copied().unwrap_or(0),
            }
        }
        peak
    }
}

/// `(m, n, k)` of [`Backend::matmul`]'s `op(a) · op(b)` for operands of shapes `a` and `b`:
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
    const OP: &str = "softmax_xent";
    let &[n, k] = logits.dims() else {
        return Err(TensorError::Shape {
            op: OP,
            reason: "logits must be [batch, classes]".into(),
            got: logits.clone(),
        });
    };
    if n == 0 || k == 0 {
        return Err(TensorError::InvalidArgument {
            op: OP,
            reason: format!("logits {logits} have no rows or no classes"),
        });
    }
    Ok((n, k))
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

/// A compute backend: owns an allocator and computes the ops of a stax training step.
///
/// All tensors are row-major. Unless stated, ops need `F32` operands on this backend's device
/// and an output that is not shared with any other tensor.
pub trait Backend: Send + Sync + fmt::Debug {
    /// The device this backend computes on.
    fn device(&self) -> Device;

    /// This backend's identity ([`BackendId::fresh`] when it was opened).
    fn id(&self) -> BackendId;

    /// The allocator every tensor of this backend is allocated from.
    fn allocator(&self) -> &Arc<Allocator>;

    /// Conv/matmul precision in use.
    fn precision(&self) -> Precision;

    /// Copies `src` (raw little-endian element bytes) into `dst`; `src.len()` must equal
    /// `dst.bytes()`.
    fn upload(&self, src: &[u8], dst: &mut Tensor) -> Result<(), TensorError>;

    /// Starts copying host memory `src` (raw element bytes, exactly `dst.bytes()` of them)
    /// into `dst` and returns the copy in flight, which owns both until it is done: the
    /// non-blocking `.to(device, non_blocking=True)` of a pinned PyTorch tensor. The copy is
    /// ordered after all work queued before the call (`dst` may reuse memory that work
    /// freed) and overlaps work queued after it; [`Upload::wait`] returns `dst` filled. The
    /// CUDA backend copies on a second stream, from pinned memory at full speed when `src`
    /// comes from [`Backend::staging_allocator`]. The default copies synchronously.
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] when `src` is not host memory;
    /// [`TensorError::HostLength`] for a size mismatch; device and copy errors.
    fn upload_async(&self, src: Allocation, mut dst: Tensor) -> Result<Upload, TensorError> {
        self.upload(host_source("upload_async", &src, &dst)?, &mut dst)?;
        Ok(Upload::done(dst))
    }

    /// Copies `src` into `dst` (raw element bytes); `dst.len()` must equal `src.bytes()`.
    fn download(&self, src: &Tensor, dst: &mut [u8]) -> Result<(), TensorError>;

    /// Copies `src` into `dst` (same shape and dtype). The default goes through host memory;
    /// backends override it with a device-side copy.
    fn copy(&self, src: &Tensor, dst: &mut Tensor) -> Result<(), TensorError> {
        src.expect_device("copy", self.device())?;
        dst.expect_device("copy", self.device())?;
        dst.expect_dtype("copy", src.dtype())?;
        dst.expect_shape("copy", src.shape())?;
        let mut host = vec![0u8; src.bytes()];
        self.download(src, &mut host)?;
        self.upload(&host, dst)
    }

    /// Sets every element of `t` to `value` (bit pattern of `value as f32`; for `U32` tensors
    /// `value` must be 0).
    fn fill(&self, t: &mut Tensor, value: f32) -> Result<(), TensorError>;

    /// `y = conv(x, w) + b`: x NHWC `g.input_shape()`, w HWIO `g.filter_shape()`, b `[c_out]`,
    /// y NHWC `g.output_shape()` (cross-correlation, as `lax.conv_general_dilated`).
    fn conv2d(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        g: &Conv2dGeometry,
        y: &mut Tensor,
    ) -> Result<(), TensorError>;

    /// Gradient of the conv with respect to its input: `dx = conv_transpose(dy, w)`,
    /// dy NHWC `g.output_shape()`, dx NHWC `g.input_shape()` (overwritten).
    fn conv2d_bwd_data(
        &self,
        dy: &Tensor,
        w: &Tensor,
        g: &Conv2dGeometry,
        dx: &mut Tensor,
    ) -> Result<(), TensorError>;

    /// Gradients of the conv with respect to kernel and bias: dw HWIO `g.filter_shape()`,
    /// db `[c_out]` (both overwritten).
    fn conv2d_bwd_filter(
        &self,
        x: &Tensor,
        dy: &Tensor,
        g: &Conv2dGeometry,
        dw: &mut Tensor,
        db: &mut Tensor,
    ) -> Result<(), TensorError>;

    /// `y = relu(conv(x, w) + b)` with the ReLU's bit mask: what [`Backend::conv2d`] then
    /// [`Backend::relu`] with `mask` compute (the default does exactly that), in fewer passes
    /// over `y` where the backend can fuse them. `mask` is U32 of `ceil(y.numel() / 32)` words.
    fn conv2d_relu(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        g: &Conv2dGeometry,
        y: &mut Tensor,
        mask: &mut Tensor,
    ) -> Result<(), TensorError> {
        self.conv2d(x, w, b, g, y)?;
        self.relu(y, Some(mask))
    }

    /// Kernel and bias gradients of `relu(conv(x, w) + b)`: `dy`, the gradient with respect
    /// to the ReLU's output, is masked in place (the ReLU's backward), then dw and db are as
    /// [`Backend::conv2d_bwd_filter`] computes them. The default does exactly those two ops;
    /// backends may fuse the masking with the bias gradient (one pass over `dy`). Workspace:
    /// at most that of [`Backend::conv2d_bwd_filter`] at any time.
    fn conv2d_bwd_filter_relu(
        &self,
        x: &Tensor,
        dy: &mut Tensor,
        mask: &Tensor,
        g: &Conv2dGeometry,
        dw: &mut Tensor,
        db: &mut Tensor,
    ) -> Result<(), TensorError> {
        self.relu_bwd(dy, mask)?;
        self.conv2d_bwd_filter(x, dy, g, dw, db)
    }

    /// `c = op(a) · op(b)` for 2-D row-major matrices, where `op` transposes when the flag is
    /// set: `op(a)` is `[m, k]`, `op(b)` is `[k, n]`, `c` is `[m, n]` (overwritten).
    fn matmul(
        &self,
        a: &Tensor,
        b: &Tensor,
        transpose_a: bool,
        transpose_b: bool,
        c: &mut Tensor,
    ) -> Result<(), TensorError>;

    /// `y[..., j] += b[j]`, b of shape `[y.shape().last()]`.
    fn bias_add(&self, y: &mut Tensor, b: &Tensor) -> Result<(), TensorError>;

    /// `db[j] = sum of dy[..., j]` over all leading dimensions.
    fn bias_grad(&self, dy: &Tensor, db: &mut Tensor) -> Result<(), TensorError>;

    /// In-place ReLU, `x = max(x, 0)`. If `mask` is given (U32, `ceil(numel / 32)` words) bit
    /// `i % 32` of word `i / 32` is set to `x[i] > 0`, for the backward pass.
    fn relu(&self, x: &mut Tensor, mask: Option<&mut Tensor>) -> Result<(), TensorError>;

    /// In-place ReLU backward: `dy[i] = 0` where mask bit `i` is clear.
    fn relu_bwd(&self, dy: &mut Tensor, mask: &Tensor) -> Result<(), TensorError>;

    /// Softmax cross-entropy with optax's semantics, fused with its gradient.
    ///
    /// logits and labels `[n, k]` (labels are probabilities, e.g. one-hot); returns
    /// `mean_i(-sum_j labels[i, j] · log_softmax(logits)[i, j])` and writes
    /// `dlogits = (softmax(logits) - labels) / n`, the gradient of that mean.
    /// Mirrors `jnp.mean(optax.softmax_cross_entropy(logits, labels))`, computed stably
    /// (max subtracted).
    fn softmax_xent(
        &self,
        logits: &Tensor,
        labels: &Tensor,
        dlogits: &mut Tensor,
    ) -> Result<f32, TensorError>;

    /// One fused, in-place Adam step on one parameter tensor (see [`AdamHyper`]): reads
    /// p, g, m, v and writes p, m, v; all four have the same shape.
    fn adam_update(
        &self,
        p: &mut Tensor,
        g: &Tensor,
        m: &mut Tensor,
        v: &mut Tensor,
        h: &AdamHyper,
    ) -> Result<(), TensorError>;

    /// Waits until all queued work is done.
    fn synchronize(&self) -> Result<(), TensorError>;

    /// `(free, total)` device bytes as the driver reports them (`cuMemGetInfo`); `None` on the
    /// host.
    fn driver_memory(&self) -> Result<Option<(u64, u64)>, TensorError>;

    /// Every workspace allocation and free (tagged [`stax_alloc::Category::Workspace`]) one
    /// call of `op` makes, in order, in steady state (once any per-shape algorithm choice has
    /// been made). A memory planner that replays exactly this around the op reproduces the
    /// step's requested bytes and the allocator's placement decisions; empty when the op
    /// allocates nothing.
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] for invalid shapes; backend errors where answering
    /// needs the device (choosing a convolution algorithm).
    fn workspace_schedule(&self, op: &WorkspaceOp) -> Result<Vec<WorkspaceStep>, TensorError>;

    /// The most workspace bytes one call of `op` holds at once: the peak of
    /// [`Backend::workspace_schedule`].
    ///
    /// # Errors
    /// As [`Backend::workspace_schedule`].
    fn workspace_bytes(&self, op: &WorkspaceOp) -> Result<usize, TensorError> {
        Ok(WorkspaceStep::peak(&self.workspace_schedule(op)?))
    }

    /// The allocator of the pinned host memory this backend copies from and to (its staging
    /// buffers are tagged [`stax_alloc::Category::Input`]): allocate [`Backend::upload_async`]
    /// sources here for full-speed copies; reports show it as pinned host memory beside device
    /// memory. `None` (the default) when the backend has none (the CPU reads any host memory).
    fn staging_allocator(&self) -> Option<&Arc<Allocator>> {
        None
    }
}
