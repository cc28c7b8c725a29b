//! The mixed-precision dense product `ops::matmul(a, b)` with a bf16 or f16 `a` and an f32
//! `b` read rounded to `a`'s dtype (`a @ b.astype(a.dtype)`, the forward product of a dense
//! layer under a bf16 or f16 policy, without a rounded copy of the weight).
//!
//! On the CPU (always): equal, bit for bit, to the product of the rounded copy; refused with
//! transposes or dtypes that do not pair. On the GPU (skipped with a notice without one): the
//! tensor-core kernel (m <= 128, k % 8 == 0, n % 4 == 0) and the fallback that rounds `b` into
//! the workspace for cuBLAS, both equal to the CPU's on fresh random inputs within the dtype's
//! rounding, each allocating exactly its workspace schedule.

mod common;

use common::*;
use stax::tensor::ops;
use stax::tensor::{OpDesc, TensorError};
use stax::{Backend, Category, DType, Tensor};
use std::sync::Arc;

const HALVES: [DType; 2] = [DType::BF16, DType::F16];

/// `c = a · b` of `a` `[m, k]` in `dtype` and the f32 `b` `[k, n]`, both from `seed`, on `be`.
fn mixed(
    be: &Arc<dyn Backend>,
    (m, k, n): (usize, usize, usize),
    dtype: DType,
    rounded_copy: bool,
) -> Vec<f32> {
    let mut rng = Rng::new(seed_for("mixed_dense", &[m, k, n]));
    let (a, b) = (rng.vec(m * k, -1.0, 1.0), rng.vec(k * n, -1.0, 1.0));
    let a = typed(be, &a, &[m, k], dtype);
    let b = match rounded_copy {
        true => typed(be, &b, &[k, n], dtype),
        false => Tensor::from_slice(be, &b, [k, n], Category::Other).unwrap(),
    };
    let mut c = poisoned(be, [m, n], dtype);
    ops::matmul(&a, &b, false, false, &mut c).unwrap();
    c.to_vec().unwrap()
}

/// Shapes the kernel takes (the seed's dense product scaled down, one row, columns past one
/// block and not a multiple of 32, k not a multiple of 32, more splits than steps of k) and
/// shapes it does not (m > 128, k odd, n not a multiple of 4).
const SHAPES: [(usize, usize, usize); 10] = [
    (100, 4096, 128),
    (1, 8, 4),
    (37, 1000, 20),
    (128, 2056, 260),
    (5, 40, 132),
    (8, 65_536, 12),
    (129, 64, 128),
    (16, 1001, 64),
    (16, 64, 130),
    (3, 5, 7),
];

#[test]
fn the_cpu_reads_b_rounded_bit_for_bit() {
    let cpu = cpu();
    for dtype in HALVES {
        for shape in SHAPES {
            let (direct, copied) = (
                mixed(&cpu, shape, dtype, false),
                mixed(&cpu, shape, dtype, true),
            );
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&direct), bits(&copied), "{dtype} {shape:?}");
        }
    }
}

#[test]
fn transposes_and_unpaired_dtypes_are_refused() {
    let cpu = cpu();
    let a = typed(&cpu, &[1.0; 6], &[2, 3], DType::BF16);
    let b = Tensor::from_slice(&cpu, &[1.0; 6], [3, 2], Category::Other).unwrap();
    let mut c = poisoned(&cpu, [2, 2], DType::BF16);
    for (ta, tb, a_t, b_t) in [
        (true, false, [3usize, 2usize], [3usize, 2usize]),
        (false, true, [2, 3], [2, 3]),
    ] {
        let a = a.reshape(a_t).unwrap();
        let b = b.reshape(b_t).unwrap();
        let e = ops::matmul(&a, &b, ta, tb, &mut c).unwrap_err();
        assert!(
            matches!(&e, TensorError::InvalidArgument { op: "matmul", reason }
                if reason.contains("f32 b") && reason.contains("transpose")),
            "{e}"
        );
    }
    // an f16 b of a bf16 a, and a bf16 b of an f32 a: no rounding pairs them, and the error
    // names both operands' dtypes and what b may be
    let refused = |e: TensorError, expected: &str| {
        assert!(
            matches!(&e, TensorError::InvalidArgument { op: "matmul", reason } if reason == expected),
            "{e}"
        );
    };
    let b16 = typed(&cpu, &[1.0; 6], &[3, 2], DType::F16);
    let e = ops::matmul(&a, &b16, false, false, &mut c).unwrap_err();
    refused(
        e,
        "b is f16: with a bf16 a, b must be bf16 or f32 (read rounded)",
    );
    let a32 = Tensor::from_slice(&cpu, &[1.0; 6], [2, 3], Category::Other).unwrap();
    let b_bf16 = typed(&cpu, &[1.0; 6], &[3, 2], DType::BF16);
    let mut c32 = poisoned(&cpu, [2, 2], DType::F32);
    let e = ops::matmul(&a32, &b_bf16, false, false, &mut c32).unwrap_err();
    refused(e, "b is bf16: with an f32 a, b must be f32");
    // c of f32 for a bf16 product: the output's dtype error
    let b32 = Tensor::from_slice(&cpu, &[1.0; 6], [3, 2], Category::Other).unwrap();
    let e = ops::matmul(&a, &b32, false, false, &mut c32).unwrap_err();
    assert!(matches!(e, TensorError::DType { op: "matmul", .. }), "{e}");
}

#[test]
fn the_gpu_matches_the_cpu_with_exact_workspace() {
    let Some(gpu) = private_gpu_or_skip() else {
        return;
    };
    let cpu = cpu();
    for dtype in HALVES {
        for (m, k, n) in SHAPES {
            let (g, c) = (
                mixed(&gpu, (m, k, n), dtype, false),
                mixed(&cpu, (m, k, n), dtype, false),
            );
            // both sum in f32 and round once, in different orders: two roundings of the
            // dtype relative to the sum, and an absolute allowance growing with sqrt(k)
            let eps = match dtype {
                DType::BF16 => 2f64.powi(-8),
                _ => 2f64.powi(-11),
            };
            let what = format!("{dtype} mixed {m}x{k}x{n}");
            assert_close(&g, &c, 2.0 * eps, 2.0 * eps * (k as f64).sqrt(), &what);
            let mut rng = Rng::new(seed_for("mixed_ws", &[m, k, n]));
            let a = typed(&gpu, &rng.vec(m * k, -1.0, 1.0), &[m, k], dtype);
            let b = Tensor::from_slice(&gpu, &rng.vec(k * n, -1.0, 1.0), [k, n], Category::Other)
                .unwrap();
            let mut out = poisoned(&gpu, [m, n], dtype);
            let op = OpDesc::Matmul {
                m,
                n,
                k,
                dtype,
                b_dtype: DType::F32,
                transpose_a: false,
                transpose_b: false,
                accumulate: false,
            };
            assert_workspace_is_the_schedule(&gpu, &what, op, &mut || {
                ops::matmul(&a, &b, false, false, &mut out).unwrap()
            });
        }
    }
}
