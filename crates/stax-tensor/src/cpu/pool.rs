//! 2-D pooling on the host: max, sum and average pooling forward and backward, NHWC.
//!
//! Max: `y[i, oy, ox, c] = max over the window of x[i, oy·sh + ky - pad_top, ox·sw + kx -
//! pad_left, c]`, positions in the padding reading -inf (`lax.reduce_window(max, -inf)`), NaN
//! propagated as `lax.max` does. The backward pass gives each window's gradient to its first
//! maximum in window order (row-major over `(ky, kx)`), summed where windows overlap: XLA's
//! select-and-scatter with a `>=` select, what `jax.grad` of `MaxPool` computes.
//!
//! Sum: the window's sum, padding reading 0 (`lax.reduce_window(add, 0)`); average: the sum
//! divided by the number of the window's positions inside the image (stax's `AvgPool` divides
//! by the same windows' sum over ones). Their backward passes spread `dy` (divided by that
//! count for the average) over each window's positions inside the image.

use super::host::{words, words_mut};
use super::{data, data_mut};
use crate::backend::{MaxFrom, Pool2d, Pool2dBwd};
use crate::{Conv2dGeometry, PoolKind, TensorError};
use std::ops::Range;

/// The argmax word of a window wholly in the padding (`kernels/pool.cu`'s `NO_MAX`).
const NO_MAX: u32 = u32::MAX;

/// The first maximum of window `(oy, ox)` in channel `c` of the image `x` (one batch element):
/// its index in the image, its window offset `ky · kw + kx` and its value; None when the window
/// lies wholly in the padding.
fn window_max(
    g: &Conv2dGeometry,
    x: &[f32],
    oy: usize,
    ox: usize,
    c: usize,
) -> Option<(usize, u32, f32)> {
    let mut best: Option<(usize, u32, f32)> = None;
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
                Some((_, _, b)) => v > b || (v.is_nan() && !b.is_nan()),
            };
            if better {
                best = Some((i, (ky * g.kw + kx) as u32, v));
            }
        }
    }
    best
}

/// Calls `f(image, out_index, argmax)` for every output element of every image, `argmax`
/// its window's first maximum ([`window_max`]).
fn each_window(
    g: &Conv2dGeometry,
    x: &[f32],
    mut f: impl FnMut(usize, usize, Option<(usize, u32, f32)>),
) {
    let image = g.h * g.w * g.c_in;
    each_output(g, |n, o, (oy, ox, c)| {
        f(n, o, window_max(g, &x[n * image..][..image], oy, ox, c));
    });
}

/// Calls `f(image, out_index, (oy, ox, c))` for every output element of every image, in
/// output order.
fn each_output(g: &Conv2dGeometry, mut f: impl FnMut(usize, usize, (usize, usize, usize))) {
    for n in 0..g.n {
        for oy in 0..g.out_h {
            for ox in 0..g.out_w {
                for c in 0..g.c_out {
                    let o = ((n * g.out_h + oy) * g.out_w + ox) * g.c_out + c;
                    f(n, o, (oy, ox, c));
                }
            }
        }
    }
}

/// The image-relative input index of window `(oy, ox)`'s position at window offset `arg` in
/// channel `c`; None for [`NO_MAX`] or an offset outside the window or the image (an argmax
/// not written by this geometry's forward pass).
fn argmax_index(g: &Conv2dGeometry, arg: u32, (oy, ox, c): (usize, usize, usize)) -> Option<usize> {
    let k = arg as usize;
    if arg == NO_MAX || k >= g.kh * g.kw {
        return None;
    }
    let iy = (oy * g.stride_h + k / g.kw)
        .checked_sub(g.pad_top)
        .filter(|&v| v < g.h)?;
    let ix = (ox * g.stride_w + k % g.kw)
        .checked_sub(g.pad_left)
        .filter(|&v| v < g.w)?;
    Some((iy * g.w + ix) * g.c_in + c)
}

/// The window positions `lo..hi` along one axis that lie inside `0..len` (input index
/// `o·s + t - pad`).
fn inside(o: usize, s: usize, pad: usize, len: usize, k: usize) -> Range<usize> {
    let base = o * s;
    let lo = pad.saturating_sub(base).min(k);
    lo..(len + pad).saturating_sub(base).min(k).max(lo)
}

/// Calls `f(out_index, window, count)` for every output element of a sum or average
/// pooling: `window` the input indices (within the whole batch) of its in-image positions,
/// `count` how many there are.
fn each_sum_window(
    g: &Conv2dGeometry,
    mut f: impl FnMut(usize, &mut dyn Iterator<Item = usize>, usize),
) {
    let c = g.c_in;
    for n in 0..g.n {
        for oy in 0..g.out_h {
            let ky = inside(oy, g.stride_h, g.pad_top, g.h, g.kh);
            for ox in 0..g.out_w {
                let kx = inside(ox, g.stride_w, g.pad_left, g.w, g.kw);
                let count = ky.len() * kx.len();
                for ch in 0..c {
                    let o = ((n * g.out_h + oy) * g.out_w + ox) * c + ch;
                    let mut window = ky.clone().flat_map(|t| {
                        let iy = oy * g.stride_h + t - g.pad_top;
                        kx.clone().map(move |u| {
                            let ix = ox * g.stride_w + u - g.pad_left;
                            ((n * g.h + iy) * g.w + ix) * c + ch
                        })
                    });
                    f(o, &mut window, count);
                }
            }
        }
    }
}

/// The divisor of a window of `count` in-image positions.
fn divisor(kind: PoolKind, count: usize) -> f32 {
    match kind {
        PoolKind::Avg => count as f32,
        _ => 1.0,
    }
}

/// Pooling forward (see the module doc); max pooling also writes the windows' argmax offsets
/// when asked ([`NO_MAX`] for a window wholly in the padding).
pub(super) fn forward(c: Pool2d<'_>) -> Result<(), TensorError> {
    const OP: &str = "pool2d";
    let Pool2d {
        kind,
        g,
        x,
        y,
        argmax,
    } = c;
    let xs = data(OP, x)?;
    let ys = data_mut(OP, y)?;
    if kind == PoolKind::Max {
        let mut arg = argmax.map(|a| words_mut(OP, a)).transpose()?;
        each_window(&g, xs, |_, o, best| {
            ys[o] = best.map_or(f32::NEG_INFINITY, |(_, _, v)| v);
            if let Some(arg) = arg.as_deref_mut() {
                arg[o] = best.map_or(NO_MAX, |(_, k, _)| k);
            }
        });
        return Ok(());
    }
    each_sum_window(&g, |o, window, count| {
        let sum: f64 = window.map(|i| f64::from(xs[i])).sum();
        ys[o] = sum as f32 / divisor(kind, count);
    });
    Ok(())
}

/// Pooling backward: `dx` (overwritten) from `dy` (and, for max pooling, the forward input
/// or its argmax offsets: the same sums in the same order).
pub(super) fn backward(c: Pool2dBwd<'_>) -> Result<(), TensorError> {
    const OP: &str = "pool2d_bwd";
    let Pool2dBwd {
        kind,
        g,
        from,
        dy,
        dx,
    } = c;
    let dys = data(OP, dy)?;
    let dxs = data_mut(OP, dx)?;
    dxs.fill(0.0);
    let image = g.h * g.w * g.c_in;
    match (kind, from) {
        (PoolKind::Max, Some(MaxFrom::Input(x))) => {
            each_window(&g, data(OP, x)?, |n, o, best| {
                if let Some((i, _, _)) = best {
                    dxs[n * image + i] += dys[o];
                }
            });
        }
        (PoolKind::Max, Some(MaxFrom::Argmax(arg))) => {
            let arg = words(OP, arg)?;
            each_output(&g, |n, o, (oy, ox, c)| {
                if let Some(i) = argmax_index(&g, arg[o], (oy, ox, c)) {
                    dxs[n * image + i] += dys[o];
                }
            });
        }
        (PoolKind::Max, None) => {
            return Err(TensorError::InvalidArgument {
                op: OP,
                reason: "max pooling's gradient reads the forward input or its argmax".into(),
            });
        }
        _ => each_sum_window(&g, |o, window, count| {
            let d = dys[o] / divisor(kind, count);
            window.for_each(|i| dxs[i] += d);
        }),
    }
    Ok(())
}
