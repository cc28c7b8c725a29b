//! `ndarray` interop: tensors to and from [`ndarray`] arrays, the Rust ecosystem's NumPy.
//!
//! - [`Tensor::from_ndarray`]: any array or view of an [`Element`] type (any memory layout; a
//!   non-row-major one is copied to row-major first) becomes a tensor of that dtype on any
//!   backend, with the array's shape (`jnp.asarray` / `jax.device_put`).
//! - [`Tensor::to_ndarray`]: one call copies a tensor of any backend, the GPU's included, into
//!   an owned [`ArrayD`] (`np.asarray(jax_array)`, `jax.device_get`).
//! - [`Tensor::ndarray_view`] and [`Tensor::ndarray_view_mut`]: zero-copy views of a tensor in
//!   host memory (the CPU backend's).
//!
//! The Rust element type must be the tensor's dtype: `f32` for [`crate::DType::F32`], [`half::bf16`],
//! [`half::f16`], `u32` (a mismatch is [`TensorError::DType`], never a reinterpretation).
//!
//! ```
//! use ndarray::{ArrayD, IxDyn};
//! use stax_tensor::{BackendOptions, Category, Device, Tensor};
//! let cpu = Device::Cpu.open(&BackendOptions::default())?;
//! let a = ArrayD::from_shape_fn(IxDyn(&[2, 3]), |i| (i[0] * 10 + i[1]) as f32);
//! let t = Tensor::from_ndarray(&cpu, &a.t(), Category::Other)?; // a transposed view: copied
//! assert_eq!(t.dims(), [3, 2]);
//! assert_eq!(t.to_vec()?, [0.0, 10.0, 1.0, 11.0, 2.0, 12.0]);
//! assert_eq!(t.to_ndarray::<f32>()?, a.t());
//! assert_eq!(t.ndarray_view::<f32>()?[[2, 1]], 12.0);
//! assert!(t.to_ndarray::<u32>().is_err()); // f32 is not u32
//! # Ok::<(), stax_tensor::TensorError>(())
//! ```

use std::sync::Arc;

use ndarray::{ArrayBase, ArrayD, ArrayViewD, ArrayViewMutD, Data, Dimension, IxDyn};
use stax_alloc::Tag;

use crate::{Backend, Element, Tensor, TensorError};

impl Tensor {
    /// A tensor of `T`'s dtype on `backend` holding a copy of `array` (shape `array.shape()`,
    /// row-major), allocated with `tag`.
    ///
    /// # Errors
    /// As [`Tensor::from_slice`] (allocation and copy errors).
    pub fn from_ndarray<T: Element, S: Data<Elem = T>, D: Dimension>(
        backend: &Arc<dyn Backend>,
        array: &ArrayBase<S, D>,
        tag: impl Into<Tag>,
    ) -> Result<Tensor, TensorError> {
        let standard = array.as_standard_layout();
        let data = standard
            .as_slice()
            .ok_or_else(|| TensorError::InvalidArgument {
                op: "from_ndarray",
                reason: "the array is not contiguous after copying to row-major order".into(),
            })?;
        Tensor::from_slice(backend, data, array.shape().to_vec(), tag)
    }

    /// Copies the tensor, on whichever backend it lives, into an owned array of its shape:
    /// one download for a device tensor.
    ///
    /// # Errors
    /// [`TensorError::DType`] unless the tensor's dtype is `T`'s; copy errors.
    pub fn to_ndarray<T: Element>(&self) -> Result<ArrayD<T>, TensorError> {
        self.expect_dtype("to_ndarray", T::DTYPE)?;
        let values = self.to_host::<T>()?;
        ArrayD::from_shape_vec(IxDyn(self.dims()), values).map_err(|e| TensorError::Shape {
            op: "to_ndarray",
            reason: e.to_string(),
            got: self.shape().clone(),
        })
    }

    /// A view of a tensor in host memory (the CPU backend's), without a copy.
    ///
    /// # Errors
    /// [`TensorError::DType`] unless the tensor's dtype is `T`'s;
    /// [`TensorError::InvalidArgument`] for a tensor outside host memory (use
    /// [`Tensor::to_ndarray`]).
    pub fn ndarray_view<T: Element>(&self) -> Result<ArrayViewD<'_, T>, TensorError> {
        const OP: &str = "ndarray_view";
        self.expect_dtype(OP, T::DTYPE)?;
        let bytes = self.host_bytes().ok_or_else(|| not_host(OP, self))?;
        let data = cast::<T>(OP, bytes)?;
        ArrayViewD::from_shape(IxDyn(self.dims()), data).map_err(|e| shape_error(OP, self, e))
    }

    /// A writable view of a tensor in host memory, without a copy: what an in-place op needs,
    /// so this must be the only handle to the buffer.
    ///
    /// # Errors
    /// As [`Tensor::ndarray_view`]; [`TensorError::Aliased`] while another handle exists.
    pub fn ndarray_view_mut<T: Element>(&mut self) -> Result<ArrayViewMutD<'_, T>, TensorError> {
        const OP: &str = "ndarray_view_mut";
        self.expect_dtype(OP, T::DTYPE)?;
        self.expect_unique(OP)?;
        let dims = self.dims().to_vec();
        let missing = not_host(OP, self);
        let bytes = self.host_bytes_mut().ok_or(missing)?;
        let data: &mut [T] = bytemuck::try_cast_slice_mut(bytes).map_err(|e| cast_error(OP, e))?;
        ArrayViewMutD::from_shape(IxDyn(&dims), data).map_err(|e| TensorError::InvalidArgument {
            op: OP,
            reason: e.to_string(),
        })
    }
}

fn cast<'a, T: Element>(op: &'static str, bytes: &'a [u8]) -> Result<&'a [T], TensorError> {
    bytemuck::try_cast_slice(bytes).map_err(|e| cast_error(op, e))
}

fn cast_error(op: &'static str, e: bytemuck::PodCastError) -> TensorError {
    TensorError::InvalidArgument {
        op,
        reason: format!("the buffer is not an array of its dtype: {e}"),
    }
}

fn shape_error(op: &'static str, t: &Tensor, e: ndarray::ShapeError) -> TensorError {
    TensorError::Shape {
        op,
        reason: e.to_string(),
        got: t.shape().clone(),
    }
}

fn not_host(op: &'static str, t: &Tensor) -> TensorError {
    TensorError::InvalidArgument {
        op,
        reason: format!(
            "the {} tensor {} is on {}, not in host memory; copy it with to_ndarray (one \
             download) or Tensor::to a CPU backend",
            t.dtype(),
            t.shape(),
            t.device()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::bf16;
    use crate::{BackendOptions, Category, DType, Device};
    use ndarray::{Array3, s};

    fn cpu() -> Arc<dyn Backend> {
        Device::Cpu.open(&BackendOptions::default()).unwrap()
    }

    #[test]
    fn round_trips_every_dtype_and_layout() {
        let be = cpu();
        let a = Array3::from_shape_fn((2, 3, 4), |(i, j, k)| (i * 100 + j * 10 + k) as u32);
        let t = Tensor::from_ndarray(&be, &a, Category::Other).unwrap();
        assert_eq!((t.dims(), t.dtype()), (&[2, 3, 4][..], DType::U32));
        assert_eq!(t.to_ndarray::<u32>().unwrap(), a.clone().into_dyn());
        // a strided slice is copied to row-major order
        let sliced = a.slice(s![.., 1.., ..;2]);
        let t = Tensor::from_ndarray(&be, &sliced, Category::Other).unwrap();
        assert_eq!(
            t.to_vec_u32().unwrap(),
            [10, 12, 20, 22, 110, 112, 120, 122]
        );
        let h = a.mapv(|v| bf16::from_f32(v as f32));
        let t = Tensor::from_ndarray(&be, &h, Category::Other).unwrap();
        assert_eq!(t.dtype(), DType::BF16);
        assert_eq!(t.ndarray_view::<bf16>().unwrap(), h.into_dyn());
    }

    #[test]
    fn views_and_typed_errors() {
        let be = cpu();
        let mut t =
            Tensor::from_slice(&be, &[1.0f32, 2.0, 3.0, 4.0], [2, 2], Category::Other).unwrap();
        t.ndarray_view_mut::<f32>().unwrap()[[1, 0]] = 30.0;
        assert_eq!(t.to_vec().unwrap(), [1.0, 2.0, 30.0, 4.0]);
        let e = t.to_ndarray::<u32>().unwrap_err();
        assert_eq!(e.to_string(), "to_ndarray: expected dtype u32, got f32");
        let e = t.ndarray_view::<half::f16>().unwrap_err();
        assert!(
            matches!(
                e,
                TensorError::DType {
                    op: "ndarray_view",
                    ..
                }
            ),
            "{e}"
        );
        let other = t.clone();
        let e = t.ndarray_view_mut::<f32>().unwrap_err();
        assert!(matches!(e, TensorError::Aliased { .. }), "{e}");
        drop(other);
        assert_eq!(t.ndarray_view_mut::<f32>().unwrap().sum(), 37.0);
    }
}
