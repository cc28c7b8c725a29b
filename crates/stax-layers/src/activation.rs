//! Elementwise activations: one layer kind, [`Elementwise`], over the [`Activation`] enum, as
//! stax's `elementwise(fun)` makes its activation layers. Each activation keeps for its
//! backward pass the least it can ([`Saves`]): the ReLU a bit mask (1/32 of the activation's
//! bytes), so the activation's buffer can be freed or overwritten by the next layer's backward
//! pass. Activations run in place on their input's buffer when nothing else holds it.

use stax_alloc::Tag;
use std::sync::Arc;

use stax_tensor::{Backend, Category, DType, Params, Shape, Tensor, Tree};

use crate::layer::{expect_params, one_shape, one_tensor, residuals, saved_tensor};
use crate::{Cx, Layer, LayerError, ParamSpec, Residuals, Saved, Shapes, Value};

/// An elementwise activation function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Activation {
    /// `jax.nn.relu`: `max(x, 0)`, NaN propagated as `jnp.maximum` does; gradient
    /// `select(x > 0, g, 0)` (relu'(0) = 0).
    Relu,
}

/// What an activation's backward pass reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Saves {
    /// A bit mask of `x > 0` (U32 words, one bit an element), made by the activation layer.
    Mask,
}

impl Activation {
    /// stax's name of the layer (`relu`).
    pub fn name(self) -> &'static str {
        match self {
            Activation::Relu => "relu",
        }
    }

    /// What its backward pass reads.
    pub fn saves(self) -> Saves {
        match self {
            Activation::Relu => Saves::Mask,
        }
    }

    /// Applies the activation to `y` in place; with `aux` (training), also writes what the
    /// backward pass reads.
    ///
    /// # Errors
    /// The backend's op errors.
    pub fn forward(self, y: &mut Tensor, aux: Option<&mut Tensor>) -> Result<(), LayerError> {
        let be = y.backend().clone();
        match self {
            Activation::Relu => be.relu(y, aux)?,
        }
        Ok(())
    }

    /// The backward pass, in place on `dy` (the gradient with respect to the output), from
    /// what the forward pass saved.
    ///
    /// # Errors
    /// The backend's op errors.
    pub fn backward(self, saved: &Tensor, dy: &mut Tensor) -> Result<(), LayerError> {
        let be = dy.backend().clone();
        match self {
            Activation::Relu => be.relu_bwd(dy, saved)?,
        }
        Ok(())
    }

    /// The buffer the forward pass fills for the backward pass when the activation keeps one
    /// of its own (the ReLU's mask: U32, `ceil(numel / 32)` words, tagged
    /// [`Category::Activation`], role `mask`), for an output of `shape` on `backend`.
    ///
    /// # Errors
    /// Allocation errors.
    pub fn aux_for(
        self,
        shape: &Shape,
        backend: &Arc<dyn Backend>,
    ) -> Result<Option<Tensor>, LayerError> {
        match self.saves() {
            Saves::Mask => {
                let words = shape.numel().div_ceil(32);
                let tag = Tag::new(Category::Activation, "mask");
                Ok(Some(Tensor::empty(backend, [words], DType::U32, tag)?))
            }
        }
    }
}

/// An activation layer: `y = act(x)`, any shape, no parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Elementwise(pub Activation);

/// stax's `Relu`: `max(x, 0)` (see [`Activation::Relu`]).
#[allow(non_upper_case_globals)]
pub const Relu: Elementwise = Elementwise(Activation::Relu);

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
            true => self.0.aux_for(x.shape(), x.backend())?,
            false => None,
        };
        let mut y = x.into_unique_as("output")?;
        self.0.forward(&mut y, aux.as_mut())?;
        let saved = match aux {
            Some(mask) => residuals([("mask", Saved::Tensor(mask))]),
            None => Tree::empty(),
        };
        Ok((Tree::leaf(y), saved))
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
        let saved = saved_tensor(self, &mut residuals, "mask")?;
        if !need_dx {
            return Ok(None);
        }
        let mut dx = one_tensor(self, dy)?.into_unique_as("dx")?;
        self.0.backward(&saved, &mut dx)?;
        Ok(Some(Tree::leaf(dx)))
    }

    fn as_activation(&self) -> Option<Activation> {
        Some(self.0)
    }
}
