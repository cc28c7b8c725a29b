//! `OptimError`: the one error type of `stax-optim`.

use stax_tensor::TensorError;

/// What can go wrong in an optimizer.
#[derive(Debug, thiserror::Error)]
pub enum OptimError {
    /// Gradients, state and parameters do not have the same structure and shapes.
    #[error("adam: {what} do not match the parameters' structure and shapes")]
    Structure {
        /// Which tree differs (`gradients` or `optimizer state`).
        what: &'static str,
    },
    /// A hyper-parameter is outside its valid range.
    #[error("adam: invalid hyper-parameter {name} = {value}: {reason}")]
    Hyper {
        /// Its name (`lr`, `b1`, `b2`, `eps`).
        name: &'static str,
        /// Its value.
        value: f32,
        /// The valid range.
        reason: &'static str,
    },
    /// The step counter would overflow.
    #[error("adam: step count overflow")]
    CountOverflow,
    /// A tensor op failed.
    #[error(transparent)]
    Tensor(#[from] TensorError),
}
