//! Host views of tensor buffers: the only place the CPU backend turns addresses into slices.
//!
//! On the CPU backend a tensor's [`Tensor::addr`] is a real host pointer from the allocator
//! (64-byte aligned, `bytes()` long, always initialized memory). Reads go through [`data`] /
//! [`words`]; writes through [`data_mut`] / [`words_mut`], which first require the handle to be
//! the only one to its buffer. Every view checks device, dtype, length and alignment, so a
//! tensor of another backend (whose address means nothing here) is an error, not a crash.

use crate::{DType, Device, Tensor, TensorError};
use stax_alloc::Allocation;

/// An exclusively owned host scratch buffer of f32 from the backend's allocator.
pub(super) struct Workspace {
    /// Held so the buffer lives exactly as long as the workspace; freed on drop.
    _alloc: Allocation,
    ptr: *mut f32,
    floats: usize,
}

impl Workspace {
    /// Wraps a fresh host allocation of at least `floats * 4` bytes.
    pub(super) fn new(alloc: Allocation, floats: usize) -> Result<Workspace, TensorError> {
        const OP: &str = "workspace";
        if floats.checked_mul(4).is_none_or(|b| b > alloc.bytes()) {
            return Err(TensorError::InvalidArgument {
                op: OP,
                reason: format!(
                    "allocation of {} bytes cannot hold {floats} f32",
                    alloc.bytes()
                ),
            });
        }
        let ptr = host_ptr::<f32>(OP, alloc.addr(), floats)?;
        Ok(Workspace {
            _alloc: alloc,
            ptr,
            floats,
        })
    }

    /// The whole buffer.
    pub(super) fn as_mut_slice(&mut self) -> &mut [f32] {
        if self.floats == 0 {
            return &mut [];
        }
        // SAFETY: `ptr` is the start of `_alloc`, a live host allocation of at least `floats * 4`
        // bytes (checked in `new`), non-null and aligned for f32 (checked by `host_ptr`), and
        // initialized memory as the host allocator guarantees. `_alloc` is owned by this value
        // and never shared, and `&mut self` makes the returned borrow the only access while it
        // lives.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.floats) }
    }
}

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

/// Checks that `t` is a CPU tensor of `dtype` whose buffer holds exactly its elements, and
/// returns its element count and host pointer.
fn checked_ptr<T>(
    op: &'static str,
    t: &Tensor,
    dtype: DType,
) -> Result<(*mut T, usize), TensorError> {
    t.expect_device(op, Device::Cpu)?;
    t.expect_dtype(op, dtype)?;
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

/// Read view of a CPU tensor's elements; fails unless `t` is on the CPU with `dtype`.
fn view<'a, T: bytemuck::Pod>(
    op: &'static str,
    t: &'a Tensor,
    dtype: DType,
) -> Result<&'a [T], TensorError> {
    let (ptr, len) = checked_ptr::<T>(op, t, dtype)?;
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

/// Write view of a CPU tensor's elements; fails unless `t` is on the CPU with `dtype` and is
/// the only handle to its buffer.
fn view_mut<'a, T: bytemuck::Pod>(
    op: &'static str,
    t: &'a mut Tensor,
    dtype: DType,
) -> Result<&'a mut [T], TensorError> {
    let (ptr, len) = checked_ptr::<T>(op, t, dtype)?;
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
    view(op, t, DType::F32)
}

/// The f32 elements of `t` for writing; see [`view_mut`].
pub(super) fn data_mut<'a>(
    op: &'static str,
    t: &'a mut Tensor,
) -> Result<&'a mut [f32], TensorError> {
    view_mut(op, t, DType::F32)
}

/// The u32 words of `t` (read-only), e.g. a ReLU mask.
pub(super) fn words<'a>(op: &'static str, t: &'a Tensor) -> Result<&'a [u32], TensorError> {
    view(op, t, DType::U32)
}

/// The u32 words of `t` for writing.
pub(super) fn words_mut<'a>(
    op: &'static str,
    t: &'a mut Tensor,
) -> Result<&'a mut [u32], TensorError> {
    view_mut(op, t, DType::U32)
}

/// The raw bytes of a CPU tensor of any dtype (read-only).
pub(super) fn bytes_of<'a>(op: &'static str, t: &'a Tensor) -> Result<&'a [u8], TensorError> {
    Ok(match t.dtype() {
        DType::F32 => bytemuck::cast_slice(data(op, t)?),
        DType::U32 => bytemuck::cast_slice(words(op, t)?),
    })
}

/// The raw bytes of a CPU tensor of any dtype, for writing.
pub(super) fn bytes_of_mut<'a>(
    op: &'static str,
    t: &'a mut Tensor,
) -> Result<&'a mut [u8], TensorError> {
    Ok(match t.dtype() {
        DType::F32 => bytemuck::cast_slice_mut(data_mut(op, t)?),
        DType::U32 => bytemuck::cast_slice_mut(words_mut(op, t)?),
    })
}
