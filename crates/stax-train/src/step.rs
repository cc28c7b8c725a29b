//! One training step, shared by [`crate::Trainer::step`] and the memory plan's dry run
//! ([`crate::plan::MemoryPlan`]), so the plan allocates exactly what the step does.
//!
//! The step is `value_and_grad` of the loss of `apply(params, x)` followed by the optimizer's
//! update: forward (residuals kept), loss and its gradient, backward (each layer's gradients
//! handed to a [`Collect`] sink as they exist), then the update, only if all of that worked
//! and the loss is finite. Every temporary is freed at its last use.
//!
//! When the optimizer is applied in the backward pass ([`Optimizer::in_backward`]: Adam's
//! default), the parameters whose layers can take it (a dense weight) and their moments are
//! moved out of the trees before the backward pass, updated by their layers as the gradient
//! is made ([`stax_tensor::ops::dense_adam`]), and put back after it; the rest is collected
//! and updated after the pass. A failed step still changes nothing: the loss is checked
//! finite before the backward pass, the fused op takes its workspace before writing, and the
//! trainer's set-up reserved the loop's memory ([`crate::plan::MemoryPlan::rehearse`]), so no
//! allocation after an update can run out. Should anything still fail after one, the error
//! is [`TrainError::UpdatedBeforeFailure`], naming what was updated.
//!
//! With a loss scale ([`crate::DynamicLossScale`]) the loss gradient is multiplied by it, every
//! gradient is collected (nothing is updated in the backward pass), and the update runs only
//! when every gradient is finite ([`ops::all_finite`], one download of one flag), reading the
//! gradients times `1 / scale`; otherwise the step changes nothing and says so.

use stax_layers::{
    Collect, Cx, GradSink, InBackward, Layer, LayerError, Loss, Profiler, Rng, Updates,
};

use crate::distributed::{DataParallel, sink::ReduceSink};
use stax_optim::{OptState, Optimizer};
use stax_tensor::{Backend, BinaryOp, Key, Params, Path, Shape, Tensor, Tree, ops};
use std::sync::Arc;

use crate::{DynamicLossScale, TrainError};

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

impl Phase {
    /// `forward`, `loss`, `backward` or `update`.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Forward => "forward",
            Phase::Loss => "loss",
            Phase::Backward => "backward",
            Phase::Update => "update",
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

/// What a step trains: the model, its loss and its optimizer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Parts<'a> {
    pub model: &'a dyn Layer,
    pub loss: &'a dyn Loss,
    pub opt: &'a dyn Optimizer,
    /// Whether the optimizer may update parameters in the backward pass (when it offers to,
    /// [`Optimizer::in_backward`]); off for a batch larger than the one whose memory the
    /// trainer reserved, so that running out of memory cannot follow an update.
    pub in_backward: bool,
    /// This rank's data parallelism: gradients reduced across the ranks
    /// ([`crate::distributed`]).
    pub dp: Option<&'a DataParallel>,
    /// The loss scale of the step (jmp's dynamic loss scaling; `None`: the loss as it is).
    pub loss_scale: Option<f32>,
    /// Where every layer's forward and backward pass is timed, if anywhere
    /// ([`crate::Trainer::profile_step`]).
    pub profiler: Option<&'a Profiler>,
}

impl<'a> Parts<'a> {
    /// The parts, with the optimizer applied in the backward pass where it offers to be and
    /// the loss scale a model starts with on inputs of shape `input` (`[batch, ...]`,
    /// [`DynamicLossScale::for_model`]).
    pub fn new(
        model: &'a dyn Layer,
        input: &Shape,
        loss: &'a dyn Loss,
        opt: &'a dyn Optimizer,
    ) -> Self {
        Parts {
            model,
            loss,
            opt,
            in_backward: true,
            dp: None,
            loss_scale: DynamicLossScale::for_model(model, input).map(|s| s.scale),
            profiler: None,
        }
    }
}

/// One training step on placed batches (see the module docs): one `(x, y)`, or several
/// micro-batches whose gradients are summed in place ([`Collect::summing`]; each
/// micro-batch's loss gradient scaled by `1 / batches.len()`, so the sum is the mean, as
/// optax's `MultiSteps` averages) before one update. `on_phase` is called as each [`Phase`]
/// starts (for every micro-batch). Returns the loss, the mean over micro-batches, and whether
/// the update was applied (false: a loss-scaled step whose gradients were not all finite,
/// after which `params` and `state` are unchanged).
/// The RNG key of the step (what `Dropout` draws from) is [`Rng::fold_in`]`(seed, step)`,
/// split per layer by the combinators; micro-batch `i` of `n` gets `fold_in(seed, step * n + i)`.
///
/// # Errors
/// [`TrainError::NonFiniteLoss`] (naming `step`); layer, tensor and optimizer errors, after
/// which `params` and `state` are unchanged; [`TrainError::UpdatedBeforeFailure`] (see the
/// module docs).
pub(crate) fn run_step(
    parts: Parts<'_>,
    params: &mut Params,
    state: &mut OptState,
    batches: &[(&Tensor, &Tensor)],
    (step, seed): (u64, u64),
    on_phase: &mut dyn FnMut(Phase),
) -> Result<(f32, bool), TrainError> {
    let Some(&(x, _)) = batches.first() else {
        return Err(TrainError::ZeroBatchSize { op: "step" });
    };
    let be = x.backend().clone();
    be.allocator().mark_step(step);
    if batches.len() > 1 {
        return accumulate(parts, (params, state), batches, (step, seed), on_phase);
    }
    let mut sink = ReduceSink::new(parts.dp, be.id(), false);
    let key = Rng::fold_in(seed, step);
    let (loss, residuals, dlogits) = forward(parts, params, batches[0], (1, key), on_phase)?;
    // Known before anything is updated, in the backward pass or after it.
    if !loss.is_finite() {
        return Err(TrainError::NonFiniteLoss { step, loss });
    }
    on_phase(Phase::Backward);
    let mut updates = match ReduceSink::reduces(parts.dp) {
        true => Updates::new(),
        false => take_in_backward(parts, params, state, x.shape())?,
    };
    let run = (|| {
        let mut cx = train_cx(&be, &mut sink, parts).with_updates(&mut updates);
        parts
            .model
            .vjp(params, residuals, Tree::leaf(dlogits), &mut cx, false)?;
        drop(cx);
        let grads = sink.finish(params)?;
        on_phase(Phase::Update);
        update(parts, state, &grads, params)
    })();
    let applied = restore(params, state, updates, run.is_ok())?;
    match run {
        Err(e) if !applied.is_empty() => Err(TrainError::UpdatedBeforeFailure {
            applied,
            source: Box::new(e),
        }),
        other => other.map(|finite| (loss, finite)),
    }
}

/// The optimizer's update from `grads`; under a loss scale only when every gradient is finite
/// (jmp's `all_finite`), reading them unscaled. Returns whether it was applied.
fn update(
    parts: Parts<'_>,
    state: &mut OptState,
    grads: &stax_tensor::Grads,
    params: &mut Params,
) -> Result<bool, TrainError> {
    let Some(scale) = parts.loss_scale else {
        parts.opt.update(state, grads, params)?;
        return Ok(true);
    };
    let leaves = grads.leaves();
    if let Some(first) = leaves.first() {
        let be = first.backend().clone();
        let _scope = be.allocator().scope("loss_scale");
        let tag = stax_alloc::Tag::new(stax_alloc::Category::Gradient, "nonfinite");
        let mut flag = Tensor::empty(&be, [1], stax_tensor::DType::U32, tag)?;
        ops::fill(&mut flag, 0.0)?;
        for g in leaves {
            ops::all_finite(g, &mut flag)?;
        }
        let mut word = [0u8; 4];
        ops::download(&flag, &mut word)?;
        if u32::from_le_bytes(word) != 0 {
            return Ok(false);
        }
    }
    parts
        .opt
        .update_unscaled(state, grads, params, 1.0 / scale)?;
    Ok(true)
}

/// The forward pass and the loss of one (micro-)batch: the loss, the residuals and the loss
/// gradient, scaled by `1 / of` when the batch is one of `of` micro-batches and by the loss
/// scale if any; `key` is its RNG key.
fn forward(
    parts: Parts<'_>,
    params: &Params,
    (x, y): (&Tensor, &Tensor),
    (of, key): (usize, Rng),
    on_phase: &mut dyn FnMut(Phase),
) -> Result<(f32, stax_layers::Residuals, Tensor), TrainError> {
    let be = x.backend().clone();
    on_phase(Phase::Forward);
    let mut unused = Collect::new();
    let mut cx = train_cx(&be, &mut unused, parts).with_rng(key);
    let (logits, residuals) = parts.model.apply(params, Tree::leaf(x.clone()), &mut cx)?;
    on_phase(Phase::Loss);
    let logits = one_output(parts.model, logits)?;
    let _scope = be.allocator().scope("loss");
    let (loss, mut dlogits) = parts.loss.value_and_grad(&logits, y)?;
    drop(logits);
    let factor = parts.loss_scale.unwrap_or(1.0) / of as f32;
    if factor != 1.0 {
        let tag = stax_alloc::Tag::new(stax_alloc::Category::Gradient, "scale");
        let mut scale = Tensor::empty(&be, dlogits.shape().clone(), dlogits.dtype(), tag)?;
        ops::fill(&mut scale, factor)?;
        ops::binary(BinaryOp::Mul, &mut dlogits, &scale)?;
    }
    Ok((loss, residuals, dlogits))
}

/// A training context on `be` whose gradients go to `sink`, with the step's loss scaling and
/// profiler.
fn train_cx<'c>(be: &Arc<dyn Backend>, sink: &'c mut dyn GradSink, parts: Parts<'c>) -> Cx<'c> {
    let cx = Cx::train(be, sink).with_loss_scaling(parts.loss_scale.is_some());
    match parts.profiler {
        Some(p) => cx.with_profiler(p),
        None => cx,
    }
}

/// [`run_step`] over several micro-batches: each one's forward and backward pass in turn, its
/// gradients summed into the first one's, then one update. Nothing is updated in the backward
/// pass (the sums must be whole first), so nothing changes unless every micro-batch worked.
fn accumulate(
    parts: Parts<'_>,
    (params, state): (&mut Params, &mut OptState),
    batches: &[(&Tensor, &Tensor)],
    (step, seed): (u64, u64),
    on_phase: &mut dyn FnMut(Phase),
) -> Result<(f32, bool), TrainError> {
    let mut sink = ReduceSink::new(parts.dp, batches[0].0.backend().id(), true);
    let (mut total, n) = (0.0f32, batches.len());
    for (i, &batch) in batches.iter().enumerate() {
        let key = Rng::fold_in(seed, step.wrapping_mul(n as u64).wrapping_add(i as u64));
        let (loss, residuals, dlogits) = forward(parts, params, batch, (n, key), on_phase)?;
        if !loss.is_finite() {
            return Err(TrainError::NonFiniteLoss { step, loss });
        }
        total += loss;
        on_phase(Phase::Backward);
        let be = batch.0.backend().clone();
        let mut cx = train_cx(&be, &mut sink, parts);
        parts
            .model
            .vjp(params, residuals, Tree::leaf(dlogits), &mut cx, false)?;
    }
    let grads = sink.finish(params)?;
    on_phase(Phase::Update);
    let finite = update(parts, state, &grads, params)?;
    Ok((total / n as f32, finite))
}

/// Moves the parameters Adam updates in their layers' backward passes (and their moments) out
/// of `params` and `state` into slots for the layers ([`Cx::take_update`]); none when the
/// optimizer is not applied in the backward pass.
fn take_in_backward(
    parts: Parts<'_>,
    params: &mut Params,
    state: &mut OptState,
    input: &Shape,
) -> Result<Updates, TrainError> {
    let mut updates = Updates::new();
    let t = state.count.saturating_add(1);
    // a loss-scaled update may have to be skipped after the pass: nothing is fused into it
    let fused = parts.in_backward && parts.loss_scale.is_none();
    let Some(h) = parts.opt.in_backward(t).filter(|_| fused) else {
        return Ok(updates);
    };
    let specs = parts.model.param_specs(&Tree::leaf(input.clone()))?;
    let paths: Vec<Path> = specs
        .paths()
        .into_iter()
        .filter(|(_, s)| s.update_in_backward)
        .map(|(p, _)| p)
        .collect();
    // Everything is checked before anything is moved.
    let field = |path: &Path, f: &'static str, i| path.child(Key::Field(f), i);
    for path in &paths {
        let present = params.get(path).is_some()
            && state.tree.get(&field(path, "mu", 0)).is_some()
            && state.tree.get(&field(path, "nu", 1)).is_some();
        if !present {
            return Err(TrainError::Layer(LayerError::Gradients {
                path: path.to_string(),
                reason: "updated in the backward pass, it needs itself and Adam's mu and nu".into(),
            }));
        }
    }
    for path in paths {
        let take = |tree: &mut Tree<Tensor>, p: &Path| tree.remove(p).and_then(Tree::into_leaf);
        // the moments' node, relative to the parameter: mu, nu
        let mut node = state.tree.remove(&path).unwrap_or_default();
        let root = Path::root();
        let mu = take(&mut node, &field(&root, "mu", 0));
        let nu = take(&mut node, &field(&root, "nu", 1));
        if let (Some(p), Some(mu), Some(nu)) = (take(params, &path), mu, nu) {
            let applied = false;
            updates.insert(
                path,
                InBackward {
                    p,
                    mu,
                    nu,
                    h,
                    applied,
                },
            );
        }
    }
    Ok(updates)
}

/// Puts the slots of [`take_in_backward`] back into `params` and `state`, where they were,
/// and returns the paths of those whose update was applied. After a backward pass that
/// succeeded (`ran`), every slot must have been applied.
fn restore(
    params: &mut Params,
    state: &mut OptState,
    updates: Updates,
    ran: bool,
) -> Result<Vec<String>, TrainError> {
    let mut slots: Vec<_> = updates.into_iter().collect();
    slots.sort_by(|a, b| a.0.cmp(&b.0));
    let (mut missed, mut applied) = (None, Vec::new());
    for (path, slot) in slots {
        match (slot.applied, ran) {
            (true, _) => applied.push(path.to_string()),
            (false, true) => {
                missed.get_or_insert_with(|| path.to_string());
            }
            (false, false) => {}
        }
        let moments = Tree::fields([("mu", slot.mu), ("nu", slot.nu)]);
        let put = params
            .insert(&path, Tree::leaf(slot.p))
            .and_then(|()| state.tree.insert(&path, moments));
        put.map_err(|e| LayerError::Gradients {
            path: path.to_string(),
            reason: format!("could not be put back: {e}"),
        })?;
    }
    match missed {
        Some(path) => Err(TrainError::Layer(LayerError::Gradients {
            path,
            reason: "marked for an update in the backward pass, which its layer did not apply"
                .into(),
        })),
        None => Ok(applied),
    }
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
