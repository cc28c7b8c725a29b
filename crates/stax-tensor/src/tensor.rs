//! `Tensor`: a shape, a dtype and an allocator-owned buffer on one backend.

use crate::{Backend, DType, Device, Element, Float, Shape, TensorError, ops};
use stax_alloc::{Allocation, Category, Name, Tag};
use std::fmt;
use std::sync::Arc;

/// An n-dimensional row-major array on one backend.
///
/// Cloning a tensor (or [`Tensor::reshape`]) makes another handle to the same buffer, like a
/// JAX array; the buffer is freed when its last handle drops. In-place ops take `&mut Tensor` and
/// fail with [`TensorError::Aliased`] while another handle to the buffer is alive, so a value
/// that something else still reads is never overwritten.
#[derive(Clone)]
pub struct Tensor {
    shape: Shape,
    dtype: DType,
    buf: Arc<Allocation>,
    backend: Arc<dyn Backend>,
}

impl Tensor {
    /// A tensor whose contents are unspecified (on the host: zeros or values left by an earlier
    /// tensor; never uninitialized memory). Allocates `shape.numel() * dtype.size_bytes()` bytes
    /// tagged `tag` (a [`Category`], or a [`Tag`] with the buffer's role, named in the
    /// allocator's current scope: `2.conv/output`).
    ///
    /// # Errors
    /// [`TensorError::Alloc`] when the allocator cannot serve the request (out of memory carries
    /// the diagnosis); [`TensorError::InvalidArgument`] if the byte count overflows.
    pub fn empty(
        backend: &Arc<dyn Backend>,
        shape: impl Into<Shape>,
        dtype: DType,
        tag: impl Into<Tag>,
    ) -> Result<Tensor, TensorError> {
        let shape = shape.into();
        let bytes = shape
            .checked_numel()
            .and_then(|n| n.checked_mul(dtype.size_bytes()))
            .ok_or_else(|| TensorError::InvalidArgument {
                op: "alloc",
                reason: format!("shape {shape} of {dtype} overflows the address space"),
            })?;
        let buf = backend
            .allocator()
            .allocate_tensor(bytes, tag, shape.dims(), dtype.name())?;
        Ok(Tensor {
            shape,
            dtype,
            buf: Arc::new(buf),
            backend: backend.clone(),
        })
    }

    /// An f32 tensor of zeros.
    ///
    /// # Errors
    /// As [`Tensor::empty`].
    pub fn zeros(
        backend: &Arc<dyn Backend>,
        shape: impl Into<Shape>,
        tag: impl Into<Tag>,
    ) -> Result<Tensor, TensorError> {
        let mut t = Tensor::empty(backend, shape, DType::F32, tag)?;
        ops::fill(&mut t, 0.0)?;
        Ok(t)
    }

    /// A tensor of `T`'s dtype holding a copy of `data` (row-major, `data.len() ==
    /// shape.numel()`).
    ///
    /// # Errors
    /// [`TensorError::HostLength`] on a length mismatch; otherwise as [`Tensor::empty`].
    pub fn from_slice<T: Element>(
        backend: &Arc<dyn Backend>,
        data: &[T],
        shape: impl Into<Shape>,
        tag: impl Into<Tag>,
    ) -> Result<Tensor, TensorError> {
        let shape = shape.into();
        let size = T::DTYPE.size_bytes();
        if data.len() != shape.numel() {
            return Err(TensorError::HostLength {
                op: "from_slice",
                expected: shape.numel().saturating_mul(size),
                got: data.len() * size,
                shape,
            });
        }
        let mut t = Tensor::empty(backend, shape, T::DTYPE, tag)?;
        ops::upload(bytemuck::cast_slice(data), &mut t)?;
        Ok(t)
    }

    /// Copies the contents of a tensor of `T`'s dtype to a host vector.
    ///
    /// # Errors
    /// [`TensorError::DType`] if the tensor is of another dtype; backend copy errors.
    pub fn to_host<T: Element>(&self) -> Result<Vec<T>, TensorError> {
        self.expect_dtype("to_host", T::DTYPE)?;
        let mut out = vec![T::zeroed(); self.numel()];
        ops::download(self, bytemuck::cast_slice_mut(&mut out))?;
        Ok(out)
    }

    /// Copies the contents of a float tensor to a host vector of f32 (bf16 and f16 widened
    /// exactly).
    ///
    /// # Errors
    /// [`TensorError::UnsupportedDType`] for a U32 tensor; backend copy errors.
    pub fn to_vec(&self) -> Result<Vec<f32>, TensorError> {
        fn widen<T: Float>(t: &Tensor) -> Result<Vec<f32>, TensorError> {
            Ok(t.to_host::<T>()?.into_iter().map(T::to_f32).collect())
        }
        crate::with_float!(self.dtype(), T => widen::<T>(self), Err(TensorError::UnsupportedDType {
            op: "to_vec",
            dtype: self.dtype(),
            supported: "f32, bf16, f16 (to_host::<u32> reads u32)",
        }))
    }

    /// Copies the contents of a u32 tensor (e.g. a bit mask) to a host vector.
    ///
    /// # Errors
    /// [`TensorError::DType`] if the tensor is not u32; backend copy errors.
    pub fn to_vec_u32(&self) -> Result<Vec<u32>, TensorError> {
        self.to_host::<u32>()
    }

    /// Places the tensor on `backend`, like `jax.device_put`: a copy with the same shape, dtype
    /// and category; on the same backend, another handle to the same buffer (no copy).
    ///
    /// # Errors
    /// Allocation or copy errors on either side.
    pub fn to(&self, backend: &Arc<dyn Backend>) -> Result<Tensor, TensorError> {
        if Arc::ptr_eq(&self.backend, backend) {
            return Ok(self.clone());
        }
        let mut host = vec![0u8; self.bytes()];
        ops::download(self, &mut host)?;
        let mut t = Tensor::empty(backend, self.shape.clone(), self.dtype, self.tag())?;
        ops::upload(&host, &mut t)?;
        Ok(t)
    }

    /// A deep copy on the same backend, with the same category and role, named in the current
    /// scope (a fresh buffer that in-place ops may overwrite).
    ///
    /// # Errors
    /// Allocation or copy errors.
    pub fn duplicate(&self) -> Result<Tensor, TensorError> {
        self.copy_as(self.tag())
    }

    /// A copy in a fresh buffer tagged `tag`.
    fn copy_as(&self, tag: Tag) -> Result<Tensor, TensorError> {
        let mut t = Tensor::empty(&self.backend, self.shape.clone(), self.dtype, tag)?;
        ops::copy(self, &mut t)?;
        Ok(t)
    }

    /// This handle if it is the only one to its buffer, else a [`Tensor::duplicate`]: what an
    /// in-place op needs. Either way the buffer now plays `role` in the current scope
    /// ([`Tensor::note_role`]; a duplicate is made with that role).
    ///
    /// # Errors
    /// As [`Tensor::duplicate`].
    pub fn into_unique_as(self, role: &'static str) -> Result<Tensor, TensorError> {
        if self.is_unique() {
            self.note_role(role);
            Ok(self)
        } else {
            self.copy_as(Tag::new(self.category(), role))
        }
    }

    /// This handle if it is the only one to its buffer, else a [`Tensor::duplicate`]: what an
    /// in-place op needs.
    ///
    /// # Errors
    /// As [`Tensor::duplicate`].
    pub fn into_unique(self) -> Result<Tensor, TensorError> {
        if self.is_unique() {
            Ok(self)
        } else {
            self.duplicate()
        }
    }

    /// Another handle to the same buffer, seen with a new shape of the same element count.
    ///
    /// # Errors
    /// [`TensorError::Shape`] if the element counts differ.
    pub fn reshape(&self, shape: impl Into<Shape>) -> Result<Tensor, TensorError> {
        let shape = shape.into();
        if shape.checked_numel() != Some(self.numel()) {
            return Err(TensorError::Shape {
                op: "reshape",
                reason: format!("cannot view {} elements as {shape}", self.numel()),
                got: self.shape.clone(),
            });
        }
        Ok(Tensor {
            shape,
            ..self.clone()
        })
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The dimensions, outermost first.
    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.numel()
    }

    /// Bytes of data (`numel * dtype size`); what the allocator was asked for.
    pub fn bytes(&self) -> usize {
        self.buf.bytes()
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device the tensor lives on.
    pub fn device(&self) -> Device {
        self.backend.device()
    }

    /// The allocator category the buffer is accounted under.
    pub fn category(&self) -> Category {
        self.buf.category()
    }

    /// The buffer's name: the scope it was allocated in and its role (`2.conv/output`).
    pub fn name(&self) -> &Name {
        self.buf.name()
    }

    /// The buffer's category and first role.
    pub fn tag(&self) -> Tag {
        Tag::new(self.category(), self.name().role())
    }

    /// Records that the buffer now plays `role` in the allocator's current scope (written over
    /// in place: a ReLU on its input, a gradient over a dead activation); see
    /// [`stax_alloc::Allocation::note_role`].
    pub fn note_role(&self, role: &'static str) {
        self.buf.note_role(role);
    }

    /// The backend that owns the buffer.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// Address of the first element: a host pointer on the CPU backend, a `CUdeviceptr` on CUDA.
    pub fn addr(&self) -> u64 {
        self.buf.addr()
    }

    /// The buffer's bytes when it is in host memory (the CPU backend's), else None.
    pub(crate) fn host_bytes(&self) -> Option<&[u8]> {
        self.buf.host_bytes()
    }

    /// As [`Tensor::host_bytes`], writable; None also while another handle exists.
    pub(crate) fn host_bytes_mut(&mut self) -> Option<&mut [u8]> {
        Arc::get_mut(&mut self.buf)?.host_bytes_mut()
    }

    /// Whether this handle is the only one to its buffer (in-place ops need that).
    pub fn is_unique(&self) -> bool {
        Arc::strong_count(&self.buf) == 1
    }

    /// Whether two handles share one buffer.
    pub fn same_buffer(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.buf, &other.buf)
    }

    /// Fails with [`TensorError::DType`] unless the tensor has `dtype`.
    pub fn expect_dtype(&self, op: &'static str, dtype: DType) -> Result<(), TensorError> {
        if self.dtype == dtype {
            Ok(())
        } else {
            Err(TensorError::DType {
                op,
                operand: None,
                expected: dtype,
                got: self.dtype,
            })
        }
    }

    /// Fails with [`TensorError::DeviceMismatch`] unless the tensor lives on `device`.
    pub fn expect_device(&self, op: &'static str, device: Device) -> Result<(), TensorError> {
        if self.device() == device {
            Ok(())
        } else {
            Err(TensorError::DeviceMismatch {
                op,
                lhs: device,
                rhs: self.device(),
            })
        }
    }

    /// Fails unless the tensor lives on the same backend as `other`:
    /// [`TensorError::DeviceMismatch`] for another device, [`TensorError::BackendMismatch`]
    /// for another backend opened on the same device.
    pub fn expect_backend(&self, op: &'static str, other: &Tensor) -> Result<(), TensorError> {
        self.expect_on(op, &other.backend)
    }

    /// As [`Tensor::expect_backend`], against `backend`.
    pub fn expect_on(
        &self,
        op: &'static str,
        backend: &Arc<dyn Backend>,
    ) -> Result<(), TensorError> {
        let (mine, theirs) = (self.backend.id(), backend.id());
        if mine == theirs {
            Ok(())
        } else if self.device() != backend.device() {
            Err(TensorError::DeviceMismatch {
                op,
                lhs: backend.device(),
                rhs: self.device(),
            })
        } else {
            Err(TensorError::BackendMismatch {
                op,
                device: self.device(),
                lhs: theirs,
                rhs: mine,
            })
        }
    }

    /// Fails with [`TensorError::Shape`] unless the tensor has `shape`.
    pub fn expect_shape(&self, op: &'static str, shape: &Shape) -> Result<(), TensorError> {
        if &self.shape == shape {
            Ok(())
        } else {
            Err(TensorError::Shape {
                op,
                reason: format!("expected shape {shape}"),
                got: self.shape.clone(),
            })
        }
    }

    /// Fails with [`TensorError::Aliased`] unless this handle is the only one to its buffer.
    pub fn expect_unique(&self, op: &'static str) -> Result<(), TensorError> {
        if self.is_unique() {
            Ok(())
        } else {
            Err(TensorError::Aliased { op, operand: None })
        }
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor({} {} on {}, {:?}, {} bytes)",
            self.dtype,
            self.shape,
            self.device(),
            self.category(),
            self.bytes()
        )
    }
}

impl crate::Tree<Tensor> {
    /// Total bytes of every tensor.
    pub fn bytes(&self) -> usize {
        self.leaves().iter().map(|t| t.bytes()).sum()
    }

    /// Total number of elements of every tensor.
    pub fn numel(&self) -> usize {
        self.leaves().iter().map(|t| t.numel()).sum()
    }
}
