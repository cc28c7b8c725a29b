//! The loss and the optimizer's update.

use crate::backend::{Adam, SoftmaxXent};
use crate::{AdamHyper, Checked, Tensor, TensorError, softmax_xent_dims};

use super::{F32, backend_of, input, output, supports};

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
    input(OP, &be, logits, logits.dtype(), None)?;
    input(OP, &be, labels, logits.dtype(), Some(logits.shape()))?;
    output(OP, &be, dlogits, logits.dtype(), Some(logits.shape()))?;
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
/// v and writes p, m, v; all four f32 of one shape.
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
    let shape = p.shape().clone();
    output(OP, &be, p, p.dtype(), None)?;
    input(OP, &be, g, p.dtype(), Some(&shape))?;
    output(OP, &be, m, p.dtype(), Some(&shape))?;
    output(OP, &be, v, p.dtype(), Some(&shape))?;
    be.adam(Checked::new(Adam { p, g, m, v, h: *h }))
}
