//! Softmax cross-entropy loss and its gradient.

use crate::LayerError;
use stax_tensor::{Category, DType, Tensor};

/// `jnp.mean(optax.softmax_cross_entropy(logits, labels))` and its gradient.
///
/// logits `[n, k]`, labels `[n, k]` (probabilities, e.g. one-hot), both f32 on one device.
/// Returns the mean loss over the batch and `dlogits = (softmax(logits) - labels) / n`
/// (tagged [`Category::Gradient`]), computed stably with the row maximum subtracted.
///
/// # Errors
/// Shape mismatch, rank other than 2, empty batch, device mismatch (typed tensor errors).
pub fn softmax_cross_entropy(
    logits: &Tensor,
    labels: &Tensor,
) -> Result<(f32, Tensor), LayerError> {
    let be = logits.backend().clone();
    let mut d = Tensor::empty(&be, logits.shape().clone(), DType::F32, Category::Gradient)?;
    let loss = be.softmax_xent(logits, labels, &mut d)?;
    Ok((loss, d))
}
