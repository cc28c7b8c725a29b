//! `OptimError`: the one error type of `stax-optim`.

use stax_tensor::{StructureError, TensorError};

/// What can go wrong in an optimizer.
#[derive(Debug, thiserror::Error)]
pub enum OptimError {
    /// Gradients or state do not have the parameters' tree structure.
    #[error("{optimizer}: {what} do not match the parameters' structure: {source}")]
    Structure {
        /// The optimizer (`adam`).
        optimizer: &'static str,
        /// Which tree differs (`gradients` or `optimizer state`).
        what: &'static str,
        /// Where they differ.
        source: StructureError,
    },
    /// A gradient or state tensor does not fit its parameter (shape, dtype, device), or a
    /// tensor that is written in place shares its buffer.
    #[error("{optimizer}: {path}: {source}")]
    Leaf {
        /// The optimizer.
        optimizer: &'static str,
        /// The parameter's path (`2.conv/w`).
        path: String,
        /// What is wrong.
        source: TensorError,
    },
    /// A hyper-parameter is outside its valid range.
    #[error("{optimizer}: invalid hyper-parameter {name} = {value}: {reason}")]
    Hyper {
        /// The optimizer.
        optimizer: &'static str,
        /// Its name (`lr`, `b1`, `b2`, `eps`).
        name: &'static str,
        /// Its value.
        value: f32,
        /// The valid range.
        reason: &'static str,
    },
    /// The step counter would overflow.
    #[error("{optimizer}: step count overflow")]
    CountOverflow {
        /// The optimizer.
        optimizer: &'static str,
    },
    /// A tensor op failed.
    #[error(transparent)]
    Tensor(#[from] TensorError),
}

impl OptimError {
    /// The tensor error inside, if any.
    pub fn tensor(&self) -> Option<&TensorError> {
        match self {
            OptimError::Tensor(t) | OptimError::Leaf { source: t, .. } => Some(t),
            _ => None,
        }
    }
}
