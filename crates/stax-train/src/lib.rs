//! Data sets, loaders, the training loop and per-step memory reports.

pub mod data;
pub mod error;
pub mod report;
pub mod trainer;

pub use error::TrainError;
pub use report::{CategoryBytes, EvalReport, MemoryReport, StepReport};
pub use trainer::{Trainer, place_batch, summarize};
