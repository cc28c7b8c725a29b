//! Every CUDA op and its backward against the CPU backend, on fresh seeded random inputs per
//! shape, with outputs poisoned first. Highest precision: norm-wise relative error <= 1e-5;
//! TF32: <= 5e-3. On a machine without a GPU every test prints a skip notice and passes
//! (`STAX_REQUIRE_GPU=1` turns that into a failure).

mod common;

use common::*;
use stax_tensor::cuda::CudaBackend;
use stax_tensor::ops::{self, Epilogue};
use stax_tensor::{
    Activation, Backend, BackendOptions, Category, Conv2dGeometry, ConvPass, DType, Device, OpDesc,
    Padding, PoolKind, Precision, Strategy, Tensor, TensorError,
};
use std::sync::Arc;

const PRECISIONS: [Precision; 2] = [Precision::Highest, Precision::Tf32];

fn tolerance(p: Precision) -> f64 {
    match p {
        Precision::Highest => 1e-5,
        Precision::Tf32 => 5e-3,
    }
}

/// Conv cases: input NHWC, kernel (kh, kw), c_out, strides, padding.
type ConvCase = ([usize; 4], (usize, usize), usize, (usize, usize), Padding);

const CONV_CASES: [ConvCase; 10] = [
    ([2, 9, 7, 3], (3, 3), 5, (1, 1), Padding::Same), // odd sizes, c_in 3
    ([1, 8, 8, 4], (3, 3), 6, (2, 2), Padding::Same), // stride 2: asymmetric (0, 1)
    ([3, 10, 11, 64], (3, 3), 16, (1, 1), Padding::Valid), // c_in 64
    ([2, 7, 6, 3], (2, 2), 8, (1, 1), Padding::Same), // even kernel: asymmetric
    ([2, 9, 9, 5], (3, 1), 4, (2, 1), Padding::Valid), // stride 2 VALID, 3x1
    ([1, 16, 16, 64], (3, 3), 64, (1, 1), Padding::Same), // 64 -> 64, batch 1
    ([4, 12, 12, 3], (3, 3), 64, (1, 1), Padding::Same), // seed's conv1, small
    ([2, 11, 10, 3], (5, 5), 7, (2, 2), Padding::Same), // 5x5 stride 2, odd/even
    ([1, 1, 1, 3], (1, 1), 2, (1, 1), Padding::Valid), // 1x1 everything
    ([3, 7, 9, 64], (1, 1), 96, (1, 1), Padding::Same), // ResNet's 1x1: dW one GEMM
];

fn geometry(case: &ConvCase) -> Conv2dGeometry {
    let ([n, h, w, c], (kh, kw), co, s, p) = *case;
    Conv2dGeometry::new(&[n, h, w, c].into(), &[kh, kw, c, co].into(), s, p).unwrap()
}

fn vec(t: &Tensor) -> Vec<f32> {
    t.to_vec().expect("download")
}

/// Runs all three conv passes on both backends for every case and precision.
#[test]
fn conv2d_all_passes_match_cpu() {
    for precision in PRECISIONS {
        let Some(gpu) = cuda_or_skip(&with_precision(precision)) else {
            return;
        };
        let cpu = cpu();
        for case in &CONV_CASES {
            let g = geometry(case);
            let what = |pass: &str| format!("conv2d {pass} {precision:?} {g:?}");
            let dims = [g.n, g.h, g.w, g.c_in, g.kh, g.kw, g.c_out, g.stride_h];
            let mut rng = Rng::new(seed_for("conv2d", &dims));
            let x = rng.vec(g.input_shape().numel(), -1.0, 1.0);
            let w = rng.vec(g.filter_shape().numel(), -1.0, 1.0);
            let b = rng.vec(g.c_out, -1.0, 1.0);
            let dy = rng.vec(g.output_shape().numel(), -1.0, 1.0);
            let (xg, xc) = on_both(&gpu, &cpu, &x, g.input_shape());
            let (wg, wc) = on_both(&gpu, &cpu, &w, g.filter_shape());
            let (bg, bc) = on_both(&gpu, &cpu, &b, [g.c_out]);
            let (dyg, dyc) = on_both(&gpu, &cpu, &dy, g.output_shape());
            let tol = tolerance(precision);

            let mut yg = poisoned(&gpu, g.output_shape(), DType::F32);
            let mut yc = poisoned(&cpu, g.output_shape(), DType::F32);
            ops::conv2d(&xg, &wg, &bg, &g, &mut yg, Default::default()).unwrap();
            ops::conv2d(&xc, &wc, &bc, &g, &mut yc, Default::default()).unwrap();
            let e1 = assert_rel_close(&vec(&yg), &vec(&yc), tol, &what("forward"));

            let mut dxg = poisoned(&gpu, g.input_shape(), DType::F32);
            let mut dxc = poisoned(&cpu, g.input_shape(), DType::F32);
            ops::conv2d_bwd_data(&dyg, &wg, &g, &mut dxg).unwrap();
            ops::conv2d_bwd_data(&dyc, &wc, &g, &mut dxc).unwrap();
            let e2 = assert_rel_close(&vec(&dxg), &vec(&dxc), tol, &what("backward data"));

            let mut dwg = poisoned(&gpu, g.filter_shape(), DType::F32);
            let mut dbg = poisoned(&gpu, [g.c_out], DType::F32);
            let mut dwc = poisoned(&cpu, g.filter_shape(), DType::F32);
            let mut dbc = poisoned(&cpu, [g.c_out], DType::F32);
            ops::conv2d_bwd_filter(&xg, &mut dyg.clone(), &g, &mut dwg, &mut dbg, None).unwrap();
            ops::conv2d_bwd_filter(&xc, &mut dyc.clone(), &g, &mut dwc, &mut dbc, None).unwrap();
            let e3 = assert_rel_close(&vec(&dwg), &vec(&dwc), tol, &what("backward filter"));
            let e4 = assert_rel_close(&vec(&dbg), &vec(&dbc), 1e-5, &what("bias gradient"));
            println!(
                "{} fwd {e1:.2e} bwd-data {e2:.2e} bwd-filter {e3:.2e} db {e4:.2e}",
                what("")
            );
        }
    }
}

/// The ops that fuse a ReLU into the convolution (`conv2d_relu`, `conv2d_bwd_filter_relu`)
/// against the CPU, whose defaults run the unfused ops. The mask must match the GPU's own
/// output (TF32 may flip signs of near-zero values against the CPU), and the backward pass is
/// given that mask on both backends.
#[test]
fn conv_relu_fused_ops_match_cpu() {
    let extra: ConvCase = ([2, 24, 20, 64], (3, 3), 64, (1, 1), Padding::Same);
    for precision in PRECISIONS {
        let Some(gpu) = cuda_or_skip(&with_precision(precision)) else {
            return;
        };
        let cpu = cpu();
        for case in CONV_CASES.iter().chain([&extra]) {
            let g = geometry(case);
            let what = |pass: &str| format!("conv2d_relu {pass} {precision:?} {g:?}");
            let dims = [g.n, g.h, g.w, g.c_in, g.kh, g.kw, g.c_out, g.stride_h];
            let mut rng = Rng::new(seed_for("conv2d_relu", &dims));
            let x = rng.vec(g.input_shape().numel(), -1.0, 1.0);
            let w = rng.vec(g.filter_shape().numel(), -1.0, 1.0);
            let b = rng.vec(g.c_out, -1.0, 1.0);
            let dy = rng.vec(g.output_shape().numel(), -1.0, 1.0);
            let (xg, xc) = on_both(&gpu, &cpu, &x, g.input_shape());
            let (wg, wc) = on_both(&gpu, &cpu, &w, g.filter_shape());
            let (bg, bc) = on_both(&gpu, &cpu, &b, [g.c_out]);
            let n = g.output_shape().numel();
            let words = n.div_ceil(32);
            let tol = tolerance(precision);

            let mut yg = poisoned(&gpu, g.output_shape(), DType::F32);
            let mut yc = poisoned(&cpu, g.output_shape(), DType::F32);
            let mut mg = poisoned(&gpu, [words], DType::U32);
            let mut mc = poisoned(&cpu, [words], DType::U32);
            ops::conv2d(
                &xg,
                &wg,
                &bg,
                &g,
                &mut yg,
                Epilogue {
                    act: Some(Activation::Relu),
                    aux: Some(&mut mg),
                },
            )
            .unwrap();
            ops::conv2d(
                &xc,
                &wc,
                &bc,
                &g,
                &mut yc,
                Epilogue {
                    act: Some(Activation::Relu),
                    aux: Some(&mut mc),
                },
            )
            .unwrap();
            let y_gpu = vec(&yg);
            let e1 = assert_rel_close(&y_gpu, &vec(&yc), tol, &what("forward"));
            let bits = mg.to_vec_u32().unwrap();
            for (i, v) in y_gpu.iter().enumerate() {
                let bit = bits[i / 32] >> (i % 32) & 1 == 1;
                assert_eq!(bit, *v > 0.0, "{}: mask bit {i} vs y {v}", what("mask"));
                assert!(
                    *v >= 0.0,
                    "{}: y[{i}] = {v} after the ReLU",
                    what("forward")
                );
            }
            if n % 32 != 0 {
                assert_eq!(bits[words - 1] >> (n % 32), 0, "{}", what("mask tail"));
            }
            let (mgg, mcc) = {
                let bytes: Vec<u8> = bits.iter().flat_map(|w| w.to_le_bytes()).collect();
                let mut on_cpu = Tensor::empty(&cpu, [words], DType::U32, Category::Other).unwrap();
                ops::upload(&bytes, &mut on_cpu).unwrap();
                (mg, on_cpu)
            };

            let (mut dyg, mut dyc) = on_both(&gpu, &cpu, &dy, g.output_shape());
            let mut dwg = poisoned(&gpu, g.filter_shape(), DType::F32);
            let mut dbg = poisoned(&gpu, [g.c_out], DType::F32);
            let mut dwc = poisoned(&cpu, g.filter_shape(), DType::F32);
            let mut dbc = poisoned(&cpu, [g.c_out], DType::F32);
            ops::conv2d_bwd_filter(
                &xg,
                &mut dyg,
                &g,
                &mut dwg,
                &mut dbg,
                Some((Activation::Relu, &mgg)),
            )
            .unwrap();
            ops::conv2d_bwd_filter(
                &xc,
                &mut dyc,
                &g,
                &mut dwc,
                &mut dbc,
                Some((Activation::Relu, &mcc)),
            )
            .unwrap();
            assert_close(&vec(&dyg), &vec(&dyc), 0.0, 0.0, &what("masked dy"));
            let e2 = assert_rel_close(&vec(&dwg), &vec(&dwc), tol, &what("backward filter"));
            let e3 = assert_rel_close(&vec(&dbg), &vec(&dbc), 1e-5, &what("bias gradient"));
            println!("{} fwd {e1:.2e} bwd-filter {e2:.2e} db {e3:.2e}", what(""));
        }
    }
}

/// At the seed's shapes (batch 100, 200x200), where cuDNN picks the algorithm that fuses the
/// bias and ReLU into its epilogue: fused and unfused runs agree, and so do the bias gradient
/// fused with the ReLU backward and the separate passes. Too large for the CPU oracle.
#[test]
fn seed_conv_fused_epilogues_match_unfused() {
    if cuda_or_skip(&with_precision(Precision::Tf32)).is_none() {
        return;
    }
    let private = CudaBackend::new(0, &with_precision(Precision::Tf32)).expect("open cuda:0");
    let gpu: Arc<dyn Backend> = private.clone();
    let s = (1, 1);
    for (c_in, seed) in [(3usize, 1u64), (64, 2)] {
        let g = Conv2dGeometry::new(
            &[100, 200, 200, c_in].into(),
            &[3, 3, c_in, 64].into(),
            s,
            Padding::Same,
        )
        .unwrap();
        let mut rng = Rng::new(seed_for("seed_fused", &[c_in, seed as usize]));
        let (x, _) = random_tensor(&gpu, g.input_shape(), &mut rng);
        let (w, _) = random_tensor(&gpu, g.filter_shape(), &mut rng);
        let (b, _) = random_tensor(&gpu, [64], &mut rng);
        let words = g.output_shape().numel().div_ceil(32);
        let run = |fused: bool| {
            private.set_fused_epilogues(fused);
            let mut y = poisoned(&gpu, g.output_shape(), DType::F32);
            let mut m = poisoned(&gpu, [words], DType::U32);
            ops::conv2d(
                &x,
                &w,
                &b,
                &g,
                &mut y,
                Epilogue {
                    act: Some(Activation::Relu),
                    aux: Some(&mut m),
                },
            )
            .unwrap();
            let mut plain = poisoned(&gpu, g.output_shape(), DType::F32);
            ops::conv2d(&x, &w, &b, &g, &mut plain, Default::default()).unwrap();
            // Backward on a copy of the plain output as dy (real values, both signs).
            let mut dy = plain.duplicate().unwrap();
            let mut dw = poisoned(&gpu, g.filter_shape(), DType::F32);
            let mut db = poisoned(&gpu, [64], DType::F32);
            ops::conv2d_bwd_filter(
                &x,
                &mut dy,
                &g,
                &mut dw,
                &mut db,
                Some((Activation::Relu, &m)),
            )
            .unwrap();
            let mut db_plain = poisoned(&gpu, [64], DType::F32);
            ops::bias_grad(&plain, &mut db_plain).unwrap();
            private.set_fused_epilogues(true);
            (
                vec(&y),
                m.to_vec_u32().unwrap(),
                vec(&plain),
                vec(&dy),
                vec(&dw),
                vec(&db),
                vec(&db_plain),
            )
        };
        let f = run(true);
        let u = run(false);
        let what = |t: &str| format!("seed conv {c_in}->64 fused vs unfused: {t}");
        let e_y = assert_rel_close(&f.0, &u.0, 1e-5, &what("conv2d_relu y"));
        let flipped: u32 =
            f.1.iter()
                .zip(&u.1)
                .map(|(a, b)| (a ^ b).count_ones())
                .sum();
        assert!(
            (flipped as usize) * 100_000 <= f.0.len(),
            "{}: {flipped} mask bits differ",
            what("mask")
        );
        let e_p = assert_rel_close(&f.2, &u.2, 1e-5, &what("conv2d"));
        let e_dy = assert_rel_close(&f.3, &u.3, 1e-5, &what("masked dy"));
        let e_dw = assert_rel_close(&f.4, &u.4, 1e-4, &what("dw"));
        let e_db = assert_rel_close(&f.5, &u.5, 1e-5, &what("db"));
        let e_dbp = assert_rel_close(&f.6, &u.6, 1e-5, &what("bias_grad"));
        println!(
            "{}: y {e_y:.2e}, mask bits flipped {flipped}, conv2d {e_p:.2e}, dy {e_dy:.2e}, \
             dw {e_dw:.2e}, db {e_db:.2e}, bias_grad {e_dbp:.2e}",
            what("")
        );
    }
}

#[test]
fn matmul_all_transposes_match_cpu() {
    let shapes = [
        (1, 1, 1),
        (3, 5, 7),
        (64, 300, 2),
        (17, 1000, 128),
        (1, 4096, 128),
        (100, 128, 2),
    ];
    for precision in PRECISIONS {
        let Some(gpu) = cuda_or_skip(&with_precision(precision)) else {
            return;
        };
        let cpu = cpu();
        for (m, k, n) in shapes {
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                let mut rng = Rng::new(seed_for("matmul", &[m, k, n, ta as usize, tb as usize]));
                let a_shape = if ta { [k, m] } else { [m, k] };
                let b_shape = if tb { [n, k] } else { [k, n] };
                let (ag, ac) = on_both(&gpu, &cpu, &rng.vec(m * k, -1.0, 1.0), a_shape);
                let (bg, bc) = on_both(&gpu, &cpu, &rng.vec(k * n, -1.0, 1.0), b_shape);
                let mut cg = poisoned(&gpu, [m, n], DType::F32);
                let mut cc = poisoned(&cpu, [m, n], DType::F32);
                ops::matmul(&ag, &bg, ta, tb, &mut cg).unwrap();
                ops::matmul(&ac, &bc, ta, tb, &mut cc).unwrap();
                let what = format!("matmul {precision:?} m{m} k{k} n{n} ta {ta} tb {tb}");
                let e = assert_rel_close(&vec(&cg), &vec(&cc), tolerance(precision), &what);
                println!("{what}: {e:.2e}");
            }
        }
    }
}

#[test]
fn bias_add_and_grad_match_cpu() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    let cpu = cpu();
    let shapes: [&[usize]; 9] = [
        &[1, 1],
        &[7, 3],
        &[100, 128],
        &[2, 5, 5, 64],
        &[10000, 2],
        &[3, 37],
        &[4096, 64],
        &[100_000, 64],
        &[513, 16],
    ];
    for shape in shapes {
        let mut rng = Rng::new(seed_for("bias", shape));
        let c = *shape.last().unwrap();
        let y = rng.vec(shape.iter().product(), -1.0, 1.0);
        let b = rng.vec(c, -1.0, 1.0);
        let (mut yg, mut yc) = on_both(&gpu, &cpu, &y, shape);
        let (bg, bc) = on_both(&gpu, &cpu, &b, [c]);
        ops::bias_add(&mut yg, &bg).unwrap();
        ops::bias_add(&mut yc, &bc).unwrap();
        assert_close(
            &vec(&yg),
            &vec(&yc),
            0.0,
            0.0,
            &format!("bias_add {shape:?}"),
        );
        let mut dbg = poisoned(&gpu, [c], DType::F32);
        let mut dbc = poisoned(&cpu, [c], DType::F32);
        ops::bias_grad(&yg, &mut dbg).unwrap();
        ops::bias_grad(&yc, &mut dbc).unwrap();
        assert_rel_close(
            &vec(&dbg),
            &vec(&dbc),
            1e-5,
            &format!("bias_grad {shape:?}"),
        );
    }
}

#[test]
fn relu_forward_mask_and_backward_match_cpu() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    let cpu = cpu();
    for n in [1, 31, 32, 33, 1000, 100_003, 1 << 20] {
        let mut rng = Rng::new(seed_for("relu", &[n]));
        let x = rng.vec(n, -1.0, 1.0);
        let words = n.div_ceil(32);
        let (mut xg, mut xc) = on_both(&gpu, &cpu, &x, [n]);
        let mut mg = poisoned(&gpu, [words], DType::U32);
        let mut mc = poisoned(&cpu, [words], DType::U32);
        ops::unary(Activation::Relu, &mut xg, Some(&mut mg)).unwrap();
        ops::unary(Activation::Relu, &mut xc, Some(&mut mc)).unwrap();
        assert_close(&vec(&xg), &vec(&xc), 0.0, 0.0, &format!("relu [{n}]"));
        assert_eq!(
            mg.to_vec_u32().unwrap(),
            mc.to_vec_u32().unwrap(),
            "relu mask [{n}]"
        );

        let (mut ng, mut nc) = on_both(&gpu, &cpu, &x, [n]);
        ops::unary(Activation::Relu, &mut ng, None).unwrap();
        ops::unary(Activation::Relu, &mut nc, None).unwrap();
        assert_close(
            &vec(&ng),
            &vec(&nc),
            0.0,
            0.0,
            &format!("relu without mask [{n}]"),
        );

        let dy = rng.vec(n, -1.0, 1.0);
        let (mut dg, mut dc) = on_both(&gpu, &cpu, &dy, [n]);
        ops::unary_bwd(Activation::Relu, &mg, &mut dg).unwrap();
        ops::unary_bwd(Activation::Relu, &mc, &mut dc).unwrap();
        assert_close(&vec(&dg), &vec(&dc), 0.0, 0.0, &format!("relu_bwd [{n}]"));
    }
}

#[test]
fn softmax_xent_loss_and_grad_match_cpu() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    let cpu = cpu();
    for (n, k, one_hot) in [
        (1, 2, true),
        (100, 2, true),
        (7, 10, false),
        (3, 1000, true),
        (513, 3, false),
    ] {
        let mut rng = Rng::new(seed_for("softmax_xent", &[n, k, one_hot as usize]));
        let logits: Vec<f32> = rng.vec(n * k, -8.0, 8.0);
        let mut labels = vec![0f32; n * k];
        for row in labels.chunks_mut(k) {
            if one_hot {
                row[rng.below(k)] = 1.0;
            } else {
                let raw = rng.vec(k, 0.0, 1.0);
                let s: f32 = raw.iter().sum();
                row.iter_mut().zip(raw).for_each(|(l, r)| *l = r / s);
            }
        }
        let (zg, zc) = on_both(&gpu, &cpu, &logits, [n, k]);
        let (yg, yc) = on_both(&gpu, &cpu, &labels, [n, k]);
        let mut dg = poisoned(&gpu, [n, k], DType::F32);
        let mut dc = poisoned(&cpu, [n, k], DType::F32);
        let lg = ops::softmax_xent(&zg, &yg, &mut dg).unwrap();
        let lc = ops::softmax_xent(&zc, &yc, &mut dc).unwrap();
        let what = format!("softmax_xent [{n}, {k}] one-hot {one_hot}");
        assert_close(&[lg], &[lc], 1e-5, 1e-7, &format!("{what} loss"));
        assert_close(&vec(&dg), &vec(&dc), 1e-5, 1e-7, &format!("{what} dlogits"));
    }
}

#[test]
fn adam_update_matches_cpu() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    let cpu = cpu();
    for n in [1, 1000, 100_003] {
        let mut rng = Rng::new(seed_for("adam", &[n]));
        let (mut pg, mut pc) = on_both(&gpu, &cpu, &rng.vec(n, -1.0, 1.0), [n]);
        let (mut mg, mut mc) = on_both(&gpu, &cpu, &rng.vec(n, -0.1, 0.1), [n]);
        let (mut vg, mut vc) = on_both(&gpu, &cpu, &rng.vec(n, 0.0, 0.01), [n]);
        for t in 1..=3 {
            let h = stax::Adam::new(1e-3).hyper(t);
            let (gg, gc) = on_both(&gpu, &cpu, &rng.vec(n, -1.0, 1.0), [n]);
            ops::adam(&mut pg, &gg, &mut mg, &mut vg, &h).unwrap();
            ops::adam(&mut pc, &gc, &mut mc, &mut vc, &h).unwrap();
            for (name, a, b) in [("p", &pg, &pc), ("m", &mg, &mc), ("v", &vg, &vc)] {
                assert_close(
                    &vec(a),
                    &vec(b),
                    1e-6,
                    1e-6,
                    &format!("adam [{n}] step {t} {name}"),
                );
            }
        }
    }
}

/// Adam where its divisions have zero dividends (a zero gradient on zero moments, ±0: half the
/// seed's dense rows; the kernels keep those off the division's slow path) and the specials
/// near them: denormal gradients and moments, `eps = 0` with `v = 0` (0 / 0, NaN on both), a
/// negative zero weight. GPU = CPU bit for bit (a NaN as a NaN) through the vector kernel (f32
/// gradients, 16-byte aligned) and the element kernel (bf16 gradients, cast alike on both).
#[test]
fn adam_on_zero_moments_and_specials_matches_cpu_bit_for_bit() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    let cpu = cpu();
    let tiny = f32::from_bits(1);
    let g = [0.0, -0.0, 0.0, 0.0, tiny, 1e-30, 0.0, 0.5, -1e-39];
    let m = [0.0, 0.0, -0.0, tiny, 0.0, 0.0, 1e-38, 0.0, 0.0];
    let v = [0.0, 0.0, 0.0, 0.0, tiny, 0.0, 1e-38, 0.0, 0.0];
    let p = [1.0, -0.0, 0.5, -2.0, 0.0, 3.0, 1.0, -1.0, 0.25];
    let repeat = |a: &[f32]| a.repeat(100);
    let bits = |t: &Tensor| -> Vec<u32> {
        let canonical = |x: f32| if x.is_nan() { f32::NAN } else { x };
        vec(t).into_iter().map(|x| canonical(x).to_bits()).collect()
    };
    for eps in [1e-8, 0.0] {
        for g_dtype in [DType::F32, DType::BF16] {
            let h = stax_tensor::AdamHyper {
                eps,
                ..stax::Adam::new(1e-3).hyper(2)
            };
            let n = 9 * 100;
            let (mut pg, mut pc) = on_both(&gpu, &cpu, &repeat(&p), [n]);
            let (mut mg, mut mc) = on_both(&gpu, &cpu, &repeat(&m), [n]);
            let (mut vg, mut vc) = on_both(&gpu, &cpu, &repeat(&v), [n]);
            let (g32, c32) = on_both(&gpu, &cpu, &repeat(&g), [n]);
            let cast = |t: &Tensor| {
                let mut out = Tensor::empty(t.backend(), [n], g_dtype, Category::Other).unwrap();
                ops::cast(t, &mut out).unwrap();
                out
            };
            let (gg, gc) = (cast(&g32), cast(&c32));
            ops::adam(&mut pg, &gg, &mut mg, &mut vg, &h).unwrap();
            ops::adam(&mut pc, &gc, &mut mc, &mut vc, &h).unwrap();
            for (name, a, b) in [("p", &pg, &pc), ("m", &mg, &mc), ("v", &vg, &vc)] {
                assert_eq!(
                    bits(a),
                    bits(b),
                    "adam {name}, eps {eps}, {g_dtype} gradients"
                );
            }
        }
    }
}

#[test]
fn fill_copy_and_transfers_round_trip() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    // Larger than the two pinned staging chunks, and not a multiple of a chunk.
    let n = 5_000_001;
    let mut rng = Rng::new(seed_for("transfer", &[n]));
    let (t, data) = random_tensor(&gpu, [n], &mut rng);
    assert_eq!(vec(&t), data, "upload then download");
    let copy = t.duplicate().unwrap();
    assert_eq!(vec(&copy), data, "device copy");
    let mut z = poisoned(&gpu, [n], DType::F32);
    ops::fill(&mut z, 2.5).unwrap();
    assert!(vec(&z).iter().all(|&v| v == 2.5), "fill");
    let mut m = poisoned(&gpu, [1000], DType::U32);
    ops::fill(&mut m, 0.0).unwrap();
    assert!(m.to_vec_u32().unwrap().iter().all(|&w| w == 0), "fill u32");
    let on_cpu = t.to(&cpu()).unwrap();
    assert_eq!(on_cpu.to_vec().unwrap(), data, "device_put to the host");
    gpu.synchronize().unwrap();
    let (free, total) = gpu.driver_memory().unwrap().expect("cuda reports memory");
    assert!(free <= total && total > 0);
}

#[test]
fn bad_ordinal_is_no_such_device() {
    if cuda_or_skip(&with_precision(Precision::Tf32)).is_none() {
        return;
    }
    match Device::Cuda(7).open(&with_precision(Precision::Tf32)) {
        Err(TensorError::NoSuchDevice { ordinal: 7, count }) => assert!(count < 8),
        Ok(_) => println!("this machine has 8 GPUs: cuda:7 exists"),
        Err(e) => panic!("expected NoSuchDevice, got {e}"),
    }
}

#[test]
fn cpu_tensor_into_cuda_op_is_device_mismatch() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Tf32)) else {
        return;
    };
    let cpu = cpu();
    let g = geometry(&CONV_CASES[0]);
    let mut rng = Rng::new(1);
    let (x_cpu, _) = random_tensor(&cpu, g.input_shape(), &mut rng);
    let (w, _) = random_tensor(&gpu, g.filter_shape(), &mut rng);
    let (b, _) = random_tensor(&gpu, [g.c_out], &mut rng);
    let mut y = poisoned(&gpu, g.output_shape(), DType::F32);
    let e = ops::conv2d(&x_cpu, &w, &b, &g, &mut y, Default::default()).unwrap_err();
    assert!(
        matches!(
            e,
            TensorError::DeviceMismatch {
                op: "conv2d",
                lhs: Device::Cpu,
                rhs: Device::Cuda(0)
            }
        ),
        "{e}"
    );
    let (a_cpu, _) = random_tensor(&cpu, [2, 2], &mut rng);
    let (a_gpu, _) = random_tensor(&gpu, [2, 2], &mut rng);
    let mut c = poisoned(&gpu, [2, 2], DType::F32);
    let e = ops::matmul(&a_gpu, &a_cpu, false, false, &mut c).unwrap_err();
    assert!(matches!(e, TensorError::DeviceMismatch { .. }), "{e}");
}

#[test]
fn terabyte_tensor_is_out_of_memory_and_backend_survives() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Tf32)) else {
        return;
    };
    let e = Tensor::empty(
        &gpu,
        [250_000_000_000usize],
        DType::F32,
        Category::Activation,
    )
    .unwrap_err();
    match &e {
        TensorError::Alloc(stax_alloc::AllocError::OutOfMemory(report)) => {
            assert_eq!(report.requested, 1_000_000_000_000);
            println!("1 TB tensor: {e}");
        }
        other => panic!("expected out of memory, got {other}"),
    }
    let mut rng = Rng::new(2);
    let (mut x, data) = random_tensor(&gpu, [4096], &mut rng);
    ops::unary(Activation::Relu, &mut x, None).unwrap();
    let want: Vec<f32> = data
        .iter()
        .map(|&v| if v > 0.0 { v } else { 0.0 })
        .collect();
    assert_eq!(
        vec(&x),
        want,
        "the backend works after the failed allocation"
    );
}

/// The seed's convolutions at batch 100: the algorithms chosen and their workspace bytes
/// (printed for the report), and finite gradients. Too large for the CPU oracle.
#[test]
fn seed_conv_plans_are_reported() {
    for precision in PRECISIONS {
        let Some(gpu) = cuda_backend_or_skip(&with_precision(precision)) else {
            return;
        };
        let dynb: Arc<dyn Backend> = gpu.clone();
        let s = (1, 1);
        let g1 = Conv2dGeometry::new(
            &[100, 200, 200, 3].into(),
            &[3, 3, 3, 64].into(),
            s,
            Padding::Same,
        )
        .unwrap();
        let g2 = Conv2dGeometry::new(
            &[100, 200, 200, 64].into(),
            &[3, 3, 64, 64].into(),
            s,
            Padding::Same,
        )
        .unwrap();
        let mut rng = Rng::new(seed_for("seed", &[100]));
        let (x, _) = random_tensor(&dynb, g1.input_shape(), &mut rng);
        let (w1, _) = random_tensor(&dynb, g1.filter_shape(), &mut rng);
        let (w2, _) = random_tensor(&dynb, g2.filter_shape(), &mut rng);
        let (b, _) = random_tensor(&dynb, [64], &mut rng);
        let mut y1 = poisoned(&dynb, g1.output_shape(), DType::F32);
        let mut y2 = poisoned(&dynb, g2.output_shape(), DType::F32);
        let mut dx2 = poisoned(&dynb, g2.input_shape(), DType::F32);
        let mut dw = poisoned(&dynb, g2.filter_shape(), DType::F32);
        let mut dw1 = poisoned(&dynb, g1.filter_shape(), DType::F32);
        let mut db = poisoned(&dynb, [64], DType::F32);
        let mut step = |timed: bool| {
            let t0 = std::time::Instant::now();
            ops::conv2d(&x, &w1, &b, &g1, &mut y1, Default::default()).unwrap();
            ops::conv2d(&y1, &w2, &b, &g2, &mut y2, Default::default()).unwrap();
            ops::conv2d_bwd_data(&y2, &w2, &g2, &mut dx2).unwrap();
            ops::conv2d_bwd_filter(&y1, &mut y2.clone(), &g2, &mut dw, &mut db, None).unwrap();
            ops::conv2d_bwd_filter(&x, &mut dx2.clone(), &g1, &mut dw1, &mut db, None).unwrap();
            gpu.synchronize().unwrap();
            if timed {
                println!(
                    "seed convs {precision:?}: 5 passes in {:.2} ms",
                    t0.elapsed().as_secs_f64() * 1e3
                );
            }
        };
        for i in 0..4 {
            step(i > 0);
        }
        assert!(
            vec(&dw).iter().chain(&vec(&dw1)).all(|v| v.is_finite()),
            "finite gradients"
        );
        for p in gpu.conv_plans().iter().filter(|p| p.geometry.n == 100) {
            println!(
                "plan {:?} {:?} c_in {} -> c_out {}: {} {} workspace {} B layout {} B ({:.3} ms)",
                p.precision,
                p.pass,
                p.geometry.c_in,
                p.geometry.c_out,
                p.algorithm,
                p.math,
                p.workspace_bytes,
                p.layout_bytes,
                p.time_ms
            );
            for c in &p.candidates {
                println!(
                    "    candidate {} {} workspace {} B time {:?} ms {}",
                    c.algorithm, c.math, c.workspace_bytes, c.time_ms, c.status
                );
            }
        }
        let stats = gpu.allocator().stats();
        println!(
            "allocator after seed convs ({precision:?}): peak_allocated {} B",
            stats.peak_allocated
        );
    }
}

/// Every allocator strategy opens on the device (bfc after the modules are loaded: seeds/004)
/// and computes the same conv, matmul and ReLU as the CPU.
#[test]
fn every_strategy_opens_and_computes() {
    if cuda_or_skip(&with_precision(Precision::Highest)).is_none() {
        return;
    }
    let cpu = cpu();
    let strategies = [
        Strategy::Bfc { fraction: 0.25 },
        Strategy::Expandable,
        Strategy::Platform,
        Strategy::Async {
            release_threshold: 1 << 30,
        },
    ];
    for strategy in strategies {
        let options = BackendOptions {
            strategy: strategy.clone(),
            precision: Precision::Highest,
            workspace_limit: Some(64 << 20),
        };
        let gpu: Arc<dyn Backend> =
            CudaBackend::new(0, &options).unwrap_or_else(|e| panic!("open with {strategy:?}: {e}"));
        let g = geometry(&CONV_CASES[1]);
        let mut rng = Rng::new(seed_for("strategies", &[g.n, g.h]));
        let x = rng.vec(g.input_shape().numel(), -1.0, 1.0);
        let w = rng.vec(g.filter_shape().numel(), -1.0, 1.0);
        let b = rng.vec(g.c_out, -1.0, 1.0);
        let (xg, xc) = on_both(&gpu, &cpu, &x, g.input_shape());
        let (wg, wc) = on_both(&gpu, &cpu, &w, g.filter_shape());
        let (bg, bc) = on_both(&gpu, &cpu, &b, [g.c_out]);
        let mut yg = poisoned(&gpu, g.output_shape(), DType::F32);
        let mut yc = poisoned(&cpu, g.output_shape(), DType::F32);
        ops::conv2d(&xg, &wg, &bg, &g, &mut yg, Default::default()).unwrap();
        ops::conv2d(&xc, &wc, &bc, &g, &mut yc, Default::default()).unwrap();
        let mut mg = poisoned(&gpu, [yg.numel().div_ceil(32)], DType::U32);
        ops::unary(Activation::Relu, &mut yg, Some(&mut mg)).unwrap();
        ops::unary(Activation::Relu, &mut yc, None).unwrap();
        let what = format!("conv2d + relu with {strategy:?}");
        assert_rel_close(&vec(&yg), &vec(&yc), 1e-5, &what);
        let (ag, ac) = on_both(&gpu, &cpu, &rng.vec(64 * 96, -1.0, 1.0), [64, 96]);
        let mut cg = poisoned(&gpu, [64, 64], DType::F32);
        let mut cc = poisoned(&cpu, [64, 64], DType::F32);
        ops::matmul(&ag, &ag, false, true, &mut cg).unwrap();
        ops::matmul(&ac, &ac, false, true, &mut cc).unwrap();
        assert_rel_close(
            &vec(&cg),
            &vec(&cc),
            1e-5,
            &format!("matmul with {strategy:?}"),
        );
        let stats = gpu.allocator().stats();
        println!(
            "{strategy:?}: reserved {} B, peak allocated {} B, driver {:?}",
            stats.reserved,
            stats.peak_allocated,
            gpu.driver_memory().unwrap()
        );
    }
}

/// `workspace_schedule` lists, to the byte and in order, the workspace allocations and frees
/// of each op once calibrated (the conv algorithms chosen), and `workspace_bytes` is their
/// peak; before calibration a conv's schedule is a bound at least as large.
#[test]
fn workspace_schedules_match_what_ops_allocate() {
    let Some(gpu) = private_gpu_or_skip() else {
        return;
    };
    let check = |what: &str, op: OpDesc, run: &mut dyn FnMut()| {
        assert_workspace_is_the_schedule(&gpu, what, op, run)
    };
    let mut rng = Rng::new(seed_for("workspace", &[]));
    for case in [
        &CONV_CASES[1],
        &CONV_CASES[2],
        &CONV_CASES[3],
        &CONV_CASES[6],
        &CONV_CASES[9],
    ] {
        let g = geometry(case);
        let (x, _) = random_tensor(&gpu, g.input_shape(), &mut rng);
        let (w, _) = random_tensor(&gpu, g.filter_shape(), &mut rng);
        let (b, _) = random_tensor(&gpu, [g.c_out], &mut rng);
        let (dy, _) = random_tensor(&gpu, g.output_shape(), &mut rng);
        let mut y = poisoned(&gpu, g.output_shape(), DType::F32);
        let mut dx = poisoned(&gpu, g.input_shape(), DType::F32);
        let mut dw = poisoned(&gpu, g.filter_shape(), DType::F32);
        let mut db = poisoned(&gpu, [g.c_out], DType::F32);
        let op = |pass| OpDesc::Conv {
            geometry: g,
            pass,
            dtype: DType::F32,
            bias: pass != ConvPass::BackwardData,
        };
        check(
            &format!("conv fwd {g:?}"),
            op(ConvPass::Forward),
            &mut || ops::conv2d(&x, &w, &b, &g, &mut y, Default::default()).unwrap(),
        );
        check(
            &format!("conv bwd data {g:?}"),
            op(ConvPass::BackwardData),
            &mut || ops::conv2d_bwd_data(&dy, &w, &g, &mut dx).unwrap(),
        );
        check(
            &format!("conv bwd filter {g:?}"),
            op(ConvPass::BackwardFilter),
            &mut || {
                ops::conv2d_bwd_filter(&x, &mut dy.clone(), &g, &mut dw, &mut db, None).unwrap()
            },
        );
        // the fused ReLU variants the training step uses allocate as their plain passes
        let words = g.output_shape().numel().div_ceil(32);
        let mut mask = poisoned(&gpu, [words], DType::U32);
        check(
            &format!("conv fwd + relu {g:?}"),
            op(ConvPass::Forward),
            &mut || {
                ops::conv2d(
                    &x,
                    &w,
                    &b,
                    &g,
                    &mut y,
                    Epilogue {
                        act: Some(Activation::Relu),
                        aux: Some(&mut mask),
                    },
                )
                .unwrap()
            },
        );
        let mut dy_relu = dy.duplicate().unwrap();
        check(
            &format!("conv bwd filter + relu {g:?}"),
            op(ConvPass::BackwardFilter),
            &mut || {
                ops::conv2d_bwd_filter(
                    &x,
                    &mut dy_relu,
                    &g,
                    &mut dw,
                    &mut db,
                    Some((Activation::Relu, &mask)),
                )
                .unwrap()
            },
        );
    }
    // max pooling's backward pass: one argmax word per output element
    let g = Conv2dGeometry::new(
        &[2, 9, 8, 5].into(),
        &[3, 3, 5, 5].into(),
        (2, 2),
        Padding::Same,
    )
    .unwrap();
    let (x, _) = random_tensor(&gpu, g.input_shape(), &mut rng);
    let (dy, _) = random_tensor(&gpu, g.output_shape(), &mut rng);
    let mut dx = poisoned(&gpu, g.input_shape(), DType::F32);
    check(
        &format!("max pool bwd {g:?}"),
        OpDesc::Pool {
            kind: PoolKind::Max,
            geometry: g,
            backward: true,
            dtype: DType::F32,
            argmax: false,
        },
        &mut || ops::pool2d_bwd(PoolKind::Max, &g, Some(&x), &dy, &mut dx).unwrap(),
    );
    let (a, _) = random_tensor(&gpu, [33, 70], &mut rng);
    let mut c = poisoned(&gpu, [33, 33], DType::F32);
    check(
        "matmul",
        OpDesc::Matmul {
            m: 33,
            n: 33,
            k: 70,
            dtype: DType::F32,
            b_dtype: DType::F32,
            transpose_a: false,
            transpose_b: true,
            accumulate: false,
        },
        &mut || ops::matmul(&a, &a, false, true, &mut c).unwrap(),
    );
    let mut db = poisoned(&gpu, [70], DType::F32);
    check(
        "bias_grad",
        OpDesc::BiasGrad { rows: 33, cols: 70 },
        &mut || ops::bias_grad(&a, &mut db).unwrap(),
    );
    let mut da = poisoned(&gpu, [33, 70], DType::F32);
    check(
        "softmax_xent",
        OpDesc::SoftmaxXent {
            rows: 33,
            classes: 70,
        },
        &mut || ops::softmax_xent(&a, &a, &mut da).map(drop).unwrap(),
    );
}
