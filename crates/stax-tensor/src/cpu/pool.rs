//! 2-D pooling on the host: max pooling forward and backward, NHWC.
//!
//! `y[i, oy, ox, c] = max over the window of x[i, oy·sh + ky - pad_top, ox·sw + kx - pad_left,
//! c]`, positions in the padding reading -inf (`lax.reduce_window(max, -inf)`), NaN
//! propagated as `lax.max` does. The backward pass gives each window's gradient to its first
//! maximum in window order (row-major over `(ky, kx)`), summed where windows overlap: XLA's
//! select-and-scatter with a `>=` select, what `jax.grad` of `MaxPool` computes.

use super::{data, data_mut};
use crate::backend::{Pool2d, Pool2dBwd};
use crate::{Conv2dGeometry, TensorError};

/// Index (in the image `x` of one batch element) of the first maximum of window `(oy, ox)` in
/// channel `c`, and its value; None when the window lies wholly in the padding.
fn window_max(
    g: &Conv2dGeometry,
    x: &[f32],
    oy: usize,
    ox: usize,
    c: usize,
) -> Option<(usize, f32)> {
    let mut best: Option<(usize, f32)> = None;
    for ky in 0..g.kh {
        let Some(iy) = (oy * g.stride_h + ky)
            .checked_sub(g.pad_top)
            .filter(|&v| v < g.h)
        else {
            continue;
        };
        for kx in 0..g.kw {
            let Some(ix) = (ox * g.stride_w + kx)
                .checked_sub(g.pad_left)
                .filter(|&v| v < g.w)
            else {
                continue;
            };
            let i = (iy * g.w + ix) * g.c_in + c;
            let v = x[i];
            let better = match best {
                None => true,
                Some((_, b)) => v > b || (v.is_nan() && !b.is_nan()),
            };
            if better {
                best = Some((i, v));
            }
        }
    }
    best
}

/// Calls `f(image, out_index, argmax)` for every output element of every image, `argmax`
/// the image-relative index of its window's first maximum.
fn each_window(
    g: &Conv2dGeometry,
    x: &[f32],
    mut f: impl FnMut(usize, usize, Option<(usize, f32)>),
) {
    let image = g.h * g.w * g.c_in;
    for n in 0..g.n {
        let xi = &x[n * image..][..image];
        for oy in 0..g.out_h {
            for ox in 0..g.out_w {
                for c in 0..g.c_out {
                    let o = ((n * g.out_h + oy) * g.out_w + ox) * g.c_out + c;
                    f(n, o, window_max(g, xi, oy, ox, c));
                }
            }
        }
    }
}

/// Max pooling forward (see the module doc).
pub(super) fn forward(c: Pool2d<'_>) -> Result<(), TensorError> {
    const OP: &str = "pool2d";
    let Pool2d { g, x, y, .. } = c;
    let xs = data(OP, x)?;
    let ys = data_mut(OP, y)?;
    each_window(&g, xs, |_, o, best| {
        ys[o] = best.map_or(f32::NEG_INFINITY, |(_, v)| v);
    });
    Ok(())
}

/// Max pooling backward: `dx` (overwritten) from the forward input and `dy`.
pub(super) fn backward(c: Pool2dBwd<'_>) -> Result<(), TensorError> {
    const OP: &str = "pool2d_bwd";
    let Pool2dBwd { g, x, dy, dx, .. } = c;
    let (xs, dys) = (data(OP, x)?, data(OP, dy)?);
    let dxs = data_mut(OP, dx)?;
    dxs.fill(0.0);
    let image = g.h * g.w * g.c_in;
    each_window(&g, xs, |n, o, best| {
        if let Some((i, _)) = best {
            dxs[n * image + i] += dys[o];
        }
    });
    Ok(())
}
