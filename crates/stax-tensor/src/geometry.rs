//! Convolution geometry: output sizes and padding, computed from shapes alone.

use crate::{Shape, TensorError};

/// Padding mode of a convolution, as in `jax.lax.conv_general_dilated` / stax.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Padding {
    /// Output size `ceil(in / stride)`; the total padding `max((out - 1) * stride + k - in, 0)`
    /// is split with the smaller half before (top/left), as `lax.padtype_to_pads`.
    Same,
    /// No padding; output size `(in - k) / stride + 1` (floor), needs `in >= k`.
    Valid,
}

/// Everything a 2-D convolution kernel needs to know, derived once from the shapes.
///
/// Input NHWC `[n, h, w, c_in]`, kernel HWIO `[kh, kw, c_in, c_out]`, output NHWC
/// `[n, out_h, out_w, c_out]`. Padding may be asymmetric (SAME with an even kernel or stride > 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Conv2dGeometry {
    /// Batch size.
    pub n: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Input channels.
    pub c_in: usize,
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Output channels.
    pub c_out: usize,
    /// Stride along height.
    pub stride_h: usize,
    /// Stride along width.
    pub stride_w: usize,
    /// Zero rows added above the input.
    pub pad_top: usize,
    /// Zero rows added below the input.
    pub pad_bottom: usize,
    /// Zero columns added left of the input.
    pub pad_left: usize,
    /// Zero columns added right of the input.
    pub pad_right: usize,
    /// Output height.
    pub out_h: usize,
    /// Output width.
    pub out_w: usize,
}

fn out_and_pads(
    op: &'static str,
    input: usize,
    k: usize,
    stride: usize,
    padding: Padding,
) -> Result<(usize, usize, usize), TensorError> {
    match padding {
        Padding::Same => {
            let out = input.div_ceil(stride);
            let total = ((out.max(1) - 1) * stride + k).saturating_sub(input);
            Ok((out, total / 2, total - total / 2))
        }
        Padding::Valid => {
            if input < k {
                return Err(TensorError::InvalidArgument {
                    op,
                    reason: format!("VALID padding needs input size {input} >= kernel size {k}"),
                });
            }
            Ok(((input - k) / stride + 1, 0, 0))
        }
    }
}

impl Conv2dGeometry {
    /// Geometry of `conv(x, w)` with `strides = (sh, sw)` and `padding`.
    ///
    /// # Errors
    /// [`TensorError::Shape`] if `x` is not rank 4, `w` not rank 4, or the channel counts
    /// disagree; [`TensorError::InvalidArgument`] for a zero stride, a zero-size dimension, or a
    /// VALID kernel larger than the input.
    pub fn new(
        x: &Shape,
        w: &Shape,
        strides: (usize, usize),
        padding: Padding,
    ) -> Result<Self, TensorError> {
        const OP: &str = "conv2d";
        let (&[n, h, wd, c_in], &[kh, kw, wc_in, c_out]) = (x.dims(), w.dims()) else {
            return Err(TensorError::Shape {
                op: OP,
                reason: format!("expected NHWC input and HWIO kernel, kernel is {w}"),
                got: x.clone(),
            });
        };
        if c_in != wc_in {
            return Err(TensorError::Shape {
                op: OP,
                reason: format!(
                    "input has {c_in} channels but the kernel expects {wc_in} (HWIO {w})"
                ),
                got: x.clone(),
            });
        }
        if strides.0 == 0 || strides.1 == 0 {
            return Err(TensorError::InvalidArgument {
                op: OP,
                reason: format!("strides must be positive, got {strides:?}"),
            });
        }
        if [n, h, wd, c_in, kh, kw, c_out].contains(&0) {
            return Err(TensorError::InvalidArgument {
                op: OP,
                reason: format!("zero-size dimension in input {x} or kernel {w}"),
            });
        }
        let (out_h, pad_top, pad_bottom) = out_and_pads(OP, h, kh, strides.0, padding)?;
        let (out_w, pad_left, pad_right) = out_and_pads(OP, wd, kw, strides.1, padding)?;
        Ok(Conv2dGeometry {
            n,
            h,
            w: wd,
            c_in,
            kh,
            kw,
            c_out,
            stride_h: strides.0,
            stride_w: strides.1,
            pad_top,
            pad_bottom,
            pad_left,
            pad_right,
            out_h,
            out_w,
        })
    }

    /// Input shape NHWC `[n, h, w, c_in]`.
    pub fn input_shape(&self) -> Shape {
        Shape::new([self.n, self.h, self.w, self.c_in])
    }

    /// Kernel shape HWIO `[kh, kw, c_in, c_out]`.
    pub fn filter_shape(&self) -> Shape {
        Shape::new([self.kh, self.kw, self.c_in, self.c_out])
    }

    /// Output shape NHWC `[n, out_h, out_w, c_out]`.
    pub fn output_shape(&self) -> Shape {
        Shape::new([self.n, self.out_h, self.out_w, self.c_out])
    }

    /// Checks that a (possibly hand-built) geometry is self-consistent: no zero sizes or
    /// strides, and output sizes that follow from input, kernel, stride and padding.
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] naming `op` and what is inconsistent.
    pub fn validate(&self, op: &'static str) -> Result<(), TensorError> {
        let g = self;
        let sizes = [
            g.n, g.h, g.w, g.c_in, g.kh, g.kw, g.c_out, g.stride_h, g.stride_w,
        ];
        if sizes.contains(&0) {
            return Err(TensorError::InvalidArgument {
                op,
                reason: format!("zero-size dimension or stride in {g:?}"),
            });
        }
        let out_len = |input: usize, a: usize, b: usize, k: usize, s: usize| {
            let padded = input.checked_add(a)?.checked_add(b)?;
            Some(padded.checked_sub(k)? / s + 1)
        };
        let oh = out_len(g.h, g.pad_top, g.pad_bottom, g.kh, g.stride_h);
        let ow = out_len(g.w, g.pad_left, g.pad_right, g.kw, g.stride_w);
        if oh != Some(g.out_h) || ow != Some(g.out_w) {
            return Err(TensorError::InvalidArgument {
                op,
                reason: format!(
                    "output {}x{} does not follow from input {}x{}, kernel {}x{}, strides ({}, \
                     {}) and padding (top {}, bottom {}, left {}, right {})",
                    g.out_h,
                    g.out_w,
                    g.h,
                    g.w,
                    g.kh,
                    g.kw,
                    g.stride_h,
                    g.stride_w,
                    g.pad_top,
                    g.pad_bottom,
                    g.pad_left,
                    g.pad_right
                ),
            });
        }
        let sizes = [
            g.input_shape().checked_numel(),
            g.output_shape().checked_numel(),
            g.filter_shape().checked_numel(),
        ];
        if sizes
            .iter()
            .any(|n| n.and_then(|n| n.checked_mul(8)).is_none())
        {
            return Err(TensorError::InvalidArgument {
                op,
                reason: format!("the tensors of {g:?} overflow the address space"),
            });
        }
        Ok(())
    }

    /// Whether the padding is the same on both sides in each direction (cuDNN needs this).
    pub fn symmetric_padding(&self) -> bool {
        self.pad_top == self.pad_bottom && self.pad_left == self.pad_right
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo(x: [usize; 4], w: [usize; 4], s: (usize, usize), p: Padding) -> Conv2dGeometry {
        Conv2dGeometry::new(&x.into(), &w.into(), s, p).unwrap()
    }

    #[test]
    fn same_padding_matches_lax() {
        let g = geo([1, 200, 200, 3], [3, 3, 3, 64], (1, 1), Padding::Same);
        assert_eq!(
            (g.out_h, g.out_w, g.pad_top, g.pad_bottom),
            (200, 200, 1, 1)
        );
        // stride 2 on an even input: out 4, total pad (4-1)*2+3-8 = 1 -> (0, 1)
        let g = geo([1, 8, 8, 1], [3, 3, 1, 1], (2, 2), Padding::Same);
        assert_eq!((g.out_h, g.pad_top, g.pad_bottom), (4, 0, 1));
        let g = geo([1, 5, 5, 1], [2, 2, 1, 1], (1, 1), Padding::Same);
        assert_eq!((g.out_h, g.pad_top, g.pad_bottom), (5, 0, 1));
    }

    #[test]
    fn valid_padding() {
        let g = geo([2, 7, 6, 1], [3, 2, 1, 4], (2, 1), Padding::Valid);
        assert_eq!(g.output_shape(), Shape::new([2, 3, 5, 4]));
        let e = Conv2dGeometry::new(
            &[1, 2, 2, 1].into(),
            &[3, 3, 1, 1].into(),
            (1, 1),
            Padding::Valid,
        );
        assert!(matches!(e, Err(TensorError::InvalidArgument { .. })));
    }

    #[test]
    fn channel_mismatch_names_the_kernel() {
        let e = Conv2dGeometry::new(
            &[1, 4, 4, 3].into(),
            &[3, 3, 4, 64].into(),
            (1, 1),
            Padding::Same,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "conv2d: input has 3 channels but the kernel expects 4 (HWIO [3, 3, 4, 64]) (got [1, 4, 4, 3])"
        );
    }
}
