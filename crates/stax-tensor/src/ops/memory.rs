//! Copies between host and device, device copies and fills.

use stax_alloc::Allocation;

use crate::backend::{Copy, CopyIn, CopyInAsync, CopyOut, Fill};
use crate::upload::host_source;
use crate::{Checked, DType, Tensor, TensorError, Upload};

use super::{backend_of, output};

fn host_length(op: &'static str, t: &Tensor, len: usize) -> Result<(), TensorError> {
    if len == t.bytes() {
        return Ok(());
    }
    Err(TensorError::HostLength {
        op,
        expected: t.bytes(),
        got: len,
        shape: t.shape().clone(),
    })
}

/// Copies `src` (raw little-endian element bytes, `dst.bytes()` of them) into `dst`.
///
/// # Errors
/// [`TensorError::HostLength`] for a size mismatch; [`TensorError::Aliased`] when `dst` is
/// shared; the device's copy errors.
pub fn upload(src: &[u8], dst: &mut Tensor) -> Result<(), TensorError> {
    const OP: &str = "upload";
    let be = backend_of(dst);
    output(OP, &be, dst, dst.dtype(), None)?;
    host_length(OP, dst, src.len())?;
    be.upload(Checked::new(CopyIn { src, dst }))
}

/// Starts copying host memory `src` (exactly `dst.bytes()` bytes, from an allocator over host
/// memory: [`crate::Backend::staging_allocator`] on CUDA for full speed) into `dst`; see
/// [`crate::MemoryOps::upload_async`].
///
/// # Errors
/// [`TensorError::InvalidArgument`] when `src` is not host memory; [`TensorError::HostLength`]
/// for a size mismatch; [`TensorError::Aliased`]; copy errors.
pub fn upload_async(src: Allocation, dst: Tensor) -> Result<Upload, TensorError> {
    const OP: &str = "upload_async";
    let be = backend_of(&dst);
    output(OP, &be, &dst, dst.dtype(), None)?;
    host_source(OP, &src, &dst)?;
    be.upload_async(Checked::new(CopyInAsync { src, dst }))
}

/// Copies `src` to the host (raw element bytes; `dst.len() == src.bytes()`).
///
/// # Errors
/// [`TensorError::HostLength`] for a size mismatch; the device's copy errors.
pub fn download(src: &Tensor, dst: &mut [u8]) -> Result<(), TensorError> {
    host_length("download", src, dst.len())?;
    backend_of(src).download(Checked::new(CopyOut { src, dst }))
}

/// Copies `src` into `dst`: same shape and dtype, one backend.
///
/// # Errors
/// [`TensorError::Shape`], [`TensorError::DType`], [`TensorError::DeviceMismatch`],
/// [`TensorError::BackendMismatch`], [`TensorError::Aliased`].
pub fn copy(src: &Tensor, dst: &mut Tensor) -> Result<(), TensorError> {
    const OP: &str = "copy";
    let be = backend_of(src);
    output(OP, &be, dst, src.dtype(), Some(src.shape()))?;
    be.copy(Checked::new(Copy { src, dst }))
}

/// Sets every element of `t` to `value` rounded to its dtype; a U32 tensor (a mask) only takes
/// 0.
///
/// # Errors
/// [`TensorError::InvalidArgument`] for a non-zero value on U32; [`TensorError::Aliased`].
pub fn fill(t: &mut Tensor, value: f32) -> Result<(), TensorError> {
    const OP: &str = "fill";
    let be = backend_of(t);
    output(OP, &be, t, t.dtype(), None)?;
    if t.dtype() == DType::U32 && value != 0.0 {
        return Err(TensorError::InvalidArgument {
            op: OP,
            reason: format!("a u32 tensor can only be filled with 0, not {value}"),
        });
    }
    be.fill(Checked::new(Fill { t, value }))
}
