//! Uploads that may still be running: [`crate::ops::upload_async`] returns an [`Upload`]
//! that holds the destination tensor until the copy is done, so nothing reads it early.
//!
//! ```
//! use std::sync::Arc;
//! use stax_alloc::{Allocator, HostMemory, Strategy};
//! use stax_tensor::{BackendOptions, Category, DType, Device, Tensor};
//! let cpu = Device::Cpu.open(&BackendOptions::default())?;
//! let host = Allocator::new(Arc::new(HostMemory::new()), Strategy::Caching)?;
//! let mut src = host.allocate(8, Category::Input)?;
//! src.host_bytes_mut().unwrap().copy_from_slice(bytemuck::cast_slice(&[1.5f32, -2.0]));
//! let dst = Tensor::empty(&cpu, [2], DType::F32, Category::Input)?;
//! let upload = stax_tensor::ops::upload_async(src, dst)?; // the source is held until done
//! assert_eq!(upload.wait()?.to_vec()?, vec![1.5, -2.0]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt::Debug;

use stax_alloc::Allocation;

use crate::{Shape, Tensor, TensorError};

/// A backend's copy in flight (the CUDA backend's: an event on its copy stream and the host
/// source the copy reads). Dropping one must wait for the copy, so that neither the source nor
/// the destination is reused while the copy runs.
pub trait PendingCopy: Send + Sync + Debug {
    /// Blocks until the copy is done.
    ///
    /// # Errors
    /// The backend's error for a failed copy.
    fn wait(self: Box<Self>) -> Result<(), TensorError>;
}

/// A host-to-device copy that may still be running, holding its destination tensor.
#[derive(Debug)]
pub struct Upload {
    // Dropped first (fields drop in order): waits for the copy before the tensor is freed.
    pending: Option<Box<dyn PendingCopy>>,
    tensor: Tensor,
}

impl Upload {
    /// An upload that has already finished.
    pub fn done(tensor: Tensor) -> Upload {
        Upload {
            pending: None,
            tensor,
        }
    }

    /// An upload into `tensor` that finishes when `pending` does.
    pub fn pending(tensor: Tensor, pending: Box<dyn PendingCopy>) -> Upload {
        Upload {
            pending: Some(pending),
            tensor,
        }
    }

    /// The destination's shape.
    pub fn shape(&self) -> &Shape {
        self.tensor.shape()
    }

    /// Waits for the copy and returns the filled tensor.
    ///
    /// # Errors
    /// The backend's error for a failed copy.
    pub fn wait(mut self) -> Result<Tensor, TensorError> {
        if let Some(p) = self.pending.take() {
            p.wait()?;
        }
        Ok(self.tensor)
    }
}

/// The bytes of `src` to upload into `dst` (checks shared by the backends): `src` must be host
/// memory ([`Allocation::host_bytes`]) of exactly `dst.bytes()` bytes.
///
/// # Errors
/// [`TensorError::InvalidArgument`] when `src` is not host memory; [`TensorError::HostLength`]
/// when the sizes differ.
pub fn host_source<'a>(
    op: &'static str,
    src: &'a Allocation,
    dst: &Tensor,
) -> Result<&'a [u8], TensorError> {
    let bytes = src
        .host_bytes()
        .ok_or_else(|| TensorError::InvalidArgument {
            op,
            reason: format!(
                "the source must be host memory, not {}",
                src.allocator().backend().name()
            ),
        })?;
    if bytes.len() != dst.bytes() {
        return Err(TensorError::HostLength {
            op,
            expected: dst.bytes(),
            got: bytes.len(),
            shape: dst.shape().clone(),
        });
    }
    Ok(bytes)
}
