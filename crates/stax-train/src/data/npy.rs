//! NumPy `.npy` and `.npz` data sets, read through `npyz`.
//!
//! - Images: `[n, h, w, c]` (NHWC) or `[n, h, w]` (gray, `c = 1`), dtype `u8` (`|u1`, read
//!   as `x / 255` by default) or `f32` (`<f4`/`>f4`, used as stored by default, must be
//!   finite); see [`super::PixelScaling`]. Anything else is [`TrainError::BadDtype`].
//! - Labels: 1-D `[n]` class indices of any integer dtype (`i1`..`i8`, `u1`..`u8`, either
//!   byte order), or 2-D `[n, k]` one-hot rows (float or integer: exactly one 1, zeros
//!   elsewhere). The number of classes is `max label + 1` for indices and `k` for one-hot
//!   rows (see [`Dataset::with_num_classes`]); a label must be below [`MAX_CLASSES`].
//! - Fortran-ordered arrays are transposed to C order on load.
//! - `.npz` archives, as `np.savez(f, x=images, y=labels)` writes them: with no key given,
//!   images are looked up as [`NPZ_IMAGE_KEYS`] and labels as [`NPZ_LABEL_KEYS`], in order.
//!   Errors about an array name it as the archive's member, `archive.npz/x.npy`.
//!
//! ```no_run
//! use std::path::Path;
//! use stax_train::data::Dataset;
//!
//! let train = Dataset::from_npz(Path::new("train.npz"), None, None)?; // keys x / y
//! let test = Dataset::from_npy(Path::new("x_test.npy"), Path::new("y_test.npy"))?;
//! # Ok::<(), stax_train::TrainError>(())
//! ```

use std::io::{Cursor, Read};
use std::path::{Path, PathBuf};

use npyz::{DType, NpyFile, Order, TypeChar};

use super::{Dataset, Pixels, Source};
use crate::error::{Corruption, TrainError};

/// Image array names tried, in order, when [`Dataset::from_npz`] gets no images key.
pub const NPZ_IMAGE_KEYS: [&str; 3] = ["x", "images", "x_train"];
/// Label array names tried, in order, when [`Dataset::from_npz`] gets no labels key.
pub const NPZ_LABEL_KEYS: [&str; 3] = ["y", "labels", "y_train"];
/// Labels must be below this (so a stray huge label cannot make a huge one-hot width).
pub const MAX_CLASSES: usize = 1 << 16;

impl Dataset {
    /// Loads images and labels from two `.npy` files (layouts and dtypes in the module doc).
    ///
    /// # Errors
    /// [`TrainError::Io`] when a file cannot be read; [`TrainError::Corrupt`] for a malformed
    /// or truncated file; [`TrainError::BadDtype`]; [`TrainError::BadShape`] for a wrong rank;
    /// [`TrainError::ShapeMismatch`] when the image and label counts differ;
    /// [`TrainError::LabelOutOfRange`]; [`TrainError::NotOneHot`]; as [`Dataset::new`]
    /// (empty, non-finite pixels).
    pub fn from_npy(images_path: &Path, labels_path: &Path) -> Result<Dataset, TrainError> {
        const OP: &str = "load_npy";
        let images = read_images(OP, images_path, &read_file(OP, images_path)?)?;
        let labels = read_labels(OP, labels_path, &read_file(OP, labels_path)?)?;
        assemble(OP, images, labels)
    }

    /// Loads images and labels from one `.npz` archive. `images_key` / `labels_key` name the
    /// arrays; `None` tries [`NPZ_IMAGE_KEYS`] / [`NPZ_LABEL_KEYS`] in order.
    ///
    /// # Errors
    /// As [`Dataset::from_npy`]; [`TrainError::MissingArray`] when no array has the name(s).
    pub fn from_npz(
        path: &Path,
        images_key: Option<&str>,
        labels_key: Option<&str>,
    ) -> Result<Dataset, TrainError> {
        const OP: &str = "load_npz";
        let bytes = read_file(OP, path)?;
        let mut archive = npyz::npz::NpzArchive::new(Cursor::new(bytes))
            .map_err(|source| corrupt(OP, path, Corruption::Zip { source }))?;
        let member = |key: &str| path.join(npyz::npz::file_name_from_array_name(key));
        let images = {
            let key = find_key(path, &archive, &keys(images_key, &NPZ_IMAGE_KEYS))?;
            let bytes = read_entry(OP, path, &mut archive, &key)?;
            read_images(OP, &member(&key), &bytes)?
        };
        let labels = {
            let key = find_key(path, &archive, &keys(labels_key, &NPZ_LABEL_KEYS))?;
            let bytes = read_entry(OP, path, &mut archive, &key)?;
            read_labels(OP, &member(&key), &bytes)?
        };
        assemble(OP, images, labels)
    }
}

/// The bytes of the `.npy` file inside the archive for array `key`.
fn read_entry(
    op: &'static str,
    path: &Path,
    archive: &mut npyz::npz::NpzArchive<Cursor<Vec<u8>>>,
    key: &str,
) -> Result<Vec<u8>, TrainError> {
    let zip_err = |source| corrupt(op, path, Corruption::Zip { source });
    let name = npyz::npz::file_name_from_array_name(key);
    let mut entry = archive
        .zip_archive()
        .by_name(&name)
        .map_err(|e| zip_err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
    let mut bytes = Vec::new();
    entry.read_to_end(&mut bytes).map_err(zip_err)?;
    Ok(bytes)
}

/// Opens `.npy` bytes. `npyz` multiplies the header's dimensions without an overflow check
/// (a panic in debug builds), so a shape whose volume overflows `u64` is refused first; bytes
/// past the data the header declares are refused too (`npyz` would ignore them).
fn open_npy<'a>(
    op: &'static str,
    path: &Path,
    bytes: &'a [u8],
) -> Result<NpyFile<&'a [u8]>, TrainError> {
    if let Some(dims) = overflowing_shape(bytes) {
        return Err(corrupt(op, path, Corruption::SizeOverflow { dims }));
    }
    let file = NpyFile::new(bytes).map_err(npy_err(op, path))?;
    let header = file.header().clone();
    let data = file.into_inner();
    let item = header.dtype().num_bytes().map(|b| b as u64);
    let declared = item.and_then(|b| header.shape().iter().try_fold(b, |v, &d| v.checked_mul(d)));
    if let Some(expected) = declared.filter(|&e| data.len() as u64 > e) {
        return Err(corrupt(op, path, Corruption::TrailingData { expected }));
    }
    Ok(NpyFile::with_header(header, data))
}

/// The dimensions in the header's `'shape': (..)` entry when their product overflows `u64`
/// (a dimension too large for `u64` counts as `u64::MAX`); `None` when it fits or the entry
/// cannot be found (`npyz` then reports the malformed header).
pub(crate) fn overflowing_shape(bytes: &[u8]) -> Option<Vec<u64>> {
    // The header text starts at byte 10 (format 1.0) or 12 (2.0, 3.0) and is at most
    // 65535 (1.0) bytes; a longer 2.0 header with a huge shape is still checked by npyz.
    let head = &bytes[..bytes.len().min(12 + 65_535)];
    let at = head
        .windows(7)
        .position(|w| w == b"'shape'" || w == b"\"shape\"")?;
    let rest = &head[at..];
    let open = rest.iter().position(|&b| b == b'(')?;
    let close = open + rest[open..].iter().position(|&b| b == b')')?;
    let text = std::str::from_utf8(&rest[open + 1..close]).ok()?;
    let dims: Vec<u64> = text
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| t.trim_end_matches('L').parse::<u64>().unwrap_or(u64::MAX))
        .collect();
    let fits = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .is_some();
    (!fits).then_some(dims)
}

fn keys(given: Option<&str>, defaults: &[&str]) -> Vec<String> {
    match given {
        Some(k) => vec![k.to_owned()],
        None => defaults.iter().map(|&k| k.to_owned()).collect(),
    }
}

/// The first of `tried` that names an array in the archive.
fn find_key<R: Read + std::io::Seek>(
    path: &Path,
    archive: &npyz::npz::NpzArchive<R>,
    tried: &[String],
) -> Result<String, TrainError> {
    let available: Vec<String> = archive.array_names().map(str::to_owned).collect();
    tried
        .iter()
        .find(|k| available.contains(k))
        .cloned()
        .ok_or_else(|| TrainError::MissingArray {
            path: path.to_path_buf(),
            tried: tried.to_vec(),
            available,
        })
}

fn read_file(op: &'static str, path: &Path) -> Result<Vec<u8>, TrainError> {
    std::fs::read(path).map_err(|source| TrainError::Io {
        op,
        path: path.to_path_buf(),
        source,
    })
}

fn corrupt(op: &'static str, path: &Path, reason: Corruption) -> TrainError {
    TrainError::Corrupt {
        op,
        path: path.to_path_buf(),
        reason,
    }
}

fn npy_err<'a>(op: &'static str, path: &'a Path) -> impl Fn(std::io::Error) -> TrainError + 'a {
    move |source| corrupt(op, path, Corruption::Npy { source })
}

/// Images as read: pixels, `[n, h, w, c]` and the file.
struct Images {
    pixels: Pixels,
    shape: [usize; 4],
    path: PathBuf,
}

/// Labels as read: one class per example, the number of classes and the file.
struct Labels {
    classes: Vec<u32>,
    num_classes: usize,
    path: PathBuf,
}

fn assemble(op: &'static str, images: Images, labels: Labels) -> Result<Dataset, TrainError> {
    let n = images.shape[0];
    if labels.classes.len() != n {
        return Err(TrainError::ShapeMismatch {
            op,
            what: "labels",
            expected: vec![n],
            found: vec![labels.classes.len()],
        });
    }
    let source = Source {
        images: images.path,
        labels: labels.path,
    };
    let (classes, k) = (labels.classes, labels.num_classes);
    Dataset::build(op, images.pixels, images.shape, classes, k, Some(source))
}

/// The element type as `(kind, bytes)`, or `BadDtype` for structured or array dtypes.
fn plain(
    op: &'static str,
    path: &Path,
    dtype: &DType,
    accepted: &'static str,
) -> Result<(TypeChar, u64), TrainError> {
    match dtype {
        DType::Plain(ts) => Ok((ts.type_char(), ts.size_field())),
        other => Err(bad_dtype(op, path, other, accepted)),
    }
}

fn bad_dtype(op: &'static str, path: &Path, dtype: &DType, accepted: &'static str) -> TrainError {
    let found = match dtype {
        DType::Plain(ts) => ts.to_string(),
        other => other.descr(),
    };
    TrainError::BadDtype {
        op,
        path: path.to_path_buf(),
        found,
        accepted,
    }
}

/// The header's shape as `usize`s, checking that the volume fits.
fn shape_of<R: Read>(
    op: &'static str,
    path: &Path,
    npy: &NpyFile<R>,
) -> Result<Vec<usize>, TrainError> {
    let dims: Vec<u64> = npy.shape().to_vec();
    let shape: Option<Vec<usize>> = dims.iter().map(|&d| usize::try_from(d).ok()).collect();
    match shape {
        Some(s) if super::checked_volume(&s).is_some() => Ok(s),
        _ => Err(corrupt(op, path, Corruption::SizeOverflow { dims })),
    }
}

/// Reads all elements as `T` in C order (transposing a Fortran-ordered array).
fn elements<T: npyz::Deserialize + Copy, R: Read>(
    op: &'static str,
    path: &Path,
    npy: NpyFile<R>,
    shape: &[usize],
) -> Result<Vec<T>, TrainError> {
    let order = npy.order();
    let data: Vec<T> = npy.into_vec().map_err(npy_err(op, path))?;
    Ok(match order {
        Order::C => data,
        Order::Fortran => fortran_to_c(&data, shape),
    })
}

/// Reorders a column-major array of `shape` into row-major order.
fn fortran_to_c<T: Copy>(data: &[T], shape: &[usize]) -> Vec<T> {
    // In Fortran order the element at (i_0, .., i_k) sits at sum_j i_j * prod(shape[..j]).
    let mut strides = Vec::with_capacity(shape.len());
    let mut s = 1;
    for &d in shape {
        strides.push(s);
        s *= d;
    }
    let mut index = vec![0usize; shape.len()];
    let mut out = Vec::with_capacity(data.len());
    for _ in 0..data.len() {
        out.push(
            data[index
                .iter()
                .zip(&strides)
                .map(|(i, s)| i * s)
                .sum::<usize>()],
        );
        for axis in (0..shape.len()).rev() {
            index[axis] += 1;
            if index[axis] < shape[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
    out
}

fn read_images(op: &'static str, path: &Path, bytes: &[u8]) -> Result<Images, TrainError> {
    const ACCEPTED: &str = "u8 and f32";
    let npy = open_npy(op, path, bytes)?;
    let dtype = npy.dtype();
    let kind = plain(op, path, &dtype, ACCEPTED)?;
    let dims = shape_of(op, path, &npy)?;
    let shape = match dims[..] {
        [n, h, w] => [n, h, w, 1],
        [n, h, w, c] => [n, h, w, c],
        _ => {
            return Err(TrainError::BadShape {
                op,
                what: path.display().to_string(),
                shape: npy.shape().to_vec(),
                expected: "images must be [n, h, w, c] or [n, h, w]",
            });
        }
    };
    let pixels = match kind {
        (TypeChar::Uint, 1) => Pixels::U8(elements(op, path, npy, &dims)?),
        (TypeChar::Float, 4) => Pixels::F32(elements(op, path, npy, &dims)?),
        _ => return Err(bad_dtype(op, path, &dtype, ACCEPTED)),
    };
    Ok(Images {
        pixels,
        shape,
        path: path.to_path_buf(),
    })
}

/// Reads every element of an integer or float array as `f64` (integers for indices are read
/// exactly as `i64` by [`read_ints`]).
fn read_numbers<R: Read>(
    op: &'static str,
    path: &Path,
    npy: NpyFile<R>,
    dims: &[usize],
    accepted: &'static str,
) -> Result<Vec<f64>, TrainError> {
    let dtype = npy.dtype();
    Ok(match plain(op, path, &dtype, accepted)? {
        (TypeChar::Float, 4) => elements::<f32, _>(op, path, npy, dims)?
            .into_iter()
            .map(f64::from)
            .collect(),
        (TypeChar::Float, 8) => elements(op, path, npy, dims)?,
        (TypeChar::Int | TypeChar::Uint, _) => read_ints(op, path, npy, dims, accepted)?
            .into_iter()
            .map(|v| v as f64)
            .collect(),
        _ => return Err(bad_dtype(op, path, &dtype, accepted)),
    })
}

/// Reads an integer array of any width and sign as `i64` (`u64` values past `i64::MAX`
/// saturate, which is out of range for a label anyway).
fn read_ints<R: Read>(
    op: &'static str,
    path: &Path,
    npy: NpyFile<R>,
    dims: &[usize],
    accepted: &'static str,
) -> Result<Vec<i64>, TrainError> {
    fn widen<T: TryInto<i64>>(v: Vec<T>) -> Vec<i64> {
        v.into_iter()
            .map(|x| x.try_into().unwrap_or(i64::MAX))
            .collect()
    }
    let dtype = npy.dtype();
    Ok(match plain(op, path, &dtype, accepted)? {
        (TypeChar::Int, 1) => widen(elements::<i8, _>(op, path, npy, dims)?),
        (TypeChar::Int, 2) => widen(elements::<i16, _>(op, path, npy, dims)?),
        (TypeChar::Int, 4) => widen(elements::<i32, _>(op, path, npy, dims)?),
        (TypeChar::Int, 8) => elements::<i64, _>(op, path, npy, dims)?,
        (TypeChar::Uint, 1) => widen(elements::<u8, _>(op, path, npy, dims)?),
        (TypeChar::Uint, 2) => widen(elements::<u16, _>(op, path, npy, dims)?),
        (TypeChar::Uint, 4) => widen(elements::<u32, _>(op, path, npy, dims)?),
        (TypeChar::Uint, 8) => widen(elements::<u64, _>(op, path, npy, dims)?),
        _ => return Err(bad_dtype(op, path, &dtype, accepted)),
    })
}

fn read_labels(op: &'static str, path: &Path, bytes: &[u8]) -> Result<Labels, TrainError> {
    let npy = open_npy(op, path, bytes)?;
    let dims = shape_of(op, path, &npy)?;
    match dims[..] {
        [_] => {
            let accepted = "integer dtypes for [n] class indices (or [n, k] one-hot rows)";
            index_labels(op, path, read_ints(op, path, npy, &dims, accepted)?)
        }
        [_, k] if k > 0 => {
            let accepted = "integer and float dtypes for [n, k] one-hot rows";
            one_hot_labels(op, path, &read_numbers(op, path, npy, &dims, accepted)?, k)
        }
        _ => Err(TrainError::BadShape {
            op,
            what: path.display().to_string(),
            shape: npy.shape().to_vec(),
            expected: "labels must be [n] class indices or [n, k] one-hot rows with k >= 1",
        }),
    }
}

fn index_labels(op: &'static str, path: &Path, raw: Vec<i64>) -> Result<Labels, TrainError> {
    let max = raw.iter().copied().max().unwrap_or(0);
    let num_classes = match usize::try_from(max) {
        Ok(m) if m < MAX_CLASSES => m + 1,
        Ok(_) => MAX_CLASSES,
        Err(_) => 1, // every label is negative
    };
    let bad = raw
        .iter()
        .position(|&l| usize::try_from(l).map_or(true, |l| l >= num_classes));
    if let Some(index) = bad {
        return Err(TrainError::LabelOutOfRange {
            op,
            path: Some(path.to_path_buf()),
            index,
            label: raw[index],
            num_classes,
        });
    }
    let classes = raw.into_iter().map(|l| l as u32).collect();
    Ok(Labels {
        classes,
        num_classes,
        path: path.to_path_buf(),
    })
}

fn one_hot_labels(
    op: &'static str,
    path: &Path,
    rows: &[f64],
    k: usize,
) -> Result<Labels, TrainError> {
    if k > MAX_CLASSES {
        return Err(TrainError::LabelOutOfRange {
            op,
            path: Some(path.to_path_buf()),
            index: 0,
            label: k as i64 - 1,
            num_classes: MAX_CLASSES,
        });
    }
    let mut classes = Vec::with_capacity(rows.len() / k);
    for (index, row) in rows.chunks_exact(k).enumerate() {
        let ones: Vec<usize> = (0..k).filter(|&j| row[j] == 1.0).collect();
        let zeros = row.iter().filter(|&&v| v == 0.0).count();
        match ones[..] {
            [hot] if zeros == k - 1 => classes.push(hot as u32),
            _ => {
                let path = Some(path.to_path_buf());
                return Err(TrainError::NotOneHot { op, path, index });
            }
        }
    }
    Ok(Labels {
        classes,
        num_classes: k,
        path: path.to_path_buf(),
    })
}

#[cfg(test)]
mod tests;
