//! Host staging: the host buffers a batch is assembled in before placement, allocated through
//! a [`stax_alloc`] allocator so that host bytes are counted like device bytes. On a backend
//! with pinned memory ([`Backend::staging_allocator`], CUDA) batches are gathered straight
//! into pinned buffers and copied asynchronously ([`Backend::upload_async`](stax_tensor::MemoryOps::upload_async)); elsewhere into
//! pageable buffers of the staging's own allocator.
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

use stax_alloc::{Allocation, Allocator, Category, HostMemory, Strategy, Tag};
use stax_tensor::{Backend, DType, Shape, Tensor, TensorError, Upload};

use crate::TrainError;
use crate::data::Dataset;

/// Host memory for assembling batches: the backend's pinned allocator where it has one, else
/// this staging's own caching [`Allocator`] over pageable [`HostMemory`]. Buffers are tagged
/// [`Category::Input`] and freed once the batch is on the device (the allocator keeps them
/// cached for the next batch).
#[derive(Debug, Clone)]
pub struct HostStaging {
    allocator: Arc<Allocator>,
}

/// How a model's input takes a data set's images: NHWC `[n, h, w, c]` (resized to `h x w`,
/// gray replicated to `c` channels), or flattened to `[n, h * w * c]` features (an MLP's
/// input, stax's `(-1, 28 * 28)`); and how its loss takes the labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Image height, width and channels.
    pub hwc: (usize, usize, usize),
    /// Whether each example is flattened to one feature axis.
    pub flat: bool,
    /// One-hot rows or class indices.
    pub labels: Labels,
}

/// How a batch's labels are given: what the loss reads ([`stax_layers::Loss::labels_dtype`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Labels {
    /// `[n, num_classes]` f32 rows, all zeros but a 1 at the label (softmax cross-entropy).
    #[default]
    OneHot,
    /// `[n]` u32 class indices (the losses with integer labels).
    Index,
}

impl Labels {
    /// The labels a loss of labels `dtype` reads: U32 class indices, else one-hot rows.
    pub fn for_dtype(dtype: DType) -> Labels {
        match dtype {
            DType::U32 => Labels::Index,
            _ => Labels::OneHot,
        }
    }

    /// Their dtype.
    pub fn dtype(self) -> DType {
        match self {
            Labels::OneHot => DType::F32,
            Labels::Index => DType::U32,
        }
    }

    /// Their shape for `n` examples of `classes` classes.
    pub fn shape(self, n: usize, classes: usize) -> Shape {
        match self {
            Labels::OneHot => Shape::new([n, classes]),
            Labels::Index => Shape::new([n]),
        }
    }
}

impl From<(usize, usize, usize)> for Layout {
    /// NHWC images of this size, one-hot labels.
    fn from(hwc: (usize, usize, usize)) -> Layout {
        Layout {
            hwc,
            flat: false,
            labels: Labels::OneHot,
        }
    }
}

impl Layout {
    /// The same layout with `labels`.
    pub fn with_labels(self, labels: Labels) -> Layout {
        Layout { labels, ..self }
    }

    /// The layout of a model input `input` (`[n, h, w, c]`, or `[n, features]` where
    /// `features` is `h * w * c` for the data set's stored `h x w` and `c` its channels or 3),
    /// with one-hot labels.
    ///
    /// # Errors
    /// [`TrainError::BatchShape`] for any other input shape.
    pub fn for_input(input: &Shape, dataset: &Dataset) -> Result<Layout, TrainError> {
        let (h, w, c0) = dataset.image_shape();
        match *input.dims() {
            [_, h, w, c] => Ok(Layout::from((h, w, c))),
            [_, f] if f % (h * w).max(1) == 0 && [c0, 3].contains(&(f / (h * w).max(1))) => {
                Ok(Layout {
                    hwc: (h, w, f / (h * w)),
                    flat: true,
                    labels: Labels::OneHot,
                })
            }
            _ => Err(TrainError::BatchShape {
                what: "model input",
                expected: format!(
                    "[n, h, w, c] images or [n, {}] (or [n, {}]) features of the {h}x{w}x{c0} data",
                    h * w * c0,
                    h * w * 3
                ),
                got: input.clone(),
            }),
        }
    }

    /// The shape of a batch of `n` examples.
    pub fn shape(&self, n: usize) -> Shape {
        let (h, w, c) = self.hwc;
        if self.flat {
            Shape::new([n, h * w * c])
        } else {
            Shape::new([n, h, w, c])
        }
    }
}

/// A batch gathered in host memory (f32 images and the labels as its [`Layout`] says), ready
/// to be placed on a device ([`HostBatch::upload`]).
#[derive(Debug)]
pub struct HostBatch {
    images: Allocation,
    labels: Allocation,
    shapes: (Shape, Shape),
    labels_dtype: DType,
}

impl HostBatch {
    /// Images and labels shapes.
    pub fn shapes(&self) -> (&Shape, &Shape) {
        (&self.shapes.0, &self.shapes.1)
    }

    /// Starts placing the batch on `backend` (tagged [`Category::Input`], named
    /// `input/images` and `input/labels`): the copies run asynchronously where the backend
    /// can ([`Backend::upload_async`](stax_tensor::MemoryOps::upload_async)); wait on the two uploads before using the tensors.
    ///
    /// # Errors
    /// Allocation and copy errors.
    pub fn upload(self, backend: &Arc<dyn Backend>) -> Result<(Upload, Upload), TrainError> {
        let (xs, ys) = self.shapes;
        let (x, y) = input_tensors(backend, xs, (ys, self.labels_dtype))?;
        let x = stax_tensor::ops::upload_async(self.images, x)?;
        let y = stax_tensor::ops::upload_async(self.labels, y)?;
        Ok((x, y))
    }
}

/// The device tensors a batch is placed in: f32 images `xs` and labels `ys` of their dtype,
/// tagged [`Category::Input`] and named `input/images` and `input/labels` (contents
/// unspecified).
///
/// # Errors
/// Allocation errors.
pub(crate) fn input_tensors(
    backend: &Arc<dyn Backend>,
    xs: Shape,
    (ys, labels): (Shape, DType),
) -> Result<(Tensor, Tensor), TensorError> {
    let _scope = backend.allocator().scope("input");
    let x = Tensor::empty(backend, xs, DType::F32, Tag::new(Category::Input, "images"))?;
    let y = Tensor::empty(backend, ys, labels, Tag::new(Category::Input, "labels"))?;
    Ok((x, y))
}

/// A host buffer for `len` 4-byte elements (f32 or u32) from `allocator`.
fn host_words(allocator: &Arc<Allocator>, len: usize) -> Result<Allocation, TrainError> {
    let bytes = len
        .checked_mul(4)
        .ok_or_else(|| TensorError::InvalidArgument {
            op: "stage",
            reason: format!("{len} f32 overflow the address space"),
        })?;
    Ok(allocator
        .allocate(bytes, Category::Input)
        .map_err(TensorError::from)?)
}

/// The `T` (f32 or u32) view of a host staging buffer.
fn as_words<T: bytemuck::Pod>(a: &mut Allocation) -> Result<&mut [T], TrainError> {
    let bytes = a
        .host_bytes_mut()
        .ok_or_else(|| TensorError::InvalidArgument {
            op: "stage",
            reason: "the staging allocator does not hand out host memory".into(),
        })?;
    bytemuck::try_cast_slice_mut(bytes).map_err(|e| {
        TrainError::from(TensorError::InvalidArgument {
            op: "stage",
            reason: format!("host buffer is not an array of 4-byte elements: {e}"),
        })
    })
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

    /// The pageable host allocator (its stats are the report's pageable host figures).
    pub fn allocator(&self) -> &Arc<Allocator> {
        &self.allocator
    }

    /// Gathers the examples `indices` of `dataset` into host buffers (as `layout` says: an
    /// `(h, w, c)` tuple for NHWC images and one-hot labels) for `backend`: pinned memory from
    /// [`Backend::staging_allocator`] when it has one, else this staging's pageable allocator.
    ///
    /// # Errors
    /// [`TrainError::ZeroBatchSize`] for no indices; [`TrainError::BadShape`] for a zero
    /// extent in `layout`; data errors from [`crate::data::loader::fill_batch`]; allocation
    /// errors.
    pub fn gather(
        &self,
        backend: &Arc<dyn Backend>,
        dataset: &Dataset,
        indices: &[usize],
        layout: impl Into<Layout>,
    ) -> Result<HostBatch, TrainError> {
        let layout = layout.into();
        let hwc @ (h, w, c) = layout.hwc;
        let (n, k) = (indices.len(), dataset.num_classes());
        if n == 0 {
            return Err(TrainError::ZeroBatchSize { op: "gather" });
        }
        crate::data::resize::check_extents("gather", "batch image layout", hwc)?;
        let allocator = backend.staging_allocator().unwrap_or(&self.allocator);
        let labels_shape = layout.labels.shape(n, k);
        let mut images = host_words(allocator, n * h * w * c)?;
        let mut labels = host_words(allocator, labels_shape.numel())?;
        let (pixels, ys) = (as_words(&mut images)?, &mut labels);
        match layout.labels {
            Labels::OneHot => {
                crate::data::loader::fill_batch(dataset, indices, hwc, pixels, as_words(ys)?)?
            }
            Labels::Index => {
                crate::data::loader::fill_label_indices(dataset, indices, as_words(ys)?)?;
                crate::data::loader::fill_images(dataset, indices, hwc, pixels)?;
            }
        }
        Ok(HostBatch {
            images,
            labels,
            shapes: (layout.shape(n), labels_shape),
            labels_dtype: layout.labels.dtype(),
        })
    }

    /// Gathers the examples `indices` of `dataset` ([`HostStaging::gather`]) and places them
    /// on `backend`, tagged [`Category::Input`]: images as `layout` says (NHWC
    /// `[len, h, w, c]` for an `(h, w, c)` tuple), labels `[len, num_classes]` one-hot or `[len]`
    /// class indices. Returns once both are on the device.
    ///
    /// # Errors
    /// Data errors from [`crate::data::loader::fill_batch`]; allocation and copy errors.
    pub fn place_batch(
        &self,
        backend: &Arc<dyn Backend>,
        dataset: &Dataset,
        indices: &[usize],
        layout: impl Into<Layout>,
    ) -> Result<(Tensor, Tensor), TrainError> {
        let (x, y) = self
            .gather(backend, dataset, indices, layout)?
            .upload(backend)?;
        Ok((x.wait()?, y.wait()?))
    }
}
