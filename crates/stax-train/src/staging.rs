//! Host staging: the pageable host buffers a batch is assembled in before placement, allocated
//! through a [`stax_alloc`] allocator so that host bytes are counted like device bytes.
//!
//! ```
//! use stax_train::{HostStaging, data::fashion_mnist_2class};
//! use stax_tensor::{BackendOptions, Category, Device};
//! let backend = Device::Cpu.open(&BackendOptions::default())?;
//! let (train, _) = fashion_mnist_2class()?;
//! let staging = HostStaging::new()?;
//! let (x, y) = staging.place_batch(&backend, &train, &[0, 1, 2], (28, 28, 3))?;
//! let host = staging.allocator().stats();
//! // the images and labels were staged on the host (tagged Input) and freed after placement
//! assert_eq!(host.peak_by_category[Category::Input.index()], (x.bytes() + y.bytes()) as u64);
//! assert_eq!(host.requested, 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::sync::Arc;

use stax_alloc::{Allocation, Allocator, Category, HostMemory, Strategy};
use stax_tensor::{Backend, Tensor};

use crate::TrainError;
use crate::data::Dataset;

/// Pageable host memory for assembling batches, from its own caching [`Allocator`] over
/// [`HostMemory`]; buffers are tagged [`Category::Input`] and freed once the batch is placed
/// (the allocator keeps them cached for the next batch).
#[derive(Debug, Clone)]
pub struct HostStaging {
    allocator: Arc<Allocator>,
}

/// A host f32 buffer from the staging allocator.
struct HostBuffer {
    alloc: Allocation,
    len: usize,
}

impl HostBuffer {
    fn new(allocator: &Arc<Allocator>, len: usize) -> Result<HostBuffer, TrainError> {
        let bytes = len
            .checked_mul(4)
            .ok_or_else(|| stax_alloc::AllocError::Backend {
                backend: "host".into(),
                op: "stage",
                message: format!("{len} f32 overflow the address space"),
            })
            .map_err(stax_tensor::TensorError::from)?;
        let alloc = allocator
            .allocate(bytes, Category::Input)
            .map_err(stax_tensor::TensorError::from)?;
        Ok(HostBuffer { alloc, len })
    }

    fn as_mut_slice(&mut self) -> &mut [f32] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: the allocation comes from an allocator over `HostMemory` (built only in
        // `HostStaging::new`), so its address is a real host pointer, 64-byte aligned (enough
        // for f32), to `len * 4` live bytes that are always initialized (fresh segments are
        // zeroed, reused blocks hold earlier values). `&mut self` owns the allocation, so the
        // slice is the only access while it lives.
        unsafe { std::slice::from_raw_parts_mut(self.alloc.addr() as usize as *mut f32, self.len) }
    }
}

impl HostStaging {
    /// Staging over a fresh host allocator (`caching` strategy).
    ///
    /// # Errors
    /// [`TrainError::Tensor`] if the allocator cannot be created.
    pub fn new() -> Result<HostStaging, TrainError> {
        let allocator = Allocator::new(Arc::new(HostMemory::new()), Strategy::Caching)
            .map_err(stax_tensor::TensorError::from)?;
        Ok(HostStaging { allocator })
    }

    /// The host allocator (its stats are the report's pageable host figures).
    pub fn allocator(&self) -> &Arc<Allocator> {
        &self.allocator
    }

    /// Gathers the examples `indices` of `dataset` into host staging buffers (resized to
    /// `hwc`, labels one-hot) and places them on `backend`, tagged [`Category::Input`]:
    /// images NHWC `[len, h, w, c]`, labels `[len, num_classes]`.
    ///
    /// # Errors
    /// Data errors from [`crate::data::loader::fill_batch`]; allocation and copy errors.
    pub fn place_batch(
        &self,
        backend: &Arc<dyn Backend>,
        dataset: &Dataset,
        indices: &[usize],
        hwc: (usize, usize, usize),
    ) -> Result<(Tensor, Tensor), TrainError> {
        let (h, w, c) = hwc;
        let (n, k) = (indices.len(), dataset.num_classes());
        let mut images = HostBuffer::new(&self.allocator, n * h * w * c)?;
        let mut labels = HostBuffer::new(&self.allocator, n * k)?;
        crate::data::loader::fill_batch(
            dataset,
            indices,
            hwc,
            images.as_mut_slice(),
            labels.as_mut_slice(),
        )?;
        let x = Tensor::from_slice(
            backend,
            images.as_mut_slice(),
            [n, h, w, c],
            Category::Input,
        )?;
        let y = Tensor::from_slice(backend, labels.as_mut_slice(), [n, k], Category::Input)?;
        Ok((x, y))
    }
}
