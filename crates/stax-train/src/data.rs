//! Host data sets and loaders.
//!
//! A [`Dataset`] holds images on the host, compactly, in NHWC order (`[n, h, w, c]`) as `u8`
//! or `f32` ([`Pixels`]), with one class label per image. How stored values become the `f32`
//! a model sees is explicit, [`PixelScaling`]: by default a `u8` value `x` becomes `x / 255`
//! (images in `[0, 1]`, as torchvision's `ToTensor`) and an `f32` value is used as stored;
//! [`Dataset::with_scaling`] chooses, [`Dataset::scaling`] says which applies. Every
//! constructor validates its input and returns a typed [`TrainError`] instead of panicking;
//! an error about data read from a file names the file (inside an `.npz`: the array,
//! `archive.npz/x.npy`) and the first bad element, so a bad test file does not read like a bad
//! training file.
//!
//! Sources: IDX files such as MNIST's ([`idx`], gzipped or not), NumPy `.npy`/`.npz` ([`npy`]),
//! and the embedded two-class Fashion-MNIST set ([`embedded::fashion_mnist_2class`]).
//! A [`Loader`] turns a data set into seeded epochs of batches and fills caller-provided
//! `f32` buffers, resizing ([`resize`]) and replicating gray to 3 channels when the model's
//! input differs from the stored image.
//!
//! ```
//! use stax_train::data::{Dataset, Loader, Pixels};
//!
//! // Two 1x2 gray images, labels 0 and 1.
//! let ds = Dataset::new(Pixels::U8(vec![0, 255, 51, 102]), 2, 1, 2, 1, vec![0, 1], 2)?;
//! assert_eq!(ds.class_counts(), vec![1, 1]);
//!
//! // Fill a batch of image 1 at the stored size: u8 51 becomes 51 / 255 = 0.2.
//! let loader = Loader::new(ds.len(), 1, 42)?;
//! let (mut x, mut y) = (vec![0.0f32; 2], vec![0.0f32; 2]);
//! loader.fill_batch(&ds, &[1], (1, 2, 1), &mut x, &mut y)?;
//! assert_eq!(x, [0.2, 0.4]);
//! assert_eq!(y, [0.0, 1.0]);
//! # Ok::<(), stax_train::TrainError>(())
//! ```

pub mod embedded;
pub mod idx;
pub mod loader;
pub mod npy;
pub mod position;
pub mod resize;

pub use embedded::fashion_mnist_2class;
pub use loader::Loader;
pub use position::DataPosition;

use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::{NonFiniteKind, TrainError};
use npy::MAX_CLASSES;

/// Image storage, NHWC (`[n, h, w, c]`, channels fastest). `F32` values must be finite. How
/// either becomes what a model sees is the data set's [`PixelScaling`].
#[derive(Debug, Clone, PartialEq)]
pub enum Pixels {
    /// One byte per value (by default read as `x / 255`).
    U8(Vec<u8>),
    /// One `f32` per value (by default read as stored).
    F32(Vec<f32>),
}

/// How stored pixel values become the `f32` values a model sees ([`Dataset::with_scaling`],
/// [`Dataset::scaling`]). The default follows the storage: `u8` images are 8-bit intensities
/// and become [`PixelScaling::Divide255`] (`[0, 1]`, as torchvision's `ToTensor` and Keras's
/// `Rescaling(1 / 255)`); `f32` images are taken as already scaled, [`PixelScaling::AsStored`].
///
/// ```
/// use stax_train::data::{Dataset, PixelScaling, Pixels};
/// let ds = Dataset::new(Pixels::U8(vec![51, 102]), 1, 1, 2, 1, vec![0], 1)?;
/// assert_eq!(ds.scaling(), PixelScaling::Divide255);
/// assert_eq!(ds.scaling().to_string(), "x / 255 (to [0, 1])");
/// let raw = ds.with_scaling(PixelScaling::AsStored);
/// let mut x = [0.0f32; 2];
/// raw.image_f32(0, &mut x)?;
/// assert_eq!(x, [51.0, 102.0]);
/// # Ok::<(), stax_train::TrainError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PixelScaling {
    /// `x / 255`: 8-bit intensities to `[0, 1]`. The default for `u8` pixels.
    Divide255,
    /// The stored value, unchanged. The default for `f32` pixels.
    AsStored,
}

impl PixelScaling {
    /// The default for `pixels`: [`PixelScaling::Divide255`] for `u8`,
    /// [`PixelScaling::AsStored`] for `f32`.
    pub fn default_for(pixels: &Pixels) -> PixelScaling {
        match pixels {
            Pixels::U8(_) => PixelScaling::Divide255,
            Pixels::F32(_) => PixelScaling::AsStored,
        }
    }
}

impl fmt::Display for PixelScaling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PixelScaling::Divide255 => "x / 255 (to [0, 1])",
            PixelScaling::AsStored => "as stored",
        })
    }
}

/// The files a data set was read from (errors name them).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Source {
    pub images: PathBuf,
    pub labels: PathBuf,
}

impl Pixels {
    /// The number of stored values (`n * h * w * c`).
    pub fn len(&self) -> usize {
        match self {
            Pixels::U8(v) => v.len(),
            Pixels::F32(v) => v.len(),
        }
    }

    /// Whether no value is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes values `start..start + out.len()` as `f32` into `out`, scaled by `scaling`.
    fn read_f32(&self, start: usize, out: &mut [f32], scaling: PixelScaling) {
        let end = start + out.len();
        match (self, scaling) {
            (Pixels::U8(v), PixelScaling::Divide255) => {
                for (o, &b) in out.iter_mut().zip(&v[start..end]) {
                    *o = f32::from(b) / 255.0;
                }
            }
            (Pixels::U8(v), PixelScaling::AsStored) => {
                for (o, &b) in out.iter_mut().zip(&v[start..end]) {
                    *o = f32::from(b);
                }
            }
            (Pixels::F32(v), PixelScaling::Divide255) => {
                for (o, &x) in out.iter_mut().zip(&v[start..end]) {
                    *o = x / 255.0;
                }
            }
            (Pixels::F32(v), PixelScaling::AsStored) => out.copy_from_slice(&v[start..end]),
        }
    }
}

/// A labelled image data set held on the host.
///
/// Invariants, checked by [`Dataset::new`]: at least one image; `h, w, c >= 1`; the pixel
/// buffer holds exactly `n * h * w * c` values; one label per image, each `< num_classes`;
/// all `f32` pixels finite; class names, when given, one per class.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    pixels: Pixels,
    scaling: PixelScaling,
    source: Option<Source>,
    n: usize,
    height: usize,
    width: usize,
    channels: usize,
    labels: Vec<u32>,
    num_classes: usize,
    class_names: Option<Vec<String>>,
}

impl Dataset {
    /// Builds a data set from NHWC pixels `[n, h, w, c]` and one label per image.
    ///
    /// # Errors
    /// - [`TrainError::EmptyDataset`] when `n == 0`;
    /// - [`TrainError::BadShape`] when `h`, `w`, `c` or `num_classes` is zero, `num_classes`
    ///   exceeds [`npy::MAX_CLASSES`], or `n * h * w * c` overflows;
    /// - [`TrainError::ShapeMismatch`] when `pixels` does not hold `n * h * w * c` values or
    ///   `labels` does not hold `n`;
    /// - [`TrainError::LabelOutOfRange`] for a label `>= num_classes`;
    /// - [`TrainError::NonFinite`] for a NaN or infinite `f32` pixel.
    pub fn new(
        pixels: Pixels,
        n: usize,
        height: usize,
        width: usize,
        channels: usize,
        labels: Vec<u32>,
        num_classes: usize,
    ) -> Result<Self, TrainError> {
        let dims = [n, height, width, channels];
        Self::build("dataset", pixels, dims, labels, num_classes, None)
    }

    /// As [`Dataset::new`] for data read from `source`'s files by `op`: errors name the file
    /// and the first bad element.
    pub(crate) fn build(
        op: &'static str,
        pixels: Pixels,
        [n, height, width, channels]: [usize; 4],
        labels: Vec<u32>,
        num_classes: usize,
        source: Option<Source>,
    ) -> Result<Self, TrainError> {
        let images_path = source.as_ref().map(|s| s.images.as_path());
        let labels_path = source.as_ref().map(|s| s.labels.as_path());
        if n == 0 {
            return Err(TrainError::EmptyDataset {
                op,
                path: images_path.map(Path::to_path_buf),
            });
        }
        let shape = [n, height, width, channels];
        let total = checked_volume(&shape)
            .filter(|_| height > 0 && width > 0 && channels > 0)
            .ok_or_else(|| TrainError::BadShape {
                op,
                what: "images".into(),
                shape: shape.iter().map(|&d| d as u64).collect(),
                expected: "h, w and c must be at least 1 and n * h * w * c must fit in usize",
            })?;
        if pixels.len() != total {
            return Err(TrainError::ShapeMismatch {
                op,
                what: "pixels",
                expected: vec![total],
                found: vec![pixels.len()],
            });
        }
        if labels.len() != n {
            return Err(TrainError::ShapeMismatch {
                op,
                what: "labels",
                expected: vec![n],
                found: vec![labels.len()],
            });
        }
        check_labels(op, labels_path, &labels, num_classes)?;
        if let Pixels::F32(values) = &pixels {
            check_finite(op, images_path, values, height * width * channels)?;
        }
        Ok(Self {
            scaling: PixelScaling::default_for(&pixels),
            pixels,
            source,
            n,
            height,
            width,
            channels,
            labels,
            num_classes,
            class_names: None,
        })
    }

    /// The data set with `scaling` applied to every pixel read (the default is
    /// [`PixelScaling::default_for`] the pixels' type).
    pub fn with_scaling(mut self, scaling: PixelScaling) -> Self {
        self.scaling = scaling;
        self
    }

    /// The scaling applied to every pixel read ([`Dataset::image_f32`], the loaders).
    pub fn scaling(&self) -> PixelScaling {
        self.scaling
    }

    /// The images' file the data set was read from (inside an `.npz`: `archive.npz/key.npy`;
    /// `embedded:/..` for the embedded set), None for data made in memory.
    pub fn images_path(&self) -> Option<&Path> {
        self.source.as_ref().map(|s| s.images.as_path())
    }

    /// The labels' file the data set was read from, None for data made in memory.
    pub fn labels_path(&self) -> Option<&Path> {
        self.source.as_ref().map(|s| s.labels.as_path())
    }

    /// Attaches one name per class (e.g. `["T-shirt/top", "Trouser"]`).
    ///
    /// # Errors
    /// [`TrainError::ShapeMismatch`] when `names.len() != num_classes`.
    pub fn with_class_names(mut self, names: Vec<String>) -> Result<Self, TrainError> {
        if names.len() != self.num_classes {
            return Err(TrainError::ShapeMismatch {
                op: "with_class_names",
                what: "class names",
                expected: vec![self.num_classes],
                found: vec![names.len()],
            });
        }
        self.class_names = Some(names);
        Ok(self)
    }

    /// Sets the number of classes (loaders infer `max label + 1`; a subset of classes or a
    /// model with more outputs may need more). Class names are dropped if their count no
    /// longer matches.
    ///
    /// # Errors
    /// [`TrainError::LabelOutOfRange`] when a label is `>= num_classes`;
    /// [`TrainError::BadShape`] when `num_classes == 0`.
    pub fn with_num_classes(mut self, num_classes: usize) -> Result<Self, TrainError> {
        const OP: &str = "with_num_classes";
        check_labels(OP, self.labels_path(), &self.labels, num_classes)?;
        if self
            .class_names
            .as_ref()
            .is_some_and(|c| c.len() != num_classes)
        {
            self.class_names = None;
        }
        self.num_classes = num_classes;
        Ok(self)
    }

    /// The number of images.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Always `false`: a data set is never empty ([`Dataset::new`] refuses `n == 0`).
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The stored image shape `(h, w, c)`.
    pub fn image_shape(&self) -> (usize, usize, usize) {
        (self.height, self.width, self.channels)
    }

    /// Values per image, `h * w * c`.
    pub fn image_len(&self) -> usize {
        self.height * self.width * self.channels
    }

    /// The number of classes `K` (labels lie in `0..K`).
    pub fn num_classes(&self) -> usize {
        self.num_classes
    }

    /// One label per image, each `< num_classes()`.
    pub fn labels(&self) -> &[u32] {
        &self.labels
    }

    /// The stored pixels, NHWC.
    pub fn pixels(&self) -> &Pixels {
        &self.pixels
    }

    /// The class names, when known (one per class).
    pub fn class_names(&self) -> Option<&[String]> {
        self.class_names.as_deref()
    }

    /// How many images each class has: `counts[k]` for `k < num_classes()`.
    pub fn class_counts(&self) -> Vec<usize> {
        let mut counts = vec![0; self.num_classes];
        for &l in &self.labels {
            counts[l as usize] += 1;
        }
        counts
    }

    /// Writes image `index` as `f32`, scaled by [`Dataset::scaling`], HWC, into `out`
    /// (`out.len() == image_len()`).
    ///
    /// # Errors
    /// [`TrainError::IndexOutOfRange`] for `index >= len()`; [`TrainError::ShapeMismatch`]
    /// when `out` has the wrong length.
    pub fn image_f32(&self, index: usize, out: &mut [f32]) -> Result<(), TrainError> {
        const OP: &str = "image_f32";
        self.check_index(OP, index)?;
        if out.len() != self.image_len() {
            return Err(TrainError::ShapeMismatch {
                op: OP,
                what: "output buffer",
                expected: vec![self.height, self.width, self.channels],
                found: vec![out.len()],
            });
        }
        self.pixels
            .read_f32(index * self.image_len(), out, self.scaling);
        Ok(())
    }

    /// A new data set of the given examples, in the given order (repeats allowed); classes and
    /// class names are kept.
    ///
    /// # Errors
    /// [`TrainError::EmptyDataset`] for no indices; [`TrainError::IndexOutOfRange`].
    pub fn subset(&self, indices: &[usize]) -> Result<Self, TrainError> {
        const OP: &str = "subset";
        if indices.is_empty() {
            return Err(TrainError::EmptyDataset { op: OP, path: None });
        }
        let per = self.image_len();
        for &i in indices {
            self.check_index(OP, i)?;
        }
        let pixels = match &self.pixels {
            Pixels::U8(v) => Pixels::U8(gather(v, indices, per)),
            Pixels::F32(v) => Pixels::F32(gather(v, indices, per)),
        };
        Ok(Self {
            pixels,
            scaling: self.scaling,
            source: self.source.clone(),
            n: indices.len(),
            height: self.height,
            width: self.width,
            channels: self.channels,
            labels: indices.iter().map(|&i| self.labels[i]).collect(),
            num_classes: self.num_classes,
            class_names: self.class_names.clone(),
        })
    }

    /// Splits into the first `k` examples and the rest (e.g. train / validation).
    ///
    /// # Errors
    /// [`TrainError::EmptyDataset`] when either part would be empty (`k == 0` or `k >= len()`).
    pub fn split_at(&self, k: usize) -> Result<(Self, Self), TrainError> {
        if k == 0 || k >= self.n {
            return Err(TrainError::EmptyDataset {
                op: "split_at",
                path: None,
            });
        }
        let head: Vec<usize> = (0..k).collect();
        let tail: Vec<usize> = (k..self.n).collect();
        Ok((self.subset(&head)?, self.subset(&tail)?))
    }

    fn check_index(&self, op: &'static str, index: usize) -> Result<(), TrainError> {
        if index >= self.n {
            return Err(TrainError::IndexOutOfRange {
                op,
                index,
                len: self.n,
            });
        }
        Ok(())
    }
}

/// The product of `dims`, or `None` on overflow.
pub(crate) fn checked_volume(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

fn gather<T: Copy>(values: &[T], indices: &[usize], per: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(indices.len() * per);
    for &i in indices {
        out.extend_from_slice(&values[i * per..(i + 1) * per]);
    }
    out
}

/// Checks `num_classes >= 1` and every label `< num_classes` (labels read from `path`).
fn check_labels(
    op: &'static str,
    path: Option<&Path>,
    labels: &[u32],
    num_classes: usize,
) -> Result<(), TrainError> {
    if num_classes == 0 || num_classes > MAX_CLASSES {
        return Err(TrainError::BadShape {
            op,
            what: "labels".into(),
            shape: vec![labels.len() as u64, num_classes as u64],
            expected: "from 1 to MAX_CLASSES (65,536) classes",
        });
    }
    match labels.iter().position(|&l| l as usize >= num_classes) {
        Some(index) => Err(TrainError::LabelOutOfRange {
            op,
            path: path.map(Path::to_path_buf),
            index,
            label: i64::from(labels[index]),
            num_classes,
        }),
        None => Ok(()),
    }
}

/// Checks every pixel (read from `path`) is finite.
fn check_finite(
    op: &'static str,
    path: Option<&Path>,
    values: &[f32],
    per_image: usize,
) -> Result<(), TrainError> {
    match values.iter().position(|x| !x.is_finite()) {
        Some(pos) => Err(TrainError::NonFinite {
            op,
            path: path.map(Path::to_path_buf),
            index: pos / per_image,
            element: pos % per_image,
            value_kind: NonFiniteKind::of(values[pos]).unwrap_or(NonFiniteKind::NaN),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests;
