//! The wgmma filter gradient (`kernels/wgrad_wgmma.cu`: a 3x3, stride-1 conv from 64 to 64
//! channels in f32 on Hopper's warpgroup tensor cores, under TF32 and in full fp32 as 3xTF32)
//! against the CPU backend on fresh seeded random inputs: the filter and bias gradients with
//! the ReLU backward fused (the masked dy bit for bit), with dy consumed (the same bits), and
//! without bias or activation (dy untouched), on SAME, VALID and asymmetric padding, one pixel,
//! rows of 1 to 5 strips (the seed's 200 columns in the widest tiles, 40 columns; ResNet-50's
//! 56); each pass's workspace is exactly its schedule; under `DirectConvs::Winning`
//! calibration times the kernel against cuDNN's choice and runs the faster, in both
//! precisions; long sums (524,288 products a weight) in full fp32 within the CPU's own f32
//! error. Without a GPU every test prints a skip notice.

mod common;

use common::*;
use stax_tensor::cuda::{ConvPlanInfo, CudaBackend, DirectConvs, Fp32Convs};
use stax_tensor::ops;
use stax_tensor::{
    Activation, Backend, BackendOptions, Category, Conv2dGeometry, ConvPass, ConvSpec, DType,
    OpDesc, Padding, Precision, Tensor,
};
use std::sync::Arc;

fn cases() -> Vec<Conv2dGeometry> {
    let (same, valid) = (Padding::Same, Padding::Valid);
    vec![
        conv3x3_c64([2, 9, 40, 64], same),
        conv3x3_c64([1, 7, 61, 64], same),
        conv3x3_c64([3, 5, 13, 64], valid),
        conv3x3_c64([1, 1, 1, 64], same),
        conv3x3_c64([2, 12, 200, 64], same),
        conv3x3_c64([1, 20, 56, 64], same),
        conv3x3_c64([1, 4, 97, 64], valid),
        conv3x3_c64([2, 6, 5, 64], Padding::Explicit([(2, 0), (1, 2)])),
        // more tiles than blocks: the cp.async pipeline, the slot rings, strips split
        // between blocks mid-row
        conv3x3_c64([3, 40, 56, 64], same),
        conv3x3_c64([4, 30, 97, 64], Padding::Explicit([(1, 0), (0, 2)])),
    ]
}

/// On `be`, from host `[x, dy]` and the ReLU mask `bits`: dw and db with the ReLU backward
/// (and dy masked in place), the same with dy consumed (asserted to give the same bits), and dw
/// with neither bias nor activation (and its dy, untouched).
fn grads(
    be: &Arc<dyn Backend>,
    g: &Conv2dGeometry,
    inputs: &[Vec<f32>; 2],
    bits: &[u32],
) -> [Vec<f32>; 5] {
    let [x, dy] = inputs;
    let x = typed(be, x, g.input_shape().dims(), DType::F32);
    let mask = Tensor::from_slice(be, bits, [bits.len()], Category::Other).unwrap();
    let act = Some((Activation::Relu, &mask));
    let new_grads = || {
        (
            poisoned(be, g.filter_shape(), DType::F32),
            poisoned(be, [g.c_out], DType::F32),
        )
    };
    let mut d = typed(be, dy, g.output_shape().dims(), DType::F32);
    let (mut dw, mut db) = new_grads();
    ops::conv2d_bwd_filter(&x, &mut d, g, &mut dw, &mut db, act).unwrap();
    let consumed = typed(be, dy, g.output_shape().dims(), DType::F32);
    let (mut dw_c, mut db_c) = new_grads();
    ops::conv2d_bwd_filter_consuming(&x, consumed, g, &mut dw_c, &mut db_c, act).unwrap();
    for (kept, consumed) in [(&dw, &dw_c), (&db, &db_c)] {
        let (a, b) = (kept.to_vec().unwrap(), consumed.to_vec().unwrap());
        let same = a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{g:?}: dy consumed changes the gradients");
    }
    let mut plain_dy = typed(be, dy, g.output_shape().dims(), DType::F32);
    let (mut dw_plain, _) = new_grads();
    ops::conv2d_bwd_filter(&x, &mut plain_dy, g, &mut dw_plain, None, None).unwrap();
    [&dw, &db, &d, &dw_plain, &plain_dy].map(|t| t.to_vec().unwrap())
}

/// The precisions the kernel runs in: the plan's name of its arithmetic and the gradients'
/// norm-wise tolerance against the CPU's exact f32: TF32's rounding (2e-3: operands with
/// 10-bit mantissas), and 3xTF32's, about f32's (1e-5: each operand's TF32 rounding and the
/// rounded rest, only the product of the two rests dropped, about 2^-22 of each product).
const PRECISIONS: [(Precision, &str, f64); 2] = [
    (Precision::Tf32, "TF32 tensor cores (wgmma), f32 sums", 2e-3),
    (
        Precision::Highest,
        "3xTF32 tensor cores (wgmma), f32 sums",
        1e-5,
    ),
];

/// [`grads`] of `g` on `cuda` match the CPU's: the gradients norm-wise within `tol`, the
/// masked and the untouched dy exactly.
fn grads_match(cuda: &Arc<CudaBackend>, g: &Conv2dGeometry, tol: f64) {
    let mut rng = Rng::new(seed_for("wgmma_wgrad", &[g.n, g.h, g.w, g.pad_top]));
    let inputs = [
        rng.vec(g.input_shape().numel(), -1.0, 1.0),
        rng.vec(g.output_shape().numel(), -1.0, 1.0),
    ];
    let words = g.output_shape().numel() / 32;
    let bits: Vec<u32> = (0..words).map(|_| rng.next_u64() as u32).collect();
    let gpu: Arc<dyn Backend> = cuda.clone();
    let on_gpu = grads(&gpu, g, &inputs, &bits);
    let on_cpu = grads(&cpu(), g, &inputs, &bits);
    let names = [
        "dw (relu bwd)",
        "db (relu bwd)",
        "masked dy",
        "dw plain",
        "dy untouched",
    ];
    for (i, name) in names.iter().enumerate() {
        let what = format!("{name} {g:?}");
        let (a, b) = (&on_gpu[i], &on_cpu[i]);
        assert!(a.iter().all(|v| v.is_finite()), "{what}");
        match i {
            2 | 4 => assert_close(a, b, 0.0, 0.0, &what),
            _ => println!("{what}: rel {:.2e}", assert_rel_close(a, b, tol, &what)),
        }
    }
}

/// In both precisions every case runs the wgmma kernel (its plan says so) and matches the CPU;
/// its workspace is the schedule; a 32-channel conv stays on cuDNN, as does the forward pass
/// but in full fp32 (`gpu_wgmma_conv`).
#[test]
fn wgmma_filter_grad_matches_the_cpu() {
    for (precision, math, tol) in PRECISIONS {
        let Some(cuda) = private_cuda_with(precision) else {
            return;
        };
        matches_the_cpu(&cuda, math, tol);
    }
}

/// [`wgmma_filter_grad_matches_the_cpu`] on `cuda`, its plans naming `math`.
fn matches_the_cpu(cuda: &Arc<CudaBackend>, math: &str, tol: f64) {
    cuda.set_direct_convs(DirectConvs::All);
    for g in &cases() {
        assert!(
            cuda.conv_is_direct(g, DType::F32, ConvPass::BackwardFilter),
            "{g:?}"
        );
        // the forward pass is direct only in full fp32 (conv_wgmma.cu, rows of 15 or more)
        let forward = cuda.precision() == Precision::Highest && g.out_w >= 15;
        assert_eq!(
            cuda.conv_is_direct(g, DType::F32, ConvPass::Forward),
            forward,
            "{g:?}"
        );
        assert!(
            !cuda.conv_is_direct(g, DType::BF16, ConvPass::BackwardFilter),
            "{g:?}"
        );
        grads_match(cuda, g, tol);
    }
    let plans = cuda.conv_plans();
    for g in &cases() {
        let p = plans
            .iter()
            .find(|p| p.geometry == *g && p.pass == ConvPass::BackwardFilter)
            .unwrap_or_else(|| panic!("no plan for {g:?}"));
        assert_eq!(p.math, math, "{p}");
        assert!(p.algorithm.starts_with("stax direct"), "{p}");
    }
    let gpu: Arc<dyn Backend> = cuda.clone();
    let mut rng = Rng::new(seed_for("wgmma_workspace", &[]));
    for g in &cases()[..2] {
        for bias in [true, false] {
            let op = OpDesc::Conv {
                geometry: *g,
                pass: ConvPass::BackwardFilter,
                dtype: DType::F32,
                bias,
            };
            let (x, _) = random_tensor(&gpu, g.input_shape(), &mut rng);
            let (dy, _) = random_tensor(&gpu, g.output_shape(), &mut rng);
            let mut dw = poisoned(&gpu, g.filter_shape(), DType::F32);
            let mut db = poisoned(&gpu, [g.c_out], DType::F32);
            let what = format!("wgmma bias {bias} {g:?}");
            assert_workspace_is_the_schedule(&gpu, &what, op, &mut || {
                let db = if bias { Some(&mut db) } else { None };
                ops::conv2d_bwd_filter(&x, &mut dy.clone(), g, &mut dw, db, None).unwrap()
            });
        }
    }
    let narrow = Conv2dGeometry::with_spec(
        &[1, 6, 6, 32].into(),
        &[3, 3, 32, 64].into(),
        &ConvSpec::default(),
    )
    .unwrap();
    assert!(!cuda.conv_is_direct(&narrow, DType::F32, ConvPass::BackwardFilter));
}

/// In both precisions, under `DirectConvs::Winning` (the default) the kernel is timed at
/// calibration against cuDNN's choice, listed as a candidate with its time, and chosen exactly
/// when faster; the pass then matches the CPU whichever runs. Not timed, so not run, with
/// deterministic algorithms, under a limit below its partials, or in full fp32 with
/// `Fp32Convs::Fma`.
#[test]
fn wgmma_filter_grad_is_chosen_by_timing() {
    let g = conv3x3_c64([4, 24, 200, 64], Padding::Same);
    for (precision, _, tol) in PRECISIONS {
        let Some(cuda) = private_cuda_with(precision) else {
            return;
        };
        chosen_by_timing(&cuda, g, tol);
        let Some(fixed) = private_cuda_with(precision) else {
            return;
        };
        fixed.set_deterministic(true);
        calibrated_plan(&fixed, &g, ConvPass::BackwardFilter);
        assert!(!fixed.conv_is_direct(&g, DType::F32, ConvPass::BackwardFilter));
        // a workspace limit below one block's partials leaves the pass on cuDNN, untimed
        let limit = 577 * 64 * 8 - 1;
        let options = BackendOptions {
            workspace_limit: Some(limit),
            ..with_precision(precision)
        };
        let Some(tight) = cuda_backend_or_skip(&options) else {
            return;
        };
        let plan = calibrated_plan(&tight, &g, ConvPass::BackwardFilter);
        assert!(!tight.conv_is_direct(&g, DType::F32, ConvPass::BackwardFilter));
        assert!(!timed(&plan) && plan.workspace_bytes <= limit, "{plan:#}");
    }
    // `--fp32-convs fma` keeps full fp32 on cuDNN's FMA algorithms: the kernel is not timed
    let Some(fma) = private_cuda_with(Precision::Highest) else {
        return;
    };
    fma.set_fp32_convs(Fp32Convs::Fma);
    let plan = calibrated_plan(&fma, &g, ConvPass::BackwardFilter);
    assert!(!fma.conv_is_direct(&g, DType::F32, ConvPass::BackwardFilter));
    assert!(!timed(&plan) && plan.math.contains("FMA"), "{plan:#}");
}

/// Whether `plan` lists a direct kernel among its candidates (it was timed).
fn timed(plan: &ConvPlanInfo) -> bool {
    plan.candidates
        .iter()
        .any(|c| c.algorithm.starts_with("stax direct"))
}

/// [`wgmma_filter_grad_is_chosen_by_timing`] of `g` on `cuda`, the gradients within `tol`.
fn chosen_by_timing(cuda: &Arc<CudaBackend>, g: Conv2dGeometry, tol: f64) {
    assert!(!cuda.conv_is_direct(&g, DType::F32, ConvPass::BackwardFilter));
    let plan = assert_timed_choice(cuda, &g, ConvPass::BackwardFilter);
    println!("{plan:#}");
    grads_match(cuda, &g, tol);
}

/// Long sums in full fp32: 524,288 products a weight (32x128x128), about 4,000 positions a
/// block summed in the tensor cores' f32 accumulators. The CPU's own f32 sums are about
/// sqrt(n) x 6e-8 = 4e-5 off at this length, so 1e-4 (as `gpu_convs` allows cuDNN here).
#[test]
fn long_sums_in_full_fp32_match_the_cpu() {
    let Some(cuda) = private_cuda_with(Precision::Highest) else {
        return;
    };
    cuda.set_direct_convs(DirectConvs::All);
    let g = conv3x3_c64([32, 128, 128, 64], Padding::Same);
    assert!(cuda.conv_is_direct(&g, DType::F32, ConvPass::BackwardFilter));
    grads_match(&cuda, &g, 1e-4);
}
