//! stax-rs: JAX's `stax` CNN and its training loop in Rust, with exact and minimal memory.
//!
//! This facade re-exports the five crates: [`stax_alloc`] (allocator and accounting),
//! [`stax_tensor`] (tensors, devices, CPU and CUDA backends), [`stax_layers`] (stax layers and
//! the loss), [`stax_optim`] (Adam) and [`stax_train`] (data, loop, reports).
//!
//! The README follows; its library example runs as a doctest.
#![doc = include_str!("../README.md")]

pub use stax_alloc as alloc;
pub use stax_layers as layers;
pub use stax_optim as optim;
pub use stax_tensor as tensor;
pub use stax_train as train;

pub use stax_layers::models;
pub use stax_layers::{
    Activation, Collect, Conv, Cx, Dense, Elementwise, FanInConcat, FanInSum, FanOut, Flatten,
    Identity, Layer, MaxPool, Padding, Parallel, ParamSource, Params, Relu, Rng, Serial,
    SoftmaxCrossEntropy, Tanh, init_params, parallel, serial,
};
pub use stax_layers::{
    AvgPool, AxisSoftmax, BatchNorm, ConvDims, ConvTranspose, Dropout, Elu, Exp, Gelu, GeneralConv,
    GeneralConvTranspose, LeakyRelu, LogSoftmax, Mode, NegLogLikelihood, Remat, Selu,
    ShapeDependent, Sigmoid, Softmax, SoftmaxCrossEntropyWithIntegerLabels, Softplus, SumPool,
};
pub use stax_optim::{Adam, Optimizer};
pub use stax_tensor::{
    Backend, BackendOptions, Category, DType, Device, Grads, Precision, Shape, Strategy, Tensor,
    TensorError, Tree,
};
