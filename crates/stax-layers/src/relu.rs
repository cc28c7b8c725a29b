//! `Relu`: elementwise `max(x, 0)`, in place (stax's `Relu`).

use crate::layer::{ParamSpec, Saved, expect_fields};
use crate::{Grads, Layer, LayerError, Params, StepContext};
use stax_tensor::{Category, DType, Shape, Tensor, Tree};

/// stax's `Relu`: `y = max(x, 0)`, any shape, no parameters.
///
/// Computed in place on the input's buffer. In training mode it keeps a bit mask of `x > 0`
/// (one bit an element, 1/32 of the activation's bytes) instead of the activation itself, so the
/// activation's buffer can be freed or overwritten by the next layer's backward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Relu;

/// An empty bit mask for ReLU over `y` (U32, one bit an element, `ceil(numel / 32)` words),
/// tagged [`Category::Activation`] because it is what the backward pass keeps of the activation.
pub(crate) fn mask_for(y: &Tensor) -> Result<Tensor, LayerError> {
    let words = y.numel().div_ceil(32);
    Ok(Tensor::empty(
        y.backend(),
        [words],
        DType::U32,
        Category::Activation,
    )?)
}

impl Layer for Relu {
    fn kind(&self) -> &'static str {
        "relu"
    }

    fn name(&self) -> String {
        "relu".into()
    }

    fn is_relu(&self) -> bool {
        true
    }

    fn output_shape(&self, input: &Shape) -> Result<Shape, LayerError> {
        Ok(input.clone())
    }

    fn param_specs(&self, _input: &Shape) -> Result<Vec<ParamSpec>, LayerError> {
        Ok(Vec::new())
    }

    fn apply(
        &self,
        params: &Params,
        x: Tensor,
        cx: &mut StepContext,
    ) -> Result<Tensor, LayerError> {
        expect_fields(params, self, &[])?;
        let mut y = x.into_unique()?;
        let be = y.backend().clone();
        if cx.is_training() {
            let mut mask = mask_for(&y)?;
            be.relu(&mut y, Some(&mut mask))?;
            cx.save(Saved::Tensor(mask));
        } else {
            be.relu(&mut y, None)?;
        }
        Ok(y)
    }

    fn vjp(
        &self,
        params: &Params,
        dy: Tensor,
        cx: &mut StepContext,
        need_dx: bool,
    ) -> Result<(Option<Tensor>, Grads), LayerError> {
        expect_fields(params, self, &[])?;
        let mask = cx.take_tensor(self)?;
        let dx = if need_dx {
            let mut dx = dy.into_unique()?;
            dx.backend().clone().relu_bwd(&mut dx, &mask)?;
            Some(dx)
        } else {
            None
        };
        Ok((dx, Tree::empty()))
    }
}
