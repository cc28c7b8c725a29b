//! stax's convolution `dimension_numbers` `(lhs_spec, rhs_spec, out_spec)`: the ones stax-rs
//! runs, and how their shapes map onto the 2-D convolution ops (a 1-D convolution is a 2-D one
//! whose width is 1, a free reshape).

use stax_alloc::Tag;
use stax_tensor::{
    Category, ConvSpec, FilterLayout, Key, Layout, Padding, Shape, Tensor, TensorError, Tree,
};

use crate::{Cx, Init, LayerError, ParamSpec};

/// Parsed dimension numbers: the input and output layout (the same for both), the kernel's
/// layout and the spatial rank.
///
/// Supported: `NHWC` or `NCHW` activations with an `HWIO` or `OIHW` kernel, and their 1-D
/// forms `NHC` / `NCH` with `HIO` / `OIH` (stax's `Conv1DTranspose` is `('NHC', 'HIO',
/// 'NHC')`). Other permutations (stax's ResNet example's `('HWCN', 'OIHW', 'NHWC')`) are a
/// typed error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConvDims {
    /// `lhs_spec` (= `out_spec`).
    pub lhs: &'static str,
    /// `rhs_spec`.
    pub rhs: &'static str,
    /// The layout the ops see.
    pub layout: Layout,
    /// The kernel layout the ops see.
    pub filter: FilterLayout,
}

/// Every supported `(lhs, rhs)`, with the 2-D layouts they run as.
const SUPPORTED: [(&str, &str, Layout, FilterLayout); 8] = [
    ("NHWC", "HWIO", Layout::Nhwc, FilterLayout::Hwio),
    ("NHWC", "OIHW", Layout::Nhwc, FilterLayout::Oihw),
    ("NCHW", "OIHW", Layout::Nchw, FilterLayout::Oihw),
    ("NCHW", "HWIO", Layout::Nchw, FilterLayout::Hwio),
    ("NHC", "HIO", Layout::Nhwc, FilterLayout::Hwio),
    ("NHC", "OIH", Layout::Nhwc, FilterLayout::Oihw),
    ("NCH", "OIH", Layout::Nchw, FilterLayout::Oihw),
    ("NCH", "HIO", Layout::Nchw, FilterLayout::Hwio),
];

impl ConvDims {
    /// stax's `Conv`: `('NHWC', 'HWIO', 'NHWC')`.
    pub const NHWC: ConvDims = ConvDims {
        lhs: "NHWC",
        rhs: "HWIO",
        layout: Layout::Nhwc,
        filter: FilterLayout::Hwio,
    };

    /// PyTorch's layout: `('NCHW', 'OIHW', 'NCHW')`.
    pub const NCHW: ConvDims = ConvDims {
        lhs: "NCHW",
        rhs: "OIHW",
        layout: Layout::Nchw,
        filter: FilterLayout::Oihw,
    };

    /// 1-D, channels last: `('NHC', 'HIO', 'NHC')` (stax's `Conv1DTranspose`).
    pub const NHC: ConvDims = ConvDims {
        lhs: "NHC",
        rhs: "HIO",
        layout: Layout::Nhwc,
        filter: FilterLayout::Hwio,
    };

    /// stax's `dimension_numbers` `(lhs, rhs, out)`.
    ///
    /// # Errors
    /// [`LayerError::Config`] for a combination stax-rs does not run (listing those it does),
    /// or an `out` spec that differs from `lhs`.
    pub fn parse(lhs: &str, rhs: &str, out: &str) -> Result<ConvDims, LayerError> {
        SUPPORTED
            .iter()
            .find(|(l, r, ..)| *l == lhs && *r == rhs && out == lhs)
            .map(|&(lhs, rhs, layout, filter)| ConvDims {
                lhs,
                rhs,
                layout,
                filter,
            })
            .ok_or_else(|| {
                let list: Vec<String> = SUPPORTED
                    .iter()
                    .map(|(l, r, ..)| format!("({l}, {r}, {l})"))
                    .collect();
                LayerError::Config {
                    path: String::new(),
                    layer: "conv".into(),
                    reason: format!(
                        "dimension numbers ({lhs}, {rhs}, {out}) are not supported; supported: {}",
                        list.join(", ")
                    ),
                }
            })
    }

    /// The rank of the activations (4 for 2-D, 3 for 1-D).
    pub fn rank(&self) -> usize {
        self.lhs.len()
    }

    /// The axis of the channels in the activations (stax's `lhs_spec.index('C')`).
    pub fn channel_axis(&self) -> usize {
        self.lhs.find('C').unwrap_or(0)
    }

    /// A shape of this spec's rank as the ops' rank-4 shape (1-D: a unit width inserted after
    /// the spatial axis); `kernel` says whether it is the kernel (`rhs`) or an activation.
    pub fn to_4d(&self, shape: &Shape, kernel: bool) -> Shape {
        let d = shape.dims();
        if d.len() == 4 {
            return shape.clone();
        }
        let spec = if kernel { self.rhs } else { self.lhs };
        let h = spec.find('H').unwrap_or(0);
        let mut out = d.to_vec();
        out.insert((h + 1).min(out.len()), 1);
        Shape::new(out)
    }

    /// The inverse of [`ConvDims::to_4d`] for an activation.
    pub fn from_4d(&self, shape: &Shape) -> Shape {
        if self.rank() == 4 {
            return shape.clone();
        }
        let mut d = shape.dims().to_vec();
        let h = self.lhs.find('H').unwrap_or(0);
        if h + 1 < d.len() {
            d.remove(h + 1);
        }
        Shape::new(d)
    }

    /// stax's kernel shape: `rhs_spec` walked, `O` the output channels, `I` the input's,
    /// spatial letters the filter shape in order.
    pub fn kernel_shape(&self, (kh, kw): (usize, usize), c_in: usize, out_chan: usize) -> Shape {
        let mut spatial = [kh, kw].into_iter();
        Shape::new(
            self.rhs
                .chars()
                .map(|ch| match ch {
                    'O' => out_chan,
                    'I' => c_in,
                    _ => spatial.next().unwrap_or(1),
                })
                .collect::<Vec<_>>(),
        )
    }

    /// stax's bias shape: `out_chan` at `C` of `out_spec`, 1 elsewhere (NHWC: `[1, 1, 1, C]`).
    pub fn bias_shape(&self, out_chan: usize) -> Shape {
        Shape::new(
            self.lhs
                .chars()
                .map(|ch| if ch == 'C' { out_chan } else { 1 })
                .collect::<Vec<_>>(),
        )
    }

    /// stax's default kernel initializer: `glorot_normal(rhs_spec.index('I'),
    /// rhs_spec.index('O'))`.
    pub fn glorot(&self) -> Init {
        Init::GlorotNormal {
            in_axis: self.rhs.find('I').unwrap_or(0),
            out_axis: self.rhs.find('O').unwrap_or(0),
        }
    }
}

/// The reason of a shape or argument error of an op, for a layer's shape error.
pub(crate) fn reason(e: TensorError) -> String {
    match e {
        TensorError::Shape { reason, .. } | TensorError::InvalidArgument { reason, .. } => reason,
        other => other.to_string(),
    }
}

/// What stax's `GeneralConv` and `GeneralConvTranspose` are made of: the dimension numbers,
/// output channels, kernel size, strides, padding, and kernel dilation (lax's `rhs_dilation`,
/// which stax does not expose: `(1, 1)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvConfig {
    /// The dimension numbers.
    pub dims: ConvDims,
    /// Output channels.
    pub out_chan: usize,
    /// Kernel `(height, width)` (1-D: `(k, 1)`).
    pub filter_shape: (usize, usize),
    /// Strides `(height, width)`.
    pub strides: (usize, usize),
    /// SAME, VALID or explicit (1-D: `[(lo, hi), (0, 0)]`).
    pub padding: Padding,
    /// Kernel dilation `(height, width)`.
    pub dilation: (usize, usize),
}

impl ConvConfig {
    /// stax's `(dimension_numbers, out_chan, filter_shape, strides, padding)`, no dilation.
    pub fn new(
        dims: ConvDims,
        out_chan: usize,
        filter_shape: (usize, usize),
        strides: (usize, usize),
        padding: Padding,
    ) -> ConvConfig {
        ConvConfig {
            dims,
            out_chan,
            filter_shape,
            strides,
            padding,
            dilation: (1, 1),
        }
    }

    /// The ops' spec: strides, padding, dilation and the layouts.
    pub(crate) fn spec(&self) -> ConvSpec {
        ConvSpec {
            strides: self.strides,
            padding: self.padding,
            dilation: self.dilation,
            layout: self.dims.layout,
            filter: self.dims.filter,
        }
    }

    /// An input (of the dimension numbers' rank) and the kernel as the ops' rank-4 shapes; the
    /// input's channels are the kernel's `I`.
    ///
    /// # Errors
    /// Why the input does not fit (its rank).
    pub(crate) fn shapes_4d(&self, input: &Shape) -> Result<(Shape, Shape), String> {
        let dims = &self.dims;
        if input.rank() != dims.rank() {
            return Err(format!(
                "expected an {} input of rank {}",
                dims.lhs,
                dims.rank()
            ));
        }
        let c_in = input.dims()[dims.channel_axis()];
        let (kh, kw) = self.filter_shape;
        let w = Shape::new(dims.filter.dims(kh, kw, c_in, self.out_chan));
        Ok((dims.to_4d(input, false), w))
    }

    /// stax's parameters for an input of `c_in` channels: `w` of [`ConvDims::kernel_shape`]
    /// drawn from [`ConvDims::glorot`], `b` of [`ConvDims::bias_shape`] from `normal(1e-6)`.
    pub(crate) fn specs(&self, c_in: usize) -> Tree<ParamSpec> {
        let dims = &self.dims;
        let kernel = dims.kernel_shape(self.filter_shape, c_in, self.out_chan);
        let w = ParamSpec::f32(kernel, dims.glorot());
        let b = ParamSpec::f32(dims.bias_shape(self.out_chan), Init::Normal(1e-6));
        Tree::node([
            (Key::Field("w"), Tree::leaf(w)),
            (Key::Field("b"), Tree::leaf(b)),
        ])
    }

    /// `conv(64, 3x3, stride 1x1, SAME)` (NHWC, no dilation), with the dimension numbers and
    /// the dilation when they are not the default: `conv_transpose(NCHW/OIHW, ..., dilation
    /// 2x1)`.
    pub(crate) fn describe(&self, kind: &str) -> String {
        let spec = match self.dims == ConvDims::NHWC {
            true => String::new(),
            false => format!("{}/{}, ", self.dims.lhs, self.dims.rhs),
        };
        let dil = match self.dilation {
            (1, 1) => String::new(),
            (a, b) => format!(", dilation {a}x{b}"),
        };
        let ((kh, kw), (sh, sw)) = (self.filter_shape, self.strides);
        format!(
            "{kind}({spec}{}, {kh}x{kw}, stride {sh}x{sw}, {}{dil})",
            self.out_chan, self.padding
        )
    }
}

/// The buffer a convolution's input gradient is written to: `x`'s own when nothing else holds
/// it (its role noted `dx`), else a fresh gradient buffer of `x`'s shape.
///
/// # Errors
/// Allocation errors.
pub(crate) fn dx_over(x: Tensor) -> Result<Tensor, LayerError> {
    if x.is_unique() {
        x.note_role("dx");
        return Ok(x);
    }
    let (be, shape, dtype) = (x.backend().clone(), x.shape().clone(), x.dtype());
    drop(x);
    let tag = Tag::new(Category::Gradient, "dx");
    Ok(Tensor::empty(&be, shape, dtype, tag)?)
}

/// Hands the kernel and bias gradients (as the ops computed them) to the sink in the shapes of
/// the parameters `specs` (`w`, `b`).
///
/// # Errors
/// The sink's errors.
pub(crate) fn hand_gradients(
    cx: &mut Cx<'_>,
    specs: &Tree<ParamSpec>,
    dw: Tensor,
    db: Tensor,
) -> Result<(), LayerError> {
    let shapes: Vec<&Shape> = specs.leaves().iter().map(|s| &s.shape).collect();
    // views in the parameters' shapes; the tensors they view are dropped, so that the sink
    // holds the only handles (an all-reduce writes them in place)
    let (w, b) = (
        dw.reshape(shapes[0].clone())?,
        db.reshape(shapes[1].clone())?,
    );
    drop((dw, db));
    cx.gradients(Tree::fields([("w", w), ("b", b)]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_follow_stax() {
        let d = ConvDims::parse("NCHW", "OIHW", "NCHW").unwrap();
        assert_eq!(d, ConvDims::NCHW);
        assert_eq!(d.kernel_shape((3, 2), 4, 8), Shape::new([8, 4, 3, 2]));
        assert_eq!(d.bias_shape(8), Shape::new([1, 8, 1, 1]));
        assert_eq!(
            d.glorot(),
            Init::GlorotNormal {
                in_axis: 1,
                out_axis: 0
            }
        );
        let n = ConvDims::NHC;
        assert_eq!(
            n.to_4d(&Shape::new([2, 9, 3]), false),
            Shape::new([2, 9, 1, 3])
        );
        assert_eq!(
            n.to_4d(&Shape::new([5, 3, 4]), true),
            Shape::new([5, 1, 3, 4])
        );
        assert_eq!(n.from_4d(&Shape::new([2, 9, 1, 4])), Shape::new([2, 9, 4]));
        assert_eq!(n.bias_shape(4), Shape::new([1, 1, 4]));
        let c = ConvDims::parse("NCH", "OIH", "NCH").unwrap();
        assert_eq!(
            c.to_4d(&Shape::new([2, 3, 9]), false),
            Shape::new([2, 3, 9, 1])
        );
        assert_eq!(
            c.to_4d(&Shape::new([4, 3, 5]), true),
            Shape::new([4, 3, 5, 1])
        );
        let e = ConvDims::parse("HWCN", "OIHW", "NHWC").unwrap_err();
        assert!(
            e.to_string()
                .contains("(HWCN, OIHW, NHWC) are not supported"),
            "{e}"
        );
    }
}
