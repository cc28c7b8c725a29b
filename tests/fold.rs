//! A `BatchNorm::folded` after a pointwise conv (`stax_tensor::ops::batch_norm_fold`): the
//! pair's forward pass is the unfolded one's bit for bit, its gradients (input, conv weight
//! and bias, scale and shift) the unfolded ones' to f32 rounding on fresh random inputs, with
//! and without scale and shift, and its input gradient against central differences; a
//! norm that cannot fold (a ReLU fused after it, a strided conv) runs as before. The
//! ResNet with `BnSpans::Fold` trains as the plain one, keeps every step at its plan, and
//! plans ResNet-50 below `ToEnd` by the stride-1 shortcut's conv output. On the GPU each
//! matches the CPU. `matmul_add` adds to its output; `batch_norm_fold` refuses bad shapes.

mod common;

use std::sync::Arc;

use common::checkpoint::state_bits;
use common::{Rng, assert_rel_close, cpu, host_values, private_gpu_with, two_steps_match_cpu};
use stax::layers::Value;
use stax::models::{BnSpans, ResNet};
use stax::train::Trainer;
use stax::train::plan::MemoryPlan;
use stax::{
    Adam, Backend, BatchNorm, Category, Conv, Layer, Padding, ParamSource, Params, Precision, Relu,
    Remat, Serial, Shape, Tensor, Tree, init_params, serial,
};
use stax_tensor::ops::{self, FoldInputs, FoldOutputs};

/// `Conv(c, 1x1) norm`, with or without a ReLU after.
fn pair(c: usize, norm: BatchNorm, relu: bool, stride: usize) -> Serial {
    let conv = Conv::new(c, (1, 1), (stride, stride), Padding::Valid);
    match relu {
        true => serial![conv, norm, Relu],
        false => serial![conv, norm],
    }
}

fn random(be: &Arc<dyn Backend>, shape: &Shape, rng: &mut Rng) -> Tensor {
    let v: Vec<f32> = (0..shape.numel()).map(|_| rng.uniform(-1.0, 2.0)).collect();
    Tensor::from_slice(be, &v, shape.clone(), Category::Input).unwrap()
}

/// Output, input gradient and parameter gradients (as host vectors) of `model` on `be`, from
/// parameters and inputs drawn from `seed`, the output gradient random too.
fn grads(model: &Serial, input: &Shape, be: &Arc<dyn Backend>, seed: u64) -> [Vec<f32>; 3] {
    let mut rng = stax::Rng::new(seed);
    let shapes = Tree::leaf(input.clone());
    let (_, params): (_, Params) =
        init_params(model, &shapes, be, ParamSource::Random(&mut rng)).unwrap();
    let mut r = Rng::new(seed);
    let x = Tree::leaf(random(be, input, &mut r));
    let dy = |y: &Value| Tree::leaf(random(be, y.leaves()[0].shape(), &mut r.clone()));
    let (y, dx, g) = common::vjp(model, &params, x, dy);
    [
        host_values(y.leaves()),
        host_values(dx.leaves()),
        host_values(g.leaves()),
    ]
}

fn assert_matches(a: &[Vec<f32>; 3], b: &[Vec<f32>; 3], tol: f64, what: &str) {
    assert_eq!(a[0], b[0], "{what}: outputs");
    assert_rel_close(&a[1], &b[1], tol, &format!("{what}: input gradient"));
    assert_rel_close(&a[2], &b[2], tol, &format!("{what}: parameter gradients"));
}

/// The shapes and norms of the pair tests: (input, out channels, norm).
fn cases() -> Vec<(Shape, usize, BatchNorm)> {
    vec![
        (Shape::new([4, 5, 5, 3]), 6, BatchNorm::new()),
        (Shape::new([2, 7, 3, 16]), 64, BatchNorm::new()),
        (
            Shape::new([3, 4, 4, 5]),
            9,
            BatchNorm::new().with(1e-3, false, true),
        ),
        (
            Shape::new([3, 4, 4, 5]),
            9,
            BatchNorm::new().with(1e-5, true, false),
        ),
        (Shape::new([3, 1, 2, 4]), 3, BatchNorm::new()),
    ]
}

#[test]
fn a_folded_norm_gives_the_unfolded_gradients() {
    let be = cpu();
    for (seed, (input, c, norm)) in cases().into_iter().enumerate() {
        let plain = grads(&pair(c, norm.clone(), false, 1), &input, &be, seed as u64);
        let folded = grads(
            &pair(c, norm.clone().folded(), false, 1),
            &input,
            &be,
            seed as u64,
        );
        assert_matches(&plain, &folded, 1e-4, &format!("{input} -> {c}, {norm:?}"));
        // another computation: the gradients are not the unfolded bits
        assert_ne!(plain[2], folded[2], "{input} -> {c}: not folded");
    }
}

/// The folded pair's input gradient against central differences of `sum(y · dy)` (f32, a
/// small pair whose batch statistics move with every input).
#[test]
fn a_folded_pairs_input_gradient_is_the_finite_difference() {
    let be = cpu();
    let (input, model) = (
        Shape::new([2, 2, 2, 3]),
        pair(4, BatchNorm::new().folded(), false, 1),
    );
    let mut rng = stax::Rng::new(3);
    let (_, params) = init_params(
        &model,
        &Tree::leaf(input.clone()),
        &be,
        ParamSource::Random(&mut rng),
    )
    .unwrap();
    let mut r = Rng::new(4);
    let x: Vec<f32> = (0..input.numel()).map(|_| r.uniform(-1.0, 1.0)).collect();
    let dyv: Vec<f32> = (0..32).map(|_| r.uniform(-1.0, 1.0)).collect();
    let tensor =
        |v: &[f32], s: &Shape| Tensor::from_slice(&be, v, s.clone(), Category::Input).unwrap();
    let dy_of = |y: &Value| Tree::leaf(tensor(&dyv, y.leaves()[0].shape()));
    let (_, dx, _) = common::vjp(&model, &params, Tree::leaf(tensor(&x, &input)), dy_of);
    let dx = host_values(dx.leaves());
    let objective = |x: &[f32]| -> f64 {
        let y = common::apply_train(&model, &params, Tree::leaf(tensor(x, &input)));
        let y = host_values(y.leaves());
        y.iter()
            .zip(&dyv)
            .map(|(&a, &b)| f64::from(a) * f64::from(b))
            .sum()
    };
    let h = 1e-2f32;
    for i in 0..x.len() {
        let (mut up, mut down) = (x.clone(), x.clone());
        up[i] += h;
        down[i] -= h;
        let fd = (objective(&up) - objective(&down)) / (2.0 * f64::from(h));
        let got = f64::from(dx[i]);
        assert!(
            (fd - got).abs() <= 2e-2 * (1.0 + fd.abs()),
            "dx[{i}]: {got} against {fd}"
        );
    }
}

/// Where the pair cannot fold it runs unfolded: a ReLU fused after the norm, a strided conv.
#[test]
fn a_norm_that_cannot_fold_runs_as_before() {
    let be = cpu();
    let input = Shape::new([2, 6, 6, 4]);
    for (relu, stride) in [(true, 1), (false, 2)] {
        let plain = grads(&pair(5, BatchNorm::new(), relu, stride), &input, &be, 9);
        let folded = grads(
            &pair(5, BatchNorm::new().folded(), relu, stride),
            &input,
            &be,
            9,
        );
        assert_eq!(plain, folded, "relu {relu}, stride {stride}: bit for bit");
    }
}

fn shallow(spans: BnSpans) -> Serial {
    let net = ResNet {
        blocks: [1, 1, 1, 1],
        widths: [8, 16, 16, 16],
        classes: 2,
        remat_stages: 0,
        bn_spans: spans,
    };
    net.build((28, 28, 1)).unwrap()
}

#[test]
fn a_folded_resnet_trains_as_the_plain_one_with_exact_memory() {
    let be = cpu();
    let input = Shape::new([50, 28, 28, 1]);
    // common::train checks every step's peak and live bytes against the plan
    let (accuracy, losses) = common::train(shallow(BnSpans::Fold), input.clone(), &be, 4);
    let (_, plain) = common::train(shallow(BnSpans::None), input, &be, 4);
    // each block's last norm folds, and the first block's stride-1 shortcut's
    let text = shallow(BnSpans::Fold).describe();
    assert_eq!(text.matches("folded)").count(), 5, "{text}");
    assert!(accuracy >= 0.95, "test accuracy {accuracy}");
    assert_rel_close(&losses[..1], &plain[..1], 1e-5, "the first epoch's loss");
}

/// ResNet-50's f32 CPU plan at batch 128, 224x224: folded below the spans to the blocks' ends
/// by at least the first block's stride-1 shortcut conv output (kept by `ToEnd`, f32), and
/// below 0.6x JAX's measured peak (issue 10's bar, BENCHMARKS.md).
#[test]
fn folding_lowers_resnet50s_planned_peak() {
    let be = cpu();
    let input = Shape::new([128, 224, 224, 3]);
    let peak = |bn_spans| {
        let net = ResNet {
            bn_spans,
            ..ResNet::resnet50(1000)
        };
        let model = net.build((224, 224, 3)).unwrap();
        MemoryPlan::new(&model, &input, &Adam::new(1e-3), &be)
            .unwrap()
            .peak
            .bytes
    };
    let (ends, fold) = (peak(BnSpans::ToEnd), peak(BnSpans::Fold));
    let shortcut: u64 = 128 * 56 * 56 * 256 * 4;
    assert!(fold + shortcut <= ends, "{fold} + {shortcut} > {ends}");
    assert!(fold <= 11_276_138_752 * 6 / 10, "{fold}");
}

/// A checkpoint of the model with or without folding loads into the other (folding changes
/// no parameter).
#[test]
fn a_checkpoint_resumes_with_or_without_fold() {
    let dir = common::checkpoint::scratch("fold");
    let (be, input) = (cpu(), Shape::new([4, 28, 28, 1]));
    let adam = Adam::new(1e-3);
    for (saved, loaded) in [
        (BnSpans::ToEnd, BnSpans::Fold),
        (BnSpans::Fold, BnSpans::None),
    ] {
        let t = Trainer::new(shallow(saved), input.clone(), adam, &be, 3).unwrap();
        let path = dir.join(format!("fold-{saved:?}.npz"));
        t.save(&path, None).unwrap();
        let (back, _) = Trainer::load(shallow(loaded), input.clone(), adam, &be, &path).unwrap();
        assert!(state_bits(&t) == state_bits(&back), "saved {saved:?}");
    }
}

/// A span saving convs saves a folded pair's conv output too, as it would unfolded: the
/// gradients are the unfolded span's.
#[test]
fn a_span_saving_convs_saves_a_folded_pairs_conv() {
    let be = cpu();
    let input = Shape::new([2, 4, 4, 3]);
    let model = |norm: BatchNorm| {
        let conv = Conv::new(5, (1, 1), (1, 1), Padding::Valid);
        let span = Remat::new(conv).spanning(2).saving(&["conv"]);
        serial![Relu, span, norm]
    };
    let plain = grads(&model(BatchNorm::new()), &input, &be, 4);
    let folded = grads(&model(BatchNorm::new().folded()), &input, &be, 4);
    assert_matches(&plain, &folded, 1e-4, "a span saving convs");
}

#[test]
fn matmul_add_adds_the_product() {
    let be = cpu();
    let mut r = Rng::new(1);
    let (a, b) = (
        random(&be, &Shape::new([5, 3]), &mut r),
        random(&be, &Shape::new([4, 3]), &mut r),
    );
    let mut c = random(&be, &Shape::new([5, 4]), &mut r);
    let before = c.to_vec().unwrap();
    ops::matmul_add(&a, &b, false, true, &mut c).unwrap();
    let (av, bv, got) = (
        a.to_vec().unwrap(),
        b.to_vec().unwrap(),
        c.to_vec().unwrap(),
    );
    for i in 0..5 {
        for j in 0..4 {
            let dot: f32 = (0..3).map(|p| av[i * 3 + p] * bv[j * 3 + p]).sum();
            let want = before[i * 4 + j] + dot;
            assert!((got[i * 4 + j] - want).abs() <= 1e-5, "[{i}, {j}]");
        }
    }
}

#[test]
fn batch_norm_fold_refuses_bad_shapes() {
    let be = cpu();
    let t = |s: &[usize]| Tensor::zeros(&be, s.to_vec(), Category::Other).unwrap();
    let (w, gt, c3, k2) = (t(&[2, 3]), t(&[2, 3]), t(&[3]), t(&[2]));
    let bad = t(&[4]);
    let inputs = |mean| FoldInputs {
        w: &w,
        b0: &c3,
        gamma: None,
        mean,
        rstd: &c3,
        gt: &gt,
        sh: &k2,
        sd: &c3,
        count: 4,
    };
    let (mut dw, mut wa, mut wc) = (t(&[2, 3]), t(&[2, 3]), t(&[2, 3]));
    let (mut bp, mut db) = (t(&[3]), t(&[3]));
    let outputs = FoldOutputs {
        dw: &mut dw,
        db0: &mut db,
        w_a: &mut wa,
        w_c: &mut wc,
        bp: &mut bp,
        dgamma: None,
        dbeta: None,
    };
    let e = ops::batch_norm_fold(inputs(&bad), outputs);
    assert!(matches!(e, Err(stax::TensorError::Shape { .. })), "{e:?}");
}

#[test]
fn a_folded_pair_and_resnet_match_the_cpu_on_the_gpu() {
    let Some(gpu) = private_gpu_with(Precision::Highest) else {
        return;
    };
    let be = cpu();
    for (seed, (input, c, norm)) in cases().into_iter().enumerate() {
        let model = pair(c, norm.folded(), false, 1);
        let seed = 100 + seed as u64;
        let (on_gpu, on_cpu) = (
            grads(&model, &input, &gpu, seed),
            grads(&model, &input, &be, seed),
        );
        for i in 0..3 {
            assert_rel_close(
                &on_gpu[i],
                &on_cpu[i],
                1e-4,
                &format!("{input} -> {c}: {i}"),
            );
        }
    }
    two_steps_match_cpu(
        || shallow(BnSpans::Fold),
        &Shape::new([50, 28, 28, 1]),
        &gpu,
        1e-3,
    );
}
