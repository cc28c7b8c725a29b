//! Host views of tensor buffers: the only place the CPU backend turns addresses into slices.
//!
//! On the CPU backend a tensor's [`Tensor::addr`] is a real host pointer from the allocator
//! (64-byte aligned, `bytes()` long, always initialized memory). Reads go through [`data`] /
//! [`words`]; writes through [`data_mut`] / [`words_mut`], which first require the handle to be
//! the only one to its buffer. Every view checks device, dtype, length and alignment, so a
//! tensor of another backend (whose address means nothing here) is an error, not a crash.

use crate::{Device, Element, Tensor, TensorError};

/// The host pointer behind `addr`, checked non-null and aligned for `T` (unless `len == 0`).
fn host_ptr<T>(op: &'static str, addr: u64, len: usize) -> Result<*mut T, TensorError> {
    let addr = usize::try_from(addr).map_err(|_| TensorError::InvalidArgument {
        op,
        reason: format!("address {addr:#x} is not a host address"),
    })?;
    if len > 0 && (addr == 0 || addr % align_of::<T>() != 0) {
        return Err(TensorError::InvalidArgument {
            op,
            reason: format!("buffer address {addr:#x} is null or misaligned"),
        });
    }
    Ok(addr as *mut T)
}

/// Checks that `t` is a CPU tensor of `T`'s dtype whose buffer holds exactly its elements,
/// and returns its element count and host pointer.
fn checked_ptr<T: Element>(op: &'static str, t: &Tensor) -> Result<(*mut T, usize), TensorError> {
    t.expect_device(op, Device::Cpu)?;
    t.expect_dtype(op, T::DTYPE)?;
    let len = t.numel();
    if len.checked_mul(size_of::<T>()) != Some(t.bytes()) {
        return Err(TensorError::Shape {
            op,
            reason: format!(
                "buffer of {} bytes does not hold the tensor's elements",
                t.bytes()
            ),
            got: t.shape().clone(),
        });
    }
    Ok((host_ptr::<T>(op, t.addr(), len)?, len))
}

/// Read view of a CPU tensor's elements; fails unless `t` is on the CPU with `T`'s dtype.
pub(super) fn view<'a, T: Element>(
    op: &'static str,
    t: &'a Tensor,
) -> Result<&'a [T], TensorError> {
    let (ptr, len) = checked_ptr::<T>(op, t)?;
    if len == 0 {
        return Ok(&[]);
    }
    // SAFETY: on the CPU backend `t.addr()` is a host allocation of `t.bytes() == len *
    // size_of::<T>()` bytes (checked), non-null and aligned (checked), always initialized, and
    // any bit pattern is a valid `T` (`Pod`). `t` holds an `Arc` to the allocation, so it
    // outlives the borrow `'a`. Nobody writes it meanwhile: writers need `&mut` to a handle that
    // is the only one to the buffer (`view_mut`), and `t` is a second handle or that one borrowed.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// Write view of a CPU tensor's elements; fails unless `t` is on the CPU with `T`'s dtype and
/// is the only handle to its buffer.
pub(super) fn view_mut<'a, T: Element>(
    op: &'static str,
    t: &'a mut Tensor,
) -> Result<&'a mut [T], TensorError> {
    let (ptr, len) = checked_ptr::<T>(op, t)?;
    t.expect_unique(op)?;
    if len == 0 {
        return Ok(&mut []);
    }
    // SAFETY: as in `view` for validity and lifetime. Exclusivity: `t` is the only handle to
    // its buffer (`expect_unique`) and we hold it by `&mut` for `'a`, so no other handle can be
    // created or read through meanwhile; distinct allocations never overlap, so no other
    // tensor's view aliases this one.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
}

/// The f32 elements of `t` (read-only); see [`view`].
pub(super) fn data<'a>(op: &'static str, t: &'a Tensor) -> Result<&'a [f32], TensorError> {
    view(op, t)
}

/// The f32 elements of `t` for writing; see [`view_mut`].
pub(super) fn data_mut<'a>(
    op: &'static str,
    t: &'a mut Tensor,
) -> Result<&'a mut [f32], TensorError> {
    view_mut(op, t)
}

/// The u32 words of `t` (read-only), e.g. a ReLU mask.
pub(super) fn words<'a>(op: &'static str, t: &'a Tensor) -> Result<&'a [u32], TensorError> {
    view(op, t)
}

/// The u32 words of `t` for writing.
pub(super) fn words_mut<'a>(
    op: &'static str,
    t: &'a mut Tensor,
) -> Result<&'a mut [u32], TensorError> {
    view_mut(op, t)
}

/// The raw bytes of a CPU tensor of any dtype (read-only).
pub(super) fn bytes_of<'a>(op: &'static str, t: &'a Tensor) -> Result<&'a [u8], TensorError> {
    crate::with_float!(t.dtype(), T => Ok(bytemuck::cast_slice(view::<T>(op, t)?)),
        Ok(bytemuck::cast_slice(words(op, t)?)))
}

/// The raw bytes of a CPU tensor of any dtype, for writing.
pub(super) fn bytes_of_mut<'a>(
    op: &'static str,
    t: &'a mut Tensor,
) -> Result<&'a mut [u8], TensorError> {
    crate::with_float!(t.dtype(), T => Ok(bytemuck::cast_slice_mut(view_mut::<T>(op, t)?)),
        Ok(bytemuck::cast_slice_mut(words_mut(op, t)?)))
}
