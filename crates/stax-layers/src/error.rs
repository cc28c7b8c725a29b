//! `LayerError`: the one error type of `stax-layers`.
//!
//! Every variant names where it happened: `path` is the layer's key path in the model
//! (`2.conv`; filled in by the combinators as the error passes up through them, empty for a
//! layer used alone) and `layer` what the layer is (`conv(64, 3x3, stride 1x1, SAME)`).

use stax_tensor::{Key, TensorError};

/// What can go wrong when a layer is initialized, applied or differentiated.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    /// The input shape does not fit the layer (raised by `output_shape`, so by `init` and
    /// `apply` before any memory is touched).
    #[error("{}{layer}: {reason} (input shape {input})", at(path))]
    Shape {
        /// The layer's path in the model (`2.conv`).
        path: String,
        /// The layer, e.g. `conv(64, 3x3, stride 1x1, SAME)`.
        layer: String,
        /// What was expected.
        reason: String,
        /// The shape (or tree of shapes) it got.
        input: String,
    },
    /// Parameters, residuals or gradients do not have the structure or shapes the layer made.
    #[error("{}{layer}: {what} do not match the layer: {reason}", at(path))]
    Mismatch {
        /// The layer's path in the model.
        path: String,
        /// The layer.
        layer: String,
        /// `parameters`, `residuals` or `output gradients`.
        what: &'static str,
        /// What differs.
        reason: String,
    },
    /// A hyper-parameter is invalid (zero output size, zero-size kernel, zero stride, a
    /// Dropout keep rate outside (0, 1]).
    #[error("{}{layer}: invalid configuration: {reason}", at(path))]
    Config {
        /// The layer's path in the model.
        path: String,
        /// The layer.
        layer: String,
        /// What is wrong.
        reason: String,
    },
    /// A gradient sink refused a layer's gradients, or did not get one for a parameter.
    #[error("{}gradients: {reason}", at(path))]
    Gradients {
        /// The layer's (or parameter's) path.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// A tensor op inside a layer failed.
    #[error("{}{source}", at(path))]
    Tensor {
        /// The layer's path in the model.
        path: String,
        /// The op's error.
        source: TensorError,
    },
}

fn at(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!("{path}: ")
    }
}

impl From<TensorError> for LayerError {
    fn from(source: TensorError) -> Self {
        LayerError::Tensor {
            path: String::new(),
            source,
        }
    }
}

impl LayerError {
    /// The error as seen from the parent combinator: `key` is put in front of its path.
    pub fn at(mut self, key: Key) -> LayerError {
        let path = match &mut self {
            LayerError::Shape { path, .. }
            | LayerError::Mismatch { path, .. }
            | LayerError::Config { path, .. }
            | LayerError::Gradients { path, .. }
            | LayerError::Tensor { path, .. } => path,
        };
        *path = if path.is_empty() {
            key.to_string()
        } else {
            format!("{key}/{path}")
        };
        self
    }

    /// The layer path the error names (`2.conv`; empty for a layer used alone).
    pub fn path(&self) -> &str {
        match self {
            LayerError::Shape { path, .. }
            | LayerError::Mismatch { path, .. }
            | LayerError::Config { path, .. }
            | LayerError::Gradients { path, .. }
            | LayerError::Tensor { path, .. } => path,
        }
    }

    /// The tensor error inside, if this is one.
    pub fn tensor(&self) -> Option<&TensorError> {
        match self {
            LayerError::Tensor { source, .. } => Some(source),
            _ => None,
        }
    }
}
