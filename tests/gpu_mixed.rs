//! Mixed precision on CUDA against the CPU backend, on fresh seeded random inputs with poisoned
//! outputs: casts between every pair of float dtypes (bit for bit), the ReLU and bias kernels
//! (bit for bit), bf16 and f16 GEMMs
//! (cuBLAS `cublasGemmEx`, f32 compute) within the dtype's rounding, Adam on f32 master weights
//! from bf16 and f16 gradients, a bf16 MLP's steps on the GPU equal to the CPU's with every
//! peak equal to its plan; bf16 and f16 convolutions (cuDNN, f32 compute) in NHWC and NCHW
//! with strides, asymmetric padding and every kernel copy, and poolings, each pass equal to the
//! CPU's within the dtype's rounding, their workspace schedules exact, and the seed model
//! training in bf16 on the GPU as on the CPU with every peak equal to its plan. Skipped with a
//! notice without a GPU.

mod common;

use common::*;
use stax::layers::{Mixed, Policy};
use stax::models::mlp;
use stax::tensor::BackendOptions;
use stax::tensor::cuda::{ConvApis, DEFAULT_WORKSPACE_LIMIT};
use stax::tensor::ops::{self, Epilogue};
use stax::tensor::{
    Activation, AdamHyper, BinaryOp, Conv2dGeometry, ConvPass, ConvSpec, FilterLayout, Layout,
    OpDesc, Padding, PoolKind,
};
use stax::train::Trainer;
use stax::train::plan::MemoryPlan;
use stax::{Adam, Backend, Category, DType, Precision, Shape, Tensor};
use std::sync::Arc;

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

/// The ReLU (in place, with and without its mask, and the read-only mask pass of an output
/// that is ReLU'd already), its backward from the mask, the bias add and the bias gradient in
/// bf16 and f16 equal the CPU's bit for bit (the bias gradient to its one rounding), on sizes
/// with whole 8-element vector groups and with tails (the vectorized kernels' edges).
#[test]
fn relu_and_bias_kernels_match_the_cpu_in_low_precision() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    let cpu = cpu();
    for dtype in [DType::BF16, DType::F16] {
        for n in [1, 33, 255, 256, 257, 1000, 100_003] {
            let mut rng = Rng::new(seed_for("relu16", &[n]));
            let (x, dy) = (rng.vec(n, -1.0, 1.0), rng.vec(n, -1.0, 1.0));
            let run = |be: &Arc<dyn Backend>| {
                let mut y = typed(be, &x, &[n], dtype);
                let mut mask = poisoned(be, [n.div_ceil(32)], DType::U32);
                ops::unary(Activation::Relu, &mut y, Some(&mut mask)).unwrap();
                let mut d = typed(be, &dy, &[n], dtype);
                ops::unary_bwd(Activation::Relu, &mask, &mut d).unwrap();
                let mut plain = typed(be, &x, &[n], dtype);
                ops::unary(Activation::Relu, &mut plain, None).unwrap();
                let words = mask.to_vec_u32().unwrap();
                (
                    y.to_vec().unwrap(),
                    words,
                    d.to_vec().unwrap(),
                    plain.to_vec().unwrap(),
                )
            };
            let (g, c) = (run(&gpu), run(&cpu));
            assert_close(&g.0, &c.0, 0.0, 0.0, &format!("{dtype} relu [{n}]"));
            assert_eq!(g.1, c.1, "{dtype} relu mask [{n}]");
            assert_close(&g.2, &c.2, 0.0, 0.0, &format!("{dtype} relu_bwd [{n}]"));
            assert_close(
                &g.3,
                &c.3,
                0.0,
                0.0,
                &format!("{dtype} relu, no mask [{n}]"),
            );
        }
        for shape in [[3usize, 37], [100, 128], [513, 16], [2000, 64], [7, 8]] {
            let (rows, c) = (shape[0], shape[1]);
            let mut rng = Rng::new(seed_for("bias16", &shape));
            let (y, b) = (rng.vec(rows * c, -1.0, 1.0), rng.vec(c, -1.0, 1.0));
            let run = |be: &Arc<dyn Backend>| {
                let mut yt = typed(be, &y, &shape, dtype);
                ops::bias_add(&mut yt, &typed(be, &b, &[c], dtype)).unwrap();
                let mut db = poisoned(be, [c], dtype);
                ops::bias_grad(&yt, &mut db).unwrap();
                (yt.to_vec().unwrap(), db.to_vec().unwrap())
            };
            let (g, cp) = (run(&gpu), run(&cpu));
            assert_close(
                &g.0,
                &cp.0,
                0.0,
                0.0,
                &format!("{dtype} bias_add {shape:?}"),
            );
            let what = format!("{dtype} bias_grad {shape:?}");
            assert_close(&g.1, &cp.1, 2.0 * eps(dtype), 0.0, &what);
        }
    }
}

/// The binary ops (the residual add and its like) in every float dtype equal the CPU's bit
/// for bit, alone, with the ReLU fused (output and mask), and masked by a ReLU's saved mask
/// (`binary_masked`, which also equals `binary` then `unary_bwd` on each backend), on sizes
/// with whole vector groups (8 elements, 32 and 256 with a mask) and with tails.
#[test]
fn binary_ops_match_the_cpu_bit_for_bit() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    let cpu = cpu();
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for n in [1, 7, 8, 9, 32, 33, 255, 256, 257, 1000, 100_003] {
            let mut rng = Rng::new(seed_for("binary", &[n]));
            let (a, b) = (rng.vec(n, -2.0, 2.0), rng.vec(n, -2.0, 2.0));
            let s = rng.vec(n, -1.0, 1.0);
            for op in [BinaryOp::Add, BinaryOp::Mul] {
                let run = |be: &Arc<dyn Backend>| {
                    let bt = typed(be, &b, &[n], dtype);
                    let mut plain = typed(be, &a, &[n], dtype);
                    ops::binary(op, &mut plain, &bt).unwrap();
                    let mut fused = typed(be, &a, &[n], dtype);
                    let mut mask = poisoned(be, [n.div_ceil(32)], DType::U32);
                    ops::binary_relu(op, &mut fused, &bt, &mut mask).unwrap();
                    let m = mask.to_vec_u32().unwrap();
                    // a ReLU's mask of fresh values, then the sum masked by it, fused and not
                    let mut saved = poisoned(be, [n.div_ceil(32)], DType::U32);
                    let mut st = typed(be, &s, &[n], dtype);
                    ops::unary(Activation::Relu, &mut st, Some(&mut saved)).unwrap();
                    let mut masked = typed(be, &a, &[n], dtype);
                    ops::binary_masked(op, &mut masked, &bt, &saved).unwrap();
                    let mut apart = typed(be, &a, &[n], dtype);
                    ops::binary(op, &mut apart, &bt).unwrap();
                    ops::unary_bwd(Activation::Relu, &saved, &mut apart).unwrap();
                    let (masked, apart) = (masked.to_vec().unwrap(), apart.to_vec().unwrap());
                    (
                        plain.to_vec().unwrap(),
                        fused.to_vec().unwrap(),
                        m,
                        masked,
                        apart,
                    )
                };
                let (g, c) = (run(&gpu), run(&cpu));
                let what = format!("{dtype} {op:?} [{n}]");
                assert_close(&g.0, &c.0, 0.0, 0.0, &what);
                assert_close(&g.1, &c.1, 0.0, 0.0, &format!("{what} + relu"));
                assert_eq!(g.2, c.2, "{what} + relu: mask");
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&g.3), bits(&c.3), "{what} masked: gpu against cpu");
                assert_eq!(
                    bits(&g.3),
                    bits(&g.4),
                    "{what} masked: gpu fused against apart"
                );
                assert_eq!(
                    bits(&c.3),
                    bits(&c.4),
                    "{what} masked: cpu fused against apart"
                );
            }
        }
    }
}

/// Batch normalization on bf16 and f16 activations (f32 parameters and statistics), forward
/// with a fused ReLU and backward with the input gradient, equals the CPU's: the output and the
/// input gradient within two roundings of the dtype, the statistics and parameter gradients
/// (f64 sums of the same rounded values) to 1e-5; on each backend the input gradient's
/// per-channel sums (`dx_sum`, in the dtype) are the f64 sums of the dx it wrote, rounded once.
#[test]
fn low_precision_batch_norm_matches_the_cpu() {
    use stax::tensor::ops::{Affine, AffineGrads, NormSaved};
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    let cpu = cpu();
    for dtype in [DType::BF16, DType::F16] {
        // the vectorized kernels (16 and 64 channels, 24: elementwise only), the scalar ones
        for [outer, c, inner] in [[50, 16, 1], [16 * 28 * 28, 64, 1], [9, 24, 1], [3, 70, 5]] {
            let g = stax::tensor::ChannelGeometry { outer, c, inner };
            let n = outer * c * inner;
            let mut rng = Rng::new(seed_for("bn16", &[outer, c, inner]));
            let (x, dy) = (rng.vec(n, -2.0, 3.0), rng.vec(n, -1.0, 1.0));
            let (gamma, beta) = (rng.vec(c, 0.5, 1.5), rng.vec(c, -1.0, 1.0));
            let run = |be: &Arc<dyn Backend>| {
                let xt = typed(be, &x, &[n], dtype);
                let f = |v: &[f32]| Tensor::from_slice(be, v, [c], Category::Other).unwrap();
                let (gm, bt) = (f(&gamma), f(&beta));
                let affine = Affine {
                    gamma: Some(&gm),
                    beta: Some(&bt),
                };
                let mut y = poisoned(be, [n], dtype);
                let (mut mean, mut rstd) =
                    (poisoned(be, [c], DType::F32), poisoned(be, [c], DType::F32));
                let mut mask = poisoned(be, [n.div_ceil(32)], DType::U32);
                let stats = (&mut mean, &mut rstd);
                ops::batch_norm(&xt, &g, 1e-5, affine, &mut y, stats, Some(&mut mask)).unwrap();
                let mut d = typed(be, &dy, &[n], dtype);
                let (mut dgm, mut dbt) =
                    (poisoned(be, [c], DType::F32), poisoned(be, [c], DType::F32));
                let saved = NormSaved {
                    mean: &mean,
                    rstd: &rstd,
                    relu: Some(&mask),
                };
                let mut dx_sum = poisoned(be, [c], dtype);
                let grads = AffineGrads {
                    dgamma: Some(&mut dgm),
                    dbeta: Some(&mut dbt),
                    dx_sum: Some(&mut dx_sum),
                };
                ops::batch_norm_bwd(&xt, &g, Some(&gm), saved, &mut d, true, grads).unwrap();
                let mut sums = vec![0f64; c];
                for (i, &v) in d.to_vec().unwrap().iter().enumerate() {
                    sums[i / inner % c] += f64::from(v);
                }
                for (got, want) in dx_sum.to_vec().unwrap().into_iter().zip(sums) {
                    let err = (f64::from(got) - want).abs();
                    let what = format!("{} {dtype} dx_sum {g:?}", be.device());
                    assert!(
                        err <= eps(dtype) * want.abs() + 1e-12,
                        "{what}: {got} {want}"
                    );
                }
                [&y, &mean, &rstd, &d, &dgm, &dbt].map(|t| t.to_vec().unwrap())
            };
            let (on_gpu, on_cpu) = (run(&gpu), run(&cpu));
            for (i, name) in ["y", "mean", "rstd", "dx", "dgamma", "dbeta"]
                .iter()
                .enumerate()
            {
                let what = format!("{dtype} batch_norm {name} {g:?}");
                assert!(on_gpu[i].iter().all(|v| v.is_finite()), "{what}");
                let scale = on_cpu[i].iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
                match *name {
                    "y" | "dx" => assert_close(
                        &on_gpu[i],
                        &on_cpu[i],
                        2.0 * eps(dtype),
                        2.0 * eps(dtype) * scale,
                        &what,
                    ),
                    _ => {
                        assert_rel_close(&on_gpu[i], &on_cpu[i], 1e-5, &what);
                    }
                }
            }
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

/// The rounding unit of `dtype`'s storage (2^-8 for bf16, 2^-11 for f16).
fn eps(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 2f64.powi(-8),
        DType::F16 => 2f64.powi(-11),
        _ => 2f64.powi(-24),
    }
}

/// Convolutions in every layout pair: `(input NHWC-ordered dims, kernel, c_out, strides,
/// padding, layout, filter layout)`: odd sizes, stride 2 with SAME on even sizes and explicit
/// asymmetric padding (the padded copy), kernels copied into cuDNN's layout or read as stored,
/// and a 1x1 NHWC/HWIO conv (its filter gradient is a GEMM).
fn low_precision_conv_cases() -> Vec<Conv2dGeometry> {
    let cases = [
        (
            [2, 9, 7, 3],
            (3, 3),
            5,
            (1, 1),
            Padding::Same,
            Layout::Nhwc,
            FilterLayout::Hwio,
        ),
        (
            [2, 8, 8, 4],
            (3, 3),
            6,
            (2, 2),
            Padding::Same,
            Layout::Nhwc,
            FilterLayout::Hwio,
        ),
        (
            [1, 7, 9, 3],
            (3, 2),
            4,
            (1, 2),
            Padding::Explicit([(2, 0), (1, 3)]),
            Layout::Nhwc,
            FilterLayout::Oihw,
        ),
        (
            [2, 9, 7, 3],
            (3, 3),
            5,
            (1, 1),
            Padding::Same,
            Layout::Nchw,
            FilterLayout::Oihw,
        ),
        (
            [1, 8, 8, 4],
            (3, 3),
            6,
            (2, 2),
            Padding::Same,
            Layout::Nchw,
            FilterLayout::Hwio,
        ),
        (
            [3, 5, 5, 8],
            (1, 1),
            16,
            (1, 1),
            Padding::Valid,
            Layout::Nhwc,
            FilterLayout::Hwio,
        ),
    ];
    cases
        .into_iter()
        .map(
            |([n, h, w, c], (kh, kw), co, strides, padding, layout, filter)| {
                let spec = ConvSpec {
                    strides,
                    padding,
                    dilation: (1, 1),
                    layout,
                    filter,
                };
                let x = Shape::new(layout.dims(n, h, w, c));
                let k = Shape::new(filter.dims(kh, kw, c, co));
                Conv2dGeometry::with_spec(&x, &k, &spec).unwrap()
            },
        )
        .collect()
}

/// Every pass of a bf16 and an f16 convolution on CUDA (cuDNN with f32 compute) equals the
/// CPU's (the f32 convolution of the same rounded operands, rounded once) within two of the
/// dtype's roundings, norm-wise: forward with bias and a fused ReLU, input gradient, filter and
/// bias gradients through the ReLU's mask.
#[test]
fn low_precision_convolutions_match_the_cpu() {
    for apis in [ConvApis::Both, ConvApis::Legacy, ConvApis::Graph] {
        // a backend of its own (a limit given: not the shared one), its choices all made
        // under `apis`
        let options = BackendOptions {
            workspace_limit: Some(DEFAULT_WORKSPACE_LIMIT),
            ..with_precision(Precision::Highest)
        };
        let Some(cuda) = cuda_backend_or_skip(&options) else {
            return;
        };
        cuda.set_conv_apis(apis);
        low_precision_convolutions_match(&(cuda.clone() as Arc<dyn Backend>));
        let plans = cuda.conv_plans();
        let engines = plans
            .iter()
            .filter(|p| p.algorithm.starts_with("CUDNN_GRAPH_ENGINE_"))
            .count();
        println!(
            "{apis:?}: {engines} of {} passes on graph engines",
            plans.len()
        );
        match apis {
            ConvApis::Legacy => assert_eq!(engines, 0, "{plans:#?}"),
            ConvApis::Graph => assert!(engines > 0, "no pass ran an engine: {plans:#?}"),
            ConvApis::Both => {}
        }
    }
}

/// The body of [`low_precision_convolutions_match_the_cpu`] on `gpu`.
fn low_precision_convolutions_match(gpu: &Arc<dyn Backend>) {
    let gpu = gpu.clone();
    let cpu = cpu();
    for dtype in [DType::BF16, DType::F16] {
        for g in &low_precision_conv_cases() {
            let what = |pass: &str| format!("{dtype} conv {pass} {g:?}");
            let mut rng = Rng::new(seed_for("low_conv", &[g.n, g.h, g.w, g.c_in, g.c_out]));
            let x = rng.vec(g.input_shape().numel(), -1.0, 1.0);
            let w = rng.vec(g.filter_shape().numel(), -1.0, 1.0);
            let b = rng.vec(g.c_out, -0.5, 0.5);
            let dy = rng.vec(g.output_shape().numel(), -1.0, 1.0);
            let words = g.output_shape().numel().div_ceil(32);
            // both backward passes read the CPU's ReLU mask: an output within a rounding of 0
            // may land on the other side of it on the GPU, flipping a bit of the mask
            let cpu_mask = std::cell::RefCell::new(Vec::new());
            let run = |be: &Arc<dyn Backend>| {
                let xt = typed(be, &x, g.input_shape().dims(), dtype);
                let wt = typed(be, &w, g.filter_shape().dims(), dtype);
                let bt = typed(be, &b, &[g.c_out], dtype);
                let mut dyt = typed(be, &dy, g.output_shape().dims(), dtype);
                let mut y = poisoned(be, g.output_shape(), dtype);
                let mut mask = poisoned(be, [words], DType::U32);
                let epi = Epilogue {
                    act: Some(Activation::Relu),
                    aux: Some(&mut mask),
                };
                ops::conv2d(&xt, &wt, &bt, g, &mut y, epi).unwrap();
                if be.device() == stax::Device::Cpu {
                    *cpu_mask.borrow_mut() = mask.to_vec_u32().unwrap();
                }
                let mask =
                    Tensor::from_slice(be, &cpu_mask.borrow(), [words], Category::Other).unwrap();
                let mut dx = poisoned(be, g.input_shape(), dtype);
                ops::conv2d_bwd_data(&dyt, &wt, g, &mut dx).unwrap();
                let (mut dw, mut db) = (
                    poisoned(be, g.filter_shape(), dtype),
                    poisoned(be, [g.c_out], dtype),
                );
                let act = Some((Activation::Relu, &mask));
                ops::conv2d_bwd_filter(&xt, &mut dyt, g, &mut dw, &mut db, act).unwrap();
                [&y, &dx, &dw, &db].map(|t| t.to_vec().unwrap())
            };
            let on_cpu = run(&cpu);
            let on_gpu = run(&gpu);
            for (i, pass) in [
                "forward + bias + relu",
                "bwd data",
                "bwd filter",
                "bias grad",
            ]
            .iter()
            .enumerate()
            {
                assert!(on_gpu[i].iter().all(|v| v.is_finite()), "{}", what(pass));
                assert_rel_close(&on_gpu[i], &on_cpu[i], 2.0 * eps(dtype), &what(pass));
            }
        }
    }
}

/// Max, sum and average pooling in bf16 and f16 on CUDA equal the CPU's: the forward max
/// exactly (the same rounded inputs), sums and every backward pass within two roundings.
#[test]
fn low_precision_poolings_match_the_cpu() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    let cpu = cpu();
    let pools = [
        ([2, 7, 6, 3], (2, 2), (2, 2), Padding::Valid),
        ([1, 7, 6, 2], (3, 3), (2, 2), Padding::Same),
        ([2, 9, 8, 5], (3, 2), (2, 3), Padding::Same),
        (
            [1, 6, 5, 2],
            (3, 3),
            (1, 2),
            Padding::Explicit([(1, 1), (0, 1)]),
        ),
        // 8 channels a thread on the GPU
        ([2, 9, 8, 16], (3, 3), (2, 2), Padding::Same),
    ];
    for dtype in [DType::BF16, DType::F16] {
        for (dims, window, strides, padding) in pools {
            let c = dims[3];
            let g = Conv2dGeometry::new(
                &dims.into(),
                &[window.0, window.1, c, c].into(),
                strides,
                padding,
            )
            .unwrap();
            let mut rng = Rng::new(seed_for("low_pool", &dims));
            let x = rng.vec(g.input_shape().numel(), -1.0, 1.0);
            let dy = rng.vec(g.output_shape().numel(), -1.0, 1.0);
            for kind in [PoolKind::Max, PoolKind::Sum, PoolKind::Avg] {
                let what = |pass: &str| format!("{dtype} {kind:?} pool {pass} {g:?}");
                let run = |be: &Arc<dyn Backend>| {
                    let xt = typed(be, &x, g.input_shape().dims(), dtype);
                    let dyt = typed(be, &dy, g.output_shape().dims(), dtype);
                    let mut y = poisoned(be, g.output_shape(), dtype);
                    ops::pool2d(kind, &g, &xt, &mut y).unwrap();
                    let mut dx = poisoned(be, g.input_shape(), dtype);
                    let saved = (kind == PoolKind::Max).then_some(&xt);
                    ops::pool2d_bwd(kind, &g, saved, &dyt, &mut dx).unwrap();
                    [y.to_vec().unwrap(), dx.to_vec().unwrap()]
                };
                let (on_gpu, on_cpu) = (run(&gpu), run(&cpu));
                if kind == PoolKind::Max {
                    assert_eq!(on_gpu[0], on_cpu[0], "{}", what("forward"));
                } else {
                    assert_rel_close(&on_gpu[0], &on_cpu[0], 2.0 * eps(dtype), &what("forward"));
                }
                assert_rel_close(&on_gpu[1], &on_cpu[1], 2.0 * eps(dtype), &what("backward"));
            }
        }
    }
}

/// A bf16 and an f16 convolution (kernel copied into cuDNN's layout, asymmetric padding, NCHW
/// bias partials, the 1x1 GEMM filter gradient) and a bf16 max pooling's backward pass allocate
/// exactly their workspace schedules, to the byte and in order.
#[test]
fn low_precision_workspace_schedules_are_exact() {
    let Some(gpu) = private_gpu_or_skip() else {
        return;
    };
    let mut rng = Rng::new(seed_for("low_workspace", &[]));
    let cases = low_precision_conv_cases();
    for dtype in [DType::BF16, DType::F16] {
        for g in [&cases[0], &cases[2], &cases[4], &cases[5]] {
            let t = |shape: Shape, rng: &mut Rng| {
                typed(
                    &gpu,
                    &rng.vec(shape.numel(), -1.0, 1.0),
                    shape.dims(),
                    dtype,
                )
            };
            let (x, w, b) = (
                t(g.input_shape(), &mut rng),
                t(g.filter_shape(), &mut rng),
                t(Shape::new([g.c_out]), &mut rng),
            );
            let dy = t(g.output_shape(), &mut rng);
            let mut y = poisoned(&gpu, g.output_shape(), dtype);
            let mut dx = poisoned(&gpu, g.input_shape(), dtype);
            let mut dw = poisoned(&gpu, g.filter_shape(), dtype);
            let mut db = poisoned(&gpu, [g.c_out], dtype);
            let op = |pass, bias| OpDesc::Conv {
                geometry: *g,
                pass,
                dtype,
                bias,
            };
            let check = |what: &str, op, run: &mut dyn FnMut()| {
                assert_workspace_is_the_schedule(&gpu, &format!("{dtype} {what} {g:?}"), op, run)
            };
            check("conv fwd", op(ConvPass::Forward, true), &mut || {
                ops::conv2d(&x, &w, &b, g, &mut y, Epilogue::default()).unwrap()
            });
            check(
                "conv bwd data",
                op(ConvPass::BackwardData, false),
                &mut || ops::conv2d_bwd_data(&dy, &w, g, &mut dx).unwrap(),
            );
            check(
                "conv bwd filter",
                op(ConvPass::BackwardFilter, true),
                &mut || {
                    let mut d = dy.duplicate().unwrap();
                    ops::conv2d_bwd_filter(&x, &mut d, g, &mut dw, &mut db, None).unwrap()
                },
            );
        }
    }
    let g = Conv2dGeometry::new(
        &[2, 9, 8, 5].into(),
        &[3, 3, 5, 5].into(),
        (2, 2),
        Padding::Same,
    )
    .unwrap();
    let x = typed(
        &gpu,
        &rng.vec(g.input_shape().numel(), -1.0, 1.0),
        g.input_shape().dims(),
        DType::BF16,
    );
    let dy = typed(
        &gpu,
        &rng.vec(g.output_shape().numel(), -1.0, 1.0),
        g.output_shape().dims(),
        DType::BF16,
    );
    let mut dx = poisoned(&gpu, g.input_shape(), DType::BF16);
    let op = OpDesc::Pool {
        kind: PoolKind::Max,
        geometry: g,
        backward: true,
        dtype: DType::BF16,
        argmax: false,
    };
    assert_workspace_is_the_schedule(&gpu, "bf16 max pool bwd", op, &mut || {
        ops::pool2d_bwd(PoolKind::Max, &g, Some(&x), &dy, &mut dx).unwrap()
    });
}

/// The seed model (Conv 3x3 SAME 64, Relu, Conv 3x3 SAME 64, Relu, Flatten, Dense 128, Relu,
/// Dense) under `Policy::BF16` at 16x16x3, batch 8: three steps on the GPU follow the CPU's
/// losses (2% relative) and parameters (5% norm-wise), and every step's peak and live bytes
/// equal its (calibrated, exact) plan, to the byte, on both backends.
#[test]
fn bf16_seed_model_trains_on_the_gpu_as_on_the_cpu_with_exact_memory() {
    use stax::train::data::{Loader, fashion_mnist_2class};
    // a backend of its own: the shared one's allocator also counts the other tests' buffers
    // (their allocations showed up in this test's step trace and peak)
    let Some(gpu) = private_gpu_with(Precision::Highest) else {
        return;
    };
    let (train_set, _) = fashion_mnist_2class().unwrap();
    let input = Shape::new([8, 16, 16, 3]);
    let model = || Mixed::new(stax::models::seed_cnn(2), Policy::BF16);
    let loader = Loader::new(train_set.len(), 8, 5).unwrap();
    let mut runs = Vec::new();
    for be in [cpu(), gpu] {
        let mut trainer = Trainer::new(model(), input.clone(), Adam::new(1e-3), &be, 5).unwrap();
        let plan = trainer.plan(8).unwrap();
        assert!(plan.exact, "{}: the plan is calibrated", be.device());
        let mut losses = Vec::new();
        for indices in loader.batches(0).take(3) {
            let (x, y) = trainer.place_batch(&train_set, &indices).unwrap();
            be.allocator().start_trace();
            let r = trainer.step(&x, &y).unwrap();
            let measured = be.allocator().stop_trace();
            if r.memory.peak != plan.peak.bytes {
                // what the step allocated outside the plan's workspace and other buffers
                let extra = |t: &stax::alloc::Trace| -> Vec<String> {
                    t.events
                        .iter()
                        .filter(|e| e.op == stax::alloc::TraceOp::Alloc)
                        .filter(|e| matches!(e.category, Category::Workspace | Category::Other))
                        .map(|e| format!("{} {} {}", e.name, e.category.name(), e.bytes))
                        .collect()
                };
                let (planned, ran) = (extra(plan.trace()), extra(&measured));
                let missing: Vec<&String> = ran.iter().filter(|e| !planned.contains(e)).collect();
                println!("step {}: allocations not in the plan: {missing:?}", r.step);
            }
            assert_eq!(
                r.memory.peak,
                plan.peak.bytes,
                "{}: step {} peak (plan {:?}; step {:?})",
                be.device(),
                r.step,
                plan.peak,
                r.memory
            );
            assert_eq!(
                r.memory.live,
                plan.persistent_bytes(),
                "{}: step {} live",
                be.device(),
                r.step
            );
            assert!(r.loss.is_finite(), "{}: step {} loss", be.device(), r.step);
            losses.push(r.loss);
        }
        runs.push((losses, host_values(trainer.params().leaves())));
    }
    let ((cpu_losses, cpu_params), (gpu_losses, gpu_params)) = (&runs[0], &runs[1]);
    assert_close(
        gpu_losses,
        cpu_losses,
        2e-2,
        1e-3,
        "bf16 seed losses, GPU vs CPU",
    );
    // f32 master weights after three Adam steps of lr 1e-3 from the same initialization: the
    // backends round bf16 activations at different points (cuDNN's fused bias), so gradients
    // near 0 may change sign and Adam moves those weights by up to 2 lr a step the other way
    assert_rel_close(
        gpu_params,
        cpu_params,
        5e-2,
        "bf16 seed parameters, GPU vs CPU",
    );
}
