//! Mixed precision: [`Mixed`] runs a layer (a whole model, or one layer of it) under a dtype
//! [`Policy`], as jmp's policies and PyTorch's autocast do; [`compute_copy`] is how a layer
//! reads a parameter in its compute dtype.
//!
//! Under `Policy { param: F32, compute: BF16, output: F32 }` the parameters stay f32 (the
//! master weights Adam updates, with f32 moments); [`Mixed`] casts its input to bf16, every
//! layer computes in the dtype of its input (convs and GEMMs with f32 accumulation), casting its
//! parameters to it where they are used ([`compute_copy`]: a buffer named `{layer}/cast_w`, freed
//! at its last use, so plans count it; a dense layer's f32 weight is read rounded by its
//! matmul instead, with no copy: [`stax_tensor::ops::matmul`]), keeps its activations and
//! activation gradients in bf16 and hands bf16 weight gradients to the sink, which Adam reads as f32 ([`stax_tensor::ops::adam`]:
//! the cast at the update); the output (logits) is cast to f32, so the loss and its softmax
//! run in f32.

use stax_alloc::Tag;
use stax_tensor::{Category, DType, Params, Tensor, Tree, ops};

use crate::{Cx, Layer, LayerError, Policy, Residuals, Shapes, Value};

/// `p` as a layer computes with it in `dtype`: `p` itself (another handle) when it is of
/// `dtype`, else a copy cast to `dtype`, made in the layer's scope with the role `role`
/// (`cast_w`) and category [`Category::Activation`] (it lives as long as the layer uses it).
///
/// # Errors
/// Allocation errors; [`stax_tensor::TensorError::UnsupportedDType`] for a U32 `dtype`.
pub fn compute_copy(p: &Tensor, dtype: DType, role: &'static str) -> Result<Tensor, LayerError> {
    if p.dtype() == dtype {
        return Ok(p.clone());
    }
    let tag = Tag::new(Category::Activation, role);
    let mut c = Tensor::empty(p.backend(), p.shape().clone(), dtype, tag)?;
    ops::cast(p, &mut c)?;
    Ok(c)
}

/// Every leaf of `x` cast to `dtype` (leaves of `dtype` kept as they are), the copies tagged
/// [`Category::Activation`] with role `role`, in the running layer's scope.
fn cast_value(x: Value, dtype: DType, role: &'static str) -> Result<Value, LayerError> {
    x.try_map_into(|_, t| match t.dtype() == dtype {
        true => Ok(t),
        false => compute_copy(&t, dtype, role),
    })
}

impl Policy {
    /// Computing in bf16 with f32 master weights and f32 outputs (jmp's
    /// `"params=float32,compute=bfloat16,output=float32"`).
    pub const BF16: Policy = Policy {
        param: DType::F32,
        compute: DType::BF16,
        output: DType::F32,
    };

    /// Computing in f16 with f32 master weights and f32 outputs (jmp's
    /// `"params=float32,compute=float16,output=float32"`); it trains only with dynamic loss
    /// scaling ([`Policy::check`]).
    pub const F16: Policy = Policy {
        param: DType::F32,
        compute: DType::F16,
        output: DType::F32,
    };

    /// Checks that stax-rs can train under this policy, with the loss scaled
    /// (`loss_scaling`: jmp's `DynamicLossScale` in the trainer) or not.
    ///
    /// # Errors
    /// [`LayerError::Config`] with the reason: parameters stored in f16 without loss scaling
    /// (updates below 2^-24 vanish, gradients above 65504 overflow), parameters stored in any
    /// dtype but f32 (Adam updates f32 master weights), f16 compute without loss scaling
    /// (gradients below 2^-24 flush to zero and above 65504 overflow: use bf16 or turn on
    /// dynamic loss scaling), or a U32 dtype.
    pub fn check(&self, loss_scaling: bool) -> Result<(), LayerError> {
        let refuse = |reason: String| LayerError::Config {
            path: String::new(),
            layer: format!("policy {self}"),
            reason,
        };
        if let Some(d) = [self.param, self.compute, self.output]
            .into_iter()
            .find(|d| !d.is_float())
        {
            return Err(refuse(format!("{d} is not a float dtype")));
        }
        match (self.param, self.compute, loss_scaling) {
            (DType::F16, _, false) => Err(refuse(
                "parameters stored in f16 without loss scaling lose every update below 2^-24 \
                 and overflow above 65504; keep f32 master weights (param=f32)"
                    .into(),
            )),
            (DType::F16 | DType::BF16, _, _) => Err(refuse(
                "Adam updates f32 master weights: store parameters in f32 (param=f32) and \
                 compute in bf16 or f16"
                    .into(),
            )),
            (_, DType::F16, false) => Err(refuse(
                "f16 compute needs dynamic loss scaling (jmp's DynamicLossScale: the trainer's \
                 set_loss_scale, on with --precision f16), or gradients below 2^-24 vanish \
                 and above 65504 overflow; compute in bf16, which needs none"
                    .into(),
            )),
            _ => Ok(()),
        }
    }
}

impl std::fmt::Display for Policy {
    /// jmp's spelling: `params=f32,compute=bf16,output=f32`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "params={},compute={},output={}",
            self.param, self.compute, self.output
        )
    }
}

/// A layer run under a dtype policy: its input cast to `policy.compute` (the copy named
/// `{path}/cast_input`), the layer computing in that dtype, its output cast to `policy.output`
/// (`cast_output`); in the backward pass the output gradient is cast to the compute dtype and the
/// input gradient back to the surrounding compute dtype (the enclosing [`Cx::policy`]'s). Its
/// parameters are the layer's own (same tree, same kind), so wrapping a model changes no
/// parameter path and no checkpoint. Wrap a whole model to choose its policy, and one layer
/// inside it to override the policy there: inside another `Mixed` (a surrounding policy other
/// than full f32) the output is cast to the surrounding compute dtype instead, the dtype the
/// layers after it compute in, so `Policy::F16` nests inside `Policy::BF16` as it is.
#[derive(Debug)]
pub struct Mixed<L: Layer> {
    /// The layer.
    pub layer: L,
    /// Its policy (checked by [`Policy::check`] on every apply: with the step's loss scaling
    /// in training, [`Cx::loss_scaled`], as loss-scaled in evaluation).
    pub policy: Policy,
}

impl<L: Layer> Mixed<L> {
    /// `layer` under `policy`.
    pub fn new(layer: L, policy: Policy) -> Mixed<L> {
        Mixed { layer, policy }
    }
}

impl<L: Layer> Layer for Mixed<L> {
    fn kind(&self) -> &'static str {
        self.layer.kind()
    }

    /// The layer's description, with the policy unless it is the default (full f32: the
    /// layer as it is, so f32 checkpoints and plans read the same).
    fn describe(&self) -> String {
        match self.policy == Policy::default() {
            true => self.layer.describe(),
            false => format!("{} under {}", self.layer.describe(), self.policy),
        }
    }

    fn policy(&self) -> Option<Policy> {
        Some(self.policy)
    }

    fn policies(&self, input: &Shapes) -> Vec<Policy> {
        let mut all = vec![self.policy];
        all.extend(self.layer.policies(input));
        all
    }

    fn output_shape(&self, input: &Shapes) -> Result<Shapes, LayerError> {
        self.layer.output_shape(input)
    }

    fn param_specs(&self, input: &Shapes) -> Result<Tree<crate::ParamSpec>, LayerError> {
        self.layer.param_specs(input)
    }

    fn apply(
        &self,
        params: &Params,
        x: Value,
        cx: &mut Cx<'_>,
    ) -> Result<(Value, Residuals), LayerError> {
        // evaluation computes no gradient: nothing for a loss scale to protect
        self.policy.check(cx.loss_scaled() || !cx.is_training())?;
        let x = cast_value(x, self.policy.compute, "cast_input")?;
        let outer = cx.set_policy(self.policy);
        let out = self.layer.apply(params, x, cx);
        cx.set_policy(outer);
        let (y, residuals) = out?;
        let output = match outer == Policy::default() {
            true => self.policy.output,
            false => outer.compute,
        };
        Ok((cast_value(y, output, "cast_output")?, residuals))
    }

    fn vjp(
        &self,
        params: &Params,
        residuals: Residuals,
        dy: Value,
        cx: &mut Cx<'_>,
        need_dx: bool,
    ) -> Result<Option<Value>, LayerError> {
        let dy = cast_value(dy, self.policy.compute, "cast_dy")?;
        let outer = cx.set_policy(self.policy);
        let dx = self.layer.vjp(params, residuals, dy, cx, need_dx);
        cx.set_policy(outer);
        dx?.map(|dx| cast_value(dx, outer.compute, "cast_dx"))
            .transpose()
    }
}
