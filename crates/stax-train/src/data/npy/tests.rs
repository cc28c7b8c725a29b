//! Tests for `.npy` / `.npz` loading, on small files written with `npyz`'s writer.

use std::path::PathBuf;

use npyz::WriterBuilder;
use npyz::npz::NpzWriter;

use super::*;
use crate::error::NonFiniteKind;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("stax-npy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// `.npy` bytes of `data` with `shape` and dtype `dtype` (e.g. `"<u2"`), or `T`'s default.
fn npy<T: npyz::AutoSerialize + Copy>(shape: &[u64], data: &[T], dtype: Option<&str>) -> Vec<u8> {
    npy_ordered(shape, data, dtype, Order::C)
}

fn npy_ordered<T: npyz::AutoSerialize + Copy>(
    shape: &[u64],
    data: &[T],
    dtype: Option<&str>,
    order: Order,
) -> Vec<u8> {
    let mut buf = Vec::new();
    let dtype = dtype.map_or_else(T::default_dtype, |d| DType::Plain(d.parse().unwrap()));
    let mut w = npyz::WriteOptions::new()
        .dtype(dtype)
        .shape(shape)
        .order(order)
        .writer(&mut buf)
        .begin_nd()
        .unwrap();
    w.extend(data.iter().copied()).unwrap();
    w.finish().unwrap();
    buf
}

fn write(name: &str, bytes: &[u8]) -> PathBuf {
    let path = tmp(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn load(name: &str, images: &[u8], labels: &[u8]) -> Result<Dataset, TrainError> {
    let ip = write(&format!("{name}-images.npy"), images);
    let lp = write(&format!("{name}-labels.npy"), labels);
    Dataset::from_npy(&ip, &lp)
}

fn u8_images() -> Vec<u8> {
    npy(&[3, 2, 2, 1], &(0u8..12).collect::<Vec<_>>(), None)
}

#[test]
fn u8_images_with_integer_labels_of_every_width() {
    let want_px = Pixels::U8((0..12).collect());
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("i64", npy(&[3], &[2i64, 0, 1], None)),
        ("i32", npy(&[3], &[2i32, 0, 1], None)),
        ("u8", npy(&[3], &[2u8, 0, 1], None)),
        ("u16be", npy(&[3], &[2u16, 0, 1], Some(">u2"))),
        ("u64", npy(&[3], &[2u64, 0, 1], None)),
        ("i8", npy(&[3], &[2i8, 0, 1], None)),
    ];
    for (name, labels) in cases {
        let ds = load(name, &u8_images(), &labels).unwrap();
        assert_eq!(ds.labels(), &[2, 0, 1], "{name}");
        assert_eq!(
            (ds.num_classes(), ds.image_shape()),
            (3, (2, 2, 1)),
            "{name}"
        );
        assert_eq!(ds.pixels(), &want_px, "{name}");
    }
}

#[test]
fn f32_images_gray_and_big_endian() {
    let px: Vec<f32> = (0..8).map(|i| i as f32 * 0.125).collect();
    let labels = npy(&[2], &[0i64, 1], None);
    let ds = load("f32", &npy(&[2, 2, 2], &px, None), &labels).unwrap();
    assert_eq!(ds.image_shape(), (2, 2, 1));
    assert_eq!(ds.pixels(), &Pixels::F32(px.clone()));
    let ds = load("f32be", &npy(&[2, 1, 2, 2], &px, Some(">f4")), &labels).unwrap();
    assert_eq!(ds.image_shape(), (1, 2, 2));
    assert_eq!(ds.pixels(), &Pixels::F32(px));
}

#[test]
fn one_hot_labels_f32_f64_and_integer() {
    let rows_f32 = npy(
        &[3, 4],
        &[0f32, 0., 1., 0., 1., 0., 0., 0., 0., 0., 0., 1.],
        None,
    );
    let rows_f64 = npy(
        &[3, 4],
        &[0f64, 0., 1., 0., 1., 0., 0., 0., 0., 0., 0., 1.],
        None,
    );
    let rows_u8 = npy(&[3, 4], &[0u8, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 1], None);
    for (name, rows) in [("oh32", rows_f32), ("oh64", rows_f64), ("ohu8", rows_u8)] {
        let ds = load(name, &u8_images(), &rows).unwrap();
        assert_eq!(ds.labels(), &[2, 0, 3], "{name}");
        assert_eq!(ds.num_classes(), 4, "{name}");
    }
}

#[test]
fn rows_that_are_not_one_hot() {
    let soft = npy(&[3, 2], &[0.5f32, 0.5, 1., 0., 0., 1.], None);
    let e = load("soft", &u8_images(), &soft).unwrap_err();
    assert!(matches!(e, TrainError::NotOneHot { index: 0, .. }), "{e}");
    let two = npy(&[3, 2], &[0f32, 1., 1., 1., 0., 1.], None);
    let e = load("two", &u8_images(), &two).unwrap_err();
    assert!(matches!(e, TrainError::NotOneHot { index: 1, .. }), "{e}");
    let nan = npy(&[3, 2], &[0f32, 1., 1., 0., f32::NAN, 1.], None);
    let e = load("nanrow", &u8_images(), &nan).unwrap_err();
    assert!(matches!(e, TrainError::NotOneHot { index: 2, .. }), "{e}");
    let empty_k = npy::<f32>(&[3, 0], &[], None);
    let e = load("k0", &u8_images(), &empty_k).unwrap_err();
    assert!(matches!(e, TrainError::BadShape { .. }), "{e}");
}

#[test]
fn wrong_dtypes() {
    let labels = npy(&[3], &[0i64, 1, 0], None);
    let u16s = npy(&[3, 2, 2, 1], &[0u16; 12], Some("<u2"));
    let e = load("u16", &u16s, &labels).unwrap_err();
    let path = tmp("u16-images.npy");
    assert_eq!(
        e.to_string(),
        format!(
            "load_npy: {} has dtype <u2 but only u8 and f32 are accepted",
            path.display()
        )
    );
    let f64s = npy(&[3, 2, 2, 1], &[0f64; 12], None);
    let e = load("f64", &f64s, &labels).unwrap_err();
    assert!(
        matches!(&e, TrainError::BadDtype { found, .. } if found == "<f8"),
        "{e}"
    );
    let float_labels = npy(&[3], &[0f32, 1., 0.], None);
    let e = load("flabels", &u8_images(), &float_labels).unwrap_err();
    assert!(matches!(e, TrainError::BadDtype { .. }), "{e}");
    let bools = npy(&[3], &[true, false, true], None);
    let e = load("blabels", &u8_images(), &bools).unwrap_err();
    assert!(matches!(e, TrainError::BadDtype { .. }), "{e}");
}

#[test]
fn wrong_ranks_and_count_mismatch() {
    let labels = npy(&[3], &[0i64, 1, 0], None);
    let flat = npy(&[3, 4], &[0u8; 12], None);
    let e = load("rank2", &flat, &labels).unwrap_err();
    assert!(matches!(e, TrainError::BadShape { .. }), "{e}");
    let labels3d = npy(&[3, 1, 1], &[0i64, 1, 0], None);
    let e = load("l3d", &u8_images(), &labels3d).unwrap_err();
    assert!(matches!(e, TrainError::BadShape { .. }), "{e}");
    let two = npy(&[2], &[0i64, 1], None);
    let e = load("count", &u8_images(), &two).unwrap_err();
    assert!(
        matches!(&e, TrainError::ShapeMismatch { op: "load_npy", what: "labels", expected, found }
            if expected == &[3] && found == &[2]),
        "{e}"
    );
}

#[test]
fn labels_out_of_range_and_empty() {
    let neg = npy(&[3], &[0i64, -1, 1], None);
    let e = load("neg", &u8_images(), &neg).unwrap_err();
    assert!(
        matches!(
            e,
            TrainError::LabelOutOfRange {
                index: 1,
                label: -1,
                ..
            }
        ),
        "{e}"
    );
    let huge = npy(&[3], &[0i64, 1, 1 << 40], None);
    let e = load("huge", &u8_images(), &huge).unwrap_err();
    assert!(
        matches!(
            e,
            TrainError::LabelOutOfRange {
                index: 2,
                num_classes: MAX_CLASSES,
                ..
            }
        ),
        "{e}"
    );
    let e = load(
        "empty",
        &npy::<u8>(&[0, 2, 2, 1], &[], None),
        &npy::<i64>(&[0], &[], None),
    )
    .unwrap_err();
    assert!(matches!(e, TrainError::EmptyDataset { .. }), "{e}");
}

#[test]
fn nan_in_f32_images_is_reported() {
    let mut px = vec![0.25f32; 12];
    px[9] = f32::NAN;
    let e = load(
        "nan",
        &npy(&[3, 2, 2, 1], &px, None),
        &npy(&[3], &[0i64, 1, 0], None),
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            TrainError::NonFinite {
                index: 2,
                element: 1,
                value_kind: NonFiniteKind::NaN,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn fortran_order_is_transposed() {
    // C-order values 0..12 of shape [3, 2, 2, 1], written column-major.
    let c: Vec<u8> = (0..12).collect();
    let shape = [3usize, 2, 2, 1];
    let mut f = vec![0u8; 12];
    for (i, &v) in c.iter().enumerate() {
        let (n, y, x) = (i / 4, (i / 2) % 2, i % 2);
        f[n + 3 * y + 6 * x] = v;
    }
    let bytes = npy_ordered(&[3, 2, 2, 1], &f, None, Order::Fortran);
    let ds = load("fortran", &bytes, &npy(&[3], &[0i64, 1, 0], None)).unwrap();
    assert_eq!(ds.pixels(), &Pixels::U8(c.clone()));
    assert_eq!(fortran_to_c(&f, &shape), c);
}

#[test]
fn truncated_corrupt_and_missing_files() {
    let labels = npy(&[3], &[0i64, 1, 0], None);
    let full = u8_images();
    let e = load("trunc", &full[..full.len() - 3], &labels).unwrap_err();
    assert!(
        matches!(
            e,
            TrainError::Corrupt {
                reason: Corruption::Npy { .. },
                ..
            }
        ),
        "{e}"
    );
    let e = load("hdr", &full[..20], &labels).unwrap_err();
    assert!(matches!(e, TrainError::Corrupt { .. }), "{e}");
    let e = load("garbage", b"not a numpy file at all", &labels).unwrap_err();
    assert!(matches!(e, TrainError::Corrupt { .. }), "{e}");
    let e = Dataset::from_npy(&tmp("nope.npy"), &tmp("nope2.npy")).unwrap_err();
    assert!(matches!(e, TrainError::Io { op: "load_npy", .. }), "{e}");
}

/// Bytes past the declared data (images or labels) are refused, not ignored.
#[test]
fn trailing_data_is_corrupt() {
    let labels = npy(&[3], &[0i64, 1, 0], None);
    let mut long = u8_images();
    long.extend_from_slice(&[7; 24]);
    let e = load("trail", &long, &labels).unwrap_err();
    let trailing = |e: &TrainError| {
        matches!(
            e,
            TrainError::Corrupt {
                reason: Corruption::TrailingData { expected: 12 },
                ..
            }
        )
    };
    assert!(trailing(&e), "{e}");
    let mut long_labels = labels.clone();
    long_labels.extend_from_slice(&[0; 8]);
    let e = load("trail-labels", &u8_images(), &long_labels).unwrap_err();
    assert!(
        matches!(
            e,
            TrainError::Corrupt {
                reason: Corruption::TrailingData { expected: 24 },
                ..
            }
        ),
        "{e}"
    );
    assert!(load("exact", &u8_images(), &labels).is_ok());
}

#[test]
fn header_with_overflowing_shape_is_corrupt() {
    let header = "{'descr': '|u1', 'fortran_order': False, \
                  'shape': (4294967296, 4294967296, 4294967296, 1), }";
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    let mut text = header.to_string();
    while (10 + text.len() + 1) % 64 != 0 {
        text.push(' ');
    }
    text.push('\n');
    bytes.extend_from_slice(&(text.len() as u16).to_le_bytes());
    bytes.extend_from_slice(text.as_bytes());
    let e = load("overflow", &bytes, &npy(&[3], &[0i64, 1, 0], None)).unwrap_err();
    assert!(matches!(e, TrainError::Corrupt { .. }), "{e}");
}

fn npz(name: &str, arrays: &[(&str, &[u8], &[u64])]) -> PathBuf {
    let path = tmp(name);
    let mut w = NpzWriter::create(&path).unwrap();
    for &(key, data, shape) in arrays {
        let a = w.array::<u8>(key, Default::default()).unwrap();
        let mut a = a.default_dtype().shape(shape).begin_nd().unwrap();
        a.extend(data.iter().copied()).unwrap();
        a.finish().unwrap();
    }
    drop(w);
    path
}

#[test]
fn npz_default_and_explicit_keys() {
    let px: Vec<u8> = (0..12).collect();
    let xy = npz(
        "xy.npz",
        &[("x", &px, &[3, 2, 2, 1]), ("y", &[1, 0, 1], &[3])],
    );
    let ds = Dataset::from_npz(&xy, None, None).unwrap();
    assert_eq!((ds.len(), ds.labels()), (3, &[1, 0, 1][..]));
    assert_eq!(ds.pixels(), &Pixels::U8(px.clone()));
    let named = npz(
        "named.npz",
        &[("labels", &[0, 0, 1], &[3]), ("images", &px, &[3, 2, 2])],
    );
    let ds = Dataset::from_npz(&named, None, None).unwrap();
    assert_eq!(ds.labels(), &[0, 0, 1]);
    let ds = Dataset::from_npz(&named, Some("images"), Some("labels")).unwrap();
    assert_eq!(ds.image_shape(), (2, 2, 1));
    let e = Dataset::from_npz(&named, Some("x"), None).unwrap_err();
    assert!(
        matches!(&e, TrainError::MissingArray { tried, .. } if tried == &["x"]),
        "{e}"
    );
    let e =
        Dataset::from_npz(&npz("onlyx.npz", &[("x", &px, &[3, 2, 2, 1])]), None, None).unwrap_err();
    assert!(matches!(e, TrainError::MissingArray { .. }), "{e}");
    assert!(
        e.to_string()
            .contains(r#"has no array named any of ["y", "labels", "y_train"]"#)
    );
}

#[test]
fn npz_corrupt_and_bad_dtype() {
    let path = write("bad.npz", b"PK\x03\x04 definitely not a zip");
    let e = Dataset::from_npz(&path, None, None).unwrap_err();
    assert!(
        matches!(
            e,
            TrainError::Corrupt {
                reason: Corruption::Zip { .. },
                ..
            }
        ),
        "{e}"
    );
    let px: Vec<u8> = (0..12).collect();
    let good = std::fs::read(npz(
        "cut.npz",
        &[("x", &px, &[3, 4, 1, 1]), ("y", &[0; 3], &[3])],
    ))
    .unwrap();
    let cut = write("cut2.npz", &good[..good.len() / 2]);
    assert!(matches!(
        Dataset::from_npz(&cut, None, None),
        Err(TrainError::Corrupt { .. })
    ));
    let path = tmp("f64.npz");
    {
        let mut w = NpzWriter::create(&path).unwrap();
        let a = w.array::<f64>("x", Default::default()).unwrap();
        let mut a = a.default_dtype().shape(&[1, 1, 1, 1]).begin_nd().unwrap();
        a.push(&0.5).unwrap();
        a.finish().unwrap();
    }
    let e = Dataset::from_npz(&path, None, None).unwrap_err();
    assert!(
        matches!(e, TrainError::BadDtype { op: "load_npz", .. }),
        "{e}"
    );
}

/// Every data error names its file and the first bad element, so that a bad test file does
/// not read like a bad training file.
#[test]
fn errors_name_the_file_and_the_first_bad_element() {
    let labels = npy(&[3], &[0i64, 1, 0], None);
    let mut px = vec![0.25f32; 12];
    px[9] = f32::NAN;
    px[11] = f32::INFINITY;
    let e = load("test-nan", &npy(&[3, 2, 2, 1], &px, None), &labels).unwrap_err();
    let images = tmp("test-nan-images.npy");
    assert_eq!(
        e.to_string(),
        format!(
            "load_npy: {}: image 2 holds NaN at element 1 (h, w, c flattened)",
            images.display()
        )
    );
    assert!(matches!(&e, TrainError::NonFinite { path: Some(p), .. } if *p == images));

    let e = load("test-neg", &u8_images(), &npy(&[3], &[0i64, -1, -2], None)).unwrap_err();
    let labels_path = tmp("test-neg-labels.npy");
    assert_eq!(
        e.to_string(),
        format!(
            "load_npy: {}: label -1 of example 1 is out of range for 1 classes",
            labels_path.display()
        )
    );
    let soft = npy(&[3, 2], &[1f32, 0., 0.5, 0.5, 1., 0.], None);
    let e = load("test-soft", &u8_images(), &soft).unwrap_err();
    let want = format!(
        "{}: label row 1 is not one-hot",
        tmp("test-soft-labels.npy").display()
    );
    assert!(e.to_string().contains(&want), "{e}");

    let empty = npy::<u8>(&[0, 2, 2, 1], &[], None);
    let e = load("test-empty", &empty, &npy::<i64>(&[0], &[], None)).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "load_npy: {}: the data set is empty",
            tmp("test-empty-images.npy").display()
        )
    );

    // A class count shared with another split names the labels' file too.
    let ds = load("test-3", &u8_images(), &npy(&[3], &[0i64, 1, 2], None)).unwrap();
    let e = ds.with_num_classes(2).unwrap_err();
    let want = format!(
        "with_num_classes: {}: label 2 of example 2 is out of range for 2 classes",
        tmp("test-3-labels.npy").display()
    );
    assert_eq!(e.to_string(), want);
}

/// Inside an `.npz` the error names the archive's member: which array of which archive.
#[test]
fn npz_errors_name_the_array() {
    let px: Vec<u8> = (0..12).collect();
    let path = npz(
        "test-split.npz",
        &[("x", &px, &[3, 2, 2, 1]), ("y", &[0, 1, 7], &[3])],
    );
    let ds = Dataset::from_npz(&path, None, None).unwrap();
    assert_eq!(ds.images_path(), Some(path.join("x.npy").as_path()));
    assert_eq!(ds.labels_path(), Some(path.join("y.npy").as_path()));
    let e = ds.with_num_classes(2).unwrap_err();
    let want = format!("{}: label 7 of example 2", path.join("y.npy").display());
    assert!(e.to_string().contains(&want), "{e}");

    let wide = tmp("test-wide.npz");
    {
        let mut w = NpzWriter::create(&wide).unwrap();
        let a = w.array::<u8>("x", Default::default()).unwrap();
        let mut a = a.default_dtype().shape(&[1, 1, 1, 1]).begin_nd().unwrap();
        a.push(&1).unwrap();
        a.finish().unwrap();
        let a = w.array::<f32>("y", Default::default()).unwrap();
        let mut a = a.default_dtype().shape(&[1]).begin_nd().unwrap();
        a.push(&0.0).unwrap();
        a.finish().unwrap();
    }
    let e = Dataset::from_npz(&wide, None, None).unwrap_err();
    assert!(
        matches!(&e, TrainError::BadDtype { path, .. } if *path == wide.join("y.npy")),
        "{e}"
    );
    assert!(
        e.to_string().starts_with(&format!(
            "load_npz: {} has dtype <f4",
            wide.join("y.npy").display()
        )),
        "{e}"
    );
}
