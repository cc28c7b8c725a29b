//! Dynamic loss scaling and optax's `mu_dtype` on CUDA against the CPU backend: the finiteness
//! check (`ops::all_finite`, every float dtype) and Adam with a bf16 / f16 first moment and an
//! unscaling `grad_scale` equal the CPU's; an f16 MLP trained with jmp's dynamic loss scale
//! follows the CPU's losses with every peak equal to its plan, and skips the same forced
//! overflow (parameters and moments bit for bit unchanged, the scale halved) as the CPU does.
//! Skipped with a notice without a GPU.

mod common;

use common::*;
use stax::layers::{Mixed, Policy};
use stax::models::mlp;
use stax::tensor::ops;
use stax::train::data::{Loader, fashion_mnist_2class};
use stax::train::{DynamicLossScale, Trainer};
use stax::{Adam, Backend, Category, DType, Precision, Shape, Tensor};
use std::sync::Arc;

/// `data` rounded to `dtype`, as a tensor of that dtype on `be`.
fn typed(be: &Arc<dyn Backend>, data: &[f32], dtype: DType) -> Tensor {
    let wide = Tensor::from_slice(be, data, [data.len()], Category::Other).unwrap();
    let mut t = Tensor::empty(be, [data.len()], dtype, Category::Other).unwrap();
    ops::cast(&wide, &mut t).unwrap();
    t
}

/// `t`'s values widened to f32.
fn wide(t: &Tensor) -> Vec<f32> {
    let mut w = Tensor::empty(t.backend(), t.shape().clone(), DType::F32, Category::Other).unwrap();
    ops::cast(t, &mut w).unwrap();
    w.to_vec().unwrap()
}

#[test]
fn all_finite_and_adam_with_a_low_precision_mu_match_the_cpu() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    let cpu = cpu();
    let n = 10_007;
    let mut rng = Rng::new(seed_for("loss_scale", &[n]));
    let g = rng.vec(n, -1.0, 1.0);
    for dtype in DType::FLOATS {
        for bad in [
            None,
            Some(f32::INFINITY),
            Some(f32::NAN),
            Some(-f32::INFINITY),
        ] {
            let mut x = g.clone();
            if let Some(v) = bad {
                x[n - 3] = v;
            }
            let flag = |be: &Arc<dyn Backend>| {
                let mut f = Tensor::empty(be, [1], DType::U32, Category::Other).unwrap();
                ops::fill(&mut f, 0.0).unwrap();
                ops::all_finite(&typed(be, &x, dtype), &mut f).unwrap();
                f.to_vec_u32().unwrap()[0]
            };
            let want = u32::from(bad.is_some());
            assert_eq!((flag(&gpu), flag(&cpu)), (want, want), "{dtype} {bad:?}");
        }
    }
    let h = stax::tensor::AdamHyper {
        grad_scale: 1.0 / 1024.0,
        ..Adam::new(1e-3).hyper(3)
    };
    let (p, m, v) = (
        rng.vec(n, -1.0, 1.0),
        rng.vec(n, -0.1, 0.1),
        rng.vec(n, 0.0, 0.1),
    );
    for (g_dtype, m_dtype) in [
        (DType::F16, DType::BF16),
        (DType::F16, DType::F16),
        (DType::F32, DType::BF16),
        (DType::BF16, DType::F32),
    ] {
        let run = |be: &Arc<dyn Backend>| {
            let f = |d: &[f32]| Tensor::from_slice(be, d, [n], Category::Other).unwrap();
            let (mut pt, mut vt) = (f(&p), f(&v));
            let mut mt = typed(be, &m, m_dtype);
            let scaled: Vec<f32> = g.iter().map(|x| x * 1024.0).collect();
            ops::adam(&mut pt, &typed(be, &scaled, g_dtype), &mut mt, &mut vt, &h).unwrap();
            [pt.to_vec().unwrap(), wide(&mt), vt.to_vec().unwrap()]
        };
        let (on_gpu, on_cpu) = (run(&gpu), run(&cpu));
        for (i, what) in ["p", "mu", "nu"].iter().enumerate() {
            // the same explicitly rounded f32 operations on both, one rounding of mu
            assert_close(
                &on_gpu[i],
                &on_cpu[i],
                1e-6,
                1e-9,
                &format!("adam g {g_dtype} mu {m_dtype}: {what}"),
            );
        }
    }
}

/// Every parameter and both moments of a trainer, widened to f32.
fn state<L: stax::Layer>(t: &Trainer<L>) -> Vec<f32> {
    let mut all: Vec<&Tensor> = t.params().leaves();
    all.extend(t.state().field("mu"));
    all.extend(t.state().field("nu"));
    all.into_iter().flat_map(wide).collect()
}

#[test]
fn f16_loss_scaling_trains_on_the_gpu_as_on_the_cpu_and_skips_the_same_overflow() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    let (train, _) = fashion_mnist_2class().unwrap();
    let input = Shape::new([50, 784]);
    let loader = Loader::new(train.len(), 50, 5).unwrap();
    let mut runs = Vec::new();
    for be in [cpu(), gpu] {
        let model = Mixed::new(mlp(&[64], 2), Policy::F16);
        let mut t = Trainer::new(model, input.clone(), Adam::new(1e-3), &be, 5).unwrap();
        let plan = t.plan(50).unwrap();
        let mut seen = Vec::new();
        for (i, indices) in loader.batches(0).take(6).enumerate() {
            if i == 3 {
                // dlogits times 2^24 overflow f16 in the backward pass
                t.set_loss_scale(Some(DynamicLossScale::new(2f32.powi(24))))
                    .unwrap();
            }
            let before = state(&t);
            let (x, y) = t.place_batch(&train, &indices).unwrap();
            let r = t.step(&x, &y).unwrap();
            assert_eq!(
                r.memory.peak,
                plan.peak.bytes,
                "{}: step {}",
                be.device(),
                r.step
            );
            let s = r.loss_scale.unwrap();
            if i == 3 {
                assert!(s.skipped, "{}: {s:?}", be.device());
                assert_eq!(s.next_scale, 2f32.powi(23));
                let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
                assert_eq!(bits(state(&t)), bits(before), "{}", be.device());
            }
            seen.push((r.loss, s.skipped, s.next_scale));
        }
        runs.push(seen);
    }
    let flags = |r: &[(f32, bool, f32)]| r.iter().map(|s| (s.1, s.2)).collect::<Vec<_>>();
    assert_eq!(flags(&runs[1]), flags(&runs[0]));
    let losses = |r: &[(f32, bool, f32)]| r.iter().map(|s| s.0).collect::<Vec<_>>();
    assert_close(
        &losses(&runs[1]),
        &losses(&runs[0]),
        2e-2,
        1e-3,
        "f16 MLP losses, GPU vs CPU",
    );
}
