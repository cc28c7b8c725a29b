//! Bad layer configurations and inputs of the issue-10 layers fail at init (before anything is
//! allocated) with a typed error naming the layer's path and the shapes; bad labels of the
//! integer-label losses fail the step and change nothing.

use std::sync::Arc;

use stax::layers::LayerError;
use stax::train::{TrainError, Trainer};
use stax::{
    Adam, Backend, BackendOptions, Category, DType, Dense, Device, Dropout, Elementwise,
    FanInConcat, FanInSum, FanOut, Layer, NegLogLikelihood, Relu, Shape, Softmax, Tensor, Tree,
    parallel, serial,
};

fn cpu() -> Arc<dyn Backend> {
    Device::Cpu.open(&BackendOptions::default()).unwrap()
}

/// Init of `model` for `input` fails without allocating; returns the error's text and path.
fn init_error(model: impl Layer, input: &[usize]) -> (String, String) {
    let be = cpu();
    let before = be.allocator().stats().requested;
    let err = Trainer::new(model, Shape::new(input), Adam::new(1e-3), &be, 0).unwrap_err();
    assert_eq!(
        be.allocator().stats().requested,
        before,
        "allocated before failing: {err}"
    );
    let path = match &err {
        TrainError::Layer(e) => e.path().to_string(),
        other => panic!("expected a layer error, got {other}"),
    };
    (err.to_string(), path)
}

fn has_all(text: &str, wants: &[&str]) {
    for want in wants {
        assert!(text.contains(want), "{want:?} missing from: {text}");
    }
}

#[test]
fn fan_in_sum_of_mismatched_shapes_names_path_and_shapes() {
    let model = serial![FanOut(2), parallel![Dense(3), Dense(4)], FanInSum];
    let (text, path) = init_error(model, &[2, 5]);
    assert_eq!(path, "2.fan_in_sum");
    has_all(
        &text,
        &["2.fan_in_sum", "branch 1 has shape [2, 4]", "[2, 3]"],
    );
}

#[test]
fn fan_in_concat_along_a_wrong_axis_names_path_and_shapes() {
    // axis 2 of rank-2 branches
    let model = serial![FanOut(2), parallel![Dense(3), Dense(3)], FanInConcat(2)];
    let (text, path) = init_error(model, &[2, 5]);
    assert_eq!(path, "2.fan_in_concat");
    has_all(
        &text,
        &["axis 2 is out of range for rank 2", "([2, 3], [2, 3])"],
    );
    // axis 0: the branches differ on axis 1
    let model = serial![FanOut(2), parallel![Dense(3), Dense(4)], FanInConcat(0)];
    let (text, path) = init_error(model, &[2, 5]);
    assert_eq!(path, "2.fan_in_concat");
    has_all(
        &text,
        &["piece 1 does not match piece 0 ([2, 3])", "[2, 4]"],
    );
}

#[test]
fn a_keep_rate_outside_0_1_is_a_typed_error_at_init() {
    for rate in [0.0, -0.1, 1.5, f32::NAN, f32::INFINITY] {
        let model = serial![Dense(4), Dropout::new(rate), Dense(2)];
        let (text, path) = init_error(model, &[3, 5]);
        assert_eq!(path, "1.dropout");
        has_all(&text, &["1.dropout", "keep rate", "(0, 1]"]);
    }
    let e = Dropout::new(2.0)
        .param_specs(&Tree::leaf(Shape::new([2, 2])))
        .unwrap_err();
    assert!(matches!(e, LayerError::Config { .. }), "{e}");
}

#[test]
fn a_training_dropout_without_an_rng_key_is_an_error() {
    let be = cpu();
    let x = Tensor::from_slice(&be, &[1.0; 6], [2, 3], Category::Input).unwrap();
    let mut sink = stax::Collect::new();
    let mut cx = stax::Cx::train(&be, &mut sink);
    let e = Dropout::new(0.5)
        .apply(&Tree::empty(), Tree::leaf(x), &mut cx)
        .unwrap_err();
    assert!(e.to_string().contains("needs an RNG key"), "{e}");
}

#[test]
fn bad_activation_parameters_and_softmax_axes_fail_at_init() {
    let (text, path) = init_error(serial![Dense(3), Elementwise::elu(-1.0), Dense(2)], &[2, 4]);
    assert_eq!(path, "1.elu");
    has_all(&text, &["elu(-1)", ">= 0"]);
    let (text, path) = init_error(serial![Dense(3), Softmax.over(2), Dense(2)], &[2, 4]);
    assert_eq!(path, "1.softmax");
    has_all(
        &text,
        &[
            "softmax(axis=2)",
            "axis 2 is out of range for rank 2",
            "[2, 3]",
        ],
    );
}

#[test]
fn integer_labels_out_of_range_or_of_the_wrong_dtype_change_nothing() {
    let be = cpu();
    let model = serial![Dense(3), Relu];
    let input = Shape::new([2, 4]);
    let mut t =
        Trainer::with_loss(model, input, Adam::new(1e-2), NegLogLikelihood, &be, 0).unwrap();
    let before: Vec<Vec<f32>> = t
        .params()
        .leaves()
        .iter()
        .map(|p| p.to_vec().unwrap())
        .collect();
    let x = Tensor::from_slice(&be, &[0.5; 8], [2, 4], Category::Input).unwrap();
    let mut y = Tensor::empty(&be, [2], DType::U32, Category::Input).unwrap();
    stax::tensor::ops::upload(bytemuck::cast_slice(&[1u32, 3]), &mut y).unwrap();
    let err = t.step(&x, &y).unwrap_err();
    assert!(
        err.to_string()
            .contains("label 3 of row 1 is out of range for 3 classes"),
        "{err}"
    );
    let one_hot = Tensor::from_slice(
        &be,
        &[0.0, 1.0, 0.0, 1.0, 0.0, 0.0],
        [2, 3],
        Category::Input,
    )
    .unwrap();
    let err = t.step(&x, &one_hot).unwrap_err();
    assert!(
        matches!(err, TrainError::BatchShape { what: "labels", .. }),
        "{err}"
    );
    assert!(err.to_string().contains("u32 [2]"), "{err}");
    let after: Vec<Vec<f32>> = t
        .params()
        .leaves()
        .iter()
        .map(|p| p.to_vec().unwrap())
        .collect();
    assert_eq!(after, before, "parameters changed by a failed step");
    assert_eq!((t.steps(), t.state().count), (0, 0));
    // nothing of the failed steps is left: the plan's persistent bytes (with this batch) and
    // the one-hot labels
    let live = t.plan(2).unwrap().persistent_bytes() + one_hot.bytes() as u64;
    assert_eq!(be.allocator().stats().requested, live);
}
