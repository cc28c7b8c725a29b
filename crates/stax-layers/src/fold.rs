//! A [`BatchNorm::folded`] after a pointwise conv in a [`crate::Serial`]: in training the pair
//! runs as the two layers do, but the norm keeps its statistics alone, not its input (the
//! conv's output); the backward pass computes the norm's and the conv's gradients from the
//! conv's input `h` and weight ([`ops::batch_norm_fold`]): `gt = hᵀ · dy`, `hᵀ · h`, the
//! per-channel sums, then `dh = dy · w_aᵀ + h · (w_c · wᵀ) + 1 ⊗ (w · bp)`. Both layers keep
//! their names, parameters and gradients' paths.

use stax_alloc::Tag;
use stax_tensor::ops::{self, FoldInputs, FoldOutputs};
use stax_tensor::{Category, DType, Key, Params, Shape, Tensor, Tree};

use crate::conv_dims::hand_gradients;
use crate::layer::{expect_params, one_tensor, saved_tensor, shapes_of};
use crate::{BatchNorm, Cx, GeneralConv, Layer, LayerError, Residuals, Rng, Saved, Value};

/// The conv and norm layers `conv` and `norm` run folded, if they are a pointwise conv and a
/// folded NHWC batch norm ([`BatchNorm::fold`]).
pub(crate) fn folds<'l>(
    conv: &'l dyn Layer,
    norm: &'l dyn Layer,
) -> Option<(&'l GeneralConv, &'l BatchNorm)> {
    let (c, n) = (conv.as_conv()?, norm.as_batch_norm()?);
    (n.fold && n.axis == [0, 1, 2] && c.is_pointwise()).then_some((c, n))
}

/// Whether an input `x` runs folded: one f32 tensor (lower precisions run unfolded).
pub(crate) fn takes(x: &Value) -> bool {
    x.as_leaf().is_some_and(|t| t.dtype() == DType::F32)
}

/// The norm's residuals as the folded pair keeps them: without its input.
fn without_input(r: Residuals) -> Residuals {
    match r {
        Tree::Node(kept) => Tree::Node(
            kept.into_iter()
                .filter(|(k, _)| k != &Key::Field("x"))
                .collect(),
        ),
        leaf => leaf,
    }
}

/// Whether `r` are the residuals of a folded pair's norm: its statistics, no input.
pub(crate) fn folded(r: &Residuals) -> bool {
    let Tree::Node(kept) = r else {
        return false;
    };
    let keys: Vec<&Key> = kept.iter().map(|(k, _)| k).collect();
    keys == [&Key::Field("mean"), &Key::Field("rstd")]
}

/// The forward pass of the pair (conv at `i`, norm at `i + 1`, keys `keys`), the norm adding
/// `add` before its ReLU when given ([`Layer::apply_adding`]): the output and the two layers'
/// residuals as the pair keeps them.
pub(crate) fn apply_pair(
    (conv, norm): (&GeneralConv, &BatchNorm),
    (keys, i): ([Key; 2], usize),
    params: [&Params; 2],
    (x, rngs): (Value, [Option<Rng>; 2]),
    cx: &mut Cx<'_>,
    add: Option<(&Tensor, &mut Tensor)>,
) -> Result<(Value, [(Key, Residuals); 2]), LayerError> {
    let [r0, r1] = rngs;
    // as the serial applies any layer: a span saving convs saves this one's output
    let (y, rc) = cx.apply_child((keys[0], i), r0, conv, params[0], x)?;
    let (y, rn) = cx.child(keys[1], i + 1, r1, |cx| match add {
        Some(add) => norm.apply_adding(params[1], y, cx, add),
        None => norm.apply(params[1], y, cx),
    })?;
    let kept = [
        (keys[0], cx.kept(rc)),
        (keys[1], cx.kept(without_input(rn))),
    ];
    Ok((y, kept))
}

/// In a rematerialized forward pass run again, the pair's residuals from its input `x` alone
/// when the norm's statistics were saved (nothing reads the pair's output): `None` when they
/// were not.
pub(crate) fn replay_pair(
    conv: &GeneralConv,
    (keys, i): ([Key; 2], usize),
    x: &Value,
    cx: &mut Cx<'_>,
) -> Result<Option<[(Key, Residuals); 2]>, LayerError> {
    let stats = cx.name_scope((keys[1], i + 1), |cx| Ok(cx.saved_stats()))?;
    let Some((mean, rstd)) = stats else {
        return Ok(None);
    };
    let rc = cx.name_scope((keys[0], i), |_| conv.residuals_from_input(x))?;
    let Some(rc) = rc else {
        return Ok(None);
    };
    let rn =
        crate::layer::residuals([("mean", Saved::Tensor(mean)), ("rstd", Saved::Tensor(rstd))]);
    Ok(Some([(keys[0], rc), (keys[1], rn)]))
}

/// The backward pass of the pair from its residuals and `dy` (the norm's output gradient):
/// both layers' parameter gradients handed in their own scopes, and `dh` when `need_dx`.
pub(crate) fn vjp_pair(
    (conv, norm): (&GeneralConv, &BatchNorm),
    (keys, i): ([Key; 2], usize),
    params: [&Params; 2],
    [mut rc, mut rn]: [Residuals; 2],
    dy: Value,
    cx: &mut Cx<'_>,
    need_dx: bool,
) -> Result<Option<Value>, LayerError> {
    let h = saved_tensor(conv, &mut rc, "x")?;
    let mean = saved_tensor(norm, &mut rn, "mean")?;
    let rstd = saved_tensor(norm, &mut rn, "rstd")?;
    let dy = one_tensor(norm, dy)?;
    let specs = conv.param_specs(&shapes_of(&Tree::leaf(h.clone())))?;
    let wb = expect_params(params[0], conv, &specs)?;
    let last = |t: &Tensor| t.dims().last().copied().unwrap_or(0);
    let (k, c) = (last(&h), last(&dy));
    let rows = h.numel() / k.max(1);
    let (w, b0) = (wb[0].reshape([k, c])?, wb[1].reshape([c])?);
    let h2 = h.reshape([rows, k])?;
    let out = h.shape().clone();
    drop(h);
    let (dh, dw, db0) = cx.child(keys[1], i + 1, None, |cx| {
        let (g, param) = norm.geometry(dy.shape())?;
        let [beta, gamma] = norm.params(params[1], &g, &param)?;
        let dy2 = dy.reshape([rows, c])?;
        drop(dy);
        let f = Fold {
            h: &h2,
            dy: &dy2,
            w: &w,
            b0: &b0,
        };
        let (dh, [dw, db0, dgamma, dbeta]) = f.run(gamma.as_ref(), (&mean, &rstd), need_dx)?;
        let slot = |on: bool, t: Tensor| -> Result<Tree<Tensor>, LayerError> {
            Ok(if on {
                Tree::leaf(t.reshape(param.clone())?)
            } else {
                Tree::empty()
            })
        };
        cx.gradients(Tree::node([
            (Key::Field("beta"), slot(beta.is_some(), dbeta)?),
            (Key::Field("gamma"), slot(gamma.is_some(), dgamma)?),
        ]))?;
        Ok((dh, dw, db0))
    })?;
    drop(h2);
    cx.child(keys[0], i, None, |cx| hand_gradients(cx, &specs, dw, db0))?;
    dh.map(|dh| Ok(Tree::leaf(dh.reshape(out)?))).transpose()
}

/// The pair's backward pass as matrices: `h` `[rows, k]`, `dy` `[rows, c]`, the conv's `w`
/// `[k, c]` and `b0` `[c]`.
struct Fold<'a> {
    h: &'a Tensor,
    dy: &'a Tensor,
    w: &'a Tensor,
    b0: &'a Tensor,
}

impl Fold<'_> {
    /// `dh` (when `need_dx`) and `[dw, db0, dgamma, dbeta]`.
    fn run(
        &self,
        gamma: Option<&Tensor>,
        (mean, rstd): (&Tensor, &Tensor),
        need_dx: bool,
    ) -> Result<(Option<Tensor>, [Tensor; 4]), LayerError> {
        let (k, c) = (self.w.dims()[0], self.w.dims()[1]);
        let be = self.h.backend().clone();
        let new = |shape: Shape, role| {
            Tensor::empty(&be, shape, DType::F32, Tag::new(Category::Gradient, role))
        };
        let (mut sh, mut sd) = (new([k].into(), "sum_h")?, new([c].into(), "sum_dy")?);
        ops::bias_grad(self.h, &mut sh)?;
        ops::bias_grad(self.dy, &mut sd)?;
        let mut gt = new([k, c].into(), "gt")?;
        ops::matmul(self.h, self.dy, true, false, &mut gt)?;
        let mut hh = new([k, k].into(), "hth")?;
        ops::matmul(self.h, self.h, true, false, &mut hh)?;
        let mut dw = new([k, c].into(), "dw")?;
        ops::matmul(&hh, self.w, false, false, &mut dw)?;
        let [mut w_a, mut w_c] = [new([k, c].into(), "w_a")?, new([k, c].into(), "w_c")?];
        let [mut bp, mut db0] = [new([c].into(), "bp")?, new([c].into(), "db")?];
        let [mut dgamma, mut dbeta] = [new([c].into(), "dgamma")?, new([c].into(), "dbeta")?];
        let inputs = FoldInputs {
            w: self.w,
            b0: self.b0,
            gamma,
            mean,
            rstd,
            gt: &gt,
            sh: &sh,
            sd: &sd,
            count: self.h.dims()[0],
        };
        let outputs = FoldOutputs {
            dw: &mut dw,
            db0: &mut db0,
            w_a: &mut w_a,
            w_c: &mut w_c,
            bp: &mut bp,
            dgamma: Some(&mut dgamma),
            dbeta: Some(&mut dbeta),
        };
        ops::batch_norm_fold(inputs, outputs)?;
        drop((gt, sh, sd));
        let dh = match need_dx {
            true => Some(self.dh((&w_a, &w_c, &bp), &mut hh)?),
            false => None,
        };
        Ok((dh, [dw, db0, dgamma, dbeta]))
    }

    /// `dh = dy · w_aᵀ + h · (w_c · wᵀ) + 1 ⊗ (w · bp)`, `m` `[k, k]` reused for `w_c · wᵀ`.
    fn dh(
        &self,
        (w_a, w_c, bp): (&Tensor, &Tensor, &Tensor),
        m: &mut Tensor,
    ) -> Result<Tensor, LayerError> {
        let (rows, k) = (self.h.dims()[0], self.h.dims()[1]);
        let be = self.h.backend().clone();
        ops::matmul(w_c, self.w, false, true, m)?;
        let mut r = Tensor::empty(&be, [k, 1], DType::F32, Tag::new(Category::Gradient, "r"))?;
        ops::matmul(
            self.w,
            &bp.reshape([self.w.dims()[1], 1])?,
            false,
            false,
            &mut r,
        )?;
        let mut dh = Tensor::empty(
            &be,
            [rows, k],
            DType::F32,
            Tag::new(Category::Gradient, "dx"),
        )?;
        ops::matmul(self.dy, w_a, false, true, &mut dh)?;
        ops::matmul_add(self.h, m, false, false, &mut dh)?;
        ops::bias_add(&mut dh, &r.reshape([k])?)?;
        Ok(dh)
    }
}
