//! The default data set, embedded in the binary: two classes of Fashion-MNIST.
//!
//! Class 0 is "T-shirt/top" (Fashion-MNIST label 0) and class 1 "Trouser" (label 1). The
//! training split holds the first 1000 images of each class in the order of
//! `train-images-idx3-ubyte` (2000 images, the classes interleaved as in the file); the test
//! split the first 250 of each from `t10k-images-idx3-ubyte` (500 images). Images are the
//! native 28x28x1 `u8` (read as `x / 255`). The four gzipped IDX files under
//! `crates/stax-train/data/` are made by `cargo xtask data` from Debian's
//! `dataset-fashion-mnist` package (`/usr/share/datasets/fashion-mnist/`) and embedded with
//! `include_bytes!`, so nothing is downloaded at run time.
//!
//! Fashion-MNIST: Xiao, Rasul and Vollgraf, 2017, <https://github.com/zalandoresearch/fashion-mnist>,
//! MIT licence.
//!
//! ```
//! let (train, test) = stax_train::data::fashion_mnist_2class()?;
//! assert_eq!((train.len(), test.len()), (2000, 500));
//! assert_eq!(train.image_shape(), (28, 28, 1));
//! assert_eq!(test.class_counts(), vec![250, 250]);
//! # Ok::<(), stax_train::TrainError>(())
//! ```

use std::path::Path;

use super::Dataset;
use super::idx::parse_idx;
use crate::error::TrainError;

/// The class names, by class index.
pub const CLASS_NAMES: [&str; 2] = ["T-shirt/top", "Trouser"];
/// The Fashion-MNIST labels kept, by class index (class `k` is original label
/// `SOURCE_LABELS[k]`).
pub const SOURCE_LABELS: [u8; 2] = [0, 1];
/// Images per class in the training split.
pub const TRAIN_PER_CLASS: usize = 1000;
/// Images per class in the test split.
pub const TEST_PER_CLASS: usize = 250;
/// The embedded files' names, in `crates/stax-train/data/`:
/// train images, train labels, test images, test labels.
pub const FILE_NAMES: [&str; 4] = [
    "fashion2-train-images.idx.gz",
    "fashion2-train-labels.idx.gz",
    "fashion2-test-images.idx.gz",
    "fashion2-test-labels.idx.gz",
];

const TRAIN_IMAGES: &[u8] = include_bytes!("../../data/fashion2-train-images.idx.gz");
const TRAIN_LABELS: &[u8] = include_bytes!("../../data/fashion2-train-labels.idx.gz");
const TEST_IMAGES: &[u8] = include_bytes!("../../data/fashion2-test-images.idx.gz");
const TEST_LABELS: &[u8] = include_bytes!("../../data/fashion2-test-labels.idx.gz");

/// The embedded two-class Fashion-MNIST set as `(train, test)`: 2000 and 500 images of
/// 28x28x1 `u8`, labels 0 ("T-shirt/top") and 1 ("Trouser"), balanced, class names attached.
/// Decompresses about 2 MB; call it once.
///
/// # Errors
/// None in practice (the files are checked by tests); a damaged build would give
/// [`TrainError::Corrupt`].
pub fn fashion_mnist_2class() -> Result<(Dataset, Dataset), TrainError> {
    let names = || {
        CLASS_NAMES
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
    };
    let load = |images: &[u8], labels: &[u8], image_name: &str, label_name: &str| {
        let (ip, lp) = (embedded_path(image_name), embedded_path(label_name));
        let ds =
            Dataset::from_idx_arrays(parse_idx(images, &ip)?, parse_idx(labels, &lp)?, &ip, &lp)?;
        ds.with_num_classes(CLASS_NAMES.len())?
            .with_class_names(names())
    };
    let train = load(TRAIN_IMAGES, TRAIN_LABELS, FILE_NAMES[0], FILE_NAMES[1])?;
    let test = load(TEST_IMAGES, TEST_LABELS, FILE_NAMES[2], FILE_NAMES[3])?;
    Ok((train, test))
}

fn embedded_path(name: &str) -> std::path::PathBuf {
    Path::new("embedded:").join(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Pixels;

    #[test]
    fn sizes_balance_and_names() {
        let (train, test) = fashion_mnist_2class().unwrap();
        assert_eq!((train.len(), test.len()), (2000, 500));
        assert_eq!(train.image_shape(), (28, 28, 1));
        assert_eq!(test.image_shape(), (28, 28, 1));
        assert_eq!(train.class_counts(), vec![1000, 1000]);
        assert_eq!(test.class_counts(), vec![250, 250]);
        assert_eq!(train.class_names().unwrap(), CLASS_NAMES);
    }

    #[test]
    fn pixel_statistics_are_plausible() {
        let (train, test) = fashion_mnist_2class().unwrap();
        for ds in [&train, &test] {
            let Pixels::U8(px) = ds.pixels() else {
                panic!("embedded images are u8")
            };
            let mean = px.iter().map(|&p| f64::from(p)).sum::<f64>() / px.len() as f64 / 255.0;
            // Fashion-MNIST's mean is about 0.29; trousers are thinner than shirts.
            assert!((0.15..0.45).contains(&mean), "mean {mean}");
            assert_eq!(px.iter().max(), Some(&255));
            // Every image has ink, and the per-class means differ.
            assert!(px.chunks_exact(784).all(|img| img.iter().any(|&p| p > 0)));
            let class_mean = |k: u32| {
                let (s, n) = px
                    .chunks_exact(784)
                    .zip(ds.labels())
                    .filter(|(_, l)| **l == k)
                    .fold((0u64, 0u64), |(s, n), (img, _)| {
                        (s + img.iter().map(|&p| u64::from(p)).sum::<u64>(), n + 1)
                    });
                s as f64 / n as f64 / 784.0 / 255.0
            };
            assert!(
                class_mean(0) > class_mean(1) + 0.05,
                "{} {}",
                class_mean(0),
                class_mean(1)
            );
        }
    }

    #[test]
    fn train_and_test_differ() {
        let (train, test) = fashion_mnist_2class().unwrap();
        let (Pixels::U8(a), Pixels::U8(b)) = (train.pixels(), test.pixels()) else {
            panic!()
        };
        assert_ne!(a[..784], b[..784]);
    }
}
