//! `Serial`: layers applied one after another (stax's `serial`).

use std::ops::Range;

use stax_tensor::{Key, Params, Tensor, Tree};

use crate::fold;
use crate::fuse::{apply_pair, fuses_with, vjp_pair};
use crate::layer::{children_of, shapes_of};
use crate::remat::{RematSpan, collected, remat_backward, remat_forward};
use crate::{
    Activation, Cx, DySums, Layer, LayerError, ParamSpec, Residuals, Rng, Shapes, Value, activation,
};

/// stax's `serial(*layers)`: composes layers; itself a [`Layer`], whose parameters are a node
/// with one child per layer, keyed `{index}.{kind}` (`2.conv`; parameter-free layers keep
/// their place with an empty node, as stax's `()`). An RNG key given to `apply` is split into
/// one key per layer, as stax's `serial` splits it. A [`crate::Remat`] spanning several of its
/// layers ([`crate::Remat::spanning`]) runs them as one rematerialized run in training.
#[derive(Debug)]
pub struct Serial(pub Vec<Box<dyn Layer>>);

/// `serial![a, b, c]` builds a [`Serial`] from layer values, like `stax.serial(a, b, c)`.
#[macro_export]
macro_rules! serial {
    ($($layer:expr),* $(,)?) => {
        $crate::Serial(vec![$(Box::new($layer) as Box<dyn $crate::Layer>),*])
    };
}

impl Serial {
    fn key(&self, i: usize) -> Key {
        Key::Layer(i, self.0[i].kind())
    }

    /// The input shapes of every layer plus the final output shapes (`len + 1` entries).
    ///
    /// # Errors
    /// The first layer whose input does not fit, with its path; a remat span that does not fit
    /// (past the end, of no layers, over another span: [`LayerError::Config`]).
    pub fn shapes(&self, input: &Shapes) -> Result<Vec<Shapes>, LayerError> {
        self.spans()?;
        let mut shapes = vec![input.clone()];
        for (i, layer) in self.0.iter().enumerate() {
            let next = layer
                .output_shape(&shapes[i])
                .map_err(|e| e.at(self.key(i)))?;
            shapes.push(next);
        }
        Ok(shapes)
    }

    /// The rematerialized spans ([`crate::Remat::spanning`]) with the index of their first
    /// layer.
    ///
    /// # Errors
    /// [`LayerError::Config`] at the spanning layer for a span of no layers, one past the
    /// serial's end, or one over another spanning layer.
    fn spans(&self) -> Result<Vec<(usize, RematSpan<'_>)>, LayerError> {
        let (n, mut spans, mut i) = (self.0.len(), Vec::new(), 0);
        while i < n {
            let Some(span) = self.0[i].remat_span() else {
                i += 1;
                continue;
            };
            let len = span.len;
            let fits = (1..=n - i).contains(&len);
            let end = if fits { i + len } else { n };
            let inner = (i + 1..end).find(|&j| self.0[j].remat_span().is_some());
            if !fits || inner.is_some() {
                let over = inner.map_or(String::new(), |j| format!(" (layer {j} spans too)"));
                let reason = format!(
                    "spanning {len} layers from layer {i} of {n}: a span covers 1 to {} layers, \
                     none of them spanning{over}",
                    n - i
                );
                return Err(self.0[i].config(reason).at(self.key(i)));
            }
            spans.push((i, span));
            i = end;
        }
        Ok(spans)
    }

    /// Each layer's parameters, checked to be keyed as [`Serial`] keys them.
    fn children<'p>(&self, params: &'p Params) -> Result<Vec<&'p Params>, LayerError> {
        let keys: Vec<Key> = (0..self.0.len()).map(|i| self.key(i)).collect();
        children_of(self, params, &keys, "parameters")
    }
}

impl Layer for Serial {
    fn kind(&self) -> &'static str {
        "serial"
    }

    fn describe(&self) -> String {
        let names: Vec<String> = self.0.iter().map(|l| l.describe()).collect();
        format!("serial[{}]", names.join(", "))
    }

    fn policies(&self, input: &Shapes) -> Vec<crate::Policy> {
        let shapes = self.shapes(input).unwrap_or_default();
        let layers = self.0.iter().zip(&shapes);
        layers.flat_map(|(l, s)| l.policies(s)).collect()
    }

    fn output_shape(&self, input: &Shapes) -> Result<Shapes, LayerError> {
        Ok(self.shapes(input)?.pop().unwrap_or_else(|| input.clone()))
    }

    /// Each layer's, those a span covers after its first collected as the span's own are
    /// ([`crate::Remat`]: the recomputation reads them).
    fn param_specs(&self, input: &Shapes) -> Result<Tree<ParamSpec>, LayerError> {
        let shapes = self.shapes(input)?;
        let spans = self.spans()?;
        let covered = |i: usize| spans.iter().any(|(s, span)| *s < i && i < s + span.len);
        let specs = self
            .0
            .iter()
            .zip(&shapes)
            .enumerate()
            .map(|(i, (layer, s))| {
                let key = self.key(i);
                let specs = layer.param_specs(s).map_err(|e| e.at(key))?;
                Ok((key, if covered(i) { collected(&specs) } else { specs }))
            });
        Ok(Tree::Node(specs.collect::<Result<_, LayerError>>()?))
    }

    fn apply(
        &self,
        params: &Params,
        x: Value,
        cx: &mut Cx<'_>,
    ) -> Result<(Value, Residuals), LayerError> {
        let children = self.children(params)?;
        let n = self.0.len();
        let rngs = cx.split_rng(n);
        let (y, saved) = self.run(&children, 0..n, x, cx, rngs, (true, None))?;
        Ok((y, Tree::Node(saved)))
    }

    /// Backward through the layers in reverse; only the first layer's `need_dx` is the
    /// caller's, so no gradient is computed for the model's input unless asked for.
    fn vjp(
        &self,
        params: &Params,
        residuals: Residuals,
        dy: Value,
        cx: &mut Cx<'_>,
        need_dx: bool,
    ) -> Result<Option<Value>, LayerError> {
        self.back_all(params, residuals, dy, cx, (need_dx, None))
    }

    /// Its last layer's (a span that covers it hands it the addend).
    fn adds(&self) -> bool {
        self.0.last().is_some_and(|l| l.adds()) && self.spans().is_ok()
    }

    /// The layers as `apply` runs them, the last one adding.
    fn apply_adding(
        &self,
        params: &Params,
        x: Value,
        cx: &mut Cx<'_>,
        add: (&Tensor, &mut Tensor),
    ) -> Result<(Value, Residuals), LayerError> {
        let children = self.children(params)?;
        let n = self.0.len();
        if !self.adds() {
            return Err(self.config("its last layer adds nothing to its output".into()));
        }
        let rngs = cx.split_rng(n);
        let (y, saved) = self.run(&children, 0..n, x, cx, rngs, (true, Some(add)))?;
        Ok((y, Tree::Node(saved)))
    }

    /// The mask of its last layer, or of the layer before an activation that layer fused.
    fn take_dy_mask(&self, residuals: &mut Residuals) -> Option<Tensor> {
        let n = self.0.len();
        let Tree::Node(saved) = residuals else {
            return None;
        };
        if saved.len() != n || n == 0 {
            return None;
        }
        let empty = |r: &Residuals| matches!(r, Tree::Node(c) if c.is_empty());
        let fused = n >= 2 && self.0[n - 1].as_activation().is_some() && empty(&saved[n - 1].1);
        let i = if fused { n - 2 } else { n - 1 };
        self.0[i].take_dy_mask(&mut saved[i].1)
    }

    /// Its first layer's (never a span's: a span runs its own backward pass).
    fn masks_dx(&self) -> bool {
        self.0
            .first()
            .is_some_and(|l| l.masks_dx() && l.remat_span().is_none())
    }

    fn vjp_masking_dx(
        &self,
        params: &Params,
        residuals: Residuals,
        dy: Value,
        cx: &mut Cx<'_>,
        mask: &Tensor,
    ) -> Result<Option<Value>, LayerError> {
        self.back_all(params, residuals, dy, cx, (true, Some(mask)))
    }
}

/// How [`Serial::back`] runs a range of layers.
struct Back<'m> {
    /// The serial's caller's `need_dx` (for layer 0).
    need_dx: bool,
    /// As in [`Serial::run`]: the serial's own run, in which a span's residuals run its
    /// forward pass again, then its backward pass; else the run of a span.
    top: bool,
    /// The caller's ReLU mask for the input gradient ([`Layer::vjp_masking_dx`]), applied by
    /// the first layer.
    mask: Option<&'m Tensor>,
    /// The sums of the last layer's output gradient, computed by the layer after the range.
    sums: Option<DySums>,
    /// Whether the first layer computes the sums of its input gradient for the layer before
    /// the range.
    sum_first: bool,
}

impl Serial {
    /// The backward pass of every layer from the serial's residuals ([`Serial::back`] of the
    /// whole range, at the top).
    fn back_all(
        &self,
        params: &Params,
        residuals: Residuals,
        dy: Value,
        cx: &mut Cx<'_>,
        (need_dx, mask): (bool, Option<&Tensor>),
    ) -> Result<Option<Value>, LayerError> {
        let children = self.children(params)?;
        let keys: Vec<Key> = (0..self.0.len()).map(|i| self.key(i)).collect();
        children_of(self, &residuals, &keys, "residuals")?;
        let saved: Vec<Residuals> = residuals.into_children().into_iter().map(|c| c.1).collect();
        let range = 0..self.0.len();
        let how = Back {
            need_dx,
            top: true,
            mask,
            sums: None,
            sum_first: false,
        };
        Ok(self.back(&children, range, saved, dy, cx, how)?.0)
    }

    /// The layer at `i` as a run of `range` applies it: inside a span (`top` false) its first
    /// layer unwrapped from the spanning [`crate::Remat`].
    fn layer_in(&self, i: usize, range: &Range<usize>, top: bool) -> &dyn Layer {
        let span = self.0[i].remat_span().filter(|_| !top && i == range.start);
        span.map_or(&*self.0[i], |s| s.first)
    }

    /// The activation layer `i + 1` of `range` hands to layer `i` as a run of `range` holds it
    /// ([`Serial::layer_in`]: a span's first layer unwrapped), if the pair fuses; a span's first
    /// layer of a kind the span saves stays unfused, so that its output is saved.
    fn fused_in(
        &self,
        children: &[&Params],
        i: usize,
        range: &Range<usize>,
        top: bool,
    ) -> Option<Activation> {
        let next = self.0.get(i + 1).filter(|_| i + 1 < range.end)?;
        let layer = self.layer_in(i, range, top);
        let span = self.0[i].remat_span().filter(|_| !top && i == range.start);
        if span.is_some_and(|s| s.saving.contains(&layer.kind())) {
            return None;
        }
        fuses_with(layer, &**next, children.get(i + 1)?)
    }

    /// The forward pass of layers `range`, each with its key of `rngs` (one a layer of the
    /// range): the output, and each layer's residuals as the serial keeps them. `top`: the
    /// serial's own run, in which a span runs as one rematerialized run (in training); else the
    /// run of a span. `add`: the addend and ReLU mask of the range's last layer, which then
    /// runs adding ([`Layer::apply_adding`]). A span's forward pass run again stops at its
    /// last layer where that layer makes its residuals alone ([`Layer::replay_residuals`]; the
    /// output is then an empty node: nothing reads it).
    fn run(
        &self,
        children: &[&Params],
        range: Range<usize>,
        x: Value,
        cx: &mut Cx<'_>,
        rngs: Vec<Option<Rng>>,
        (top, mut add): (bool, Option<(&Tensor, &mut Tensor)>),
    ) -> Result<(Value, Vec<(Key, Residuals)>), LayerError> {
        let mut rngs = rngs.into_iter();
        let (mut x, mut saved, mut i) = (x, Vec::with_capacity(range.len()), range.start);
        while i < range.end {
            let key = self.key(i);
            let span = self.0[i].remat_span().filter(|_| top && cx.is_training());
            if let Some(span) = span {
                let (len, who) = (span.len, (&*self.0[i], span.saving));
                let keys: Vec<Option<Rng>> = rngs.by_ref().take(len).collect();
                let add = add.take_if(|_| i + len == range.end);
                let (y, r) = remat_forward(who, keys, x, cx, |cx, x, keys| {
                    self.run(children, i..i + len, x, cx, keys, (false, add))
                })?;
                saved.push((key, cx.kept(r)));
                saved.extend((i + 1..i + len).map(|j| (self.key(j), Tree::empty())));
                x = y;
                i += len;
                continue;
            }
            let layer = self.layer_in(i, &range, top);
            let rng = rngs.next().flatten();
            let folding = cx.is_training() && fold::takes(&x);
            if let Some(pair) = self.folded_at(children, i, &range, top).filter(|_| folding) {
                let at = ([key, self.key(i + 1)], i);
                let last = i + 2 == range.end;
                if last && !top && cx.replaying() {
                    if let Some(r) = fold::replay_pair(pair.0, at, &x, cx)? {
                        saved.extend(r);
                        return Ok((Tree::empty(), saved));
                    }
                }
                let (add, ps) = (add.take_if(|_| last), [children[i], children[i + 1]]);
                let xr = (x, [rng, rngs.next().flatten()]);
                let (y, r) = fold::apply_pair(pair, at, ps, xr, cx, add)?;
                saved.extend(r);
                (x, i) = (y, i + 2);
                continue;
            }
            if i + 1 == range.end && !top && cx.replaying() {
                // its path alone (no profiler span): the layer runs below when it cannot answer
                let r = cx.name_scope((key, i), |cx| layer.replay_residuals(&x, cx))?;
                if let Some(r) = r {
                    saved.push((key, r));
                    return Ok((Tree::empty(), saved));
                }
            }
            if let Some(add) = add.take_if(|_| i + 1 == range.end) {
                let p = children[i];
                let (y, r) = cx.child(key, i, rng, |cx| layer.apply_adding(p, x, cx, add))?;
                saved.push((key, cx.kept(r)));
                return Ok((y, saved));
            }
            if self.summed_at(children, i, &range, cx) {
                let (y, r) = self.run_summed(children, i, layer, x, cx, rng)?;
                rngs.nth(1);
                saved.extend(r);
                x = y;
                i += 3;
                continue;
            }
            let fused = self.fused_in(children, i, &range, top);
            match fused.filter(|_| cx.is_training()) {
                Some(act) => {
                    let act_key = self.key(i + 1);
                    let (y, r) =
                        apply_pair((layer, key, i), (act, act_key), children[i], x, cx, rng)?;
                    rngs.next();
                    saved.push((key, cx.kept(r)));
                    saved.push((act_key, Tree::empty()));
                    x = y;
                    i += 2;
                }
                None => {
                    let (y, r) = cx.apply_child((key, i), rng, layer, children[i], x)?;
                    saved.push((key, cx.kept(r)));
                    x = y;
                    i += 1;
                }
            }
        }
        Ok((x, saved))
    }

    /// The pointwise conv at `i` and the folded norm after it, as a run of `range` holds them,
    /// when they run folded in training ([`crate::fold`]): the norm in the range, fused with
    /// nothing after it.
    fn folded_at(
        &self,
        children: &[&Params],
        i: usize,
        range: &Range<usize>,
        top: bool,
    ) -> Option<(&crate::GeneralConv, &crate::BatchNorm)> {
        let next = self.0.get(i + 1).filter(|_| i + 1 < range.end)?;
        let unfused = self.fused_in(children, i + 1, range, top).is_none();
        fold::folds(self.layer_in(i, range, top), &**next).filter(|_| unfused)
    }

    /// Whether layers `i`, `i + 1` and `i + 2` of `range` run as one in training: a layer that
    /// runs summed ([`Layer::runs_summed`]), a sum of its branches and the ReLU fused with it.
    fn summed_at(&self, children: &[&Params], i: usize, range: &Range<usize>, cx: &Cx<'_>) -> bool {
        cx.is_training()
            && i + 2 < range.end
            && self.0[i].remat_span().is_none()
            && self.0[i].runs_summed()
            && self.0[i + 1].sums_branches()
            // layer i + 1 is no range's first, so no span unwraps it whatever `top` says
            && self.fused_in(children, i + 1, range, true) == Some(Activation::Relu)
    }

    /// Layers `i` (`layer`), `i + 1` and `i + 2` run as one ([`Serial::summed_at`]): the ReLU's
    /// mask made in its scope, the sum and its residuals as `FanInSum`'s fused with it keeps
    /// them ([`Layer::summed_residuals`]); the output, and the three layers' residuals.
    fn run_summed(
        &self,
        children: &[&Params],
        i: usize,
        layer: &dyn Layer,
        x: Value,
        cx: &mut Cx<'_>,
        rng: Option<Rng>,
    ) -> Result<(Value, [(Key, Residuals); 3]), LayerError> {
        let (key, sum_key, act_key) = (self.key(i), self.key(i + 1), self.key(i + 2));
        let out = layer.output_shape(&shapes_of(&x)).map_err(|e| e.at(key))?;
        let out = self.0[i + 1]
            .output_shape(&out)
            .map_err(|e| e.at(sum_key))?;
        let branches = shapes_of(&x).children().len();
        let relu = Activation::Relu;
        let mask = cx.name_scope((act_key, i + 2), |cx| match out.as_leaf() {
            Some(shape) => activation::aux_for(relu, shape, cx.backend()),
            None => Ok(None),
        })?;
        let Some(mut mask) = mask else {
            let reason = "the sum gives no single tensor".into();
            return Err(self.0[i + 1].shape_error(reason, &out).at(sum_key));
        };
        let (y, r) = cx.child(key, i, rng, |cx| {
            layer.apply_summed(children[i], x, cx, &mut mask)
        })?;
        cx.name_scope((act_key, i + 2), |_| {
            y.leaves().iter().for_each(|t| t.note_role("output"));
            Ok(())
        })?;
        let summed = self.0[i + 1].summed_residuals(branches, mask);
        let kept = [
            (key, cx.kept(r)),
            (sum_key, cx.kept(summed)),
            (act_key, Tree::empty()),
        ];
        Ok((y, kept))
    }

    /// The backward pass of layers `range` in reverse from their residuals (`saved`, one a
    /// layer of the range), run as `how` says: the input gradient, and the sums of it the
    /// range's first layer computed when `how.sum_first`. Between two layers of their own
    /// (neither fused nor in a span): a layer that masks its input gradient
    /// ([`Layer::masks_dx`]) applies the mask the layer before it would apply first
    /// ([`Layer::take_dy_mask`]). A layer before one that takes its gradient's sums
    /// ([`Layer::takes_dy_sums`]) computes them ([`Layer::vjp_summing_dx`]), across a span's
    /// ends too (a span's first layer for the layer before the span, its last one's from the
    /// layer after).
    fn back(
        &self,
        children: &[&Params],
        range: Range<usize>,
        mut saved: Vec<Residuals>,
        dy: Value,
        cx: &mut Cx<'_>,
        how: Back<'_>,
    ) -> Result<(Option<Value>, Option<DySums>), LayerError> {
        let Back {
            need_dx,
            top,
            mask,
            sums,
            sum_first,
        } = how;
        let unmasked = |layer: &dyn Layer| {
            let reason = "the first layer must mask the input gradient but fuses or spans".into();
            Err(layer.config(reason))
        };
        let spans = if top { self.spans()? } else { Vec::new() };
        let start = range.start;
        // whether the layer before layer `j` takes the sums of layer `j`'s input gradient
        let sums_for = |j: usize| match j == start {
            true => sum_first,
            false => self.layer_in(j - 1, &range, top).takes_dy_sums(),
        };
        let (mut dy, mut end, mut sums) = (Some(dy), range.end, sums);
        while end > start {
            let i = end - 1;
            let d = dy.take().ok_or_else(|| {
                self.mismatch("output gradients", format!("layer {i} got no gradient"))
            })?;
            let pending: Option<DySums> = sums.take();
            if let Some(&(s, span)) = spans.iter().find(|(s, span)| s + span.len == end) {
                if s == start && mask.is_some() {
                    return unmasked(&*self.0[s]);
                }
                let r = std::mem::take(&mut saved[s - start]);
                let run = |cx: &mut Cx<'_>, x, keys| {
                    self.run(children, s..end, x, cx, keys, (false, None))
                };
                let how = Back {
                    need_dx,
                    top: false,
                    mask: None,
                    sums: pending,
                    sum_first: (s > 0 || need_dx) && sums_for(s),
                };
                (dy, sums) =
                    remat_backward((&*self.0[s], span.saving), r, cx, run, |cx, inner| {
                        let inner = inner.into_iter().map(|c| c.1).collect();
                        self.back(children, s..end, inner, d, cx, how)
                    })?;
                end = s;
                continue;
            }
            let r = std::mem::take(&mut saved[i - start]);
            // A fused pair left the activation's residuals empty (see `fuse`); a span's last
            // layer fuses with nothing after it.
            let after_span = spans.iter().any(|(s, span)| s + span.len == i);
            let pair = (i > start && !after_span && fold::folded(&r))
                .then(|| self.folded_at(children, i - 1, &range, top));
            if let Some(pair) = pair.flatten() {
                let j = i - 1;
                if j == start && mask.is_some() {
                    return unmasked(&*self.0[j]);
                }
                let rc = std::mem::take(&mut saved[j - start]);
                let at = ([self.key(j), self.key(i)], j);
                let ps = [children[j], children[i]];
                dy = fold::vjp_pair(pair, at, ps, [rc, r], d, cx, j > 0 || need_dx)?;
                end -= 2;
                continue;
            }
            let fused =
                i > start && !after_span && r.children().is_empty() && matches!(r, Tree::Node(_));
            let act = if fused {
                self.fused_in(children, i - 1, &range, top)
            } else {
                None
            };
            match act {
                Some(act) => {
                    let (j, layer) = (i - 1, self.layer_in(i - 1, &range, top));
                    if j == start && mask.is_some() {
                        return unmasked(layer);
                    }
                    let r = std::mem::take(&mut saved[j - start]);
                    let want_dx = j > 0 || need_dx;
                    let sum = want_dx && sums_for(j);
                    let pair = ((layer, self.key(j), j), (act, self.key(i)));
                    let p = children[j];
                    (dy, sums) = vjp_pair(pair.0, pair.1, p, r, d, cx, (want_dx, sum))?;
                    end -= 2;
                }
                None => {
                    let layer = self.layer_in(i, &range, top);
                    let want_dx = i > 0 || need_dx;
                    let m = match i == start {
                        true => mask.cloned(),
                        false if want_dx && layer.masks_dx() => {
                            let prev = self.layer_in(i - 1, &range, top);
                            prev.take_dy_mask(&mut saved[i - 1 - start])
                        }
                        false => None,
                    };
                    let sum = want_dx && sums_for(i);
                    let p = children[i];
                    (dy, sums) = cx.child(self.key(i), i, None, |cx| match (m, pending) {
                        (Some(m), _) => Ok((layer.vjp_masking_dx(p, r, d, cx, &m)?, None)),
                        (None, Some(s)) => {
                            Ok((layer.vjp_with_dy_sums(p, r, d, cx, (want_dx, s))?, None))
                        }
                        (None, None) if sum => layer.vjp_summing_dx(p, r, d, cx, None),
                        (None, None) => Ok((layer.vjp(p, r, d, cx, want_dx)?, None)),
                    })?;
                    end -= 1;
                }
            }
        }
        Ok((dy, sums))
    }
}
