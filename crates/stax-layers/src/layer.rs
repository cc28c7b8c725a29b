//! The `Layer` trait: stax's `(init_fun, apply_fun)` pair with an explicit backward pass.
//!
//! Inputs and outputs are trees of tensors ([`Value`]), so layers compose into graphs
//! (`FanOut`, `parallel`, `FanInSum`). `apply` returns the layer's output and its
//! [`Residuals`], what its `vjp` needs, as `jax.vjp` returns them; `vjp` consumes them and
//! hands the parameter gradients to the context's gradient sink as soon as they exist.

use std::fmt;

use stax_tensor::{DType, Key, Params, Shape, Tensor, Tree};

use crate::{Activation, Cx, LayerError};

/// A layer's input or output: one tensor (a leaf) or a tree of them (`FanOut`'s branches).
pub type Value = Tree<Tensor>;

/// The shapes of a [`Value`].
pub type Shapes = Tree<Shape>;

/// What a forward pass keeps for the backward pass: tensors (handles, nothing is copied) and
/// shapes, as a tree keyed by what they are (`x`, `mask`) or by child layer.
pub type Residuals = Tree<Saved>;

/// The per-channel sums of a gradient (f64 sums rounded once, in the gradient's dtype, `[c]`)
/// and the `[outer, c, inner]` view of the gradient they sum over: what
/// [`Layer::vjp_summing_dx`] hands the layer before it.
pub type DySums = (Tensor, stax_tensor::ChannelGeometry);

/// One thing a forward pass keeps.
#[derive(Debug, Clone)]
pub enum Saved {
    /// A tensor: an input, an output or a mask.
    Tensor(Tensor),
    /// A shape (`Flatten` keeps its input shape).
    Shape(Shape),
    /// What a [`crate::Remat`] keeps to run its layer's forward pass again: the RNG key (the
    /// same dropout masks), the outputs it saves and its BatchNorms' statistics.
    Replay(Box<crate::remat::Replay>),
}

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
    /// Every element this value: `jax.nn.initializers.zeros` (0) and `ones` (1), BatchNorm's
    /// `beta_init` and `gamma_init`.
    Constant(f32),
}

/// One parameter tensor a layer will create: its shape, dtype and initializer. Its name is
/// its key in the layer's spec tree (`w`, `b`).
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec {
    /// Shape.
    pub shape: Shape,
    /// Element type.
    pub dtype: DType,
    /// Initializer.
    pub init: Init,
    /// Whether the layer can apply the optimizer to this parameter in its own backward pass,
    /// from the factors of its gradient, so the gradient never exists whole (Dense's `w`:
    /// [`stax_tensor::ops::dense_adam`]; see [`crate::Cx::take_update`]).
    pub update_in_backward: bool,
}

impl ParamSpec {
    /// An f32 parameter of `shape` drawn from `init`.
    pub fn f32(shape: impl Into<Shape>, init: Init) -> ParamSpec {
        ParamSpec {
            shape: shape.into(),
            dtype: DType::F32,
            init,
            update_in_backward: false,
        }
    }

    /// This spec, marked as updated in the backward pass (see the field).
    pub fn updated_in_backward(self) -> ParamSpec {
        ParamSpec {
            update_in_backward: true,
            ..self
        }
    }
}

/// A stax layer: shapes first, then parameters, forward and backward.
///
/// Mirrors stax's `(init_fun, apply_fun)` pair with the backward pass explicit. `apply` takes
/// its input by value so that in-place layers (activations) reuse the buffer, and `vjp` takes
/// `dy` by value so that gradients can overwrite buffers no longer needed. Parameters are
/// made by one walk over [`Layer::param_specs`] ([`crate::init_params`]).
pub trait Layer: fmt::Debug + Send + Sync {
    /// The layer's kind (`conv`, `relu`, `serial`): the key of its parameters in a
    /// combinator's tree (`2.conv`), and so the path segment of everything it allocates.
    fn kind(&self) -> &'static str;

    /// A short readable description for messages, e.g. `conv(64, 3x3, stride 1x1, SAME)`.
    fn describe(&self) -> String {
        self.kind().to_string()
    }

    /// The dtype policy this layer runs under as a whole: a [`crate::Mixed`] layer's own,
    /// `None` (the default) for a layer that does not choose one (it runs under its caller's).
    /// The trainer reads the model's: f16 compute turns on dynamic loss scaling, and
    /// checkpoints record it.
    fn policy(&self) -> Option<crate::Policy> {
        None
    }

    /// Every dtype policy this layer and the layers inside it run under for `input`
    /// ([`crate::Mixed`]'s), outermost first: the trainer turns on dynamic loss scaling when
    /// one computes in f16, wherever it is. The default is [`Layer::policy`]'s; the
    /// combinators add their layers' for their inputs (a [`crate::ShapeDependent`] the
    /// policies of the layer it makes for `input`); a layer `input` does not fit adds none.
    fn policies(&self, _input: &Shapes) -> Vec<crate::Policy> {
        self.policy().into_iter().collect()
    }

    /// The output shapes for `input`, computed from shapes alone (no memory touched).
    ///
    /// # Errors
    /// [`LayerError::Shape`] naming the expected and the actual shape when the input does
    /// not fit the layer.
    fn output_shape(&self, input: &Shapes) -> Result<Shapes, LayerError>;

    /// The parameter tensors this layer creates for `input`: a node of fields (`w`, `b`) for a
    /// leaf layer, an empty node for a parameter-free one, one child per layer for a
    /// combinator (keyed `{index}.{kind}`).
    ///
    /// # Errors
    /// As [`Layer::output_shape`].
    fn param_specs(&self, input: &Shapes) -> Result<Tree<ParamSpec>, LayerError>;

    /// stax's `apply_fun`: the forward pass, returning the output and (in training mode) what
    /// `vjp` needs.
    ///
    /// # Errors
    /// The input's shape is checked first ([`Layer::output_shape`]); then parameter
    /// mismatches, device mismatches, allocation errors.
    fn apply(
        &self,
        params: &Params,
        x: Value,
        cx: &mut Cx<'_>,
    ) -> Result<(Value, Residuals), LayerError>;

    /// The backward pass: given `dy = dL/dy` and the residuals of `apply`, hands the parameter
    /// gradients to `cx`'s sink ([`Cx::gradients`]) and returns `dL/dx` when `need_dx`.
    ///
    /// # Errors
    /// [`LayerError::Mismatch`] for residuals of another layer; op errors.
    fn vjp(
        &self,
        params: &Params,
        residuals: Residuals,
        dy: Value,
        cx: &mut Cx<'_>,
        need_dx: bool,
    ) -> Result<Option<Value>, LayerError>;

    /// The residuals `apply` keeps in training when they are its input alone (Conv and Dense
    /// keep only their input), made from `x` without running the layer; `None` (the default)
    /// for every other layer. A [`crate::Remat`] that saves this layer's output
    /// ([`crate::Remat::saving`]) skips the layer when it recomputes the forward pass.
    ///
    /// # Errors
    /// As [`Layer::output_shape`] for an input the layer does not take.
    fn residuals_from_input(&self, _x: &Value) -> Result<Option<Residuals>, LayerError> {
        Ok(None)
    }

    /// In a rematerialized forward pass run again, this layer's residuals made from its input
    /// `x` without its output, when it is the run's last layer (nothing reads its output): a
    /// `BatchNorm` whose statistics the first run saved keeps its input with them. `None` (the
    /// default): the layer runs.
    ///
    /// # Errors
    /// As [`Layer::output_shape`] for an input the layer does not take.
    fn replay_residuals(
        &self,
        _x: &Value,
        _cx: &mut Cx<'_>,
    ) -> Result<Option<Residuals>, LayerError> {
        Ok(None)
    }

    /// The span of a [`crate::Remat`] that covers this layer and the ones after it in its
    /// [`crate::Serial`] ([`crate::Remat::spanning`]), which the serial runs as one
    /// rematerialized run; `None` (the default) for every other layer.
    fn remat_span(&self) -> Option<crate::remat::RematSpan<'_>> {
        None
    }

    /// This layer as a [`crate::GeneralConv`], if it is one: a serial folds a
    /// [`crate::BatchNorm::folded`] after a pointwise conv; `None` (the default) for every
    /// other layer.
    fn as_conv(&self) -> Option<&crate::GeneralConv> {
        None
    }

    /// This layer as a [`crate::BatchNorm`], if it is one (see [`Layer::as_conv`]); `None`
    /// (the default) for every other layer.
    fn as_batch_norm(&self) -> Option<&crate::BatchNorm> {
        None
    }

    /// The activation this layer is, if it is an elementwise activation (a combinator may hand
    /// it to the layer before, see [`Layer::fuses`]).
    fn as_activation(&self) -> Option<Activation> {
        None
    }

    /// Whether this layer can run `act` as an epilogue of its own op
    /// ([`Layer::apply_fused`], [`Layer::vjp_fused`]).
    fn fuses(&self, _act: Activation) -> bool {
        false
    }

    /// `apply` followed by the activation `act`, as one op where the backend fuses it. `aux`
    /// is the activation's own saved buffer when it keeps one (the ReLU bit mask, made by the
    /// activation layer in its own scope); the residuals must hold it for
    /// [`Layer::vjp_fused`]. Only called when [`Layer::fuses`] says so.
    ///
    /// # Errors
    /// As `apply`; [`LayerError::Config`] from layers that fuse nothing.
    fn apply_fused(
        &self,
        _params: &Params,
        _x: Value,
        _cx: &mut Cx<'_>,
        act: Activation,
        _aux: Option<Tensor>,
    ) -> Result<(Value, Residuals), LayerError> {
        Err(self.config(format!("cannot fuse {act:?}")))
    }

    /// The backward pass of [`Layer::apply_fused`]: `dy` is the gradient with respect to the
    /// activation's output.
    ///
    /// # Errors
    /// As `vjp`.
    fn vjp_fused(
        &self,
        _params: &Params,
        _residuals: Residuals,
        _dy: Value,
        _cx: &mut Cx<'_>,
        act: Activation,
        _need_dx: bool,
    ) -> Result<Option<Value>, LayerError> {
        Err(self.config(format!("cannot fuse {act:?}")))
    }

    /// Whether [`Layer::apply_adding`] runs this layer with a tensor added to its output before
    /// a ReLU, in its own last pass (a `BatchNorm`, a serial ending in one); `false` (the
    /// default) for every other layer.
    fn adds(&self) -> bool {
        false
    }

    /// In training, `relu(apply(x) + add)` as one pass of this layer (`add` of the output's
    /// shape and dtype), `mask` receiving the ReLU's bit mask (a buffer the ReLU's layer made);
    /// the residuals `apply`'s. Only called when [`Layer::adds`] says so.
    ///
    /// # Errors
    /// As `apply`; [`LayerError::Config`] from layers that add nothing.
    fn apply_adding(
        &self,
        _params: &Params,
        _x: Value,
        _cx: &mut Cx<'_>,
        (_add, _mask): (&Tensor, &mut Tensor),
    ) -> Result<(Value, Residuals), LayerError> {
        Err(self.config("adds nothing to its output".into()))
    }

    /// Whether [`Layer::apply_summed`] runs this layer with its outputs summed and a ReLU after
    /// (a `parallel` of two branches whose first one adds, [`Layer::adds`]); `false` (the
    /// default) for every other layer.
    fn runs_summed(&self) -> bool {
        false
    }

    /// In training, `apply` followed by the sum of its branches and a ReLU (the `FanInSum` and
    /// `Relu` after it in a serial: a ResNet block's end), the last branch first and its output
    /// added in the first one's last pass ([`Layer::apply_adding`]): one pass over the sum
    /// fewer each way. `mask` receives the ReLU's bit mask; returns the sum and `apply`'s
    /// residuals. Only called when [`Layer::runs_summed`] says so.
    ///
    /// # Errors
    /// As `apply`; [`LayerError::Config`] from layers that do not run summed.
    fn apply_summed(
        &self,
        _params: &Params,
        _x: Value,
        _cx: &mut Cx<'_>,
        _mask: &mut Tensor,
    ) -> Result<(Value, Residuals), LayerError> {
        Err(self.config("does not run summed".into()))
    }

    /// Whether this layer sums its input's branches (`FanInSum`): a serial runs it and the
    /// ReLU fused with it in the layer before's [`Layer::apply_summed`], and gives it
    /// [`Layer::summed_residuals`]; `false` (the default) for every other layer.
    fn sums_branches(&self) -> bool {
        false
    }

    /// The residuals of a sum of `branches` branches fused with a ReLU whose bit mask is
    /// `mask`, as its `apply_fused` keeps them (see [`Layer::sums_branches`]); an empty node
    /// from every other layer.
    fn summed_residuals(&self, _branches: usize, _mask: Tensor) -> Residuals {
        Tree::empty()
    }

    /// The ReLU bit mask this layer's backward pass applies first to its output gradient (a
    /// [`crate::FanInSum`] fused with the ReLU after it, or a [`crate::Serial`] ending in
    /// one), taken out of `residuals` (this layer's, from `apply`): its slot is left empty and
    /// the backward pass then takes `dy` as masked already. A serial takes it when the layer
    /// after this one applies it while writing its input gradient ([`Layer::masks_dx`]: the
    /// `FanOut` that starts the next ResNet block), one pass over that gradient fewer. `None`
    /// (the default) for every other layer.
    fn take_dy_mask(&self, _residuals: &mut Residuals) -> Option<Tensor> {
        None
    }

    /// Whether [`Layer::vjp_masking_dx`] applies a ReLU mask in the pass that writes the input
    /// gradient ([`crate::FanOut`], a serial starting with one); `false` (the default) for
    /// every other layer. Such a layer fuses no activation ([`Layer::fuses`]).
    fn masks_dx(&self) -> bool {
        false
    }

    /// `vjp` with `need_dx`, the input gradient then masked by a ReLU's saved bit `mask` (the
    /// ReLU's backward pass, see [`Layer::take_dy_mask`]) in the same pass. Only called when
    /// [`Layer::masks_dx`] says so.
    ///
    /// # Errors
    /// As `vjp`; [`LayerError::Config`] from layers that mask nothing.
    fn vjp_masking_dx(
        &self,
        _params: &Params,
        _residuals: Residuals,
        _dy: Value,
        _cx: &mut Cx<'_>,
        _mask: &Tensor,
    ) -> Result<Option<Value>, LayerError> {
        Err(self.config("masks no input gradient".into()))
    }

    /// Whether this layer's backward pass takes the per-channel sums of its output gradient
    /// (its bias gradient: a conv's) from the layer after it in a [`crate::Serial`], which
    /// computes them in the pass that writes that gradient ([`Layer::vjp_summing_dx`]: a
    /// `BatchNorm`'s), one pass over it fewer ([`Layer::vjp_with_dy_sums`]); `false` (the
    /// default) for every other layer.
    fn takes_dy_sums(&self) -> bool {
        false
    }

    /// `vjp` with `need_dx` (`vjp_fused` with `act` when the layer runs fused with it), and
    /// the per-channel sums of the input gradient with the view they are over ([`DySums`])
    /// where this layer computes them in the pass that writes it; the default computes none.
    ///
    /// # Errors
    /// As `vjp` and `vjp_fused`.
    fn vjp_summing_dx(
        &self,
        params: &Params,
        residuals: Residuals,
        dy: Value,
        cx: &mut Cx<'_>,
        act: Option<Activation>,
    ) -> Result<(Option<Value>, Option<DySums>), LayerError> {
        let dx = match act {
            Some(a) => self.vjp_fused(params, residuals, dy, cx, a, true)?,
            None => self.vjp(params, residuals, dy, cx, true)?,
        };
        Ok((dx, None))
    }

    /// `vjp` given the per-channel sums of `dy` ([`Layer::vjp_summing_dx`]), which the layer
    /// takes as its bias gradient where their view is its output's channels; the default
    /// drops them and runs `vjp`.
    ///
    /// # Errors
    /// As `vjp`.
    fn vjp_with_dy_sums(
        &self,
        params: &Params,
        residuals: Residuals,
        dy: Value,
        cx: &mut Cx<'_>,
        (need_dx, _sums): (bool, DySums),
    ) -> Result<Option<Value>, LayerError> {
        self.vjp(params, residuals, dy, cx, need_dx)
    }

    /// A [`LayerError::Shape`] of this layer for `input`.
    fn shape_error(&self, reason: String, input: &Shapes) -> LayerError {
        LayerError::Shape {
            path: String::new(),
            layer: self.describe(),
            reason,
            input: shapes_string(input),
        }
    }

    /// A [`LayerError::Mismatch`] of this layer.
    fn mismatch(&self, what: &'static str, reason: String) -> LayerError {
        LayerError::Mismatch {
            path: String::new(),
            layer: self.describe(),
            what,
            reason,
        }
    }

    /// A [`LayerError::Config`] of this layer.
    fn config(&self, reason: String) -> LayerError {
        LayerError::Config {
            path: String::new(),
            layer: self.describe(),
            reason,
        }
    }
}

/// `[2, 3]` for one shape, `([2, 3], [2, 3])` for a tree of them.
pub fn shapes_string(s: &Shapes) -> String {
    match s {
        Tree::Leaf(shape) => shape.to_string(),
        Tree::Node(c) => {
            let parts: Vec<String> = c.iter().map(|(_, t)| shapes_string(t)).collect();
            format!("({})", parts.join(", "))
        }
    }
}

/// The one shape of a single-tensor input.
///
/// # Errors
/// [`LayerError::Shape`] when `input` is a tree of several.
pub fn one_shape<'s>(layer: &dyn Layer, input: &'s Shapes) -> Result<&'s Shape, LayerError> {
    input
        .as_leaf()
        .ok_or_else(|| layer.shape_error("expected one tensor".into(), input))
}

/// The one tensor of a single-tensor value.
///
/// # Errors
/// [`LayerError::Shape`] when `x` is a tree of several.
pub fn one_tensor(layer: &dyn Layer, x: Value) -> Result<Tensor, LayerError> {
    match x {
        Tree::Leaf(t) => Ok(t),
        other => Err(layer.shape_error(
            "expected one tensor".into(),
            &other.map(|t| t.shape().clone()),
        )),
    }
}

/// The shapes of a value.
pub fn shapes_of(x: &Value) -> Shapes {
    x.map(|t| t.shape().clone())
}

/// The tensors of a leaf layer's parameter node, checked against the layer's specs: a node
/// of one field per spec, in order, each of the spec's shape and dtype.
///
/// # Errors
/// [`LayerError::Mismatch`] naming what differs.
pub fn expect_params<'p>(
    params: &'p Params,
    layer: &dyn Layer,
    specs: &Tree<ParamSpec>,
) -> Result<Vec<&'p Tensor>, LayerError> {
    let bad = |reason: String| layer.mismatch("parameters", reason);
    if let Some(e) = specs.structure_differs(params) {
        return Err(bad(e.to_string()));
    }
    params
        .paths()
        .into_iter()
        .zip(specs.leaves())
        .map(|((path, t), s)| {
            if t.shape() != &s.shape || t.dtype() != s.dtype {
                Err(bad(format!(
                    "{path} is {} {}, expected {} {}",
                    t.dtype(),
                    t.shape(),
                    s.dtype,
                    s.shape
                )))
            } else {
                Ok(t)
            }
        })
        .collect()
}

/// The tensor saved under `key` in a leaf layer's residuals.
///
/// # Errors
/// [`LayerError::Mismatch`] when it is missing or not a tensor (residuals of another layer).
pub fn saved_tensor(
    layer: &dyn Layer,
    residuals: &mut Residuals,
    key: &'static str,
) -> Result<Tensor, LayerError> {
    take(residuals, key)
        .and_then(|s| match s {
            Saved::Tensor(t) => Some(t),
            _ => None,
        })
        .ok_or_else(|| layer.mismatch("residuals", format!("no saved tensor `{key}`")))
}

/// The shape saved under `key` in a leaf layer's residuals.
///
/// # Errors
/// As [`saved_tensor`].
pub fn saved_shape(
    layer: &dyn Layer,
    residuals: &mut Residuals,
    key: &'static str,
) -> Result<Shape, LayerError> {
    take(residuals, key)
        .and_then(|s| match s {
            Saved::Shape(s) => Some(s),
            _ => None,
        })
        .ok_or_else(|| layer.mismatch("residuals", format!("no saved shape `{key}`")))
}

/// Takes the leaf under field `key` out of a residuals node, leaving an empty node there.
fn take(residuals: &mut Residuals, key: &'static str) -> Option<Saved> {
    let Tree::Node(children) = residuals else {
        return None;
    };
    let slot = children.iter_mut().find(|(k, _)| *k == Key::Field(key))?;
    std::mem::take(&mut slot.1).into_leaf()
}

/// Residuals of saved fields: `[("x", Saved::Tensor(x))]`.
pub fn residuals(fields: impl IntoIterator<Item = (&'static str, Saved)>) -> Residuals {
    Tree::fields(fields)
}

/// The children of a combinator's node (its parameters or residuals), checked to carry
/// `keys` in order.
pub(crate) fn children_of<'p, T>(
    layer: &dyn Layer,
    node: &'p Tree<T>,
    keys: &[Key],
    what: &'static str,
) -> Result<Vec<&'p Tree<T>>, LayerError> {
    let children = node.children();
    if matches!(node, Tree::Leaf(_)) || children.len() != keys.len() {
        let reason = format!(
            "expected {} per-layer entries, got {}",
            keys.len(),
            children.len()
        );
        return Err(layer.mismatch(what, reason));
    }
    keys.iter()
        .zip(children)
        .map(|(want, (key, t))| match key == want {
            true => Ok(t),
            false => Err(layer.mismatch(what, format!("entry `{key}` where `{want}` belongs"))),
        })
        .collect()
}
