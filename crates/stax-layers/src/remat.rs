//! Rematerialization: [`Remat`] runs a layer whose forward pass keeps only its input and whose
//! backward pass recomputes the rest (`jax.checkpoint`, alias `jax.remat`; PyTorch's
//! `torch.utils.checkpoint`).

use stax_tensor::{Key, Params, Tree};

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
/// for a second forward pass of the layer. The results are the same bits: every op is
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
}

impl<L: Layer> Remat<L> {
    /// `layer`, rematerialized.
    pub fn new(layer: L) -> Remat<L> {
        Remat { layer }
    }

    /// `(x, rng)` from the residuals of [`Layer::apply`].
    fn unpack(&self, residuals: Residuals) -> Result<(Value, Option<crate::Rng>), LayerError> {
        let (mut x, mut rng) = (None, None);
        for (key, saved) in residuals.into_children() {
            match (key, saved) {
                (Key::Field("x"), t) => x = Some(t),
                (Key::Field("rng"), Tree::Leaf(Saved::Rng(r))) => rng = Some(*r),
                (key, _) => return Err(self.mismatch("residuals", format!("unexpected `{key}`"))),
            }
        }
        let x = x.ok_or_else(|| self.mismatch("residuals", "no saved input `x`".into()))?;
        let x = x.try_map_into(|_, s| match s {
            Saved::Tensor(t) => Ok(t),
            _ => Err(self.mismatch("residuals", "a saved input is not a tensor".into())),
        })?;
        Ok((x, rng))
    }
}

impl<L: Layer> Layer for Remat<L> {
    fn kind(&self) -> &'static str {
        self.layer.kind()
    }

    fn describe(&self) -> String {
        format!("remat({})", self.layer.describe())
    }

    fn policy(&self) -> Option<Policy> {
        self.layer.policy()
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
        let (y, inner) = self.layer.apply(params, x, cx)?;
        drop(inner);
        let mut fields = vec![(Key::Field("x"), kept)];
        fields.extend(rng.map(|r| (Key::Field("rng"), Tree::leaf(Saved::Rng(Box::new(r))))));
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
        let (x, rng) = self.unpack(residuals)?;
        let outer = cx.replace_rng(rng);
        let again = {
            // what the recomputation allocates is named `{path}/remat/...` in plans and traces
            let _scope = cx.backend().allocator().scope("remat");
            self.layer.apply(params, x, cx)
        };
        cx.replace_rng(outer);
        let (y, inner) = again?;
        drop(y);
        self.layer.vjp(params, inner, dy, cx, need_dx)
    }
}
