//! `cargo xtask data`: build the embedded two-class Fashion-MNIST subset.
//!
//! Reads Debian's `dataset-fashion-mnist` IDX files (`apt-get install dataset-fashion-mnist`,
//! installed under `/usr/share/datasets/fashion-mnist/`), keeps the first
//! [`TRAIN_PER_CLASS`] training and [`TEST_PER_CLASS`] test images of each class in
//! [`SOURCE_LABELS`] (file order, classes interleaved as in the file), relabels them
//! `0..SOURCE_LABELS.len()`, and writes the four gzipped IDX files that
//! `stax_train::data::fashion_mnist_2class` embeds. The output is byte-for-byte reproducible
//! (gzip mtime 0), so running it again leaves `git status` clean.

use std::path::{Path, PathBuf};

use clap::Args;
use stax_train::TrainError;
use stax_train::data::embedded::{FILE_NAMES, SOURCE_LABELS, TEST_PER_CLASS, TRAIN_PER_CLASS};
use stax_train::data::idx::{IdxArray, read_idx, write_idx_gz};

/// Options of `cargo xtask data`.
#[derive(Args, Debug)]
pub struct DataArgs {
    /// Folder holding `{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz`.
    #[arg(long, default_value = "/usr/share/datasets/fashion-mnist")]
    pub source: PathBuf,
    /// Folder to write the four `fashion2-*.idx.gz` files to; a relative path is taken from
    /// the workspace root.
    #[arg(long, default_value = "crates/stax-train/data")]
    pub out: PathBuf,
}

/// What can stop `cargo xtask data`.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A source file is missing.
    #[error(
        "data: {} not found (install Debian's package: apt-get install dataset-fashion-mnist, \
         or pass --source DIR)",
        path.display()
    )]
    MissingSource {
        /// The missing file.
        path: PathBuf,
    },
    /// Reading or writing IDX failed.
    #[error(transparent)]
    Train(#[from] TrainError),
    /// The source arrays do not have the MNIST shapes.
    #[error(
        "data: {split} images have dims {images:?} and labels {labels:?}; expected [n, 28, 28] and [n]"
    )]
    BadShape {
        /// `"train"` or `"t10k"`.
        split: &'static str,
        /// Image dims found.
        images: Vec<usize>,
        /// Label dims found.
        labels: Vec<usize>,
    },
    /// A class has fewer images than the subset needs.
    #[error("data: {split} has {found} images of label {label}, {needed} needed")]
    TooFew {
        /// `"train"` or `"t10k"`.
        split: &'static str,
        /// The source label.
        label: u8,
        /// Images found.
        found: usize,
        /// Images needed.
        needed: usize,
    },
    /// The output folder cannot be created.
    #[error("data: cannot create {}: {source}", path.display())]
    CreateDir {
        /// The folder.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
}

/// Runs `cargo xtask data`.
///
/// # Errors
/// [`DataError`] (boxed): a missing source file, a malformed one, or an unwritable output.
pub fn run(args: DataArgs) -> Result<(), Box<dyn std::error::Error>> {
    let out = if args.out.is_relative() {
        workspace_root().join(&args.out)
    } else {
        args.out
    };
    std::fs::create_dir_all(&out).map_err(|source| DataError::CreateDir {
        path: out.clone(),
        source,
    })?;
    let splits = [
        ("train", TRAIN_PER_CLASS, [FILE_NAMES[0], FILE_NAMES[1]]),
        ("t10k", TEST_PER_CLASS, [FILE_NAMES[2], FILE_NAMES[3]]),
    ];
    for (split, per_class, [image_file, label_file]) in splits {
        let images = read_source(&args.source.join(format!("{split}-images-idx3-ubyte.gz")))?;
        let labels = read_source(&args.source.join(format!("{split}-labels-idx1-ubyte.gz")))?;
        let (images, labels) = select(split, &images, &labels, per_class)?;
        write_idx_gz(&out.join(image_file), &images).map_err(DataError::from)?;
        write_idx_gz(&out.join(label_file), &labels).map_err(DataError::from)?;
        let bytes: u64 = [image_file, label_file]
            .iter()
            .filter_map(|f| std::fs::metadata(out.join(f)).ok())
            .map(|m| m.len())
            .sum();
        println!(
            "data: {split}: images {:?}, labels {:?} -> {} and {} in {} ({bytes} bytes)",
            images.dims,
            labels.dims,
            image_file,
            label_file,
            out.display(),
        );
    }
    Ok(())
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(PathBuf::new, Path::to_path_buf)
}

fn read_source(path: &Path) -> Result<IdxArray, DataError> {
    if !path.exists() {
        return Err(DataError::MissingSource {
            path: path.to_path_buf(),
        });
    }
    Ok(read_idx(path)?)
}

/// Keeps the first `per_class` examples of each label in [`SOURCE_LABELS`], in file order,
/// relabelled to their position in [`SOURCE_LABELS`].
fn select(
    split: &'static str,
    images: &IdxArray,
    labels: &IdxArray,
    per_class: usize,
) -> Result<(IdxArray, IdxArray), DataError> {
    let n = labels.data.len();
    let shape_ok = matches!(images.dims[..], [m, 28, 28] if m == n) && labels.dims.len() == 1;
    if !shape_ok {
        return Err(DataError::BadShape {
            split,
            images: images.dims.clone(),
            labels: labels.dims.clone(),
        });
    }
    let per_image = 28 * 28;
    let mut taken = vec![0usize; SOURCE_LABELS.len()];
    let mut pixels = Vec::with_capacity(per_class * SOURCE_LABELS.len() * per_image);
    let mut classes = Vec::with_capacity(per_class * SOURCE_LABELS.len());
    for (i, label) in labels.data.iter().enumerate() {
        let Some(class) = SOURCE_LABELS.iter().position(|l| l == label) else {
            continue;
        };
        if taken[class] == per_class {
            continue;
        }
        taken[class] += 1;
        classes.push(class as u8);
        pixels.extend_from_slice(&images.data[i * per_image..(i + 1) * per_image]);
    }
    for (class, &found) in taken.iter().enumerate() {
        if found < per_class {
            let label = SOURCE_LABELS[class];
            return Err(DataError::TooFew {
                split,
                label,
                found,
                needed: per_class,
            });
        }
    }
    let m = classes.len();
    Ok((
        IdxArray {
            dims: vec![m, 28, 28],
            data: pixels,
        },
        IdxArray {
            dims: vec![m],
            data: classes,
        },
    ))
}
