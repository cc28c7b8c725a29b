//! How a convolution's tensors are laid out: the activations (NHWC or NCHW) and the kernel
//! (HWIO, OIHW, or the kernel of a transposed convolution seen from the convolution it runs as).

use std::fmt;

/// Layout of a convolution's input and output (stax's `lhs_spec` / `out_spec`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Layout {
    /// `[n, h, w, c]`: channels last (stax's `Conv`, TensorFlow's default).
    #[default]
    Nhwc,
    /// `[n, c, h, w]`: channels first (PyTorch's default).
    Nchw,
}

impl Layout {
    /// `(n, h, w, c)` of a tensor of this layout with dimensions `dims`.
    pub fn split(self, [a, b, c, d]: [usize; 4]) -> (usize, usize, usize, usize) {
        match self {
            Layout::Nhwc => (a, b, c, d),
            Layout::Nchw => (a, c, d, b),
        }
    }

    /// The dimensions of an `n x h x w x c` tensor in this layout.
    pub fn dims(self, n: usize, h: usize, w: usize, c: usize) -> [usize; 4] {
        match self {
            Layout::Nhwc => [n, h, w, c],
            Layout::Nchw => [n, c, h, w],
        }
    }

    /// Element strides `(image, channel, row, column)` of an `h x w x c` image in this layout.
    pub fn strides(self, h: usize, w: usize, c: usize) -> (usize, usize, usize, usize) {
        match self {
            Layout::Nhwc => (h * w * c, 1, w * c, c),
            Layout::Nchw => (c * h * w, h * w, w, 1),
        }
    }

    /// The axis of the channels (3 or 1).
    pub fn channel_axis(self) -> usize {
        match self {
            Layout::Nhwc => 3,
            Layout::Nchw => 1,
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Layout::Nhwc => "NHWC",
            Layout::Nchw => "NCHW",
        })
    }
}

/// How a convolution's kernel is stored, relative to the canonical kernel `K[ky, kx, ci, co]`
/// of the cross-correlation `y[oy, ox, co] = sum K[ky, kx, ci, co] x[oy·s + ky·d - p, .., ci]`.
///
/// A transposed convolution (`lax.conv_transpose` with `transpose_kernel=False`, what stax's
/// `ConvTranspose` calls) runs as the backward-data pass of a convolution whose input is the
/// transposed output; that convolution's kernel is the stored one spatially flipped with its
/// input and output channels swapped: the `Transposed*` layouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FilterLayout {
    /// `[kh, kw, ci, co]` = `K` (stax's `Conv`).
    #[default]
    Hwio,
    /// `[co, ci, kh, kw]`: `K[ky, kx, ci, co]` at `[co, ci, ky, kx]`.
    Oihw,
    /// A transposed convolution's HWIO kernel `[kh, kw, co, ci]`:
    /// `K[ky, kx, ci, co]` at `[kh - 1 - ky, kw - 1 - kx, co, ci]`.
    TransposedHwio,
    /// A transposed convolution's OIHW kernel `[ci, co, kh, kw]`:
    /// `K[ky, kx, ci, co]` at `[ci, co, kh - 1 - ky, kw - 1 - kx]`.
    TransposedOihw,
}

impl FilterLayout {
    /// `(kh, kw, ci, co)` of a kernel of this layout with dimensions `dims`.
    pub fn split(self, [a, b, c, d]: [usize; 4]) -> (usize, usize, usize, usize) {
        match self {
            FilterLayout::Hwio => (a, b, c, d),
            FilterLayout::Oihw => (c, d, b, a),
            FilterLayout::TransposedHwio => (a, b, d, c),
            FilterLayout::TransposedOihw => (c, d, a, b),
        }
    }

    /// The stored dimensions of a kernel of `(kh, kw, ci, co)`.
    pub fn dims(self, kh: usize, kw: usize, ci: usize, co: usize) -> [usize; 4] {
        match self {
            FilterLayout::Hwio => [kh, kw, ci, co],
            FilterLayout::Oihw => [co, ci, kh, kw],
            FilterLayout::TransposedHwio => [kh, kw, co, ci],
            FilterLayout::TransposedOihw => [ci, co, kh, kw],
        }
    }

    /// Where `K[ky, kx, c, o]` of a `(kh, kw, ci, co)` kernel is stored (row-major index).
    pub fn index(self, (kh, kw, ci, co): (usize, usize, usize, usize), k: [usize; 4]) -> usize {
        let [ky, kx, c, o] = k;
        let (fy, fx) = (kh - 1 - ky, kw - 1 - kx);
        match self {
            FilterLayout::Hwio => ((ky * kw + kx) * ci + c) * co + o,
            FilterLayout::Oihw => ((o * ci + c) * kh + ky) * kw + kx,
            FilterLayout::TransposedHwio => ((fy * kw + fx) * co + o) * ci + c,
            FilterLayout::TransposedOihw => ((c * co + o) * kh + fy) * kw + fx,
        }
    }

    /// The code `kernels/layout.cu`'s `filter_index` switches on (`FILTER_*`).
    pub fn code(self) -> i32 {
        match self {
            FilterLayout::Hwio => 0,
            FilterLayout::Oihw => 1,
            FilterLayout::TransposedHwio => 2,
            FilterLayout::TransposedOihw => 3,
        }
    }
}

impl fmt::Display for FilterLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FilterLayout::Hwio => "HWIO",
            FilterLayout::Oihw => "OIHW",
            FilterLayout::TransposedHwio => "HWIO (transposed)",
            FilterLayout::TransposedOihw => "OIHW (transposed)",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_filter_layout_stores_each_tap_once() {
        let dims = (2, 3, 4, 5);
        for f in [
            FilterLayout::Hwio,
            FilterLayout::Oihw,
            FilterLayout::TransposedHwio,
            FilterLayout::TransposedOihw,
        ] {
            let mut seen = [false; 120];
            for k in 0..120 {
                let t = [k / 60, (k / 20) % 3, (k / 5) % 4, k % 5];
                let i = f.index(dims, t);
                assert!(!seen[i], "{f}: index {i} twice");
                seen[i] = true;
            }
            assert_eq!(f.split(f.dims(2, 3, 4, 5)), dims, "{f}");
        }
        assert_eq!(
            Layout::Nchw.split(Layout::Nchw.dims(1, 2, 3, 4)),
            (1, 2, 3, 4)
        );
        // the transposed HWIO tap K[0, 0, 1, 2] is the stored [kh-1, kw-1, 2, 1] = [1, 2, 2, 1]
        let i = FilterLayout::TransposedHwio.index(dims, [0, 0, 1, 2]);
        assert_eq!(i, ((3 + 2) * 5 + 2) * 4 + 1);
    }
}
