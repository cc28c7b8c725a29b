//! The dense layer's weight gradient consumed by Adam as it is made (`ops::dense_adam`): the
//! GPU equals the CPU on fresh random inputs, over several chunks and a partial one, for every
//! way of writing the input gradient, in f32, bf16 and f16; its workspace is its schedule on
//! both backends; training with it equals training with every gradient collected, in f32 and
//! (bit for bit) under the bf16 policy with every step's peak equal to its plan, on the CPU;
//! f16 with loss scaling still collects the dense weight's gradient.

mod common;

use common::{
    Rng, assert_rel_close, assert_workspace_is_the_schedule, cpu, cuda_or_skip, on_both, poisoned,
    private_cuda_with, seed_for, with_precision,
};
use stax::tensor::backend::DenseDx;
use stax::{Adam, Backend, Category, DType, Precision, Tensor};
use stax_tensor::{AdamHyper, OpDesc, WorkspaceStep, ops};
use std::sync::Arc;

/// Adam(1e-3)'s hyper-parameters at step 2.
fn hyper() -> AdamHyper {
    Adam::new(1e-3).hyper(2)
}

#[test]
fn gpu_dense_adam_matches_cpu() {
    let Some(gpu) = private_cuda_with(Precision::Highest) else {
        return;
    };
    let cpu = cpu();
    // (m, n, k), the way dx is written: chunks of 64 MiB of gradient (70,000 rows of 300 are
    // two, the second partial), one chunk, a batch of one row, the seed's shape at batch 10
    // (once only read, once in place) and 64; the one-pass kernel's edges (16 rows, one
    // output, 100 outputs in k = 65 rows: two groups of 32 and a partial one) and just past
    // them (17 rows, 129 outputs: chunks); more groups of 32 weight rows than the rows
    // kernel's grid has warps (700,001 rows: a warp takes several, the last partial), and 124
    // outputs.
    let cases = [
        ((3, 4, 700_001), 1),
        ((12, 124, 333), 2),
        ((100, 300, 70_000), 0),
        ((1, 3, 100), 1),
        ((3, 5, 77), 1),
        ((10, 128, 40_000), 2),
        ((10, 128, 40_000), 0),
        ((64, 128, 5_000), 0),
        ((16, 128, 3_001), 1),
        ((2, 1, 31), 0),
        ((7, 100, 65), 1),
        ((17, 128, 500), 1),
        ((5, 129, 500), 0),
    ];
    for rows_kernel in [true, false] {
        gpu.set_dense_adam_rows(rows_kernel);
        for ((m, n, k), mode) in cases {
            let gpu: Arc<dyn Backend> = gpu.clone();
            let what = format!("dense_adam m{m} n{n} k{k} mode {mode}, rows kernel {rows_kernel}");
            dense_adam_agrees(&gpu, &cpu, (m, n, k), mode, FULL_F32, &what);
        }
    }
}

/// Under full fp32 with `set_fp32_dense_chunks_3xtf32(true)` the chunks take both products
/// from our 3xTF32 kernel (`dense_grads_x3`) for 1 to 128 rows into a multiple of 8 up to 128
/// outputs, else (and with the setting off, the default) cuBLAS's f32 GEMMs: both agree with the CPU's f32 within full
/// fp32's tolerance at the seed's shape at batch 100 over two chunks (the second partial, its
/// last 16-row strip too), one row into 8 outputs, 128 rows, batches no multiple of 8, with dx
/// in place, into its own tensor and not computed. Past the kernel's edges (124 and 136
/// outputs, 129 rows, bf16) the chunks stay on cuBLAS.
#[test]
fn gpu_fp32_chunks_in_3xtf32_match_cpu() {
    let Some(gpu) = private_cuda_with(Precision::Highest) else {
        return;
    };
    gpu.set_dense_adam_rows(false);
    let cpu = cpu();
    let cases = [
        ((100, 128, 140_007), 0),
        ((100, 128, 140_007), 1),
        ((1, 8, 1_000), 1),
        ((128, 128, 3_000), 0),
        ((37, 120, 2_001), 2),
        ((17, 64, 999), 1),
    ];
    assert!(!gpu.dense_chunks_x3(100, 128, DType::F32), "off by default");
    let mut taken = 0;
    for x3 in [true, false] {
        gpu.set_fp32_dense_chunks_3xtf32(x3);
        for ((m, n, k), mode) in cases {
            let kernel = gpu.dense_chunks_x3(m, n, DType::F32);
            assert!(x3 || !kernel, "m{m} n{n}: off, the chunks stay on cuBLAS");
            taken += kernel as usize;
            let gpu: Arc<dyn Backend> = gpu.clone();
            let what = format!("fp32 chunks m{m} n{n} k{k} mode {mode}, 3xTF32 {x3}");
            dense_adam_agrees(&gpu, &cpu, (m, n, k), mode, FULL_F32, &what);
        }
    }
    // every case fits a block's shared memory on Hopper and the A100 (all six take the
    // kernel); a 99 KiB device (sm_86, sm_89) takes the three up to 37 rows
    assert!(taken >= 3, "{taken} of the cases took the 3xTF32 kernel");
    gpu.set_fp32_dense_chunks_3xtf32(true);
    for (m, n) in [(100, 124), (100, 136), (129, 128)] {
        assert!(!gpu.dense_chunks_x3(m, n, DType::F32), "m{m} n{n}");
    }
    assert!(!gpu.dense_chunks_x3(100, 128, DType::BF16));
    let tf32 = private_cuda_with(Precision::Tf32).unwrap();
    tf32.set_fp32_dense_chunks_3xtf32(true);
    assert!(!tf32.dense_chunks_x3(100, 128, DType::F32));
}

/// Under TF32 a batch of 1 to 16 rows runs the rows kernel too, whose dw and dx are exact f32
/// sums and whose Adam step is `adam_tf32`'s (the tensor-core pass's: within a few ulp of
/// `adam_one`; the chunks would take cuBLAS's TF32 GEMMs): it agrees with the CPU's f32 within
/// full fp32's tolerance, at the seed's shape at batch 10, one row, 16
/// rows over a partial group of 32 weight rows, and odd output counts, with dx in place, into
/// its own tensor and not computed.
#[test]
fn gpu_tf32_rows_kernel_matches_cpu() {
    let Some(gpu) = private_cuda_with(Precision::Tf32) else {
        return;
    };
    let cpu = cpu();
    let cases = [
        ((10, 128, 40_000), 0),
        ((1, 3, 100), 1),
        ((16, 128, 3_001), 1),
        ((7, 100, 65), 2),
        ((3, 5, 77), 0),
    ];
    for ((m, n, k), mode) in cases {
        assert!(gpu.dense_adam_is_rows(m, n, DType::F32), "m{m} n{n}");
        let be: Arc<dyn Backend> = gpu.clone();
        let what = format!("TF32 rows kernel m{m} n{n} k{k} mode {mode}");
        dense_adam_agrees(&be, &cpu, (m, n, k), mode, FULL_F32, &what);
    }
}

/// How a GPU update is checked against the CPU's f32: norm-wise relative tolerances of w, mu,
/// nu and dx, and the least nu drawn (nu is drawn from [nu_min, 1)).
#[derive(Clone, Copy)]
struct Check {
    tol: [f64; 4],
    nu_min: f32,
}
/// Full fp32 on the GPU: f32 sums in other orders.
const FULL_F32: Check = Check {
    tol: [1e-5; 4],
    nu_min: 0.0,
};
/// TF32 products (operands rounded to 10 bits, about 5e-4 norm-wise in dw and dx): mu takes a
/// tenth of dw's error and nu a thousandth of its square's; the weight moves by lr (1e-3) times
/// m / sqrt(v), which TF32 changes by about 1e-3, so it must still agree to 1e-5 (a wrong
/// column's gradient moves it by 2 lr, 3e-3 of its scale). Where v is near 0 that ratio is
/// unbounded and a gradient near 0 (cancellation) has no relative precision, so nu is drawn
/// from [0.1, 1): measured, one weight of 9 million moved by 2.2 with nu from [0, 1).
const TF32: Check = Check {
    tol: [1e-5, 3e-3, 1e-3, 3e-3],
    nu_min: 0.1,
};

/// One `dense_adam` on fresh random inputs on `gpu` and on the CPU; dx in place (`mode` 0),
/// into its own tensor (1) or not computed (2): w, mu, nu and dx agree as `check` says.
fn dense_adam_agrees(
    gpu: &Arc<dyn Backend>,
    cpu: &Arc<dyn Backend>,
    (m, n, k): (usize, usize, usize),
    mode: u8,
    check: Check,
    what: &str,
) {
    let mut rng = Rng::new(seed_for("dense_adam", &[m, n, k, mode as usize]));
    let mut both = |rows, cols, lo: f32| {
        let v = rng.vec(rows * cols, lo, 1.0);
        on_both(gpu, cpu, &v, [rows, cols])
    };
    let (mut xg, mut xc) = both(m, k, -1.0);
    let (dyg, dyc) = both(m, n, -1.0);
    let (mut wg, mut wc) = both(k, n, -1.0);
    let (mut mug, mut muc) = both(k, n, -1.0);
    let (mut nug, mut nuc) = both(k, n, check.nu_min);
    let mut dxg = poisoned(gpu, [m, k], DType::F32);
    let mut dxc = Tensor::empty(cpu, [m, k], DType::F32, stax::Category::Other).unwrap();
    let (dx_g, dx_c) = match mode {
        0 => (DenseDx::InPlace, DenseDx::InPlace),
        1 => (DenseDx::Into(&mut dxg), DenseDx::Into(&mut dxc)),
        _ => (DenseDx::Skip, DenseDx::Skip),
    };
    ops::dense_adam(&mut xg, &dyg, &mut wg, &mut mug, &mut nug, dx_g, &hyper()).unwrap();
    ops::dense_adam(&mut xc, &dyc, &mut wc, &mut muc, &mut nuc, dx_c, &hyper()).unwrap();
    let pairs = [(&wg, &wc, "w"), (&mug, &muc, "mu"), (&nug, &nuc, "nu")];
    for ((g, c, name), tol) in pairs.into_iter().zip(check.tol) {
        let (g, c) = (g.to_vec().unwrap(), c.to_vec().unwrap());
        assert_rel_close(&g, &c, tol, &format!("{name} of {what}"));
    }
    let (g, c) = match mode {
        1 => (dxg.to_vec().unwrap(), dxc.to_vec().unwrap()),
        _ => (xg.to_vec().unwrap(), xc.to_vec().unwrap()),
    };
    // mode 2 only reads x: equal to the bit
    let tol = if mode == 2 { 0.0 } else { check.tol[3] };
    assert_rel_close(&g, &c, tol, &format!("dx of {what}"));
}

/// Under TF32, an f32 batch of 17 to 128 rows into a multiple of 8 up to 128 outputs runs in
/// one pass on the tensor cores (`dense_adam_mma`), with no workspace; it and the chunks
/// (cuBLAS's TF32 GEMMs, the kernel off) agree with the CPU's f32 within TF32's rounding, on
/// the seed's shape at batch 100 (a partial 16-row strip at the end), the kernel's edges (17
/// rows and 8 outputs, 128 rows and 128 outputs) and batches that are no multiple of 8, with
/// dx in place, into its own tensor and not computed. Past its edges (16 rows, 129 rows, 124
/// outputs) the update is not the tensor-core pass.
#[test]
fn gpu_tf32_dense_adam_in_one_pass_matches_cpu() {
    let Some(gpu) = private_cuda_with(Precision::Tf32) else {
        return;
    };
    let cpu = cpu();
    let cases = [
        ((100, 128, 70_001), 0),
        ((17, 8, 33), 1),
        ((128, 128, 5_000), 1),
        ((33, 64, 1_000), 2),
        ((100, 120, 999), 1),
        ((71, 96, 4_096), 0),
    ];
    for one_pass in [true, false] {
        gpu.set_dense_adam_rows(one_pass);
        for ((m, n, k), mode) in cases {
            assert_eq!(gpu.dense_adam_is_rows(m, n, DType::F32), one_pass);
            let op = OpDesc::DenseAdam {
                m,
                n,
                k,
                dtype: DType::F32,
                input_grad: mode != 2,
            };
            assert_eq!(gpu.workspace_schedule(&op).unwrap().is_empty(), one_pass);
            let be: Arc<dyn Backend> = gpu.clone();
            let what = format!("TF32 dense_adam m{m} n{n} k{k} mode {mode}, one pass {one_pass}");
            dense_adam_agrees(&be, &cpu, (m, n, k), mode, TF32, &what);
        }
    }
    gpu.set_dense_adam_rows(true);
    assert!(
        gpu.dense_adam_is_rows(16, 128, DType::F32),
        "the f32 rows kernel"
    );
    for (m, n) in [(129, 128), (100, 124), (100, 136)] {
        assert!(!gpu.dense_adam_is_rows(m, n, DType::F32), "m{m} n{n}");
    }
    let highest = private_cuda_with(Precision::Highest).unwrap();
    assert!(
        !highest.dense_adam_is_rows(100, 128, DType::F32),
        "full fp32 keeps the chunks"
    );
}

/// Trains `model` three steps on the same batches with Adam updating the dense weights in
/// the backward pass and with every gradient collected: losses, parameters and both moments
/// agree, and the fused plan has no whole dense weight gradient.
#[test]
fn updating_in_backward_trains_as_collecting() {
    use common::{batch, seed_model};
    use stax::train::Trainer;
    use stax::{Adam, Shape, models::mlp};
    let be = cpu();
    let cases: [(fn() -> stax::Serial, Shape); 2] = [
        (seed_model, Shape::new([3, 10, 10, 3])),
        (|| mlp(&[17, 5], 2), Shape::new([4, 300])),
    ];
    for (model, input) in cases {
        let (x, y) = batch(&be, &input, 2);
        let run = |adam: Adam| {
            let mut t = Trainer::new(model(), input.clone(), adam, &be, 9).unwrap();
            let reserves = be.allocator().stats().backend_reserves;
            let losses: Vec<f32> = (0..3).map(|_| t.step(&x, &y).unwrap().loss).collect();
            let params = common::host_values(t.params().leaves());
            let moments = common::host_values(t.state().tree.leaves());
            let plan = t.plan(input.dims()[0]).unwrap();
            let after = be.allocator().stats().backend_reserves - reserves;
            (losses, params, moments, plan, after)
        };
        let (lf, pf, mf, plan_f, reserves_f) = run(Adam::new(1e-3));
        let (lc, pc, mc, plan_c, _) = run(Adam::new(1e-3).collecting());
        assert_rel_close(&lf, &lc, 1e-6, "losses");
        assert_rel_close(&pf, &pc, 1e-6, "parameters");
        assert_rel_close(&mf, &mc, 1e-6, "moments");
        let names = |p: &stax::train::MemoryPlan| -> Vec<String> {
            p.buffers.iter().map(|b| b.name.clone()).collect()
        };
        assert!(names(&plan_c).iter().any(|n| n.ends_with("dense/dw")));
        assert!(
            !names(&plan_f).iter().any(|n| n.ends_with("dense/dw")),
            "{:?}",
            names(&plan_f)
        );
        assert!(plan_f.peak.bytes < plan_c.peak.bytes);
        // the set-up reserved the loop's memory: no step asked the host for more
        assert_eq!(reserves_f, 0, "backend reserves during the fused steps");
    }
}

/// With the dense weights updated in the backward pass, a run that cannot fit fails at
/// set-up (the loop's memory is reserved then), never in a step after an update, with the
/// out-of-memory diagnosis of a step (the largest batch that fits, smaller than this one); a
/// budget of the plan's least memory trains.
#[test]
fn a_loop_that_cannot_fit_fails_at_set_up() {
    use common::{batch, seed_model};
    use stax::train::{MemoryPlan, Trainer};
    use stax::{Adam, BackendOptions, Shape, Strategy, tensor::cpu::CpuBackend};
    let input = Shape::new([3, 10, 10, 3]);
    let options = BackendOptions {
        strategy: Strategy::Caching,
        ..BackendOptions::default()
    };
    let host = cpu();
    let need = MemoryPlan::new(&seed_model(), &input, &Adam::new(1e-3), &host)
        .unwrap()
        .min_budget()
        .unwrap();
    let tight: std::sync::Arc<dyn stax::Backend> =
        CpuBackend::with_capacity(&options, need - (1 << 20)).unwrap();
    let e = Trainer::new(seed_model(), input.clone(), Adam::new(1e-3), &tight, 1).unwrap_err();
    let fits = stax::train::max_batch_that_fits(
        &seed_model(),
        &input,
        &Adam::new(1e-3),
        &tight,
        stax::train::plan::Feed::Placed,
        Some(need - (1 << 20)),
    )
    .unwrap();
    match &e {
        stax::train::TrainError::OutOfMemory(oom) => {
            assert_eq!((oom.batch, oom.max_batch), (3, Some(fits)), "{e}");
            assert!(fits < 3, "{e}");
            assert!(e.to_string().contains("ran out of memory"), "{e}");
            // the rehearsal's replay allocates under the plan's names
            let named = oom.buffer.as_deref().is_some_and(|b| b.contains('/'));
            assert!(named, "the failed buffer by its plan name: {e}");
        }
        other => panic!("expected the set-up's OutOfMemory, got {other}"),
    }
    let enough: std::sync::Arc<dyn stax::Backend> =
        CpuBackend::with_capacity(&options, need).unwrap();
    let mut t = Trainer::new(seed_model(), input.clone(), Adam::new(1e-3), &enough, 1).unwrap();
    let (x, y) = batch(&enough, &input, 2);
    for _ in 0..3 {
        t.step(&x, &y).unwrap();
    }
}

/// `t` cast to `dtype` on its backend (bit-identical casts on both backends).
fn cast(t: &Tensor, dtype: DType) -> Tensor {
    let mut out = Tensor::empty(t.backend(), t.shape().clone(), dtype, Category::Other).unwrap();
    ops::cast(t, &mut out).unwrap();
    out
}

/// A float tensor's values widened to f32.
fn wide(t: &Tensor) -> Vec<f32> {
    cast(t, DType::F32).to_vec().unwrap()
}

/// Asserts that a bf16 or f16 result differs from the CPU's only where the two backends' f32
/// sums (of different orders) round to neighbouring values: by at most one unit in the last
/// place of `dtype` (plus `1e-5` of the largest value, for results near zero, whose ulp is below
/// the sums' f32 error), in at most 1% of the elements. dx from the unrounded weight would
/// differ in about a third of them.
fn assert_within_one_rounding(gpu: &[f32], cpu: &[f32], dtype: DType, what: &str) {
    assert_eq!(gpu.len(), cpu.len(), "{what}: lengths differ");
    let atol = 1e-5 * cpu.iter().fold(0f32, |m, c| m.max(c.abs()));
    let mut differ = 0;
    for (i, (&g, &c)) in gpu.iter().zip(cpu).enumerate() {
        if g.to_bits() == c.to_bits() {
            continue;
        }
        differ += 1;
        let ulp = ulp(g.abs().max(c.abs()), dtype).max(2f32.powi(-24));
        assert!(
            (g - c).abs() <= ulp + atol,
            "{what}: element {i}: gpu {g} vs cpu {c}, more than one {dtype} rounding apart"
        );
    }
    assert!(
        differ * 100 <= gpu.len(),
        "{what}: {differ} of {} elements differ",
        gpu.len()
    );
}

/// bf16 and f16 `x` and `dy` on both backends: the weight gradient is summed in f32 by cuBLAS's
/// tensor cores and by the CPU's GEMM in other orders, then rounded to the dtype, so a few of
/// its elements round to neighbouring values; both moments within one such rounding
/// ([`assert_moments_within_one_rounding`]), the weight within 2e-6, dx within one rounding of
/// the dtype, an x that is only read unchanged. Two chunks of 64 MiB of f32 gradient rows (the
/// second partial), one chunk, a batch of one row, odd n, with a loss scale's `grad_scale`;
/// the seed's 128 outputs at batch 10 and 100 (70,001 rows), a batch not a multiple of 16 into
/// another tensor, 16 outputs.
#[test]
fn gpu_low_precision_dense_adam_matches_cpu() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    let cpu = cpu();
    let h = AdamHyper {
        grad_scale: 0.25,
        ..hyper()
    };
    let cases = [
        ((100, 300, 70_000), 0),
        ((1, 3, 100), 1),
        ((3, 5, 77), 1),
        ((64, 127, 5_000), 0),
        ((10, 128, 40_000), 2),
        ((100, 128, 70_001), 0),
        ((37, 64, 1_000), 1),
        ((5, 16, 130), 0),
    ];
    for dtype in [DType::BF16, DType::F16] {
        for ((m, n, k), mode) in cases {
            let mut rng = Rng::new(seed_for("dense_adam low", &[m, n, k]));
            let mut both = |rows, cols, positive: bool| {
                let mut v = rng.vec(rows * cols, -1.0, 1.0);
                if positive {
                    v.iter_mut().for_each(|x| *x = x.abs());
                }
                on_both(&gpu, &cpu, &v, [rows, cols])
            };
            let (x, dy) = (both(m, k, false), both(m, n, false));
            let [mut xg, mut xc, dyg, dyc] = [&x.0, &x.1, &dy.0, &dy.1].map(|t| cast(t, dtype));
            let (mut wg, mut wc) = both(k, n, false);
            let (mut mug, mut muc) = both(k, n, false);
            let (mut nug, mut nuc) = both(k, n, true);
            let x_before = wide(&xc);
            let before = [&muc, &nuc].map(|t| t.to_vec().unwrap());
            let mut dxg = poisoned(&gpu, [m, k], dtype);
            let mut dxc = Tensor::empty(&cpu, [m, k], dtype, Category::Other).unwrap();
            let (dx_g, dx_c) = match mode {
                0 => (DenseDx::InPlace, DenseDx::InPlace),
                1 => (DenseDx::Into(&mut dxg), DenseDx::Into(&mut dxc)),
                _ => (DenseDx::Skip, DenseDx::Skip),
            };
            ops::dense_adam(&mut xg, &dyg, &mut wg, &mut mug, &mut nug, dx_g, &h).unwrap();
            ops::dense_adam(&mut xc, &dyc, &mut wc, &mut muc, &mut nuc, dx_c, &h).unwrap();
            let what = |s: &str| format!("{s} of {dtype} dense_adam m{m} n{n} k{k} mode {mode}");
            let (g, c) = (wg.to_vec().unwrap(), wc.to_vec().unwrap());
            assert_rel_close(&g, &c, 2e-6, &what("w"));
            let mu = [&mug, &muc].map(|t| t.to_vec().unwrap());
            let nu = [&nug, &nuc].map(|t| t.to_vec().unwrap());
            assert_moments_within_one_rounding([mu, nu], &before, (dtype, &h), &what("moments"));
            let (g, c) = match mode {
                1 => (wide(&dxg), wide(&dxc)),
                _ => (wide(&xg), wide(&xc)),
            };
            match mode {
                2 => {
                    assert_eq!(g, x_before, "{}", what("x (read only)"));
                    assert_eq!(c, x_before, "{}", what("x (read only, cpu)"));
                }
                _ => assert_within_one_rounding(&g, &c, dtype, &what("dx")),
            }
        }
    }
}

/// One unit in the last place of `dtype` (bf16 or f16) at `v >= 0` (0 at 0).
fn ulp(v: f32, dtype: DType) -> f32 {
    let digits = if dtype == DType::BF16 { 8 } else { 11 };
    match v > 0.0 {
        true => 2f32.powi(v.log2().floor() as i32 - (digits - 1)),
        false => 0.0,
    }
}

/// Asserts that Adam's moments `[[mu_gpu, mu_cpu], [nu_gpu, nu_cpu]]` after one step from
/// `[mu, nu]` before differ only where the two backends' weight gradients g (f32 sums rounded
/// to `dtype`) round to neighbouring values, one unit u in the last place of `dtype` at g apart
/// (g read back from the CPU's mu; u the ulp just above |g|, so a gradient at a power of two
/// may move to its upper neighbour, and at least `1e-5` of the largest |g|, for gradients near
/// zero, whose ulp is below the sums' f32 error): mu by at most `(1 - b1) s u`, nu by at most
/// `(1 - b2) s² (2|g| + u) u` (s = grad_scale), beyond f32 noise, in at most 1% of the
/// elements. A gradient left in f32 on one side moves almost every element.
fn assert_moments_within_one_rounding(
    [[mu_g, mu_c], [nu_g, nu_c]]: [[Vec<f32>; 2]; 2],
    [mu0, nu0]: &[Vec<f32>; 2],
    (dtype, h): (DType, &AdamHyper),
    what: &str,
) {
    let s = h.grad_scale;
    let noise = |a: f32, b: f32, c: f32| 4.0 * f32::EPSILON * a.abs().max(b.abs()).max(c.abs());
    let grads: Vec<f32> = (0..mu_c.len())
        .map(|i| (mu_c[i] - h.b1 * mu0[i]) / ((1.0 - h.b1) * s))
        .collect();
    let atol = 1e-5 * grads.iter().fold(0f32, |m, g| m.max(g.abs()));
    let mut differ = 0;
    for (i, &g) in grads.iter().enumerate() {
        let (dm, dn) = ((mu_g[i] - mu_c[i]).abs(), (nu_g[i] - nu_c[i]).abs());
        let (m_noise, n_noise) = (
            noise(mu_g[i], mu_c[i], mu0[i]),
            noise(nu_g[i], nu_c[i], nu0[i]),
        );
        if dm <= m_noise && dn <= n_noise {
            continue;
        }
        differ += 1;
        // the ulp above |g|: a g read back as just below a power of two (f32 noise) may have
        // rounded to it, whose upper neighbour is a whole ulp of the next binade away
        let u = ulp(g.abs() * (1.0 + ulp(1.0, dtype)), dtype).max(atol);
        let m_bound = 1.01 * (1.0 - h.b1) * s * u + m_noise;
        let n_bound = 1.01 * (1.0 - h.b2) * s * s * (2.0 * g.abs() + u) * u + n_noise;
        assert!(
            dm <= m_bound && dn <= n_bound,
            "{what}: element {i}: mu gpu {} vs cpu {}, nu gpu {} vs cpu {} (gradient {g}): more \
             than one {dtype} rounding of the gradient apart",
            mu_g[i],
            mu_c[i],
            nu_g[i],
            nu_c[i]
        );
    }
    assert!(
        differ * 100 <= mu_c.len(),
        "{what}: {differ} of {} elements differ",
        mu_c.len()
    );
}

/// Every float dtype, with and without dx: the workspace a call allocates and frees is its
/// schedule, to the byte and in order, on the CPU (with chunks of 64 rows: three here) and on
/// CUDA; the schedules hold what the op needs: on the CPU the f32 copies of x and dy (bf16,
/// f16), the f32 chunk of dw, the rounded old weight's chunk (bf16, f16 with dx); on CUDA the
/// chunk of dw in the dtype, the old weight's chunk in the dtype (bf16, f16 with dx), cuBLAS's
/// workspace (none where full fp32's f32 chunks run the 3xTF32 kernel: 20 rows into 8
/// outputs), and nothing for the one-pass f32 kernels of these batches (6 rows: the rows
/// kernel, 20 rows into 8 outputs: the TF32 tensor-core kernel; off: the chunks).
#[test]
fn dense_adam_workspace_is_its_schedule_on_both_backends() {
    for shape in [(6, 7, 150), (20, 8, 150)] {
        workspace_is_the_schedule(shape);
    }
}

fn workspace_is_the_schedule((m, n, k): (usize, usize, usize)) {
    let options = stax::BackendOptions {
        workspace_limit: Some(64 * n * 4),
        ..Default::default()
    };
    let small: Arc<dyn Backend> = stax::tensor::cpu::CpuBackend::new(&options).unwrap();
    // (backend, whether the one-pass kernel is on, whether f32 chunks run in 3xTF32)
    let mut backends = vec![(small, false, false)];
    for rows_kernel in [true, false] {
        if let Some(gpu) = private_cuda_with(Precision::Tf32) {
            gpu.set_dense_adam_rows(rows_kernel);
            backends.push((gpu, rows_kernel, false));
        }
    }
    if let Some(gpu) = private_cuda_with(Precision::Highest) {
        gpu.set_dense_adam_rows(false);
        gpu.set_fp32_dense_chunks_3xtf32(true);
        let x3 = gpu.dense_chunks_x3(m, n, DType::F32);
        // 20 rows into 8 outputs take the 3xTF32 kernel; 7 outputs are no multiple of 8
        assert_eq!(x3, n % 8 == 0, "the 3xTF32 chunks for m{m} n{n}");
        backends.push((gpu, false, x3));
    }
    let h = hyper();
    for (be, rows_kernel, x3) in backends {
        let device = be.device();
        for dtype in DType::FLOATS {
            for input_grad in [true, false] {
                let mut rng = Rng::new(seed_for("dense_adam workspace", &[m, n, k]));
                let mut t = |rows, cols| {
                    let v: Vec<f32> = rng.vec(rows * cols, 0.0, 1.0);
                    Tensor::from_slice(&be, &v, [rows, cols], Category::Other).unwrap()
                };
                let (mut x, dy) = (cast(&t(m, k), dtype), cast(&t(m, n), dtype));
                let (mut w, mut mu, mut nu) = (t(k, n), t(k, n), t(k, n));
                let op = OpDesc::DenseAdam {
                    m,
                    n,
                    k,
                    dtype,
                    input_grad,
                };
                let allocs = be
                    .workspace_schedule(&op)
                    .unwrap()
                    .iter()
                    .filter(|s| matches!(s, WorkspaceStep::Alloc(_)))
                    .count();
                let low = dtype != DType::F32;
                let want = match device {
                    stax::Device::Cpu => 1 + 2 * low as usize + (low && input_grad) as usize,
                    _ if rows_kernel && !low => 0,
                    // the gradient's chunk, no cuBLAS workspace
                    _ if x3 && !low => 1,
                    _ => 2 + (low && input_grad) as usize,
                };
                let what = format!("{device:?} {dtype} dense_adam, dx {input_grad}");
                assert_eq!(allocs, want, "{what}: buffers");
                assert_workspace_is_the_schedule(&be, &what, op, &mut || {
                    let dx = if input_grad {
                        DenseDx::InPlace
                    } else {
                        DenseDx::Skip
                    };
                    ops::dense_adam(&mut x, &dy, &mut w, &mut mu, &mut nu, dx, &h).unwrap();
                });
            }
        }
    }
}

/// The seed model (small images) under `Policy::BF16` on a CPU whose dense update runs in
/// thirteen chunks: five steps with Adam updating the dense weights in the backward pass give
/// the collecting run's losses, parameters and moments bit for bit (both round each weight
/// gradient's f32 sums to bf16 once before Adam reads it), every step's peak equal to its
/// plan, and the fused plan has neither a whole dense weight gradient nor a cast of the weight
/// in the backward pass and peaks lower.
#[test]
fn bf16_updating_in_backward_trains_as_collecting_with_exact_memory() {
    use common::{batch, seed_model};
    use stax::layers::{Mixed, Policy};
    use stax::train::{MemoryPlan, Trainer};
    use stax::{Adam, Shape};
    let input = Shape::new([3, 10, 10, 3]);
    let options = stax::BackendOptions {
        workspace_limit: Some(1 << 18),
        ..Default::default()
    };
    let run = |adam: Adam| {
        let be: Arc<dyn Backend> = stax::tensor::cpu::CpuBackend::new(&options).unwrap();
        let (x, y) = batch(&be, &input, 2);
        let model = Mixed::new(seed_model(), Policy::BF16);
        let mut t = Trainer::new(model, input.clone(), adam, &be, 9).unwrap();
        let plan = t.plan(input.dims()[0]).unwrap();
        let mut losses = Vec::new();
        for _ in 0..5 {
            let r = t.step(&x, &y).unwrap();
            assert_eq!(
                r.memory.peak, plan.peak.bytes,
                "step {} peak = plan",
                r.step
            );
            losses.push(r.loss);
        }
        let params = common::host_values(t.params().leaves());
        let moments = common::host_values(t.state().tree.leaves());
        (losses, params, moments, plan)
    };
    let (lf, pf, mf, plan_f) = run(Adam::new(1e-3));
    let (lc, pc, mc, plan_c) = run(Adam::new(1e-3).collecting());
    assert_eq!(lf, lc, "losses");
    assert_ne!(lf[0], lf[4], "the updates change the loss");
    for (f, c, what) in [(&pf, &pc, "parameters"), (&mf, &mc, "moments")] {
        let differ = f
            .iter()
            .zip(c)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(
            (f.len(), differ),
            (c.len(), 0),
            "{what} differing from collecting"
        );
    }
    let names =
        |p: &MemoryPlan| -> Vec<String> { p.buffers.iter().map(|b| b.name.clone()).collect() };
    assert!(names(&plan_c).iter().any(|n| n.ends_with("dense/dw")));
    let fused = names(&plan_f);
    assert!(!fused.iter().any(|n| n.ends_with("dense/dw")), "{fused:?}");
    assert!(plan_f.peak.bytes < plan_c.peak.bytes);
}

/// Under f16 with dynamic loss scaling the step collects the dense weight's gradient (its
/// update must wait for the all-finite check), with Adam's default of updating in the backward
/// pass; under bf16 (no loss scale) it does not.
#[test]
fn f16_with_a_loss_scale_collects_the_dense_gradient() {
    use common::seed_model;
    use stax::layers::{Mixed, Policy};
    use stax::train::MemoryPlan;
    use stax::{Adam, Shape};
    let (be, input) = (cpu(), Shape::new([3, 10, 10, 3]));
    for (policy, collected) in [(Policy::F16, true), (Policy::BF16, false)] {
        let model = Mixed::new(seed_model(), policy);
        let plan = MemoryPlan::new(&model, &input, &Adam::new(1e-3), &be).unwrap();
        let dw = plan.buffers.iter().any(|b| b.name.ends_with("dense/dw"));
        assert_eq!(dw, collected, "{policy:?}");
    }
}
