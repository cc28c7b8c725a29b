//! Epilogue fusion, as the combinators apply it: when layer `i + 1` is an activation
//! ([`Layer::as_activation`]) without parameters and layer `i` runs it as an epilogue of its
//! own op ([`Layer::fuses`]), a training step runs the two as one ([`Layer::apply_fused`],
//! [`Layer::vjp_fused`]). An activation that keeps its input ([`Saves::Input`]: GELU) never
//! fuses: an epilogue overwrites that input. Everything keeps the name it has unfused: the activation's saved
//! buffer is made in the activation's scope, and the fused output and gradient take the
//! activation's roles there.

use stax_tensor::{Key, Params, Tree};

use crate::layer::shapes_of;
use crate::{Activation, Cx, DySums, Layer, LayerError, Residuals, Saves, Value};

/// The activation the layer `next` (of parameters `next_params`) hands to `layer`, if the
/// pair fuses.
pub(crate) fn fuses_with(
    layer: &dyn Layer,
    next: &dyn Layer,
    next_params: &Params,
) -> Option<Activation> {
    let act = next.as_activation()?;
    let empty = matches!(next_params, Tree::Node(c) if c.is_empty());
    let in_place = act.saves() != Saves::Input;
    (empty && in_place && layer.fuses(act)).then_some(act)
}

/// The forward pass of layers `i` and `i + 1` fused (see the module docs): the output and the
/// two layers' residuals (the activation's are empty: the fused layer keeps them).
pub(crate) fn apply_pair(
    (layer, key, i): (&dyn Layer, Key, usize),
    (act, act_key): (Activation, Key),
    params: &Params,
    x: Value,
    cx: &mut Cx<'_>,
    rng: Option<crate::Rng>,
) -> Result<(Value, Residuals), LayerError> {
    let out = layer.output_shape(&shapes_of(&x)).map_err(|e| e.at(key))?;
    let shape = out.as_leaf().ok_or_else(|| {
        layer
            .shape_error("fusion needs one output tensor".into(), &out)
            .at(key)
    })?;
    let aux = cx.name_scope((act_key, i + 1), |cx| {
        crate::activation::aux_for(act, shape, cx.backend())
    })?;
    let (y, r) = cx.child(key, i, rng, |cx| layer.apply_fused(params, x, cx, act, aux))?;
    cx.name_scope((act_key, i + 1), |_| {
        y.leaves().iter().for_each(|t| t.note_role("output"));
        Ok(())
    })?;
    Ok((y, r))
}

/// The backward pass of a fused pair: `dy` is the gradient with respect to the activation's
/// output; it becomes the activation's input gradient in place. With `sum` (and `need_dx`),
/// the layer's input gradient's sums too, where it computes them ([`Layer::vjp_summing_dx`]).
pub(crate) fn vjp_pair(
    (layer, key, i): (&dyn Layer, Key, usize),
    (act, act_key): (Activation, Key),
    params: &Params,
    residuals: Residuals,
    dy: Value,
    cx: &mut Cx<'_>,
    (need_dx, sum): (bool, bool),
) -> Result<(Option<Value>, Option<DySums>), LayerError> {
    cx.name_scope((act_key, i + 1), |_| {
        dy.leaves().iter().for_each(|t| t.note_role("dx"));
        Ok(())
    })?;
    cx.child(key, i, None, |cx| match need_dx && sum {
        true => layer.vjp_summing_dx(params, residuals, dy, cx, Some(act)),
        false => Ok((
            layer.vjp_fused(params, residuals, dy, cx, act, need_dx)?,
            None,
        )),
    })
}
