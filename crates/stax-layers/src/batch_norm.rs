//! `BatchNorm`: stax's batch normalization, batch statistics always (no running statistics).

use stax_alloc::Tag;
use stax_tensor::ops::{self, Affine, AffineGrads, NormSaved};
use stax_tensor::{Category, ChannelGeometry, DType, Key, Params, Shape, Tensor, Tree};

use crate::layer::{one_shape, one_tensor, residuals, saved_tensor};
use crate::{
    Activation, Cx, DySums, Init, Layer, LayerError, ParamSpec, Residuals, Saved, Shapes, Value,
    activation,
};

/// stax's `BatchNorm(axis=(0, 1, 2), epsilon=1e-5, center=True, scale=True)`:
/// `y = gamma · (x - mean) / sqrt(var + epsilon) + beta`, mean and variance over `axis`
/// (`jax.nn.standardize`: `var = max(E[x²] - E[x]², 0)`), computed from the batch in training
/// and in evaluation alike (stax keeps no running statistics; an example is normalized with
/// its batch).
///
/// Parameters `(beta, gamma)`, in that order, each of the input's shape with `axis` removed
/// (`[c]` for NHWC with the default axis), `beta` zeros and `gamma` ones; `center = false`
/// leaves `beta` out and `scale = false` `gamma` (their places stay, as stax's `()`). The axes
/// kept must be consecutive (`[.., c, ..]`: NHWC `(0, 1, 2)`, NCHW `(0, 2, 3)`, `[n, d]`
/// `(0,)`). Keeps its input and the per-channel mean and `1 / sqrt(var + eps)` for the
/// backward pass, which writes the input gradient over the output gradient. A ReLU that follows
/// runs in its kernels ([`Layer::fuses`]: one pass over the activation fewer each way).
/// Under a bf16 or f16 policy ([`crate::Mixed`]) the input, output and their gradients are in
/// the compute dtype while the parameters, statistics and parameter gradients stay f32 (as
/// PyTorch's batch norm under autocast): no parameter is cast.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchNorm {
    /// The axes normalized over.
    pub axis: Vec<usize>,
    /// Added to the variance.
    pub epsilon: f32,
    /// Whether to add `beta`.
    pub center: bool,
    /// Whether to multiply by `gamma`.
    pub scale: bool,
    /// Whether, right after a pointwise conv in a [`crate::Serial`]
    /// ([`crate::GeneralConv::is_pointwise`]) and over the NHWC channels, training keeps no
    /// input of its own: the backward pass computes from the conv's input and weights instead
    /// ([`stax_tensor::ops::batch_norm_fold`]), so the conv's output leaves the step's peak
    /// at no recomputation (f32 inputs; elsewhere it runs as usual). The same results to
    /// rounding. Off by default.
    pub fold: bool,
}

impl Default for BatchNorm {
    /// stax's defaults: axis `(0, 1, 2)`, epsilon `1e-5`, center and scale.
    fn default() -> Self {
        BatchNorm {
            axis: vec![0, 1, 2],
            epsilon: 1e-5,
            center: true,
            scale: true,
            fold: false,
        }
    }
}

impl BatchNorm {
    /// stax's `BatchNorm()` (see [`BatchNorm::default`]).
    pub fn new() -> BatchNorm {
        BatchNorm::default()
    }

    /// This normalization folded into the pointwise conv before it ([`BatchNorm::fold`]).
    pub fn folded(self) -> BatchNorm {
        BatchNorm { fold: true, ..self }
    }

    /// This normalization over `axis`.
    pub fn with_axis(self, axis: &[usize]) -> BatchNorm {
        BatchNorm {
            axis: axis.to_vec(),
            ..self
        }
    }

    /// This normalization with `epsilon`, `center` and `scale`.
    pub fn with(self, epsilon: f32, center: bool, scale: bool) -> BatchNorm {
        BatchNorm {
            epsilon,
            center,
            scale,
            ..self
        }
    }

    /// The input as `[outer, c, inner]` (`c` the kept axes) and the parameters' shape.
    pub(crate) fn geometry(&self, input: &Shape) -> Result<(ChannelGeometry, Shape), LayerError> {
        let shapes = Tree::leaf(input.clone());
        let rank = input.rank();
        if let Some(a) = self.axis.iter().find(|&&a| a >= rank) {
            let reason = format!("axis {a} is out of range for rank {rank}");
            return Err(self.shape_error(reason, &shapes));
        }
        let kept: Vec<usize> = (0..rank).filter(|i| !self.axis.contains(i)).collect();
        let param = Shape::new(kept.iter().map(|&i| input.dims()[i]).collect::<Vec<_>>());
        let g = match (kept.first(), kept.last()) {
            (Some(&a), Some(&b)) if b - a + 1 == kept.len() => ChannelGeometry::of(input, a..b + 1)
                .map_err(|e| self.shape_error(e.to_string(), &shapes))?,
            (Some(_), _) => {
                let reason = format!("the axes kept {kept:?} must be consecutive");
                return Err(self.shape_error(reason, &shapes));
            }
            (None, _) => ChannelGeometry {
                outer: input.numel(),
                c: 1,
                inner: 1,
            },
        };
        if g.per_channel() == 0 || g.c == 0 {
            let reason = "expected a non-empty input".into();
            return Err(self.shape_error(reason, &shapes));
        }
        Ok((g, param))
    }

    fn specs(&self, param: &Shape) -> Tree<ParamSpec> {
        let slot = |on: bool, v: f32| match on {
            true => Tree::leaf(ParamSpec::f32(param.clone(), Init::Constant(v))),
            false => Tree::empty(),
        };
        Tree::node([
            (Key::Field("beta"), slot(self.center, 0.0)),
            (Key::Field("gamma"), slot(self.scale, 1.0)),
        ])
    }

    /// `(beta, gamma)` as `[c]` tensors, each when present, checked against the specs.
    pub(crate) fn params(
        &self,
        params: &Params,
        g: &ChannelGeometry,
        param: &Shape,
    ) -> Result<[Option<Tensor>; 2], LayerError> {
        let specs = self.specs(param);
        if let Some(e) = specs.structure_differs(params) {
            return Err(self.mismatch("parameters", e.to_string()));
        }
        let field = |i: usize| -> Result<Option<Tensor>, LayerError> {
            match &params.children()[i].1 {
                Tree::Leaf(t) if t.shape() == param && t.dtype() == DType::F32 => {
                    Ok(Some(t.reshape([g.c])?))
                }
                Tree::Leaf(t) => Err(self.mismatch(
                    "parameters",
                    format!(
                        "{} is {} {}, expected f32 {param}",
                        params.children()[i].0,
                        t.dtype(),
                        t.shape()
                    ),
                )),
                Tree::Node(_) => Ok(None),
            }
        };
        Ok([field(0)?, field(1)?])
    }

    /// The forward pass; with `relu`, the ReLU that follows runs in the same kernel and
    /// writes its mask there, after `add` is added ([`ops::batch_norm_add_relu`]). The residuals
    /// are the norm's own (the mask's keeper keeps it).
    /// In a rematerialized forward pass run again, the statistics its first run saved are
    /// used rather than computed ([`ops::batch_norm_given`]: the same output, one pass fewer);
    /// in its first run they are saved.
    fn forward(
        &self,
        params: &Params,
        x: Value,
        cx: &mut Cx<'_>,
        (relu, add): (Option<&mut Tensor>, Option<&Tensor>),
    ) -> Result<(Value, Residuals), LayerError> {
        let x = one_tensor(self, x)?;
        let (g, param) = self.geometry(x.shape())?;
        let [beta, gamma] = self.params(params, &g, &param)?;
        let be = x.backend().clone();
        let act = |role| Tag::new(Category::Activation, role);
        let mut y = Tensor::empty(&be, x.shape().clone(), x.dtype(), act("output"))?;
        let affine = Affine {
            gamma: gamma.as_ref(),
            beta: beta.as_ref(),
        };
        if add.is_some() && relu.is_none() {
            return Err(self.config("adds only before a ReLU".into()));
        }
        let (mean, rstd) = match cx.saved_stats() {
            Some((mean, rstd)) => {
                let out = (&mut y, add);
                ops::batch_norm_given(&x, &g, affine, out, (&mean, &rstd), relu)?;
                (mean, rstd)
            }
            None => {
                let mut mean = Tensor::empty(&be, [g.c], DType::F32, act("mean"))?;
                let mut rstd = Tensor::empty(&be, [g.c], DType::F32, act("rstd"))?;
                let stats = (&mut mean, &mut rstd);
                match (add, relu) {
                    (Some(add), Some(mask)) => {
                        let out = (&mut y, add);
                        ops::batch_norm_add_relu(&x, &g, self.epsilon, affine, out, stats, mask)?
                    }
                    (_, relu) => {
                        ops::batch_norm(&x, &g, self.epsilon, affine, &mut y, stats, relu)?
                    }
                }
                cx.save_stats(&mean, &rstd);
                (mean, rstd)
            }
        };
        if !cx.is_training() {
            return Ok((Tree::leaf(y), Tree::empty()));
        }
        Ok((Tree::leaf(y), kept(x, (mean, rstd))))
    }

    /// The backward pass; with `relu`, `dy` is the gradient after the fused ReLU, masked by
    /// the ReLU's saved mask in the same kernels; with `sum` (and `need_dx`), the input
    /// gradient's per-channel sums too ([`Layer::vjp_summing_dx`]).
    fn backward(
        &self,
        params: &Params,
        mut residuals: Residuals,
        (dy, relu, sum): (Value, bool, bool),
        cx: &mut Cx<'_>,
        need_dx: bool,
    ) -> Result<(Option<Value>, Option<DySums>), LayerError> {
        let x = saved_tensor(self, &mut residuals, "x")?;
        let mean = saved_tensor(self, &mut residuals, "mean")?;
        let rstd = saved_tensor(self, &mut residuals, "rstd")?;
        let key = activation::saved_key(Activation::Relu);
        let mask = relu
            .then(|| saved_tensor(self, &mut residuals, key))
            .transpose()?;
        let (g, param) = self.geometry(x.shape())?;
        let [beta, gamma] = self.params(params, &g, &param)?;
        let mut dy = one_tensor(self, dy)?;
        if need_dx || relu {
            dy = dy.into_unique_as("dx")?;
        }
        let be = x.backend().clone();
        let grad = |on: bool, role| match on {
            true => {
                Tensor::empty(&be, [g.c], DType::F32, Tag::new(Category::Gradient, role)).map(Some)
            }
            false => Ok(None),
        };
        let (mut dbeta, mut dgamma) = (
            grad(beta.is_some(), "dbeta")?,
            grad(gamma.is_some(), "dgamma")?,
        );
        let mut dx_sum = match sum && need_dx {
            true => Some(Tensor::empty(
                &be,
                [g.c],
                dy.dtype(),
                Tag::new(Category::Gradient, "dx_sum"),
            )?),
            false => None,
        };
        let grads = AffineGrads {
            dgamma: dgamma.as_mut(),
            dbeta: dbeta.as_mut(),
            dx_sum: dx_sum.as_mut(),
        };
        let saved = NormSaved {
            mean: &mean,
            rstd: &rstd,
            relu: mask.as_ref(),
        };
        ops::batch_norm_bwd(&x, &g, gamma.as_ref(), saved, &mut dy, need_dx, grads)?;
        let slot = |t: Option<Tensor>| -> Result<Tree<Tensor>, LayerError> {
            Ok(match t {
                Some(t) => Tree::leaf(t.reshape(param.clone())?),
                None => Tree::empty(),
            })
        };
        cx.gradients(Tree::node([
            (Key::Field("beta"), slot(dbeta)?),
            (Key::Field("gamma"), slot(dgamma)?),
        ]))?;
        Ok((need_dx.then(|| Tree::leaf(dy)), dx_sum.map(|s| (s, g))))
    }
}

/// A norm's residuals: its input and its statistics (mean, rstd).
fn kept(x: Tensor, (mean, rstd): (Tensor, Tensor)) -> Residuals {
    residuals([
        ("x", Saved::Tensor(x)),
        ("mean", Saved::Tensor(mean)),
        ("rstd", Saved::Tensor(rstd)),
    ])
}

impl Layer for BatchNorm {
    fn kind(&self) -> &'static str {
        "batch_norm"
    }

    fn as_batch_norm(&self) -> Option<&BatchNorm> {
        Some(self)
    }

    fn describe(&self) -> String {
        format!(
            "batch_norm(axis={:?}, epsilon={}, center={}, scale={}{})",
            self.axis,
            self.epsilon,
            self.center,
            self.scale,
            if self.fold { ", folded" } else { "" }
        )
    }

    fn output_shape(&self, input: &Shapes) -> Result<Shapes, LayerError> {
        let input = one_shape(self, input)?;
        self.geometry(input)?;
        Ok(Tree::leaf(input.clone()))
    }

    fn param_specs(&self, input: &Shapes) -> Result<Tree<ParamSpec>, LayerError> {
        Ok(self.specs(&self.geometry(one_shape(self, input)?)?.1))
    }

    fn apply(
        &self,
        params: &Params,
        x: Value,
        cx: &mut Cx<'_>,
    ) -> Result<(Value, Residuals), LayerError> {
        self.forward(params, x, cx, (None, None))
    }

    fn adds(&self) -> bool {
        true
    }

    /// Its input with the statistics its first run saved, when there are.
    fn replay_residuals(
        &self,
        x: &Value,
        cx: &mut Cx<'_>,
    ) -> Result<Option<Residuals>, LayerError> {
        let x = one_tensor(self, x.clone())?;
        self.geometry(x.shape())?;
        Ok(cx.saved_stats().map(|stats| kept(x, stats)))
    }

    /// `add` and the ReLU in the kernel that applies the normalization
    /// ([`ops::batch_norm_add_relu`]).
    fn apply_adding(
        &self,
        params: &Params,
        x: Value,
        cx: &mut Cx<'_>,
        (add, mask): (&Tensor, &mut Tensor),
    ) -> Result<(Value, Residuals), LayerError> {
        self.forward(params, x, cx, (Some(mask), Some(add)))
    }

    fn vjp(
        &self,
        params: &Params,
        residuals: Residuals,
        dy: Value,
        cx: &mut Cx<'_>,
        need_dx: bool,
    ) -> Result<Option<Value>, LayerError> {
        Ok(self
            .backward(params, residuals, (dy, false, false), cx, need_dx)?
            .0)
    }

    /// The sums in the kernel that writes the input gradient ([`ops::batch_norm_bwd`]'s
    /// `dx_sum`), the view they are over this norm's `[outer, c, inner]`.
    fn vjp_summing_dx(
        &self,
        params: &Params,
        residuals: Residuals,
        dy: Value,
        cx: &mut Cx<'_>,
        act: Option<Activation>,
    ) -> Result<(Option<Value>, Option<DySums>), LayerError> {
        match act {
            None => self.backward(params, residuals, (dy, false, true), cx, true),
            Some(Activation::Relu) => self.backward(params, residuals, (dy, true, true), cx, true),
            Some(a) => Err(self.config(format!("fuses a ReLU, not {a:?}"))),
        }
    }

    /// A ReLU, in the normalization's kernels (its mask written by the forward one, `dy`
    /// masked by the backward ones).
    fn fuses(&self, act: Activation) -> bool {
        act == Activation::Relu
    }

    fn apply_fused(
        &self,
        params: &Params,
        x: Value,
        cx: &mut Cx<'_>,
        act: Activation,
        aux: Option<Tensor>,
    ) -> Result<(Value, Residuals), LayerError> {
        let (Activation::Relu, Some(mut mask)) = (act, aux) else {
            return Err(self.config(format!("fuses a ReLU with its mask, not {act:?}")));
        };
        let (y, mut r) = self.forward(params, x, cx, (Some(&mut mask), None))?;
        if let (Tree::Node(kept), true) = (&mut r, cx.is_training()) {
            let key = activation::saved_key(Activation::Relu);
            kept.push((Key::Field(key), Tree::leaf(Saved::Tensor(mask))));
        }
        Ok((y, r))
    }

    fn vjp_fused(
        &self,
        params: &Params,
        residuals: Residuals,
        dy: Value,
        cx: &mut Cx<'_>,
        act: Activation,
        need_dx: bool,
    ) -> Result<Option<Value>, LayerError> {
        if act != Activation::Relu {
            return Err(self.config(format!("fuses a ReLU, not {act:?}")));
        }
        Ok(self
            .backward(params, residuals, (dy, true, false), cx, need_dx)?
            .0)
    }
}
