//! The CUDA ops of issue 10's layers against the CPU backend, on fresh seeded random inputs
//! with poisoned outputs, in every float dtype: the new activations (forward, mask, backward),
//! softmax and log-softmax over an axis, dropout (bit for bit: the mask is a function of the
//! key and the index on both), and the losses with integer labels (with their workspace
//! schedules). Skipped with a notice without a GPU.

mod common;

use common::*;
use stax_alloc::TraceOp;
use stax_tensor::dtype::{bf16, f16};
use stax_tensor::ops;
use stax_tensor::{
    Activation, Alpha, Backend, BackendOptions, Category, DType, IndexLoss, OpDesc, Precision,
    Saves, Shape, SoftmaxKind, Tensor, WorkspaceStep,
};
use std::sync::Arc;

/// `data` rounded to `dtype` on `be`.
fn typed(be: &Arc<dyn Backend>, data: &[f32], shape: impl Into<Shape>, dtype: DType) -> Tensor {
    match dtype {
        DType::BF16 => {
            let v: Vec<bf16> = data.iter().map(|&x| bf16::from_f32(x)).collect();
            Tensor::from_slice(be, &v, shape, Category::Other).unwrap()
        }
        DType::F16 => {
            let v: Vec<f16> = data.iter().map(|&x| f16::from_f32(x)).collect();
            Tensor::from_slice(be, &v, shape, Category::Other).unwrap()
        }
        _ => Tensor::from_slice(be, data, shape, Category::Other).unwrap(),
    }
}

/// `data` rounded to `dtype` on both backends: `(on_gpu, on_cpu)`.
fn pair(
    gpu: &Arc<dyn Backend>,
    cpu: &Arc<dyn Backend>,
    data: &[f32],
    shape: &[usize],
    dtype: DType,
) -> (Tensor, Tensor) {
    (
        typed(gpu, data, shape, dtype),
        typed(cpu, data, shape, dtype),
    )
}

/// GPU = CPU within `ulps` units in the last place of the dtype, for results computed in f32
/// (or f64) and rounded once (the two backends' f32 may round to either neighbour).
fn agree(g: &Tensor, c: &Tensor, ulps: f64, what: &str) {
    let (rtol, atol) = match c.dtype() {
        DType::BF16 => (8e-3, 1e-6),
        DType::F16 => (1e-3, 1e-6),
        _ => (2e-6, 1e-7),
    };
    let (g, c) = (g.to_vec().unwrap(), c.to_vec().unwrap());
    assert_close(&g, &c, ulps * rtol, ulps * atol, what);
}

const ACTIVATIONS: [Activation; 10] = [
    Activation::Exp,
    Activation::Softplus,
    Activation::Sigmoid,
    Activation::Elu(Alpha::new(1.0)),
    Activation::Elu(Alpha::new(0.5)),
    Activation::LeakyRelu(Alpha::new(0.01)),
    Activation::LeakyRelu(Alpha::new(-0.2)),
    Activation::Selu,
    Activation::Gelu,
    Activation::Tanh,
];

#[test]
fn activations_forward_mask_and_backward_match_cpu() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    let cpu = cpu();
    for act in ACTIVATIONS {
        for dtype in DType::FLOATS {
            for n in [1, 33, 1000, 100_003] {
                let what = format!("{act:?} {dtype} [{n}]");
                let mut rng = Rng::new(seed_for(&what, &[n]));
                let mut x = rng.vec(n, -4.0, 4.0);
                x[0] = 0.0; // the leaky ReLU's mask bit at 0
                let (mut yg, mut yc) = pair(&gpu, &cpu, &x, &[n], dtype);
                let (xg, xc) = pair(&gpu, &cpu, &x, &[n], dtype);
                let words = n.div_ceil(32);
                let mask = act.saves() == Saves::Mask;
                let (mut mg, mut mc) = (
                    poisoned(&gpu, [words], DType::U32),
                    poisoned(&cpu, [words], DType::U32),
                );
                ops::unary(act, &mut yg, mask.then_some(&mut mg)).unwrap();
                ops::unary(act, &mut yc, mask.then_some(&mut mc)).unwrap();
                agree(&yg, &yc, 1.0, &what);
                if mask {
                    assert_eq!(
                        mg.to_vec_u32().unwrap(),
                        mc.to_vec_u32().unwrap(),
                        "{what} mask"
                    );
                }
                // both backward passes read the CPU's saved values (an output rounded to a
                // half dtype one way or the other would make e.g. ELU's `y + alpha` differ)
                let (sg, sc) = match act.saves() {
                    Saves::Mask => (mc.to(&gpu).unwrap(), mc),
                    Saves::Output => (yc.to(&gpu).unwrap(), yc),
                    Saves::Input => (xg, xc),
                };
                let (mut dg, mut dc) = pair(&gpu, &cpu, &rng.vec(n, -1.0, 1.0), &[n], dtype);
                ops::unary_bwd(act, &sg, &mut dg).unwrap();
                ops::unary_bwd(act, &sc, &mut dc).unwrap();
                agree(&dg, &dc, 4.0, &format!("{what} bwd"));
            }
        }
    }
}

#[test]
fn softmax_and_log_softmax_over_an_axis_match_cpu() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    let cpu = cpu();
    let cases: [(&[usize], usize); 7] = [
        (&[4, 1000], 1),
        (&[3, 5, 7], 1),
        (&[2, 3, 33], 2),
        (&[1, 1], 1),
        (&[6, 2], 0),
        (&[70, 3], 0),
        (&[513, 10], 1),
    ];
    for kind in [SoftmaxKind::Softmax, SoftmaxKind::LogSoftmax] {
        for dtype in DType::FLOATS {
            for (shape, axis) in cases {
                let what = format!("{} {dtype} {shape:?} axis {axis}", kind.name());
                let n: usize = shape.iter().product();
                let mut rng = Rng::new(seed_for(&what, shape));
                let (mut yg, mut yc) = pair(&gpu, &cpu, &rng.vec(n, -6.0, 6.0), shape, dtype);
                ops::softmax(kind, axis, &mut yg).unwrap();
                ops::softmax(kind, axis, &mut yc).unwrap();
                agree(&yg, &yc, 1.0, &what);
                let (mut dg, mut dc) = pair(&gpu, &cpu, &rng.vec(n, -1.0, 1.0), shape, dtype);
                ops::softmax_bwd(kind, axis, &yc.to(&gpu).unwrap(), &mut dg).unwrap();
                ops::softmax_bwd(kind, axis, &yc, &mut dc).unwrap();
                agree(&dg, &dc, 4.0, &format!("{what} bwd"));
            }
        }
    }
}

#[test]
fn dropout_matches_cpu_bit_for_bit() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    let cpu = cpu();
    for dtype in DType::FLOATS {
        for n in [1, 31, 32, 33, 1000, 100_003, 1 << 20] {
            for rate in [0.1, 0.5, 0.8, 1.0] {
                let what = format!("dropout({rate}) {dtype} [{n}]");
                let mut rng = Rng::new(seed_for(&what, &[n]));
                let key = rng.next_u64();
                let (mut yg, mut yc) = pair(&gpu, &cpu, &rng.vec(n, -1.0, 1.0), &[n], dtype);
                let words = n.div_ceil(32);
                let mut mg = poisoned(&gpu, [words], DType::U32);
                let mut mc = poisoned(&cpu, [words], DType::U32);
                ops::dropout(rate, key, &mut yg, &mut mg).unwrap();
                ops::dropout(rate, key, &mut yc, &mut mc).unwrap();
                assert_eq!(
                    mg.to_vec_u32().unwrap(),
                    mc.to_vec_u32().unwrap(),
                    "{what} mask"
                );
                agree(&yg, &yc, 0.0, &what);
                let (mut dg, mut dc) = pair(&gpu, &cpu, &rng.vec(n, -1.0, 1.0), &[n], dtype);
                ops::dropout_bwd(rate, &mg, &mut dg).unwrap();
                ops::dropout_bwd(rate, &mc, &mut dc).unwrap();
                agree(&dg, &dc, 0.0, &format!("{what} bwd"));
            }
        }
    }
}

/// `labels` as a u32 tensor on `be`.
fn labels(be: &Arc<dyn Backend>, v: &[u32]) -> Tensor {
    let mut t = Tensor::empty(be, [v.len()], DType::U32, Category::Input).unwrap();
    ops::upload(bytemuck::cast_slice(v), &mut t).unwrap();
    t
}

#[test]
fn index_losses_match_cpu() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    let cpu = cpu();
    for loss in [IndexLoss::SoftmaxCrossEntropy, IndexLoss::NegLogLikelihood] {
        for (n, k) in [(1, 1), (3, 5), (64, 1000), (7, 33), (513, 2)] {
            let what = format!("{loss:?} [{n}, {k}]");
            let mut rng = Rng::new(seed_for(&what, &[n, k]));
            let z = rng.vec(n * k, -8.0, 8.0);
            let y: Vec<u32> = (0..n).map(|_| rng.below(k) as u32).collect();
            let (zg, zc) = on_both(&gpu, &cpu, &z, [n, k]);
            let (yg, yc) = (labels(&gpu, &y), labels(&cpu, &y));
            let mut dg = poisoned(&gpu, [n, k], DType::F32);
            let mut dc = poisoned(&cpu, [n, k], DType::F32);
            let lg = ops::index_loss(loss, &zg, &yg, &mut dg).unwrap();
            let lc = ops::index_loss(loss, &zc, &yc, &mut dc).unwrap();
            assert_close(&[lg], &[lc], 1e-6, 1e-7, &format!("{what} loss"));
            agree(&dg, &dc, 1.0, &format!("{what} dlogits"));
            // a label out of range: the same typed error on both, naming row and label
            let mut bad = y.clone();
            bad[n - 1] = k as u32 + 2;
            let eg = ops::index_loss(loss, &zg, &labels(&gpu, &bad), &mut dg).unwrap_err();
            let ec = ops::index_loss(loss, &zc, &labels(&cpu, &bad), &mut dc).unwrap_err();
            assert_eq!(eg.to_string(), ec.to_string(), "{what}");
            assert!(
                eg.to_string()
                    .contains(&format!("label {} of row {}", k + 2, n - 1))
            );
        }
    }
}

/// The index loss allocates exactly its schedule (one buffer: row losses, the mean, the bad
/// row), recorded by the allocator's trace of a backend of its own.
#[test]
fn index_loss_workspace_is_its_schedule() {
    let options = BackendOptions {
        workspace_limit: Some(stax_tensor::cuda::DEFAULT_WORKSPACE_LIMIT), // not shared
        ..with_precision(Precision::Highest)
    };
    let Some(gpu) = cuda_or_skip(&options) else {
        return;
    };
    let (n, k) = (100, 10);
    let mut rng = Rng::new(seed_for("index_loss workspace", &[n, k]));
    let (z, _) = random_tensor(&gpu, [n, k], &mut rng);
    let y = labels(&gpu, &vec![3; n]);
    let mut d = poisoned(&gpu, [n, k], DType::F32);
    let op = OpDesc::IndexLoss {
        loss: IndexLoss::SoftmaxCrossEntropy,
        rows: n,
        classes: k,
    };
    gpu.synchronize().unwrap();
    gpu.allocator().start_trace();
    ops::index_loss(IndexLoss::SoftmaxCrossEntropy, &z, &y, &mut d).unwrap();
    let trace = gpu.allocator().stop_trace();
    let bytes: Vec<(TraceOp, u64)> = trace
        .events
        .iter()
        .filter(|e| e.category == Category::Workspace)
        .map(|e| (e.op, e.bytes))
        .collect();
    let want = (n * 8).next_multiple_of(256) as u64 + 16;
    assert_eq!(bytes, [(TraceOp::Alloc, want), (TraceOp::Free, want)]);
    let schedule = gpu.workspace_schedule(&op).unwrap();
    assert_eq!(WorkspaceStep::peak(&schedule) as u64, want);
}
