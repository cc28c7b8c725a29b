//! The loss and the optimizer's update.

use crate::backend::{Adam, AllFinite, DenseAdam, DenseDx, SoftmaxXent};
use crate::{AdamHyper, Checked, DType, Shape, Tensor, TensorError, softmax_xent_dims};

use super::{F32, FLOATS, backend_of, input, loss_operands, output, supports};

/// Softmax cross-entropy with optax's semantics, fused with its gradient: logits and labels
/// `[n, k]` f32 (labels are probabilities, e.g. one-hot). Returns
/// `mean_i(-sum_j labels[i, j] · log_softmax(logits)[i, j])` and writes
/// `dlogits = (softmax(logits) - labels) / n`, the gradient of that mean. Mirrors
/// `jnp.mean(optax.softmax_cross_entropy(logits, labels))`, computed stably (max subtracted).
///
/// # Errors
/// [`TensorError::Shape`] unless logits are 2-D and labels and dlogits have their shape;
/// [`TensorError::InvalidArgument`] for no rows or classes; dtype, device, alias errors.
pub fn softmax_xent(
    logits: &Tensor,
    labels: &Tensor,
    dlogits: &mut Tensor,
) -> Result<f32, TensorError> {
    const OP: &str = "softmax_xent";
    let be = backend_of(logits);
    supports(OP, logits.dtype(), F32)?;
    let (rows, classes) = softmax_xent_dims(logits.shape())?;
    loss_operands(
        OP,
        [logits, labels, dlogits],
        (logits.dtype(), logits.shape()),
    )?;
    let call = SoftmaxXent {
        rows,
        classes,
        logits,
        labels,
        dlogits,
    };
    be.softmax_xent(Checked::new(call))
}

/// Checks that the hyper-parameters give finite updates: all finite, bias corrections positive.
fn validate(h: &AdamHyper) -> Result<(), TensorError> {
    let fields = [
        ("lr", h.lr),
        ("b1", h.b1),
        ("b2", h.b2),
        ("eps", h.eps),
        ("eps_root", h.eps_root),
        ("bias_correction1", h.bias_correction1),
        ("bias_correction2", h.bias_correction2),
        ("grad_scale", h.grad_scale),
    ];
    if let Some((name, v)) = fields.iter().find(|(_, v)| !v.is_finite()) {
        return Err(TensorError::InvalidArgument {
            op: "adam_update",
            reason: format!("{name} must be finite, got {v}"),
        });
    }
    if h.bias_correction1 <= 0.0 || h.bias_correction2 <= 0.0 {
        return Err(TensorError::InvalidArgument {
            op: "adam_update",
            reason: format!(
                "bias corrections 1 - b^t must be positive (step t >= 1), got {} and {}",
                h.bias_correction1, h.bias_correction2
            ),
        });
    }
    Ok(())
}

/// One fused, in-place Adam step on one parameter tensor (see [`AdamHyper`]): reads p, g, m,
/// v and writes p, m, v, all of one shape; p and v f32 (the master weights and optax's second
/// moment), g in any float dtype (a bf16 or f16 step's weight gradient, read as f32 and
/// multiplied by `h.grad_scale`: the cast and the loss scale's unscaling at the update), m in
/// any float dtype (optax's `mu_dtype`: read as f32, the step computed in f32, the new first
/// moment rounded once to m's dtype, as `optax.scale_by_adam(mu_dtype=..)` casts `mu` after
/// `update_moment`).
///
/// # Errors
/// [`TensorError::InvalidArgument`] for a non-finite hyper-parameter or a bias correction
/// `<= 0`; shape, dtype, device and alias errors.
pub fn adam(
    p: &mut Tensor,
    g: &Tensor,
    m: &mut Tensor,
    v: &mut Tensor,
    h: &AdamHyper,
) -> Result<(), TensorError> {
    const OP: &str = "adam_update";
    let be = backend_of(p);
    supports(OP, p.dtype(), F32)?;
    validate(h)?;
    supports(OP, g.dtype(), FLOATS)?;
    let shape = p.shape().clone();
    output(OP, &be, p, "p", p.dtype(), None)?;
    input(OP, &be, g, "g", g.dtype(), Some(&shape))?;
    supports(OP, m.dtype(), FLOATS)?;
    output(OP, &be, m, "m", m.dtype(), Some(&shape))?;
    output(OP, &be, v, "v", p.dtype(), Some(&shape))?;
    be.adam(Checked::new(Adam { p, g, m, v, h: *h }))
}

/// Folds `all(isfinite(x))` (jmp's `all_finite` of one leaf) into a flag: `nonfinite`, a U32
/// `[1]` tensor, is set to 1 when an element of `x` (any float dtype) is NaN or infinite and
/// left as it is otherwise. Fill it with 0, call this for every tensor of a tree, and read it
/// once (one download for the whole tree). No workspace.
///
/// # Errors
/// [`TensorError::UnsupportedDType`] for a U32 `x`; [`TensorError::Shape`] unless `nonfinite` is
/// U32 `[1]`; device and alias errors.
pub fn all_finite(x: &Tensor, nonfinite: &mut Tensor) -> Result<(), TensorError> {
    const OP: &str = "all_finite";
    let be = backend_of(x);
    supports(OP, x.dtype(), FLOATS)?;
    input(OP, &be, x, "x", x.dtype(), None)?;
    output(
        OP,
        &be,
        nonfinite,
        "nonfinite",
        DType::U32,
        Some(&Shape::new([1])),
    )?;
    be.all_finite(Checked::new(AllFinite { x, nonfinite }))
}

/// A dense layer's backward pass with Adam applied to its weight as the weight gradient is
/// made, so that the gradient `dw = xᵀ · dy` never exists whole. x `[m, k]` and dy `[m, n]`
/// are of one float dtype D (f32, bf16 or f16); w, mu, nu `[k, n]` are f32 (the master weight
/// and Adam's moments); dx `[m, k]` is of dtype D. For each chunk of the weight's rows
/// ([`crate::dense_chunk_rows`]):
///
/// - `dw_chunk = x[:, chunk]ᵀ · dy`, products and sums in f32 from the widened D inputs,
///   rounded once to D: the weight gradient the unfused layer hands to Adam in D (JAX's bf16
///   `dot_general` and PyTorch autocast's bf16 GEMMs give it in bf16 too);
/// - the Adam step of [`adam`] with that gradient read as f32 on `w_chunk`, `mu_chunk`,
///   `nu_chunk` (times `h.grad_scale`, as [`adam`] reads it);
/// - `dx[:, chunk] = dy · round_D(w_old_chunk)ᵀ` from the weight before the step rounded to
///   D, sums in f32, rounded once to D: what the unfused layer computes from its D copy of
///   the weight.
///
/// For f32 this is exactly `matmul` then `adam` per element. The workspace (a chunk of `dw`,
/// in D on CUDA and held as f32 on the CPU, and, for a bf16 or f16 `dx`, a chunk of the
/// rounded old weight) is taken before anything is written, so an error leaves every operand
/// as it was. With [`DenseDx::InPlace`], `x` holds `dx` on return (each chunk of `x`'s
/// columns is read for its `dw` before its `dx` is written over it).
///
/// # Errors
/// [`TensorError::Shape`] for operands of other shapes (x `[m, k]` and w `[k, n]` matrices, dy
/// `[m, n]`, mu and nu as w, dx as x; the operand named); [`TensorError::UnsupportedDType`]
/// for a U32 `x`; [`TensorError::DType`] when dy or dx is not of x's dtype or w, mu, nu are
/// not f32; as [`adam`] for the hyper-parameters; device and alias errors (w, mu, nu, an
/// in-place x and dx must be solely owned).
#[allow(clippy::too_many_arguments)]
pub fn dense_adam(
    x: &mut Tensor,
    dy: &Tensor,
    w: &mut Tensor,
    mu: &mut Tensor,
    nu: &mut Tensor,
    dx: DenseDx<'_>,
    h: &AdamHyper,
) -> Result<(), TensorError> {
    const OP: &str = "dense_adam";
    let be = backend_of(x);
    let dtype = x.dtype();
    supports(OP, dtype, FLOATS)?;
    validate(h)?;
    let matrix = |t: &Tensor, name: &str| match t.dims() {
        &[r, c] => Ok((r, c)),
        _ => Err(TensorError::Shape {
            op: OP,
            reason: format!("{name}: x, dy and w must be matrices"),
            got: t.shape().clone(),
        }),
    };
    // the batch and input features from x, the outputs from the weight: a dy of other
    // features is dy's error
    let ((m, k), (_, n)) = (matrix(x, "x")?, matrix(w, "w")?);
    input(OP, &be, dy, "dy", dtype, Some(&Shape::new([m, n])))?;
    let weight = Shape::new([k, n]);
    for (t, name) in [(&*w, "w"), (&*mu, "mu"), (&*nu, "nu")] {
        output(OP, &be, t, name, DType::F32, Some(&weight))?;
    }
    match &dx {
        DenseDx::InPlace => output(OP, &be, x, "x", dtype, None)?,
        DenseDx::Into(d) => output(OP, &be, d, "dx", dtype, Some(&Shape::new([m, k])))?,
        DenseDx::Skip => input(OP, &be, x, "x", dtype, None)?,
    }
    let call = DenseAdam {
        x,
        dy,
        w,
        mu,
        nu,
        dx,
        h: *h,
    };
    be.dense_adam(Checked::new(call))
}
