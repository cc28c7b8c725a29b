//! `Conv`: 2-D convolution, NHWC input, HWIO kernel (stax's `Conv`).

use crate::layer::{Init, ParamSpec, Saved, expect_fields};
use crate::{Grads, Layer, LayerError, Params, Relu, StepContext};
use stax_tensor::{Category, Conv2dGeometry, DType, Padding, Shape, Tensor, Tree};

/// stax's `Conv(out_chan, filter_shape, strides, padding)`: `y = conv(x, w) + b`.
///
/// x NHWC `[n, h, w, c_in]`, w HWIO `[kh, kw, c_in, out_chan]` initialized with
/// `glorot_normal(in_axis=2, out_axis=3)`, b `[out_chan]` initialized with `normal(1e-6)`
/// (stax stores b as `[1, 1, 1, out_chan]`; the values broadcast the same way).
/// Output NHWC `[n, out_h, out_w, out_chan]`, sizes as [`Padding`] says.
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
        let (kh, kw) = self.filter_shape;
        let c_in = if input.rank() == 4 {
            input.dims()[3]
        } else {
            0
        };
        let w = Shape::new([kh, kw, c_in, self.out_chan]);
        Conv2dGeometry::new(input, &w, self.strides, self.padding).map_err(|e| LayerError::Shape {
            layer: self.name(),
            reason: match e {
                stax_tensor::TensorError::Shape { reason, .. } => reason,
                stax_tensor::TensorError::InvalidArgument { reason, .. } => reason,
                other => other.to_string(),
            },
            input: input.clone(),
        })
    }

    fn weights<'p>(
        &self,
        params: &'p Params,
        input: &Shape,
    ) -> Result<Vec<&'p Tensor>, LayerError> {
        expect_fields(params, self, &self.param_specs(input)?)
    }
}

impl Layer for Conv {
    fn kind(&self) -> &'static str {
        "conv"
    }

    fn name(&self) -> String {
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

    fn output_shape(&self, input: &Shape) -> Result<Shape, LayerError> {
        if input.rank() != 4 {
            return Err(LayerError::Shape {
                layer: self.name(),
                reason: "expected an NHWC input of rank 4".into(),
                input: input.clone(),
            });
        }
        Ok(self.geometry(input)?.output_shape())
    }

    fn param_specs(&self, input: &Shape) -> Result<Vec<ParamSpec>, LayerError> {
        let g = self.geometry(input)?;
        Ok(vec![
            ParamSpec {
                name: "w",
                shape: g.filter_shape(),
                init: Init::GlorotNormal {
                    in_axis: 2,
                    out_axis: 3,
                },
            },
            ParamSpec {
                name: "b",
                shape: Shape::new([g.c_out]),
                init: Init::Normal(1e-6),
            },
        ])
    }

    fn apply(
        &self,
        params: &Params,
        x: Tensor,
        cx: &mut StepContext,
    ) -> Result<Tensor, LayerError> {
        let g = self.geometry(x.shape())?;
        let wb = self.weights(params, x.shape())?;
        let be = x.backend().clone();
        let mut y = Tensor::empty(&be, g.output_shape(), DType::F32, Category::Activation)?;
        be.conv2d(&x, wb[0], wb[1], &g, &mut y)?;
        cx.save(Saved::Tensor(x));
        Ok(y)
    }

    /// Backward: `dw, db` from `x` and `dy` first; then, if `need_dx`, `dx` is written over
    /// `x`'s buffer when nothing else holds it (the activation is no longer needed).
    fn vjp(
        &self,
        params: &Params,
        dy: Tensor,
        cx: &mut StepContext,
        need_dx: bool,
    ) -> Result<(Option<Tensor>, Grads), LayerError> {
        self.backward(params, dy, None, cx, need_dx)
    }

    /// Conv then ReLU as one backend op ([`stax_tensor::Backend::conv2d_relu`]) in training
    /// mode; saves the input, then the ReLU's mask, as the two layers would.
    fn apply_then_relu(
        &self,
        params: &Params,
        x: Tensor,
        cx: &mut StepContext,
    ) -> Result<Tensor, LayerError> {
        if !cx.is_training() {
            let y = self.apply(params, x, cx)?;
            return Relu.apply(&Tree::empty(), y, cx);
        }
        let g = self.geometry(x.shape())?;
        let wb = self.weights(params, x.shape())?;
        let be = x.backend().clone();
        let mut y = Tensor::empty(&be, g.output_shape(), DType::F32, Category::Activation)?;
        let mut mask = crate::relu::mask_for(&y)?;
        be.conv2d_relu(&x, wb[0], wb[1], &g, &mut y, &mut mask)?;
        cx.save(Saved::Tensor(x));
        cx.save(Saved::Tensor(mask));
        Ok(y)
    }

    /// The ReLU's backward fused with the kernel and bias gradients
    /// ([`stax_tensor::Backend::conv2d_bwd_filter_relu`]).
    fn vjp_through_relu(
        &self,
        params: &Params,
        dy: Tensor,
        cx: &mut StepContext,
        need_dx: bool,
    ) -> Result<(Option<Tensor>, Grads), LayerError> {
        let mask = cx.take_tensor(&Relu)?;
        self.backward(params, dy, Some(mask), cx, need_dx)
    }
}

impl Conv {
    /// The backward pass; with `mask`, `dy` is the gradient with respect to the output of the
    /// ReLU that followed, masked here (fused with the bias gradient where the backend can).
    fn backward(
        &self,
        params: &Params,
        dy: Tensor,
        mask: Option<Tensor>,
        cx: &mut StepContext,
        need_dx: bool,
    ) -> Result<(Option<Tensor>, Grads), LayerError> {
        let x = cx.take_tensor(self)?;
        let g = self.geometry(x.shape())?;
        let wb = self.weights(params, x.shape())?;
        let be = dy.backend().clone();
        let mut dw = Tensor::empty(&be, g.filter_shape(), DType::F32, Category::Gradient)?;
        let mut db = Tensor::empty(&be, [g.c_out], DType::F32, Category::Gradient)?;
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
                x
            } else {
                drop(x);
                Tensor::empty(&be, g.input_shape(), DType::F32, Category::Gradient)?
            };
            be.conv2d_bwd_data(&dy, wb[0], &g, &mut dx)?;
            Some(dx)
        } else {
            None
        };
        Ok((dx, Tree::fields([("w", dw), ("b", db)])))
    }
}
