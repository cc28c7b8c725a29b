//! Copies between host and device, device copies and fills.

use stax_alloc::Allocation;

use crate::backend::{Cast, Concat, Copy, CopyIn, CopyInAsync, CopyOut, Fill, Split};
use crate::upload::host_source;
use crate::{Checked, DType, Shape, Tensor, TensorError, Upload};

use super::{backend_of, input, output};

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
    output(OP, &be, dst, "dst", dst.dtype(), None)?;
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
    output(OP, &be, &dst, "dst", dst.dtype(), None)?;
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
    output(OP, &be, dst, "dst", src.dtype(), Some(src.shape()))?;
    be.copy(Checked::new(Copy { src, dst }))
}

/// `dst = src` converted to `dst`'s float dtype, element by element (read as f32, rounded to
/// nearest even; values beyond f16's range become infinities, NaN stays NaN): the cast of a
/// mixed-precision step (`jmp`'s `cast_to_compute`). Same shape, any two float dtypes (the same
/// dtype is a [`copy`]).
///
/// # Errors
/// [`TensorError::UnsupportedDType`] naming `cast` for a U32 operand; shape, device and alias
/// errors.
pub fn cast(src: &Tensor, dst: &mut Tensor) -> Result<(), TensorError> {
    const OP: &str = "cast";
    let be = backend_of(src);
    super::supports(OP, src.dtype(), super::FLOATS)?;
    super::supports(OP, dst.dtype(), super::FLOATS)?;
    if src.dtype() == dst.dtype() {
        return copy(src, dst);
    }
    input(OP, &be, src, "src", src.dtype(), None)?;
    output(OP, &be, dst, "dst", dst.dtype(), Some(src.shape()))?;
    be.cast(Checked::new(Cast { src, dst }))
}

/// Sets every element of `t` to `value` rounded to its dtype; a U32 tensor (a mask) only takes
/// 0.
///
/// # Errors
/// [`TensorError::InvalidArgument`] for a non-zero value on U32; [`TensorError::Aliased`].
pub fn fill(t: &mut Tensor, value: f32) -> Result<(), TensorError> {
    const OP: &str = "fill";
    let be = backend_of(t);
    output(OP, &be, t, "t", t.dtype(), None)?;
    if t.dtype() == DType::U32 && value != 0.0 {
        return Err(TensorError::InvalidArgument {
            op: OP,
            reason: format!("a u32 tensor can only be filled with 0, not {value}"),
        });
    }
    be.fill(Checked::new(Fill { t, value }))
}

/// `axis` of tensors of rank `rank`, from a stax-style axis (negative counts from the end).
///
/// # Errors
/// [`TensorError::InvalidArgument`] when it is out of range.
pub fn axis_of(op: &'static str, axis: isize, rank: usize) -> Result<usize, TensorError> {
    let a = if axis < 0 { axis + rank as isize } else { axis };
    usize::try_from(a)
        .ok()
        .filter(|&a| a < rank)
        .ok_or_else(|| TensorError::InvalidArgument {
            op,
            reason: format!("axis {axis} is out of range for rank {rank}"),
        })
}

/// The shape of `pieces` concatenated along `axis`: every piece of one rank, with the extents
/// of the first on every other axis.
///
/// # Errors
/// [`TensorError::Shape`] naming the first piece that does not fit, or whose extent along
/// `axis` makes the sum overflow `usize`.
pub fn concat_shape(
    op: &'static str,
    axis: usize,
    pieces: &[&Shape],
) -> Result<Shape, TensorError> {
    let first = pieces.first().ok_or_else(|| TensorError::InvalidArgument {
        op,
        reason: "nothing to concatenate".into(),
    })?;
    let mut dims = first.dims().to_vec();
    if axis >= dims.len() {
        return Err(TensorError::InvalidArgument {
            op,
            reason: format!("axis {axis} is out of range for rank {}", dims.len()),
        });
    }
    dims[axis] = 0;
    for (i, s) in pieces.iter().enumerate() {
        let fits = s.rank() == first.rank()
            && s.dims()
                .iter()
                .zip(first.dims())
                .enumerate()
                .all(|(k, (a, b))| k == axis || a == b);
        if !fits {
            return Err(TensorError::Shape {
                op,
                reason: format!(
                    "piece {i} does not match piece 0 ({first}) on every axis but {axis}"
                ),
                got: (*s).clone(),
            });
        }
        dims[axis] = dims[axis]
            .checked_add(s.dims()[axis])
            .ok_or_else(|| TensorError::Shape {
                op,
                reason: format!("the pieces' sizes along axis {axis} overflow usize"),
                got: (*s).clone(),
            })?;
    }
    Ok(Shape::new(dims))
}

/// `out` = `inputs` concatenated along `axis` (`jnp.concatenate`): one rank, dtype (not u32
/// masks' bits: whole words) and backend, equal extents on every other axis; `out` of the
/// concatenated shape.
///
/// # Errors
/// Shape, dtype, device and alias errors.
pub fn concat(axis: usize, inputs: &[&Tensor], out: &mut Tensor) -> Result<(), TensorError> {
    const OP: &str = "concat";
    let be = backend_of(out);
    let shapes: Vec<&Shape> = inputs.iter().map(|t| t.shape()).collect();
    let shape = concat_shape(OP, axis, &shapes)?;
    for t in inputs {
        input(OP, &be, t, "an input", out.dtype(), None)?;
    }
    output(OP, &be, out, "out", out.dtype(), Some(&shape))?;
    be.concat(Checked::new(Concat { axis, inputs, out }))
}

/// `outs` = consecutive pieces of `src` along `axis` (the reverse of [`concat()`]): their
/// shapes concatenate to `src`'s.
///
/// # Errors
/// Shape, dtype, device and alias errors.
pub fn split(axis: usize, src: &Tensor, outs: &mut [Tensor]) -> Result<(), TensorError> {
    const OP: &str = "split";
    let be = backend_of(src);
    let shapes: Vec<&Shape> = outs.iter().map(|t| t.shape()).collect();
    let shape = concat_shape(OP, axis, &shapes)?;
    input(OP, &be, src, "src", src.dtype(), Some(&shape))?;
    for t in outs.iter() {
        output(OP, &be, t, "an output", src.dtype(), None)?;
    }
    be.split(Checked::new(Split { axis, src, outs }))
}
