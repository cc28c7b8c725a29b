//! Bad input at the trainer level gets a typed error, never a panic, and changes nothing.

use stax::train::data::{Dataset, Loader, Pixels};
use stax::train::{TrainError, Trainer};
use stax::{
    Adam, Backend, BackendOptions, Category, Conv, Dense, Device, Flatten, Relu, Shape, Tensor,
    serial,
};
use std::sync::Arc;

fn cpu() -> Arc<dyn Backend> {
    Device::Cpu.open(&BackendOptions::default()).unwrap()
}

fn small_trainer(be: &Arc<dyn Backend>) -> Trainer<stax::Serial> {
    let model = serial![Conv::same(2, (3, 3)), Relu, Flatten, Dense(2)];
    Trainer::new(model, Shape::new([4, 6, 6, 3]), Adam::new(1e-3), be, 1).unwrap()
}

fn values(t: &Trainer<stax::Serial>) -> Vec<Vec<f32>> {
    t.params()
        .leaves()
        .iter()
        .map(|p| p.to_vec().unwrap())
        .collect()
}

fn tensor(be: &Arc<dyn Backend>, shape: &[usize], value: f32) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_slice(be, &vec![value; n], shape, Category::Input).unwrap()
}

#[test]
fn image_shape_that_does_not_match_the_model() {
    let be = cpu();
    let mut t = small_trainer(&be);
    let y = tensor(&be, &[4, 2], 0.5);
    for shape in [[4, 7, 6, 3], [4, 6, 6, 1], [0, 6, 6, 3]] {
        let err = t.step(&tensor(&be, &shape, 0.1), &y).unwrap_err();
        assert!(
            matches!(err, TrainError::BatchShape { what: "inputs", .. }),
            "{err}"
        );
        // prediction checks its inputs the same way (any batch size, the example's shape)
        let err = t.predict(&tensor(&be, &shape, 0.1)).unwrap_err();
        assert!(
            matches!(err, TrainError::BatchShape { what: "inputs", .. }),
            "predict: {err}"
        );
    }
    let logits = t.predict(&tensor(&be, &[3, 6, 6, 3], 0.1)).unwrap();
    assert_eq!(logits.dims(), &[3, 2], "predict takes any batch size");
    let err = t
        .step(&tensor(&be, &[4, 6, 6, 3], 0.1), &tensor(&be, &[4, 3], 0.5))
        .unwrap_err();
    assert!(
        matches!(err, TrainError::BatchShape { what: "labels", .. }),
        "{err}"
    );
    assert_eq!(t.steps(), 0);
}

#[test]
fn nan_in_placed_inputs_is_reported_and_not_trained_on() {
    let be = cpu();
    let mut t = small_trainer(&be);
    let before = values(&t);
    let y = tensor(&be, &[4, 2], 0.5);
    let err = t
        .step(&tensor(&be, &[4, 6, 6, 3], f32::NAN), &y)
        .unwrap_err();
    assert!(
        matches!(err, TrainError::NonFiniteLoss { step: 1, .. }),
        "{err}"
    );
    assert_eq!(values(&t), before, "parameters changed by a NaN batch");
    assert_eq!(t.state().count, 0);
    // the trainer still works afterwards, and its memory is back to the persistent bytes
    let r = t.step(&tensor(&be, &[4, 6, 6, 3], 0.1), &y).unwrap();
    assert!(r.loss.is_finite());
    assert_ne!(values(&t), before);
}

#[test]
fn nan_in_a_dataset_is_reported_at_load() {
    let mut px = vec![0.5f32; 2 * 2 * 2];
    px[5] = f32::NAN;
    let err = Dataset::new(Pixels::F32(px), 2, 2, 2, 1, vec![0, 1], 2).unwrap_err();
    assert!(
        matches!(err, TrainError::NonFinite { index: 1, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("NaN"), "{err}");
}

#[test]
fn data_set_and_batch_errors() {
    let ds = Dataset::new(Pixels::U8(vec![1; 3 * 4]), 3, 2, 2, 1, vec![0, 1, 1], 2).unwrap();
    assert!(matches!(
        Loader::new(ds.len(), 4, 0),
        Err(TrainError::BatchTooLarge { batch: 4, len: 3 })
    ));
    assert!(matches!(
        Loader::new(0, 1, 0),
        Err(TrainError::EmptyDataset { .. })
    ));
    let err = Dataset::new(Pixels::U8(vec![1; 4]), 1, 2, 2, 1, vec![2], 2).unwrap_err();
    assert!(matches!(err, TrainError::LabelOutOfRange { .. }), "{err}");
}

#[test]
fn a_model_that_does_not_fit_the_input_fails_in_init() {
    let be = cpu();
    let model = serial![
        Conv::new(2, (5, 5), (1, 1), stax::Padding::Valid),
        Flatten,
        Dense(2)
    ];
    let before = be.allocator().stats().requested;
    let err = Trainer::new(model, Shape::new([1, 3, 3, 1]), Adam::new(1e-3), &be, 0).unwrap_err();
    assert!(err.to_string().contains("conv(2, 5x5"), "{err}");
    assert_eq!(
        be.allocator().stats().requested,
        before,
        "init allocated before failing"
    );
}

#[test]
fn flatten_feature_count_overflow_is_a_shape_error() {
    use stax::Layer;
    let huge = Shape::new([2, usize::MAX / 2, 3, 1]);
    let err = Flatten.output_shape(&stax::Tree::leaf(huge)).unwrap_err();
    assert!(err.to_string().contains("overflows"), "{err}");
}

#[test]
fn a_wrong_rank_names_the_layer_path_and_both_shapes() {
    // An MLP's flat input given to a CNN: directly through `apply`, and through a trainer.
    use stax::{Cx, Layer, Tree};
    let be = cpu();
    let model = serial![Conv::same(16, (3, 3)), Relu, Flatten, Dense(2)];
    let (_, params) = {
        let good = Tree::leaf(Shape::new([2, 28, 28, 1]));
        let mut rng = stax::Rng::new(0);
        stax::init_params(&model, &good, &be, stax::ParamSource::Random(&mut rng)).unwrap()
    };
    let flat = tensor(&be, &[128, 784], 0.5);
    let err = model
        .apply(&params, Tree::leaf(flat), &mut Cx::eval(&be))
        .unwrap_err();
    let text = err.to_string();
    assert_eq!(err.path(), "0.conv");
    for want in ["0.conv", "NHWC", "rank 4", "[128, 784]"] {
        assert!(text.contains(want), "{want} missing from: {text}");
    }
    // the same model built for the wrong input fails at init, naming the same
    let err = Trainer::new(model, Shape::new([128, 784]), Adam::new(1e-3), &be, 0).unwrap_err();
    let text = err.to_string();
    for want in ["0.conv", "rank 4", "[128, 784]"] {
        assert!(text.contains(want), "{want} missing from: {text}");
    }
}

/// A max or average pooling with a window wholly in the padding (JAX: -inf or 0/0 there) is
/// refused when the model is built, naming the layer and the window; sum pooling's is 0.
#[test]
fn a_pooling_window_wholly_in_the_padding_fails_in_init() {
    use stax::layers::{AvgPool, MaxPool, SumPool};
    let be = cpu();
    let padding = stax::Padding::Explicit([(1, 2), (0, 1)]);
    let input = Shape::new([1, 6, 5, 2]);
    let tail = |k: usize| serial![Flatten, Dense(k)];
    let avg = serial![AvgPool::new((2, 3)).with((1, 2), padding), tail(2)];
    let err = Trainer::new(avg, input.clone(), Adam::new(1e-3), &be, 0).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("avg_pool"), "{text}");
    assert!(
        text.contains("output row 7 lies wholly in the padding"),
        "{text}"
    );
    let max = serial![MaxPool::new((2, 3)).with((1, 2), padding), tail(2)];
    let err = Trainer::new(max, input.clone(), Adam::new(1e-3), &be, 0).unwrap_err();
    assert!(err.to_string().contains("wholly in the padding"), "{err}");
    let sum = serial![SumPool::new((2, 3)).with((1, 2), padding), tail(2)];
    Trainer::new(sum, input, Adam::new(1e-3), &be, 0).unwrap();
}

/// The trainer's inputs are f32 (a model computing in bf16 casts them itself): a bf16 batch is
/// a typed error at the batch check, naming both dtypes, and nothing trains.
#[test]
fn a_batch_of_another_dtype_is_refused_at_the_batch_check() {
    let be = cpu();
    let mut trainer = small_trainer(&be);
    let before = values(&trainer);
    let x = tensor(&be, &[2, 6, 6, 3], 0.5);
    let mut xb = Tensor::empty(&be, x.shape().clone(), stax::DType::BF16, Category::Input).unwrap();
    stax::tensor::ops::cast(&x, &mut xb).unwrap();
    let mut y = vec![0f32; 4];
    y[0] = 1.0;
    y[3] = 1.0;
    let y = Tensor::from_slice(&be, &y, [2, 2], Category::Input).unwrap();
    let e = trainer.step(&xb, &y).unwrap_err().to_string();
    assert!(
        e.contains("trainer inputs") && e.contains("bf16") && e.contains("f32"),
        "{e}"
    );
    assert_eq!(values(&trainer), before);
}

/// An op's shape, dtype and alias errors name the operand they are about, as the op's
/// signature calls it.
#[test]
fn op_errors_name_the_operand() {
    use stax::tensor::backend::DenseDx;
    use stax::{DType, TensorError};
    use stax_tensor::ops;
    let be = cpu();
    let msg = |e: TensorError| e.to_string();
    // binary: b of another dtype, then of another shape
    let mut x = tensor(&be, &[2, 3], 1.0);
    let b16 = Tensor::empty(&be, [2, 3], DType::BF16, Category::Other).unwrap();
    let e = ops::binary(stax_tensor::BinaryOp::Add, &mut x, &b16).unwrap_err();
    assert!(
        matches!(
            e,
            TensorError::DType {
                operand: Some("b"),
                ..
            }
        ),
        "{e}"
    );
    assert!(msg(e).starts_with("binary: b: expected dtype f32"));
    let e = ops::binary(
        stax_tensor::BinaryOp::Add,
        &mut x,
        &tensor(&be, &[2, 4], 0.0),
    );
    assert!(msg(e.unwrap_err()).contains("b: expected shape [2, 3]"));
    // dense_adam: nu of the wrong shape, then an aliased mu
    let (dy, mut w, mut mu) = (
        tensor(&be, &[2, 4], 0.1),
        tensor(&be, &[3, 4], 0.0),
        tensor(&be, &[3, 4], 0.0),
    );
    let mut nu = tensor(&be, &[4, 3], 0.0);
    let h = Adam::new(1e-3).hyper(1);
    let mut xs = tensor(&be, &[2, 3], 1.0);
    let e = ops::dense_adam(&mut xs, &dy, &mut w, &mut mu, &mut nu, DenseDx::Skip, &h).unwrap_err();
    assert!(msg(e).contains("nu: expected shape [3, 4]"));
    let mut nu = tensor(&be, &[3, 4], 0.0);
    let alias = mu.clone();
    let e = ops::dense_adam(&mut xs, &dy, &mut w, &mut mu, &mut nu, DenseDx::Skip, &h).unwrap_err();
    assert!(
        matches!(
            e,
            TensorError::Aliased {
                operand: Some("mu"),
                ..
            }
        ),
        "{e}"
    );
    drop(alias);
}

#[test]
fn sizes_that_overflow_usize_are_typed_errors() {
    use stax_tensor::{Conv2dGeometry, ConvSpec, Padding, TensorError, ops};
    // SAME padding of a kernel dilated to usize::MAX
    let spec = ConvSpec {
        padding: Padding::Same,
        dilation: (usize::MAX - 1, 1),
        ..ConvSpec::default()
    };
    let x = Shape::new([1, 4, 4, 1]);
    let err = Conv2dGeometry::with_spec(&x, &Shape::new([2, 2, 1, 1]), &spec).unwrap_err();
    assert!(matches!(err, TensorError::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("overflows"), "{err}");
    // concatenated pieces whose sizes along the axis pass usize::MAX
    let (a, b) = (Shape::new([2, usize::MAX]), Shape::new([2, 2]));
    let err = ops::concat_shape("concat", 1, &[&a, &b]).unwrap_err();
    assert!(matches!(err, TensorError::Shape { .. }), "{err}");
    assert!(err.to_string().contains("overflow"), "{err}");
}

#[test]
fn more_classes_than_labels_can_name_is_refused() {
    use stax::train::data::npy::MAX_CLASSES;
    use stax::train::data::{Dataset, Pixels};
    for k in [MAX_CLASSES + 1, 1 << 40, usize::MAX] {
        let built = Dataset::new(Pixels::U8(vec![1, 2]), 2, 1, 1, 1, vec![0, 0], k);
        let err = built.expect_err("refused");
        assert!(matches!(err, TrainError::BadShape { .. }), "{k}: {err}");
        let ds = Dataset::new(Pixels::U8(vec![1, 2]), 2, 1, 1, 1, vec![0, 0], 2).unwrap();
        assert!(ds.with_num_classes(k).is_err(), "{k}");
    }
    let ds = Dataset::new(Pixels::U8(vec![1, 2]), 2, 1, 1, 1, vec![0, 1], MAX_CLASSES).unwrap();
    assert_eq!(ds.num_classes(), MAX_CLASSES);
}

#[test]
fn a_zero_extent_batch_layout_is_named() {
    use stax::train::data::{Dataset, Pixels};
    let be = cpu();
    let ds = Dataset::new(Pixels::U8(vec![1, 2]), 2, 1, 1, 1, vec![0, 1], 2).unwrap();
    for hwc in [(0, 0, 0), (1, 0, 1), (1, 1, 0)] {
        let err = stax::train::place_batch(&be, &ds, &[0], hwc).unwrap_err();
        assert!(matches!(err, TrainError::BadShape { .. }), "{hwc:?}: {err}");
        assert!(
            err.to_string().contains("every extent must be at least 1"),
            "{err}"
        );
    }
}
