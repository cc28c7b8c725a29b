//! The transposed convolution (`lax.conv_transpose`, stax's `ConvTranspose`) as the
//! backward-data pass of an ordinary convolution.
//!
//! `lax.conv_transpose(x, w, strides, padding)` (with `transpose_kernel=False`) is
//! `conv_general_dilated(x, w, 1, pads, lhs_dilation=strides)`: the input spread out by the
//! strides, padded by `pads = (a, b)` per axis, and cross-correlated with `w` as it is. With
//! `k` the dilated kernel size, output row `Y` gets `x[i] · w[t]` where `Y = a + i·s - t·d`.
//! The backward-data pass of a convolution `G` (input of the transposed output's size, output
//! of `x`'s, stride `s`, dilation `d`, padding `(k - 1 - a, k - 1 - b)`) computes exactly this
//! with `G`'s kernel the stored one flipped and its channels swapped
//! ([`FilterLayout::TransposedHwio`]). So the transposed forward is `G`'s backward data, its
//! input gradient `G`'s forward, its kernel gradient `G`'s backward filter.

use super::{Conv2dGeometry, ConvSpec, FilterLayout, Padding};
use crate::{Shape, TensorError};

const OP: &str = "conv_transpose";

/// `lax`'s `_conv_transpose_padding(k, s, padding)` for SAME and VALID: the `(before, after)`
/// padding of the spread-out input.
fn transpose_pads(k: usize, s: usize, padding: Padding, axis: usize) -> (usize, usize) {
    match padding {
        Padding::Same => {
            let len = k + s - 2;
            let a = if s > k - 1 { k - 1 } else { len.div_ceil(2) };
            (a, len - a)
        }
        Padding::Valid => (k - 1, k + s - 2 + k.saturating_sub(s) - (k - 1)),
        Padding::Explicit(p) => p[axis],
    }
}

/// `(out, before, after)` along one axis: the transposed output size and `G`'s padding.
fn axis(
    input: usize,
    k: usize,
    s: usize,
    padding: Padding,
    axis_: usize,
) -> Result<[usize; 3], TensorError> {
    let (a, b) = transpose_pads(k, s, padding, axis_);
    let bad = |reason: String| TensorError::InvalidArgument { op: OP, reason };
    // (input - 1)·s + 1 spread-out rows, padded, minus the kernel, plus one
    let out = ((input - 1) * s + 2 + a + b)
        .checked_sub(k)
        .filter(|&o| o > 0)
        .ok_or_else(|| {
            bad(format!(
                "padding ({a}, {b}) leaves no output for input {input}, kernel {k}"
            ))
        })?;
    let top = (k - 1).checked_sub(a).ok_or_else(|| {
        bad(format!(
            "padding before ({a}) over the dilated kernel size minus one ({}) is not supported",
            k - 1
        ))
    })?;
    // A negative `after` of G (|.| < s) only means G's last window ends early: floor absorbs it.
    let bottom = match (k - 1).checked_sub(b) {
        Some(p) => p,
        None if b - (k - 1) < s => 0,
        None => {
            return Err(bad(format!(
                "padding after ({b}) over the dilated kernel size minus one plus the stride \
                 minus one ({}) is not supported",
                k - 1 + s - 1
            )));
        }
    };
    Ok([out, top, bottom])
}

impl Conv2dGeometry {
    /// The geometry `G` a transposed convolution runs as (see the module docs): `x` is the
    /// transposed convolution's input (of `spec.layout`; `G`'s output), `w` its kernel
    /// (`spec.filter` [`FilterLayout::Hwio`] or [`FilterLayout::Oihw`], with `I` the input's
    /// channels and `O` the output's), `spec.padding` SAME or VALID as lax's
    /// `_conv_transpose_padding` computes it from the dilated kernel size, or explicit pads of
    /// the spread-out input. The transposed output is `G.input_shape()`: SAME gives
    /// `in · s`, VALID `in · s + max(k - s, 0)` (`k` dilated).
    ///
    /// # Errors
    /// As [`Conv2dGeometry::with_spec`]; [`TensorError::InvalidArgument`] for explicit padding
    /// `(a, b)` with `a > k - 1` or `b > k - 1 + s - 1` (unsupported), or one that leaves no
    /// output.
    pub fn transposed(
        x: &Shape,
        w: &Shape,
        spec: &ConvSpec,
    ) -> Result<Conv2dGeometry, TensorError> {
        let filter = match spec.filter {
            FilterLayout::Hwio => FilterLayout::TransposedHwio,
            FilterLayout::Oihw => FilterLayout::TransposedOihw,
            other => {
                return Err(TensorError::InvalidArgument {
                    op: OP,
                    reason: format!("a transposed kernel is HWIO or OIHW, not {other}"),
                });
            }
        };
        // As an ordinary spec, the kernel's I is the input's channels and O the output's.
        let super::Sizes {
            n,
            h,
            w: wd_,
            c_in: c,
            kh,
            kw,
            c_out: wo,
            kh_eff,
            kw_eff,
        } = super::Sizes::of(OP, x, w, spec)?;
        let ((sh, sw), (dh, dw)) = (spec.strides, spec.dilation);
        let overflow = || TensorError::InvalidArgument {
            op: OP,
            reason: format!("the transposed convolution of {x} by {w} overflows"),
        };
        h.checked_mul(sh)
            .zip(wd_.checked_mul(sw))
            .ok_or_else(overflow)?;
        let [out_h, top, bottom] = axis(h, kh_eff, sh, spec.padding, 0)?;
        let [out_w, left, right] = axis(wd_, kw_eff, sw, spec.padding, 1)?;
        let g = Conv2dGeometry {
            n,
            h: out_h,
            w: out_w,
            c_in: wo,
            kh,
            kw,
            c_out: c,
            stride_h: sh,
            stride_w: sw,
            dilation_h: dh,
            dilation_w: dw,
            pad_top: top,
            pad_bottom: bottom,
            pad_left: left,
            pad_right: right,
            out_h: h,
            out_w: wd_,
            layout: spec.layout,
            filter,
        };
        g.validate(OP)?;
        Ok(g)
    }
}
