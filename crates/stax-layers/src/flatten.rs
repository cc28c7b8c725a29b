//! `Flatten`: keeps the batch axis, merges the rest (stax's `Flatten`).

use stax_tensor::{Params, Shape, Tree};

use crate::layer::{expect_params, one_shape, one_tensor, residuals, saved_shape};
use crate::{Cx, Layer, LayerError, ParamSpec, Residuals, Saved, Shapes, Value};

/// stax's `Flatten`: `[n, d1, d2, ...] -> [n, d1 * d2 * ...]` in row-major order (so an NHWC
/// input's features are ordered (h, w, c)), a view (no copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flatten;

impl Flatten {
    fn flat(&self, input: &Shape) -> Result<Shape, LayerError> {
        let bad = |reason: &str| self.shape_error(reason.into(), &Tree::leaf(input.clone()));
        match input.dims() {
            [] => Err(bad("expected at least a batch axis")),
            [n, rest @ ..] => {
                let features = rest.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
                let features =
                    features.ok_or_else(|| bad("the flattened feature count overflows usize"))?;
                Ok(Shape::new([*n, features]))
            }
        }
    }
}

impl Layer for Flatten {
    fn kind(&self) -> &'static str {
        "flatten"
    }

    fn output_shape(&self, input: &Shapes) -> Result<Shapes, LayerError> {
        Ok(Tree::leaf(self.flat(one_shape(self, input)?)?))
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
        let out = self.flat(x.shape())?;
        let saved = match cx.is_training() {
            true => residuals([("shape", Saved::Shape(x.shape().clone()))]),
            false => Tree::empty(),
        };
        Ok((Tree::leaf(x.reshape(out)?), saved))
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
        let shape = saved_shape(self, &mut residuals, "shape")?;
        if !need_dx {
            return Ok(None);
        }
        Ok(Some(Tree::leaf(one_tensor(self, dy)?.reshape(shape)?)))
    }
}
