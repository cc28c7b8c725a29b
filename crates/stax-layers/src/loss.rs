//! Losses: a [`Loss`] turns logits and labels into the mean loss and its gradient.
//!
//! With one-hot labels `[n, k]` f32: [`SoftmaxCrossEntropy`]. With class indices `[n]` u32:
//! [`SoftmaxCrossEntropyWithIntegerLabels`] (optax's) and [`NegLogLikelihood`] (stax's
//! examples' loss after a `LogSoftmax`).

use std::fmt;

use stax_alloc::Tag;
use stax_tensor::{Category, DType, IndexLoss, Shape, Tensor, ops};

use crate::LayerError;

/// A loss over a batch: the mean of per-example losses, and its gradient with respect to the
/// model's output.
pub trait Loss: fmt::Debug + Send + Sync {
    /// A short name (`softmax_cross_entropy`).
    fn name(&self) -> &'static str;

    /// The labels' shape for model outputs of shape `logits`.
    fn labels_shape(&self, logits: &Shape) -> Shape;

    /// The labels' dtype: F32 (one-hot or probability rows, the default) or U32 (class
    /// indices).
    fn labels_dtype(&self) -> DType {
        DType::F32
    }

    /// The mean loss and `dlogits`, its gradient (tagged [`Category::Gradient`], role
    /// `dlogits`).
    ///
    /// # Errors
    /// Shape, dtype and device mismatches; allocation errors.
    fn value_and_grad(&self, logits: &Tensor, labels: &Tensor)
    -> Result<(f32, Tensor), LayerError>;
}

/// The gradient buffer of a loss of `logits` (f32, their shape, tagged [`Category::Gradient`],
/// role `dlogits`).
fn dlogits_for(logits: &Tensor) -> Result<Tensor, LayerError> {
    let tag = Tag::new(Category::Gradient, "dlogits");
    Ok(Tensor::empty(
        logits.backend(),
        logits.shape().clone(),
        DType::F32,
        tag,
    )?)
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
        let mut d = dlogits_for(logits)?;
        let loss = ops::softmax_xent(logits, labels, &mut d)?;
        Ok((loss, d))
    }
}

/// A loss with integer labels: model outputs `[n, k]` f32, labels `[n]` u32 class indices,
/// the mean of [`IndexLoss`]'s per-row loss ([`SoftmaxCrossEntropyWithIntegerLabels`],
/// [`NegLogLikelihood`]). A label `>= k` is an error (optax gives NaN for it, silently).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntegerLabels(pub IndexLoss);

/// `jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))`: per row
/// `logsumexp(logits) - logits[label]`, the gradient `(softmax(logits) - one_hot(labels)) / n`.
#[allow(non_upper_case_globals)]
pub const SoftmaxCrossEntropyWithIntegerLabels: IntegerLabels =
    IntegerLabels(IndexLoss::SoftmaxCrossEntropy);

/// The negative log-likelihood of a `LogSoftmax` output, how stax's examples end
/// (`mnist_classifier.py`: `-jnp.mean(jnp.sum(preds * targets, axis=1))` with one-hot targets,
/// here given as their class indices): per row `-logp[label]`, the gradient
/// `-one_hot(labels) / n`.
#[allow(non_upper_case_globals)]
pub const NegLogLikelihood: IntegerLabels = IntegerLabels(IndexLoss::NegLogLikelihood);

impl Loss for IntegerLabels {
    fn name(&self) -> &'static str {
        match self.0 {
            IndexLoss::SoftmaxCrossEntropy => "softmax_cross_entropy_with_integer_labels",
            IndexLoss::NegLogLikelihood => "negative_log_likelihood",
        }
    }

    /// `[n]` for outputs `[n, ...]`.
    fn labels_shape(&self, logits: &Shape) -> Shape {
        Shape::new([logits.dims().first().copied().unwrap_or(0)])
    }

    fn labels_dtype(&self) -> DType {
        DType::U32
    }

    fn value_and_grad(
        &self,
        logits: &Tensor,
        labels: &Tensor,
    ) -> Result<(f32, Tensor), LayerError> {
        let mut d = dlogits_for(logits)?;
        let value = ops::index_loss(self.0, logits, labels, &mut d)?;
        Ok((value, d))
    }
}
