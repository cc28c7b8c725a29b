//! The layer conformance list: one line per layer (and per combinator arrangement), and five
//! checks run over every line: shapes (`init`'s equal `apply`'s, in both modes: stax's
//! `_CheckShapeAgreement`), finite differences of the backward pass, the same bits when
//! rematerialized (`Remat`), GPU = CPU on fresh random inputs (skipped without a GPU), and the
//! memory plan of a training step equal to what the step measures, to the byte, on the CPU and
//! the GPU. A new layer is one line here.

mod common;

use std::sync::Arc;

use common::layers::{finite_differences, gpu_matches_cpu, remat_is_the_same_bits};
use common::{Rng, cpu, cuda_or_skip, init, with_precision};
use stax::train::Trainer;
use stax::{
    Adam, Backend, Category, Collect, Conv, Cx, Dense, FanInConcat, FanInSum, FanOut, Flatten,
    Identity, Layer, MaxPool, Padding, Precision, Relu, Serial, Shape, Tanh, Tensor, Tree,
    parallel, serial,
};
use stax::{
    AvgPool, BatchNorm, ConvDims, ConvTranspose, Dropout, Elementwise, Elu, Exp, Gelu, GeneralConv,
    GeneralConvTranspose, LeakyRelu, LogSoftmax, Mode, Remat, Selu, ShapeDependent, Sigmoid,
    Softmax, Softplus, SumPool, models,
};

/// One line of the list: a name, the layer, an input shape.
struct Case {
    name: &'static str,
    layer: fn() -> Box<dyn Layer>,
    input: &'static [usize],
}

macro_rules! case {
    ($name:literal, $layer:expr, $input:expr) => {
        Case {
            name: $name,
            layer: || Box::new($layer),
            input: &$input,
        }
    };
}

const LAYERS: &[Case] = &[
    case!("conv SAME stride 1", Conv::same(4, (3, 3)), [2, 6, 5, 3]),
    case!(
        "conv VALID stride 2 odd",
        Conv::new(3, (3, 2), (2, 2), Padding::Valid),
        [2, 7, 5, 2]
    ),
    case!(
        "conv SAME asymmetric, batch 1",
        Conv::new(2, (3, 3), (2, 1), Padding::Same),
        [1, 8, 6, 3]
    ),
    case!("conv 1x1", Conv::same(5, (1, 1)), [3, 4, 4, 2]),
    case!("conv even kernel", Conv::same(2, (2, 2)), [1, 5, 5, 1]),
    case!("dense rank 2", Dense(5), [3, 7]),
    case!("dense rank 3", Dense(2), [2, 3, 4]),
    case!("dense 1x1", Dense(3), [1, 1]),
    case!("relu", Relu, [2, 3, 3, 2]),
    case!("tanh", Tanh, [2, 3, 3, 2]),
    case!("flatten", Flatten, [2, 3, 3, 2]),
    case!(
        "max_pool 2x2 stride 1 VALID",
        MaxPool::new((2, 2)),
        [2, 5, 4, 3]
    ),
    case!(
        "max_pool 3x3 stride 2 SAME",
        MaxPool::new((3, 3)).with((2, 2), Padding::Same),
        [1, 7, 6, 2]
    ),
    case!(
        "conv + tanh (fused)",
        serial![Conv::same(3, (3, 3)), Tanh],
        [2, 5, 5, 2]
    ),
    case!(
        "small cnn",
        serial![
            Conv::same(3, (3, 3)),
            Relu,
            Conv::new(2, (3, 3), (2, 2), Padding::Valid),
            Relu,
            Flatten,
            Dense(4),
            Relu,
            Dense(2)
        ],
        [2, 7, 7, 2]
    ),
    case!(
        "residual block",
        serial![
            FanOut(2),
            parallel![
                serial![Conv::same(3, (3, 3)), Relu, Conv::same(3, (3, 3))],
                Identity
            ],
            FanInSum,
            Relu
        ],
        [2, 6, 6, 3]
    ),
    case!(
        "concat of two convs",
        serial![
            FanOut(2),
            parallel![Conv::same(3, (3, 3)), Conv::same(2, (1, 1))],
            FanInConcat(-1)
        ],
        [2, 5, 5, 2]
    ),
    case!("fan out, sum", serial![FanOut(3), FanInSum], [2, 4]),
    case!("exp", Exp, [2, 3, 5]),
    case!("softplus", Softplus, [1, 7]),
    case!("sigmoid", Sigmoid, [3, 2, 2, 1]),
    case!("elu", Elu, [2, 5, 3]),
    case!("elu alpha 0.5, batch 1", Elementwise::elu(0.5), [1, 9]),
    case!("leaky_relu", LeakyRelu, [2, 3, 3, 2]),
    case!(
        "leaky_relu slope 0.3",
        Elementwise::leaky_relu(0.3),
        [1, 33]
    ),
    case!("selu", Selu, [2, 7]),
    case!("gelu", Gelu, [2, 3, 5]),
    case!("log_softmax", LogSoftmax, [3, 5]),
    case!("softmax, batch 1", Softmax, [1, 7]),
    case!("softmax over axis 1", Softmax.over(1), [2, 3, 4]),
    case!("log_softmax over axis 0", LogSoftmax.over(0), [3, 2, 5]),
    case!("dropout 0.8", Dropout::new(0.8), [2, 5, 3]),
    case!("dropout 0.5, batch 1", Dropout::new(0.5), [1, 37]),
    case!("dropout keep all", Dropout::new(1.0), [2, 3]),
    case!(
        "dropout in test mode",
        Dropout::new(0.5).with_mode(Mode::Eval),
        [2, 3]
    ),
    case!(
        "conv + elu (fused)",
        serial![Conv::same(3, (3, 3)), Elu],
        [2, 5, 5, 2]
    ),
    case!(
        "conv + leaky_relu (fused, mask)",
        serial![Conv::same(3, (3, 3)), LeakyRelu],
        [1, 5, 4, 2]
    ),
    case!(
        "conv + gelu (not fused)",
        serial![Conv::same(2, (3, 3)), Gelu],
        [2, 4, 4, 3]
    ),
    case!(
        "mlp with dropout and log_softmax",
        serial![Dense(6), Relu, Dropout::new(0.7), Dense(3), LogSoftmax],
        [3, 5]
    ),
    case!(
        "shape_dependent dense as wide as its input",
        ShapeDependent::new(|s| Box::new(Dense(s.as_leaf().map_or(1, |s| s.last())))),
        [2, 3, 4]
    ),
    case!(
        "residual block with shape_dependent",
        serial![
            FanOut(2),
            parallel![
                ShapeDependent::new(|s| {
                    let c = s.as_leaf().map_or(1, |s| s.last());
                    Box::new(serial![Conv::same(2, (1, 1)), Relu, Conv::same(c, (1, 1))])
                }),
                Identity
            ],
            FanInSum,
            Relu
        ],
        [2, 3, 3, 3]
    ),
    case!(
        "general conv NCHW/OIHW stride (2, 1) SAME dilated",
        GeneralConv::general(ConvDims::NCHW, 3, (3, 2), (2, 1), Padding::Same).dilated((2, 1)),
        [2, 2, 7, 6]
    ),
    case!(
        "conv explicit padding, dilation (1, 2), batch 1",
        Conv::new(3, (2, 3), (1, 2), Padding::Explicit([(2, 0), (1, 3)])).dilated((1, 2)),
        [1, 6, 7, 2]
    ),
    case!(
        "general conv NHWC/OIHW VALID",
        GeneralConv::general(dims("NHWC", "OIHW"), 4, (2, 2), (2, 2), Padding::Valid),
        [2, 5, 6, 3]
    ),
    case!(
        "general conv 1-D NCH/OIH SAME stride 2",
        GeneralConv::general(dims("NCH", "OIH"), 4, (3, 1), (2, 1), Padding::Same),
        [2, 3, 9]
    ),
    case!(
        "conv_transpose SAME stride 2",
        ConvTranspose::new(3, (3, 3), (2, 2), Padding::Same),
        [2, 4, 3, 2]
    ),
    case!(
        "conv_transpose VALID stride (2, 3), batch 1",
        ConvTranspose::new(2, (3, 2), (2, 3), Padding::Valid),
        [1, 3, 4, 3]
    ),
    case!(
        "conv_transpose explicit padding, dilated",
        ConvTranspose::new(2, (2, 2), (1, 2), Padding::Explicit([(1, 0), (0, 1)])).dilated((2, 1)),
        [2, 3, 3, 2]
    ),
    case!(
        "conv_transpose NCHW/OIHW SAME stride 2",
        GeneralConvTranspose::general(ConvDims::NCHW, 3, (3, 3), (2, 2), Padding::Same),
        [1, 2, 4, 5]
    ),
    case!(
        "conv1d_transpose VALID stride 2",
        ConvTranspose::one_d(3, 4, 2, Padding::Valid),
        [2, 5, 2]
    ),
    case!("batch_norm NHWC", BatchNorm::new(), [2, 3, 4, 3]),
    case!(
        "batch_norm NCHW without center, batch 1",
        BatchNorm::new()
            .with_axis(&[0, 2, 3])
            .with(1e-3, false, true),
        [1, 3, 4, 5]
    ),
    case!(
        "batch_norm [n, d] without scale",
        BatchNorm::new().with_axis(&[0]).with(1e-5, true, false),
        [5, 4]
    ),
    case!(
        "sum_pool 2x2 stride 1 VALID",
        SumPool::new((2, 2)),
        [2, 5, 4, 3]
    ),
    case!(
        "sum_pool 3x3 stride 2 SAME",
        SumPool::new((3, 3)).with((2, 2), Padding::Same),
        [1, 7, 6, 2]
    ),
    case!(
        "avg_pool 3x3 stride 2 SAME",
        AvgPool::new((3, 3)).with((2, 2), Padding::Same),
        [1, 7, 6, 2]
    ),
    case!(
        "avg_pool 2x2 stride 2 VALID",
        AvgPool::new((2, 2)).with((2, 2), Padding::Valid),
        [2, 5, 5, 3]
    ),
    case!(
        "batch_norm + relu (fused), NCHW",
        serial![BatchNorm::new().with_axis(&[0, 2, 3]), Relu],
        [2, 3, 4, 5]
    ),
    case!(
        "conv, batch_norm, relu",
        serial![Conv::same(4, (3, 3)), BatchNorm::new(), Relu],
        [2, 5, 5, 2]
    ),
    case!(
        "resnet conv block stride 2",
        models::conv_block(3, [2, 3, 4], (2, 2)),
        [2, 5, 6, 3]
    ),
    case!(
        "resnet identity block",
        models::identity_block(3, [2, 3], 4),
        [3, 3, 3, 4]
    ),
    case!(
        "remat of a resnet identity block",
        Remat::new(models::identity_block(3, [2, 3], 4)),
        [2, 3, 3, 4]
    ),
    case!(
        "remat of conv, relu, dropout, dense",
        Remat::new(serial![
            Conv::same(3, (3, 3)),
            Relu,
            Dropout::new(0.7),
            Flatten,
            Dense(4)
        ]),
        [2, 4, 3, 2]
    ),
    case!(
        "a remat span of two resnet identity blocks saving their convs",
        serial![
            Remat::new(models::identity_block(3, [2, 3], 4))
                .spanning(2)
                .saving(&["conv"]),
            models::identity_block(3, [3, 2], 4)
        ],
        [2, 3, 3, 4]
    ),
];

/// Dimension numbers `(lhs, rhs, lhs)`.
fn dims(lhs: &str, rhs: &str) -> ConvDims {
    ConvDims::parse(lhs, rhs, lhs).unwrap()
}

fn shape(case: &Case) -> Shape {
    Shape::new(case.input)
}

#[test]
fn shapes_agree_in_both_modes() {
    let be = cpu();
    for (i, case) in LAYERS.iter().enumerate() {
        let layer = (case.layer)();
        let (out, params) = init(&*layer, &shape(case), &be, i as u64);
        for train in [true, false] {
            let data = Rng::new(i as u64).vec(shape(case).numel(), -1.0, 1.0);
            let x = Tensor::from_slice(&be, &data, shape(case), Category::Input).unwrap();
            let mut sink = Collect::new();
            let mut cx = if train {
                Cx::train(&be, &mut sink).with_rng(stax::Rng::new(i as u64))
            } else {
                Cx::eval(&be)
            };
            let (y, _) = layer.apply(&params, Tree::leaf(x), &mut cx).unwrap();
            assert_eq!(
                y.map(|t| t.shape().clone()),
                out,
                "{}: train {train}",
                case.name
            );
        }
    }
}

#[test]
fn backward_passes_match_finite_differences() {
    for (i, case) in LAYERS.iter().enumerate() {
        finite_differences(&*(case.layer)(), &shape(case), 11 + i as u64);
    }
}

#[test]
fn every_layer_rematerialized_gives_the_same_bits() {
    for (i, case) in LAYERS.iter().enumerate() {
        remat_is_the_same_bits(case.layer, &shape(case), 61 + i as u64);
    }
}

#[test]
fn gpu_matches_cpu_on_every_layer() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    for (i, case) in LAYERS.iter().enumerate() {
        gpu_matches_cpu(&*(case.layer)(), &shape(case), 101 + i as u64, &gpu, 2e-5);
    }
}

/// The layer with a head that makes it a two-class model.
fn model(case: &Case) -> Serial {
    Serial(vec![(case.layer)(), Box::new(Flatten), Box::new(Dense(2))])
}

/// Two training steps of the case's model: each step's peak and bytes per category at the
/// peak equal the plan's, and live bytes after it the plan's persistent bytes.
fn plan_equals_measured(case: &Case, be: &Arc<dyn Backend>, seed: u64) {
    let input = shape(case);
    let mut trainer = Trainer::new(model(case), input.clone(), Adam::new(1e-3), be, seed).unwrap();
    let plan = trainer.plan(input.dims()[0]).unwrap();
    assert!(
        plan.exact,
        "{}: the plan is exact once calibrated",
        case.name
    );
    let mut rng = Rng::new(seed);
    let n = input.dims()[0];
    for _ in 0..2 {
        let x = Tensor::from_slice(
            be,
            &rng.vec(input.numel(), -1.0, 1.0),
            input.clone(),
            Category::Input,
        )
        .unwrap();
        let labels: Vec<f32> = (0..n * 2)
            .map(|i| ((i % 2) == (i / 2) % 2) as u8 as f32)
            .collect();
        let y = Tensor::from_slice(be, &labels, [n, 2], Category::Input).unwrap();
        let r = trainer.step(&x, &y).unwrap();
        assert_eq!(r.memory.peak, plan.peak.bytes, "{}: peak", case.name);
        for c in Category::ALL {
            assert_eq!(
                r.memory.at_peak(c),
                plan.peak.by_category[c.index()],
                "{}: {c}",
                case.name
            );
        }
        assert_eq!(
            r.memory.live,
            plan.persistent_bytes(),
            "{}: live",
            case.name
        );
    }
}

#[test]
fn plans_equal_measured_on_the_cpu() {
    let be = cpu();
    for (i, case) in LAYERS.iter().enumerate() {
        plan_equals_measured(case, &be, 31 + i as u64);
    }
}

#[test]
fn plans_equal_measured_on_the_gpu() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Tf32)) else {
        return;
    };
    for (i, case) in LAYERS.iter().enumerate() {
        plan_equals_measured(case, &gpu, 31 + i as u64);
    }
}
