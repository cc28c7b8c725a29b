//! Mixed precision on CUDA against the CPU backend, on fresh seeded random inputs with poisoned
//! outputs: casts between every pair of float dtypes (bit for bit), bf16 and f16 GEMMs
//! (cuBLAS `cublasGemmEx`, f32 compute) within the dtype's rounding, Adam on f32 master weights
//! from bf16 and f16 gradients, a bf16 MLP's steps on the GPU equal to the CPU's with every
//! peak equal to its plan, and the typed error of a bf16 convolution (not written on CUDA yet).
//! Skipped with a notice without a GPU.

mod common;

use common::*;
use stax::layers::{Mixed, Policy};
use stax::models::mlp;
use stax::tensor::ops::{self, Epilogue};
use stax::tensor::{AdamHyper, Conv2dGeometry, Padding};
use stax::train::Trainer;
use stax::train::plan::MemoryPlan;
use stax::{Adam, Backend, Category, DType, Precision, Shape, Tensor, TensorError};
use std::sync::Arc;

/// `data` rounded to `dtype` on `be` (through the CPU's cast: the oracle's rounding).
fn typed(be: &Arc<dyn Backend>, data: &[f32], shape: &[usize], dtype: DType) -> Tensor {
    let host = cpu();
    let wide = Tensor::from_slice(&host, data, shape.to_vec(), Category::Other).unwrap();
    let mut t = Tensor::empty(&host, shape.to_vec(), dtype, Category::Other).unwrap();
    ops::cast(&wide, &mut t).unwrap();
    t.to(be).unwrap()
}

const FLOATS: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

#[test]
fn casts_equal_the_cpu_bit_for_bit() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    let cpu = cpu();
    let mut rng = Rng::new(seed_for("casts", &[4099]));
    let mut data = rng.vec(4099, -70000.0, 70000.0);
    // (NaN payloads are not compared: PTX's f16 conversion makes the canonical NaN)
    data[..3].copy_from_slice(&[f32::INFINITY, 1e-30, -0.0]);
    for from in FLOATS {
        for to in FLOATS {
            let (g_src, c_src) = (
                typed(&gpu, &data, &[4099], from),
                typed(&cpu, &data, &[4099], from),
            );
            let mut g = poisoned(&gpu, [4099], to);
            let mut c = poisoned(&cpu, [4099], to);
            ops::cast(&g_src, &mut g).unwrap();
            ops::cast(&c_src, &mut c).unwrap();
            let bits = |t: &Tensor| -> Vec<u8> {
                let mut b = vec![0u8; t.bytes()];
                ops::download(t, &mut b).unwrap();
                b
            };
            assert_eq!(bits(&g), bits(&c), "cast {from} -> {to}");
        }
    }
}

#[test]
fn low_precision_gemms_match_the_cpu() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    let cpu = cpu();
    for dtype in [DType::BF16, DType::F16] {
        for (m, k, n, ta, tb) in [
            (100, 784, 64, false, false),
            (784, 100, 64, true, false),
            (100, 64, 784, false, true),
            (3, 5, 7, true, true),
        ] {
            let mut rng = Rng::new(seed_for("gemm", &[m, k, n]));
            let (a, b) = (rng.vec(m * k, -1.0, 1.0), rng.vec(k * n, -1.0, 1.0));
            let a_shape = if ta { [k, m] } else { [m, k] };
            let b_shape = if tb { [n, k] } else { [k, n] };
            let run = |be: &Arc<dyn Backend>| {
                let (a, b) = (
                    typed(be, &a, &a_shape, dtype),
                    typed(be, &b, &b_shape, dtype),
                );
                let mut c = poisoned(be, [m, n], dtype);
                ops::matmul(&a, &b, ta, tb, &mut c).unwrap();
                c.to_vec().unwrap()
            };
            // both accumulate in f32 and round once; the sums' orders differ, so allow two
            // roundings of the dtype relative to the largest product sum
            let (g, c) = (run(&gpu), run(&cpu));
            let eps = if dtype == DType::BF16 {
                2f64.powi(-8)
            } else {
                2f64.powi(-11)
            };
            let scale = (k as f64).sqrt();
            assert_close(
                &g,
                &c,
                2.0 * eps,
                2.0 * eps * scale,
                &format!("{dtype} gemm {m}x{k}x{n} t{ta}{tb}"),
            );
        }
    }
}

#[test]
fn adam_from_low_precision_gradients_matches_the_cpu() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    let cpu = cpu();
    let h = AdamHyper {
        lr: 1e-3,
        b1: 0.9,
        b2: 0.999,
        eps: 1e-8,
        eps_root: 0.0,
        bias_correction1: 1.0 - 0.9f32.powi(3),
        bias_correction2: 1.0 - 0.999f32.powi(3),
        grad_scale: 1.0,
    };
    for dtype in [DType::BF16, DType::F16] {
        let n = 10_007;
        let mut rng = Rng::new(seed_for("adam", &[n]));
        let (p, g, m, v) = (
            rng.vec(n, -1.0, 1.0),
            rng.vec(n, -1.0, 1.0),
            rng.vec(n, -0.1, 0.1),
            rng.vec(n, 0.0, 0.1),
        );
        let run = |be: &Arc<dyn Backend>| {
            let f = |d: &[f32]| Tensor::from_slice(be, d, [n], Category::Other).unwrap();
            let (mut pt, mut mt, mut vt) = (f(&p), f(&m), f(&v));
            let gt = typed(be, &g, &[n], dtype);
            ops::adam(&mut pt, &gt, &mut mt, &mut vt, &h).unwrap();
            [
                pt.to_vec().unwrap(),
                mt.to_vec().unwrap(),
                vt.to_vec().unwrap(),
            ]
        };
        let (on_gpu, on_cpu) = (run(&gpu), run(&cpu));
        for (i, what) in ["p", "mu", "nu"].iter().enumerate() {
            // the same explicitly rounded f32 operations on both (the f32 kernel's contract)
            assert_close(
                &on_gpu[i],
                &on_cpu[i],
                1e-6,
                1e-9,
                &format!("{dtype} adam {what}"),
            );
        }
    }
}

/// A bf16 MLP (every op it needs has a CUDA kernel in every dtype): the GPU's losses follow the
/// CPU's, and every step's peak on the GPU equals its plan there, to the byte.
#[test]
fn bf16_mlp_trains_on_the_gpu_as_on_the_cpu_with_exact_memory() {
    // a backend of its own: the shared one's allocator also holds the other tests' buffers
    let Some(gpu) = private_gpu_or_skip() else {
        return;
    };
    let input = Shape::new([50, 784]);
    let model = || Mixed::new(mlp(&[64], 2), Policy::BF16);
    let mut losses = Vec::new();
    for be in [cpu(), gpu] {
        let plan = MemoryPlan::new(&model(), &input, &Adam::new(1e-3), &be).unwrap();
        let mut trainer = Trainer::new(model(), input.clone(), Adam::new(1e-3), &be, 5).unwrap();
        let mut run = Vec::new();
        for _ in 0..5 {
            let (x, y) = batch(&be, &input, 2);
            let r = trainer.step(&x, &y).unwrap();
            assert_eq!(
                r.memory.peak,
                plan.peak.bytes,
                "{}: step {} peak",
                be.device(),
                r.step
            );
            run.push(r.loss);
        }
        losses.push(run);
    }
    assert_close(
        &losses[1],
        &losses[0],
        2e-2,
        1e-3,
        "bf16 MLP losses, GPU vs CPU",
    );
    assert!(losses[1][4] < losses[1][0], "{:?}", losses[1]);
}

#[test]
fn a_bf16_convolution_on_cuda_is_a_typed_error() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Tf32)) else {
        return;
    };
    let g = Conv2dGeometry::new(
        &[1, 5, 5, 3].into(),
        &[3, 3, 3, 4].into(),
        (1, 1),
        Padding::Same,
    )
    .unwrap();
    let t = |s: Shape| Tensor::empty(&gpu, s, DType::BF16, Category::Other).unwrap();
    let (x, w) = (t(g.input_shape()), t(g.filter_shape()));
    let mut y = t(g.output_shape());
    let e = ops::conv2d(&x, &w, None, &g, &mut y, Epilogue::default()).unwrap_err();
    assert!(
        matches!(
            e,
            TensorError::UnsupportedDType {
                op: "conv2d",
                dtype: DType::BF16,
                ..
            }
        ),
        "{e}"
    );
}
