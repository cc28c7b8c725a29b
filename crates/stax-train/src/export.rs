//! Exports of memory timelines: Chrome trace / Perfetto JSON ([`perfetto`]) and an SVG plot of
//! one step stacked by category ([`plot`]).
//!
//! Both take a [`Timeline`](crate::plan::Timeline): a plan's step
//! ([`MemoryPlan::timeline`](crate::plan::MemoryPlan)) or a recorded run, each event named
//! after its buffer ([`NamedTrace::of`](crate::plan::NamedTrace::of)).

pub mod perfetto;
pub mod plot;

pub use perfetto::{perfetto_json, write_perfetto};
pub use plot::{StackedSeries, XAxis, stacked_series, write_svg};

use crate::TrainError;
use std::path::Path;

/// Wraps a write failure of an export as [`TrainError::Io`].
pub(crate) fn io_error(op: &'static str, path: &Path, message: impl ToString) -> TrainError {
    TrainError::Io {
        op,
        path: path.to_path_buf(),
        source: std::io::Error::other(message.to_string()),
    }
}
