//! IDX files (the MNIST / Fashion-MNIST format), gzipped or not.
//!
//! Layout (big-endian), from the MNIST page of LeCun, Cortes and Burges: bytes `0, 0`, a
//! type code (`0x08` = unsigned byte; `0x09` i8, `0x0B` i16, `0x0C` i32, `0x0D` f32 and
//! `0x0E` f64 exist but are refused here), the number of dimensions `d`, then `d` sizes as
//! `u32`, then the elements in C order. A file whose first two bytes are the gzip magic
//! `1f 8b` is decompressed first. Every malformed or truncated input is a typed
//! [`TrainError`], never a panic; the declared size is checked before the data is trusted,
//! and trailing bytes are refused.
//!
//! ```
//! use stax_train::data::idx::{IdxArray, encode_idx, parse_idx};
//!
//! let a = IdxArray { dims: vec![2, 3], data: vec![1, 2, 3, 4, 5, 6] };
//! let bytes = encode_idx(&a)?;
//! assert_eq!(&bytes[..8], &[0, 0, 8, 2, 0, 0, 0, 2]);
//! assert_eq!(parse_idx(&bytes, "mem.idx".as_ref())?, a);
//! # Ok::<(), stax_train::TrainError>(())
//! ```

use std::io::{Read, Write};
use std::path::Path;

use flate2::Compression;
use flate2::read::MultiGzDecoder;
use flate2::write::GzEncoder;

use super::{Dataset, Pixels, Source};
use crate::error::{Corruption, TrainError};

const OP: &str = "load_idx";
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const TYPE_U8: u8 = 0x08;

/// An IDX array of unsigned bytes: its dimensions and its elements in C order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdxArray {
    /// Sizes, outermost first (e.g. `[n, 28, 28]` for images, `[n]` for labels).
    pub dims: Vec<usize>,
    /// `dims.iter().product()` elements, C order.
    pub data: Vec<u8>,
}

/// Reads an IDX file of `u8` elements, gzipped or not.
///
/// # Errors
/// [`TrainError::Io`] when the file cannot be read; otherwise as [`parse_idx`].
pub fn read_idx(path: &Path) -> Result<IdxArray, TrainError> {
    let bytes = std::fs::read(path).map_err(|source| TrainError::Io {
        op: OP,
        path: path.to_path_buf(),
        source,
    })?;
    parse_idx(&bytes, path)
}

/// Parses the bytes of an IDX file of `u8` elements, gzipped or not; `path` only names the
/// source in errors.
///
/// # Errors
/// [`TrainError::Corrupt`] for a bad magic, zero dimensions, a truncated header or data,
/// trailing bytes, sizes that overflow, or a bad gzip stream; [`TrainError::BadDtype`] for a
/// type code other than `0x08` (u8).
pub fn parse_idx(bytes: &[u8], path: &Path) -> Result<IdxArray, TrainError> {
    if bytes.starts_with(&GZIP_MAGIC) {
        parse_stream(MultiGzDecoder::new(bytes), path)
    } else {
        parse_stream(bytes, path)
    }
}

fn parse_stream(mut r: impl Read, path: &Path) -> Result<IdxArray, TrainError> {
    let corrupt = |reason| TrainError::Corrupt {
        op: OP,
        path: path.to_path_buf(),
        reason,
    };
    // Every read error comes from the decoder: the bytes themselves are already in memory.
    let read_err = |source| corrupt(Corruption::Gzip { source });

    let mut magic = [0u8; 4];
    let got = read_full(&mut r, &mut magic).map_err(read_err)?;
    if got < magic.len() {
        return Err(corrupt(Corruption::TruncatedHeader {
            expected: 4,
            found: got,
        }));
    }
    if magic[0] != 0 || magic[1] != 0 {
        return Err(corrupt(Corruption::BadMagic { found: magic }));
    }
    if magic[2] != TYPE_U8 {
        return Err(TrainError::BadDtype {
            op: OP,
            path: path.to_path_buf(),
            found: format!("idx type 0x{:02x} ({})", magic[2], type_name(magic[2])),
            accepted: "u8 (idx type 0x08)",
        });
    }
    let ndims = usize::from(magic[3]);
    if ndims == 0 {
        return Err(corrupt(Corruption::ZeroDims));
    }
    let mut raw = vec![0u8; 4 * ndims];
    let got = read_full(&mut r, &mut raw).map_err(read_err)?;
    if got < raw.len() {
        return Err(corrupt(Corruption::TruncatedHeader {
            expected: 4 + raw.len(),
            found: 4 + got,
        }));
    }
    let dims64: Vec<u64> = raw
        .chunks_exact(4)
        .map(|b| u64::from(u32::from_be_bytes([b[0], b[1], b[2], b[3]])))
        .collect();
    let expected = dims64
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&v| usize::try_from(v).is_ok())
        .ok_or_else(|| {
            corrupt(Corruption::SizeOverflow {
                dims: dims64.clone(),
            })
        })?;

    // Grow with the data actually present, so a lying header cannot allocate much.
    let mut data = Vec::with_capacity(expected.min(1 << 26) as usize);
    (&mut r)
        .take(expected)
        .read_to_end(&mut data)
        .map_err(read_err)?;
    if (data.len() as u64) < expected {
        return Err(corrupt(Corruption::TruncatedData {
            expected,
            found: data.len() as u64,
        }));
    }
    let mut extra = [0u8; 1];
    if read_full(&mut r, &mut extra).map_err(read_err)? > 0 {
        return Err(corrupt(Corruption::TrailingData { expected }));
    }
    let dims = dims64.iter().map(|&d| d as usize).collect();
    Ok(IdxArray { dims, data })
}

/// Reads until `buf` is full or the stream ends; returns the bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(k) => filled += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

fn type_name(code: u8) -> &'static str {
    match code {
        0x08 => "u8",
        0x09 => "i8",
        0x0B => "i16",
        0x0C => "i32",
        0x0D => "f32",
        0x0E => "f64",
        _ => "unknown",
    }
}

/// Encodes an array as an uncompressed IDX file (type `0x08`).
///
/// # Errors
/// [`TrainError::BadShape`] when there are 0 or more than 255 dimensions or a size exceeds
/// `u32::MAX`; [`TrainError::ShapeMismatch`] when `data` does not hold the product of `dims`.
pub fn encode_idx(array: &IdxArray) -> Result<Vec<u8>, TrainError> {
    const OP_W: &str = "write_idx";
    let bad_shape = || TrainError::BadShape {
        op: OP_W,
        what: "idx array".into(),
        shape: array.dims.iter().map(|&d| d as u64).collect(),
        expected: "idx needs 1 to 255 dimensions, each at most u32::MAX",
    };
    let ndims = u8::try_from(array.dims.len()).map_err(|_| bad_shape())?;
    if ndims == 0 {
        return Err(bad_shape());
    }
    let volume = super::checked_volume(&array.dims).ok_or_else(bad_shape)?;
    if volume != array.data.len() {
        return Err(TrainError::ShapeMismatch {
            op: OP_W,
            what: "idx data",
            expected: vec![volume],
            found: vec![array.data.len()],
        });
    }
    let mut out = Vec::with_capacity(4 + 4 * array.dims.len() + volume);
    out.extend_from_slice(&[0, 0, TYPE_U8, ndims]);
    for &d in &array.dims {
        let d = u32::try_from(d).map_err(|_| bad_shape())?;
        out.extend_from_slice(&d.to_be_bytes());
    }
    out.extend_from_slice(&array.data);
    Ok(out)
}

/// Writes an array as a gzipped IDX file (best compression, gzip mtime 0, so the output is
/// byte-for-byte reproducible).
///
/// # Errors
/// As [`encode_idx`]; [`TrainError::Io`] when the file cannot be written.
pub fn write_idx_gz(path: &Path, array: &IdxArray) -> Result<(), TrainError> {
    let raw = encode_idx(array)?;
    let io = |source| TrainError::Io {
        op: "write_idx",
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::create(path).map_err(io)?;
    let mut enc = GzEncoder::new(std::io::BufWriter::new(file), Compression::best());
    enc.write_all(&raw).map_err(io)?;
    enc.finish().map_err(io)?.flush().map_err(io)
}

impl Dataset {
    /// Loads a data set from an IDX image file (`[n, h, w]` gray or `[n, h, w, c]`, u8) and
    /// an IDX label file (`[n]`, u8), each gzipped or not, e.g. Fashion-MNIST's
    /// `train-images-idx3-ubyte.gz` and `train-labels-idx1-ubyte.gz`. The number of classes
    /// is `max label + 1` (see [`Dataset::with_num_classes`]).
    ///
    /// # Errors
    /// As [`read_idx`]; [`TrainError::BadShape`] for images that are not 3-D or 4-D or labels
    /// that are not 1-D; as [`Dataset::new`] (count mismatch, empty data set).
    pub fn from_idx(images_path: &Path, labels_path: &Path) -> Result<Dataset, TrainError> {
        let images = read_idx(images_path)?;
        let labels = read_idx(labels_path)?;
        Dataset::from_idx_arrays(images, labels, images_path, labels_path)
    }

    /// Builds a data set from parsed IDX arrays (see [`Dataset::from_idx`]); the paths only
    /// name the sources in errors.
    ///
    /// # Errors
    /// As [`Dataset::from_idx`], minus file access.
    pub fn from_idx_arrays(
        images: IdxArray,
        labels: IdxArray,
        images_path: &Path,
        labels_path: &Path,
    ) -> Result<Dataset, TrainError> {
        let bad = |path: &Path, dims: &[usize], expected| TrainError::BadShape {
            op: OP,
            what: path.display().to_string(),
            shape: dims.iter().map(|&d| d as u64).collect(),
            expected,
        };
        let (n, h, w, c) = match images.dims[..] {
            [n, h, w] => (n, h, w, 1),
            [n, h, w, c] => (n, h, w, c),
            _ => {
                let expected = "images must be [n, h, w] or [n, h, w, c]";
                return Err(bad(images_path, &images.dims, expected));
            }
        };
        if labels.dims.len() != 1 {
            return Err(bad(labels_path, &labels.dims, "labels must be [n]"));
        }
        let labels: Vec<u32> = labels.data.iter().map(|&l| u32::from(l)).collect();
        let num_classes = labels.iter().max().map_or(1, |&m| m as usize + 1);
        let source = Source {
            images: images_path.to_path_buf(),
            labels: labels_path.to_path_buf(),
        };
        let pixels = Pixels::U8(images.data);
        Dataset::build(OP, pixels, [n, h, w, c], labels, num_classes, Some(source))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn tmp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("stax-idx-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join(name)
    }

    fn images() -> IdxArray {
        IdxArray {
            dims: vec![3, 2, 2],
            data: (0..12).collect(),
        }
    }

    fn gz(raw: &[u8]) -> Vec<u8> {
        let mut enc = GzEncoder::new(Vec::new(), Compression::fast());
        enc.write_all(raw).unwrap();
        enc.finish().unwrap()
    }

    fn parse(bytes: &[u8]) -> Result<IdxArray, TrainError> {
        parse_idx(bytes, Path::new("mem.idx"))
    }

    fn reason(e: TrainError) -> Corruption {
        match e {
            TrainError::Corrupt { reason, .. } => reason,
            other => panic!("expected Corrupt, got {other}"),
        }
    }

    #[test]
    fn round_trip_plain_and_gzip_files() {
        let a = images();
        let raw = encode_idx(&a).unwrap();
        assert_eq!(parse(&raw).unwrap(), a);
        assert_eq!(parse(&gz(&raw)).unwrap(), a);
        let path = tmp("round.idx.gz");
        write_idx_gz(&path, &a).unwrap();
        assert_eq!(std::fs::read(&path).unwrap()[..2], GZIP_MAGIC);
        assert_eq!(read_idx(&path).unwrap(), a);
    }

    #[test]
    fn dataset_from_idx_files() {
        let (ip, lp) = (tmp("ds-images.idx.gz"), tmp("ds-labels.idx"));
        write_idx_gz(&ip, &images()).unwrap();
        std::fs::write(
            &lp,
            encode_idx(&IdxArray {
                dims: vec![3],
                data: vec![2, 0, 1],
            })
            .unwrap(),
        )
        .unwrap();
        let ds = Dataset::from_idx(&ip, &lp).unwrap();
        assert_eq!(
            (ds.len(), ds.image_shape(), ds.num_classes()),
            (3, (2, 2, 1), 3)
        );
        assert_eq!(ds.labels(), &[2, 0, 1]);
        assert_eq!(ds.pixels(), &Pixels::U8((0..12).collect()));
    }

    #[test]
    fn missing_file_is_io() {
        let e = read_idx(&tmp("does-not-exist.idx")).unwrap_err();
        assert!(matches!(e, TrainError::Io { op: "load_idx", .. }), "{e}");
    }

    #[test]
    fn bad_magic() {
        let mut raw = encode_idx(&images()).unwrap();
        raw[0] = 7;
        assert!(matches!(
            reason(parse(&raw).unwrap_err()),
            Corruption::BadMagic { .. }
        ));
        let e = parse(&raw).unwrap_err();
        assert_eq!(
            e.to_string(),
            "load_idx: mem.idx is corrupt: bad idx magic [07, 00, 08, 03] \
             (expected [00, 00, type, ndims])"
        );
    }

    #[test]
    fn truncated_header() {
        let raw = encode_idx(&images()).unwrap();
        for cut in [0, 3, 4, 9, 15] {
            let r = reason(parse(&raw[..cut]).unwrap_err());
            assert!(
                matches!(r, Corruption::TruncatedHeader { .. }),
                "cut {cut}: {r}"
            );
        }
        // Also through gzip.
        let r = reason(parse(&gz(&raw[..6])).unwrap_err());
        assert!(
            matches!(
                r,
                Corruption::TruncatedHeader {
                    expected: 16,
                    found: 6
                }
            ),
            "{r}"
        );
    }

    #[test]
    fn truncated_data_and_trailing_bytes() {
        let raw = encode_idx(&images()).unwrap();
        let r = reason(parse(&raw[..raw.len() - 1]).unwrap_err());
        assert!(
            matches!(
                r,
                Corruption::TruncatedData {
                    expected: 12,
                    found: 11
                }
            ),
            "{r}"
        );
        let mut long = raw.clone();
        long.push(0);
        let r = reason(parse(&long).unwrap_err());
        assert!(
            matches!(r, Corruption::TrailingData { expected: 12 }),
            "{r}"
        );
    }

    #[test]
    fn truncated_or_garbled_gzip() {
        let z = gz(&encode_idx(&images()).unwrap());
        assert!(matches!(
            parse(&z[..z.len() / 2]),
            Err(TrainError::Corrupt { .. })
        ));
        let mut bad = z.clone();
        bad[12] ^= 0xff;
        bad[13] ^= 0xff;
        assert!(matches!(parse(&bad), Err(TrainError::Corrupt { .. })));
    }

    #[test]
    fn zero_dims_overflow_and_other_types() {
        assert!(matches!(
            reason(parse(&[0, 0, 8, 0]).unwrap_err()),
            Corruption::ZeroDims
        ));
        let huge = [
            0, 0, 8, 3, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
        ];
        let r = reason(parse(&huge).unwrap_err());
        assert!(matches!(r, Corruption::SizeOverflow { .. }), "{r}");
        // A header that declares 4 GiB of data but holds none must not allocate it.
        let lying = [0, 0, 8, 1, 255, 255, 255, 255];
        let r = reason(parse(&lying).unwrap_err());
        assert!(
            matches!(r, Corruption::TruncatedData { found: 0, .. }),
            "{r}"
        );
        let e = parse(&[0, 0, 0x0d, 1, 0, 0, 0, 1, 0, 0, 0, 0]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "load_idx: mem.idx has dtype idx type 0x0d (f32) but only u8 (idx type 0x08) are \
             accepted"
        );
    }

    #[test]
    fn wrong_dims_for_a_dataset() {
        let p = Path::new("x");
        let labels = IdxArray {
            dims: vec![3],
            data: vec![0, 1, 0],
        };
        let flat = IdxArray {
            dims: vec![3, 4],
            data: (0..12).collect(),
        };
        let e = Dataset::from_idx_arrays(flat, labels.clone(), p, p).unwrap_err();
        assert!(matches!(e, TrainError::BadShape { .. }), "{e}");
        let l2 = IdxArray {
            dims: vec![3, 1],
            data: vec![0, 1, 0],
        };
        let e = Dataset::from_idx_arrays(images(), l2, p, p).unwrap_err();
        assert!(matches!(e, TrainError::BadShape { .. }), "{e}");
        let l4 = IdxArray {
            dims: vec![4],
            data: vec![0, 1, 0, 1],
        };
        let e = Dataset::from_idx_arrays(images(), l4, p, p).unwrap_err();
        assert!(
            matches!(e, TrainError::ShapeMismatch { what: "labels", .. }),
            "{e}"
        );
        let empty = IdxArray {
            dims: vec![0, 2, 2],
            data: vec![],
        };
        let e = Dataset::from_idx_arrays(
            empty,
            IdxArray {
                dims: vec![0],
                data: vec![],
            },
            p,
            p,
        );
        assert!(matches!(e, Err(TrainError::EmptyDataset { .. })));
    }

    #[test]
    fn encode_refuses_inconsistent_arrays() {
        let e = encode_idx(&IdxArray {
            dims: vec![2, 2],
            data: vec![0; 3],
        })
        .unwrap_err();
        assert!(matches!(e, TrainError::ShapeMismatch { .. }), "{e}");
        let e = encode_idx(&IdxArray {
            dims: vec![],
            data: vec![],
        })
        .unwrap_err();
        assert!(matches!(e, TrainError::BadShape { .. }), "{e}");
    }

    #[test]
    fn dataset_errors_name_the_idx_files() {
        let (ip, lp) = (Path::new("t10k-images.idx"), Path::new("t10k-labels.idx"));
        let labels = IdxArray {
            dims: vec![3],
            data: vec![0, 1, 2],
        };
        let ds = Dataset::from_idx_arrays(images(), labels, ip, lp).unwrap();
        assert_eq!((ds.images_path(), ds.labels_path()), (Some(ip), Some(lp)));
        let e = ds.with_num_classes(2).unwrap_err();
        assert_eq!(
            e.to_string(),
            "with_num_classes: t10k-labels.idx: label 2 of example 2 is out of range for 2 classes"
        );
        let empty = IdxArray {
            dims: vec![0, 2, 2],
            data: vec![],
        };
        let none = IdxArray {
            dims: vec![0],
            data: vec![],
        };
        let e = Dataset::from_idx_arrays(empty, none, ip, lp).unwrap_err();
        assert_eq!(
            e.to_string(),
            "load_idx: t10k-images.idx: the data set is empty"
        );
    }
}
