//! Data sets, loaders, the training loop, per-step memory reports, the static memory plan and
//! its exports.

pub mod data;
pub mod error;
pub mod export;
pub mod plan;
pub mod report;
pub mod staging;
pub mod trainer;

pub use error::TrainError;
pub use plan::{MemoryPlan, max_batch_that_fits};
pub use report::{
    CategoryBytes, EvalReport, HostReport, MemoryReport, PoolReport, StepOom, StepReport,
};
pub use staging::HostStaging;
pub use trainer::{Phase, Trainer, place_batch, summarize};
