//! Rematerialization: [`Remat`] runs a layer whose forward pass keeps only its input (and its
//! BatchNorms' statistics) and whose backward pass recomputes the rest (`jax.checkpoint`, alias
//! `jax.remat`; PyTorch's `torch.utils.checkpoint`).

use stax_tensor::{Key, Params, Path, Tree};

use crate::cx::{NormStats, Saving};
use crate::{Cx, Layer, LayerError, ParamSpec, Policy, Residuals, Rng, Saved, Shapes, Value};

/// `jax.checkpoint(layer)`: in a training step the layer's forward pass runs as usual, but all
/// it keeps for the backward pass (its residuals: masks, inputs of its convs, BatchNorm's
/// statistics) is freed as soon as it returns; only the input (handles, no copy), the RNG
/// key and the BatchNorms' statistics (`[c]` each: run again, a BatchNorm normalizes with them,
/// one pass over its input fewer) are kept. The backward pass runs the forward pass again from
/// them (what that allocates is named `{layer}/remat/...`, so plans show what the
/// recomputation holds: `4.serial/remat/1.parallel/0.serial/0.conv/output`), then the layer's
/// backward pass on what it made, and frees it.
///
/// So the memory between the two passes is the input instead of everything inside the layer,
/// for a second forward pass of the layer; the forward pass itself drops each inner layer's
/// residuals as soon as the layer returns. It pays where several rematerialized layers follow
/// each other (the blocks of a deep model): around a whole model, the recomputation meets the
/// output gradient and the peak rises. The results are the same bits: every op is
/// deterministic on both backends, and the recomputation draws the same RNG key (the same
/// dropout masks); that holds where each conv gets the same workspace in both models (a
/// backend's headroom rule may give a smaller plan's convs more, which sums a filter gradient
/// in another order). Wrap each block of a deep model (`ResNet { remat_stages }`) to keep one
/// block's activations at a time in the backward pass, or let one `Remat` span several layers
/// of its serial ([`Remat::spanning`]).
///
/// Parameters are the layer's own (same tree, same kind, so paths and checkpoints do not
/// change), except that none is updated in the backward pass ([`ParamSpec`]'s
/// `update_in_backward` is cleared): the recomputation reads every parameter, so a dense
/// weight inside is collected and updated after the backward pass. That is the same
/// arithmetic as the in-backward update (under a bf16 or f16 policy both round the gradient
/// to the compute dtype once before the update). A `Remat` of one layer fuses nothing with the
/// layers around it: an activation after it runs as its own layer. Inside a span
/// ([`Remat::spanning`]) the first layer fuses with an activation after it as it would outside
/// (a `BatchNorm Relu` pair), unless the span saves that layer's kind (its output is then
/// saved, unfused).
#[derive(Debug)]
pub struct Remat<L: Layer> {
    /// The layer.
    pub layer: L,
    /// The kinds of the layers inside whose outputs are saved rather than recomputed
    /// ([`Remat::saving`]); empty: only the input (and the BatchNorms' statistics) is kept.
    pub saving: Vec<&'static str>,
    /// How many layers of its [`crate::Serial`] it covers, itself first ([`Remat::spanning`]);
    /// 1: its layer alone.
    pub span: usize,
}

/// What a rematerialized run keeps to run its forward pass again ([`Saved::Replay`]): the RNG
/// keys it gave its layers (a [`Remat`]'s one, a span's one a layer), the outputs it saved and
/// its BatchNorms' statistics (mean, rstd), by path.
#[derive(Debug, Clone, Default)]
pub struct Replay {
    rngs: Vec<Option<Rng>>,
    outputs: Vec<(Path, Value)>,
    stats: Vec<(Path, NormStats)>,
}

/// A [`Remat`] spanning layers of its serial ([`Layer::remat_span`]): how many, the kinds it
/// saves, and the layer it wraps (the span's first).
#[derive(Debug, Clone, Copy)]
pub struct RematSpan<'a> {
    /// Layers covered, the wrapping one first.
    pub len: usize,
    /// The kinds whose outputs are saved ([`Remat::saving`]).
    pub saving: &'a [&'static str],
    /// The first layer, unwrapped.
    pub first: &'a dyn Layer,
}

/// The forward pass of a rematerialized run (a [`Remat`]'s layer, or a span of a serial):
/// `run(cx, x, rngs)` runs it while the combinators inside drop every child's residuals and
/// the outputs of the kinds in `saving` are recorded; the output, and as residuals the input
/// (handles) with the replay. A run that was to save outputs and saved none is a
/// [`LayerError::Config`] of `who`.
pub(crate) fn remat_forward<R>(
    (who, saving): (&dyn Layer, &[&'static str]),
    rngs: Vec<Option<Rng>>,
    x: Value,
    cx: &mut Cx<'_>,
    run: impl FnOnce(&mut Cx<'_>, Value, Vec<Option<Rng>>) -> Result<(Value, R), LayerError>,
) -> Result<(Value, Residuals), LayerError> {
    let kept = x.map(|t| Saved::Tensor(t.clone()));
    let outer = cx.replace_saving(Some(recording(saving, false, Replay::default())));
    let discard = cx.replace_discard(true);
    let out = run(cx, x, rngs.clone());
    cx.replace_discard(discard);
    let saved = cx.replace_saving(outer);
    let (y, inner) = out?;
    drop(inner);
    let Saving { outputs, stats, .. } = saved.unwrap_or_default();
    if !saving.is_empty() && outputs.is_empty() {
        return Err(who.config(format!(
            "saving {}: no layer of these kinds inside could be saved (Conv and Dense run by a \
             serial or parallel combinator inside, not fused with an activation after them, \
             not under a Mixed of their own)",
            saving.join(", ")
        )));
    }
    let replay = Saved::Replay(Box::new(Replay {
        rngs,
        outputs,
        stats,
    }));
    let fields = [
        (Key::Field("x"), kept),
        (Key::Field("replay"), Tree::leaf(replay)),
    ];
    Ok((y, Tree::node(fields)))
}

/// The backward pass of a rematerialized run from the residuals of [`remat_forward`]: `run`
/// again from the kept input with the same keys, handed the saved outputs (what it allocates
/// is named `{path}/remat/...` in plans and traces), then `back` on the residuals it made.
pub(crate) fn remat_backward<R, T>(
    (who, saving): (&dyn Layer, &[&'static str]),
    residuals: Residuals,
    cx: &mut Cx<'_>,
    run: impl FnOnce(&mut Cx<'_>, Value, Vec<Option<Rng>>) -> Result<(Value, R), LayerError>,
    back: impl FnOnce(&mut Cx<'_>, R) -> Result<T, LayerError>,
) -> Result<T, LayerError> {
    let (x, mut replay) = unpack(who, residuals)?;
    let rngs = std::mem::take(&mut replay.rngs);
    let outer = cx.replace_saving(Some(recording(saving, true, replay)));
    let again = {
        let _scope = cx.backend().allocator().scope("remat");
        run(cx, x, rngs)
    };
    drop(cx.replace_saving(outer));
    let (y, inner) = again?;
    drop(y);
    back(cx, inner)
}

/// `specs` with none updated in the backward pass: a rematerialized run's parameters, read by
/// the recomputation after their gradients are made.
pub(crate) fn collected(specs: &Tree<ParamSpec>) -> Tree<ParamSpec> {
    specs.map(|s| ParamSpec {
        update_in_backward: false,
        ..s.clone()
    })
}

/// How a run saves the outputs of the kinds in `saving` and its norms' statistics: recorded
/// (`replay` false, `saved` empty), or handed back from `saved` (`replay`).
fn recording(saving: &[&'static str], replay: bool, saved: Replay) -> Saving {
    Saving {
        kinds: saving.to_vec(),
        replay,
        outputs: saved.outputs,
        stats: saved.stats,
    }
}

/// `(x, replay)` from the residuals of [`remat_forward`].
fn unpack(who: &dyn Layer, residuals: Residuals) -> Result<(Value, Replay), LayerError> {
    let (mut x, mut replay) = (None, None);
    for (key, saved) in residuals.into_children() {
        match (key, saved) {
            (Key::Field("x"), t) => x = Some(t),
            (Key::Field("replay"), Tree::Leaf(Saved::Replay(r))) => replay = Some(*r),
            (key, _) => return Err(who.mismatch("residuals", format!("unexpected `{key}`"))),
        }
    }
    let missing = |what: &str| who.mismatch("residuals", format!("no saved `{what}`"));
    let x = x.ok_or_else(|| missing("x"))?;
    let x = x.try_map_into(|_, s| match s {
        Saved::Tensor(t) => Ok(t),
        _ => Err(who.mismatch("residuals", "a saved input is not a tensor".into())),
    })?;
    Ok((x, replay.ok_or_else(|| missing("replay"))?))
}

impl<L: Layer> Remat<L> {
    /// `layer`, rematerialized: only its input (and its BatchNorms' `[c]` statistics) is kept
    /// (`jax.checkpoint`'s default policy, `nothing_saveable`).
    pub fn new(layer: L) -> Remat<L> {
        Remat {
            layer,
            saving: Vec::new(),
            span: 1,
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

    /// This, covering the `len - 1` layers after it in its [`crate::Serial`] too: the serial
    /// runs the span as one rematerialized run ([`Layer::remat_span`]), so only the span's
    /// input is kept and its backward pass recomputes every layer of it at once, but what it
    /// saves and a last layer that makes its residuals alone ([`Layer::replay_residuals`]: a
    /// `BatchNorm`, from its saved statistics). Parameters keep their place in the serial's
    /// tree (a model with spans loads the plain model's checkpoints), where a `Remat` of a
    /// `serial` of those layers would nest them.
    /// `Remat::new(first_block).spanning(3).saving(&["conv"])` is `jax.checkpoint` of a ResNet
    /// stage that saves its convs' outputs. Outside a serial, or past its end, a span is a
    /// [`LayerError::Config`].
    pub fn spanning(self, len: usize) -> Remat<L> {
        Remat { span: len, ..self }
    }

    /// The layer's forward pass with the key `rngs` holds (given in this layer's place).
    fn run(
        &self,
        params: &Params,
        x: Value,
        cx: &mut Cx<'_>,
        mut rngs: Vec<Option<Rng>>,
    ) -> Result<(Value, Residuals), LayerError> {
        let outer = cx.replace_rng(rngs.pop().flatten());
        let out = self.layer.apply(params, x, cx);
        cx.replace_rng(outer);
        out
    }
}

impl<L: Layer> Layer for Remat<L> {
    fn kind(&self) -> &'static str {
        self.layer.kind()
    }

    fn describe(&self) -> String {
        let span = (self.span != 1).then(|| format!("spanning {}", self.span));
        let saving =
            (!self.saving.is_empty()).then(|| format!("saving {}", self.saving.join(", ")));
        let how: Vec<String> = span.into_iter().chain(saving).collect();
        match how.is_empty() {
            true => format!("remat({})", self.layer.describe()),
            false => format!("remat({}: {})", how.join(", "), self.layer.describe()),
        }
    }

    fn remat_span(&self) -> Option<RematSpan<'_>> {
        (self.span != 1).then_some(RematSpan {
            len: self.span,
            saving: &self.saving,
            first: &self.layer,
        })
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
        Ok(collected(&self.layer.param_specs(input)?))
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
        if self.span != 1 {
            return Err(self.config(format!(
                "spanning {} layers: a span runs as a layer of a serial, which has the layers \
                 after it",
                self.span
            )));
        }
        let rng = cx.take_rng();
        let who = (self as &dyn Layer, self.saving.as_slice());
        remat_forward(who, vec![rng], x, cx, |cx, x, rngs| {
            self.run(params, x, cx, rngs)
        })
    }

    fn vjp(
        &self,
        params: &Params,
        residuals: Residuals,
        dy: Value,
        cx: &mut Cx<'_>,
        need_dx: bool,
    ) -> Result<Option<Value>, LayerError> {
        let who = (self as &dyn Layer, self.saving.as_slice());
        let run = |cx: &mut Cx<'_>, x, rngs| self.run(params, x, cx, rngs);
        remat_backward(who, residuals, cx, run, |cx, inner| {
            self.layer.vjp(params, inner, dy, cx, need_dx)
        })
    }
}
