//! Per-channel ops on the host: batch normalization forward and backward and the channel
//! bias, on a `[outer, c, inner]` view ([`ChannelGeometry`]), statistics in f64.
//!
//! Forward (stax's `BatchNorm`, `jax.nn.standardize`): `mean = E[x]`, `var = max(E[x²] -
//! mean², 0)`, `rstd = 1 / sqrt(var + eps)`, `y = (x - mean) · (gamma · rstd) + beta`.
//! Backward, with `z = (x - mean) · rstd` and `m = outer · inner`: `dbeta = Σ dy`, `dgamma =
//! Σ dy · z = rstd · Σ dy · (x - mean)`, `dx = gamma · rstd · (dy - dbeta / m - z · dgamma /
//! m)` (the gradient of the one-pass variance is that of the two-pass one: the same function).
//! A fused ReLU runs after the forward pass and masks `dy` before the backward one.

use super::elementwise::{not_float, unary, unary_bwd};
use super::host::{view, view_mut};
use super::{data, data_mut};
use crate::backend::{
    BatchNorm, BatchNormBwd, BatchNormFold, ChannelBiasAdd, ChannelBiasGrad, NormStats, Unary,
    UnaryBwd,
};
use crate::{Activation, ChannelGeometry, Float, Tensor, TensorError, with_float};

/// `out[j] = Σ a[.., j, ..]` over the view, in any float dtype: f64 sums of `a`'s values,
/// rounded once to `out`'s dtype (`a`'s).
pub(super) fn channel_sums(
    g: &ChannelGeometry,
    a: &Tensor,
    out: &mut Tensor,
) -> Result<(), TensorError> {
    let dtype = a.dtype();
    with_float!(dtype, T => sums_t::<T>(g, a, out), Err(not_float("channel_sums", dtype)))
}

fn sums_t<T: Float>(g: &ChannelGeometry, a: &Tensor, out: &mut Tensor) -> Result<(), TensorError> {
    const OP: &str = "channel_sums";
    let mut acc = vec![0f64; g.c];
    for (r, run) in view::<T>(OP, a)?.chunks_exact(g.inner.max(1)).enumerate() {
        acc[r % g.c] += run.iter().map(|v| f64::from(v.to_f32())).sum::<f64>();
    }
    for (o, s) in view_mut::<T>(OP, out)?.iter_mut().zip(acc) {
        *o = T::from_f32(s as f32);
    }
    Ok(())
}

/// `(Σ a, Σ a · (b - shift))` per channel over the view, in f64 (`shift` 0 when `None`).
fn moments(g: &ChannelGeometry, a: &[f32], b: &[f32], shift: Option<&[f32]>) -> [Vec<f64>; 2] {
    let (mut s, mut t) = (vec![0f64; g.c], vec![0f64; g.c]);
    let inner = g.inner.max(1);
    for (r, (ra, rb)) in a.chunks_exact(inner).zip(b.chunks_exact(inner)).enumerate() {
        let j = r % g.c;
        let sh = shift.map_or(0.0, |m| f64::from(m[j]));
        for (&va, &vb) in ra.iter().zip(rb) {
            s[j] += f64::from(va);
            t[j] += f64::from(va) * (f64::from(vb) - sh);
        }
    }
    [s, t]
}

/// A per-channel parameter, or `default` everywhere when absent.
fn or_const(
    op: &'static str,
    p: Option<&crate::Tensor>,
    c: usize,
    default: f32,
) -> Result<Vec<f32>, TensorError> {
    Ok(match p {
        Some(t) => data(op, t)?.to_vec(),
        None => vec![default; c],
    })
}

/// Batch normalization forward (see the module doc).
pub(super) fn batch_norm(c: BatchNorm<'_>) -> Result<(), TensorError> {
    const OP: &str = "batch_norm";
    let BatchNorm {
        g,
        eps,
        x,
        gamma,
        beta,
        y,
        stats,
        relu,
        add: _,
    } = c;
    let xs = data(OP, x)?;
    let gamma = or_const(OP, gamma, g.c, 1.0)?;
    let beta = or_const(OP, beta, g.c, 0.0)?;
    let (means, rstds): (&[f32], &[f32]) = match stats {
        NormStats::Computed { mean, rstd } => {
            let (means, rstds) = (data_mut(OP, mean)?, data_mut(OP, rstd)?);
            statistics(&g, xs, eps, (&mut *means, &mut *rstds));
            (means, rstds)
        }
        NormStats::Given { mean, rstd } => (data(OP, mean)?, data(OP, rstd)?),
    };
    // from the rounded rstd, as the GPU's bn_finish_f32 and bn_scale_f32
    let scale: Vec<f32> = gamma
        .iter()
        .zip(rstds)
        .map(|(&gm, &r)| (f64::from(gm) * f64::from(r)) as f32)
        .collect();
    let ys = data_mut(OP, y)?;
    let inner = g.inner.max(1);
    for (r, (yr, xr)) in ys
        .chunks_exact_mut(inner)
        .zip(xs.chunks_exact(inner))
        .enumerate()
    {
        let j = r % g.c;
        for (v, &xv) in yr.iter_mut().zip(xr) {
            *v = (xv - means[j]) * scale[j] + beta[j];
        }
    }
    match relu {
        Some(mask) => unary(Unary {
            act: Activation::Relu,
            y,
            aux: Some(mask),
        }),
        None => Ok(()),
    }
}

/// The mean and rstd of each channel of `xs` (see the module doc), in f64, rounded once.
fn statistics(g: &ChannelGeometry, xs: &[f32], eps: f32, (means, rstds): (&mut [f32], &mut [f32])) {
    let [s1, s2] = moments(g, xs, xs, None);
    let m = g.per_channel() as f64;
    for j in 0..g.c {
        let mu = s1[j] / m;
        let var = (s2[j] / m - mu * mu).max(0.0);
        let r = 1.0 / (var + f64::from(eps)).sqrt();
        (means[j], rstds[j]) = (mu as f32, r as f32);
    }
}

/// Batch normalization backward (see the module doc); `dx` over `dy` when `need_dx`.
pub(super) fn batch_norm_bwd(c: BatchNormBwd<'_>) -> Result<(), TensorError> {
    const OP: &str = "batch_norm_bwd";
    let BatchNormBwd {
        g,
        x,
        gamma,
        mean,
        rstd,
        relu,
        dy,
        need_dx,
        dgamma,
        dbeta,
        dx_sum: _,
    } = c;
    if let Some(mask) = relu {
        let act = Activation::Relu;
        unary_bwd(UnaryBwd {
            act,
            saved: mask,
            dy: &mut *dy,
        })?;
    }
    let (xs, means, rstds) = (data(OP, x)?, data(OP, mean)?, data(OP, rstd)?);
    let gamma = or_const(OP, gamma, g.c, 1.0)?;
    let [sdy, sdyx] = moments(&g, data(OP, dy)?, xs, Some(means));
    let dg: Vec<f64> = (0..g.c).map(|j| f64::from(rstds[j]) * sdyx[j]).collect();
    if let Some(d) = dgamma {
        for (o, &v) in data_mut(OP, d)?.iter_mut().zip(&dg) {
            *o = v as f32;
        }
    }
    if let Some(d) = dbeta {
        for (o, &v) in data_mut(OP, d)?.iter_mut().zip(&sdy) {
            *o = v as f32;
        }
    }
    if !need_dx {
        return Ok(());
    }
    let m = g.per_channel() as f64;
    let coef: Vec<[f32; 4]> = (0..g.c)
        .map(|j| {
            let r = f64::from(rstds[j]);
            let a = f64::from(gamma[j]) * r;
            [
                a as f32,
                (sdy[j] / m) as f32,
                (r * dg[j] / m) as f32,
                means[j],
            ]
        })
        .collect();
    let inner = g.inner.max(1);
    let dys = data_mut(OP, dy)?;
    for (r, (dr, xr)) in dys
        .chunks_exact_mut(inner)
        .zip(xs.chunks_exact(inner))
        .enumerate()
    {
        let [a, b, cz, mu] = coef[r % g.c];
        for (d, &xv) in dr.iter_mut().zip(xr) {
            *d = a * (*d - b - (xv - mu) * cz);
        }
    }
    Ok(())
}

/// `y[o, j, i] += b[j]`.
pub(super) fn channel_bias_add(c: ChannelBiasAdd<'_>) -> Result<(), TensorError> {
    const OP: &str = "channel_bias_add";
    let ChannelBiasAdd { g, y, b } = c;
    let bias = data(OP, b)?;
    for (r, run) in data_mut(OP, y)?
        .chunks_exact_mut(g.inner.max(1))
        .enumerate()
    {
        let v = bias[r % g.c];
        run.iter_mut().for_each(|e| *e += v);
    }
    Ok(())
}

/// `db[j] = Σ dy[.., j, ..]` in f64.
pub(super) fn channel_bias_grad(c: ChannelBiasGrad<'_>) -> Result<(), TensorError> {
    let ChannelBiasGrad { g, dy, db } = c;
    channel_sums(&g, dy, db)
}

/// [`BatchNormFold`], per channel in f64 (see [`crate::ops::batch_norm_fold`]).
pub(super) fn batch_norm_fold(f: BatchNormFold<'_>) -> Result<(), TensorError> {
    const OP: &str = "batch_norm_fold";
    let BatchNormFold {
        k,
        c,
        inputs,
        outputs,
    } = f;
    let count = inputs.count as f64;
    let read = |t: &Tensor| data(OP, t).map(|d| d.iter().map(|&v| f64::from(v)).collect());
    let i = inputs;
    let [w, b0, mean, rstd, gt, sh, sd]: [Vec<f64>; 7] = [
        read(i.w)?,
        read(i.b0)?,
        read(i.mean)?,
        read(i.rstd)?,
        read(i.gt)?,
        read(i.sh)?,
        read(i.sd)?,
    ];
    let gamma: Option<Vec<f64>> = i.gamma.map(read).transpose()?;
    let o = outputs;
    let (dw, w_a, w_c) = (
        data_mut(OP, o.dw)?,
        data_mut(OP, o.w_a)?,
        data_mut(OP, o.w_c)?,
    );
    let (bp, db0) = (data_mut(OP, o.bp)?, data_mut(OP, o.db0)?);
    let mut dgamma = o.dgamma.map(|t| data_mut(OP, t)).transpose()?;
    let mut dbeta = o.dbeta.map(|t| data_mut(OP, t)).transpose()?;
    for j in 0..c {
        let col = (0..k).map(|r| r * c + j);
        let xw: f64 = col.clone().map(|i| w[i] * gt[i]).sum();
        let hw: f64 = col.clone().zip(&sh).map(|(i, s)| w[i] * s).sum();
        let (s, r) = (sd[j], rstd[j]);
        let t = r * (xw + (b0[j] - mean[j]) * s);
        let a = gamma.as_ref().map_or(1.0, |g| g[j]) * r;
        let cz = -a * r * t / count;
        let bpj = -a * s / count + cz * (b0[j] - mean[j]);
        if let Some(d) = dgamma.as_deref_mut() {
            d[j] = t as f32;
        }
        if let Some(d) = dbeta.as_deref_mut() {
            d[j] = s as f32;
        }
        db0[j] = (a * s + count * bpj + cz * hw) as f32;
        bp[j] = bpj as f32;
        for (i, h) in col.zip(&sh) {
            dw[i] = (a * gt[i] + h * bpj + cz * f64::from(dw[i])) as f32;
            w_a[i] = (a * w[i]) as f32;
            w_c[i] = (cz * w[i]) as f32;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testing::{backend, tensor};
    use crate::ops::{self, AffineGrads, NormSaved};
    use crate::{Category, ChannelGeometry, DType, Tensor, TensorError};

    /// The input gradient's per-channel sums are the f64 sums of the dx written (NCHW-like
    /// view, 2 channels of 2 x 3 elements), in f32 and bf16; without dx they are refused.
    #[test]
    fn dx_sums_are_the_sums_of_the_input_gradient() {
        let be = backend();
        let g = ChannelGeometry {
            outer: 2,
            c: 2,
            inner: 3,
        };
        let xs = [
            0.5, -1.0, 2.0, 3.0, 1.5, -2.0, 1.0, 0.25, -0.5, 4.0, 2.5, 0.0,
        ];
        let dys = [
            0.1, -0.2, 0.3, 0.7, -0.4, 0.05, -0.6, 0.9, 0.2, -0.3, 0.8, -0.1,
        ];
        for dtype in [DType::F32, DType::BF16] {
            let cast = |t: Tensor| {
                let mut out =
                    Tensor::empty(&be, t.shape().clone(), dtype, Category::Other).unwrap();
                ops::cast(&t, &mut out).unwrap();
                out
            };
            let x = cast(tensor(&be, &xs, [12]));
            let mut dy = cast(tensor(&be, &dys, [12]));
            let (mut mean, mut rstd) = (tensor(&be, &[0.0; 2], [2]), tensor(&be, &[0.0; 2], [2]));
            let mut y = Tensor::empty(&be, [12], dtype, Category::Other).unwrap();
            let stats = (&mut mean, &mut rstd);
            ops::batch_norm(&x, &g, 1e-5, Default::default(), &mut y, stats, None).unwrap();
            let saved = NormSaved {
                mean: &mean,
                rstd: &rstd,
                relu: None,
            };
            let mut sums = Tensor::empty(&be, [2], dtype, Category::Other).unwrap();
            let grads = AffineGrads {
                dx_sum: Some(&mut sums),
                ..Default::default()
            };
            ops::batch_norm_bwd(&x, &g, None, saved, &mut dy, true, grads).unwrap();
            let dx = dy.to_vec().unwrap();
            let want: Vec<f32> = (0..2)
                .map(|j| {
                    let channel = dx.chunks(3).skip(j).step_by(2).flatten();
                    channel.map(|&v| f64::from(v)).sum::<f64>() as f32
                })
                .collect();
            let got = sums.to_vec().unwrap();
            let tol = if dtype == DType::F32 { 0.0 } else { 2e-3 };
            for (a, b) in got.iter().zip(&want) {
                assert!((a - b).abs() <= tol, "{dtype}: {got:?} against {want:?}");
            }
            let grads = AffineGrads {
                dx_sum: Some(&mut sums),
                ..Default::default()
            };
            let e = ops::batch_norm_bwd(&x, &g, None, saved, &mut dy, false, grads);
            assert!(
                matches!(e, Err(TensorError::InvalidArgument { .. })),
                "{e:?}"
            );
        }
    }
}
