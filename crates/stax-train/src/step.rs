//! One training step, shared by [`crate::Trainer::step`] and the memory plan's dry run
//! ([`crate::plan::MemoryPlan`]), so the plan allocates exactly what the step does.
//!
//! The step is `value_and_grad` of the loss of `apply(params, x)` followed by the optimizer's
//! update: forward (residuals kept), loss and its gradient, backward (each layer's gradients
//! handed to a [`Collect`] sink as they exist), then the update, only if all of that worked
//! and the loss is finite. So a step that fails (out of memory, a non-finite loss) leaves
//! parameters and optimizer state as the last finished step left them. Every temporary is
//! freed at its last use.

use stax_layers::{Collect, Cx, Layer, LayerError, Loss, Rng};
use stax_optim::{OptState, Optimizer};
use stax_tensor::{Params, Shape, Tensor, Tree};

use crate::TrainError;

/// The parts of a step, in order (the plan says in which one the peak falls).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// `apply` in training mode: residuals (activations, masks) are kept.
    Forward,
    /// The loss and its gradient.
    Loss,
    /// `vjp` through the model: parameter gradients; activation gradients over dead buffers.
    Backward,
    /// The optimizer, in place.
    Update,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(match self {
            Phase::Forward => "forward",
            Phase::Loss => "loss",
            Phase::Backward => "backward",
            Phase::Update => "update",
        })
    }
}

/// What a step trains: the model, its loss and its optimizer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Parts<'a> {
    pub model: &'a dyn Layer,
    pub loss: &'a dyn Loss,
    pub opt: &'a dyn Optimizer,
}

/// One training step on a placed batch `(x, y)` (see the module docs); `on_phase` is called
/// as each [`Phase`] starts. Returns the loss. The step's RNG key (what `Dropout` draws from)
/// is [`Rng::fold_in`]`(seed, step)`, split per layer by the combinators.
///
/// # Errors
/// [`TrainError::NonFiniteLoss`] (naming `step`); layer, tensor and optimizer errors. On any
/// error `params` and `state` are unchanged.
pub(crate) fn run_step(
    parts: Parts<'_>,
    params: &mut Params,
    state: &mut OptState,
    (x, y): (&Tensor, &Tensor),
    (step, seed): (u64, u64),
    on_phase: &mut dyn FnMut(Phase),
) -> Result<f32, TrainError> {
    let be = x.backend().clone();
    be.allocator().mark_step(step);
    on_phase(Phase::Forward);
    let mut sink = Collect::new();
    let loss = {
        let mut cx = Cx::train(&be, &mut sink).with_rng(Rng::fold_in(seed, step));
        let (logits, residuals) = parts.model.apply(params, Tree::leaf(x.clone()), &mut cx)?;
        on_phase(Phase::Loss);
        let logits = one_output(parts.model, logits)?;
        let (loss, dlogits) = {
            let _scope = be.allocator().scope("loss");
            parts.loss.value_and_grad(&logits, y)?
        };
        drop(logits);
        on_phase(Phase::Backward);
        parts
            .model
            .vjp(params, residuals, Tree::leaf(dlogits), &mut cx, false)?;
        loss
    };
    let grads = sink.finish(params)?;
    if !loss.is_finite() {
        return Err(TrainError::NonFiniteLoss { step, loss });
    }
    on_phase(Phase::Update);
    parts.opt.update(state, &grads, params)?;
    drop(grads);
    Ok(loss)
}

/// The model's output as one tensor (the logits a loss reads).
pub(crate) fn one_output(model: &dyn Layer, out: Tree<Tensor>) -> Result<Tensor, TrainError> {
    match out {
        Tree::Leaf(t) => Ok(t),
        other => Err(LayerError::Shape {
            path: String::new(),
            layer: model.describe(),
            reason: "a trained model must output one tensor (the logits)".into(),
            input: stax_layers::layer::shapes_string(&other.map(|t| t.shape().clone())),
        }
        .into()),
    }
}

/// Checks a model input shape: a batch axis first, every extent positive.
pub(crate) fn check_input_shape(input: &Shape) -> Result<(), TrainError> {
    if input.rank() == 0 || input.dims().contains(&0) {
        return Err(TrainError::BatchShape {
            what: "input shape",
            expected: "[batch, ...] with every extent positive".into(),
            got: input.clone(),
        });
    }
    Ok(())
}

/// The model's output shape for `input`, a single tensor.
pub(crate) fn output_shape(model: &dyn Layer, input: &Shape) -> Result<Shape, TrainError> {
    let out = model.output_shape(&Tree::leaf(input.clone()))?;
    match out {
        Tree::Leaf(s) => Ok(s),
        other => Err(LayerError::Shape {
            path: String::new(),
            layer: model.describe(),
            reason: "a trained model must output one tensor (the logits)".into(),
            input: stax_layers::layer::shapes_string(&other),
        }
        .into()),
    }
}
