//! Unit tests of [`Dataset`]: validation, errors, subsets, scaling.
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

/// The scaling is explicit (a documented default per storage type, an option to change it) and
/// visible (the data set says which applies).
#[test]
fn scaling_is_explicit_and_reported() {
    let ds = tiny();
    assert_eq!(ds.scaling(), PixelScaling::Divide255);
    assert_eq!(ds.scaling().to_string(), "x / 255 (to [0, 1])");
    let raw = ds.clone().with_scaling(PixelScaling::AsStored);
    assert_eq!(raw.scaling().to_string(), "as stored");
    let mut out = [0.0f32; 4];
    raw.image_f32(2, &mut out).unwrap();
    assert_eq!(out, [20.0, 21.0, 22.0, 23.0]);
    // subsets keep it
    let sub = raw.subset(&[2]).unwrap();
    assert_eq!(sub.scaling(), PixelScaling::AsStored);
    // f32 images are taken as stored unless asked otherwise
    let f = Dataset::new(Pixels::F32(vec![51.0, 255.0]), 1, 1, 2, 1, vec![0], 1).unwrap();
    assert_eq!(f.scaling(), PixelScaling::AsStored);
    let mut two = [0.0f32; 2];
    f.image_f32(0, &mut two).unwrap();
    assert_eq!(two, [51.0, 255.0]);
    let f = f.with_scaling(PixelScaling::Divide255);
    f.image_f32(0, &mut two).unwrap();
    assert_eq!(two, [0.2, 1.0]);
    // data made in memory has no files
    assert_eq!((ds.images_path(), ds.labels_path()), (None, None));
}
