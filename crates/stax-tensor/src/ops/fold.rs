//! A batch norm's backward pass through the pointwise conv before it, without the conv's
//! output: the per-channel part ([`batch_norm_fold`]); the layers run the GEMMs around it.

use crate::backend::{BatchNormFold, FoldInputs, FoldOutputs};
use crate::{Checked, DType, Shape, TensorError};

use super::{backend_of, input, output};

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
    let i = inputs;
    if i.count == 0 {
        let reason = "the sums are over no rows (count 0)".into();
        return Err(TensorError::InvalidArgument { op: OP, reason });
    }
    let be = backend_of(i.w);
    let &[k, c] = i.w.dims() else {
        let (reason, got) = (
            "expected the weight as a matrix [k, c]".into(),
            i.w.shape().clone(),
        );
        return Err(TensorError::Shape {
            op: OP,
            reason,
            got,
        });
    };
    let (kc, cs, ks) = (Shape::new([k, c]), Shape::new([c]), Shape::new([k]));
    let ins = [
        (i.w, "w", &kc),
        (i.gt, "gt", &kc),
        (i.sh, "sh", &ks),
        (i.b0, "b0", &cs),
    ];
    let ins = ins.into_iter().chain([
        (i.mean, "mean", &cs),
        (i.rstd, "rstd", &cs),
        (i.sd, "sd", &cs),
    ]);
    for (t, name, shape) in ins.chain(i.gamma.map(|g| (g, "gamma", &cs))) {
        input(OP, &be, t, name, DType::F32, Some(shape))?;
    }
    let o = &outputs;
    let outs = [
        (&*o.dw, "dw", &kc),
        (&*o.w_a, "w_a", &kc),
        (&*o.w_c, "w_c", &kc),
    ];
    let outs = outs
        .into_iter()
        .chain([(&*o.bp, "bp", &cs), (&*o.db0, "db0", &cs)]);
    let grads = [o.dgamma.as_deref(), o.dbeta.as_deref()]
        .into_iter()
        .flatten();
    for (t, name, shape) in outs.chain(grads.map(|g| (g, "dgamma or dbeta", &cs))) {
        output(OP, &be, t, name, DType::F32, Some(shape))?;
    }
    let call = BatchNormFold {
        k,
        c,
        inputs,
        outputs,
    };
    be.batch_norm_fold(Checked::new(call))
}
