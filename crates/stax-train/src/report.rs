//! Per-step memory and timing reports.
//!
//! [`MemoryReport`] is the per-step breakdown: the allocator strategy in effect, device bytes
//! by category (live and at the step's peak), the allocator's cache, a stream-ordered pool's
//! own cache (`async`: what the pool holds beyond the live allocations), what lives outside the
//! allocator (driver-used minus reserved minus the pool's cache), and host memory (pageable
//! staging and, on CUDA, pinned staging) in the same report. Its `Display` is the short
//! per-step line; [`MemoryReport::breakdown`] is the full table; the JSON (serde) has
//! everything. [`StepOom`] is a step's out-of-memory diagnosis.

use serde::Serialize;
pub(crate) use stax_alloc::group_digits as group;
use stax_alloc::{Allocator, Category, OomReport, PoolUsage, Stats, human_bytes};
use stax_tensor::{Backend, TensorError};
use std::fmt::{self, Write as _};

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
    /// The backend's device (`cpu`, `cuda:0`).
    pub device: String,
    /// The allocator strategy with every parameter in effect
    /// ([`stax_alloc::Strategy::in_effect`]: `caching`, `bfc:fraction=0.75`,
    /// `async:release_threshold=unlimited`).
    pub allocator: String,
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
    /// A stream-ordered pool's own figures (`async`: `cuMemPoolGetAttribute`'s reserved and
    /// used bytes); `None` for the other strategies.
    pub pool: Option<PoolUsage>,
    /// What a stream-ordered pool holds beyond the live allocations (`pool.reserved -
    /// reserved`: the pool's cache, `pool.reserved - pool.used`, and its rounding of live
    /// allocations); `None` without a pool.
    pub pool_cache: Option<u64>,
    /// Driver-used minus reserved minus the pool's cache: context, loaded modules, library
    /// handles, anything allocated outside our allocator; `None` on the host.
    pub outside_allocator: Option<u64>,
    /// Per-category breakdown.
    pub by_category: Vec<CategoryBytes>,
    /// Host memory beside it: pageable staging and (CUDA) pinned staging.
    pub host: HostReport,
    /// A data-parallel rank's communication (buckets, the library's own memory); `None` for
    /// a single process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comm: Option<crate::CommReport>,
}

/// One allocator's figures in a report (host memory). All sizes are bytes.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PoolReport {
    /// Requested bytes live now.
    pub live: u64,
    /// Highest requested bytes live since the previous report.
    pub peak: u64,
    /// Bytes the allocator holds from its backend.
    pub reserved: u64,
    /// Reserved bytes not allocated.
    pub cached: u64,
    /// Per-category live bytes and bytes at the peak.
    pub by_category: Vec<CategoryBytes>,
}

impl PoolReport {
    /// Reads `allocator`'s counters now.
    pub fn read(allocator: &Allocator) -> PoolReport {
        let s = allocator.stats();
        PoolReport {
            live: s.requested,
            peak: s.peak_requested,
            reserved: s.reserved,
            cached: s.cached,
            by_category: categories(&s),
        }
    }
}

/// Host memory of a step: the pageable buffers batches are staged in and, on CUDA, the pinned
/// buffers of the transfers.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct HostReport {
    /// Pageable host staging (the trainer's [`crate::HostStaging`]).
    pub pageable: PoolReport,
    /// Pinned host staging of the backend ([`Backend::staging_allocator`]); None without one.
    pub pinned: Option<PoolReport>,
}

fn categories(s: &Stats) -> Vec<CategoryBytes> {
    Category::ALL
        .iter()
        .map(|&c| CategoryBytes {
            category: c,
            live: s.by_category[c.index()].live,
            at_peak: s.peak_by_category[c.index()],
        })
        .collect()
}

/// `"1.31 GB"`: [`human_bytes`] without the exact count.
pub(crate) fn short(b: u64) -> String {
    human_bytes(b)
        .split(" (")
        .next()
        .unwrap_or_default()
        .to_string()
}

impl MemoryReport {
    /// Reads the allocator's counters, the driver's figure, a stream-ordered pool's own
    /// figures and the backend's pinned staging now (host pageable staging is added by
    /// [`MemoryReport::with_host`]).
    ///
    /// # Errors
    /// Driver errors from [`Backend::driver_memory`] and the pool query.
    pub fn read(backend: &dyn Backend) -> Result<MemoryReport, TensorError> {
        let device = backend.device().to_string();
        let driver = backend.driver_memory()?;
        Self::from_parts(
            device,
            backend.allocator(),
            driver,
            backend.staging_allocator(),
        )
    }

    /// The report of `allocator` on `device`, with the driver's `(free, total)` figure and the
    /// pinned staging allocator when there are.
    fn from_parts(
        device: String,
        allocator: &Allocator,
        driver: Option<(u64, u64)>,
        pinned: Option<&std::sync::Arc<Allocator>>,
    ) -> Result<MemoryReport, TensorError> {
        let s: Stats = allocator.stats();
        let pool = allocator.backend().pool_usage()?;
        let pool_cache = pool.map(|p| p.reserved.saturating_sub(s.reserved));
        let driver_used = driver.map(|(free, total)| total.saturating_sub(free));
        let held = s.reserved + pool_cache.unwrap_or(0);
        let by_category = categories(&s);
        let host = HostReport {
            pageable: PoolReport::default(),
            pinned: pinned.map(|a| PoolReport::read(a)),
        };
        Ok(MemoryReport {
            device,
            allocator: allocator.strategy().in_effect(),
            live: s.requested,
            peak: s.peak_requested,
            workspace_peak: s.by_category[Category::Workspace.index()].peak,
            reserved: s.reserved,
            cached: s.cached,
            driver_used,
            pool,
            pool_cache,
            outside_allocator: driver_used.map(|u| u.saturating_sub(held)),
            by_category,
            host,
            comm: None,
        })
    }

    /// The report with `pageable`'s figures as its pageable host memory.
    pub fn with_host(mut self, pageable: &Allocator) -> MemoryReport {
        self.host.pageable = PoolReport::read(pageable);
        self
    }

    /// Requested bytes of `category` live at the step's peak.
    pub fn at_peak(&self, category: Category) -> u64 {
        self.by_category
            .iter()
            .find(|c| c.category == category)
            .map_or(0, |c| c.at_peak)
    }

    /// The full breakdown, one line per figure: the allocator strategy, device bytes by
    /// category (live after the step and at its peak), the allocator's cache, a stream-ordered
    /// pool's cache, what lives outside the allocator, and host memory (pageable and pinned).
    pub fn breakdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "  allocator {} on {}", self.allocator, self.device);
        let row = |o: &mut String, what: &str, live: u64, at_peak: Option<u64>| {
            let peak = at_peak.map_or(String::new(), |p| format!("{:>28}", group(p)));
            let _ = writeln!(o, "  {what:<24}{:>28}{peak}", group(live));
        };
        let head = format!("{} (bytes)", self.device);
        let _ = writeln!(out, "  {head:<24}{:>28}{:>28}", "live", "at peak");
        for c in &self.by_category {
            row(&mut out, c.category.name(), c.live, Some(c.at_peak));
        }
        row(&mut out, "total requested", self.live, Some(self.peak));
        row(&mut out, "allocator cache", self.cached, None);
        row(&mut out, "reserved", self.reserved, None);
        if let (Some(cache), Some(p)) = (self.pool_cache, self.pool) {
            row(&mut out, "pool cache", cache, None);
            let _ = writeln!(
                out,
                "  {:<24}{:>28}   (used {})",
                "pool reserved",
                group(p.reserved),
                group(p.used)
            );
        }
        match (self.driver_used, self.outside_allocator) {
            (Some(u), Some(o)) => {
                row(&mut out, "outside the allocator", o, None);
                row(&mut out, "driver used", u, None);
            }
            _ => {
                let _ = writeln!(out, "  {:<24}{:>28}", "outside the allocator", "n/a (host)");
            }
        }
        let pools = [
            ("host pageable", Some(&self.host.pageable)),
            ("host pinned", self.host.pinned.as_ref()),
        ];
        for (what, pool) in pools {
            match pool {
                Some(p) => {
                    let _ = writeln!(
                        out,
                        "  {what:<24}{:>28}{:>28}   (reserved {}, cached {})",
                        group(p.live),
                        group(p.peak),
                        short(p.reserved),
                        short(p.cached)
                    );
                }
                None => {
                    let _ = writeln!(out, "  {what:<24}{:>28}", "none");
                }
            }
        }
        if let Some(comm) = &self.comm {
            let _ = write!(out, "{comm}");
        }
        out
    }
}

impl fmt::Display for MemoryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "live {} | peak {} | workspace {} | reserved {}",
            short(self.live),
            short(self.peak),
            short(self.workspace_peak),
            short(self.reserved)
        )?;
        if let Some(c) = self.pool_cache {
            write!(f, " | pool cache {}", short(c))?;
        }
        if let Some(u) = self.driver_used {
            write!(f, " | driver used {}", short(u))?;
        }
        let host = self.host.pageable.peak + self.host.pinned.as_ref().map_or(0, |p| p.peak);
        write!(f, " | host {} | allocator {}", short(host), self.allocator)?;
        match &self.comm {
            Some(c) => write!(
                f,
                " | {} rank {}/{}: {} bucket(s) {} in place{}",
                c.library,
                c.rank,
                c.world,
                c.buckets.len(),
                short(c.buckets.iter().map(|b| b.bytes).sum()),
                c.device_bytes
                    .map_or(String::new(), |d| format!(", {} outside", short(d)))
            ),
            None => Ok(()),
        }
    }
}

/// Why a training step ran out of memory, in numbers: the failed request (the allocator's
/// diagnosis), which buffer of the plan it was, the breakdown when it failed, the plan's peak
/// for this batch and the largest batch that fits. Parameters and optimizer state are those
/// of `last_finished_step`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepOom {
    /// The step that failed, from 1.
    pub step: u64,
    /// Its batch size.
    pub batch: usize,
    /// The request that failed and the allocator's state then.
    pub request: OomReport,
    /// The plan's name for the failed buffer (e.g. `conv2.output`), when the step's events so
    /// far matched the plan.
    pub buffer: Option<String>,
    /// The breakdown when it failed (peaks are the step's up to the failure).
    pub memory: MemoryReport,
    /// The plan's peak for this batch, in bytes.
    pub planned_peak: Option<u64>,
    /// The largest batch that fits this allocator's memory, by the plan.
    pub max_batch: Option<usize>,
    /// The last step that finished (its parameters and optimizer state are kept).
    pub last_finished_step: u64,
    /// Whether it failed at the trainer's set-up, reserving the step's memory ahead
    /// (the trainer's rehearsal of the step), before any step ran.
    pub at_set_up: bool,
}

impl fmt::Display for StepOom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = &self.request;
        let (step, batch) = (self.step, self.batch);
        match self.at_set_up {
            true => write!(
                f,
                "train: set-up (reserving step {step}'s memory, batch {batch}) ran out of memory \
                 allocating "
            )?,
            false => write!(
                f,
                "train: step {step} (batch {batch}) ran out of memory allocating "
            )?,
        }
        match &self.buffer {
            Some(b) => write!(f, "{b} ({}, {})", r.category, short(r.requested))?,
            None => write!(f, "{} of {}", short(r.requested), r.category)?,
        }
        writeln!(f)?;
        match (self.max_batch, self.planned_peak) {
            (Some(0), _) => writeln!(
                f,
                "  no batch fits: not even one example's step fits beside the parameters and \
                 optimizer state"
            )?,
            (Some(m), Some(p)) => writeln!(
                f,
                "  the largest batch that fits is {m} (this batch's planned peak: {})",
                short(p)
            )?,
            (Some(m), None) => writeln!(f, "  the largest batch that fits is {m}")?,
            (None, _) => writeln!(
                f,
                "  the largest batch that fits is unknown (no memory size)"
            )?,
        }
        writeln!(f, "  request: {}", r.to_string().replace('\n', "\n  "))?;
        writeln!(
            f,
            "  memory after the failed step unwound (live) and at its highest point (at peak):"
        )?;
        write!(f, "{}", self.memory.breakdown())?;
        match self.last_finished_step {
            0 => write!(f, "  parameters and optimizer state are as initialized"),
            n => write!(f, "  parameters and optimizer state are those of step {n}"),
        }
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
    /// Wall time from the step's start until its loss (the first micro-batch's) was on the
    /// host, ms: the forward pass and the loss as the device ran them, since the host waits
    /// for the loss before the backward pass ([`crate::TrainError::NonFiniteLoss`]).
    pub loss_ms: f64,
    /// Wall time from the step's start until the host had queued all of the step's work,
    /// ms. `step_ms - queued_ms` is what came after: gathering the next batch where the loop
    /// prefetches, and waiting for the device. Near zero, the host's issuing of the backward
    /// pass and the update, not the device, bounds the step (a "CPU-bound" step).
    pub queued_ms: f64,
    /// Memory counters of the step.
    pub memory: MemoryReport,
    /// Bytes of the parameters and the optimizer's state by dtype after the step (the
    /// plan's [`crate::MemoryPlan::state_by_dtype`]).
    pub state_by_dtype: crate::plan::DTypeBytes,
    /// The loss scale the step used, whether it was skipped (gradients not all finite:
    /// nothing updated) and the next step's scale; `None` without loss scaling.
    pub loss_scale: Option<crate::LossScaleStep>,
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

impl fmt::Display for EvalReport {
    /// `loss 0.2638, accuracy 91.60% (500 images)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (loss, percent) = (self.loss, self.accuracy * 100.0);
        write!(
            f,
            "loss {loss:.4}, accuracy {percent:.2}% ({} images)",
            self.examples
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stax_alloc::{RawMemory, SimMemory, Strategy};

    use std::sync::Arc;

    const MIB: u64 = 1 << 20;

    /// The report of `alloc` on `sim`, with the driver's figures as the sim has them plus
    /// `context` bytes the driver uses itself (context, modules, handles).
    fn report(alloc: &Allocator, sim: &SimMemory, context: u64) -> MemoryReport {
        let driver = Some((sim.free_bytes().unwrap() - context, sim.capacity().unwrap()));
        MemoryReport::from_parts("sim".into(), alloc, driver, None).unwrap()
    }

    /// Under `async` the pool keeps what is freed: that is the pool's cache in the report, not
    /// memory outside the allocator.
    #[test]
    fn the_pools_cache_is_not_outside_the_allocator() {
        let sim = Arc::new(SimMemory::new(1 << 30, 2 << 20).with_stream_ordered(true));
        let strategy = Strategy::Async {
            release_threshold: 1 << 30,
        };
        let alloc = Allocator::new(sim.clone(), strategy).unwrap();
        let mut blocks: Vec<_> = (0..3)
            .map(|_| {
                alloc
                    .allocate((100 * MIB) as usize, Category::Activation)
                    .unwrap()
            })
            .collect();
        blocks.truncate(1); // two freed: the pool keeps them
        let r = report(&alloc, &sim, 50 * MIB);
        assert_eq!(r.reserved, 100 * MIB);
        assert_eq!(r.driver_used, Some(350 * MIB));
        assert_eq!(
            r.pool,
            Some(PoolUsage {
                reserved: 300 * MIB,
                used: 100 * MIB
            })
        );
        assert_eq!(r.pool_cache, Some(200 * MIB));
        assert_eq!(
            r.outside_allocator,
            Some(50 * MIB),
            "the driver's own 50 MiB only"
        );
        assert_eq!(r.allocator, "async:release_threshold=1GiB");
        assert!(r.to_string().contains(" | pool cache 209.72 MB | "), "{r}");
        let b = r.breakdown();
        assert!(b.contains("pool cache") && b.contains("209,715,200"), "{b}");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["pool_cache"], 200 * MIB);
        assert_eq!(json["outside_allocator"], 50 * MIB);
        drop(blocks);
    }

    /// Every report names the strategy and its parameters in effect: the line, the breakdown
    /// and the JSON.
    #[test]
    fn every_report_names_the_strategy_in_effect() {
        for (strategy, shown) in [
            (Strategy::Caching, "caching"),
            (Strategy::Expandable, "expandable"),
            (Strategy::Bfc { fraction: 0.5 }, "bfc:fraction=0.5"),
            (Strategy::Platform, "platform"),
        ] {
            let sim = Arc::new(SimMemory::new(1 << 30, 2 << 20));
            let alloc = Allocator::new(sim.clone(), strategy).unwrap();
            let r = report(&alloc, &sim, 0);
            assert_eq!(r.allocator, shown);
            assert_eq!((r.pool, r.pool_cache), (None, None));
            assert!(
                r.to_string().ends_with(&format!(" | allocator {shown}")),
                "{r}"
            );
            assert!(
                r.breakdown()
                    .starts_with(&format!("  allocator {shown} on sim\n"))
            );
            assert_eq!(serde_json::to_value(&r).unwrap()["allocator"], shown);
        }
    }
}
