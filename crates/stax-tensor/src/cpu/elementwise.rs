//! Elementwise ops on the host, written once over the element type ([`Float`]: f32, bf16,
//! f16, each read as f32, computed in f32 and rounded back once): fill, casts, activations and
//! their backward passes, binary ops, bias add and its gradient.
//!
//! Masks are packed bits, as the CUDA kernels keep them: a `U32` tensor of `ceil(numel / 32)`
//! words where bit `i % 32` of word `i / 32` is the activation's bit for `x[i]`
//! ([`crate::Activation::mask_bit`]: `x[i] > 0` for the ReLU), and the bits past `numel` in
//! the last word are zero.

use super::host::{view, view_mut, words, words_mut};
use crate::backend::{BiasAdd, BiasGrad, Binary, Cast, Fill, Unary, UnaryBwd};
use crate::{Activation, Float, Saves, TensorError, with_float};

/// The dtype error of an op given U32 where it needs a float (the front end refuses it).
pub(super) fn not_float(op: &'static str, dtype: crate::DType) -> TensorError {
    TensorError::UnsupportedDType {
        op,
        dtype,
        supported: "f32, bf16, f16",
    }
}

/// Sets every element to `value` rounded to the dtype (a U32 tensor to 0).
pub(super) fn fill(c: Fill<'_>) -> Result<(), TensorError> {
    const OP: &str = "fill";
    let Fill { t, value } = c;
    with_float!(t.dtype(), T => view_mut::<T>(OP, t)?.fill(T::from_f32(value)),
        words_mut(OP, t)?.fill(0));
    Ok(())
}

/// `dst = src` converted between float dtypes (through f32, rounded once).
pub(super) fn cast(c: Cast<'_>) -> Result<(), TensorError> {
    const OP: &str = "cast";
    let Cast { src, dst } = c;
    let (from, to) = (src.dtype(), dst.dtype());
    with_float!(from, S => with_float!(to, D => {
        let s = view::<S>(OP, src)?;
        for (d, v) in view_mut::<D>(OP, dst)?.iter_mut().zip(s) {
            *d = D::from_f32(v.to_f32());
        }
        Ok(())
    }, Err(not_float(OP, to))), Err(not_float(OP, from)))
}

/// In place, each element of the f32 `t` rounded to `dtype` and back (`t.astype(dtype)
/// .astype(f32)`): an f32 operand that an op reads rounded to a low-precision dtype.
pub(super) fn round_through(t: &mut crate::Tensor, dtype: crate::DType) -> Result<(), TensorError> {
    const OP: &str = "round_through";
    with_float!(dtype, T => {
        view_mut::<f32>(OP, t)?
            .iter_mut()
            .for_each(|v| *v = T::from_f32(*v).to_f32());
        Ok(())
    }, Err(not_float(OP, dtype)))
}

/// In place `y = act(y)`; for an activation that saves a mask, `aux` receives it.
pub(super) fn unary(c: Unary<'_>) -> Result<(), TensorError> {
    let dtype = c.y.dtype();
    with_float!(dtype, T => unary_t::<T>(c), Err(not_float("unary", dtype)))
}

fn unary_t<T: Float>(c: Unary<'_>) -> Result<(), TensorError> {
    const OP: &str = "unary";
    let Unary { act, y, aux } = c;
    let y = view_mut::<T>(OP, y)?;
    let Some(mask) = aux else {
        y.iter_mut()
            .for_each(|v| *v = T::from_f32(act.apply(v.to_f32())));
        return Ok(());
    };
    for (chunk, word) in y.chunks_mut(32).zip(words_mut(OP, mask)?) {
        let mut w = 0u32;
        for (i, v) in chunk.iter_mut().enumerate() {
            let x = v.to_f32();
            w |= u32::from(act.mask_bit(x)) << i;
            *v = T::from_f32(act.apply(x));
        }
        *word = w;
    }
    Ok(())
}

/// In place `dy = dy · act'` from the mask or the output the forward pass saved.
pub(super) fn unary_bwd(c: UnaryBwd<'_>) -> Result<(), TensorError> {
    let dtype = c.dy.dtype();
    with_float!(dtype, T => unary_bwd_t::<T>(c), Err(not_float("unary_bwd", dtype)))
}

fn unary_bwd_t<T: Float>(c: UnaryBwd<'_>) -> Result<(), TensorError> {
    const OP: &str = "unary_bwd";
    let UnaryBwd { act, saved, dy } = c;
    let dy = view_mut::<T>(OP, dy)?;
    match act.saves() {
        Saves::Mask => {
            for (chunk, &word) in dy.chunks_mut(32).zip(words(OP, saved)?) {
                for (i, v) in chunk.iter_mut().enumerate() {
                    let bit = (word >> i & 1) as f32;
                    *v = T::from_f32(act.grad(bit, v.to_f32()));
                }
            }
        }
        Saves::Output | Saves::Input => {
            for (v, &s) in dy.iter_mut().zip(view::<T>(OP, saved)?) {
                *v = T::from_f32(act.grad(s.to_f32(), v.to_f32()));
            }
        }
    }
    Ok(())
}

/// In place `a = a op b`.
pub(super) fn binary(c: Binary<'_>) -> Result<(), TensorError> {
    let dtype = c.a.dtype();
    with_float!(dtype, T => binary_t::<T>(c), Err(not_float("binary", dtype)))
}

fn binary_t<T: Float>(c: Binary<'_>) -> Result<(), TensorError> {
    const OP: &str = "binary";
    let Binary {
        op,
        a,
        b,
        relu,
        masked_by,
    } = c;
    let b = view::<T>(OP, b)?;
    for (x, &z) in view_mut::<T>(OP, a)?.iter_mut().zip(b) {
        *x = T::from_f32(op.apply(x.to_f32(), z.to_f32()));
    }
    match (relu, masked_by) {
        (Some(mask), _) => unary(Unary {
            act: Activation::Relu,
            y: a,
            aux: Some(mask),
        }),
        (None, Some(saved)) => unary_bwd(UnaryBwd {
            act: Activation::Relu,
            saved,
            dy: a,
        }),
        (None, None) => Ok(()),
    }
}

/// `y[..., j] += b[j]`.
pub(super) fn bias_add(c: BiasAdd<'_>) -> Result<(), TensorError> {
    let dtype = c.y.dtype();
    with_float!(dtype, T => bias_add_t::<T>(c), Err(not_float("bias_add", dtype)))
}

fn bias_add_t<T: Float>(c: BiasAdd<'_>) -> Result<(), TensorError> {
    const OP: &str = "bias_add";
    let BiasAdd { cols, y, b, .. } = c;
    let bias = view::<T>(OP, b)?;
    if cols > 0 {
        for row in view_mut::<T>(OP, y)?.chunks_exact_mut(cols) {
            for (v, b) in row.iter_mut().zip(bias) {
                *v = T::from_f32(v.to_f32() + b.to_f32());
            }
        }
    }
    Ok(())
}

/// `db[j] = sum of dy[..., j]`, in f64.
pub(super) fn bias_grad(c: BiasGrad<'_>) -> Result<(), TensorError> {
    let dtype = c.dy.dtype();
    with_float!(dtype, T => bias_grad_t::<T>(c), Err(not_float("bias_grad", dtype)))
}

fn bias_grad_t<T: Float>(c: BiasGrad<'_>) -> Result<(), TensorError> {
    const OP: &str = "bias_grad";
    let BiasGrad { dy, db, .. } = c;
    column_sums(view::<T>(OP, dy)?, view_mut::<T>(OP, db)?);
    Ok(())
}

/// `out[j] = sum_i m[i, j]` for the row-major matrix `m` with `out.len()` columns, in f64.
pub(super) fn column_sums<T: Float>(m: &[T], out: &mut [T]) {
    if out.is_empty() {
        return;
    }
    let mut acc = vec![0f64; out.len()];
    for row in m.chunks_exact(out.len()) {
        for (a, &v) in acc.iter_mut().zip(row) {
            *a += f64::from(v.to_f32());
        }
    }
    for (o, a) in out.iter_mut().zip(acc) {
        *o = T::from_f32(a as f32);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{backend, tensor};
    use crate::dtype::{bf16, f16};
    use crate::{Activation, BinaryOp, Category, DType, Tensor, TensorError, ops};

    #[test]
    fn fill_every_dtype() {
        let be = backend();
        let mut t = tensor(&be, &[1.0; 5], [5]);
        ops::fill(&mut t, -2.5).unwrap();
        assert_eq!(t.to_vec().unwrap(), vec![-2.5; 5]);
        let mut h = Tensor::empty(&be, [3], DType::BF16, Category::Other).unwrap();
        ops::fill(&mut h, 1.0 / 3.0).unwrap();
        assert_eq!(
            h.to_host::<bf16>().unwrap(),
            vec![bf16::from_f32(1.0 / 3.0); 3]
        );
        let mut m = Tensor::empty(&be, [3], DType::U32, Category::Other).unwrap();
        ops::upload(&[0xff; 12], &mut m).unwrap();
        ops::fill(&mut m, 0.0).unwrap();
        assert_eq!(m.to_vec_u32().unwrap(), vec![0; 3]);
        let e = ops::fill(&mut m, 1.0).unwrap_err();
        assert!(
            matches!(e, TensorError::InvalidArgument { op: "fill", .. }),
            "{e}"
        );
    }

    #[test]
    fn bias_add_and_grad() {
        let be = backend();
        let mut y = tensor(&be, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [1, 2, 3]);
        let b = tensor(&be, &[10.0, 20.0, 30.0], [3]);
        ops::bias_add(&mut y, &b).unwrap();
        assert_eq!(
            y.to_vec().unwrap(),
            vec![11.0, 22.0, 33.0, 14.0, 25.0, 36.0]
        );
        let mut db = tensor(&be, &[f32::NAN; 3], [3]);
        ops::bias_grad(&y, &mut db).unwrap();
        assert_eq!(db.to_vec().unwrap(), vec![25.0, 47.0, 69.0]);
        let bad = tensor(&be, &[0.0; 2], [2]);
        assert!(matches!(
            ops::bias_add(&mut y, &bad),
            Err(TensorError::Shape { .. })
        ));
        let mut bad = tensor(&be, &[0.0; 3], [1, 3]);
        assert!(matches!(
            ops::bias_grad(&y, &mut bad),
            Err(TensorError::Shape { .. })
        ));
        let _alias = y.clone();
        assert!(matches!(
            ops::bias_add(&mut y, &b),
            Err(TensorError::Aliased { .. })
        ));
    }

    #[test]
    fn relu_sets_exact_mask_words() {
        let be = backend();
        // 37 elements: two words, the second with 5 used bits.
        let xs: Vec<f32> = (0..37)
            .map(|i| if i % 3 == 0 { i as f32 } else { -(i as f32) })
            .collect();
        let mut x = tensor(&be, &xs, [37]);
        let mut mask = Tensor::empty(&be, [2], DType::U32, Category::Activation).unwrap();
        ops::upload(&[0xff; 8], &mut mask).unwrap();
        ops::unary(Activation::Relu, &mut x, Some(&mut mask)).unwrap();
        let want_x: Vec<f32> = xs.iter().map(|&v| v.max(0.0)).collect();
        assert_eq!(x.to_vec().unwrap(), want_x);
        // Set bits: i % 3 == 0 and i > 0 (x[0] = 0 is not > 0).
        let mut want = [0u32; 2];
        for i in (3..37).step_by(3) {
            want[i / 32] |= 1 << (i % 32);
        }
        assert_eq!(want, [0x4924_9248, 0b10010]);
        assert_eq!(mask.to_vec_u32().unwrap(), want.to_vec());

        let mut dy = tensor(&be, &[1.5; 37], [37]);
        ops::unary_bwd(Activation::Relu, &mask, &mut dy).unwrap();
        let want_dy: Vec<f32> = xs
            .iter()
            .map(|&v| if v > 0.0 { 1.5 } else { 0.0 })
            .collect();
        assert_eq!(dy.to_vec().unwrap(), want_dy);
    }

    #[test]
    fn binary_relu_is_the_sum_then_the_relu() {
        let be = backend();
        let (a, b) = (
            [1.0, -2.0, 0.5, f32::NAN, 3.0],
            [-1.0, 1.0, 0.25, 0.0, -4.0],
        );
        let mut x = tensor(&be, &a, [5]);
        let mut mask = Tensor::empty(&be, [1], DType::U32, Category::Activation).unwrap();
        ops::binary_relu(BinaryOp::Add, &mut x, &tensor(&be, &b, [5]), &mut mask).unwrap();
        let y = x.to_vec().unwrap();
        // 1 - 1 = 0 is not > 0; NaN propagates with its bit clear
        assert_eq!((y[0], y[1], y[2], y[4]), (0.0, 0.0, 0.75, 0.0));
        assert!(y[3].is_nan());
        assert_eq!(mask.to_vec_u32().unwrap(), [0b100]);
        let mut f32_mask = tensor(&be, &[0.0], [1]);
        let e = ops::binary_relu(BinaryOp::Add, &mut x, &tensor(&be, &b, [5]), &mut f32_mask);
        assert!(matches!(e, Err(TensorError::DType { .. })), "{e:?}");
        let mut short = tensor(&be, &[1.0; 2], [2]);
        let e = ops::binary_relu(BinaryOp::Mul, &mut short, &tensor(&be, &b, [5]), &mut mask);
        assert!(matches!(e, Err(TensorError::Shape { .. })), "{e:?}");
    }

    #[test]
    fn binary_masked_is_the_sum_then_the_relu_backward() {
        let be = backend();
        let (a, b) = ([1.0, -2.0, 0.5, 4.0, 3.0], [-1.5, 1.0, 0.25, 2.0, -4.0]);
        // a ReLU's mask with bits 1, 2 and 4 set
        let mut source = tensor(&be, &[-1.0, 2.0, 0.5, 0.0, 7.0], [5]);
        let mut mask = Tensor::empty(&be, [1], DType::U32, Category::Activation).unwrap();
        ops::unary(Activation::Relu, &mut source, Some(&mut mask)).unwrap();
        assert_eq!(mask.to_vec_u32().unwrap(), [0b10110]);
        let mut x = tensor(&be, &a, [5]);
        ops::binary_masked(BinaryOp::Add, &mut x, &tensor(&be, &b, [5]), &mask).unwrap();
        assert_eq!(x.to_vec().unwrap(), [0.0, -1.0, 0.75, 0.0, -1.0]);
        let mut x = tensor(&be, &a, [5]);
        ops::binary_masked(BinaryOp::Mul, &mut x, &tensor(&be, &b, [5]), &mask).unwrap();
        assert_eq!(x.to_vec().unwrap(), [0.0, -2.0, 0.125, 0.0, -12.0]);
        let e = ops::binary_masked(BinaryOp::Add, &mut x, &tensor(&be, &b, [5]), &source);
        assert!(matches!(e, Err(TensorError::DType { .. })), "{e:?}");
        let mut long = tensor(&be, &[1.0; 40], [40]);
        let e = ops::binary_masked(
            BinaryOp::Add,
            &mut long,
            &tensor(&be, &[1.0; 40], [40]),
            &mask,
        );
        assert!(matches!(e, Err(TensorError::Shape { .. })), "{e:?}");
    }

    #[test]
    fn relu_without_mask_and_nan() {
        let be = backend();
        let mut x = tensor(&be, &[-1.0, 0.0, 2.0, f32::NAN, f32::INFINITY], [5]);
        ops::unary(Activation::Relu, &mut x, None).unwrap();
        let y = x.to_vec().unwrap();
        // NaN propagates, as jnp.maximum(x, 0) does.
        assert_eq!((y[0], y[1], y[2], y[4]), (0.0, 0.0, 2.0, f32::INFINITY));
        assert!(y[3].is_nan());
    }

    #[test]
    fn relu_errors() {
        let be = backend();
        let mut x = tensor(&be, &[1.0; 33], [33]);
        let mut short = Tensor::empty(&be, [1], DType::U32, Category::Other).unwrap();
        let relu = Activation::Relu;
        assert!(matches!(
            ops::unary(relu, &mut x, Some(&mut short)),
            Err(TensorError::Shape { .. })
        ));
        let mut f32_mask = tensor(&be, &[0.0; 2], [2]);
        let e = ops::unary(relu, &mut x, Some(&mut f32_mask)).unwrap_err();
        assert!(matches!(e, TensorError::DType { .. }), "{e}");
        let y2 = x.clone();
        assert!(matches!(
            ops::unary(relu, &mut x, None),
            Err(TensorError::Aliased { op: "unary", .. })
        ));
        drop(y2);
        let mask = Tensor::empty(&be, [2], DType::U32, Category::Other).unwrap();
        let _m2 = mask.clone();
        // A shared mask may be read by the backward pass, but not written by the forward.
        ops::unary_bwd(relu, &mask, &mut x).unwrap();
        let mut shared = mask.clone();
        assert!(matches!(
            ops::unary(relu, &mut x, Some(&mut shared)),
            Err(TensorError::Aliased { .. })
        ));
        assert!(matches!(
            ops::unary_bwd(relu, &short, &mut x),
            Err(TensorError::Shape { .. })
        ));
        // tanh keeps its output, not a mask
        let mut m = Tensor::empty(&be, [2], DType::U32, Category::Other).unwrap();
        let e = ops::unary(Activation::Tanh, &mut x, Some(&mut m)).unwrap_err();
        assert!(matches!(e, TensorError::InvalidArgument { .. }), "{e}");
    }

    /// Every elementwise op in bf16 and f16 equals the f32 computation on the same (rounded)
    /// inputs, rounded once to the dtype.
    #[test]
    fn half_dtypes_are_f32_rounded_once() {
        let be = backend();
        let xs: Vec<f32> = (0..50).map(|i| (i as f32 - 25.0) / 7.3).collect();
        for dtype in [DType::BF16, DType::F16] {
            let round = |v: f32| match dtype {
                DType::BF16 => bf16::from_f32(v).to_f32(),
                _ => f16::from_f32(v).to_f32(),
            };
            let xr: Vec<f32> = xs.iter().map(|&v| round(v)).collect();
            let make = |vals: &[f32]| {
                let mut t = Tensor::empty(&be, [vals.len()], dtype, Category::Other).unwrap();
                match dtype {
                    DType::BF16 => {
                        let h: Vec<bf16> = vals.iter().map(|&v| bf16::from_f32(v)).collect();
                        ops::upload(bytemuck::cast_slice(&h), &mut t).unwrap();
                    }
                    _ => {
                        let h: Vec<f16> = vals.iter().map(|&v| f16::from_f32(v)).collect();
                        ops::upload(bytemuck::cast_slice(&h), &mut t).unwrap();
                    }
                }
                t
            };
            let mut y = make(&xr);
            ops::unary(Activation::Tanh, &mut y, None).unwrap();
            let want: Vec<f32> = xr.iter().map(|&v| round(v.tanh())).collect();
            assert_eq!(y.to_vec().unwrap(), want, "{dtype} tanh");
            let mut dy = make(&xr);
            ops::unary_bwd(Activation::Tanh, &y, &mut dy).unwrap();
            let yv = y.to_vec().unwrap();
            let want: Vec<f32> = xr
                .iter()
                .zip(&yv)
                .map(|(&g, &s)| round(g * (1.0 - s * s)))
                .collect();
            assert_eq!(dy.to_vec().unwrap(), want, "{dtype} tanh backward");
            let mut a = make(&xr);
            ops::binary(BinaryOp::Add, &mut a, &y).unwrap();
            let want: Vec<f32> = xr.iter().zip(&yv).map(|(&x, &s)| round(x + s)).collect();
            assert_eq!(a.to_vec().unwrap(), want, "{dtype} add");
            let mut r = make(&xr);
            let mut mask = Tensor::empty(&be, [2], DType::U32, Category::Other).unwrap();
            ops::unary(Activation::Relu, &mut r, Some(&mut mask)).unwrap();
            let want: Vec<f32> = xr.iter().map(|&v| v.max(0.0)).collect();
            assert_eq!(r.to_vec().unwrap(), want, "{dtype} relu");
            let mut b = make(&xr[..10]).reshape([2, 5]).unwrap();
            let bias = make(&xr[10..15]);
            ops::bias_add(&mut b, &bias).unwrap();
            let want: Vec<f32> = (0..10).map(|i| round(xr[i] + xr[10 + i % 5])).collect();
            assert_eq!(b.to_vec().unwrap(), want, "{dtype} bias_add");
        }
    }
}
