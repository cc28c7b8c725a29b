//! `dense_adam` on the host: f32 against matmul then adam; bf16 and f16 against the semantics
//! written out as loops (`dw` summed in f32 from the widened inputs and rounded once,
//! `ops::adam`, `dx` from the old weight rounded, rounded once) on inputs whose every sum is
//! exact in f32, so the comparison is bit for bit whatever the summation order; bad operands.

use super::super::testing::{assert_close, backend_with_workspace, random_vec, rng, tensor};
use crate::backend::DenseDx;
use crate::dtype::{bf16, f16};
use crate::{AdamHyper, Backend, Category, DType, Float, Tensor, TensorError, ops};
use rand::rngs::StdRng;
use std::sync::Arc;

fn hyper() -> AdamHyper {
    super::super::testing::adam_hyper(1e-2, 3)
}

/// x [m, k], dy [m, n], w, mu (random), nu (random, positive) [k, n].
fn operands(be: &Arc<dyn Backend>, (m, n, k): (usize, usize, usize), seed: u64) -> [Tensor; 5] {
    let mut r = rng(seed);
    let nu: Vec<f32> = random_vec(&mut r, k * n).iter().map(|v| v.abs()).collect();
    [
        tensor(be, &random_vec(&mut r, m * k), [m, k]),
        tensor(be, &random_vec(&mut r, m * n), [m, n]),
        tensor(be, &random_vec(&mut r, k * n), [k, n]),
        tensor(be, &random_vec(&mut r, k * n), [k, n]),
        tensor(be, &nu, [k, n]),
    ]
}

/// The unfused reference: dw = xᵀ·dy, dx = dy·wᵀ, then Adam with dw.
fn unfused(be: &Arc<dyn Backend>, [x, dy, mut w, mut mu, mut nu]: [Tensor; 5]) -> [Vec<f32>; 4] {
    let (m, k, n) = (x.dims()[0], x.dims()[1], dy.dims()[1]);
    let mut dw = tensor(be, &vec![0.0; k * n], [k, n]);
    let mut dx = tensor(be, &vec![0.0; m * k], [m, k]);
    ops::matmul(&x, &dy, true, false, &mut dw).unwrap();
    ops::matmul(&dy, &w, false, true, &mut dx).unwrap();
    ops::adam(&mut w, &dw, &mut mu, &mut nu, &hyper()).unwrap();
    [dx, w, mu, nu].map(|t| t.to_vec().unwrap())
}

/// Chunks of 64 rows, a last partial chunk, each way of writing dx: equal to matmul then
/// adam; an empty batch too (a zero gradient: Adam's step on zeros, over every chunk), and no
/// outputs.
#[test]
fn fused_equals_matmul_then_adam_over_partial_chunks() {
    // room for 64 rows of 3 columns: k = 150 is 64 + 64 + 22 rows
    let be = backend_with_workspace(64 * 3 * 4);
    for (dims, mode) in [
        ((5, 3, 150), 0),
        ((5, 3, 150), 1),
        ((1, 3, 150), 2),
        ((4, 7, 9), 0),
        ((0, 3, 150), 0),
        ((0, 3, 150), 1),
        ((0, 3, 150), 2),
        ((0, 0, 3), 0),
        ((2, 0, 150), 1),
    ] {
        let want = unfused(&be, operands(&be, dims, 11));
        let [mut x, dy, mut w, mut mu, mut nu] = operands(&be, dims, 11);
        let mut into = tensor(&be, &vec![f32::NAN; dims.0 * dims.2], [dims.0, dims.2]);
        let dx = match mode {
            0 => DenseDx::InPlace,
            1 => DenseDx::Into(&mut into),
            _ => DenseDx::Skip,
        };
        ops::dense_adam(&mut x, &dy, &mut w, &mut mu, &mut nu, dx, &hyper()).unwrap();
        let got_dx = if mode == 1 { into.to_vec() } else { x.to_vec() }.unwrap();
        if mode != 2 {
            assert_close(&got_dx, &want[0], 1e-6, 1e-7, "dx");
        }
        for (t, (want, what)) in [w, mu, nu]
            .iter()
            .zip(want[1..].iter().zip(["w", "mu", "nu"]))
        {
            assert_close(&t.to_vec().unwrap(), want, 1e-6, 1e-7, what);
        }
    }
}

/// Bad operands are typed errors and nothing is written.
#[test]
fn bad_operands_are_errors_and_change_nothing() {
    let be = backend_with_workspace(1 << 20);
    let [mut x, dy, mut w, mut mu, nu] = operands(&be, (4, 3, 10), 5);
    let before = w.to_vec().unwrap();
    let shared = nu.clone();
    let mut nu2 = nu;
    let e = ops::dense_adam(
        &mut x,
        &dy,
        &mut w,
        &mut mu,
        &mut nu2,
        DenseDx::InPlace,
        &hyper(),
    );
    assert!(matches!(e, Err(TensorError::Aliased { .. })), "{e:?}");
    drop(shared);
    let mut short = tensor(&be, &[0.0; 6], [2, 3]);
    let e = ops::dense_adam(
        &mut x,
        &short.clone(),
        &mut w,
        &mut mu,
        &mut nu2,
        DenseDx::Skip,
        &hyper(),
    );
    assert!(matches!(e, Err(TensorError::Shape { .. })), "{e:?}");
    let e = ops::dense_adam(
        &mut x,
        &dy,
        &mut short,
        &mut mu,
        &mut nu2,
        DenseDx::Skip,
        &hyper(),
    );
    assert!(matches!(e, Err(TensorError::Shape { .. })), "{e:?}");
    // a dy of other features than w's outputs is dy's error
    let wide = tensor(&be, &[0.0; 16], [4, 4]);
    let e = ops::dense_adam(
        &mut x,
        &wide,
        &mut w,
        &mut mu,
        &mut nu2,
        DenseDx::Skip,
        &hyper(),
    );
    let named = e
        .as_ref()
        .is_err_and(|e| e.to_string().contains("dy: expected shape [4, 3]"));
    assert!(named, "{e:?}");
    let mut flat = tensor(&be, &[0.0; 40], [40]);
    let e = ops::dense_adam(
        &mut flat,
        &dy,
        &mut w,
        &mut mu,
        &mut nu2,
        DenseDx::Skip,
        &hyper(),
    );
    assert!(matches!(e, Err(TensorError::Shape { .. })), "{e:?}");
    let bad = AdamHyper {
        bias_correction1: 0.0,
        ..hyper()
    };
    let e = ops::dense_adam(&mut x, &dy, &mut w, &mut mu, &mut nu2, DenseDx::Skip, &bad);
    assert!(
        matches!(e, Err(TensorError::InvalidArgument { .. })),
        "{e:?}"
    );
    assert_eq!(w.to_vec().unwrap(), before);
}

/// `v` rounded to `dtype`, as a tensor of that dtype.
fn low(be: &Arc<dyn Backend>, v: &[f32], shape: [usize; 2], dtype: DType) -> Tensor {
    let mut t = Tensor::empty(be, shape, dtype, Category::Other).unwrap();
    ops::cast(&tensor(be, v, shape), &mut t).unwrap();
    t
}

/// The bits of a float tensor's values widened to f32.
fn bits(t: &Tensor) -> Vec<u32> {
    let mut w = Tensor::empty(t.backend(), t.shape().clone(), DType::F32, Category::Other).unwrap();
    ops::cast(t, &mut w).unwrap();
    w.to_vec().unwrap().iter().map(|v| v.to_bits()).collect()
}

/// Asserts equal bits, naming the first element that differs.
fn assert_bits(got: &[u32], want: &[u32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        let [g, w] = [got[i], want[i]].map(f32::from_bits);
        panic!(
            "{what}: element {i} of {} is {g} but should be {w}",
            got.len()
        );
    }
}

/// `v` rounded to `dtype` (bf16 or f16) and widened back.
fn round(v: f32, dtype: DType) -> f32 {
    match dtype {
        DType::BF16 => <bf16 as Float>::from_f32(v).to_f32(),
        _ => <f16 as Float>::from_f32(v).to_f32(),
    }
}

/// `n` multiples of `2^-bits` in `[-1, 1]`.
fn grid(r: &mut StdRng, n: usize, bits: i32) -> Vec<f32> {
    let s = 2f32.powi(bits);
    random_vec(r, n)
        .iter()
        .map(|v| (v * s).round() / s)
        .collect()
}

/// `dw = xᵀ · dy` (`[k, n]`) summed in f32 as loops, from x `[m, k]` and dy `[m, n]`.
fn dw_sums((m, n, k): (usize, usize, usize), x: &[f32], dy: &[f32]) -> Vec<f32> {
    (0..k * n)
        .map(|e| (0..m).map(|r| x[r * k + e / n] * dy[r * n + e % n]).sum())
        .collect()
}

/// The semantics of a low-precision `dense_adam` as loops over `[x, dy, w, mu, nu]` (x and dy
/// exact in `dtype`): `dw = xᵀ · dy` in f32 rounded to `dtype`, `ops::adam` with it,
/// `dx = dy · round(w)ᵀ` in f32, rounded. Returns dx, w, mu, nu as bits.
fn reference(
    be: &Arc<dyn Backend>,
    (m, n, k): (usize, usize, usize),
    [x, dy, w, mu, nu]: &[Vec<f32>; 5],
    dtype: DType,
    h: &AdamHyper,
) -> [Vec<u32>; 4] {
    let dw: Vec<f32> = dw_sums((m, n, k), x, dy)
        .into_iter()
        .map(|s| round(s, dtype))
        .collect();
    let dx: Vec<f32> = (0..m * k)
        .map(|e| {
            let (r, i) = (e / k, e % k);
            let s: f32 = (0..n)
                .map(|j| dy[r * n + j] * round(w[i * n + j], dtype))
                .sum();
            round(s, dtype)
        })
        .collect();
    let [mut wt, mut mt, mut vt] = [w, mu, nu].map(|v| tensor(be, v, [k, n]));
    ops::adam(&mut wt, &tensor(be, &dw, [k, n]), &mut mt, &mut vt, h).unwrap();
    let dx = tensor(be, &dx, [m, k]);
    [&dx, &wt, &mt, &vt].map(bits)
}

/// bf16 and f16 over several chunks (k = 150 is 64 + 64 + 22 rows of 3; n = 5 chunks of 38
/// rows: k = 77 is 38 + 38 + 1), one batch row, an odd n, every way of writing dx, with a
/// loss scale's `grad_scale`: bit for bit the reference. x and dy are multiples of 2^-6 (exact
/// in both dtypes), w of 2^-12 (not exact: the rounding of the old weight shows), so every
/// product and sum is exact in f32; dw needs up to 15 bits, so its rounding shows too.
#[test]
fn low_precision_is_rounded_dw_then_adam_and_dx_from_the_rounded_old_weight() {
    let be = backend_with_workspace(64 * 3 * 4);
    let h = AdamHyper {
        grad_scale: 0.5,
        ..hyper()
    };
    let cases = [
        ((5, 3, 150), 0),
        ((5, 3, 150), 1),
        ((1, 5, 77), 0),
        ((1, 5, 77), 2),
        ((4, 7, 9), 1),
    ];
    for dtype in [DType::BF16, DType::F16] {
        let mut dw_rounds = false;
        for (dims @ (m, n, k), mode) in cases {
            let mut r = rng(17 + mode as u64);
            let nu: Vec<f32> = random_vec(&mut r, k * n).iter().map(|v| v.abs()).collect();
            let v = [
                grid(&mut r, m * k, 6),
                grid(&mut r, m * n, 6),
                grid(&mut r, k * n, 12),
                random_vec(&mut r, k * n),
                nu,
            ];
            assert!(v[2].iter().any(|&w| round(w, dtype) != w), "w is not exact");
            dw_rounds |= dw_sums(dims, &v[0], &v[1])
                .into_iter()
                .any(|s| round(s, dtype) != s);
            let want = reference(&be, dims, &v, dtype, &h);
            let mut x = low(&be, &v[0], [m, k], dtype);
            let dy = low(&be, &v[1], [m, n], dtype);
            let [mut w, mut mu, mut nu] = [2, 3, 4].map(|i| tensor(&be, &v[i], [k, n]));
            let mut into = low(&be, &vec![f32::NAN; m * k], [m, k], dtype);
            let dx = match mode {
                0 => DenseDx::InPlace,
                1 => DenseDx::Into(&mut into),
                _ => DenseDx::Skip,
            };
            ops::dense_adam(&mut x, &dy, &mut w, &mut mu, &mut nu, dx, &h).unwrap();
            let what = format!("{dtype} (m, n, k) {dims:?} mode {mode}");
            let got_dx = bits(if mode == 1 { &into } else { &x });
            let x_bits: Vec<u32> = v[0].iter().map(|x| x.to_bits()).collect();
            let want_dx = if mode == 2 { &x_bits } else { &want[0] };
            assert_bits(&got_dx, want_dx, &format!("dx of {what}"));
            for (t, (want, name)) in [w, mu, nu]
                .iter()
                .zip(want[1..].iter().zip(["w", "mu", "nu"]))
            {
                assert_bits(&bits(t), want, &format!("{name} of {what}"));
            }
        }
        assert!(dw_rounds, "no dw of these cases rounds in {dtype}");
    }
}

/// x and dy of different dtypes, dx of another dtype than x, a low-precision weight and a U32
/// x are typed errors naming the op, and nothing is written.
#[test]
fn mixed_and_unsupported_dtypes_are_typed_errors_and_change_nothing() {
    let be = backend_with_workspace(1 << 20);
    let (m, n, k) = (3, 4, 5);
    let [x32, dy32, mut w, mut mu, mut nu] = operands(&be, (m, n, k), 3);
    let mut x = low(&be, &x32.to_vec().unwrap(), [m, k], DType::BF16);
    let dy = low(&be, &dy32.to_vec().unwrap(), [m, n], DType::BF16);
    let before = [&x, &w, &mu, &nu].map(bits);
    let h = hyper();
    let dtype_error = |e: Result<(), TensorError>, expected, got| match e {
        Err(TensorError::DType {
            op,
            expected: e,
            got: g,
            ..
        }) => {
            assert_eq!((op, e, g), ("dense_adam", expected, got));
        }
        other => panic!("expected a dtype error, got {other:?}"),
    };
    let e = ops::dense_adam(
        &mut x,
        &dy32,
        &mut w,
        &mut mu,
        &mut nu,
        DenseDx::InPlace,
        &h,
    );
    dtype_error(e, DType::BF16, DType::F32);
    let mut into = tensor(&be, &vec![0.0; m * k], [m, k]);
    let dx = DenseDx::Into(&mut into);
    let e = ops::dense_adam(&mut x, &dy, &mut w, &mut mu, &mut nu, dx, &h);
    dtype_error(e, DType::BF16, DType::F32);
    let mut wb = low(&be, &w.to_vec().unwrap(), [k, n], DType::BF16);
    let e = ops::dense_adam(&mut x, &dy, &mut wb, &mut mu, &mut nu, DenseDx::Skip, &h);
    dtype_error(e, DType::F32, DType::BF16);
    let mut xu = Tensor::empty(&be, [m, k], DType::U32, Category::Other).unwrap();
    let e = ops::dense_adam(&mut xu, &dy, &mut w, &mut mu, &mut nu, DenseDx::Skip, &h);
    assert!(
        matches!(
            e,
            Err(TensorError::UnsupportedDType {
                op: "dense_adam",
                dtype: DType::U32,
                ..
            })
        ),
        "{e:?}"
    );
    assert_eq!([&x, &w, &mu, &nu].map(bits), before);
}
