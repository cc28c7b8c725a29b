//! `GeneralConvTranspose`: stax's transposed convolution; `ConvTranspose` and
//! `Conv1DTranspose` are its NHWC and 1-D forms.

use stax_alloc::Tag;
use stax_tensor::ops;
use stax_tensor::{Category, Conv2dGeometry, DType, Padding, Params, Shape, Tensor, Tree};

use crate::conv_dims::{ConvConfig, dx_over, hand_gradients, reason};
use crate::layer::{expect_params, one_shape, one_tensor, residuals, saved_tensor};
use crate::{ConvDims, Cx, Layer, LayerError, ParamSpec, Residuals, Saved, Shapes, Value};

/// stax's `GeneralConvTranspose(dimension_numbers, out_chan, filter_shape, strides, padding)`:
/// `y = lax.conv_transpose(x, w, strides, padding, dimension_numbers) + b`, a fractionally
/// strided convolution with the kernel used as it is (`transpose_kernel=False`; not PyTorch's
/// `ConvTranspose2d`, which flips the kernel and swaps its channels).
///
/// With [`ConvDims::NHWC`] ([`ConvTranspose`]): x `[n, h, w, c_in]`, w HWIO `[kh, kw, c_in,
/// out_chan]`, b `[1, 1, 1, out_chan]`, y `[n, out_h, out_w, out_chan]` with, per axis, SAME
/// `out = in · s`, VALID `out = in · s + max(k - s, 0)` (lax's `_conv_transpose_padding`), or
/// explicit pads `(lo, hi)` of the spread-out input: `out = (in - 1) · s + lo + hi - k + 2`. w
/// from `glorot_normal(rhs.index('I'), rhs.index('O'))`, b from `normal(1e-6)`, as stax.
///
/// It runs as the convolution it is the backward-data pass of
/// ([`Conv2dGeometry::transposed`]): the forward pass is that convolution's backward data, the
/// input gradient its forward pass, the kernel gradient its backward filter. It keeps its input
/// for the backward pass, whose buffer the input gradient then reuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GeneralConvTranspose(pub ConvConfig);

/// stax's `ConvTranspose`: [`GeneralConvTranspose`] with `('NHWC', 'HWIO', 'NHWC')`.
pub type ConvTranspose = GeneralConvTranspose;

impl GeneralConvTranspose {
    /// stax's `ConvTranspose(out_chan, filter_shape, strides, padding)`: NHWC, HWIO.
    pub fn new(
        out_chan: usize,
        filter_shape: (usize, usize),
        strides: (usize, usize),
        padding: Padding,
    ) -> Self {
        Self::general(ConvDims::NHWC, out_chan, filter_shape, strides, padding)
    }

    /// stax's `Conv1DTranspose(out_chan, (k,), (s,), padding)`: `('NHC', 'HIO', 'NHC')`, input
    /// `[n, h, c_in]`, kernel `[k, c_in, out_chan]` (explicit padding `[(lo, hi), (0, 0)]`).
    pub fn one_d(out_chan: usize, k: usize, stride: usize, padding: Padding) -> Self {
        Self::general(ConvDims::NHC, out_chan, (k, 1), (stride, 1), padding)
    }

    /// stax's `GeneralConvTranspose(dimension_numbers, out_chan, filter_shape, strides,
    /// padding)`.
    pub fn general(
        dims: ConvDims,
        out_chan: usize,
        filter_shape: (usize, usize),
        strides: (usize, usize),
        padding: Padding,
    ) -> Self {
        GeneralConvTranspose(ConvConfig::new(
            dims,
            out_chan,
            filter_shape,
            strides,
            padding,
        ))
    }

    /// This transposed convolution with its kernel dilated by `dilation`.
    pub fn dilated(self, dilation: (usize, usize)) -> Self {
        GeneralConvTranspose(ConvConfig { dilation, ..self.0 })
    }

    /// The geometry of the convolution this runs as: its output is this layer's input.
    fn geometry(&self, input: &Shape) -> Result<Conv2dGeometry, LayerError> {
        let bad = |r: String| self.shape_error(r, &Tree::leaf(input.clone()));
        let (x, w) = self.0.shapes_4d(input).map_err(bad)?;
        Conv2dGeometry::transposed(&x, &w, &self.0.spec()).map_err(|e| bad(reason(e)))
    }

    /// The parameters: the kernel's `I` is this layer's input channels (`g.c_out`).
    fn specs(&self, g: &Conv2dGeometry) -> Tree<ParamSpec> {
        self.0.specs(g.c_out)
    }

    /// The kernel as the ops' rank-4 tensor, and the bias as `[out_chan]`.
    fn kernel(&self, params: &Params, g: &Conv2dGeometry) -> Result<[Tensor; 2], LayerError> {
        let wb = expect_params(params, self, &self.specs(g))?;
        Ok([wb[0].reshape(g.filter_shape())?, wb[1].reshape([g.c_in])?])
    }
}

impl Layer for GeneralConvTranspose {
    fn kind(&self) -> &'static str {
        "conv_transpose"
    }

    fn describe(&self) -> String {
        self.0.describe("conv_transpose")
    }

    fn output_shape(&self, input: &Shapes) -> Result<Shapes, LayerError> {
        let g = self.geometry(one_shape(self, input)?)?;
        Ok(Tree::leaf(self.0.dims.from_4d(&g.input_shape())))
    }

    fn param_specs(&self, input: &Shapes) -> Result<Tree<ParamSpec>, LayerError> {
        Ok(self.specs(&self.geometry(one_shape(self, input)?)?))
    }

    /// `y = conv2d_bwd_data(x, w) + b` on the geometry of [`Conv2dGeometry::transposed`].
    fn apply(
        &self,
        params: &Params,
        x: Value,
        cx: &mut Cx<'_>,
    ) -> Result<(Value, Residuals), LayerError> {
        let x = one_tensor(self, x)?;
        let g = self.geometry(x.shape())?;
        let x = x.reshape(g.output_shape())?;
        let [w, b] = self.kernel(params, &g)?;
        let tag = Tag::new(Category::Activation, "output");
        let mut y = Tensor::empty(x.backend(), g.input_shape(), DType::F32, tag)?;
        ops::conv2d_bwd_data(&x, &w, &g, &mut y)?;
        ops::bias_add_channels(&mut y, &b, g.layout.channel_axis())?;
        let out = Tree::leaf(y.reshape(self.0.dims.from_4d(&g.input_shape()))?);
        let kept = match cx.is_training() {
            true => residuals([("x", Saved::Tensor(x))]),
            false => Tree::empty(),
        };
        Ok((out, kept))
    }

    /// `db = sum dy` over the non-channel axes, `dw` as the backward filter of the convolution
    /// with input `dy` and output gradient `x`, then `dx = conv2d(dy, w)` (no bias) over `x`'s
    /// buffer when nothing else holds it.
    fn vjp(
        &self,
        params: &Params,
        mut residuals: Residuals,
        dy: Value,
        cx: &mut Cx<'_>,
        need_dx: bool,
    ) -> Result<Option<Value>, LayerError> {
        let mut x = saved_tensor(self, &mut residuals, "x")?;
        let g = self.geometry(&self.0.dims.from_4d(x.shape()))?;
        let [w, _] = self.kernel(params, &g)?;
        let dy = one_tensor(self, dy)?.reshape(g.input_shape())?;
        let be = dy.backend().clone();
        let grad = |role| Tag::new(Category::Gradient, role);
        let mut dw = Tensor::empty(&be, g.filter_shape(), DType::F32, grad("dw"))?;
        let mut db = Tensor::empty(&be, [g.c_in], DType::F32, grad("db"))?;
        ops::bias_grad_channels(&dy, &mut db, g.layout.channel_axis())?;
        ops::conv2d_bwd_filter(&dy, &mut x, &g, &mut dw, None, None)?;
        let dx = if need_dx {
            let mut dx = dx_over(x)?;
            ops::conv2d(&dy, &w, None, &g, &mut dx, Default::default())?;
            Some(Tree::leaf(
                dx.reshape(self.0.dims.from_4d(&g.output_shape()))?,
            ))
        } else {
            None
        };
        hand_gradients(cx, &self.specs(&g), dw, db)?;
        Ok(dx)
    }
}
