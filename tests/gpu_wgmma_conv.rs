//! The wgmma forward and backward-data passes (`kernels/conv_wgmma.cu`: a 3x3, stride-1 conv
//! from 64 to 64 channels in full fp32 as 3xTF32 on Hopper's warpgroup tensor cores) against
//! the CPU backend on fresh seeded random inputs: the forward pass plain, with a bias, and with
//! bias, ReLU and mask (the mask the GPU output's sign), and the backward-data pass, on SAME,
//! VALID and asymmetric padding, the narrowest rows the kernel takes (15), tiles spanning up to
//! 10 rows, rows wider than a tile, more tiles than blocks; each pass's workspace is exactly its
//! schedule (the packed kernel); under `DirectConvs::Winning` calibration times the kernel
//! against cuDNN's choice and runs the faster; TF32, narrower rows and wider padding stay on
//! cuDNN. Without a GPU every test prints a skip notice.

mod common;

use common::*;
use stax_tensor::cuda::{CudaBackend, DirectConvs, Fp32Convs};
use stax_tensor::ops::{self, Epilogue};
use stax_tensor::{
    Activation, Backend, Conv2dGeometry, ConvPass, DType, OpDesc, Padding, Precision,
};
use std::sync::Arc;

fn cases() -> Vec<Conv2dGeometry> {
    let (same, valid) = (Padding::Same, Padding::Valid);
    vec![
        conv3x3_c64([2, 9, 40, 64], same),
        conv3x3_c64([3, 15, 15, 64], same),
        conv3x3_c64([1, 4, 97, 64], valid),
        conv3x3_c64([1, 3, 200, 64], same),
        conv3x3_c64([2, 6, 20, 64], Padding::Explicit([(2, 0), (1, 2)])),
        conv3x3_c64([1, 5, 17, 64], Padding::Explicit([(0, 2), (2, 0)])),
        // more tiles (128 positions) than blocks (one a multiprocessor)
        conv3x3_c64([6, 50, 64, 64], same),
    ]
}

/// The passes' norm-wise tolerance against the CPU's exact f32: 3xTF32's, about f32's (each
/// operand's TF32 rounding and the rounded rest, the product of the two rests dropped).
const TOL: f64 = 1e-5;

/// On `be`, from host `[x, w, b, dy]`: the forward output plain, with the bias, and with bias
/// and ReLU (and its mask, returned), then dx.
fn passes(
    be: &Arc<dyn Backend>,
    g: &Conv2dGeometry,
    inputs: &[Vec<f32>; 4],
) -> ([Vec<f32>; 4], Vec<u32>) {
    let [x, w, b, dy] = inputs;
    let x = typed(be, x, g.input_shape().dims(), DType::F32);
    let w = typed(be, w, g.filter_shape().dims(), DType::F32);
    let b = typed(be, b, &[g.c_out], DType::F32);
    let dy = typed(be, dy, g.output_shape().dims(), DType::F32);
    let out = || poisoned(be, g.output_shape(), DType::F32);
    let (mut y_plain, mut y_bias, mut y_relu) = (out(), out(), out());
    ops::conv2d(&x, &w, None, g, &mut y_plain, Default::default()).unwrap();
    ops::conv2d(&x, &w, &b, g, &mut y_bias, Default::default()).unwrap();
    let mut m = poisoned(be, [g.output_shape().numel() / 32], DType::U32);
    let epi = Epilogue {
        act: Some(Activation::Relu),
        aux: Some(&mut m),
    };
    ops::conv2d(&x, &w, &b, g, &mut y_relu, epi).unwrap();
    let mut dx = poisoned(be, g.input_shape(), DType::F32);
    ops::conv2d_bwd_data(&dy, &w, g, &mut dx).unwrap();
    let host = [&y_plain, &y_bias, &y_relu, &dx].map(|t| t.to_vec().unwrap());
    (host, m.to_vec_u32().unwrap())
}

/// [`passes`] of `g` on `cuda` match the CPU's within [`TOL`]; the mask is the GPU output's
/// sign.
fn passes_match(cuda: &Arc<CudaBackend>, g: &Conv2dGeometry) {
    let mut rng = Rng::new(seed_for(
        "wgmma_conv",
        &[g.n, g.h, g.w, g.pad_top, g.pad_left],
    ));
    let inputs = [
        rng.vec(g.input_shape().numel(), -1.0, 1.0),
        rng.vec(g.filter_shape().numel(), -0.1, 0.1),
        rng.vec(g.c_out, -0.5, 0.5),
        rng.vec(g.output_shape().numel(), -1.0, 1.0),
    ];
    let gpu: Arc<dyn Backend> = cuda.clone();
    let (on_gpu, bits) = passes(&gpu, g, &inputs);
    let (on_cpu, _) = passes(&cpu(), g, &inputs);
    for (i, y) in on_gpu[2].iter().enumerate() {
        let bit = bits[i / 32] >> (i % 32) & 1 == 1;
        assert_eq!(bit, *y > 0.0, "mask bit {i} vs y {y}, {g:?}");
    }
    for (i, name) in ["forward", "forward + bias", "forward + bias + relu", "dx"]
        .iter()
        .enumerate()
    {
        let what = format!("{name} {g:?}");
        let (a, b) = (&on_gpu[i], &on_cpu[i]);
        assert!(a.iter().all(|v| v.is_finite()), "{what}");
        println!("{what}: rel {:.2e}", assert_rel_close(a, b, TOL, &what));
    }
}

/// The plan's name of the kernel's arithmetic.
const MATH: &str = "3xTF32 tensor cores (wgmma), f32 sums";

/// Every case runs the kernel in both passes (its plans say so) and matches the CPU; each
/// pass's workspace is its schedule, the packed kernel; under TF32 and in bf16 the passes stay
/// on cuDNN, as do rows under 15 wide and, for backward data, padding over 2.
#[test]
fn wgmma_conv_passes_match_the_cpu() {
    let Some(cuda) = private_cuda_with(Precision::Highest) else {
        return;
    };
    cuda.set_direct_convs(DirectConvs::All);
    let both = [ConvPass::Forward, ConvPass::BackwardData];
    for g in &cases() {
        for pass in both {
            assert!(cuda.conv_is_direct(g, DType::F32, pass), "{pass:?} {g:?}");
            assert!(!cuda.conv_is_direct(g, DType::BF16, pass), "{pass:?} {g:?}");
        }
        passes_match(&cuda, g);
    }
    let plans = cuda.conv_plans();
    for g in &cases() {
        for pass in both {
            let p = plans
                .iter()
                .find(|p| p.geometry == *g && p.pass == pass)
                .unwrap_or_else(|| panic!("no {pass:?} plan for {g:?}"));
            assert!(p.algorithm.starts_with("stax direct"), "{p}");
            assert_eq!((p.math.as_str(), p.workspace_bytes), (MATH, 294_912), "{p}");
        }
    }
    schedules_hold(&cuda, &cases()[..2]);
    let narrow = conv3x3_c64([1, 5, 14, 64], Padding::Same);
    let wide_pad = conv3x3_c64([1, 5, 20, 64], Padding::Explicit([(3, 3), (1, 1)]));
    for (g, fwd, data) in [(narrow, false, false), (wide_pad, true, false)] {
        assert_eq!(cuda.conv_is_direct(&g, DType::F32, ConvPass::Forward), fwd);
        assert_eq!(
            cuda.conv_is_direct(&g, DType::F32, ConvPass::BackwardData),
            data
        );
    }
    let Some(tf32) = private_cuda_with(Precision::Tf32) else {
        return;
    };
    tf32.set_direct_convs(DirectConvs::All);
    for pass in both {
        assert!(
            !tf32.conv_is_direct(&cases()[0], DType::F32, pass),
            "{pass:?}"
        );
    }
}

/// On fresh operands of each of `geometries`, the forward pass with and without a bias and the
/// backward-data pass each allocate exactly their workspace schedule.
fn schedules_hold(cuda: &Arc<CudaBackend>, geometries: &[Conv2dGeometry]) {
    let gpu: Arc<dyn Backend> = cuda.clone();
    let mut rng = Rng::new(seed_for("wgmma_conv_workspace", &[]));
    for g in geometries {
        let (x, _) = random_tensor(&gpu, g.input_shape(), &mut rng);
        let (w, _) = random_tensor(&gpu, g.filter_shape(), &mut rng);
        let (b, _) = random_tensor(&gpu, [g.c_out], &mut rng);
        let (dy, _) = random_tensor(&gpu, g.output_shape(), &mut rng);
        let mut y = poisoned(&gpu, g.output_shape(), DType::F32);
        let mut dx = poisoned(&gpu, g.input_shape(), DType::F32);
        let op = |pass, bias| OpDesc::Conv {
            geometry: *g,
            pass,
            dtype: DType::F32,
            bias,
        };
        for bias in [true, false] {
            let what = format!("forward bias {bias} {g:?}");
            assert_workspace_is_the_schedule(&gpu, &what, op(ConvPass::Forward, bias), &mut || {
                let b = if bias { Some(&b) } else { None };
                ops::conv2d(&x, &w, b, g, &mut y, Default::default()).unwrap()
            });
        }
        let what = format!("backward data {g:?}");
        assert_workspace_is_the_schedule(
            &gpu,
            &what,
            op(ConvPass::BackwardData, false),
            &mut || ops::conv2d_bwd_data(&dy, &w, g, &mut dx).unwrap(),
        );
    }
}

/// Under `DirectConvs::Winning` (the default) the kernel is timed at calibration against
/// cuDNN's choice in both passes, listed as a candidate with its time, and chosen exactly when
/// faster; the passes then match the CPU whichever runs. Not timed, so not run, with
/// deterministic algorithms, or with `Fp32Convs::Fma`.
#[test]
fn wgmma_conv_is_chosen_by_timing() {
    let g = conv3x3_c64([4, 24, 200, 64], Padding::Same);
    let Some(cuda) = private_cuda_with(Precision::Highest) else {
        return;
    };
    for pass in [ConvPass::Forward, ConvPass::BackwardData] {
        assert!(!cuda.conv_is_direct(&g, DType::F32, pass), "{pass:?}");
        println!("{:#}", assert_timed_choice(&cuda, &g, pass));
    }
    passes_match(&cuda, &g);
    let Some(fixed) = private_cuda_with(Precision::Highest) else {
        return;
    };
    fixed.set_deterministic(true);
    let Some(fma) = private_cuda_with(Precision::Highest) else {
        return;
    };
    fma.set_fp32_convs(Fp32Convs::Fma);
    for be in [&fixed, &fma] {
        for pass in [ConvPass::Forward, ConvPass::BackwardData] {
            let plan = calibrated_plan(be, &g, pass);
            assert!(!be.conv_is_direct(&g, DType::F32, pass), "{plan:#}");
            let timed = plan
                .candidates
                .iter()
                .any(|c| c.algorithm.starts_with("stax"));
            assert!(!timed, "{plan:#}");
        }
    }
}

/// NaNs propagate as in f32: a NaN input position (the GPU's own NaN, 0x7fffffff, and a quiet
/// NaN) makes NaN exactly the outputs whose windows hold it, in both passes (the kernel rounds
/// operands to TF32 by integer arithmetic, which must not turn a NaN into a number).
#[test]
fn wgmma_conv_keeps_nans() {
    let Some(cuda) = private_cuda_with(Precision::Highest) else {
        return;
    };
    cuda.set_direct_convs(DirectConvs::All);
    let g = conv3x3_c64([2, 9, 40, 64], Padding::Same);
    let gpu: Arc<dyn Backend> = cuda.clone();
    let mut rng = Rng::new(seed_for("wgmma_conv_nan", &[]));
    let mut x = rng.vec(g.input_shape().numel(), -1.0, 1.0);
    let mut dy = rng.vec(g.output_shape().numel(), -1.0, 1.0);
    let w = rng.vec(g.filter_shape().numel(), -0.1, 0.1);
    for (i, bits) in [
        (64 * (40 * 4 + 17) + 5, 0x7fff_ffff),
        (64 * (360 + 40 * 7 + 39), 0x7fc0_0000),
    ] {
        x[i] = f32::from_bits(bits);
        dy[i + 64 * 40] = f32::from_bits(bits);
    }
    let run = |be: &Arc<dyn Backend>| {
        let xt = typed(be, &x, g.input_shape().dims(), DType::F32);
        let wt = typed(be, &w, g.filter_shape().dims(), DType::F32);
        let dyt = typed(be, &dy, g.output_shape().dims(), DType::F32);
        let mut y = poisoned(be, g.output_shape(), DType::F32);
        let mut dx = poisoned(be, g.input_shape(), DType::F32);
        ops::conv2d(&xt, &wt, None, &g, &mut y, Default::default()).unwrap();
        ops::conv2d_bwd_data(&dyt, &wt, &g, &mut dx).unwrap();
        [y.to_vec().unwrap(), dx.to_vec().unwrap()]
    };
    let (on_gpu, on_cpu) = (run(&gpu), run(&cpu()));
    for (name, a, b) in [
        ("y", &on_gpu[0], &on_cpu[0]),
        ("dx", &on_gpu[1], &on_cpu[1]),
    ] {
        let nans = |v: &[f32]| v.iter().map(|e| e.is_nan()).collect::<Vec<_>>();
        assert!(nans(b).iter().any(|&n| n), "{name}: the CPU has no NaN");
        assert_eq!(
            nans(a),
            nans(b),
            "{name}: NaN positions differ from the CPU's"
        );
    }
}
