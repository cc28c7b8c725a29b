//! The convolution, normalization and pooling layers of issue 10 given inputs they cannot
//! take: a typed error at init (from shapes alone, before anything is allocated) naming the
//! layer's path, what it expected and the shape it got; parameters made for another channel
//! count are a mismatch naming both shapes.

use stax::models::ResNet;
use stax::{
    AvgPool, BackendOptions, BatchNorm, Category, Conv, ConvDims, ConvTranspose, Cx, Dense, Device,
    Flatten, GeneralConv, GeneralConvTranspose, Layer, Padding, ParamSource, Rng, Serial, Shape,
    SumPool, Tensor, Tree, init_params, serial,
};

/// `model` on `input` fails in `param_specs` and in `init_params` with an error whose path is
/// `path` and whose message holds every one of `want`, and init allocates nothing.
fn fails_at_init(model: &Serial, input: &[usize], path: &str, want: &[&str]) {
    let be = Device::Cpu.open(&BackendOptions::default()).unwrap();
    let shapes = Tree::leaf(Shape::new(input));
    let err = model.param_specs(&shapes).unwrap_err();
    assert_eq!(err.path(), path, "{err}");
    let text = err.to_string();
    for w in want {
        assert!(text.contains(w), "{w:?} missing from: {text}");
    }
    let before = be.allocator().stats().requested;
    let mut rng = Rng::new(0);
    let err = init_params(model, &shapes, &be, ParamSource::Random(&mut rng)).unwrap_err();
    assert_eq!(err.to_string(), text);
    assert_eq!(be.allocator().stats().requested, before, "init allocated");
}

#[test]
fn wrong_ranks_and_shapes_fail_at_init_naming_path_and_shapes() {
    let nchw = GeneralConv::general(ConvDims::NCHW, 4, (3, 3), (1, 1), Padding::Same);
    fails_at_init(
        &serial![Dense(4), nchw],
        &[2, 8],
        "1.conv",
        &["conv(NCHW/OIHW, 4, 3x3", "NCHW input of rank 4", "[2, 4]"],
    );
    fails_at_init(
        &serial![ConvTranspose::one_d(3, 2, 2, Padding::Same)],
        &[2, 5, 5, 3],
        "0.conv_transpose",
        &["NHC input of rank 3", "[2, 5, 5, 3]"],
    );
    fails_at_init(
        &serial![Flatten, BatchNorm::new()],
        &[2, 3, 3, 1],
        "1.batch_norm",
        &["axis 2 is out of range for rank 2", "[2, 9]"],
    );
    fails_at_init(
        &serial![BatchNorm::new().with_axis(&[1])],
        &[2, 3, 3, 4],
        "0.batch_norm",
        &["axes kept [0, 2, 3] must be consecutive", "[2, 3, 3, 4]"],
    );
    fails_at_init(
        &serial![Flatten, AvgPool::new((2, 2))],
        &[2, 3, 3, 1],
        "1.avg_pool",
        &["NHWC input [n, h, w, c] of rank 4", "[2, 9]"],
    );
    fails_at_init(
        &serial![SumPool::new((4, 4))],
        &[1, 3, 5, 2],
        "0.sum_pool",
        &[
            "VALID padding needs input size 3 >= kernel size 4",
            "[1, 3, 5, 2]",
        ],
    );
    // a dilated kernel wider than the input: (3 - 1) * 3 + 1 = 7 > 6
    fails_at_init(
        &serial![Conv::new(2, (3, 3), (1, 1), Padding::Valid).dilated((1, 3))],
        &[1, 9, 6, 2],
        "0.conv",
        &[
            "dilation 1x3",
            "input size 6 >= kernel size 7",
            "[1, 9, 6, 2]",
        ],
    );
    // explicit transposed padding the mapping does not run: before > k - 1
    let t = GeneralConvTranspose::new(2, (2, 2), (1, 1), Padding::Explicit([(2, 0), (0, 0)]));
    fails_at_init(
        &serial![t],
        &[1, 4, 4, 1],
        "0.conv_transpose",
        &["padding before (2)", "[1, 4, 4, 1]"],
    );
}

#[test]
fn a_resnet_for_images_too_small_names_the_layer() {
    let net = ResNet::resnet50(10);
    // 4x4 -> 2x2 after the stride-2 stem: the VALID 3x3 max pool does not fit
    let err = net.build((4, 4, 3)).unwrap_err();
    let text = err.to_string();
    assert_eq!(err.path(), "3.max_pool", "{text}");
    for want in ["input size 2 >= kernel size 3", "[1, 2, 2, 64]"] {
        assert!(text.contains(want), "{want} missing from: {text}");
    }
    let zero = ResNet {
        blocks: [1, 0, 1, 1],
        ..net
    };
    assert!(
        zero.build((224, 224, 3))
            .unwrap_err()
            .to_string()
            .contains("needs a block")
    );
    let five = ResNet {
        remat_stages: 5,
        ..net
    };
    let text = five.build((224, 224, 3)).unwrap_err().to_string();
    assert!(text.contains("remat_stages is 5"), "{text}");
}

#[test]
fn parameters_for_another_channel_count_are_a_mismatch_naming_both_shapes() {
    let be = Device::Cpu.open(&BackendOptions::default()).unwrap();
    let model = serial![Conv::same(8, (3, 3)), BatchNorm::new()];
    let mut rng = Rng::new(1);
    let made_for = Tree::leaf(Shape::new([2, 6, 6, 3]));
    let (_, params) = init_params(&model, &made_for, &be, ParamSource::Random(&mut rng)).unwrap();
    let x =
        Tensor::from_slice(&be, &[0.5f32; 2 * 6 * 6 * 4], [2, 6, 6, 4], Category::Input).unwrap();
    let err = model
        .apply(&params, Tree::leaf(x), &mut Cx::eval(&be))
        .unwrap_err();
    let text = err.to_string();
    assert_eq!(err.path(), "0.conv", "{text}");
    for want in ["[3, 3, 3, 8]", "[3, 3, 4, 8]"] {
        assert!(text.contains(want), "{want} missing from: {text}");
    }
}

#[test]
fn unsupported_dimension_numbers_are_config_errors() {
    // stax's own ResNet example starts with ('HWCN', 'OIHW', 'NHWC')
    let err = ConvDims::parse("HWCN", "OIHW", "NHWC").unwrap_err();
    assert!(
        matches!(err, stax::layers::LayerError::Config { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("(NHWC, HWIO, NHWC)"), "{err}");
    assert!(ConvDims::parse("NCHW", "OIHW", "NHWC").is_err());
}
