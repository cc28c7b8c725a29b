//! Convolution geometry: output sizes and padding, computed from shapes alone.
//!
//! A [`Conv2dGeometry`] is everything a 2-D convolution kernel needs: sizes, strides, kernel
//! dilation, padding (possibly asymmetric) and the layouts of the activations ([`Layout`]) and
//! the kernel ([`FilterLayout`]). Pooling reuses it with the window as the kernel. A transposed
//! convolution is described by the geometry of the convolution it runs as
//! ([`Conv2dGeometry::transposed`]).

mod layout;
#[cfg(test)]
mod tests;
mod transpose;

pub use layout::{FilterLayout, Layout};

use crate::{Shape, TensorError};
use std::fmt;

/// Padding of a convolution or pooling, as in `jax.lax.conv_general_dilated` / stax.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Padding {
    /// Output size `ceil(in / stride)`; the total padding `max((out - 1) * stride + k - in, 0)`
    /// (`k` the dilated kernel size) is split with the smaller half before (top/left), as
    /// `lax.padtype_to_pads`.
    Same,
    /// No padding; output size `(in - k) / stride + 1` (floor), needs `in >= k`.
    Valid,
    /// Explicit `[(top, bottom), (left, right)]` zeros, as lax's `[(lo, hi), (lo, hi)]`
    /// (non-negative; lax also allows negative padding, which crops).
    Explicit([(usize, usize); 2]),
}

impl fmt::Display for Padding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Padding::Same => f.write_str("SAME"),
            Padding::Valid => f.write_str("VALID"),
            Padding::Explicit([h, w]) => write!(f, "[{h:?}, {w:?}]"),
        }
    }
}

/// A convolution's hyper-parameters beside the shapes: strides, padding, kernel dilation
/// (`rhs_dilation`), and the layouts. The default is stride 1, VALID, no dilation,
/// NHWC input and output, HWIO kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConvSpec {
    /// Strides `(height, width)`.
    pub strides: (usize, usize),
    /// Padding.
    pub padding: Padding,
    /// Kernel dilation `(height, width)`: tap `k` reads input offset `k · d`.
    pub dilation: (usize, usize),
    /// Layout of input and output.
    pub layout: Layout,
    /// Layout of the kernel.
    pub filter: FilterLayout,
}

impl Default for ConvSpec {
    fn default() -> Self {
        ConvSpec {
            strides: (1, 1),
            padding: Padding::Valid,
            dilation: (1, 1),
            layout: Layout::Nhwc,
            filter: FilterLayout::Hwio,
        }
    }
}

/// Everything a 2-D convolution kernel needs to know, derived once from the shapes.
///
/// Input `[n, h, w, c_in]`, kernel `[kh, kw, c_in, c_out]`, output `[n, out_h, out_w, c_out]`,
/// each stored as [`Conv2dGeometry::layout`] and [`Conv2dGeometry::filter`] say (NHWC and HWIO
/// by default). Padding may be asymmetric (SAME with an even kernel or stride > 1).
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
    /// Kernel dilation along height (1: none).
    pub dilation_h: usize,
    /// Kernel dilation along width (1: none).
    pub dilation_w: usize,
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
    /// Layout of input and output.
    pub layout: Layout,
    /// Layout of the kernel.
    pub filter: FilterLayout,
}

/// `(k - 1) · d + 1`, the extent of a dilated kernel.
fn dilated(k: usize, d: usize) -> Option<usize> {
    (k.checked_sub(1)?).checked_mul(d)?.checked_add(1)
}

/// Output size and `(before, after)` padding along one axis (`axis` 0: height, 1: width).
fn out_and_pads(
    op: &'static str,
    input: usize,
    k: usize,
    stride: usize,
    padding: Padding,
    axis: usize,
) -> Result<(usize, usize, usize), TensorError> {
    let too_small = |padded: usize| TensorError::InvalidArgument {
        op,
        reason: format!("padded input size {padded} is smaller than the (dilated) kernel {k}"),
    };
    match padding {
        Padding::Same => {
            let out = input.div_ceil(stride);
            let reach = (out.max(1) - 1)
                .checked_mul(stride)
                .and_then(|r| r.checked_add(k))
                .ok_or_else(|| TensorError::InvalidArgument {
                    op,
                    reason: format!(
                        "SAME padding of the (dilated) kernel {k} at stride {stride} overflows \
                         usize"
                    ),
                })?;
            let total = reach.saturating_sub(input);
            Ok((out, total / 2, total - total / 2))
        }
        Padding::Valid if input < k => Err(TensorError::InvalidArgument {
            op,
            reason: format!("VALID padding needs input size {input} >= kernel size {k}"),
        }),
        Padding::Valid => Ok(((input - k) / stride + 1, 0, 0)),
        Padding::Explicit(pads) => {
            let (lo, hi) = pads[axis];
            let padded = input
                .checked_add(lo)
                .and_then(|p| p.checked_add(hi))
                .ok_or_else(|| too_small(usize::MAX))?;
            match padded.checked_sub(k) {
                Some(room) => Ok((room / stride + 1, lo, hi)),
                None => Err(too_small(padded)),
            }
        }
    }
}

/// The four dimensions of a rank-4 shape.
fn four(s: &Shape) -> Option<[usize; 4]> {
    s.dims().try_into().ok()
}

/// The sizes of a convolution of `x` (of `spec.layout`) by `w` (of `spec.filter`), checked:
/// both rank 4, the input's channels the kernel's `I`, every size, stride and dilation
/// positive; with the dilated kernel extents.
pub(super) struct Sizes {
    n: usize,
    h: usize,
    w: usize,
    c_in: usize,
    kh: usize,
    kw: usize,
    c_out: usize,
    kh_eff: usize,
    kw_eff: usize,
}

impl Sizes {
    /// See the type's docs; errors name `op`.
    pub(super) fn of(
        op: &'static str,
        x: &Shape,
        w: &Shape,
        spec: &ConvSpec,
    ) -> Result<Sizes, TensorError> {
        let (Some(xd), Some(wd)) = (four(x), four(w)) else {
            return Err(TensorError::Shape {
                op,
                reason: format!(
                    "expected {} input and {} kernel, kernel is {w}",
                    spec.layout, spec.filter
                ),
                got: x.clone(),
            });
        };
        let (n, h, wd_, c_in) = spec.layout.split(xd);
        let (kh, kw, wc_in, c_out) = spec.filter.split(wd);
        if c_in != wc_in {
            return Err(TensorError::Shape {
                op,
                reason: format!(
                    "input has {c_in} channels but the kernel expects {wc_in} ({} {w})",
                    spec.filter
                ),
                got: x.clone(),
            });
        }
        let ((sh, sw), (dh, dw)) = (spec.strides, spec.dilation);
        if [sh, sw, dh, dw].contains(&0) {
            return Err(TensorError::InvalidArgument {
                op,
                reason: format!(
                    "strides and dilation must be positive, got strides {:?}, dilation {:?}",
                    spec.strides, spec.dilation
                ),
            });
        }
        if [n, h, wd_, c_in, kh, kw, c_out].contains(&0) {
            return Err(TensorError::InvalidArgument {
                op,
                reason: format!("zero-size dimension in input {x} or kernel {w}"),
            });
        }
        let overflow = || TensorError::InvalidArgument {
            op,
            reason: format!(
                "dilated kernel of {w} with dilation {:?} overflows",
                spec.dilation
            ),
        };
        Ok(Sizes {
            n,
            h,
            w: wd_,
            c_in,
            kh,
            kw,
            c_out,
            kh_eff: dilated(kh, dh).ok_or_else(overflow)?,
            kw_eff: dilated(kw, dw).ok_or_else(overflow)?,
        })
    }
}

impl Conv2dGeometry {
    /// Geometry of `conv(x, w)` with `strides = (sh, sw)` and `padding`, x NHWC and w HWIO.
    ///
    /// # Errors
    /// As [`Conv2dGeometry::with_spec`].
    pub fn new(
        x: &Shape,
        w: &Shape,
        strides: (usize, usize),
        padding: Padding,
    ) -> Result<Self, TensorError> {
        let spec = ConvSpec {
            strides,
            padding,
            ..ConvSpec::default()
        };
        Self::with_spec(x, w, &spec)
    }

    /// Geometry of `lax.conv_general_dilated(x, w, strides, padding, rhs_dilation=dilation)`,
    /// x of `spec.layout` and w of `spec.filter`; SAME padding is computed with the dilated
    /// kernel size `(k - 1) · d + 1`, as lax does.
    ///
    /// # Errors
    /// [`TensorError::Shape`] if `x` or `w` is not rank 4 or the channel counts disagree;
    /// [`TensorError::InvalidArgument`] for a zero stride or dilation, a zero-size dimension,
    /// or a kernel larger than the padded input.
    pub fn with_spec(x: &Shape, w: &Shape, spec: &ConvSpec) -> Result<Self, TensorError> {
        const OP: &str = "conv2d";
        let Sizes {
            n,
            h,
            w: wd_,
            c_in,
            kh,
            kw,
            c_out,
            kh_eff,
            kw_eff,
        } = Sizes::of(OP, x, w, spec)?;
        let (sh, sw) = spec.strides;
        let (dh, dw) = spec.dilation;
        let (out_h, pad_top, pad_bottom) = out_and_pads(OP, h, kh_eff, sh, spec.padding, 0)?;
        let (out_w, pad_left, pad_right) = out_and_pads(OP, wd_, kw_eff, sw, spec.padding, 1)?;
        let g = Conv2dGeometry {
            n,
            h,
            w: wd_,
            c_in,
            kh,
            kw,
            c_out,
            stride_h: sh,
            stride_w: sw,
            dilation_h: dh,
            dilation_w: dw,
            pad_top,
            pad_bottom,
            pad_left,
            pad_right,
            out_h,
            out_w,
            layout: spec.layout,
            filter: spec.filter,
        };
        g.validate(OP)?;
        Ok(g)
    }

    /// Input shape, `[n, h, w, c_in]` in [`Conv2dGeometry::layout`].
    pub fn input_shape(&self) -> Shape {
        Shape::new(self.layout.dims(self.n, self.h, self.w, self.c_in))
    }

    /// Kernel shape, `[kh, kw, c_in, c_out]` in [`Conv2dGeometry::filter`].
    pub fn filter_shape(&self) -> Shape {
        Shape::new(self.filter.dims(self.kh, self.kw, self.c_in, self.c_out))
    }

    /// Output shape, `[n, out_h, out_w, c_out]` in [`Conv2dGeometry::layout`].
    pub fn output_shape(&self) -> Shape {
        Shape::new(self.layout.dims(self.n, self.out_h, self.out_w, self.c_out))
    }

    /// The output as channels (for a per-channel bias and its gradient): `[n·h·w, c_out, 1]`
    /// for NHWC, `[n, c_out, h·w]` for NCHW.
    pub fn output_channels(&self) -> crate::ChannelGeometry {
        let hw = self.out_h * self.out_w;
        let (outer, inner) = match self.layout {
            Layout::Nhwc => (self.n * hw, 1),
            Layout::Nchw => (self.n, hw),
        };
        crate::ChannelGeometry {
            outer,
            c: self.c_out,
            inner,
        }
    }

    /// The same geometry with NHWC activations and an HWIO kernel (what the CPU's im2col
    /// computes on).
    pub fn canonical(&self) -> Conv2dGeometry {
        Conv2dGeometry {
            layout: Layout::Nhwc,
            filter: FilterLayout::Hwio,
            ..*self
        }
    }

    /// Dilated kernel extents `((kh - 1) · dh + 1, (kw - 1) · dw + 1)` (saturating).
    pub fn dilated_kernel(&self) -> (usize, usize) {
        let d = |k: usize, d: usize| dilated(k, d).unwrap_or(usize::MAX);
        (d(self.kh, self.dilation_h), d(self.kw, self.dilation_w))
    }

    /// Checks that a (possibly hand-built) geometry is self-consistent: no zero sizes,
    /// strides or dilations, and output sizes that follow from input, dilated kernel, stride
    /// and padding.
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] naming `op` and what is inconsistent.
    pub fn validate(&self, op: &'static str) -> Result<(), TensorError> {
        let g = self;
        let sizes = [
            g.n,
            g.h,
            g.w,
            g.c_in,
            g.kh,
            g.kw,
            g.c_out,
            g.stride_h,
            g.stride_w,
            g.dilation_h,
            g.dilation_w,
        ];
        if sizes.contains(&0) {
            return Err(TensorError::InvalidArgument {
                op,
                reason: format!("zero-size dimension, stride or dilation in {g:?}"),
            });
        }
        let out_len = |input: usize, a: usize, b: usize, k: usize, d: usize, s: usize| {
            let padded = input.checked_add(a)?.checked_add(b)?;
            Some(padded.checked_sub(dilated(k, d)?)? / s + 1)
        };
        let oh = out_len(g.h, g.pad_top, g.pad_bottom, g.kh, g.dilation_h, g.stride_h);
        let ow = out_len(g.w, g.pad_left, g.pad_right, g.kw, g.dilation_w, g.stride_w);
        if oh != Some(g.out_h) || ow != Some(g.out_w) {
            return Err(TensorError::InvalidArgument {
                op,
                reason: format!(
                    "output {}x{} does not follow from input {}x{}, kernel {}x{} dilated \
                     ({}, {}), strides ({}, {}) and padding (top {}, bottom {}, left {}, right \
                     {})",
                    g.out_h,
                    g.out_w,
                    g.h,
                    g.w,
                    g.kh,
                    g.kw,
                    g.dilation_h,
                    g.dilation_w,
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
                reason: format!(
                    "its tensors (input {}, filter {}, output {}) overflow the address space",
                    g.input_shape(),
                    g.filter_shape(),
                    g.output_shape()
                ),
            });
        }
        Ok(())
    }

    /// The first output position whose window lies wholly in the padding, as (axis, index):
    /// `("row", oy)` or `("column", ox)`; `None` when every window covers part of the image.
    /// The windows that miss the image are a prefix and a suffix of each axis, so the first
    /// and last of each are all that is looked at.
    pub fn window_in_padding(&self) -> Option<(&'static str, usize)> {
        let (kh, kw) = self.dilated_kernel();
        let axes = [
            ("row", self.out_h, self.stride_h, self.pad_top, self.h, kh),
            (
                "column",
                self.out_w,
                self.stride_w,
                self.pad_left,
                self.w,
                kw,
            ),
        ];
        axes.into_iter().find_map(|(axis, out, s, pad, len, k)| {
            let misses = |o: usize| o * s + k <= pad || o * s >= pad + len;
            [0, out.saturating_sub(1)]
                .into_iter()
                .find(|&o| misses(o))
                .map(|o| (axis, o))
        })
    }

    /// Whether the padding is the same on both sides in each direction (cuDNN needs this).
    pub fn symmetric_padding(&self) -> bool {
        self.pad_top == self.pad_bottom && self.pad_left == self.pad_right
    }
}
