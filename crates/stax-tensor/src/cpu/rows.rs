//! Softmax and log-softmax over an axis, the losses with integer labels, and dropout, on the
//! host. Rows are gathered into an f64 buffer, computed in f64 and rounded once; dropout draws
//! each element's bits from [`crate::ops::dropout_bits`], as the CUDA kernels do.

use super::elementwise::not_float;
use super::host::{data, data_mut, view, view_mut, words, words_mut};
use crate::backend::{AxisDims, Dropout, DropoutBwd, IndexLossCall, Softmax, SoftmaxBwd};
use crate::ops::{dropout_bits, label_out_of_range};
use crate::{Float, IndexLoss, SoftmaxKind, TensorError, with_float};

/// `(m, s)` of a row: its maximum and `sum(exp(x - m))` (the log-sum-exp is `m + ln s`).
fn max_and_sum(row: &[f64]) -> (f64, f64) {
    let m = row.iter().fold(f64::NEG_INFINITY, |a, &v| a.max(v));
    (m, row.iter().map(|&v| (v - m).exp()).sum())
}

/// Calls `f(row, grad)` on every row of `a` (and the same row of `b`) along `dims`, in f64,
/// and writes `row` back to `a`.
fn for_rows<T: Float>(
    dims: &AxisDims,
    a: &mut [T],
    b: Option<&[T]>,
    mut f: impl FnMut(&mut [f64], &[f64]),
) {
    let (mut row, mut other) = (vec![0f64; dims.len], vec![0f64; dims.len]);
    for r in 0..dims.rows() {
        let at = |j: usize| dims.row_start(r) + j * dims.inner;
        for j in 0..dims.len {
            row[j] = f64::from(a[at(j)].to_f32());
            if let Some(b) = b {
                other[j] = f64::from(b[at(j)].to_f32());
            }
        }
        f(&mut row, &other);
        for (j, &v) in row.iter().enumerate() {
            a[at(j)] = T::from_f32(v as f32);
        }
    }
}

/// In place softmax or log-softmax of `y` along the axis.
pub(super) fn softmax(c: Softmax<'_>) -> Result<(), TensorError> {
    let dtype = c.y.dtype();
    with_float!(dtype, T => softmax_t::<T>(c), Err(not_float("softmax", dtype)))
}

fn softmax_t<T: Float>(c: Softmax<'_>) -> Result<(), TensorError> {
    let Softmax { kind, dims, y } = c;
    for_rows(&dims, view_mut::<T>("softmax", y)?, None, |row, _| {
        let (m, s) = max_and_sum(row);
        let log_s = s.ln();
        for v in row.iter_mut() {
            *v = match kind {
                SoftmaxKind::Softmax => (*v - m).exp() / s,
                SoftmaxKind::LogSoftmax => *v - m - log_s,
            };
        }
    });
    Ok(())
}

/// In place `dy = dL/dx` of the softmax or log-softmax from its output `y`.
pub(super) fn softmax_bwd(c: SoftmaxBwd<'_>) -> Result<(), TensorError> {
    let dtype = c.dy.dtype();
    with_float!(dtype, T => softmax_bwd_t::<T>(c), Err(not_float("softmax_bwd", dtype)))
}

fn softmax_bwd_t<T: Float>(c: SoftmaxBwd<'_>) -> Result<(), TensorError> {
    const OP: &str = "softmax_bwd";
    let SoftmaxBwd { kind, dims, y, dy } = c;
    let y = view::<T>(OP, y)?;
    for_rows(&dims, view_mut::<T>(OP, dy)?, Some(y), |g, y| match kind {
        SoftmaxKind::Softmax => {
            let s: f64 = g.iter().zip(y).map(|(g, y)| g * y).sum();
            g.iter_mut().zip(y).for_each(|(g, y)| *g = y * (*g - s));
        }
        SoftmaxKind::LogSoftmax => {
            let s: f64 = g.iter().sum();
            g.iter_mut().zip(y).for_each(|(g, y)| *g -= y.exp() * s);
        }
    });
    Ok(())
}

/// The mean loss of `logits` against integer `labels`; writes its gradient (see
/// [`crate::ops::index_loss`]). Every label is checked before anything is written.
pub(super) fn index_loss(c: IndexLossCall<'_>) -> Result<f32, TensorError> {
    const OP: &str = "index_loss";
    let IndexLossCall {
        loss,
        rows: n,
        classes: k,
        logits,
        labels,
        dlogits,
    } = c;
    let labels = words(OP, labels)?;
    if let Some((row, &label)) = labels.iter().enumerate().find(|(_, l)| **l as usize >= k) {
        return Err(label_out_of_range(row, label, k));
    }
    let (z, d) = (data(OP, logits)?, data_mut(OP, dlogits)?);
    let inv_n = 1.0 / n as f64;
    let mut total = 0f64;
    let mut row = vec![0f64; k];
    for ((zr, dr), &label) in z.chunks_exact(k).zip(d.chunks_exact_mut(k)).zip(labels) {
        let label = label as usize;
        row.iter_mut().zip(zr).for_each(|(r, &v)| *r = f64::from(v));
        let hot = |j: usize| f64::from(u8::from(j == label));
        match loss {
            IndexLoss::SoftmaxCrossEntropy => {
                let (m, s) = max_and_sum(&row);
                total += m + s.ln() - row[label];
                for (j, dv) in dr.iter_mut().enumerate() {
                    *dv = (((row[j] - m).exp() / s - hot(j)) * inv_n) as f32;
                }
            }
            IndexLoss::NegLogLikelihood => {
                total -= row[label];
                for (j, dv) in dr.iter_mut().enumerate() {
                    *dv = (-hot(j) * inv_n) as f32;
                }
            }
        }
    }
    Ok((total * inv_n) as f32)
}

/// In place dropout of `y`, its keep bits into the mask.
pub(super) fn dropout(c: Dropout<'_>) -> Result<(), TensorError> {
    let dtype = c.y.dtype();
    with_float!(dtype, T => dropout_t::<T>(c), Err(not_float("dropout", dtype)))
}

fn dropout_t<T: Float>(c: Dropout<'_>) -> Result<(), TensorError> {
    const OP: &str = "dropout";
    let Dropout {
        rate,
        threshold,
        key,
        y,
        mask,
    } = c;
    let y = view_mut::<T>(OP, y)?;
    for (w, (chunk, word)) in y.chunks_mut(32).zip(words_mut(OP, mask)?).enumerate() {
        let mut bits = 0u32;
        for (i, v) in chunk.iter_mut().enumerate() {
            let keep = u64::from(dropout_bits(key, (w * 32 + i) as u64)) < threshold;
            bits |= u32::from(keep) << i;
            *v = T::from_f32(if keep { v.to_f32() / rate } else { 0.0 });
        }
        *word = bits;
    }
    Ok(())
}

/// In place dropout backward of `dy` from the mask.
pub(super) fn dropout_bwd(c: DropoutBwd<'_>) -> Result<(), TensorError> {
    let dtype = c.dy.dtype();
    with_float!(dtype, T => dropout_bwd_t::<T>(c), Err(not_float("dropout_bwd", dtype)))
}

fn dropout_bwd_t<T: Float>(c: DropoutBwd<'_>) -> Result<(), TensorError> {
    const OP: &str = "dropout_bwd";
    let DropoutBwd { rate, mask, dy } = c;
    let dy = view_mut::<T>(OP, dy)?;
    for (chunk, &word) in dy.chunks_mut(32).zip(words(OP, mask)?) {
        for (i, v) in chunk.iter_mut().enumerate() {
            let keep = word >> i & 1 == 1;
            *v = T::from_f32(if keep { v.to_f32() / rate } else { 0.0 });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_close, backend, random_vec, rng, tensor};
    use crate::{Category, DType, IndexLoss, SoftmaxKind, Tensor, TensorError, ops};

    fn labels(be: &std::sync::Arc<dyn crate::Backend>, v: &[u32]) -> Tensor {
        let mut t = Tensor::empty(be, [v.len()], DType::U32, Category::Input).unwrap();
        ops::upload(bytemuck::cast_slice(v), &mut t).unwrap();
        t
    }

    /// Softmax over the middle axis of [2, 3, 2]: each (outer, inner) row is normalized.
    #[test]
    fn softmax_over_an_inner_axis() {
        let be = backend();
        let x: Vec<f32> = (0..12).map(|i| (i as f32 * 0.7).sin() * 3.0).collect();
        let mut y = tensor(&be, &x, [2, 3, 2]);
        ops::softmax(SoftmaxKind::Softmax, 1, &mut y).unwrap();
        let y = y.to_vec().unwrap();
        for (o, i) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
            let at = |j: usize| o * 6 + j * 2 + i;
            let e: Vec<f64> = (0..3).map(|j| f64::from(x[at(j)]).exp()).collect();
            let s: f64 = e.iter().sum();
            let got: Vec<f32> = (0..3).map(|j| y[at(j)]).collect();
            let want: Vec<f64> = e.iter().map(|v| v / s).collect();
            assert_close(&got, &want, 1e-6, 1e-7, "softmax row");
        }
        let mut ly = tensor(&be, &x, [2, 3, 2]);
        ops::softmax(SoftmaxKind::LogSoftmax, 1, &mut ly).unwrap();
        let want: Vec<f64> = y.iter().map(|&v| f64::from(v).ln()).collect();
        assert_close(&ly.to_vec().unwrap(), &want, 1e-5, 1e-6, "log_softmax");
    }

    /// Both backward passes against finite differences of `sum(f(x) * r)`.
    #[test]
    fn softmax_backward_matches_finite_differences() {
        let be = backend();
        let mut r = rng(3);
        let (x, w) = (random_vec(&mut r, 15), random_vec(&mut r, 15));
        for kind in [SoftmaxKind::Softmax, SoftmaxKind::LogSoftmax] {
            let f = |x: &[f32]| -> f64 {
                let mut y = tensor(&be, x, [3, 5]);
                ops::softmax(kind, 1, &mut y).unwrap();
                let y = y.to_vec().unwrap();
                y.iter().zip(&w).map(|(a, b)| f64::from(a * b)).sum()
            };
            let mut y = tensor(&be, &x, [3, 5]);
            ops::softmax(kind, 1, &mut y).unwrap();
            let mut g = tensor(&be, &w, [3, 5]);
            ops::softmax_bwd(kind, 1, &y, &mut g).unwrap();
            let h = 1e-2f32;
            let fd: Vec<f64> = (0..15)
                .map(|i| {
                    let (mut p, mut m) = (x.clone(), x.clone());
                    p[i] += h;
                    m[i] -= h;
                    (f(&p) - f(&m)) / (2.0 * f64::from(h))
                })
                .collect();
            assert_close(&g.to_vec().unwrap(), &fd, 1e-3, 1e-4, kind.name());
        }
    }

    /// Softmax cross-entropy with integer labels equals the one-hot op's on the same rows;
    /// the NLL is `-mean(z[label])` with gradient `-one_hot / n`.
    #[test]
    fn index_losses_match_their_formulas() {
        let be = backend();
        let (n, k) = (4, 5);
        let z = random_vec(&mut rng(11), n * k);
        let y = [3u32, 0, 4, 0];
        let mut hot = vec![0f32; n * k];
        y.iter()
            .enumerate()
            .for_each(|(i, &c)| hot[i * k + c as usize] = 1.0);
        let (zt, yt) = (tensor(&be, &z, [n, k]), labels(&be, &y));
        let mut d = tensor(&be, &vec![f32::NAN; n * k], [n, k]);
        let loss = ops::index_loss(IndexLoss::SoftmaxCrossEntropy, &zt, &yt, &mut d).unwrap();
        let mut d1 = tensor(&be, &vec![f32::NAN; n * k], [n, k]);
        let one_hot = ops::softmax_xent(&zt, &tensor(&be, &hot, [n, k]), &mut d1).unwrap();
        assert!(
            (loss - one_hot).abs() <= 1e-6 * one_hot.abs(),
            "{loss} vs {one_hot}"
        );
        assert_close(
            &d.to_vec().unwrap(),
            &d1.to_vec().unwrap(),
            1e-6,
            1e-8,
            "dlogits",
        );
        let loss = ops::index_loss(IndexLoss::NegLogLikelihood, &zt, &yt, &mut d).unwrap();
        let picked: f32 = y
            .iter()
            .enumerate()
            .map(|(i, &c)| z[i * k + c as usize])
            .sum();
        assert!((loss + picked / n as f32).abs() < 1e-6, "{loss}");
        let want: Vec<f32> = hot.iter().map(|h| -h / n as f32).collect();
        assert_eq!(d.to_vec().unwrap(), want);
    }

    #[test]
    fn index_loss_errors() {
        let be = backend();
        let z = tensor(&be, &[0.0; 6], [2, 3]);
        let mut d = tensor(&be, &[7.0; 6], [2, 3]);
        let e = ops::index_loss(
            IndexLoss::NegLogLikelihood,
            &z,
            &labels(&be, &[1, 3]),
            &mut d,
        )
        .unwrap_err();
        assert!(e.to_string().contains("label 3 of row 1"), "{e}");
        assert_eq!(d.to_vec().unwrap(), [7.0; 6], "written before failing");
        let e = ops::index_loss(IndexLoss::NegLogLikelihood, &z, &labels(&be, &[1]), &mut d)
            .unwrap_err();
        assert!(matches!(e, TensorError::Shape { .. }), "{e}");
        let e = ops::index_loss(IndexLoss::NegLogLikelihood, &z, &z, &mut d).unwrap_err();
        assert!(matches!(e, TensorError::DType { .. }), "{e}");
    }

    /// Dropout keeps about `rate` of the elements, scales them by `1 / rate`, records them in
    /// the mask, and its backward pass applies the same mask; a bad rate is an error.
    #[test]
    fn dropout_keeps_rate_and_masks_its_gradient() {
        let be = backend();
        let n = 20_011; // a last word of 11 bits
        let mut y = tensor(&be, &vec![1.5; n], [n]);
        let mut mask = Tensor::empty(&be, [n.div_ceil(32)], DType::U32, Category::Other).unwrap();
        ops::dropout(0.8, 42, &mut y, &mut mask).unwrap();
        let y = y.to_vec().unwrap();
        let kept = y.iter().filter(|&&v| v != 0.0).count();
        assert!(
            (kept as f64 / n as f64 - 0.8).abs() < 0.01,
            "kept {kept} of {n}"
        );
        assert!(y.iter().all(|&v| v == 0.0 || v == 1.5 / 0.8));
        let words = mask.to_vec_u32().unwrap();
        for (i, &v) in y.iter().enumerate() {
            let bit = words[i / 32] >> (i % 32) & 1 == 1;
            assert_eq!(bit, v != 0.0, "mask bit {i}");
            assert_eq!(
                bit,
                u64::from(ops::dropout_bits(42, i as u64)) < ops::keep_threshold(0.8)
            );
        }
        assert_eq!(words[n / 32] >> (n % 32), 0, "bits past the end are clear");
        let mut g = tensor(&be, &vec![2.0; n], [n]);
        ops::dropout_bwd(0.8, &mask, &mut g).unwrap();
        let g = g.to_vec().unwrap();
        assert!(g.iter().zip(&y).all(|(&g, &v)| (g == 0.0) == (v == 0.0)));
        assert!(g.iter().all(|&v| v == 0.0 || v == 2.0 / 0.8));
        let mut all = tensor(&be, &[3.0; 5], [5]);
        let mut m = Tensor::empty(&be, [1], DType::U32, Category::Other).unwrap();
        ops::dropout(1.0, 7, &mut all, &mut m).unwrap();
        assert_eq!(all.to_vec().unwrap(), [3.0; 5]);
        for bad in [0.0, -0.5, 1.5, f32::NAN] {
            let e = ops::dropout(bad, 7, &mut all, &mut m).unwrap_err();
            assert!(matches!(e, TensorError::InvalidArgument { .. }), "{e}");
        }
    }
}
