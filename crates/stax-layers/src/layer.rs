//! The `Layer` trait, parameters, and the state a training step keeps between forward and
//! backward passes.

use crate::{LayerError, Rng};
use stax_tensor::{Backend, Category, DType, Grads, Key, Params, Shape, Tensor, Tree};
use std::fmt;
use std::sync::Arc;

/// How a parameter tensor is initialized (stax's defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// `jax.nn.initializers.glorot_normal(in_axis, out_axis)`: a normal truncated to ±2
    /// standard deviations, scaled by `sqrt(1 / fan_avg) / 0.87962566103423978`, where the fans
    /// multiply the receptive field (all other axes) by the sizes of `in_axis` and `out_axis`.
    GlorotNormal {
        /// Axis of the input features (HWIO: 2, dense `[in, out]`: 0).
        in_axis: usize,
        /// Axis of the output features (HWIO: 3, dense: 1).
        out_axis: usize,
    },
    /// `jax.nn.initializers.normal(stddev)`: plain normal with this standard deviation.
    Normal(f32),
}

/// One parameter tensor a layer will create: its name, shape and initializer.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec {
    /// Short name within the layer (`w`, `b`).
    pub name: &'static str,
    /// Shape (f32).
    pub shape: Shape,
    /// Initializer.
    pub init: Init,
}

/// The tensors of a leaf layer's parameter node, checked against the layer's specs: a node
/// of one field per spec (`w`, `b`), each of the spec's shape.
///
/// # Errors
/// [`LayerError::Params`] naming what differs.
pub fn expect_fields<'p>(
    params: &'p Params,
    layer: &dyn Layer,
    specs: &[ParamSpec],
) -> Result<Vec<&'p Tensor>, LayerError> {
    let bad = |reason: String| LayerError::Params {
        layer: layer.name(),
        reason,
    };
    let children = match params {
        Tree::Node(c) => c,
        Tree::Leaf(_) => return Err(bad("expected a node of parameter fields, got a leaf".into())),
    };
    if children.len() != specs.len() {
        return Err(bad(format!(
            "expected {} tensors, got {}",
            specs.len(),
            children.len()
        )));
    }
    children
        .iter()
        .zip(specs)
        .map(|((key, t), s)| match t.as_leaf() {
            Some(t) if *key == Key::Field(s.name) && t.shape() == &s.shape => Ok(t),
            Some(t) if *key == Key::Field(s.name) => Err(bad(format!(
                "{} has shape {}, expected {}",
                s.name,
                t.shape(),
                s.shape
            ))),
            _ => Err(bad(format!("expected the tensor {} at `{key}`", s.name))),
        })
        .collect()
}

/// What a forward pass in training mode keeps for the backward pass.
#[derive(Debug)]
pub enum Saved {
    /// A tensor (an input or a mask); a handle, so nothing is copied.
    Tensor(Tensor),
    /// A shape (Flatten keeps its input shape).
    Shape(Shape),
}

/// State of one step between `apply` and `vjp`: a stack of what each layer saved.
///
/// In inference mode nothing is saved and no ReLU masks are made.
#[derive(Debug, Default)]
pub struct StepContext {
    training: bool,
    saved: Vec<Saved>,
}

impl StepContext {
    /// A context for a training step: layers save what their `vjp` needs.
    pub fn training() -> Self {
        StepContext {
            training: true,
            saved: Vec::new(),
        }
    }

    /// A context for evaluation: nothing is saved.
    pub fn inference() -> Self {
        StepContext {
            training: false,
            saved: Vec::new(),
        }
    }

    /// Whether layers should save state for a backward pass.
    pub fn is_training(&self) -> bool {
        self.training
    }

    /// Pushes what a layer saved (ignored in inference mode).
    pub fn save(&mut self, saved: Saved) {
        if self.training {
            self.saved.push(saved);
        }
    }

    /// Pops the one tensor (an input or a mask) the layer saved last.
    ///
    /// # Errors
    /// [`LayerError::NothingSaved`] if the top of the stack is empty or not a tensor.
    pub fn take_tensor(&mut self, layer: &dyn Layer) -> Result<Tensor, LayerError> {
        match self.saved.pop() {
            Some(Saved::Tensor(t)) => Ok(t),
            _ => Err(LayerError::NothingSaved {
                layer: layer.name(),
            }),
        }
    }

    /// Pops the shape the layer saved last.
    ///
    /// # Errors
    /// [`LayerError::NothingSaved`] if the top of the stack is empty or not a shape.
    pub fn take_shape(&mut self, layer: &dyn Layer) -> Result<Shape, LayerError> {
        match self.saved.pop() {
            Some(Saved::Shape(s)) => Ok(s),
            _ => Err(LayerError::NothingSaved {
                layer: layer.name(),
            }),
        }
    }

    /// Whether nothing is saved (true after a complete backward pass).
    pub fn is_empty(&self) -> bool {
        self.saved.is_empty()
    }

    /// Drops everything saved (e.g. after a failed step), freeing it.
    pub fn clear(&mut self) {
        self.saved.clear();
    }
}

/// A stax layer: shapes first, then parameters, forward and backward.
///
/// Mirrors stax's `(init_fun, apply_fun)` pair, with the backward pass explicit (`vjp`).
/// `apply` takes its input by value so that in-place layers (ReLU) reuse the buffer, and
/// `vjp` takes `dy` by value so that gradients can overwrite buffers no longer needed.
pub trait Layer: fmt::Debug + Send + Sync {
    /// The layer's kind (`conv`, `relu`, `serial`): the key of its parameters in a
    /// combinator's tree (`2.conv`), and so the path segment of everything it allocates.
    fn kind(&self) -> &'static str;

    /// A short readable name, e.g. `conv(64, 3x3, stride 1x1, SAME)`.
    fn name(&self) -> String;

    /// The output shape for `input`, computed from shapes alone (no memory touched).
    ///
    /// # Errors
    /// [`LayerError::Shape`] when the input does not fit the layer.
    fn output_shape(&self, input: &Shape) -> Result<Shape, LayerError>;

    /// The parameter tensors this layer creates for `input` (empty for parameter-free layers).
    ///
    /// # Errors
    /// As [`Layer::output_shape`].
    fn param_specs(&self, input: &Shape) -> Result<Vec<ParamSpec>, LayerError>;

    /// stax's `init_fun`: returns the output shape and freshly initialized parameters, placed
    /// on `backend` and tagged [`Category::Parameter`]. Each tensor draws from its own split of
    /// `rng`.
    ///
    /// # Errors
    /// Shape errors before any allocation; allocation errors.
    fn init(
        &self,
        rng: &mut Rng,
        input: &Shape,
        backend: &Arc<dyn Backend>,
    ) -> Result<(Shape, Params), LayerError> {
        let out = self.output_shape(input)?;
        let specs = self.param_specs(input)?;
        let keys = rng.split(specs.len());
        let tensors = specs
            .iter()
            .zip(keys)
            .map(|(s, mut k)| {
                // The tensor first: a parameter too large for the backend is its typed
                // out-of-memory error before any host memory is spent on its values.
                let mut t =
                    Tensor::empty(backend, s.shape.clone(), DType::F32, Category::Parameter)?;
                backend.upload(bytemuck::cast_slice(&k.sample(s)?), &mut t)?;
                Ok((s.name, t))
            })
            .collect::<Result<Vec<_>, LayerError>>()?;
        Ok((out, Tree::fields(tensors)))
    }

    /// [`Layer::init`] without drawing any values: the same output shape and parameter tree,
    /// the tensors allocated in the same order and tagged [`Category::Parameter`], their
    /// contents unspecified ([`Tensor::empty`]). A memory plan allocates with it exactly what
    /// `init` would, without the cost of sampling; loading saved parameters can fill it.
    ///
    /// # Errors
    /// Shape errors before any allocation; allocation errors.
    fn init_empty(
        &self,
        input: &Shape,
        backend: &Arc<dyn Backend>,
    ) -> Result<(Shape, Params), LayerError> {
        let out = self.output_shape(input)?;
        let tensors = self
            .param_specs(input)?
            .into_iter()
            .map(|s| {
                let t = Tensor::empty(backend, s.shape, DType::F32, Category::Parameter)?;
                Ok((s.name, t))
            })
            .collect::<Result<Vec<_>, LayerError>>()?;
        Ok((out, Tree::fields(tensors)))
    }

    /// stax's `apply_fun`: the forward pass. In training mode, saves what `vjp` needs in `cx`.
    ///
    /// # Errors
    /// Parameter/shape mismatches, device mismatches, allocation errors.
    fn apply(&self, params: &Params, x: Tensor, cx: &mut StepContext)
    -> Result<Tensor, LayerError>;

    /// The backward pass: given `dy = dL/dy`, returns `dL/dx` (only if `need_dx`) and the
    /// parameter gradients, consuming what `apply` saved.
    ///
    /// # Errors
    /// [`LayerError::NothingSaved`] without a training-mode `apply`; op errors.
    fn vjp(
        &self,
        params: &Params,
        dy: Tensor,
        cx: &mut StepContext,
        need_dx: bool,
    ) -> Result<(Option<Tensor>, Grads), LayerError>;

    /// Whether this layer is a ReLU, which [`crate::Serial`] hands to the layer before it
    /// ([`Layer::apply_then_relu`], [`Layer::vjp_through_relu`]) so the two can be fused.
    fn is_relu(&self) -> bool {
        false
    }

    /// `apply` followed by a ReLU, saving in `cx` exactly what `apply` then
    /// [`crate::Relu`]'s `apply` would save (so either backward pass reads it). The default
    /// runs the two; layers that can fuse the ReLU into their own op override it.
    ///
    /// # Errors
    /// As `apply`.
    fn apply_then_relu(
        &self,
        params: &Params,
        x: Tensor,
        cx: &mut StepContext,
    ) -> Result<Tensor, LayerError> {
        let y = self.apply(params, x, cx)?;
        crate::Relu.apply(&Tree::empty(), y, cx)
    }

    /// The backward pass of `apply_then_relu` (or of `apply` then a ReLU): `dy` is the
    /// gradient with respect to the ReLU's output; returns what `vjp` returns. The default runs
    /// the ReLU's backward, then `vjp`.
    ///
    /// # Errors
    /// As `vjp`.
    fn vjp_through_relu(
        &self,
        params: &Params,
        dy: Tensor,
        cx: &mut StepContext,
        need_dx: bool,
    ) -> Result<(Option<Tensor>, Grads), LayerError> {
        let relu = crate::Relu;
        let (dx, _) = relu.vjp(&Tree::empty(), dy, cx, true)?;
        let dx = dx.ok_or_else(|| LayerError::NothingSaved { layer: relu.name() })?;
        self.vjp(params, dx, cx, need_dx)
    }
}
