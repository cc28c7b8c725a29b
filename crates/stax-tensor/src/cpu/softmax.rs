//! Softmax cross-entropy fused with its gradient, on the host.
//!
//! Mirrors `jnp.mean(optax.softmax_cross_entropy(logits, labels))`: per row
//! `loss_i = -sum_j labels[i, j] · log_softmax(logits[i])[j]`, with
//! `log_softmax(x)_j = x_j - m - ln(sum_l exp(x_l - m))` and `m = max_l x_l` (the max is
//! subtracted so large logits stay finite, as `jax.nn.log_softmax`). The gradient written is
//! `(softmax(logits) - labels) / n`, as [`crate::Backend::softmax_xent`] defines it: the exact
//! gradient of the mean when every label row sums to 1 (one-hot or a distribution).
//! Each row is computed in f64 and rounded once.

use super::{data, data_mut};
use crate::TensorError;
use crate::backend::SoftmaxXent;

const OP: &str = "softmax_xent";

/// Mean softmax cross-entropy of `logits` against `labels` (both `[n, k]`, labels are
/// probabilities); writes `dlogits = (softmax(logits) - labels) / n` (`[n, k]`).
///
/// # Errors
/// [`TensorError::Shape`] unless logits are 2-D and labels and dlogits have their shape;
/// [`TensorError::InvalidArgument`] if `n` or `k` is 0 (the mean is undefined);
/// dtype, device and alias errors as for every op.
pub(crate) fn softmax_xent(c: SoftmaxXent<'_>) -> Result<f32, TensorError> {
    let SoftmaxXent {
        rows: n,
        classes: k,
        logits,
        labels,
        dlogits,
    } = c;
    let x = data(OP, logits)?;
    let y = data(OP, labels)?;
    let d = data_mut(OP, dlogits)?;
    let inv_n = 1.0 / n as f64;
    let mut total = 0f64;
    for ((xr, yr), dr) in x
        .chunks_exact(k)
        .zip(y.chunks_exact(k))
        .zip(d.chunks_exact_mut(k))
    {
        let m = xr
            .iter()
            .fold(f64::NEG_INFINITY, |a, &v| a.max(f64::from(v)));
        let s: f64 = xr.iter().map(|&v| (f64::from(v) - m).exp()).sum();
        let log_s = s.ln();
        for ((&xv, &yv), dv) in xr.iter().zip(yr).zip(dr.iter_mut()) {
            let shifted = f64::from(xv) - m;
            total -= f64::from(yv) * (shifted - log_s);
            *dv = (((shifted.exp() / s) - f64::from(yv)) * inv_n) as f32;
        }
    }
    Ok((total * inv_n) as f32)
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_close, backend, random_vec, rng, tensor};
    use crate::ops;
    use crate::{Backend, Category, DType, Tensor, TensorError};
    use std::sync::Arc;

    fn run(be: &Arc<dyn Backend>, x: &[f32], y: &[f32], n: usize, k: usize) -> (f32, Vec<f32>) {
        let logits = tensor(be, x, [n, k]);
        let labels = tensor(be, y, [n, k]);
        let mut d = tensor(be, &vec![f32::NAN; n * k], [n, k]);
        let loss = ops::softmax_xent(&logits, &labels, &mut d).unwrap();
        (loss, d.to_vec().unwrap())
    }

    #[test]
    fn matches_hand_computed_values() {
        let be = backend();
        // loss = log(1 + e^-1 + e^-2); softmax = [e^1, e^2, e^3] / (e^1 + e^2 + e^3).
        let (loss, d) = run(&be, &[1.0, 2.0, 3.0], &[0.0, 0.0, 1.0], 1, 3);
        assert!((loss - 0.407_605_96).abs() < 1e-6, "{loss}");
        assert_close(
            &d,
            &[0.090_030_57, 0.244_728_48, -0.334_759_04],
            1e-6,
            1e-6,
            "dlogits",
        );
        // Two rows: the mean, and gradients divided by n = 2. Row 2 has equal logits, so its
        // loss against a one-hot label is ln 3.
        let (loss, d) = run(
            &be,
            &[1.0, 2.0, 3.0, 5.0, 5.0, 5.0],
            &[0.0, 0.0, 1.0, 1.0, 0.0, 0.0],
            2,
            3,
        );
        let want = (0.407_605_96 + 3f64.ln()) / 2.0;
        assert!((f64::from(loss) - want).abs() < 1e-6, "{loss}");
        let third = 1.0 / 6.0;
        let want_d = [
            0.045_015_29,
            0.122_364_24,
            -0.167_379_52,
            third - 0.5,
            third,
            third,
        ];
        assert_close(&d, &want_d, 1e-6, 1e-6, "dlogits");
    }

    #[test]
    fn gradient_matches_finite_differences() {
        let be = backend();
        let mut r = rng(7);
        let (n, k) = (3, 5);
        let x = random_vec(&mut r, n * k)
            .iter()
            .map(|v| 3.0 * v)
            .collect::<Vec<_>>();
        // Soft labels: random positive rows normalized to sum 1.
        let mut y: Vec<f32> = random_vec(&mut r, n * k)
            .iter()
            .map(|v| v.abs() + 0.1)
            .collect();
        for row in y.chunks_exact_mut(k) {
            let s: f32 = row.iter().sum();
            row.iter_mut().for_each(|v| *v /= s);
        }
        let (_, d) = run(&be, &x, &y, n, k);
        let h = 1e-2f32;
        let fd: Vec<f32> = (0..n * k)
            .map(|i| {
                let (mut xp, mut xm) = (x.clone(), x.clone());
                xp[i] += h;
                xm[i] -= h;
                let (lp, lm) = (run(&be, &xp, &y, n, k).0, run(&be, &xm, &y, n, k).0);
                (f64::from(lp - lm) / f64::from(2.0 * h)) as f32
            })
            .collect();
        assert_close(
            &d,
            &fd,
            2e-3,
            2e-4,
            "softmax_xent gradient vs finite differences",
        );
    }

    #[test]
    fn large_logits_stay_finite() {
        let be = backend();
        let (loss, d) = run(&be, &[1000.0, 0.0, -1000.0], &[0.0, 1.0, 0.0], 1, 3);
        assert_eq!(loss, 1000.0);
        assert_eq!(d, vec![1.0, -1.0, 0.0]);
        let (loss, d) = run(&be, &[1000.0, 1000.0], &[1.0, 0.0], 1, 2);
        assert!((loss - std::f32::consts::LN_2).abs() < 1e-6);
        assert_eq!(d, vec![-0.5, 0.5]);
    }

    #[test]
    fn errors() {
        let be = backend();
        let empty = Tensor::empty(&be, [0, 3], DType::F32, Category::Other).unwrap();
        let mut d0 = Tensor::empty(&be, [0, 3], DType::F32, Category::Other).unwrap();
        let e = ops::softmax_xent(&empty, &empty, &mut d0).unwrap_err();
        assert!(matches!(e, TensorError::InvalidArgument { .. }), "{e}");
        let no_classes = Tensor::empty(&be, [2, 0], DType::F32, Category::Other).unwrap();
        let mut d1 = Tensor::empty(&be, [2, 0], DType::F32, Category::Other).unwrap();
        let e = ops::softmax_xent(&no_classes, &no_classes, &mut d1).unwrap_err();
        assert!(matches!(e, TensorError::InvalidArgument { .. }), "{e}");
        let x = tensor(&be, &[0.0; 6], [2, 3]);
        let y = tensor(&be, &[0.0; 6], [3, 2]);
        let mut d = tensor(&be, &[0.0; 6], [2, 3]);
        assert!(matches!(
            ops::softmax_xent(&x, &y, &mut d),
            Err(TensorError::Shape { .. })
        ));
        let flat = tensor(&be, &[0.0; 6], [6]);
        assert!(matches!(
            ops::softmax_xent(&flat, &flat, &mut d),
            Err(TensorError::Shape { .. })
        ));
        let _alias = d.clone();
        assert!(matches!(
            ops::softmax_xent(&x, &x, &mut d),
            Err(TensorError::Aliased { .. })
        ));
    }
}
