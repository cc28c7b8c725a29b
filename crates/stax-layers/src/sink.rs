//! Gradient sinks: where a backward pass puts each layer's gradients, as soon as its `vjp`
//! has them. The seam between the backward pass and the update: [`Collect`] gathers them for
//! one update after the pass (today's step); accumulation over micro-batches, an all-reduce
//! or an optimizer applied during the pass plug in here.

use std::collections::HashMap;

use stax_tensor::{AdamHyper, BinaryOp, Grads, Params, Path, Tensor, ops};

use crate::LayerError;

/// Receives each layer's gradients during a backward pass.
pub trait GradSink {
    /// The gradients `grads` (a tree like the layer's parameters) of the layer at `path`.
    ///
    /// # Errors
    /// [`LayerError::Gradients`] when the sink cannot take them.
    fn accept(&mut self, path: &Path, grads: Grads) -> Result<(), LayerError>;
}

/// Collects every gradient of a backward pass, for one update after it; or, summing, the
/// gradients of several backward passes (gradient accumulation over micro-batches, optax's
/// `MultiSteps`): the first pass's gradient tensors become the sums and each later one is
/// added into them in place (`ops::binary(Add)`) and freed at once.
#[derive(Debug, Default)]
pub struct Collect {
    by_path: HashMap<Path, Tensor>,
    summing: bool,
}

impl Collect {
    /// An empty collection; a gradient given twice is an error.
    pub fn new() -> Collect {
        Collect::default()
    }

    /// An empty sum over backward passes.
    pub fn summing() -> Collect {
        Collect {
            summing: true,
            ..Collect::default()
        }
    }

    /// The collected gradients as a tree like `params`.
    ///
    /// # Errors
    /// [`LayerError::Gradients`] naming a parameter with no gradient, or a gradient for no
    /// parameter.
    pub fn finish(mut self, params: &Params) -> Result<Grads, LayerError> {
        let grads = params.try_map(|path, _| {
            self.by_path
                .remove(path)
                .ok_or_else(|| LayerError::Gradients {
                    path: path.to_string(),
                    reason: "the backward pass gave no gradient for this parameter".into(),
                })
        })?;
        match self.by_path.keys().next() {
            Some(extra) => Err(LayerError::Gradients {
                path: extra.to_string(),
                reason: "a gradient for no parameter of the model".into(),
            }),
            None => Ok(grads),
        }
    }
}

impl GradSink for Collect {
    fn accept(&mut self, path: &Path, grads: Grads) -> Result<(), LayerError> {
        for (rest, t) in grads.paths() {
            let full = path.join(&rest);
            match self.by_path.get_mut(&full) {
                Some(sum) if self.summing => {
                    ops::binary(BinaryOp::Add, sum, t).map_err(LayerError::from)?;
                }
                Some(_) => {
                    return Err(LayerError::Gradients {
                        path: full.to_string(),
                        reason: "given twice".into(),
                    });
                }
                None => {
                    self.by_path.insert(full, t.clone());
                }
            }
        }
        Ok(())
    }
}

/// A parameter Adam updates in the backward pass of the layer that owns it, with its moments
/// and this step's hyper-parameters (optax's `adam` at step `t`, [`AdamHyper`]). The step
/// takes the parameter and its state out of their trees before the backward pass, the layer
/// takes the slot ([`crate::Cx::take_update`]), updates all three in place
/// ([`stax_tensor::ops::dense_adam`]) and gives it back ([`crate::Cx::give_back`]), and the
/// step puts them back into the trees.
#[derive(Debug)]
pub struct InBackward {
    /// The parameter.
    pub p: Tensor,
    /// Adam's first moment of it.
    pub mu: Tensor,
    /// Adam's second moment of it.
    pub nu: Tensor,
    /// This step's hyper-parameters.
    pub h: AdamHyper,
    /// Whether the update was applied (set by [`crate::Cx::give_back`]).
    pub applied: bool,
}

/// The parameters updated in the backward pass, by path (`5.dense/w`).
pub type Updates = HashMap<Path, InBackward>;
