//! Elementwise activations: one layer kind, [`Elementwise`], over the [`Activation`] enum, as
//! stax's `elementwise(fun)` makes its activation layers. Each activation keeps for its
//! backward pass the least it can ([`Saves`]): the ReLU a bit mask (1/32 of the activation's
//! bytes), so the activation's buffer can be freed or overwritten by the next layer's backward
//! pass; tanh its output. Activations run in place on their input's buffer when nothing else
//! holds it, but for GELU in training, whose gradient needs its input (kept, the output made
//! in a buffer of its own). A new activation is a variant of [`Activation`] (with its
//! formulas and kernel line) and, if stax names it, a constant here.
//!
//! stax's values: [`Relu`], [`Tanh`], [`Exp`], [`Softplus`], [`Sigmoid`], [`Elu`] (alpha 1),
//! [`LeakyRelu`] (negative slope 0.01), [`Selu`], [`Gelu`] (the tanh approximation, as stax's);
//! `elementwise(elu, alpha=a)` is [`Elementwise::elu`]`(a)`. `Softmax` and `LogSoftmax` work
//! along an axis: see [`crate::softmax`].
//!
//! ```
//! use stax_layers::{Elementwise, Gelu, Layer, LeakyRelu};
//! use stax_tensor::{Shape, Tree};
//! let x = Tree::leaf(Shape::new([2, 3]));
//! assert_eq!(Gelu.output_shape(&x).unwrap(), x);
//! assert_eq!(LeakyRelu.describe(), "leaky_relu(0.01)");
//! assert!(Elementwise::elu(-1.0).output_shape(&x).is_err()); // alpha must be >= 0
//! ```

use stax_alloc::Tag;
use std::sync::Arc;

pub use stax_tensor::{Activation, Alpha, Saves};
use stax_tensor::{Backend, Category, DType, Params, Shape, Tensor, Tree, ops};

use crate::layer::{expect_params, one_shape, one_tensor, residuals, saved_tensor};
use crate::{Cx, Layer, LayerError, ParamSpec, Residuals, Saved, Shapes, Value};

/// The buffer an activation's forward pass fills for its backward pass when it keeps one of
/// its own (the ReLU's mask: U32, `ceil(numel / 32)` words, tagged [`Category::Activation`],
/// role `mask`), for an output of `shape` on `backend`; None for one that keeps its output.
///
/// # Errors
/// Allocation errors.
pub fn aux_for(
    act: Activation,
    shape: &Shape,
    backend: &Arc<dyn Backend>,
) -> Result<Option<Tensor>, LayerError> {
    match act.saves() {
        Saves::Mask => {
            let words = shape.numel().div_ceil(32);
            let tag = Tag::new(Category::Activation, "mask");
            Ok(Some(Tensor::empty(backend, [words], DType::U32, tag)?))
        }
        Saves::Output | Saves::Input => Ok(None),
    }
}

/// What an activation keeps for its backward pass, given its output `y` and its mask: the
/// residual field's name and the tensor (None for one that keeps its input: the caller has
/// it).
pub(crate) fn saved(
    act: Activation,
    y: &Tensor,
    mask: Option<Tensor>,
) -> Option<(&'static str, Saved)> {
    match act.saves() {
        Saves::Mask => mask.map(|m| ("mask", Saved::Tensor(m))),
        Saves::Output => Some(("y", Saved::Tensor(y.clone()))),
        Saves::Input => None,
    }
}

/// The residual field an activation's backward pass reads.
pub(crate) fn saved_key(act: Activation) -> &'static str {
    match act.saves() {
        Saves::Mask => "mask",
        Saves::Output => "y",
        Saves::Input => "x",
    }
}

/// An activation layer: `y = act(x)`, any shape, no parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Elementwise(pub Activation);

/// stax's `Relu`: `max(x, 0)` (see [`Activation::Relu`]).
#[allow(non_upper_case_globals)]
pub const Relu: Elementwise = Elementwise(Activation::Relu);

/// stax's `Tanh` (see [`Activation::Tanh`]).
#[allow(non_upper_case_globals)]
pub const Tanh: Elementwise = Elementwise(Activation::Tanh);

/// stax's `Exp` (see [`Activation::Exp`]).
#[allow(non_upper_case_globals)]
pub const Exp: Elementwise = Elementwise(Activation::Exp);

/// stax's `Softplus` (see [`Activation::Softplus`]).
#[allow(non_upper_case_globals)]
pub const Softplus: Elementwise = Elementwise(Activation::Softplus);

/// stax's `Sigmoid` (see [`Activation::Sigmoid`]).
#[allow(non_upper_case_globals)]
pub const Sigmoid: Elementwise = Elementwise(Activation::Sigmoid);

/// stax's `Elu`: `jax.nn.elu` with alpha 1 (see [`Activation::Elu`]).
#[allow(non_upper_case_globals)]
pub const Elu: Elementwise = Elementwise(Activation::Elu(Alpha::new(1.0)));

/// stax's `LeakyRelu`: `jax.nn.leaky_relu` with negative slope 0.01 (see
/// [`Activation::LeakyRelu`]).
#[allow(non_upper_case_globals)]
pub const LeakyRelu: Elementwise = Elementwise(Activation::LeakyRelu(Alpha::new(0.01)));

/// stax's `Selu` (see [`Activation::Selu`]).
#[allow(non_upper_case_globals)]
pub const Selu: Elementwise = Elementwise(Activation::Selu);

/// stax's `Gelu`: `jax.nn.gelu` with its default `approximate=True`, the tanh form (PyTorch's
/// default is the exact erf form; see [`Activation::Gelu`]).
#[allow(non_upper_case_globals)]
pub const Gelu: Elementwise = Elementwise(Activation::Gelu);

impl Elementwise {
    /// `stax.elementwise(jax.nn.elu, alpha=alpha)`; `alpha` must be finite and `>= 0`
    /// (checked at init).
    pub fn elu(alpha: f32) -> Elementwise {
        Elementwise(Activation::Elu(Alpha::new(alpha)))
    }

    /// `stax.elementwise(jax.nn.leaky_relu, negative_slope=slope)`; `slope` must be finite
    /// (checked at init).
    pub fn leaky_relu(slope: f32) -> Elementwise {
        Elementwise(Activation::LeakyRelu(Alpha::new(slope)))
    }
}

impl Layer for Elementwise {
    fn kind(&self) -> &'static str {
        self.0.name()
    }

    fn describe(&self) -> String {
        match self.0 {
            Activation::Elu(a) | Activation::LeakyRelu(a) => {
                format!("{}({})", self.0.name(), a.get())
            }
            act => act.name().to_string(),
        }
    }

    /// The input's shape; a bad parameter ([`Activation::check`]) is a [`LayerError::Config`].
    fn output_shape(&self, input: &Shapes) -> Result<Shapes, LayerError> {
        if let Err(e) = self.0.check() {
            return Err(self.config(e.to_string()));
        }
        Ok(Tree::leaf(one_shape(self, input)?.clone()))
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
        self.output_shape(&Tree::leaf(x.shape().clone()))?;
        let train = cx.is_training();
        let mut aux = match train {
            true => aux_for(self.0, x.shape(), x.backend())?,
            false => None,
        };
        let (input, mut y) = match train && self.0.saves() == Saves::Input {
            true => {
                let tag = Tag::new(Category::Activation, "output");
                let mut y = Tensor::empty(x.backend(), x.shape().clone(), x.dtype(), tag)?;
                ops::copy(&x, &mut y)?;
                (Some(x), y)
            }
            false => (None, x.into_unique_as("output")?),
        };
        ops::unary(self.0, &mut y, aux.as_mut())?;
        let kept = match (train, input) {
            (true, Some(x)) => residuals([("x", Saved::Tensor(x))]),
            (true, None) => residuals(saved(self.0, &y, aux)),
            (false, _) => Tree::empty(),
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
        let saved = saved_tensor(self, &mut residuals, saved_key(self.0))?;
        if !need_dx {
            return Ok(None);
        }
        let mut dx = one_tensor(self, dy)?.into_unique_as("dx")?;
        ops::unary_bwd(self.0, &saved, &mut dx)?;
        Ok(Some(Tree::leaf(dx)))
    }

    fn as_activation(&self) -> Option<Activation> {
        Some(self.0)
    }
}
