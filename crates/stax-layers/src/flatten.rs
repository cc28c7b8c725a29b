//! `Flatten`: keeps the batch axis, merges the rest (stax's `Flatten`).

use crate::layer::{ParamSpec, Saved, expect_fields};
use crate::{Grads, Layer, LayerError, Params, StepContext};
use stax_tensor::{Shape, Tensor, Tree};

/// stax's `Flatten`: `[n, d1, d2, ...] -> [n, d1 * d2 * ...]`, a view (no copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flatten;

impl Layer for Flatten {
    fn kind(&self) -> &'static str {
        "flatten"
    }

    fn name(&self) -> String {
        "flatten".into()
    }

    fn output_shape(&self, input: &Shape) -> Result<Shape, LayerError> {
        match input.dims() {
            [] => Err(LayerError::Shape {
                layer: self.name(),
                reason: "expected at least a batch axis".into(),
                input: input.clone(),
            }),
            [n, rest @ ..] => {
                let features = rest.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
                let features = features.ok_or_else(|| LayerError::Shape {
                    layer: self.name(),
                    reason: "the flattened feature count overflows usize".into(),
                    input: input.clone(),
                })?;
                Ok(Shape::new([*n, features]))
            }
        }
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
        let out = self.output_shape(x.shape())?;
        cx.save(Saved::Shape(x.shape().clone()));
        Ok(x.reshape(out)?)
    }

    fn vjp(
        &self,
        params: &Params,
        dy: Tensor,
        cx: &mut StepContext,
        need_dx: bool,
    ) -> Result<(Option<Tensor>, Grads), LayerError> {
        expect_fields(params, self, &[])?;
        let shape = cx.take_shape(self)?;
        let dx = if need_dx {
            Some(dy.reshape(shape)?)
        } else {
            None
        };
        Ok((dx, Tree::empty()))
    }
}
