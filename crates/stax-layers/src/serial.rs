//! `Serial`: layers applied one after another (stax's `serial`).

use crate::layer::ParamSpec;
use crate::{Grads, Layer, LayerError, Params, Rng, StepContext};
use stax_tensor::{Backend, Key, Shape, Tensor, Tree};
use std::sync::Arc;

/// stax's `serial(*layers)`: composes layers; itself a [`Layer`], whose parameters are a node
/// with one child per layer, keyed `{index}.{kind}` (`2.conv`; parameter-free layers keep
/// their place with an empty node, as stax's `()`).
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

    fn children<'p>(&self, params: &'p Params) -> Result<Vec<&'p Params>, LayerError> {
        let bad = |reason: String| LayerError::Params {
            layer: self.name(),
            reason,
        };
        let children = match params {
            Tree::Node(c) => c,
            Tree::Leaf(_) => return Err(bad("expected nested per-layer parameters".into())),
        };
        if children.len() != self.0.len() {
            return Err(bad(format!(
                "expected {} per-layer entries, got {}",
                self.0.len(),
                children.len()
            )));
        }
        self.0
            .iter()
            .zip(children)
            .enumerate()
            .map(|(i, (layer, (key, p)))| {
                let want = Key::Layer(i, layer.kind());
                if *key == want {
                    Ok(p)
                } else {
                    Err(bad(format!("entry {i} is `{key}`, expected `{want}`")))
                }
            })
            .collect()
    }
}

impl Layer for Serial {
    fn kind(&self) -> &'static str {
        "serial"
    }

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
        for (i, (layer, mut key)) in self.0.iter().zip(rng.split(self.0.len())).enumerate() {
            let (out, p) = layer.init(&mut key, &shape, backend)?;
            params.push((Key::Layer(i, layer.kind()), p));
            shape = out;
        }
        Ok((shape, Tree::Node(params)))
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
        for (i, layer) in self.0.iter().enumerate() {
            let (out, p) = layer.init_empty(&shape, backend)?;
            params.push((Key::Layer(i, layer.kind()), p));
            shape = out;
        }
        Ok((shape, Tree::Node(params)))
    }

    fn apply(
        &self,
        params: &Params,
        x: Tensor,
        cx: &mut StepContext,
    ) -> Result<Tensor, LayerError> {
        let children = self.children(params)?;
        let mut x = x;
        let mut i = 0;
        while i < self.0.len() {
            if self.relu_follows(&children, i) {
                x = self.0[i].apply_then_relu(children[i], x, cx)?;
                i += 2;
            } else {
                x = self.0[i].apply(children[i], x, cx)?;
                i += 1;
            }
        }
        Ok(x)
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
        let mut end = self.0.len();
        while end > 0 {
            let i = end - 1;
            let d = dy.take().ok_or_else(|| LayerError::NothingSaved {
                layer: self.0[i].name(),
            })?;
            if i > 0 && self.relu_follows(&children, i - 1) {
                let (dx, g) =
                    self.0[i - 1].vjp_through_relu(children[i - 1], d, cx, i > 1 || need_dx)?;
                grads.push((Key::Layer(i, self.0[i].kind()), Tree::empty()));
                grads.push((Key::Layer(i - 1, self.0[i - 1].kind()), g));
                dy = dx;
                end -= 2;
            } else {
                let (dx, g) = self.0[i].vjp(children[i], d, cx, i > 0 || need_dx)?;
                grads.push((Key::Layer(i, self.0[i].kind()), g));
                dy = dx;
                end -= 1;
            }
        }
        grads.reverse();
        Ok((dy, Tree::Node(grads)))
    }
}

impl Serial {
    /// Whether layer `i + 1` is a ReLU with its (empty) parameters, so that layer `i` runs it
    /// ([`Layer::apply_then_relu`], [`Layer::vjp_through_relu`]: one fused op where the layer
    /// can). Otherwise the ReLU runs alone (and reports bad parameters itself).
    fn relu_follows(&self, children: &[&Params], i: usize) -> bool {
        self.0.get(i + 1).is_some_and(|l| l.is_relu())
            && matches!(children.get(i + 1), Some(Tree::Node(v)) if v.is_empty())
    }
}
