//! `TensorError`: the one error type of `stax-tensor`.

use crate::{DType, Device, Shape};
use stax_alloc::AllocError;

/// Everything that can go wrong in a tensor op, a placement or a backend call.
///
/// Messages are lowercase and name the op first, e.g.
/// `conv2d: input has 3 channels but the kernel expects 4 (HWIO [3, 3, 4, 64])`.
#[derive(Debug, thiserror::Error)]
pub enum TensorError {
    // ---- shapes and dtypes ----
    /// An operand's shape does not fit the op.
    #[error("{op}: {reason} (got {got})")]
    Shape {
        /// The op that rejected the shape.
        op: &'static str,
        /// What was expected, in words.
        reason: String,
        /// The offending shape.
        got: Shape,
    },
    /// An operand has the wrong element type.
    #[error("{op}: {}expected dtype {expected}, got {got}", named(operand))]
    DType {
        /// The op.
        op: &'static str,
        /// The operand's name in the op's signature (`dy`, `w`), when the op names it.
        operand: Option<&'static str>,
        /// The dtype the op needs.
        expected: DType,
        /// The dtype it got.
        got: DType,
    },
    /// An op does not compute in this element type.
    #[error("{op}: dtype {dtype} is not supported (supported: {supported})")]
    UnsupportedDType {
        /// The op.
        op: &'static str,
        /// The dtype it got.
        dtype: DType,
        /// What it supports, in words (`f32`, `f32, bf16, f16`).
        supported: &'static str,
    },
    /// A host buffer's length does not match the tensor it is copied to or from.
    #[error("{op}: host buffer holds {got} bytes but the tensor {shape} needs {expected}")]
    HostLength {
        /// The op.
        op: &'static str,
        /// Bytes the tensor holds.
        expected: usize,
        /// Bytes the host buffer holds.
        got: usize,
        /// The tensor's shape.
        shape: Shape,
    },
    /// An argument is out of its valid range (zero stride, zero-size kernel, bad hyper-parameter).
    #[error("{op}: invalid argument: {reason}")]
    InvalidArgument {
        /// The op.
        op: &'static str,
        /// What is wrong.
        reason: String,
    },

    /// Two trees that must have one structure (parameters and gradients, say) differ.
    #[error("{op}: {source}")]
    Structure {
        /// The op.
        op: &'static str,
        /// Where they differ.
        source: crate::StructureError,
    },

    // ---- placement ----
    /// Operands of one op live on different devices.
    #[error(
        "{op}: operands on different devices ({lhs} and {rhs}); place them with Tensor::to first"
    )]
    DeviceMismatch {
        /// The op.
        op: &'static str,
        /// The device the op runs on.
        lhs: Device,
        /// The device of the other operand.
        rhs: Device,
    },
    /// Operands of one op belong to two backends opened on the same device: each has its own
    /// stream and allocator, so mixing them would race.
    #[error(
        "{op}: operands belong to two backends on {device} ({lhs} and {rhs}); use one backend per device, or place the tensor with Tensor::to"
    )]
    BackendMismatch {
        /// The op.
        op: &'static str,
        /// The device both are on.
        device: Device,
        /// The backend the op runs on.
        lhs: crate::BackendId,
        /// The other operand's backend.
        rhs: crate::BackendId,
    },
    /// An in-place op was given a tensor whose buffer is shared with another tensor.
    #[error(
        "{op}: {}a buffer it writes (an output, mask or in-place operand) is shared with another tensor (a clone or reshape view is alive); it needs sole ownership",
        named(operand)
    )]
    Aliased {
        /// The op.
        op: &'static str,
        /// The operand's name in the op's signature, when the op names it.
        operand: Option<&'static str>,
    },
    /// A tensor holds NaN or infinity where finite values are required.
    #[error("{op}: non-finite value {value} at element {index}")]
    NonFinite {
        /// The op.
        op: &'static str,
        /// Flat index of the first bad element.
        index: usize,
        /// The bad value.
        value: f32,
    },

    // ---- memory ----
    /// The allocator failed (out of memory carries a full diagnosis).
    #[error(transparent)]
    Alloc(#[from] AllocError),

    // ---- collectives ----
    /// A collective across ranks failed: a peer died, timed out or called another
    /// collective, or the communicator failed earlier.
    #[error("collective {op} on rank {rank}: {reason}")]
    Collective {
        /// The collective (`all_reduce_mean`, `broadcast`, `barrier`, `connect`, `wait`).
        op: &'static str,
        /// The rank that reports it.
        rank: usize,
        /// What happened.
        reason: String,
    },
    /// An NCCL call failed.
    #[error("nccl: {op}: {message} (ncclResult_t {code})")]
    Nccl {
        /// The call.
        op: &'static str,
        /// NCCL's result code.
        code: i32,
        /// `ncclGetErrorString` and, where there is one, `ncclGetLastError`.
        message: String,
    },

    // ---- CUDA ----
    /// No such CUDA device.
    #[error("cuda: device {ordinal} requested but {count} CUDA device(s) found")]
    NoSuchDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many the driver reports.
        count: usize,
    },
    /// A CUDA library could not be loaded.
    #[error("cuda: could not load {library}: {hint}")]
    CudaUnavailable {
        /// The library (e.g. `libcuda.so`, `libcudnn.so.9`).
        library: &'static str,
        /// How to make it loadable.
        hint: String,
    },
    /// A CUDA driver call failed.
    #[error("cuda driver: {op}: {source}")]
    Driver {
        /// The call or kernel.
        op: &'static str,
        /// cudarc's error.
        source: cudarc::driver::DriverError,
    },
    /// A cuBLAS call failed.
    #[error("cublas: {op}: {source}")]
    Cublas {
        /// The call.
        op: &'static str,
        /// cudarc's error.
        source: cudarc::cublas::result::CublasError,
    },
    /// A cuDNN call failed.
    #[error("cudnn: {op}: {source}")]
    Cudnn {
        /// The call.
        op: &'static str,
        /// cudarc's error.
        source: cudarc::cudnn::CudnnError,
    },
    /// NVRTC could not compile a kernel source.
    #[error("nvrtc: compiling {kernel} failed: {log}")]
    Compile {
        /// The kernel file.
        kernel: &'static str,
        /// NVRTC's log.
        log: String,
    },
}

/// `"{name}: "` for a named operand, else nothing (the error messages' prefix).
fn named(operand: &Option<&'static str>) -> String {
    operand.map(|o| format!("{o}: ")).unwrap_or_default()
}

impl TensorError {
    /// This error with `name` as the operand it is about, for the shape, dtype and alias
    /// errors of one operand (a shape error's reason starts with the name); others unchanged.
    pub fn for_operand(self, name: &'static str) -> TensorError {
        match self {
            TensorError::Shape { op, reason, got } => TensorError::Shape {
                op,
                reason: format!("{name}: {reason}"),
                got,
            },
            TensorError::DType {
                op, expected, got, ..
            } => TensorError::DType {
                op,
                operand: Some(name),
                expected,
                got,
            },
            TensorError::Aliased { op, .. } => TensorError::Aliased {
                op,
                operand: Some(name),
            },
            other => other,
        }
    }

    /// The allocator's diagnosis, if this is an out-of-memory.
    pub fn oom(&self) -> Option<&stax_alloc::OomReport> {
        match self {
            TensorError::Alloc(AllocError::OutOfMemory(r)) => Some(r),
            _ => None,
        }
    }
}
