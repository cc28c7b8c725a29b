//! Full fp32's dense product on the GPU: under `Precision::Highest` an f32 `ops::matmul` with
//! neither operand transposed (the seed's Dense(128) forward) runs our split-K kernel in
//! 3xTF32 (`gemm_wf32_f32x3`) where it fits (`CudaBackend::set_fp32_gemm_3xtf32`, on by
//! default), and cuBLAS's f32 GEMM elsewhere and with the kernel off. Both agree with the CPU's f32 on fresh random inputs within f32's
//! tolerance (a plain TF32 product, about 5e-4 off norm-wise, fails it), and each allocates
//! exactly its workspace schedule. Skipped with a notice without a GPU.

mod common;

use common::*;
use stax::tensor::OpDesc;
use stax::tensor::ops;
use stax::{Backend, DType, Precision, Tensor};
use std::sync::Arc;

/// Norm-wise relative tolerance of full fp32 against the CPU: 3xTF32 keeps each product within
/// about 2^-21 of itself; sums in another order add about as much.
const F32_TOL: f64 = 1e-5;

/// `(m, k, n)`: the seed's product scaled down (k a fifth of 2,560,000 rows, so many steps a
/// split), one row, columns past one block and not a multiple of 32, k a multiple of 4 but not
/// of 8 or 32, more splits than steps of k; then shapes the kernel does not take (m > 128, k
/// not a multiple of 4, n not a multiple of 4), which cuBLAS runs.
const SHAPES: [(usize, usize, usize); 9] = [
    (100, 512_000, 128),
    (1, 8, 4),
    (37, 1004, 20),
    (128, 2056, 260),
    (5, 36, 132),
    (129, 64, 128),
    (16, 1001, 64),
    (16, 64, 130),
    (3, 5, 7),
];

/// `c = op(a) · op(b)` (plus `c`'s start with `accumulate`) on both backends from one seed:
/// `(gpu, cpu)` results.
fn product(
    gpu: &Arc<dyn Backend>,
    (m, k, n): (usize, usize, usize),
    (transpose_a, transpose_b): (bool, bool),
    accumulate: bool,
) -> (Vec<f32>, Vec<f32>) {
    let cpu = cpu();
    let mut rng = Rng::new(seed_for("fp32_dense", &[m, k, n, transpose_a as usize]));
    let a_shape = if transpose_a { [k, m] } else { [m, k] };
    let b_shape = if transpose_b { [n, k] } else { [k, n] };
    let (ag, ac) = on_both(gpu, &cpu, &rng.vec(m * k, -1.0, 1.0), a_shape);
    let (bg, bc) = on_both(gpu, &cpu, &rng.vec(k * n, -1.0, 1.0), b_shape);
    let (mut cg, mut cc) = on_both(gpu, &cpu, &rng.vec(m * n, -1.0, 1.0), [m, n]);
    let run = |a: &Tensor, b: &Tensor, c: &mut Tensor| match accumulate {
        true => ops::matmul_add(a, b, transpose_a, transpose_b, c).unwrap(),
        false => ops::matmul(a, b, transpose_a, transpose_b, c).unwrap(),
    };
    run(&ag, &bg, &mut cg);
    run(&ac, &bc, &mut cc);
    (cg.to_vec().unwrap(), cc.to_vec().unwrap())
}

#[test]
fn full_fp32_dense_products_match_the_cpu_with_exact_workspace() {
    let Some(gpu) = private_cuda_with(Precision::Highest) else {
        return;
    };
    assert!(gpu.fp32_gemm_3xtf32(), "the kernel is on by default");
    for kernel in [false, true] {
        gpu.set_fp32_gemm_3xtf32(kernel);
        let be: Arc<dyn Backend> = gpu.clone();
        for (m, k, n) in SHAPES {
            let what = format!("f32 {m}x{k}x{n}, kernel {kernel}");
            let (g, c) = product(&be, (m, k, n), (false, false), false);
            assert_rel_close(&g, &c, F32_TOL, &what);
            let op = OpDesc::Matmul {
                m,
                n,
                k,
                dtype: DType::F32,
                b_dtype: DType::F32,
                transpose_a: false,
                transpose_b: false,
                accumulate: false,
            };
            let mut rng = Rng::new(seed_for("fp32_dense_ws", &[m, k, n]));
            let (a, _) = random_tensor(&be, [m, k], &mut rng);
            let (b, _) = random_tensor(&be, [k, n], &mut rng);
            let mut out = poisoned(&be, [m, n], DType::F32);
            assert_workspace_is_the_schedule(&be, &what, op, &mut || {
                ops::matmul(&a, &b, false, false, &mut out).unwrap()
            });
        }
    }
}

/// The kernel takes neither transposes nor a product added to `c`: with it on, those stay
/// cuBLAS's and agree with the CPU too, at the seed's dense shape scaled down.
#[test]
fn transposed_and_accumulated_fp32_products_stay_exact() {
    let Some(gpu) = private_cuda_with(Precision::Highest) else {
        return;
    };
    gpu.set_fp32_gemm_3xtf32(true);
    let be: Arc<dyn Backend> = gpu.clone();
    for (transposes, accumulate) in [
        ((true, false), false),
        ((false, true), false),
        ((false, false), true),
    ] {
        let what = format!("f32 100x51200x128 transposes {transposes:?} accumulate {accumulate}");
        let (g, c) = product(&be, (100, 51_200, 128), transposes, accumulate);
        assert_rel_close(&g, &c, F32_TOL, &what);
    }
}
