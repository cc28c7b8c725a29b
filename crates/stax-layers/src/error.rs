//! `LayerError`: the one error type of `stax-layers`.

use stax_tensor::{Shape, TensorError};

/// What can go wrong when a layer is initialized, applied or differentiated.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    /// The input shape does not fit the layer (raised by `init`/`output_shape`, before any
    /// memory is touched).
    #[error("{layer}: {reason} (input shape {input})")]
    Shape {
        /// The layer, e.g. `conv(64, 3x3, SAME)`.
        layer: String,
        /// What was expected.
        reason: String,
        /// The shape it got.
        input: Shape,
    },
    /// Parameters do not have the structure or shapes the layer made in `init`.
    #[error("{layer}: parameters do not match the layer: {reason}")]
    Params {
        /// The layer.
        layer: String,
        /// What differs.
        reason: String,
    },
    /// `vjp` was called without a matching training-mode `apply`.
    #[error(
        "{layer}: backward pass without saved forward state (apply in training mode first, and run vjp in reverse order)"
    )]
    NothingSaved {
        /// The layer.
        layer: String,
    },
    /// A hyper-parameter is invalid (zero output size, zero-size kernel, zero stride).
    #[error("{layer}: invalid configuration: {reason}")]
    Config {
        /// The layer.
        layer: String,
        /// What is wrong.
        reason: String,
    },
    /// A tensor op failed.
    #[error(transparent)]
    Tensor(#[from] TensorError),
}
