//! A batch norm's backward pass through the pointwise conv before it, without the conv's
//! output: the per-channel part ([`batch_norm_fold`]); the layers run the GEMMs around it.

use crate::backend::BatchNormFold;
use crate::{Checked, DType, Shape, Tensor, TensorError};

use super::{backend_of, input, output};

/// The conv and norm tensors [`batch_norm_fold`] reads, all f32: the conv's weight `w`
/// `[k, c]` (a 1x1 HWIO filter's view) and bias `b0` `[c]`, the norm's scale `gamma` `[c]`
/// (if any) and saved `mean` and `rstd` `[c]`, and the sums over the `count` rows of the
/// conv's input `h` `[count, k]` and the norm's output gradient `dy` `[count, c]`: `gt = hᵀ ·
/// dy` `[k, c]`, `sh = Σ h` `[k]`, `sd = Σ dy` `[c]`.
#[derive(Debug, Clone, Copy)]
pub struct FoldInputs<'a> {
    /// The conv's weight `[k, c]`.
    pub w: &'a Tensor,
    /// The conv's bias `[c]`.
    pub b0: &'a Tensor,
    /// The norm's scale `[c]`, if any.
    pub gamma: Option<&'a Tensor>,
    /// The norm's saved mean `[c]`.
    pub mean: &'a Tensor,
    /// The norm's saved `1 / sqrt(var + eps)` `[c]`.
    pub rstd: &'a Tensor,
    /// `hᵀ · dy` `[k, c]`.
    pub gt: &'a Tensor,
    /// `Σ h` over the rows `[k]`.
    pub sh: &'a Tensor,
    /// `Σ dy` over the rows `[c]`.
    pub sd: &'a Tensor,
    /// The rows summed over.
    pub count: usize,
}

/// What [`batch_norm_fold`] writes, all f32 (`dw` also read).
#[derive(Debug)]
pub struct FoldOutputs<'a> {
    /// `hᵀ · h · w` `[k, c]` on entry, the conv's weight gradient on return.
    pub dw: &'a mut Tensor,
    /// The conv's bias gradient `[c]`.
    pub db0: &'a mut Tensor,
    /// `w · diag(a)` `[k, c]`.
    pub w_a: &'a mut Tensor,
    /// `w · diag(cz)` `[k, c]`.
    pub w_c: &'a mut Tensor,
    /// `bp` `[c]`.
    pub bp: &'a mut Tensor,
    /// The norm's scale gradient `[c]`, if wanted.
    pub dgamma: Option<&'a mut Tensor>,
    /// The norm's shift gradient `[c]`, if wanted.
    pub dbeta: Option<&'a mut Tensor>,
}

/// The per-channel part of the backward pass of a batch norm (stax's `BatchNorm`, as
/// [`super::batch_norm_bwd`]) over `x = h · w + b0`, the output of a pointwise conv (1x1,
/// stride 1) of input `h` `[count, k]`, computed without `x`, so that `x` need not be kept.
///
/// With `xhat = (x - mean) · rstd`, the norm's input gradient is, per channel,
/// `dx = a · dy + b + cz · x`, where `a = gamma · rstd`, `t = Σ dy · xhat`, `cz = -a · rstd ·
/// t / count` and `b = -a · Σ dy / count - cz · mean` (the batch-norm gradient of Ioffe &
/// Szegedy 2015, as `jax.grad` of `jax.nn.standardize` gives it). Since `x` is linear in `h`:
/// `Σ dy · x = Σ_k w ∘ gt + b0 · sd` (`Σ_k` down the `k` rows), so `t = rstd · (Σ_k w ∘ gt +
/// (b0 - mean) · sd)`; with `bp = b + cz · b0`, the conv's gradients are `dw = hᵀ · dx = gt · diag(a) + sh ⊗ bp + (hᵀ ·
/// h · w) · diag(cz)` and `db0 = Σ dx = a · sd + count · bp + cz · (sh · w)`, and its input
/// gradient is `dh = dx · wᵀ = dy · w_aᵀ + h · (w_c · wᵀ) + 1 ⊗ (w · bp)`, which the caller
/// computes by GEMMs from `w_a`, `w_c` and `bp`. This op writes `dgamma = t`, `dbeta = Σ dy`,
/// `db0`, `dw` (from `hᵀ · h · w`, which `outputs.dw` holds on entry), `w_a`, `w_c` and `bp`;
/// per-channel values in f64.
///
/// # Errors
/// [`TensorError::InvalidArgument`] for a `count` of 0; [`TensorError::DType`],
/// [`TensorError::Shape`], device and alias errors for operands that are not f32 of the shapes
/// above; kernel errors.
pub fn batch_norm_fold(
    inputs: FoldInputs<'_>,
    outputs: FoldOutputs<'_>,
) -> Result<(), TensorError> {
    const OP: &str = "batch_norm_fold";
    let FoldInputs {
        w,
        b0,
        gamma,
        mean,
        rstd,
        gt,
        sh,
        sd,
        count,
    } = inputs;
    if count == 0 {
        let reason = "the sums are over no rows (count 0)".into();
        return Err(TensorError::InvalidArgument { op: OP, reason });
    }
    let be = backend_of(w);
    let (k, c) = match w.dims() {
        &[k, c] => (k, c),
        _ => {
            let reason = "expected the weight as a matrix [k, c]".into();
            let got = w.shape().clone();
            return Err(TensorError::Shape {
                op: OP,
                reason,
                got,
            });
        }
    };
    let (kc, cs, ks) = (Shape::new([k, c]), Shape::new([c]), Shape::new([k]));
    input(OP, &be, w, "w", DType::F32, Some(&kc))?;
    input(OP, &be, gt, "gt", DType::F32, Some(&kc))?;
    input(OP, &be, sh, "sh", DType::F32, Some(&ks))?;
    for (t, name) in [(b0, "b0"), (mean, "mean"), (rstd, "rstd"), (sd, "sd")] {
        input(OP, &be, t, name, DType::F32, Some(&cs))?;
    }
    if let Some(g) = gamma {
        input(OP, &be, g, "gamma", DType::F32, Some(&cs))?;
    }
    let FoldOutputs {
        dw,
        db0,
        w_a,
        w_c,
        bp,
        dgamma,
        dbeta,
    } = outputs;
    for (t, name) in [(&*dw, "dw"), (&*w_a, "w_a"), (&*w_c, "w_c")] {
        output(OP, &be, t, name, DType::F32, Some(&kc))?;
    }
    for (t, name) in [(&*bp, "bp"), (&*db0, "db0")] {
        output(OP, &be, t, name, DType::F32, Some(&cs))?;
    }
    for d in [&dgamma, &dbeta].into_iter().flatten() {
        output(OP, &be, d, "dgamma or dbeta", DType::F32, Some(&cs))?;
    }
    let call = BatchNormFold {
        k,
        c,
        count,
        w,
        b0,
        gamma,
        mean,
        rstd,
        gt,
        sh,
        sd,
        dw,
        w_a,
        w_c,
        bp,
        db0,
        dgamma,
        dbeta,
    };
    be.batch_norm_fold(Checked::new(call))
}
