//! stax-style layers for stax-rs, mirroring `jax.example_libraries.stax`.
//!
//! A layer is a small value ([`Layer`]) with shapes first (`output_shape`, `param_specs`),
//! then `apply(params, inputs) -> (outputs, residuals)` and its explicit vector-Jacobian
//! product `vjp`. Inputs and outputs are trees of tensors, so [`serial!`], [`parallel!`] and
//! the fan combinators build graphs. Parameters live outside the layer ([`Params`]), made by
//! one walk over the layer's specs ([`init_params`]), as in stax.
//!
//! ```
//! use stax_layers::{serial, Conv, Dense, Flatten, Layer, Padding, Relu};
//! use stax_tensor::{Shape, Tree};
//! let model = serial![Conv::new(8, (3, 3), (1, 1), Padding::Same), Relu, Flatten, Dense(2)];
//! let out = model.output_shape(&Tree::leaf(Shape::new([4, 28, 28, 3]))).unwrap();
//! assert_eq!(out, Tree::leaf(Shape::new([4, 2])));
//! // every parameter is named by its path
//! let specs = model.param_specs(&Tree::leaf(Shape::new([4, 28, 28, 3]))).unwrap();
//! let paths: Vec<String> = specs.paths().iter().map(|(p, _)| p.to_string()).collect();
//! assert_eq!(paths, ["0.conv/w", "0.conv/b", "3.dense/w", "3.dense/b"]);
//! ```

pub mod activation;
pub mod batch_norm;
pub mod conv;
pub mod conv_dims;
pub mod conv_transpose;
pub mod cx;
pub mod dense;
pub mod dropout;
pub mod error;
pub mod fan;
pub mod flatten;
mod fold;
mod fuse;
pub mod init;
pub mod layer;
pub mod loss;
pub mod models;
pub mod parallel;
pub mod params;
pub mod pool;
pub mod precision;
pub mod profile;
pub mod remat;
pub mod serial;
pub mod shape_dependent;
pub mod sink;
pub mod softmax;

pub use activation::{Activation, Elementwise, Relu, Saves, Tanh};
pub use batch_norm::BatchNorm;
pub use conv::{Conv, GeneralConv};
pub use conv_dims::{ConvConfig, ConvDims};
pub use conv_transpose::{ConvTranspose, GeneralConvTranspose};
pub use cx::{Cx, Mode, Policy};
pub use dense::Dense;
pub use error::LayerError;
pub use fan::{FanInConcat, FanInSum, FanOut};
pub use flatten::Flatten;
pub use init::Rng;
pub use layer::{DySums, Init, Layer, ParamSpec, Residuals, Saved, Shapes, Value};
pub use loss::{Loss, SoftmaxCrossEntropy};
pub use parallel::{Identity, Parallel};
pub use params::{ParamSource, init_params};
pub use pool::{AvgPool, MaxPool, Pool, SumPool};
pub use precision::{Mixed, compute_copy};
pub use profile::{LayerTime, Profile, Profiler};
pub use remat::Remat;
pub use serial::Serial;
pub use sink::{Collect, GradSink, InBackward, Updates};
pub use stax_tensor::{Grads, Padding, Params};

pub use activation::{Alpha, Elu, Exp, Gelu, LeakyRelu, Selu, Sigmoid, Softplus};
pub use dropout::Dropout;
pub use loss::{IntegerLabels, NegLogLikelihood, SoftmaxCrossEntropyWithIntegerLabels};
pub use shape_dependent::ShapeDependent;
pub use softmax::{AxisSoftmax, LogSoftmax, Softmax, SoftmaxKind};
