//! The context a layer runs in: the mode, the RNG, the dtype policy, where in the model it
//! is, and where its gradients go.

use std::sync::Arc;

use stax_tensor::{Backend, DType, Grads, Key, Params, Path, Tensor, Tree};

use crate::{GradSink, InBackward, Layer, LayerError, Profiler, Residuals, Rng, Updates, Value};

/// Training or evaluation (stax's Dropout `mode`; BatchNorm ignores it, as stax's does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// A training step: layers keep residuals for the backward pass.
    Train,
    /// Evaluation: nothing is kept, no masks are made.
    Eval,
}

/// The dtypes a model computes in (after jmp's `Policy`): where parameters are stored, what
/// the ops compute in, and what the model outputs. [`crate::Mixed`] applies one to a model or
/// a layer ([`Policy::check`] says which ones train); [`Policy::BF16`] is the usual choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Policy {
    /// Parameter storage dtype.
    pub param: DType,
    /// Activation and compute dtype.
    pub compute: DType,
    /// Output (logits) dtype.
    pub output: DType,
}

impl Default for Policy {
    /// Full f32.
    fn default() -> Self {
        Policy {
            param: DType::F32,
            compute: DType::F32,
            output: DType::F32,
        }
    }
}

/// What a layer's `apply` and `vjp` run with (see the module docs).
///
/// The combinators enter each child ([`Cx::child`]): its key extends the path, the backend's
/// allocator scope follows it (so everything the child allocates is named `2.conv/...`), and
/// the child gets its own RNG key, split as stax's `serial` splits it.
pub struct Cx<'a> {
    backend: Arc<dyn Backend>,
    mode: Mode,
    rng: Option<Rng>,
    policy: Policy,
    loss_scaled: bool,
    path: Path,
    sink: Option<&'a mut dyn GradSink>,
    updates: Option<&'a mut Updates>,
    saving: Option<Saving>,
    discard: bool,
    profiler: Option<&'a Profiler>,
}

/// What a [`crate::Remat`] saves between its passes besides its input: the outputs of its
/// `saving` kinds and every `BatchNorm`'s statistics, by path; recorded in its forward pass,
/// handed back when it recomputes (those layers skip what they saved).
#[derive(Debug, Default)]
pub(crate) struct Saving {
    /// The kinds of the layers whose outputs are saved.
    pub(crate) kinds: Vec<&'static str>,
    /// Whether the forward pass is being recomputed (outputs are taken) or run (recorded).
    pub(crate) replay: bool,
    /// The saved outputs, by the path of the layer that made them.
    pub(crate) outputs: Vec<(Path, Value)>,
    /// The saved statistics (mean, rstd), by the path of the norm that computed them.
    pub(crate) stats: Vec<(Path, NormStats)>,
}

/// A `BatchNorm`'s per-channel mean and `1 / sqrt(var + eps)`, `[c]` f32 each.
pub(crate) type NormStats = (Tensor, Tensor);

/// The entry of `saved` for the layer at `path`, taken.
fn take_at<T>(saved: &mut Vec<(Path, T)>, path: &Path) -> Option<T> {
    let at = saved.iter().position(|(p, _)| p == path)?;
    Some(saved.swap_remove(at).1)
}

impl std::fmt::Debug for Cx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cx")
            .field("mode", &self.mode)
            .field("path", &self.path.to_string())
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl<'a> Cx<'a> {
    /// A training context on `backend` whose layers hand their gradients to `sink`.
    pub fn train(backend: &Arc<dyn Backend>, sink: &'a mut dyn GradSink) -> Cx<'a> {
        Cx {
            backend: backend.clone(),
            mode: Mode::Train,
            rng: None,
            policy: Policy::default(),
            loss_scaled: false,
            path: Path::root(),
            sink: Some(sink),
            updates: None,
            saving: None,
            discard: false,
            profiler: None,
        }
    }

    /// An evaluation context on `backend`: nothing is kept for a backward pass.
    pub fn eval(backend: &Arc<dyn Backend>) -> Cx<'a> {
        Cx {
            backend: backend.clone(),
            mode: Mode::Eval,
            rng: None,
            policy: Policy::default(),
            loss_scaled: false,
            path: Path::root(),
            sink: None,
            updates: None,
            saving: None,
            discard: false,
            profiler: None,
        }
    }

    /// This context with the RNG key `rng` (stax's `apply_fun(params, inputs, rng=rng)`).
    pub fn with_rng(mut self, rng: Rng) -> Cx<'a> {
        self.rng = Some(rng);
        self
    }

    /// This context with parameters to update in the backward pass ([`Cx::take_update`]).
    pub fn with_updates(mut self, updates: &'a mut Updates) -> Cx<'a> {
        self.updates = Some(updates);
        self
    }

    /// This context with every child layer's forward and backward pass timed into `profiler`
    /// (a backend [`stax_tensor::Mark`] before and after each; see [`crate::profile`]).
    pub fn with_profiler(mut self, profiler: &'a Profiler) -> Cx<'a> {
        self.profiler = Some(profiler);
        self
    }

    /// This context with the dtype policy `policy`.
    pub fn with_policy(mut self, policy: Policy) -> Cx<'a> {
        self.policy = policy;
        self
    }

    /// This context with the loss scaled (`true`: the step multiplies the loss gradient by a
    /// dynamic loss scale and skips non-finite updates, so [`Policy::check`] lets f16 compute
    /// train).
    pub fn with_loss_scaling(mut self, on: bool) -> Cx<'a> {
        self.loss_scaled = on;
        self
    }

    /// Whether the step scales its loss (see [`Cx::with_loss_scaling`]).
    pub fn loss_scaled(&self) -> bool {
        self.loss_scaled
    }

    /// Sets the dtype policy of what runs next (a [`crate::Mixed`] layer's, for its layer) and
    /// returns the one it replaces.
    pub fn set_policy(&mut self, policy: Policy) -> Policy {
        std::mem::replace(&mut self.policy, policy)
    }

    /// Training or evaluation.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Whether layers should keep residuals for a backward pass.
    pub fn is_training(&self) -> bool {
        self.mode == Mode::Train
    }

    /// The dtype policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The backend the step runs on.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The key path of the layer running now (`3.parallel/0.serial/2.conv`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The RNG key of the layer running now, taken (None when the caller gave none).
    pub fn take_rng(&mut self) -> Option<Rng> {
        self.rng.take()
    }

    /// The RNG key of the layer running now, taken and split into one key per child of a
    /// combinator of `n` children, as stax's `serial` and `parallel` split it (`None` each when
    /// the caller gave none).
    pub(crate) fn split_rng(&mut self, n: usize) -> Vec<Option<Rng>> {
        match self.rng.take() {
            Some(mut rng) => rng.split(n).into_iter().map(Some).collect(),
            None => vec![None; n],
        }
    }

    /// Sets the RNG key of what runs next in this layer's place ([`crate::Remat`] hands its
    /// layer the key it was given, twice) and returns the one it replaces.
    pub(crate) fn replace_rng(&mut self, rng: Option<Rng>) -> Option<Rng> {
        std::mem::replace(&mut self.rng, rng)
    }

    /// Sets the outputs saving of what runs next (a [`crate::Remat`]'s, for its layer) and
    /// returns the one it replaces.
    pub(crate) fn replace_saving(&mut self, saving: Option<Saving>) -> Option<Saving> {
        std::mem::replace(&mut self.saving, saving)
    }

    /// Whether a [`crate::Remat`]'s forward pass is being run again (its backward pass).
    pub(crate) fn replaying(&self) -> bool {
        self.saving.as_ref().is_some_and(|s| s.replay)
    }

    /// The statistics saved for the norm at this path by the first run of the
    /// rematerialized forward pass being run again, taken; `None` outside such a run.
    pub(crate) fn saved_stats(&mut self) -> Option<NormStats> {
        let s = self.saving.as_mut().filter(|s| s.replay)?;
        take_at(&mut s.stats, &self.path)
    }

    /// Saves the statistics of the norm at this path (handles, no copy) when a
    /// rematerialized forward pass runs for the first time ([`Cx::saved_stats`] hands them
    /// back when it runs again); nothing otherwise.
    pub(crate) fn save_stats(&mut self, mean: &Tensor, rstd: &Tensor) {
        if let Some(s) = self.saving.as_mut().filter(|s| !s.replay) {
            s.stats
                .push((self.path.clone(), (mean.clone(), rstd.clone())));
        }
    }

    /// Sets whether the combinators drop their children's residuals as soon as each child
    /// returns ([`Cx::kept`]: a [`crate::Remat`]'s forward pass, whose residuals are not used)
    /// and returns the setting it replaces.
    pub(crate) fn replace_discard(&mut self, discard: bool) -> bool {
        std::mem::replace(&mut self.discard, discard)
    }

    /// A child's residuals as its combinator keeps them: `r`, or (in a [`crate::Remat`]'s
    /// forward pass) nothing, so what they hold is freed once the next layer has used it.
    pub(crate) fn kept(&self, r: Residuals) -> Residuals {
        match self.discard {
            true => Tree::empty(),
            false => r,
        }
    }

    /// `layer.apply(params, x)` as the child `key` (see [`Cx::child`]), the way a combinator
    /// runs its layers. Under a [`crate::Remat`] that saves `layer`'s kind, a layer whose
    /// residuals are its input ([`Layer::residuals_from_input`]) has its output recorded, and
    /// when the forward pass is recomputed that output comes back with those residuals instead
    /// of the layer running again.
    ///
    /// # Errors
    /// What `layer.apply` returns, located.
    pub(crate) fn apply_child(
        &mut self,
        (key, position): (Key, usize),
        rng: Option<Rng>,
        layer: &dyn Layer,
        params: &Params,
        x: Value,
    ) -> Result<(Value, Residuals), LayerError> {
        self.child(key, position, rng, |cx| {
            let replay = match cx
                .saving
                .as_ref()
                .filter(|s| s.kinds.contains(&layer.kind()))
            {
                Some(s) => s.replay,
                None => return layer.apply(params, x, cx),
            };
            let Some(r) = layer.residuals_from_input(&x)? else {
                return layer.apply(params, x, cx);
            };
            let path = cx.path.clone();
            if replay {
                return match cx
                    .saving
                    .as_mut()
                    .and_then(|s| take_at(&mut s.outputs, &path))
                {
                    Some(y) => Ok((y, r)),
                    None => layer.apply(params, x, cx),
                };
            }
            drop(r);
            let (y, r) = layer.apply(params, x, cx)?;
            if let Some(s) = cx.saving.as_mut() {
                s.outputs.push((path, y.clone()));
            }
            Ok((y, r))
        })
    }

    /// Runs `f` as the child `key` (at `position` among its siblings) with its own RNG key:
    /// the path and the allocator scope are the child's meanwhile, and an error comes back
    /// with `key` in front of its path.
    ///
    /// # Errors
    /// What `f` returns, located.
    pub fn child<T>(
        &mut self,
        key: Key,
        position: usize,
        rng: Option<Rng>,
        f: impl FnOnce(&mut Cx<'_>) -> Result<T, LayerError>,
    ) -> Result<T, LayerError> {
        self.enter((key, position), rng, true, f)
    }

    /// [`Cx::child`] for naming alone: the child's path and allocator scope around `f`,
    /// which runs none of the child's own work (a fused activation's buffers, made for the
    /// layer it is fused into), so no profiler span.
    pub(crate) fn name_scope<T>(
        &mut self,
        (key, position): (Key, usize),
        f: impl FnOnce(&mut Cx<'_>) -> Result<T, LayerError>,
    ) -> Result<T, LayerError> {
        self.enter((key, position), None, false, f)
    }

    fn enter<T>(
        &mut self,
        (key, position): (Key, usize),
        rng: Option<Rng>,
        profiled: bool,
        f: impl FnOnce(&mut Cx<'_>) -> Result<T, LayerError>,
    ) -> Result<T, LayerError> {
        let _scope = self.backend.allocator().scope(&key.to_string());
        let profiler = self.profiler.filter(|_| profiled);
        let open = profiler.map(|p| p.begin(&*self.backend)).transpose()?;
        let parent = std::mem::replace(&mut self.path, Path::root());
        self.path = parent.child(key, position);
        let saved_rng = std::mem::replace(&mut self.rng, rng);
        let out = f(self).map_err(|e| e.at(key));
        let path = std::mem::replace(&mut self.path, parent);
        self.rng = saved_rng;
        if let (Some(p), Some(open), Ok(_)) = (profiler, open, &out) {
            let kind = match key {
                Key::Layer(_, kind) => kind,
                _ => "",
            };
            p.end(&*self.backend, open, (path, kind))?;
        }
        out
    }

    /// The in-backward update of the running layer's parameter `field` (at `position` in its
    /// parameter node), taken: the parameter is then not in the layer's `params`, and the layer
    /// must update it and hand it back with [`Cx::give_back`], on success and on error alike.
    pub fn take_update(&mut self, field: &'static str, position: usize) -> Option<InBackward> {
        let path = self.path.child(Key::Field(field), position);
        self.updates.as_deref_mut()?.remove(&path)
    }

    /// Gives back a slot of [`Cx::take_update`], `applied` when the update ran.
    pub fn give_back(
        &mut self,
        field: &'static str,
        position: usize,
        mut slot: InBackward,
        applied: bool,
    ) {
        slot.applied = applied;
        let path = self.path.child(Key::Field(field), position);
        if let Some(u) = self.updates.as_deref_mut() {
            u.insert(path, slot);
        }
    }

    /// Hands the gradients of the layer running now (a tree like its parameters) to the sink.
    ///
    /// # Errors
    /// [`LayerError::Gradients`] in an evaluation context, or when the sink refuses them.
    pub fn gradients(&mut self, grads: Grads) -> Result<(), LayerError> {
        match self.sink.as_deref_mut() {
            Some(sink) => sink.accept(&self.path, grads),
            None => Err(LayerError::Gradients {
                path: String::new(),
                reason: "a backward pass needs a training context (Cx::train)".into(),
            }),
        }
    }
}
