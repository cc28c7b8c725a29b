//! Data sets, loaders, the training loop and per-step memory reports.

pub mod data;
pub mod error;

pub use error::TrainError;
