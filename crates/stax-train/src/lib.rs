//! Data sets, loaders, the training loop, per-step memory reports, the static memory plan and
//! its exports.

pub mod checkpoint;
pub mod data;
pub mod distributed;
pub mod error;
pub mod export;
pub mod loss_scale;
pub mod plan;
pub mod prefetch;
pub mod report;
pub mod seed;
pub mod staging;
pub mod step;
pub mod trainer;

pub use checkpoint::Checkpoint;
pub use distributed::{CommReport, DataParallel, Rendezvous};
pub use error::{CheckpointProblem, TrainError};
pub use loss_scale::{DynamicLossScale, LossScaleStep};
pub use plan::{Feed, MemoryPlan, max_batch_that_fits};
pub use prefetch::Prefetcher;
pub use report::{
    CategoryBytes, EvalReport, HostReport, MemoryReport, PoolReport, StepOom, StepReport,
};
pub use staging::{HostBatch, HostStaging, Labels, Layout};
pub use step::Phase;
pub use trainer::{KindTime, StepProfile, Trainer, place_batch, summarize};
