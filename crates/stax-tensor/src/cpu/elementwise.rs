//! Elementwise ops on the host: fill, bias add and its gradient, ReLU forward and backward.
//!
//! ReLU masks are packed bits, as the CUDA kernels keep them: a `U32` tensor of
//! `ceil(numel / 32)` words where bit `i % 32` of word `i / 32` is `x[i] > 0`, and the bits past
//! `numel` in the last word are zero.

use super::{data, data_mut, words, words_mut};
use crate::{DType, Shape, Tensor, TensorError};

/// Sets every element of `t` to `value`; a `U32` tensor only takes `value == 0` (written as 0).
///
/// # Errors
/// [`TensorError::InvalidArgument`] for a non-zero `value` on a `U32` tensor;
/// [`TensorError::Aliased`] if `t` shares its buffer; [`TensorError::DeviceMismatch`].
pub(crate) fn fill(t: &mut Tensor, value: f32) -> Result<(), TensorError> {
    const OP: &str = "fill";
    match t.dtype() {
        DType::F32 => data_mut(OP, t)?.fill(value),
        DType::U32 if value == 0.0 => words_mut(OP, t)?.fill(0),
        DType::U32 => {
            return Err(TensorError::InvalidArgument {
                op: OP,
                reason: format!("a u32 tensor can only be filled with 0, not {value}"),
            });
        }
    }
    Ok(())
}

/// Checks that a bias has shape `[c]`, `c` being the last dimension of `of`.
fn expect_bias(op: &'static str, bias: &Tensor, of: &Tensor) -> Result<usize, TensorError> {
    let c = of.shape().last();
    bias.expect_shape(op, &Shape::new([c]))?;
    Ok(c)
}

/// `y[..., j] += b[j]`; `y` any shape (a scalar counts as `[1]`), `b` is `[y.shape().last()]`.
///
/// # Errors
/// [`TensorError::Shape`] if `b` is not `[last]`; dtype, device and alias errors as usual.
pub(crate) fn bias_add(y: &mut Tensor, b: &Tensor) -> Result<(), TensorError> {
    const OP: &str = "bias_add";
    let c = expect_bias(OP, b, y)?;
    let bias = data(OP, b)?;
    let y = data_mut(OP, y)?;
    if c > 0 {
        add_rows(y, bias);
    }
    Ok(())
}

/// Adds `bias` (length `c > 0`) to every row of the row-major `[_, c]` matrix `y`.
fn add_rows(y: &mut [f32], bias: &[f32]) {
    for row in y.chunks_exact_mut(bias.len()) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

/// `db[j] = sum of dy[..., j]` over all leading dimensions, accumulated in f64.
///
/// # Errors
/// [`TensorError::Shape`] if `db` is not `[dy.shape().last()]`; dtype, device and alias errors.
pub(crate) fn bias_grad(dy: &Tensor, db: &mut Tensor) -> Result<(), TensorError> {
    const OP: &str = "bias_grad";
    expect_bias(OP, db, dy)?;
    let dy = data(OP, dy)?;
    column_sums(dy, data_mut(OP, db)?);
    Ok(())
}

/// `out[j] = sum_i m[i, j]` for the row-major matrix `m` with `out.len()` columns, in f64.
pub(crate) fn column_sums(m: &[f32], out: &mut [f32]) {
    if out.is_empty() {
        return;
    }
    let mut acc = vec![0f64; out.len()];
    for row in m.chunks_exact(out.len()) {
        for (a, &v) in acc.iter_mut().zip(row) {
            *a += f64::from(v);
        }
    }
    for (o, a) in out.iter_mut().zip(acc) {
        *o = a as f32;
    }
}

/// Checks that `mask` holds `ceil(numel / 32)` words.
fn expect_mask(op: &'static str, mask: &Tensor, numel: usize) -> Result<(), TensorError> {
    let want = numel.div_ceil(32);
    if mask.numel() != want {
        return Err(TensorError::Shape {
            op,
            reason: format!("a mask for {numel} elements needs {want} u32 words"),
            got: mask.shape().clone(),
        });
    }
    Ok(())
}

/// In-place ReLU `x = x > 0 ? x : 0` (NaN becomes 0, as CUDA's `fmaxf`); with a mask, bit `i`
/// is `x[i] > 0` and the trailing bits of the last word are cleared.
///
/// # Errors
/// [`TensorError::Shape`] for a mask of the wrong length, [`TensorError::DType`] unless `x` is
/// f32 and the mask u32, [`TensorError::Aliased`] if either output shares its buffer.
/// `max(v, 0)` with NaN propagated, as `jnp.maximum(x, 0)` does (a NaN input must reach the
/// loss, where the trainer reports it, instead of being silently zeroed).
fn relu1(v: f32) -> f32 {
    if v > 0.0 || v.is_nan() { v } else { 0.0 }
}

pub(crate) fn relu(x: &mut Tensor, mask: Option<&mut Tensor>) -> Result<(), TensorError> {
    const OP: &str = "relu";
    let numel = x.numel();
    let Some(mask) = mask else {
        for v in data_mut(OP, x)? {
            *v = relu1(*v);
        }
        return Ok(());
    };
    expect_mask(OP, mask, numel)?;
    let bits = words_mut(OP, mask)?;
    let x = data_mut(OP, x)?;
    for (chunk, word) in x.chunks_mut(32).zip(bits) {
        let mut w = 0u32;
        for (i, v) in chunk.iter_mut().enumerate() {
            let on = *v > 0.0;
            w |= u32::from(on) << i;
            *v = relu1(*v);
        }
        *word = w;
    }
    Ok(())
}

/// In-place ReLU backward: `dy[i] = 0` where bit `i` of `mask` is clear (see [`relu`]).
///
/// # Errors
/// As [`relu`]; `mask` must hold `ceil(dy.numel() / 32)` u32 words.
pub(crate) fn relu_bwd(dy: &mut Tensor, mask: &Tensor) -> Result<(), TensorError> {
    const OP: &str = "relu_bwd";
    expect_mask(OP, mask, dy.numel())?;
    let bits = words(OP, mask)?;
    let dy = data_mut(OP, dy)?;
    for (chunk, &word) in dy.chunks_mut(32).zip(bits) {
        for (i, v) in chunk.iter_mut().enumerate() {
            if word >> i & 1 == 0 {
                *v = 0.0;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testing::{backend, tensor};
    use crate::{Category, DType, Tensor, TensorError};

    #[test]
    fn fill_f32_and_u32() {
        let be = backend();
        let mut t = tensor(&be, &[1.0; 5], [5]);
        be.fill(&mut t, -2.5).unwrap();
        assert_eq!(t.to_vec().unwrap(), vec![-2.5; 5]);
        let mut m = Tensor::empty(&be, [3], DType::U32, Category::Other).unwrap();
        be.upload(&[0xff; 12], &mut m).unwrap();
        be.fill(&mut m, 0.0).unwrap();
        assert_eq!(m.to_vec_u32().unwrap(), vec![0; 3]);
        let e = be.fill(&mut m, 1.0).unwrap_err();
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
        be.bias_add(&mut y, &b).unwrap();
        assert_eq!(
            y.to_vec().unwrap(),
            vec![11.0, 22.0, 33.0, 14.0, 25.0, 36.0]
        );
        let mut db = tensor(&be, &[f32::NAN; 3], [3]);
        be.bias_grad(&y, &mut db).unwrap();
        assert_eq!(db.to_vec().unwrap(), vec![25.0, 47.0, 69.0]);
        let bad = tensor(&be, &[0.0; 2], [2]);
        assert!(matches!(
            be.bias_add(&mut y, &bad),
            Err(TensorError::Shape { .. })
        ));
        let mut bad = tensor(&be, &[0.0; 3], [1, 3]);
        assert!(matches!(
            be.bias_grad(&y, &mut bad),
            Err(TensorError::Shape { .. })
        ));
        let _alias = y.clone();
        assert!(matches!(
            be.bias_add(&mut y, &b),
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
        be.upload(&[0xff; 8], &mut mask).unwrap();
        be.relu(&mut x, Some(&mut mask)).unwrap();
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
        be.relu_bwd(&mut dy, &mask).unwrap();
        let want_dy: Vec<f32> = xs
            .iter()
            .map(|&v| if v > 0.0 { 1.5 } else { 0.0 })
            .collect();
        assert_eq!(dy.to_vec().unwrap(), want_dy);
    }

    #[test]
    fn relu_without_mask_and_nan() {
        let be = backend();
        let mut x = tensor(&be, &[-1.0, 0.0, 2.0, f32::NAN, f32::INFINITY], [5]);
        be.relu(&mut x, None).unwrap();
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
        assert!(matches!(
            be.relu(&mut x, Some(&mut short)),
            Err(TensorError::Shape { .. })
        ));
        let mut f32_mask = tensor(&be, &[0.0; 2], [2]);
        let e = be.relu(&mut x, Some(&mut f32_mask)).unwrap_err();
        assert!(matches!(e, TensorError::DType { .. }), "{e}");
        let y2 = x.clone();
        assert!(matches!(
            be.relu(&mut x, None),
            Err(TensorError::Aliased { op: "relu" })
        ));
        drop(y2);
        let mask = Tensor::empty(&be, [2], DType::U32, Category::Other).unwrap();
        let _m2 = mask.clone();
        // A shared mask may be read by relu_bwd, but not written by relu.
        be.relu_bwd(&mut x, &mask).unwrap();
        let mut shared = mask.clone();
        assert!(matches!(
            be.relu(&mut x, Some(&mut shared)),
            Err(TensorError::Aliased { .. })
        ));
        assert!(matches!(
            be.relu_bwd(&mut x, &short),
            Err(TensorError::Shape { .. })
        ));
    }
}
