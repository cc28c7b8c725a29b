//! `Conv`: 2-D convolution, NHWC input, HWIO kernel (stax's `Conv`).

use stax_alloc::Tag;
use stax_tensor::ops::{self, Epilogue};
use stax_tensor::{Category, Conv2dGeometry, DType, Key, Padding, Params, Shape, Tensor, Tree};

use crate::layer::{expect_params, one_shape, one_tensor, residuals, saved_tensor};
use crate::{
    Activation, Cx, Init, Layer, LayerError, ParamSpec, Residuals, Saved, Shapes, Value, activation,
};

/// stax's `Conv(out_chan, filter_shape, strides, padding)`: `y = conv(x, w) + b`.
///
/// x NHWC `[n, h, w, c_in]`, w HWIO `[kh, kw, c_in, out_chan]` initialized with
/// `glorot_normal(in_axis=2, out_axis=3)`, b `[out_chan]` initialized with `normal(1e-6)`
/// (stax stores b as `[1, 1, 1, out_chan]`; the values broadcast the same way).
/// Output NHWC `[n, out_h, out_w, out_chan]`, sizes as [`Padding`] says. An activation that
/// follows runs in the convolution's epilogue ([`Layer::fuses`]: cuDNN fuses a ReLU).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv {
    /// Output channels.
    pub out_chan: usize,
    /// Kernel `(height, width)`.
    pub filter_shape: (usize, usize),
    /// Strides `(height, width)`.
    pub strides: (usize, usize),
    /// SAME or VALID.
    pub padding: Padding,
}

impl Conv {
    /// A conv layer (stax: `Conv(out_chan, filter_shape, strides, padding)`).
    pub fn new(
        out_chan: usize,
        filter_shape: (usize, usize),
        strides: (usize, usize),
        padding: Padding,
    ) -> Self {
        Conv {
            out_chan,
            filter_shape,
            strides,
            padding,
        }
    }

    /// Stride 1, SAME padding: the seed model's convs.
    pub fn same(out_chan: usize, filter_shape: (usize, usize)) -> Self {
        Conv::new(out_chan, filter_shape, (1, 1), Padding::Same)
    }

    fn geometry(&self, input: &Shape) -> Result<Conv2dGeometry, LayerError> {
        let shapes = Tree::leaf(input.clone());
        let &[_, _, _, c_in] = input.dims() else {
            let reason = "expected an NHWC input [n, h, w, c] of rank 4".into();
            return Err(self.shape_error(reason, &shapes));
        };
        let (kh, kw) = self.filter_shape;
        let w = Shape::new([kh, kw, c_in, self.out_chan]);
        Conv2dGeometry::new(input, &w, self.strides, self.padding).map_err(|e| {
            let reason = match e {
                stax_tensor::TensorError::Shape { reason, .. }
                | stax_tensor::TensorError::InvalidArgument { reason, .. } => reason,
                other => other.to_string(),
            };
            self.shape_error(reason, &shapes)
        })
    }

    fn specs(g: &Conv2dGeometry) -> Tree<ParamSpec> {
        let glorot = Init::GlorotNormal {
            in_axis: 2,
            out_axis: 3,
        };
        Tree::node([
            (
                Key::Field("w"),
                Tree::leaf(ParamSpec::f32(g.filter_shape(), glorot)),
            ),
            (
                Key::Field("b"),
                Tree::leaf(ParamSpec::f32([g.c_out], Init::Normal(1e-6))),
            ),
        ])
    }

    /// The forward pass, with the activation `act` fused into the op when given.
    fn forward(
        &self,
        params: &Params,
        x: Value,
        cx: &Cx<'_>,
        act: Option<(Activation, Option<Tensor>)>,
    ) -> Result<(Value, Residuals), LayerError> {
        let x = one_tensor(self, x)?;
        let g = self.geometry(x.shape())?;
        let wb = expect_params(params, self, &Self::specs(&g))?;
        let tag = Tag::new(Category::Activation, "output");
        let mut y = Tensor::empty(x.backend(), g.output_shape(), DType::F32, tag)?;
        let (act, mut aux) = match act {
            Some((a, aux)) => (Some(a), aux),
            None => (None, None),
        };
        let epi = Epilogue {
            act,
            aux: aux.as_mut(),
        };
        ops::conv2d(&x, wb[0], wb[1], &g, &mut y, epi)?;
        if !cx.is_training() {
            return Ok((Tree::leaf(y), Tree::empty()));
        }
        let mut kept = vec![("x", Saved::Tensor(x))];
        kept.extend(act.and_then(|a| activation::saved(a, &y, aux)));
        Ok((Tree::leaf(y), residuals(kept)))
    }

    /// The backward pass; with `act`, `dy` is the gradient with respect to the output of the
    /// activation that followed, turned here into the convolution's output gradient from what
    /// the activation saved (fused with the bias gradient where the backend can). Kernel and
    /// bias gradients first, then `dx` over `x`'s buffer when nothing else holds it (the
    /// activation is no longer needed).
    fn backward(
        &self,
        params: &Params,
        x: Tensor,
        act: Option<(Activation, Tensor)>,
        dy: Value,
        cx: &mut Cx<'_>,
        need_dx: bool,
    ) -> Result<Option<Value>, LayerError> {
        let g = self.geometry(x.shape())?;
        let wb = expect_params(params, self, &Self::specs(&g))?;
        let dy = one_tensor(self, dy)?;
        let be = dy.backend().clone();
        let grad = |role| Tag::new(Category::Gradient, role);
        let mut dw = Tensor::empty(&be, g.filter_shape(), DType::F32, grad("dw"))?;
        let mut db = Tensor::empty(&be, [g.c_out], DType::F32, grad("db"))?;
        let dy = match act {
            Some((act, saved)) => {
                let mut dy = dy.into_unique()?;
                let act = Some((act, &saved));
                ops::conv2d_bwd_filter(&x, &mut dy, &g, &mut dw, &mut db, act)?;
                dy
            }
            None => {
                let mut dy = dy;
                ops::conv2d_bwd_filter(&x, &mut dy, &g, &mut dw, &mut db, None)?;
                dy
            }
        };
        let dx = if need_dx {
            let mut dx = if x.is_unique() {
                x.note_role("dx");
                x
            } else {
                drop(x);
                Tensor::empty(&be, g.input_shape(), DType::F32, grad("dx"))?
            };
            ops::conv2d_bwd_data(&dy, wb[0], &g, &mut dx)?;
            Some(Tree::leaf(dx))
        } else {
            None
        };
        cx.gradients(Tree::fields([("w", dw), ("b", db)]))?;
        Ok(dx)
    }
}

impl Layer for Conv {
    fn kind(&self) -> &'static str {
        "conv"
    }

    fn describe(&self) -> String {
        let (kh, kw) = self.filter_shape;
        let (sh, sw) = self.strides;
        let pad = match self.padding {
            Padding::Same => "SAME",
            Padding::Valid => "VALID",
        };
        format!(
            "conv({}, {kh}x{kw}, stride {sh}x{sw}, {pad})",
            self.out_chan
        )
    }

    fn output_shape(&self, input: &Shapes) -> Result<Shapes, LayerError> {
        Ok(Tree::leaf(
            self.geometry(one_shape(self, input)?)?.output_shape(),
        ))
    }

    fn param_specs(&self, input: &Shapes) -> Result<Tree<ParamSpec>, LayerError> {
        Ok(Self::specs(&self.geometry(one_shape(self, input)?)?))
    }

    fn apply(
        &self,
        params: &Params,
        x: Value,
        cx: &mut Cx<'_>,
    ) -> Result<(Value, Residuals), LayerError> {
        self.forward(params, x, cx, None)
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
        self.backward(params, x, None, dy, cx, need_dx)
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
    /// ([`ops::conv2d_bwd_filter`]).
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
        self.backward(params, x, Some((act, saved)), dy, cx, need_dx)
    }
}
