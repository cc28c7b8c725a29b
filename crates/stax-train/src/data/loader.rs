//! Epochs as seeded permutations, batches of example indices, and filling host batch buffers.
//!
//! Shuffling algorithm (fixed, so orders are reproducible across runs, platforms and
//! `rand` upgrades that keep these named algorithms):
//!
//! 1. the epoch's generator is `Xoshiro256PlusPlus::seed_from_u64(seed ^ (epoch * φ))`, with
//!    `φ = 0x9E37_79B9_7F4A_7C15` (the golden-ratio constant, wrapping multiply), so
//!    `(seed, epoch)` pairs do not collide the way `seed ^ epoch` would; `seed_from_u64`
//!    expands the word with SplitMix64;
//! 2. the order starts as `0..len` and is shuffled by Fisher–Yates, high to low: for
//!    `i = len - 1 .. 1`, swap `order[i]` with `order[j]`, `j` uniform in `0..=i`;
//! 3. `j` is drawn from `next_u64` by Lemire's multiply-and-reject method ("Fast random
//!    integer generation in an interval", 2019), which is unbiased.
//!
//! An epoch holds `len / batch_size` full batches, the last incomplete batch dropped (as the
//! seed's loop `num_batches = len // batch_size` does); [`Loader::eval_batches`] covers every
//! example once, in order, for evaluation.
//!
//! ```
//! use stax_train::data::Loader;
//!
//! let loader = Loader::new(10, 4, 7)?;
//! assert_eq!(loader.num_batches(), 2);
//! let batches: Vec<Vec<usize>> = loader.batches(0).collect();
//! assert_eq!(batches.len(), 2);
//! assert_eq!(batches, loader.batches(0).collect::<Vec<_>>()); // same seed, same order
//! # Ok::<(), stax_train::TrainError>(())
//! ```

use rand::rngs::Xoshiro256PlusPlus;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;

use super::Dataset;
use super::resize::{check_resizable, resize_bilinear};
use crate::error::TrainError;

const PHI: u64 = 0x9E37_79B9_7F4A_7C15;

/// Seeded epochs of batches over a data set of `len` examples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loader {
    len: usize,
    batch_size: usize,
    seed: u64,
}

impl Loader {
    /// A loader for `len` examples in batches of `batch_size`, shuffled from `seed`.
    ///
    /// # Errors
    /// [`TrainError::EmptyDataset`] when `len == 0`; [`TrainError::ZeroBatchSize`];
    /// [`TrainError::BatchTooLarge`] when `batch_size > len` (an epoch would be empty).
    pub fn new(len: usize, batch_size: usize, seed: u64) -> Result<Self, TrainError> {
        if len == 0 {
            return Err(TrainError::EmptyDataset {
                op: "loader",
                path: None,
            });
        }
        if batch_size == 0 {
            return Err(TrainError::ZeroBatchSize { op: "loader" });
        }
        if batch_size > len {
            return Err(TrainError::BatchTooLarge {
                batch: batch_size,
                len,
            });
        }
        Ok(Self {
            len,
            batch_size,
            seed,
        })
    }

    /// The number of examples.
    pub fn dataset_len(&self) -> usize {
        self.len
    }

    /// Examples per batch.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// The seed the epochs are drawn from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Full batches per epoch, `len / batch_size` (the last incomplete batch is dropped).
    pub fn num_batches(&self) -> usize {
        self.len / self.batch_size
    }

    /// Steps of `epochs` passes: `epochs * num_batches()`, capped at `max_steps`.
    ///
    /// # Errors
    /// [`TrainError::TooManySteps`] when the product overflows `u64` (it never wraps to a
    /// smaller count).
    pub fn steps(&self, epochs: u64, max_steps: Option<u64>) -> Result<u64, TrainError> {
        let steps =
            (self.num_batches() as u64)
                .checked_mul(epochs)
                .ok_or(TrainError::TooManySteps {
                    epochs,
                    per_epoch: self.num_batches() as u64,
                })?;
        Ok(steps.min(max_steps.unwrap_or(u64::MAX)))
    }

    /// The epoch's order of all `len` examples: a permutation of `0..len` (algorithm in the
    /// module doc), the same for the same `(seed, epoch)`.
    pub fn permutation(&self, epoch: u64) -> Vec<usize> {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(self.seed ^ epoch.wrapping_mul(PHI));
        let mut order: Vec<usize> = (0..self.len).collect();
        for i in (1..order.len()).rev() {
            let j = below(&mut rng, i as u64 + 1) as usize;
            order.swap(i, j);
        }
        order
    }

    /// The epoch's batches: [`Loader::num_batches`] lists of `batch_size` example indices,
    /// consecutive slices of [`Loader::permutation`].
    pub fn batches(&self, epoch: u64) -> Batches {
        let mut order = self.permutation(epoch);
        order.truncate(self.num_batches() * self.batch_size);
        Batches {
            order,
            batch_size: self.batch_size,
            next: 0,
        }
    }

    /// Every example once, in order `0..len`, in batches of `batch_size` with the last one
    /// possibly shorter: for evaluation, where no example may be dropped.
    pub fn eval_batches(&self) -> Batches {
        Batches {
            order: (0..self.len).collect(),
            batch_size: self.batch_size,
            next: 0,
        }
    }

    /// Fills caller-provided host buffers with the examples `indices` of `dataset`; see
    /// [`fill_batch`]. Taking `&mut [f32]` lets the caller choose the memory (a pageable
    /// `Vec`, a pinned staging buffer).
    ///
    /// # Errors
    /// As [`fill_batch`].
    pub fn fill_batch(
        &self,
        dataset: &Dataset,
        indices: &[usize],
        out_hwc: (usize, usize, usize),
        images: &mut [f32],
        labels_onehot: &mut [f32],
    ) -> Result<(), TrainError> {
        fill_batch(dataset, indices, out_hwc, images, labels_onehot)
    }
}

/// An epoch's batches of example indices (see [`Loader::batches`]).
#[derive(Debug, Clone)]
pub struct Batches {
    order: Vec<usize>,
    batch_size: usize,
    next: usize,
}

impl Iterator for Batches {
    type Item = Vec<usize>;

    fn next(&mut self) -> Option<Vec<usize>> {
        if self.next >= self.order.len() {
            return None;
        }
        let end = (self.next + self.batch_size).min(self.order.len());
        let batch = self.order[self.next..end].to_vec();
        self.next = end;
        Some(batch)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = (self.order.len() - self.next).div_ceil(self.batch_size);
        (left, Some(left))
    }
}

impl ExactSizeIterator for Batches {}

/// A uniform integer in `0..bound` (`bound >= 1`) by Lemire's multiply-and-reject method.
fn below(rng: &mut impl Rng, bound: u64) -> u64 {
    let mut m = u128::from(rng.next_u64()) * u128::from(bound);
    if (m as u64) < bound {
        let threshold = bound.wrapping_neg() % bound;
        while (m as u64) < threshold {
            m = u128::from(rng.next_u64()) * u128::from(bound);
        }
    }
    (m >> 64) as u64
}

/// Fills `images` and `labels_onehot` with the examples `indices` of `dataset`.
///
/// - `out_hwc = (oh, ow, oc)` is the model's input shape; images are converted to `f32`
///   (scaled as [`Dataset::scaling`] says), resized by [`resize_bilinear`] when `(oh, ow)` differs from
///   the stored `(h, w)`, and gray replicated when `oc > 1 = c`.
/// - `images`: NHWC `[indices.len(), oh, ow, oc]`, fully overwritten.
/// - `labels_onehot`: `[indices.len(), num_classes]`, row `b` all zeros but a 1 at the label of
///   example `indices[b]`.
///
/// Any number of indices (at least one) may be given, so a last, shorter evaluation batch
/// works. Nothing is written when an error is returned.
///
/// # Errors
/// [`TrainError::ZeroBatchSize`] for no indices; [`TrainError::BadShape`] for a zero extent
/// in `out_hwc`; [`TrainError::BadChannels`] when `oc != c` and `c != 1`;
/// [`TrainError::ShapeMismatch`] for buffers of the wrong length;
/// [`TrainError::IndexOutOfRange`] for an index `>= dataset.len()`.
pub fn fill_batch(
    dataset: &Dataset,
    indices: &[usize],
    out_hwc: (usize, usize, usize),
    images: &mut [f32],
    labels_onehot: &mut [f32],
) -> Result<(), TrainError> {
    const OP: &str = "fill_batch";
    let (k, b) = (dataset.num_classes(), indices.len());
    check_images(OP, dataset, indices, out_hwc, images.len())?;
    check_labels(OP, labels_onehot.len(), vec![b, k])?;
    check_indices(OP, dataset, indices)?;
    write_images(dataset, indices, out_hwc, images)?;
    labels_onehot.fill(0.0);
    for (&i, row) in indices.iter().zip(labels_onehot.chunks_exact_mut(k)) {
        row[dataset.labels()[i] as usize] = 1.0;
    }
    Ok(())
}

/// Fills `labels` (`[indices.len()]`) with the class indices of the examples `indices` of
/// `dataset`: the labels of the losses with integer labels. Nothing is written on error.
///
/// # Errors
/// [`TrainError::ZeroBatchSize`] for no indices; [`TrainError::ShapeMismatch`] for a buffer of
/// the wrong length; [`TrainError::IndexOutOfRange`] for an index `>= dataset.len()`.
pub fn fill_label_indices(
    dataset: &Dataset,
    indices: &[usize],
    labels: &mut [u32],
) -> Result<(), TrainError> {
    const OP: &str = "fill_label_indices";
    if indices.is_empty() {
        return Err(TrainError::ZeroBatchSize { op: OP });
    }
    check_labels(OP, labels.len(), vec![indices.len()])?;
    check_indices(OP, dataset, indices)?;
    for (&i, l) in indices.iter().zip(labels.iter_mut()) {
        *l = dataset.labels()[i];
    }
    Ok(())
}

fn check_labels(op: &'static str, len: usize, expected: Vec<usize>) -> Result<(), TrainError> {
    if len == expected.iter().product::<usize>() {
        return Ok(());
    }
    Err(TrainError::ShapeMismatch {
        op,
        what: "labels buffer",
        expected,
        found: vec![len],
    })
}

fn check_indices(op: &'static str, dataset: &Dataset, indices: &[usize]) -> Result<(), TrainError> {
    match indices.iter().find(|&&i| i >= dataset.len()) {
        Some(&index) => Err(TrainError::IndexOutOfRange {
            op,
            index,
            len: dataset.len(),
        }),
        None => Ok(()),
    }
}

/// Fills `images` with the examples `indices` of `dataset`, as [`fill_batch`] does (without
/// labels).
///
/// # Errors
/// As [`fill_batch`].
pub fn fill_images(
    dataset: &Dataset,
    indices: &[usize],
    out_hwc: (usize, usize, usize),
    images: &mut [f32],
) -> Result<(), TrainError> {
    const OP: &str = "fill_images";
    check_images(OP, dataset, indices, out_hwc, images.len())?;
    check_indices(OP, dataset, indices)?;
    write_images(dataset, indices, out_hwc, images)
}

/// Checks a batch of `indices` for an images buffer of `len` f32 of shape `out_hwc`.
fn check_images(
    op: &'static str,
    dataset: &Dataset,
    indices: &[usize],
    out_hwc: (usize, usize, usize),
    len: usize,
) -> Result<(), TrainError> {
    let (oh, ow, oc) = out_hwc;
    let b = indices.len();
    if b == 0 {
        return Err(TrainError::ZeroBatchSize { op });
    }
    check_resizable(op, dataset.image_shape(), out_hwc)?;
    let per_out = super::checked_volume(&[oh, ow, oc]).unwrap_or(usize::MAX);
    if super::checked_volume(&[b, per_out]) != Some(len) {
        return Err(TrainError::ShapeMismatch {
            op,
            what: "images buffer",
            expected: vec![b, oh, ow, oc],
            found: vec![len],
        });
    }
    Ok(())
}

/// Writes the checked batch's images.
fn write_images(
    dataset: &Dataset,
    indices: &[usize],
    out_hwc: (usize, usize, usize),
    images: &mut [f32],
) -> Result<(), TrainError> {
    let (oh, ow, oc) = out_hwc;
    let (h, w, c) = dataset.image_shape();
    let per_out = oh * ow * oc;

    // One image per task, in parallel (rayon): resizing a batch of 100 to 200x200 takes
    // ~20 ms on one core, longer than the seed's step on an H200.
    let same = (h, w, c) == (oh, ow, oc);
    let scratch = || {
        if same {
            Vec::new()
        } else {
            vec![0.0f32; dataset.image_len()]
        }
    };
    indices
        .par_iter()
        .zip(images.par_chunks_exact_mut(per_out))
        .try_for_each_init(scratch, |scratch, (&i, out)| {
            if same {
                dataset.image_f32(i, out)
            } else {
                dataset.image_f32(i, scratch)?;
                resize_bilinear(scratch, (h, w, c), out, out_hwc)
            }
        })
}

#[cfg(test)]
mod tests {

    #[test]
    fn step_counts_that_overflow_are_errors_not_zero() {
        let loader = super::Loader::new(2000, 100, 0).unwrap();
        assert_eq!(loader.steps(2, None).unwrap(), 40);
        assert_eq!(loader.steps(2, Some(7)).unwrap(), 7);
        let e = loader.steps(9_223_372_036_854_775_808, None).unwrap_err();
        assert!(
            matches!(e, crate::TrainError::TooManySteps { per_epoch: 20, .. }),
            "{e}"
        );
    }
    use super::*;
    use crate::data::Pixels;

    fn is_permutation(order: &[usize], len: usize) -> bool {
        let mut sorted = order.to_vec();
        sorted.sort_unstable();
        sorted == (0..len).collect::<Vec<_>>()
    }

    #[test]
    fn same_seed_same_order_and_each_epoch_a_permutation() {
        let a = Loader::new(1000, 100, 42).unwrap();
        let b = Loader::new(1000, 100, 42).unwrap();
        for epoch in 0..4 {
            let p = a.permutation(epoch);
            assert!(is_permutation(&p, 1000));
            assert_eq!(p, b.permutation(epoch));
        }
        assert_ne!(a.permutation(0), a.permutation(1));
        assert_ne!(
            a.permutation(0),
            Loader::new(1000, 100, 43).unwrap().permutation(0)
        );
        assert_ne!(a.permutation(0), (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn order_is_pinned() {
        // Guards the documented algorithm: a change here changes every run's batches.
        let p = Loader::new(10, 1, 0).unwrap().permutation(0);
        assert!(is_permutation(&p, 10));
        assert_eq!(p, PINNED);
    }
    const PINNED: [usize; 10] = [1, 4, 5, 8, 6, 7, 0, 2, 9, 3];

    #[test]
    fn batches_drop_the_last_incomplete_one() {
        let l = Loader::new(10, 3, 1).unwrap();
        assert_eq!(l.num_batches(), 3);
        let batches: Vec<_> = l.batches(5).collect();
        assert_eq!(batches.len(), 3);
        assert!(batches.iter().all(|b| b.len() == 3));
        let flat: Vec<usize> = batches.concat();
        assert_eq!(flat, l.permutation(5)[..9]);
        assert_eq!(l.batches(5).len(), 3);
        let eval: Vec<_> = l.eval_batches().collect();
        assert_eq!(
            eval,
            vec![vec![0, 1, 2], vec![3, 4, 5], vec![6, 7, 8], vec![9]]
        );
    }

    #[test]
    fn bad_batch_sizes() {
        let e = Loader::new(10, 11, 0).unwrap_err();
        assert!(
            matches!(e, TrainError::BatchTooLarge { batch: 11, len: 10 }),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            "loader: batch size 11 is larger than the data set (10 examples)"
        );
        assert!(matches!(
            Loader::new(10, 0, 0),
            Err(TrainError::ZeroBatchSize { .. })
        ));
        assert!(matches!(
            Loader::new(0, 1, 0),
            Err(TrainError::EmptyDataset { .. })
        ));
        assert_eq!(Loader::new(10, 10, 0).unwrap().num_batches(), 1);
    }

    #[test]
    fn below_is_in_range_and_roughly_uniform() {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(9);
        let mut counts = [0usize; 3];
        for _ in 0..30_000 {
            counts[below(&mut rng, 3) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (9_000..11_000).contains(&c)),
            "{counts:?}"
        );
        assert_eq!(below(&mut rng, 1), 0);
    }

    fn gray() -> Dataset {
        // Two 2x2 gray images: [0, 51, 102, 255] and all 255; labels 2 and 0 of 3 classes.
        let px = vec![0, 51, 102, 255, 255, 255, 255, 255];
        Dataset::new(Pixels::U8(px), 2, 2, 2, 1, vec![2, 0], 3).unwrap()
    }

    #[test]
    fn fill_batch_native_size_scales_and_one_hots() {
        let ds = gray();
        let (mut x, mut y) = (vec![f32::NAN; 8], vec![f32::NAN; 6]);
        fill_batch(&ds, &[1, 0], (2, 2, 1), &mut x, &mut y).unwrap();
        assert_eq!(x, [1.0, 1.0, 1.0, 1.0, 0.0, 0.2, 0.4, 1.0]);
        assert_eq!(y, [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]);
    }

    #[test]
    fn fill_batch_resizes_and_replicates() {
        let ds = gray();
        let (mut x, mut y) = (vec![f32::NAN; 4 * 4 * 3], vec![0.0; 3]);
        fill_batch(&ds, &[0], (4, 4, 3), &mut x, &mut y).unwrap();
        let mut want = vec![0.0; 4 * 4 * 3];
        resize_bilinear(&[0.0, 0.2, 0.4, 1.0], (2, 2, 1), &mut want, (4, 4, 3)).unwrap();
        assert_eq!(x, want);
        assert_eq!(x[..3], [0.0; 3]);
        assert_eq!(y, [0.0, 0.0, 1.0]);
        // The all-white image stays exactly white at any size.
        let mut x = vec![0.0; 200 * 200 * 3];
        fill_batch(&ds, &[1], (200, 200, 3), &mut x, &mut y).unwrap();
        assert!(x.iter().all(|&v| v == 1.0));
    }

    #[test]
    fn label_indices_and_images_alone() {
        let ds = gray();
        let mut y = [7u32; 3];
        fill_label_indices(&ds, &[1, 0, 0], &mut y).unwrap();
        assert_eq!(y, [0, 2, 2]);
        let e = fill_label_indices(&ds, &[0, 2], &mut y[..2]).unwrap_err();
        assert!(
            matches!(e, TrainError::IndexOutOfRange { index: 2, .. }),
            "{e}"
        );
        let e = fill_label_indices(&ds, &[0], &mut y).unwrap_err();
        assert!(matches!(e, TrainError::ShapeMismatch { .. }), "{e}");
        assert_eq!(y, [0, 2, 2], "written before failing");
        let mut x = vec![f32::NAN; 4];
        fill_images(&ds, &[0], (2, 2, 1), &mut x).unwrap();
        assert_eq!(x, [0.0, 0.2, 0.4, 1.0]);
    }

    #[test]
    fn fill_batch_errors() {
        let ds = gray();
        let (mut x, mut y) = (vec![0.0; 8], vec![0.0; 6]);
        let e = fill_batch(&ds, &[0, 2], (2, 2, 1), &mut x, &mut y).unwrap_err();
        assert!(
            matches!(
                e,
                TrainError::IndexOutOfRange {
                    index: 2,
                    len: 2,
                    ..
                }
            ),
            "{e}"
        );
        let e = fill_batch(&ds, &[0], (2, 2, 1), &mut x, &mut y).unwrap_err();
        assert_eq!(
            e.to_string(),
            "fill_batch: images buffer has shape [8] but [1, 2, 2, 1] is required"
        );
        let e = fill_batch(&ds, &[0, 1], (2, 2, 1), &mut x, &mut y[..5]).unwrap_err();
        assert!(
            matches!(
                e,
                TrainError::ShapeMismatch {
                    what: "labels buffer",
                    ..
                }
            ),
            "{e}"
        );
        let e = fill_batch(&ds, &[], (2, 2, 1), &mut [], &mut []).unwrap_err();
        assert!(matches!(e, TrainError::ZeroBatchSize { .. }), "{e}");
        let e = fill_batch(&ds, &[0], (0, 2, 1), &mut [], &mut y[..3]).unwrap_err();
        assert!(matches!(e, TrainError::BadShape { .. }), "{e}");
        let rgb = Dataset::new(Pixels::U8(vec![0; 12]), 1, 2, 2, 3, vec![0], 1).unwrap();
        let e = fill_batch(&rgb, &[0], (2, 2, 1), &mut x[..4], &mut y[..1]).unwrap_err();
        assert!(
            matches!(e, TrainError::BadChannels { from: 3, to: 1, .. }),
            "{e}"
        );
    }
}
