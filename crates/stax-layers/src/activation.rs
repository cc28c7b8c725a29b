//! Elementwise activations: one layer kind, [`Elementwise`], over the [`Activation`] enum, as
//! stax's `elementwise(fun)` makes its activation layers. Each activation keeps for its
//! backward pass the least it can ([`Saves`]): the ReLU a bit mask (1/32 of the activation's
//! bytes), so the activation's buffer can be freed or overwritten by the next layer's backward
//! pass; tanh its output. Activations run in place on their input's buffer when nothing else
//! holds it. A new activation is a variant of [`Activation`] (with its formulas and kernel
//! line) and, if stax names it, a constant here.

use stax_alloc::Tag;
use std::sync::Arc;

pub use stax_tensor::{Activation, Saves};
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
        Saves::Output => Ok(None),
    }
}

/// What an activation keeps for its backward pass, given its output `y` and its mask: the
/// residual field's name and the tensor.
pub(crate) fn saved(
    act: Activation,
    y: &Tensor,
    mask: Option<Tensor>,
) -> Option<(&'static str, Saved)> {
    match act.saves() {
        Saves::Mask => mask.map(|m| ("mask", Saved::Tensor(m))),
        Saves::Output => Some(("y", Saved::Tensor(y.clone()))),
    }
}

/// The residual field an activation's backward pass reads.
pub(crate) fn saved_key(act: Activation) -> &'static str {
    match act.saves() {
        Saves::Mask => "mask",
        Saves::Output => "y",
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

impl Layer for Elementwise {
    fn kind(&self) -> &'static str {
        self.0.name()
    }

    fn output_shape(&self, input: &Shapes) -> Result<Shapes, LayerError> {
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
        let mut aux = match cx.is_training() {
            true => aux_for(self.0, x.shape(), x.backend())?,
            false => None,
        };
        let mut y = x.into_unique_as("output")?;
        ops::unary(self.0, &mut y, aux.as_mut())?;
        let kept = match cx.is_training() {
            true => residuals(saved(self.0, &y, aux)),
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
