//! stax-style layers for stax-rs, mirroring `jax.example_libraries.stax`.
//!
//! A layer is a small value with `init(rng, input_shape) -> (output_shape, params)` and
//! `apply(params, inputs)`, plus an explicit vector-Jacobian product `vjp` for the backward pass.
//! Parameters live outside the layer ([`Params`]), as in stax. [`serial!`] composes layers.
//!
//! ```
//! use stax_layers::{serial, Conv, Dense, Flatten, Layer, Padding, Relu};
//! use stax_tensor::Shape;
//! let model = serial![Conv::new(8, (3, 3), (1, 1), Padding::Same), Relu, Flatten, Dense(2)];
//! let out = model.output_shape(&Shape::new([4, 28, 28, 3])).unwrap();
//! assert_eq!(out, Shape::new([4, 2]));
//! ```

pub mod conv;
pub mod dense;
pub mod error;
pub mod flatten;
pub mod init;
pub mod layer;
pub mod loss;
pub mod relu;
pub mod serial;

pub use conv::Conv;
pub use dense::Dense;
pub use error::LayerError;
pub use flatten::Flatten;
pub use init::Rng;
pub use layer::{Layer, ParamSpec, StepContext};
pub use loss::softmax_cross_entropy;
pub use relu::Relu;
pub use serial::Serial;
pub use stax_tensor::Padding;
pub use stax_tensor::{Grads, Params};
