//! `MaxPool`: 2-D max pooling, NHWC (stax's `MaxPool`).

use stax_alloc::Tag;
use stax_tensor::{Category, Conv2dGeometry, Padding, Params, PoolKind, Shape, Tensor, Tree, ops};

use crate::layer::{expect_params, one_shape, one_tensor, residuals, saved_tensor};
use crate::{Cx, Layer, LayerError, ParamSpec, Residuals, Saved, Shapes, Value};

/// stax's `MaxPool(window_shape, strides=None, padding='VALID')` on NHWC input: the maximum of
/// each `window` (spatial only), moved by `strides` (stax's default: 1, not the window),
/// SAME padding reading -inf. The gradient goes to each window's first maximum
/// (XLA's select-and-scatter). Keeps its input for the backward pass (a handle).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxPool {
    /// Window `(height, width)`.
    pub window: (usize, usize),
    /// Strides `(height, width)`.
    pub strides: (usize, usize),
    /// SAME or VALID.
    pub padding: Padding,
}

impl MaxPool {
    /// stax's `MaxPool(window)`: stride 1, VALID.
    pub fn new(window: (usize, usize)) -> MaxPool {
        MaxPool {
            window,
            strides: (1, 1),
            padding: Padding::Valid,
        }
    }

    /// This pooling with `strides` and `padding`.
    pub fn with(self, strides: (usize, usize), padding: Padding) -> MaxPool {
        MaxPool {
            strides,
            padding,
            ..self
        }
    }

    fn geometry(&self, input: &Shape) -> Result<Conv2dGeometry, LayerError> {
        let shapes = Tree::leaf(input.clone());
        let &[_, _, _, c] = input.dims() else {
            let reason = "expected an NHWC input [n, h, w, c] of rank 4".into();
            return Err(self.shape_error(reason, &shapes));
        };
        let (kh, kw) = self.window;
        let w = Shape::new([kh, kw, c, c]);
        Conv2dGeometry::new(input, &w, self.strides, self.padding).map_err(|e| {
            let reason = match e {
                stax_tensor::TensorError::InvalidArgument { reason, .. } => reason,
                other => other.to_string(),
            };
            self.shape_error(reason, &shapes)
        })
    }
}

impl Layer for MaxPool {
    fn kind(&self) -> &'static str {
        "max_pool"
    }

    fn describe(&self) -> String {
        let ((kh, kw), (sh, sw)) = (self.window, self.strides);
        let pad = match self.padding {
            Padding::Same => "SAME",
            Padding::Valid => "VALID",
        };
        format!("max_pool({kh}x{kw}, stride {sh}x{sw}, {pad})")
    }

    fn output_shape(&self, input: &Shapes) -> Result<Shapes, LayerError> {
        Ok(Tree::leaf(
            self.geometry(one_shape(self, input)?)?.output_shape(),
        ))
    }

    fn param_specs(&self, input: &Shapes) -> Result<Tree<ParamSpec>, LayerError> {
        self.output_shape(input)?;
        Ok(Tree::empty())
    }

    fn apply(
        &self,
        params: &Params,
        x: Value,
        cx: &mut Cx<'_>,
    ) -> Result<(Value, Residuals), LayerError> {
        expect_params(params, self, &Tree::empty())?;
        let x = one_tensor(self, x)?;
        let g = self.geometry(x.shape())?;
        let tag = Tag::new(Category::Activation, "output");
        let mut y = Tensor::empty(x.backend(), g.output_shape(), x.dtype(), tag)?;
        ops::pool2d(PoolKind::Max, &g, &x, &mut y)?;
        let kept = match cx.is_training() {
            true => residuals([("x", Saved::Tensor(x))]),
            false => Tree::empty(),
        };
        Ok((Tree::leaf(y), kept))
    }

    fn vjp(
        &self,
        params: &Params,
        mut residuals: Residuals,
        dy: Value,
        _cx: &mut Cx<'_>,
        need_dx: bool,
    ) -> Result<Option<Value>, LayerError> {
        expect_params(params, self, &Tree::empty())?;
        let x = saved_tensor(self, &mut residuals, "x")?;
        if !need_dx {
            return Ok(None);
        }
        let dy = one_tensor(self, dy)?;
        let g = self.geometry(x.shape())?;
        let tag = Tag::new(Category::Gradient, "dx");
        let mut dx = Tensor::empty(x.backend(), g.input_shape(), x.dtype(), tag)?;
        ops::pool2d_bwd(PoolKind::Max, &g, &x, &dy, &mut dx)?;
        Ok(Some(Tree::leaf(dx)))
    }
}
