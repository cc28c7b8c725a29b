//! `Conv`: 2-D convolution, NHWC input, HWIO kernel (stax's `Conv`).

use stax_alloc::Tag;
use stax_tensor::{Category, Conv2dGeometry, DType, Key, Padding, Params, Shape, Tensor, Tree};

use crate::layer::{expect_params, one_shape, one_tensor, residuals, saved_tensor};
use crate::{Activation, Cx, Init, Layer, LayerError, ParamSpec, Residuals, Saved, Shapes, Value};

/// stax's `Conv(out_chan, filter_shape, strides, padding)`: `y = conv(x, w) + b`.
///
/// x NHWC `[n, h, w, c_in]`, w HWIO `[kh, kw, c_in, out_chan]` initialized with
/// `glorot_normal(in_axis=2, out_axis=3)`, b `[out_chan]` initialized with `normal(1e-6)`
/// (stax stores b as `[1, 1, 1, out_chan]`; the values broadcast the same way).
/// Output NHWC `[n, out_h, out_w, out_chan]`, sizes as [`Padding`] says. A ReLU that follows
/// runs in the convolution's epilogue ([`Layer::fuses`]).
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
        let be = x.backend().clone();
        let tag = Tag::new(Category::Activation, "output");
        let mut y = Tensor::empty(&be, g.output_shape(), DType::F32, tag)?;
        let mask = match act {
            Some((Activation::Relu, Some(mut mask))) => {
                be.conv2d_relu(&x, wb[0], wb[1], &g, &mut y, &mut mask)?;
                Some(mask)
            }
            Some((act, _)) => return Err(self.config(format!("cannot fuse {act:?}"))),
            None => {
                be.conv2d(&x, wb[0], wb[1], &g, &mut y)?;
                None
            }
        };
        if !cx.is_training() {
            return Ok((Tree::leaf(y), Tree::empty()));
        }
        let mut saved = vec![("x", Saved::Tensor(x))];
        saved.extend(mask.map(|m| ("mask", Saved::Tensor(m))));
        Ok((Tree::leaf(y), residuals(saved)))
    }

    /// The backward pass; with `mask`, `dy` is the gradient with respect to the output of the
    /// ReLU that followed, masked here (fused with the bias gradient where the backend can).
    /// Kernel and bias gradients first, then `dx` over `x`'s buffer when nothing else holds
    /// it (the activation is no longer needed).
    fn backward(
        &self,
        params: &Params,
        x: Tensor,
        mask: Option<Tensor>,
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
        let dy = match mask {
            Some(mask) => {
                let mut dy = dy.into_unique()?;
                be.conv2d_bwd_filter_relu(&x, &mut dy, &mask, &g, &mut dw, &mut db)?;
                dy
            }
            None => {
                be.conv2d_bwd_filter(&x, &dy, &g, &mut dw, &mut db)?;
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
            be.conv2d_bwd_data(&dy, wb[0], &g, &mut dx)?;
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

    /// The ReLU, in the convolution's epilogue (`Backend::conv2d_relu`).
    fn fuses(&self, act: Activation) -> bool {
        act == Activation::Relu
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

    /// The ReLU's backward fused with the kernel and bias gradients
    /// (`Backend::conv2d_bwd_filter_relu`).
    fn vjp_fused(
        &self,
        params: &Params,
        mut residuals: Residuals,
        dy: Value,
        cx: &mut Cx<'_>,
        _act: Activation,
        need_dx: bool,
    ) -> Result<Option<Value>, LayerError> {
        let x = saved_tensor(self, &mut residuals, "x")?;
        let mask = saved_tensor(self, &mut residuals, "mask")?;
        self.backward(params, x, Some(mask), dy, cx, need_dx)
    }
}
