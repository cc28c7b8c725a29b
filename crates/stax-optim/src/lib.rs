//! Optimizers for stax-rs: [`Adam`], an optax-style `(init, update)` pair whose update runs as
//! one fused, in-place kernel per parameter tensor (no temporary the size of the parameters).
//!
//! ```
//! use stax_optim::Adam;
//! let adam = Adam::new(1e-3);
//! assert_eq!((adam.b1, adam.b2, adam.eps), (0.9, 0.999, 1e-8));
//! ```

pub mod adam;
pub mod error;

pub use adam::{Adam, AdamState};
pub use error::OptimError;
