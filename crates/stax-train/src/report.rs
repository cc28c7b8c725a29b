//! Per-step memory and timing reports.

use serde::Serialize;
use stax_alloc::{Category, Stats, human_bytes};
use stax_tensor::{Backend, TensorError};
use std::fmt;

/// Live and peak bytes of one category, as the allocator counted them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CategoryBytes {
    /// The category.
    pub category: Category,
    /// Requested bytes live at the end of the step.
    pub live: u64,
    /// Requested bytes of this category live at the moment the step's total peak was reached.
    pub at_peak: u64,
}

/// Device (or host, on the CPU backend) memory of one step, in bytes, exact counts.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MemoryReport {
    /// Requested bytes live after the step: parameters, optimizer state, and what the caller
    /// placed on the device (the batch).
    pub live: u64,
    /// Highest requested bytes live at any moment of the step.
    pub peak: u64,
    /// Highest workspace bytes (im2col, cuDNN/cuBLAS scratch) live at any moment of the step.
    pub workspace_peak: u64,
    /// Bytes the allocator holds from the backend (segments), allocated or cached.
    pub reserved: u64,
    /// Reserved bytes not allocated: the allocator's cache.
    pub cached: u64,
    /// Bytes in use on the device as the driver reports them (total - free); `None` on the host.
    pub driver_used: Option<u64>,
    /// Driver-used minus reserved: context, loaded modules, library handles, anything allocated
    /// outside our allocator; `None` on the host.
    pub outside_allocator: Option<u64>,
    /// Per-category breakdown.
    pub by_category: Vec<CategoryBytes>,
}

impl MemoryReport {
    /// Reads the allocator's counters and the driver's figure now.
    ///
    /// # Errors
    /// Driver errors from [`Backend::driver_memory`].
    pub fn read(backend: &dyn Backend) -> Result<MemoryReport, TensorError> {
        let s: Stats = backend.allocator().stats();
        let driver_used = backend
            .driver_memory()?
            .map(|(free, total)| total.saturating_sub(free));
        let by_category = Category::ALL
            .iter()
            .map(|&c| CategoryBytes {
                category: c,
                live: s.by_category[c.index()].live,
                at_peak: s.peak_by_category[c.index()],
            })
            .collect();
        Ok(MemoryReport {
            live: s.requested,
            peak: s.peak_requested,
            workspace_peak: s.by_category[Category::Workspace.index()].peak,
            reserved: s.reserved,
            cached: s.cached,
            driver_used,
            outside_allocator: driver_used.map(|u| u.saturating_sub(s.reserved)),
            by_category,
        })
    }
}

impl fmt::Display for MemoryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let short = |b: u64| {
            human_bytes(b)
                .split(" (")
                .next()
                .unwrap_or_default()
                .to_string()
        };
        write!(
            f,
            "live {} | peak {} | workspace {} | reserved {}",
            short(self.live),
            short(self.peak),
            short(self.workspace_peak),
            short(self.reserved)
        )?;
        if let Some(u) = self.driver_used {
            write!(f, " | driver used {}", short(u))?;
        }
        Ok(())
    }
}

/// What one training step reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepReport {
    /// Step number, from 1.
    pub step: u64,
    /// Mean softmax cross-entropy of the batch, before the update.
    pub loss: f32,
    /// Wall time of the step including the final device synchronization, ms.
    pub step_ms: f64,
    /// Memory counters of the step.
    pub memory: MemoryReport,
}

/// Loss and accuracy on a held-out split.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct EvalReport {
    /// Mean softmax cross-entropy over all evaluated examples.
    pub loss: f32,
    /// Fraction of examples whose arg-max logit is the label, in [0, 1].
    pub accuracy: f32,
    /// Number of examples evaluated.
    pub examples: usize,
}
