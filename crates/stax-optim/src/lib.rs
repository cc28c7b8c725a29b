//! Optimizers for stax-rs: an [`Optimizer`] is written per parameter tensor and lifted to
//! whole parameter trees once, as `jax.example_libraries.optimizers`'s `@optimizer` does.
//! [`Adam`] is the first, with optax's semantics; its update runs as one fused, in-place
//! kernel per parameter tensor (no temporary the size of the parameters).
//!
//! The crate depends on `stax-tensor` only: parameters and gradients are
//! [`stax_tensor::Params`] trees, and the state is an [`OptState`] tree named by the same paths.
//!
//! ```
//! use stax_optim::{Adam, Optimizer};
//! use stax_tensor::{BackendOptions, Category, Device, Tensor, Tree};
//! let cpu = Device::Cpu.open(&BackendOptions::default())?;
//! let p = Tensor::from_slice(&cpu, &[1.0, 2.0], [2], Category::Parameter)?;
//! let mut params = Tree::fields([("w", p)]);
//! let adam = Adam::new(0.1);
//! let mut state = adam.init(&params)?;
//! let g = Tree::fields([("w", Tensor::from_slice(&cpu, &[0.5, -0.5], [2], Category::Gradient)?)]);
//! adam.update(&mut state, &g, &mut params)?;
//! // the first Adam step moves every coordinate by lr against the gradient's sign
//! let w = params.leaves()[0].to_vec()?;
//! assert!((w[0] - 0.9).abs() < 1e-6 && (w[1] - 2.1).abs() < 1e-6);
//! assert_eq!((state.count, state.field("mu").len()), (1, 1));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod adam;
pub mod error;
pub mod optimizer;

pub use adam::Adam;
pub use error::OptimError;
pub use optimizer::{OptState, Optimizer};
