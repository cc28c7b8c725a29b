//! The op codes of the row ops: which normalization a softmax op computes and which loss an
//! integer-label loss op computes (what their kernels switch on).

/// A normalization over one axis (stax's `Softmax` and `LogSoftmax` layers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SoftmaxKind {
    /// `jax.nn.softmax`: `exp(x - m) / sum(exp(x - m))`, `m` the axis' maximum; gradient
    /// `y (dy - sum(y dy))` from the output, as JAX's custom JVP.
    Softmax,
    /// `jax.nn.log_softmax`: `x - m - log(sum(exp(x - m)))`; gradient
    /// `dy - exp(y) sum(dy)` from the output.
    LogSoftmax,
}

impl SoftmaxKind {
    /// stax's name of the layer (`softmax`, `log_softmax`).
    pub fn name(self) -> &'static str {
        match self {
            SoftmaxKind::Softmax => "softmax",
            SoftmaxKind::LogSoftmax => "log_softmax",
        }
    }

    /// The op code the softmax kernels switch on.
    pub fn code(self) -> i32 {
        match self {
            SoftmaxKind::Softmax => 0,
            SoftmaxKind::LogSoftmax => 1,
        }
    }
}

/// A loss with integer labels (class indices), the mean over the batch of a per-example loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IndexLoss {
    /// `optax.softmax_cross_entropy_with_integer_labels`: `logsumexp(z) - z[label]` per row;
    /// gradient of the mean `(softmax(z) - one_hot(label)) / n`.
    SoftmaxCrossEntropy,
    /// The negative log-likelihood of log-probabilities `z` (a `LogSoftmax` output):
    /// `-z[label]` per row, stax's examples' `-mean(sum(z * one_hot))`; gradient
    /// `-one_hot(label) / n`.
    NegLogLikelihood,
}

impl IndexLoss {
    /// The op code the loss kernel switches on.
    pub fn code(self) -> i32 {
        match self {
            IndexLoss::SoftmaxCrossEntropy => 0,
            IndexLoss::NegLogLikelihood => 1,
        }
    }
}
