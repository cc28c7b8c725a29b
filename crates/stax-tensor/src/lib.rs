//! Tensors with explicit placement, and the backends that compute on them.
//!
//! A [`Tensor`] is a shape, a dtype and a buffer allocated through the [`stax_alloc`] allocator
//! of the [`Backend`] that owns it. Placement is explicit, like `jax.device_put`:
//! [`Tensor::to`] copies to another backend, and an op whose operands live on different devices
//! returns [`TensorError::DeviceMismatch`]. The CPU backend ([`cpu::CpuBackend`]) is the test
//! oracle for the CUDA backend ([`cuda::CudaBackend`]).
//!
//! ```
//! use stax_tensor::{Device, BackendOptions, Tensor, Category};
//! let cpu = Device::Cpu.open(&BackendOptions::default()).unwrap();
//! let t = Tensor::from_slice(&cpu, &[1.0f32, -2.0, 3.0, -4.0], [2, 2], Category::Other).unwrap();
//! assert_eq!(t.to_vec().unwrap(), vec![1.0, -2.0, 3.0, -4.0]);
//! assert_eq!(t.bytes(), 16);
//! ```

pub mod backend;
mod checked;
pub mod codes;
pub mod collective;
pub mod cpu;
pub mod cuda;
pub mod device;
pub mod dtype;
pub mod error;
pub mod geometry;
pub mod interop;
pub mod mark;
pub mod op;
pub mod ops;
pub mod scalar;
pub mod shape;
pub mod tensor;
pub mod tree;
pub mod upload;

pub use backend::{
    AdamHyper, Backend, BackendId, BackendOptions, ConvOps, ElementwiseOps, LossOps, MatmulOps,
    MemoryOps, NormOps, OptimOps, Precision, class_dims, matmul_dims, softmax_xent_dims,
};
pub use checked::Checked;
pub use codes::{IndexLoss, SoftmaxKind};
pub use collective::{Collective, CommMemory};
pub use device::Device;
pub use dtype::{DType, Element, Float};
pub use error::TensorError;
pub use geometry::{Conv2dGeometry, ConvSpec, FilterLayout, Layout, Padding};
pub use mark::Mark;
pub use op::Alpha;
pub use op::{
    Activation, BinaryOp, ChannelGeometry, ConvPass, OpDesc, PoolKind, Saves, WorkspaceStep,
    dense_chunk_rows,
};
pub use shape::Shape;
pub use stax_alloc::{Allocator, Category, Name, Strategy, Tag};
pub use tensor::Tensor;
pub use tree::{Key, Path, StructureError, Tree};
pub use upload::Upload;

/// Parameters of a model: a tree of tensors whose paths (`2.conv/w`) name them everywhere.
pub type Params = Tree<Tensor>;

/// Gradients have the structure of the parameters they differentiate.
pub type Grads = Params;
