//! Host data sets and loaders.
//!
//! A [`Dataset`] holds images on the host, compactly, in NHWC order (`[n, h, w, c]`) as `u8`
//! or `f32` ([`Pixels`]), with one class label per image. Pixel convention: a `u8` value `x`
//! means `x / 255` (so images lie in `[0, 1]`); an `f32` value is used as is. Every
//! constructor validates its input and returns a typed [`TrainError`] instead of panicking.
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
pub mod resize;

pub use embedded::fashion_mnist_2class;
pub use loader::Loader;

use crate::error::{NonFiniteKind, TrainError};

/// Image storage, NHWC (`[n, h, w, c]`, channels fastest).
///
/// `U8(x)` means the value `x / 255`; `F32(x)` is used as is (and must be finite).
#[derive(Debug, Clone, PartialEq)]
pub enum Pixels {
    /// One byte per value, scaled by `1 / 255` when read.
    U8(Vec<u8>),
    /// One `f32` per value, used as is.
    F32(Vec<f32>),
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

    /// Writes values `start..start + out.len()` as `f32` into `out`, applying the `u8`
    /// scale `x / 255`.
    fn read_f32(&self, start: usize, out: &mut [f32]) {
        match self {
            Pixels::U8(v) => {
                let end = start + out.len();
                for (o, &b) in out.iter_mut().zip(&v[start..end]) {
                    *o = f32::from(b) / 255.0;
                }
            }
            Pixels::F32(v) => out.copy_from_slice(&v[start..start + out.len()]),
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
    /// - [`TrainError::BadShape`] when `h`, `w`, `c` or `num_classes` is zero, or
    ///   `n * h * w * c` overflows;
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
        const OP: &str = "dataset";
        if n == 0 {
            return Err(TrainError::EmptyDataset { op: OP });
        }
        let shape = [n, height, width, channels];
        let total = checked_volume(&shape)
            .filter(|_| height > 0 && width > 0 && channels > 0)
            .ok_or_else(|| TrainError::BadShape {
                op: OP,
                what: "images".into(),
                shape: shape.iter().map(|&d| d as u64).collect(),
                expected: "h, w and c must be at least 1 and n * h * w * c must fit in usize",
            })?;
        if pixels.len() != total {
            return Err(TrainError::ShapeMismatch {
                op: OP,
                what: "pixels",
                expected: vec![total],
                found: vec![pixels.len()],
            });
        }
        if labels.len() != n {
            return Err(TrainError::ShapeMismatch {
                op: OP,
                what: "labels",
                expected: vec![n],
                found: vec![labels.len()],
            });
        }
        check_labels(OP, &labels, num_classes)?;
        if let Pixels::F32(values) = &pixels {
            check_finite(OP, values, height * width * channels)?;
        }
        Ok(Self {
            pixels,
            n,
            height,
            width,
            channels,
            labels,
            num_classes,
            class_names: None,
        })
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
        check_labels(OP, &self.labels, num_classes)?;
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

    /// Writes image `index` as `f32` (`u8` scaled by `1 / 255`), HWC, into `out`
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
        self.pixels.read_f32(index * self.image_len(), out);
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
            return Err(TrainError::EmptyDataset { op: OP });
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
            return Err(TrainError::EmptyDataset { op: "split_at" });
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

/// Checks `num_classes >= 1` and every label `< num_classes`.
fn check_labels(op: &'static str, labels: &[u32], num_classes: usize) -> Result<(), TrainError> {
    if num_classes == 0 {
        return Err(TrainError::BadShape {
            op,
            what: "labels".into(),
            shape: vec![labels.len() as u64, 0],
            expected: "there must be at least one class",
        });
    }
    match labels.iter().position(|&l| l as usize >= num_classes) {
        Some(index) => Err(TrainError::LabelOutOfRange {
            op,
            index,
            label: i64::from(labels[index]),
            num_classes,
        }),
        None => Ok(()),
    }
}

fn check_finite(op: &'static str, values: &[f32], per_image: usize) -> Result<(), TrainError> {
    match values.iter().position(|x| !x.is_finite()) {
        Some(pos) => Err(TrainError::NonFinite {
            op,
            index: pos / per_image,
            element: pos % per_image,
            value_kind: NonFiniteKind::of(values[pos]).unwrap_or(NonFiniteKind::NaN),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Dataset {
        // Three 2x2x1 images with values i*10 + pixel.
        let px: Vec<u8> = (0..3)
            .flat_map(|i| (0..4).map(move |p| i * 10 + p))
            .collect();
        Dataset::new(Pixels::U8(px), 3, 2, 2, 1, vec![0, 1, 1], 2).unwrap()
    }

    #[test]
    fn new_accepts_valid_and_reports_shape() {
        let ds = tiny();
        assert_eq!(ds.len(), 3);
        assert!(!ds.is_empty());
        assert_eq!(ds.image_shape(), (2, 2, 1));
        assert_eq!(ds.class_counts(), vec![1, 2]);
    }

    #[test]
    fn empty_dataset_is_an_error() {
        let e = Dataset::new(Pixels::U8(vec![]), 0, 2, 2, 1, vec![], 2).unwrap_err();
        assert!(matches!(e, TrainError::EmptyDataset { .. }), "{e}");
        assert_eq!(e.to_string(), "dataset: the data set is empty");
    }

    #[test]
    fn pixel_and_label_count_mismatches() {
        let e = Dataset::new(Pixels::U8(vec![0; 7]), 2, 2, 2, 1, vec![0, 1], 2).unwrap_err();
        assert!(
            matches!(e, TrainError::ShapeMismatch { what: "pixels", .. }),
            "{e}"
        );
        let e = Dataset::new(Pixels::U8(vec![0; 8]), 2, 2, 2, 1, vec![0], 2).unwrap_err();
        assert!(
            matches!(e, TrainError::ShapeMismatch { what: "labels", .. }),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            "dataset: labels has shape [1] but [2] is required"
        );
        let e = Dataset::new(Pixels::U8(vec![]), 2, 0, 2, 1, vec![0, 1], 2).unwrap_err();
        assert!(matches!(e, TrainError::BadShape { .. }), "{e}");
        let e = Dataset::new(Pixels::U8(vec![0; 8]), 2, 2, 2, 1, vec![0, 0], 0).unwrap_err();
        assert!(matches!(e, TrainError::BadShape { .. }), "{e}");
    }

    #[test]
    fn label_out_of_range() {
        let e = Dataset::new(Pixels::U8(vec![0; 8]), 2, 2, 2, 1, vec![0, 2], 2).unwrap_err();
        assert!(
            matches!(
                e,
                TrainError::LabelOutOfRange {
                    index: 1,
                    label: 2,
                    num_classes: 2,
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            "dataset: label 2 of example 1 is out of range for 2 classes"
        );
    }

    #[test]
    fn nan_and_inf_in_f32_images_are_reported() {
        let cases = [
            (6, f32::NAN, NonFiniteKind::NaN),
            (0, f32::NEG_INFINITY, NonFiniteKind::NegInf),
            (5, f32::INFINITY, NonFiniteKind::PosInf),
        ];
        for (at, value, kind) in cases {
            let mut px = vec![0.5f32; 8];
            px[at] = value;
            match Dataset::new(Pixels::F32(px), 2, 2, 2, 1, vec![0, 1], 2) {
                Err(TrainError::NonFinite {
                    index,
                    element,
                    value_kind,
                    ..
                }) => {
                    assert_eq!((index, element, value_kind), (at / 4, at % 4, kind));
                }
                other => panic!("{value}: expected NonFinite, got {other:?}"),
            }
        }
        let mut px = vec![0.5f32; 8];
        px[6] = f32::NAN;
        let e = Dataset::new(Pixels::F32(px), 2, 2, 2, 1, vec![0, 1], 2).unwrap_err();
        let want = "dataset: image 1 holds NaN at element 2 (h, w, c flattened)";
        assert_eq!(e.to_string(), want);
    }

    #[test]
    fn subset_and_split_keep_images_with_labels() {
        let ds = tiny()
            .with_class_names(vec!["a".into(), "b".into()])
            .unwrap();
        let s = ds.subset(&[2, 0]).unwrap();
        assert_eq!(s.labels(), &[1, 0]);
        assert_eq!(s.pixels(), &Pixels::U8(vec![20, 21, 22, 23, 0, 1, 2, 3]));
        assert_eq!(s.class_names().unwrap(), ["a", "b"]);
        let (a, b) = ds.split_at(1).unwrap();
        assert_eq!((a.len(), b.len()), (1, 2));
        assert_eq!(b.labels(), &[1, 1]);
        assert!(matches!(
            ds.split_at(3),
            Err(TrainError::EmptyDataset { .. })
        ));
        assert!(matches!(
            ds.subset(&[]),
            Err(TrainError::EmptyDataset { .. })
        ));
        assert!(matches!(
            ds.subset(&[3]),
            Err(TrainError::IndexOutOfRange {
                index: 3,
                len: 3,
                ..
            })
        ));
    }

    #[test]
    fn image_f32_scales_u8() {
        let ds = tiny();
        let mut out = [0.0f32; 4];
        ds.image_f32(2, &mut out).unwrap();
        assert_eq!(
            out,
            [20.0 / 255.0, 21.0 / 255.0, 22.0 / 255.0, 23.0 / 255.0]
        );
        assert!(ds.image_f32(3, &mut out).is_err());
        assert!(ds.image_f32(0, &mut [0.0; 3]).is_err());
    }

    #[test]
    fn class_names_and_num_classes() {
        let ds = tiny();
        assert!(ds.clone().with_class_names(vec!["a".into()]).is_err());
        let ds = ds.with_num_classes(5).unwrap();
        assert_eq!(ds.class_counts(), vec![1, 2, 0, 0, 0]);
        assert!(matches!(
            ds.with_num_classes(1),
            Err(TrainError::LabelOutOfRange { .. })
        ));
    }
}
