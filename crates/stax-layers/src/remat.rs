//! Rematerialization: [`Remat`] runs a layer whose forward pass keeps only its input and whose
//! backward pass recomputes the rest (`jax.checkpoint`, alias `jax.remat`; PyTorch's
//! `torch.utils.checkpoint`).

use stax_tensor::{Key, Params, Path, Tree};

use crate::cx::Saving;
use crate::{Cx, Layer, LayerError, ParamSpec, Policy, Residuals, Saved, Shapes, Value};

/// `jax.checkpoint(layer)`: in a training step the layer's forward pass runs as usual, but all
/// it keeps for the backward pass (its residuals: masks, inputs of its convs, BatchNorm's
/// statistics) is freed as soon as it returns; only the input (handles, no copy) and the RNG
/// key are kept. The backward pass runs the forward pass again from them (what that allocates is
/// named `{layer}/remat/...`, so plans show what the recomputation holds:
/// `4.serial/remat/1.parallel/0.serial/0.conv/output`), then the layer's backward pass on what
/// it made, and frees it.
///
/// So the memory between the two passes is the input instead of everything inside the layer,
/// for a second forward pass of the layer; the forward pass itself drops each inner layer's
/// residuals as soon as the layer returns. It pays where several rematerialized layers follow
/// each other (the blocks of a deep model): around a whole model, the recomputation meets the
/// output gradient and the peak rises. The results are the same bits: every op is
/// deterministic on both backends, and the recomputation draws the same RNG key (the same
/// dropout masks). Wrap each block of a deep model (`ResNet { remat_stages }`) to keep one
/// block's activations at a time in the backward pass.
///
/// Parameters are the layer's own (same tree, same kind, so paths and checkpoints do not
/// change), except that none is updated in the backward pass ([`ParamSpec`]'s
/// `update_in_backward` is cleared): the recomputation reads every parameter, so a dense
/// weight inside is collected and updated after the backward pass. In f32 that is the same
/// bits; under a bf16 or f16 policy it is what `Adam::collecting()` gives (the gradient
/// rounded to the compute dtype before the update, where the in-backward update keeps it in
/// f32). A `Remat` fuses nothing with the layers around it: an activation after it runs as its
/// own layer.
#[derive(Debug)]
pub struct Remat<L: Layer> {
    /// The layer.
    pub layer: L,
    /// The kinds of the layers inside whose outputs are saved rather than recomputed
    /// ([`Remat::saving`]); empty: only the input is kept.
    pub saving: Vec<&'static str>,
}

/// What a [`Remat`] keeps to run its layer's forward pass again ([`Saved::Replay`]): the RNG
/// key it gave the layer and the outputs it saved, by path.
#[derive(Debug, Clone)]
pub struct Replay {
    rng: Option<crate::Rng>,
    outputs: Vec<(Path, Value)>,
}

impl<L: Layer> Remat<L> {
    /// `layer`, rematerialized: only its input is kept (`jax.checkpoint`'s default policy,
    /// `nothing_saveable`).
    pub fn new(layer: L) -> Remat<L> {
        Remat {
            layer,
            saving: Vec::new(),
        }
    }

    /// This, with the outputs of the layers of kinds `kinds` inside kept between the passes
    /// (`jax.checkpoint(.., policy=save_only_these_names(..))`; `["conv"]` is in the spirit of
    /// `dots_saveable`). Such a layer whose residuals are its input alone
    /// ([`Layer::residuals_from_input`]: Conv, Dense) is not run again: the recomputation
    /// hands on its saved output and makes its residuals from its recomputed input. So
    /// `Remat::new(block).saving(&["conv"])` recomputes a ResNet block's BatchNorms, ReLUs and
    /// residual sums, not its convolutions. A saved output that a later layer inside writes in
    /// place is copied there first (it is shared); the copy is freed once the next layer has
    /// used it (the forward pass drops residuals as it goes).
    ///
    /// Only layers run by a combinator inside are saved ([`Serial`](crate::Serial),
    /// [`Parallel`](crate::Parallel)): not the wrapped layer itself, not a conv fused with the
    /// activation after it (the pair runs as one), not a layer under a [`crate::Mixed`] of its
    /// own. A training forward pass in which nothing could be saved is a
    /// [`LayerError::Config`] naming the kinds.
    pub fn saving(self, kinds: &[&'static str]) -> Remat<L> {
        Remat {
            saving: kinds.to_vec(),
            ..self
        }
    }

    /// How the layer's outputs are saved while it runs: recorded, or (`replay`) handed back.
    fn outputs(&self, replay: bool, outputs: Vec<(Path, Value)>) -> Option<Saving> {
        let kinds = self.saving.clone();
        (!kinds.is_empty()).then_some(Saving {
            kinds,
            replay,
            outputs,
        })
    }

    /// `(x, replay)` from the residuals of [`Layer::apply`].
    fn unpack(&self, residuals: Residuals) -> Result<(Value, Replay), LayerError> {
        let (mut x, mut replay) = (None, None);
        for (key, saved) in residuals.into_children() {
            match (key, saved) {
                (Key::Field("x"), t) => x = Some(t),
                (Key::Field("replay"), Tree::Leaf(Saved::Replay(r))) => replay = Some(*r),
                (key, _) => return Err(self.mismatch("residuals", format!("unexpected `{key}`"))),
            }
        }
        let missing = |what: &str| self.mismatch("residuals", format!("no saved `{what}`"));
        let x = x.ok_or_else(|| missing("x"))?;
        let x = x.try_map_into(|_, s| match s {
            Saved::Tensor(t) => Ok(t),
            _ => Err(self.mismatch("residuals", "a saved input is not a tensor".into())),
        })?;
        Ok((x, replay.ok_or_else(|| missing("replay"))?))
    }
}

impl<L: Layer> Layer for Remat<L> {
    fn kind(&self) -> &'static str {
        self.layer.kind()
    }

    fn describe(&self) -> String {
        match self.saving.is_empty() {
            true => format!("remat({})", self.layer.describe()),
            false => format!(
                "remat(saving {}: {})",
                self.saving.join(", "),
                self.layer.describe()
            ),
        }
    }

    fn policy(&self) -> Option<Policy> {
        self.layer.policy()
    }

    fn policies(&self, input: &Shapes) -> Vec<Policy> {
        self.layer.policies(input)
    }

    fn output_shape(&self, input: &Shapes) -> Result<Shapes, LayerError> {
        self.layer.output_shape(input)
    }

    fn param_specs(&self, input: &Shapes) -> Result<Tree<ParamSpec>, LayerError> {
        let specs = self.layer.param_specs(input)?;
        Ok(specs.map(|s| ParamSpec {
            update_in_backward: false,
            ..s.clone()
        }))
    }

    fn apply(
        &self,
        params: &Params,
        x: Value,
        cx: &mut Cx<'_>,
    ) -> Result<(Value, Residuals), LayerError> {
        if !cx.is_training() {
            return self.layer.apply(params, x, cx);
        }
        let rng = cx.take_rng();
        let kept = x.map(|t| Saved::Tensor(t.clone()));
        cx.replace_rng(rng.clone());
        let outer = cx.replace_saving(self.outputs(false, Vec::new()));
        let discard = cx.replace_discard(true);
        let out = self.layer.apply(params, x, cx);
        cx.replace_discard(discard);
        let saved = cx.replace_saving(outer);
        let (y, inner) = out?;
        drop(inner);
        let outputs = saved.map(|s| s.outputs).unwrap_or_default();
        if !self.saving.is_empty() && outputs.is_empty() {
            return Err(self.config(format!(
                "saving {}: no layer of these kinds inside could be saved (Conv and Dense run by \
                 a serial or parallel combinator inside, not fused with an activation after \
                 them, not under a Mixed of their own)",
                self.saving.join(", ")
            )));
        }
        let replay = Saved::Replay(Box::new(Replay { rng, outputs }));
        let fields = [
            (Key::Field("x"), kept),
            (Key::Field("replay"), Tree::leaf(replay)),
        ];
        Ok((y, Tree::node(fields)))
    }

    fn vjp(
        &self,
        params: &Params,
        residuals: Residuals,
        dy: Value,
        cx: &mut Cx<'_>,
        need_dx: bool,
    ) -> Result<Option<Value>, LayerError> {
        let (x, Replay { rng, outputs }) = self.unpack(residuals)?;
        let outer_rng = cx.replace_rng(rng);
        let outer = cx.replace_saving(self.outputs(true, outputs));
        let again = {
            // what the recomputation allocates is named `{path}/remat/...` in plans and traces
            let _scope = cx.backend().allocator().scope("remat");
            self.layer.apply(params, x, cx)
        };
        drop(cx.replace_saving(outer));
        cx.replace_rng(outer_rng);
        let (y, inner) = again?;
        drop(y);
        self.layer.vjp(params, inner, dy, cx, need_dx)
    }
}
