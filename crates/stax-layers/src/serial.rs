//! `Serial`: layers applied one after another (stax's `serial`).

use crate::layer::ParamSpec;
use crate::{Grads, Layer, LayerError, Params, Rng, StepContext};
use stax_tensor::{Backend, Shape, Tensor};
use std::sync::Arc;

/// stax's `serial(*layers)`: composes layers; itself a [`Layer`], with [`Params::Seq`]
/// parameters (one entry per layer).
#[derive(Debug)]
pub struct Serial(pub Vec<Box<dyn Layer>>);

/// `serial![a, b, c]` builds a [`Serial`] from layer values, like `stax.serial(a, b, c)`.
#[macro_export]
macro_rules! serial {
    ($($layer:expr),* $(,)?) => {
        $crate::Serial(vec![$(Box::new($layer) as Box<dyn $crate::Layer>),*])
    };
}

impl Serial {
    /// The input shape of every layer plus the final output shape (`len + 1` shapes).
    ///
    /// # Errors
    /// The first layer whose input does not fit.
    pub fn shapes(&self, input: &Shape) -> Result<Vec<Shape>, LayerError> {
        let mut shapes = vec![input.clone()];
        for layer in &self.0 {
            let next = layer.output_shape(shapes.last().unwrap_or(input))?;
            shapes.push(next);
        }
        Ok(shapes)
    }

    fn children<'p>(&self, params: &'p Params) -> Result<&'p [Params], LayerError> {
        match params {
            Params::Seq(v) if v.len() == self.0.len() => Ok(v),
            Params::Seq(v) => Err(LayerError::Params {
                layer: self.name(),
                reason: format!(
                    "expected {} per-layer entries, got {}",
                    self.0.len(),
                    v.len()
                ),
            }),
            Params::Leaf(_) => Err(LayerError::Params {
                layer: self.name(),
                reason: "expected nested per-layer parameters".into(),
            }),
        }
    }
}

impl Layer for Serial {
    fn name(&self) -> String {
        let names: Vec<String> = self.0.iter().map(|l| l.name()).collect();
        format!("serial[{}]", names.join(", "))
    }

    fn output_shape(&self, input: &Shape) -> Result<Shape, LayerError> {
        Ok(self.shapes(input)?.pop().unwrap_or_else(|| input.clone()))
    }

    /// Every sub-layer's specs, in order (for memory planning).
    fn param_specs(&self, input: &Shape) -> Result<Vec<ParamSpec>, LayerError> {
        let shapes = self.shapes(input)?;
        let mut specs = Vec::new();
        for (layer, s) in self.0.iter().zip(&shapes) {
            specs.extend(layer.param_specs(s)?);
        }
        Ok(specs)
    }

    fn init(
        &self,
        rng: &mut Rng,
        input: &Shape,
        backend: &Arc<dyn Backend>,
    ) -> Result<(Shape, Params), LayerError> {
        self.shapes(input)?;
        let mut shape = input.clone();
        let mut params = Vec::with_capacity(self.0.len());
        for (layer, mut key) in self.0.iter().zip(rng.split(self.0.len())) {
            let (out, p) = layer.init(&mut key, &shape, backend)?;
            params.push(p);
            shape = out;
        }
        Ok((shape, Params::Seq(params)))
    }

    /// Every sub-layer's [`Layer::init_empty`], in order (the allocation order of `init`).
    fn init_empty(
        &self,
        input: &Shape,
        backend: &Arc<dyn Backend>,
    ) -> Result<(Shape, Params), LayerError> {
        self.shapes(input)?;
        let mut shape = input.clone();
        let mut params = Vec::with_capacity(self.0.len());
        for layer in &self.0 {
            let (out, p) = layer.init_empty(&shape, backend)?;
            params.push(p);
            shape = out;
        }
        Ok((shape, Params::Seq(params)))
    }

    fn apply(
        &self,
        params: &Params,
        x: Tensor,
        cx: &mut StepContext,
    ) -> Result<Tensor, LayerError> {
        let children = self.children(params)?;
        self.0
            .iter()
            .zip(children)
            .try_fold(x, |x, (layer, p)| layer.apply(p, x, cx))
    }

    /// Backward through the layers in reverse; only the first layer's `need_dx` is the
    /// caller's, so no gradient is computed for the model's input unless asked for.
    fn vjp(
        &self,
        params: &Params,
        dy: Tensor,
        cx: &mut StepContext,
        need_dx: bool,
    ) -> Result<(Option<Tensor>, Grads), LayerError> {
        let children = self.children(params)?;
        let mut grads = Vec::with_capacity(self.0.len());
        let mut dy = Some(dy);
        for (i, (layer, p)) in self.0.iter().zip(children).enumerate().rev() {
            let d = dy.take().ok_or_else(|| LayerError::NothingSaved {
                layer: layer.name(),
            })?;
            let (dx, g) = layer.vjp(p, d, cx, i > 0 || need_dx)?;
            grads.push(g);
            dy = dx;
        }
        grads.reverse();
        Ok((dy, Params::Seq(grads)))
    }
}
