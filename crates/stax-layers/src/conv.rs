//! `GeneralConv`: stax's convolution with dimension numbers; `Conv` is its NHWC form.

use stax_alloc::Tag;
use stax_tensor::ops::{self, Epilogue};
use stax_tensor::{Category, Conv2dGeometry, Padding, Params, Shape, Tensor, Tree};

use crate::conv_dims::{ConvConfig, dx_over, hand_gradients, reason};
use crate::layer::{expect_params, one_shape, one_tensor, residuals, saved_tensor};
use crate::{
    Activation, ConvDims, Cx, DySums, Layer, LayerError, ParamSpec, Residuals, Saved, Shapes,
    Value, activation, compute_copy,
};

/// stax's `GeneralConv(dimension_numbers, out_chan, filter_shape, strides, padding)`:
/// `y = lax.conv_general_dilated(x, w, strides, padding, rhs_dilation=dilation) + b`, made of
/// a [`ConvConfig`].
///
/// With [`ConvDims::NHWC`] (stax's `Conv`, the [`Conv`] alias): x `[n, h, w, c_in]`, w HWIO
/// `[kh, kw, c_in, out_chan]`, b `[1, 1, 1, out_chan]`, y `[n, out_h, out_w, out_chan]`,
/// sizes as [`Padding`] says (SAME from the dilated kernel size). Other dimension numbers store
/// the tensors as their specs say (NCHW/OIHW: b `[1, out_chan, 1, 1]`; 1-D `NHC`/`HIO`: a unit
/// width, filter `(k, 1)`). w is drawn from `glorot_normal(rhs.index('I'), rhs.index('O'))`, b
/// from `normal(1e-6)`, as stax does. Kernel dilation (`lax`'s `rhs_dilation`, which stax does
/// not expose) is [`GeneralConv::dilated`]. An activation that follows runs in the
/// convolution's epilogue ([`Layer::fuses`]: cuDNN fuses a ReLU).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GeneralConv(pub ConvConfig);

/// stax's `Conv`: [`GeneralConv`] with `('NHWC', 'HWIO', 'NHWC')`.
pub type Conv = GeneralConv;

impl GeneralConv {
    /// stax's `Conv(out_chan, filter_shape, strides, padding)`: NHWC input, HWIO kernel.
    pub fn new(
        out_chan: usize,
        filter_shape: (usize, usize),
        strides: (usize, usize),
        padding: Padding,
    ) -> Self {
        GeneralConv::general(ConvDims::NHWC, out_chan, filter_shape, strides, padding)
    }

    /// Stride 1, SAME padding: the seed model's convs.
    pub fn same(out_chan: usize, filter_shape: (usize, usize)) -> Self {
        Conv::new(out_chan, filter_shape, (1, 1), Padding::Same)
    }

    /// stax's `GeneralConv(dimension_numbers, out_chan, filter_shape, strides, padding)`.
    pub fn general(
        dims: ConvDims,
        out_chan: usize,
        filter_shape: (usize, usize),
        strides: (usize, usize),
        padding: Padding,
    ) -> Self {
        GeneralConv(ConvConfig::new(
            dims,
            out_chan,
            filter_shape,
            strides,
            padding,
        ))
    }

    /// This convolution with its kernel dilated by `dilation` (`rhs_dilation`).
    pub fn dilated(self, dilation: (usize, usize)) -> Self {
        GeneralConv(ConvConfig { dilation, ..self.0 })
    }

    /// Whether this is a pointwise NHWC conv (1x1 HWIO kernel, stride 1, no padding or
    /// dilation): its output is `h · w + b` of its input `h` seen as `[rows, c_in]`.
    pub fn is_pointwise(&self) -> bool {
        let c = &self.0;
        let unpadded = matches!(c.padding, Padding::Valid | Padding::Same);
        c.dims == ConvDims::NHWC
            && c.filter_shape == (1, 1)
            && c.strides == (1, 1)
            && c.dilation == (1, 1)
            && unpadded
    }

    fn geometry(&self, input: &Shape) -> Result<Conv2dGeometry, LayerError> {
        let bad = |r: String| self.shape_error(r, &Tree::leaf(input.clone()));
        let (x, w) = self.0.shapes_4d(input).map_err(bad)?;
        Conv2dGeometry::with_spec(&x, &w, &self.0.spec()).map_err(|e| bad(reason(e)))
    }

    fn specs(&self, g: &Conv2dGeometry) -> Tree<ParamSpec> {
        self.0.specs(g.c_in)
    }

    /// The forward pass, with the activation `act` fused into the op when given. Everything
    /// is computed (and kept) as the ops' rank-4 tensors; only the output is reshaped back.
    fn forward(
        &self,
        params: &Params,
        x: Value,
        cx: &Cx<'_>,
        act: Option<(Activation, Option<Tensor>)>,
    ) -> Result<(Value, Residuals), LayerError> {
        let x = one_tensor(self, x)?;
        let g = self.geometry(x.shape())?;
        let x = x.reshape(g.input_shape())?;
        let wb = expect_params(params, self, &self.specs(&g))?;
        let dtype = x.dtype();
        let w = compute_copy(wb[0], dtype, "cast_w")?.reshape(g.filter_shape())?;
        let b = compute_copy(wb[1], dtype, "cast_b")?.reshape([g.c_out])?;
        let tag = Tag::new(Category::Activation, "output");
        let mut y = Tensor::empty(x.backend(), g.output_shape(), dtype, tag)?;
        let (act, mut aux) = match act {
            Some((a, aux)) => (Some(a), aux),
            None => (None, None),
        };
        let epi = Epilogue {
            act,
            aux: aux.as_mut(),
        };
        ops::conv2d(&x, &w, &b, &g, &mut y, epi)?;
        drop((w, b));
        let out = Tree::leaf(y.reshape(self.0.dims.from_4d(&g.output_shape()))?);
        if !cx.is_training() {
            return Ok((out, Tree::empty()));
        }
        let mut kept = vec![("x", Saved::Tensor(x))];
        kept.extend(act.and_then(|a| activation::saved(a, &y, aux)));
        Ok((out, residuals(kept)))
    }

    /// The backward pass; with `act`, `dy` is the gradient with respect to the output of the
    /// activation that followed, turned here into the convolution's output gradient from what
    /// the activation saved (fused with the bias gradient where the backend can). Kernel and
    /// bias gradients first, then `dx` over `x`'s buffer when nothing else holds it (the
    /// activation is no longer needed). A bias gradient `given` (the per-channel sums of `dy`
    /// the layer after computed, [`Layer::vjp_with_dy_sums`]) is taken as it is.
    fn backward(
        &self,
        params: &Params,
        x: Tensor,
        act: Option<(Activation, Tensor)>,
        dy: Value,
        cx: &mut Cx<'_>,
        (need_dx, given): (bool, Option<Tensor>),
    ) -> Result<Option<Value>, LayerError> {
        let g = self.geometry(&self.0.dims.from_4d(x.shape()))?;
        let wb = expect_params(params, self, &self.specs(&g))?;
        let dy = one_tensor(self, dy)?;
        let dtype = dy.dtype();
        let dy = {
            let view = dy.reshape(g.output_shape())?;
            drop(dy);
            view
        };
        let be = dy.backend().clone();
        let grad = |role| Tag::new(Category::Gradient, role);
        let mut dw = Tensor::empty(&be, g.filter_shape(), dtype, grad("dw"))?;
        let (mut db, computed) = match given {
            Some(db) => (db, false),
            None => (Tensor::empty(&be, [g.c_out], dtype, grad("db"))?, true),
        };
        let act_ref = act.as_ref().map(|(a, saved)| (*a, saved));
        if !need_dx {
            // dy is not needed afterwards: the backend need not write the masked dy back
            let db_out = computed.then_some(&mut db);
            ops::conv2d_bwd_filter_consuming(&x, dy, &g, &mut dw, db_out, act_ref)?;
            drop((x, act));
            hand_gradients(cx, &self.specs(&g), dw, db)?;
            return Ok(None);
        }
        // with an activation dy is masked in place
        let mut dy = match act_ref {
            Some(_) => dy.into_unique()?,
            None => dy,
        };
        ops::conv2d_bwd_filter(
            &x,
            &mut dy,
            &g,
            &mut dw,
            computed.then_some(&mut db),
            act_ref,
        )?;
        let mut dx = dx_over(x)?;
        let w = compute_copy(wb[0], dtype, "cast_w")?.reshape(g.filter_shape())?;
        ops::conv2d_bwd_data(&dy, &w, &g, &mut dx)?;
        let dx = Some(Tree::leaf(
            dx.reshape(self.0.dims.from_4d(&g.input_shape()))?,
        ));
        hand_gradients(cx, &self.specs(&g), dw, db)?;
        Ok(dx)
    }
}

impl Layer for GeneralConv {
    fn kind(&self) -> &'static str {
        "conv"
    }

    fn as_conv(&self) -> Option<&GeneralConv> {
        Some(self)
    }

    fn describe(&self) -> String {
        self.0.describe("conv")
    }

    fn output_shape(&self, input: &Shapes) -> Result<Shapes, LayerError> {
        let g = self.geometry(one_shape(self, input)?)?;
        Ok(Tree::leaf(self.0.dims.from_4d(&g.output_shape())))
    }

    fn param_specs(&self, input: &Shapes) -> Result<Tree<ParamSpec>, LayerError> {
        Ok(self.specs(&self.geometry(one_shape(self, input)?)?))
    }

    fn apply(
        &self,
        params: &Params,
        x: Value,
        cx: &mut Cx<'_>,
    ) -> Result<(Value, Residuals), LayerError> {
        self.forward(params, x, cx, None)
    }

    /// `x` as [`GeneralConv::apply`] keeps it: viewed with its rank-4 shape.
    fn residuals_from_input(&self, x: &Value) -> Result<Option<Residuals>, LayerError> {
        let x = one_tensor(self, x.clone())?;
        let x = x.reshape(self.geometry(x.shape())?.input_shape())?;
        Ok(Some(residuals([("x", Saved::Tensor(x))])))
    }

    fn vjp(
        &self,
        params: &Params,
        mut residuals: Residuals,
        dy: Value,
        cx: &mut Cx<'_>,
        need_dx: bool,
    ) -> Result<Option<Value>, LayerError> {
        let x = saved_tensor(self, &mut residuals, "x")?;
        self.backward(params, x, None, dy, cx, (need_dx, None))
    }

    /// Its bias is added along its output's channels, so its gradient is `dy`'s sums there.
    fn takes_dy_sums(&self) -> bool {
        true
    }

    /// The sums as the bias gradient when they are over this conv's output channels in its
    /// output's dtype (else computed here as `vjp` does).
    fn vjp_with_dy_sums(
        &self,
        params: &Params,
        mut residuals: Residuals,
        dy: Value,
        cx: &mut Cx<'_>,
        (need_dx, (sums, view)): (bool, DySums),
    ) -> Result<Option<Value>, LayerError> {
        let x = saved_tensor(self, &mut residuals, "x")?;
        let g = self.geometry(&self.0.dims.from_4d(x.shape()))?;
        let fits = view == g.output_channels()
            && sums.shape() == &Shape::new([g.c_out])
            && dy.leaves().iter().all(|t| t.dtype() == sums.dtype());
        let given = fits.then_some(sums);
        self.backward(params, x, None, dy, cx, (need_dx, given))
    }

    /// Any activation, in the convolution's epilogue ([`ops::conv2d`]'s `Epilogue`).
    fn fuses(&self, _act: Activation) -> bool {
        true
    }

    fn apply_fused(
        &self,
        params: &Params,
        x: Value,
        cx: &mut Cx<'_>,
        act: Activation,
        aux: Option<Tensor>,
    ) -> Result<(Value, Residuals), LayerError> {
        self.forward(params, x, cx, Some((act, aux)))
    }

    /// The activation's backward fused with the kernel and bias gradients
    /// ([`ops::conv2d_bwd_filter`], or [`ops::conv2d_bwd_filter_consuming`] without dx).
    fn vjp_fused(
        &self,
        params: &Params,
        mut residuals: Residuals,
        dy: Value,
        cx: &mut Cx<'_>,
        act: Activation,
        need_dx: bool,
    ) -> Result<Option<Value>, LayerError> {
        let x = saved_tensor(self, &mut residuals, "x")?;
        let saved = saved_tensor(self, &mut residuals, activation::saved_key(act))?;
        self.backward(params, x, Some((act, saved)), dy, cx, (need_dx, None))
    }
}
