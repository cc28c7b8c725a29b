//! The direct conv kernels (`kernels/direct_conv.cu` in f32 FMAs, `kernels/direct_mma.cu` on
//! the tensor cores for 32 to 128 outputs: convs with at most 32 taps, such as the seed's
//! conv1) against the CPU backend on fresh seeded random inputs, in f32 (full fp32 and TF32),
//! bf16 and f16:
//! the forward pass with and without the bias, with the fused ReLU (its mask bit for bit
//! against the output), the filter and bias gradients with and without the fused ReLU backward
//! (the masked dy bit for bit), on the seed's conv1 shape at a small image and on odd ones
//! (stride 2 with SAME on even sizes, explicit asymmetric padding with dilation, one input
//! channel, 32 taps with 512 outputs and with 64, 16 taps, a 1x1 kernel, positions not a multiple of the kernels' tiles, the seed's
//! 200x200 at 4 images); and their workspace, exactly the schedule. Without a GPU every test
//! prints a skip notice.

mod common;

use common::*;
use stax_tensor::cuda::{CudaBackend, DirectConvs};
use stax_tensor::ops::{self, Epilogue};
use stax_tensor::{
    Activation, Backend, Category, Conv2dGeometry, ConvPass, ConvSpec, DType, OpDesc, Padding,
    Precision, Tensor,
};
use std::sync::Arc;

/// A case: input NHWC `[n, h, w, c_in]`, kernel `(kh, kw)`, `c_out`, strides, padding,
/// dilation.
type Case = (
    [usize; 4],
    (usize, usize),
    usize,
    (usize, usize),
    Padding,
    (usize, usize),
);

/// The cases (see [`Case`]).
fn cases() -> Vec<Conv2dGeometry> {
    let same = Padding::Same;
    let asym = Padding::Explicit([(2, 1), (0, 3)]);
    let table: [Case; 11] = [
        ([2, 12, 11, 3], (3, 3), 64, (1, 1), same, (1, 1)),
        ([3, 10, 10, 3], (3, 3), 32, (2, 2), same, (1, 1)),
        ([2, 9, 13, 2], (3, 3), 256, (1, 2), asym, (2, 2)),
        ([2, 8, 9, 1], (5, 5), 128, (1, 1), Padding::Valid, (1, 1)),
        ([1, 5, 6, 2], (4, 4), 512, (1, 1), same, (1, 1)),
        ([3, 7, 5, 1], (1, 1), 32, (1, 1), Padding::Valid, (1, 1)),
        ([1, 3, 3, 3], (2, 2), 64, (3, 1), same, (1, 2)),
        // the seed's conv1 at 4 images: many tiles a block
        ([4, 200, 200, 3], (3, 3), 64, (1, 1), same, (1, 1)),
        // 32 taps into 64 (the tensor cores' largest patch), 16 taps
        ([2, 7, 9, 2], (4, 4), 64, (1, 1), same, (1, 1)),
        ([3, 6, 5, 4], (2, 2), 128, (2, 1), Padding::Valid, (1, 1)),
        // rows of 35 outputs: segments of 16 and of 8 positions with a short last one
        ([2, 5, 37, 3], (3, 3), 32, (1, 1), Padding::Valid, (1, 1)),
    ];
    table
        .into_iter()
        .map(|(x, (kh, kw), c_out, strides, padding, dilation)| {
            let spec = ConvSpec {
                strides,
                padding,
                dilation,
                ..ConvSpec::default()
            };
            Conv2dGeometry::with_spec(&x.into(), &[kh, kw, x[3], c_out].into(), &spec).unwrap()
        })
        .collect()
}

/// The tolerance of a pass of `g` in `dtype` under `precision`, norm-wise relative: f32 sums
/// of exact products (1e-5, as full fp32), f32 operands rounded to TF32 where the tensor-core
/// kernels take f32 (TF32, 32 to 128 outputs: 10-bit mantissas, 2e-3), else two roundings of
/// the storage type.
fn tolerance(g: &Conv2dGeometry, dtype: DType, precision: Precision) -> f64 {
    let tensor_cores = (32..=128).contains(&g.c_out);
    match dtype {
        DType::BF16 => 2.0 * 2f64.powi(-8),
        DType::F16 => 2.0 * 2f64.powi(-11),
        _ if tensor_cores && precision == Precision::Tf32 => 2e-3,
        _ => 1e-5,
    }
}

/// What one backend computes for `g` in `dtype` from the host inputs `[x, w, b, dy]`: the
/// forward output without and with the bias, the output and mask of the fused ReLU, and the
/// filter gradient, bias gradient and masked dy of the backward pass through `mask` (the CPU's,
/// so both backends mask the same elements), then the filter gradient without a bias or act.
/// The same backward pass with dy consumed (`conv2d_bwd_filter_consuming`, which need not
/// write dy back) must give the same bits.
fn passes(
    be: &Arc<dyn Backend>,
    g: &Conv2dGeometry,
    dtype: DType,
    inputs: &[Vec<f32>; 4],
    mask: Option<&[u32]>,
) -> (Vec<Vec<f32>>, Vec<u32>) {
    let [x, w, b, dy] = inputs;
    let x = typed(be, x, g.input_shape().dims(), dtype);
    let w = typed(be, w, g.filter_shape().dims(), dtype);
    let b = typed(be, b, &[g.c_out], dtype);
    let out = || poisoned(be, g.output_shape(), dtype);
    let (mut y_plain, mut y_bias, mut y_relu) = (out(), out(), out());
    ops::conv2d(&x, &w, None, g, &mut y_plain, Default::default()).unwrap();
    ops::conv2d(&x, &w, &b, g, &mut y_bias, Default::default()).unwrap();
    let words = g.output_shape().numel() / 32;
    let mut m = poisoned(be, [words], DType::U32);
    let epi = Epilogue {
        act: Some(Activation::Relu),
        aux: Some(&mut m),
    };
    ops::conv2d(&x, &w, &b, g, &mut y_relu, epi).unwrap();
    let bits = m.to_vec_u32().unwrap();
    let used = Tensor::from_slice(be, mask.unwrap_or(&bits), [words], Category::Other).unwrap();
    let mut d = typed(be, dy, g.output_shape().dims(), dtype);
    let (mut dw, mut db) = (
        poisoned(be, g.filter_shape(), dtype),
        poisoned(be, [g.c_out], dtype),
    );
    let act = Some((Activation::Relu, &used));
    ops::conv2d_bwd_filter(&x, &mut d, g, &mut dw, &mut db, act).unwrap();
    let consumed = typed(be, dy, g.output_shape().dims(), dtype);
    let (mut dw_c, mut db_c) = (
        poisoned(be, g.filter_shape(), dtype),
        poisoned(be, [g.c_out], dtype),
    );
    ops::conv2d_bwd_filter_consuming(&x, consumed, g, &mut dw_c, &mut db_c, act).unwrap();
    for (kept, consumed) in [(&dw, &dw_c), (&db, &db_c)] {
        let (a, b) = (kept.to_vec().unwrap(), consumed.to_vec().unwrap());
        let same = a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{dtype} {g:?}: dy consumed changes the gradients");
    }
    let mut plain_dy = typed(be, dy, g.output_shape().dims(), dtype);
    let mut dw_plain = poisoned(be, g.filter_shape(), dtype);
    ops::conv2d_bwd_filter(&x, &mut plain_dy, g, &mut dw_plain, None, None).unwrap();
    let host = [
        &y_plain, &y_bias, &y_relu, &dw, &db, &d, &dw_plain, &plain_dy,
    ];
    (host.map(|t| t.to_vec().unwrap()).to_vec(), bits)
}

const NAMES: [&str; 8] = [
    "forward",
    "forward + bias",
    "forward + bias + relu",
    "filter grad (relu bwd fused)",
    "bias grad (relu bwd fused)",
    "masked dy",
    "filter grad, no bias",
    "dy without act (untouched)",
];

/// Every pass of every case on `cuda` (of `precision`) matches the CPU; the mask is the GPU
/// output's sign.
fn direct_passes_match(cuda: &Arc<CudaBackend>, precision: Precision) {
    for g in &cases() {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for pass in [ConvPass::Forward, ConvPass::BackwardFilter] {
                let direct = cuda.conv_is_direct(g, dtype, pass);
                assert!(direct, "{dtype} {pass:?} {g:?} is not direct");
            }
            passes_match(cuda, g, dtype, tolerance(g, dtype, precision));
        }
    }
}

/// [`passes`] of `g` in `dtype` on `cuda` match the CPU's within `tol` (norm-wise relative;
/// the masked dy and the untouched dy exactly); the mask is the GPU output's sign.
fn passes_match(cuda: &Arc<CudaBackend>, g: &Conv2dGeometry, dtype: DType, tol: f64) {
    let gpu: Arc<dyn Backend> = cuda.clone();
    let cpu = cpu();
    let what = |pass: &str| format!("{dtype} {pass} {g:?}");
    let mut rng = Rng::new(seed_for("direct", &[g.n, g.h, g.w, g.c_in, g.c_out]));
    let inputs = [
        rng.vec(g.input_shape().numel(), -1.0, 1.0),
        rng.vec(g.filter_shape().numel(), -1.0, 1.0),
        rng.vec(g.c_out, -0.5, 0.5),
        rng.vec(g.output_shape().numel(), -1.0, 1.0),
    ];
    let (on_cpu, cpu_bits) = passes(&cpu, g, dtype, &inputs, None);
    let (on_gpu, gpu_bits) = passes(&gpu, g, dtype, &inputs, Some(&cpu_bits));
    for (i, y) in on_gpu[2].iter().enumerate() {
        let bit = gpu_bits[i / 32] >> (i % 32) & 1 == 1;
        assert_eq!(bit, *y > 0.0, "{}: mask bit {i} vs y {y}", what("mask"));
    }
    for (i, name) in NAMES.iter().enumerate() {
        let (a, b) = (&on_gpu[i], &on_cpu[i]);
        assert!(a.iter().all(|v| v.is_finite()), "{}", what(name));
        match i {
            5 | 7 => assert_close(a, b, 0.0, 0.0, &what(name)),
            _ => {
                let e = assert_rel_close(a, b, tol, &what(name));
                println!("{}: rel {e:.2e}", what(name));
            }
        }
    }
}

#[test]
fn direct_convs_match_the_cpu() {
    let Some(cuda) = private_cuda_with(Precision::Highest) else {
        return;
    };
    cuda.set_direct_convs(DirectConvs::All);
    direct_passes_match(&cuda, Precision::Highest);
}

/// Under TF32 the f32 passes of 32 to 128 outputs run on the tensor cores: the CPU's results
/// within TF32's rounding. Untimed, each pass is listed by `conv_plans` as the direct kernel
/// with its arithmetic.
#[test]
fn direct_convs_match_the_cpu_under_tf32() {
    let Some(cuda) = private_cuda_with(Precision::Tf32) else {
        return;
    };
    cuda.set_direct_convs(DirectConvs::All);
    direct_passes_match(&cuda, Precision::Tf32);
    let plans = cuda.conv_plans();
    for g in &cases() {
        for pass in [ConvPass::Forward, ConvPass::BackwardFilter] {
            let listed = plans
                .iter()
                .find(|p| p.geometry == *g && p.dtype == DType::F32 && p.pass == pass);
            let p = listed.unwrap_or_else(|| panic!("no plan for {pass:?} {g:?}"));
            assert!(p.algorithm.starts_with("stax direct"), "{p}");
            let tensor_cores = (32..=128).contains(&g.c_out);
            assert_eq!(p.math.starts_with("TF32 tensor cores"), tensor_cores, "{p}");
            assert!(p.time_ms.is_nan() && p.candidates.is_empty(), "{p}");
        }
    }
}

/// With the epilogues unfused the direct forward runs the bias and ReLU as their own passes and
/// the filter gradient masks dy first: the same results.
#[test]
fn direct_convs_match_the_cpu_with_the_epilogues_unfused() {
    let Some(cuda) = private_cuda_with(Precision::Tf32) else {
        return;
    };
    cuda.set_fused_epilogues(false);
    cuda.set_direct_convs(DirectConvs::All);
    direct_passes_match(&cuda, Precision::Tf32);
}

/// Whether [`DirectConvs::Winning`] runs `pass` of `g` in `dtype` under `precision` without
/// timing it: the f32 forward pass under full fp32, and the passes of the tensor-core kernels
/// (bf16, f16, f32 under TF32; 32 to 128 outputs).
fn by_rule(g: &Conv2dGeometry, dtype: DType, pass: ConvPass, precision: Precision) -> bool {
    let tensor_cores =
        (32..=128).contains(&g.c_out) && (dtype != DType::F32 || precision == Precision::Tf32);
    let fma = pass == ConvPass::Forward && dtype == DType::F32 && precision == Precision::Highest;
    pass != ConvPass::BackwardData && (tensor_cores || fma)
}

/// The modes before any calibration: off, no pass is direct; winning (the default), the passes
/// of its rule ([`by_rule`]; the others are timed at calibration, below); all, forward and
/// filter gradient in every float dtype. Never backward data.
#[test]
fn direct_conv_modes_choose_their_passes() {
    for precision in [Precision::Highest, Precision::Tf32] {
        let Some(cuda) = private_cuda_with(precision) else {
            return;
        };
        assert_eq!(cuda.direct_convs(), DirectConvs::Winning);
        for mode in [DirectConvs::Off, DirectConvs::Winning, DirectConvs::All] {
            cuda.set_direct_convs(mode);
            for g in &cases() {
                for dtype in [DType::F32, DType::BF16, DType::F16] {
                    for pass in [
                        ConvPass::Forward,
                        ConvPass::BackwardData,
                        ConvPass::BackwardFilter,
                    ] {
                        let want = match mode {
                            DirectConvs::Off => false,
                            DirectConvs::Winning => by_rule(g, dtype, pass, precision),
                            DirectConvs::All => pass != ConvPass::BackwardData,
                        };
                        let got = cuda.conv_is_direct(g, dtype, pass);
                        assert_eq!(got, want, "{mode:?} {precision:?} {dtype} {pass:?} {g:?}");
                    }
                }
            }
        }
        // outside what the kernels take: 33 taps, 96 outputs (not a power of two), NCHW
        cuda.set_direct_convs(DirectConvs::All);
        let spec = ConvSpec::default();
        for (x, w) in [
            ([1, 6, 6, 11], [3, 1, 11, 64]),
            ([1, 6, 6, 3], [3, 3, 3, 96]),
        ] {
            let g = Conv2dGeometry::with_spec(&x.into(), &w.into(), &spec).unwrap();
            assert!(
                !cuda.conv_is_direct(&g, DType::F32, ConvPass::Forward),
                "{g:?}"
            );
        }
        let nchw = ConvSpec {
            layout: stax_tensor::Layout::Nchw,
            filter: stax_tensor::FilterLayout::Oihw,
            ..spec
        };
        let g =
            Conv2dGeometry::with_spec(&[1, 3, 6, 6].into(), &[64, 3, 3, 3].into(), &nchw).unwrap();
        assert!(
            !cuda.conv_is_direct(&g, DType::F32, ConvPass::Forward),
            "{g:?}"
        );
    }
}

/// A direct forward pass allocates no workspace and a direct filter gradient exactly its
/// partials, with and without a bias: the schedule, to the byte and in order.
#[test]
fn direct_workspace_is_the_schedule() {
    let Some(cuda) = private_cuda_with(Precision::Tf32) else {
        return;
    };
    cuda.set_direct_convs(DirectConvs::All);
    let gpu: Arc<dyn Backend> = cuda;
    let mut rng = Rng::new(seed_for("direct_workspace", &[]));
    for g in &cases()[..2] {
        let op = OpDesc::Conv {
            geometry: *g,
            pass: ConvPass::Forward,
            dtype: DType::F32,
            bias: true,
        };
        let fwd = gpu.workspace_schedule(&op).unwrap();
        assert!(fwd.is_empty(), "{g:?}: {fwd:?}");
        schedules_hold(&gpu, g, "direct", &mut rng, true);
    }
}

/// On fresh operands of `g`, the forward pass with a bias and the filter gradient with one
/// (and, with `no_bias`, without) each allocate exactly their workspace schedule.
fn schedules_hold(
    gpu: &Arc<dyn Backend>,
    g: &Conv2dGeometry,
    what: &str,
    rng: &mut Rng,
    no_bias: bool,
) {
    let (x, _) = random_tensor(gpu, g.input_shape(), rng);
    let (w, _) = random_tensor(gpu, g.filter_shape(), rng);
    let (b, _) = random_tensor(gpu, [g.c_out], rng);
    let (dy, _) = random_tensor(gpu, g.output_shape(), rng);
    let mut y = poisoned(gpu, g.output_shape(), DType::F32);
    let mut dw = poisoned(gpu, g.filter_shape(), DType::F32);
    let mut db = poisoned(gpu, [g.c_out], DType::F32);
    let op = |pass, bias| OpDesc::Conv {
        geometry: *g,
        pass,
        dtype: DType::F32,
        bias,
    };
    let check = |name: &str, op, run: &mut dyn FnMut()| {
        assert_workspace_is_the_schedule(gpu, &format!("{what} {name} {g:?}"), op, run)
    };
    check("fwd", op(ConvPass::Forward, true), &mut || {
        ops::conv2d(&x, &w, &b, g, &mut y, Default::default()).unwrap()
    });
    check(
        "bwd filter",
        op(ConvPass::BackwardFilter, true),
        &mut || ops::conv2d_bwd_filter(&x, &mut dy.clone(), g, &mut dw, &mut db, None).unwrap(),
    );
    if no_bias {
        check(
            "bwd filter no bias",
            op(ConvPass::BackwardFilter, false),
            &mut || ops::conv2d_bwd_filter(&x, &mut dy.clone(), g, &mut dw, None, None).unwrap(),
        );
    }
}

/// Under [`DirectConvs::Winning`] calibration times the FMA kernel against cuDNN's choice for
/// the forward pass and the filter gradient outside its rule (in TF32: 256 and 512 outputs):
/// the report lists it as a candidate with its time, the
/// faster of the two is chosen and is what runs (its workspace exactly the schedule); with
/// deterministic algorithms nothing is timed and the rule alone applies. A pass run before
/// any calibration (the ops API alone) calibrates, then runs the choice, matching the CPU.
#[test]
fn winning_times_the_kernel_at_calibration() {
    let Some(cuda) = private_cuda_with(Precision::Tf32) else {
        return;
    };
    let geometries = [cases()[2], cases()[4]];
    for g in &geometries {
        for pass in [ConvPass::Forward, ConvPass::BackwardFilter] {
            assert!(
                !by_rule(g, DType::F32, pass, Precision::Tf32),
                "{pass:?} {g:?}"
            );
            let plan = assert_timed_choice(&cuda, g, pass);
            let is_direct = |name: &str| name.starts_with("stax direct");
            let ms = plan
                .candidates
                .iter()
                .find_map(|c| c.time_ms.filter(|_| is_direct(&c.algorithm)))
                .expect("the kernel was timed");
            assert!(ms > 0.0 && ms.is_finite(), "{ms}");
            // cuDNN's candidates it could choose (the search also times those over the limit)
            let best_cudnn = plan
                .candidates
                .iter()
                .filter(|c| {
                    !is_direct(&c.algorithm)
                        && c.status.starts_with("CUDNN_STATUS_SUCCESS")
                        && c.workspace_bytes <= cuda.workspace_limit()
                })
                .filter_map(|c| c.time_ms)
                .fold(f32::INFINITY, f32::min);
            if is_direct(&plan.algorithm) {
                assert!(ms < best_cudnn, "{plan:#}");
            }
        }
        let gpu: Arc<dyn Backend> = cuda.clone();
        let mut rng = Rng::new(seed_for("winning_direct", &[g.n, g.h]));
        schedules_hold(&gpu, g, "winning", &mut rng, false);
    }
    // a pass run before any calibration calibrates first and then runs what was chosen
    let Some(fresh) = private_cuda_with(Precision::Tf32) else {
        return;
    };
    for g in [cases()[2], cases()[4]] {
        // TF32 where cuDNN keeps a pass: operands rounded to 10 mantissa bits
        passes_match(&fresh, &g, DType::F32, 2e-3);
        for pass in [ConvPass::Forward, ConvPass::BackwardFilter] {
            let chosen = fresh
                .conv_plans()
                .into_iter()
                .find(|p| p.geometry == g && p.pass == pass);
            let direct = chosen.is_some_and(|p| p.algorithm.starts_with("stax direct"));
            assert_eq!(
                fresh.conv_is_direct(&g, DType::F32, pass),
                direct,
                "{pass:?} {g:?}"
            );
        }
    }
    let Some(fixed) = private_cuda_with(Precision::Tf32) else {
        return;
    };
    fixed.set_deterministic(true);
    let (g, seed) = (cases()[2], seed_conv1(10));
    for pass in [ConvPass::Forward, ConvPass::BackwardFilter] {
        let op = |geometry| OpDesc::Conv {
            geometry,
            pass,
            dtype: DType::F32,
            bias: true,
        };
        fixed.calibrate(&op(g)).unwrap();
        fixed.calibrate(&op(seed)).unwrap();
        assert!(!fixed.conv_is_direct(&g, DType::F32, pass), "{pass:?}");
        // the tensor-core kernels by the rule
        assert!(fixed.conv_is_direct(&seed, DType::F32, pass), "{pass:?}");
    }
    let plans = fixed.conv_plans();
    assert!(
        plans.iter().all(|p| p
            .candidates
            .iter()
            .all(|c| !c.algorithm.starts_with("stax direct"))),
        "nothing timed when deterministic"
    );
}

/// The seed's conv1 (3x3 SAME, 3 -> 64 channels) on `n` images of 200x200.
fn seed_conv1(n: usize) -> Conv2dGeometry {
    let same = ConvSpec {
        padding: Padding::Same,
        ..ConvSpec::default()
    };
    Conv2dGeometry::with_spec(&[n, 200, 200, 3].into(), &[3, 3, 3, 64].into(), &same).unwrap()
}
