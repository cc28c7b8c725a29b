//! Losses: a [`Loss`] turns logits and labels into the mean loss and its gradient.

use std::fmt;

use stax_alloc::Tag;
use stax_tensor::{Category, DType, Shape, Tensor, ops};

use crate::LayerError;

/// A loss over a batch: the mean of per-example losses, and its gradient with respect to the
/// model's output.
pub trait Loss: fmt::Debug + Send + Sync {
    /// A short name (`softmax_cross_entropy`).
    fn name(&self) -> &'static str;

    /// The labels' shape for model outputs of shape `logits`.
    fn labels_shape(&self, logits: &Shape) -> Shape;

    /// The mean loss and `dlogits`, its gradient (tagged [`Category::Gradient`], role
    /// `dlogits`).
    ///
    /// # Errors
    /// Shape, dtype and device mismatches; allocation errors.
    fn value_and_grad(&self, logits: &Tensor, labels: &Tensor)
    -> Result<(f32, Tensor), LayerError>;
}

/// `jnp.mean(optax.softmax_cross_entropy(logits, labels))`: logits `[n, k]`, labels `[n, k]`
/// (probabilities, e.g. one-hot), f32 on one device; the gradient
/// `dlogits = (softmax(logits) - labels) / n` is computed stably, with the row maximum
/// subtracted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SoftmaxCrossEntropy;

impl Loss for SoftmaxCrossEntropy {
    fn name(&self) -> &'static str {
        "softmax_cross_entropy"
    }

    fn labels_shape(&self, logits: &Shape) -> Shape {
        logits.clone()
    }

    fn value_and_grad(
        &self,
        logits: &Tensor,
        labels: &Tensor,
    ) -> Result<(f32, Tensor), LayerError> {
        let tag = Tag::new(Category::Gradient, "dlogits");
        let mut d = Tensor::empty(logits.backend(), logits.shape().clone(), DType::F32, tag)?;
        let loss = ops::softmax_xent(logits, labels, &mut d)?;
        Ok((loss, d))
    }
}
