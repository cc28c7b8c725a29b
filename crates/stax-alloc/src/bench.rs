//! Strategies measured on traces: what `cargo run --release --example alloc_bench` prints, one
//! [`BenchResult`] per trace and strategy.
//!
//! [`bench()`] replays a [`Trace`] (as [`crate::replay`] does: every alloc event allocates, every
//! free event drops, what is left live is freed at the end) `replays` times on one allocator,
//! timing each allocation alone, and reads: the peak of live (requested) bytes, the peak of
//! reserved bytes, the largest free block when live bytes peaked, the backend (driver) calls,
//! and the allocation latency percentiles. Running out of memory is a result (the strategy
//! did not survive the trace), not an error.
//!
//! ```
//! use std::sync::Arc;
//! use stax_alloc::{Allocator, SimMemory, Strategy, adversarial, bench};
//! let s = adversarial::scenario("pytorch-35901").unwrap();
//! let alloc = Allocator::new(Arc::new(SimMemory::new(s.capacity, 2 << 20)), Strategy::Caching)?;
//! let r = bench::bench(&s.trace, s.name, &alloc, 2)?;
//! assert_eq!(r.failure, None);
//! assert_eq!(r.peak_live, 1_288_490_189 + 10 * (20 << 20));
//! assert_eq!(r.backend_calls, 11, "the second replay is served from the cache");
//! assert_eq!(r.allocations, 2 * 12);
//! # Ok::<(), stax_alloc::AllocError>(())
//! ```

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use crate::{AllocError, Allocation, Allocator, RawMemory, Strategy, Trace, TraceOp};

/// One trace replayed under one strategy. Sizes in bytes, times in nanoseconds.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BenchResult {
    /// The trace's name.
    pub trace: String,
    /// The strategy, every parameter in effect ([`crate::Strategy::in_effect`]).
    pub strategy: String,
    /// The backend ([`crate::RawMemory::name`]).
    pub backend: String,
    /// Events in the trace.
    pub events: usize,
    /// How many times the trace was replayed.
    pub replays: usize,
    /// Allocations made, over every replay (up to a failure).
    pub allocations: u64,
    /// None when every replay ran to its end; else the out-of-memory diagnosis's first line.
    pub failure: Option<String>,
    /// Peak of live requested bytes.
    pub peak_live: u64,
    /// Peak of reserved bytes (what the strategy held from the backend).
    pub peak_reserved: u64,
    /// `peak_reserved / peak_live` (1.0 is perfect; 0 for an empty trace).
    pub reserved_per_peak: f64,
    /// The largest free block inside reserved memory when live bytes last reached their peak.
    pub largest_free_at_peak: u64,
    /// Backend calls (reserves, releases, maps, unmaps) during the replays.
    pub backend_calls: u64,
    /// Median latency of one allocation, timer overhead subtracted.
    pub alloc_ns_p50: u64,
    /// 99th percentile latency of one allocation, timer overhead subtracted.
    pub alloc_ns_p99: u64,
}

impl BenchResult {
    /// The row of a strategy that could not even start on the backend (`bfc` asking more
    /// than is free, `async` on a backend that is not a stream-ordered pool, ...): `error` as
    /// its failure, every figure 0.
    pub fn not_started(
        trace: &str,
        strategy: &Strategy,
        backend: &dyn RawMemory,
        events: usize,
        error: &AllocError,
    ) -> BenchResult {
        BenchResult {
            trace: trace.to_string(),
            strategy: strategy.in_effect(),
            backend: backend.name(),
            events,
            replays: 0,
            allocations: 0,
            failure: Some(format!("cannot start: {error}")),
            peak_live: 0,
            peak_reserved: 0,
            reserved_per_peak: 0.0,
            largest_free_at_peak: 0,
            backend_calls: 0,
            alloc_ns_p50: 0,
            alloc_ns_p99: 0,
        }
    }
}

/// The median cost, in ns, of reading the clock around nothing (`samples` times); what
/// [`bench()`] subtracts from every timed allocation.
pub fn timer_overhead_ns(samples: usize) -> u64 {
    let mut v: Vec<u64> = (0..samples.max(1))
        .map(|_| {
            let t = Instant::now();
            black_box(());
            t.elapsed().as_nanos() as u64
        })
        .collect();
    v.sort_unstable();
    percentile(&v, 0.5)
}

/// The `q`-quantile (0 to 1) of `sorted` (ascending), nearest rank; 0 when empty.
pub fn percentile(sorted: &[u64], q: f64) -> u64 {
    match sorted.len() {
        0 => 0,
        n => sorted[((n as f64 * q) as usize).min(n - 1)],
    }
}

/// Replays `trace` `replays` times (at least once) on `allocator`, measured (see the module
/// docs). `name` names the trace in the result. Peaks are over all replays (the allocator's
/// peaks are reset first); the replays stop at the first allocation that fails.
///
/// # Errors
/// [`AllocError::Trace`] for a free of an unknown id or an id allocated twice; backend errors
/// other than out of memory.
pub fn bench(
    trace: &Trace,
    name: &str,
    allocator: &Arc<Allocator>,
    replays: usize,
) -> Result<BenchResult, AllocError> {
    let overhead = timer_overhead_ns(1000);
    allocator.reset_peak();
    let before = allocator.stats().backend_calls();
    let mut times = Vec::new();
    let (mut peak_live, mut largest_free_at_peak) = (0u64, 0u64);
    let mut failure = None;
    'replays: for _ in 0..replays.max(1) {
        allocator.coalesce();
        let mut live: HashMap<u64, Allocation> = HashMap::new();
        let mut live_bytes = 0u64;
        for (i, e) in trace.events.iter().enumerate() {
            let err = |m: String| AllocError::Trace {
                op: "replay",
                line: i + 1,
                message: m,
            };
            match e.op {
                TraceOp::Alloc => {
                    let bytes =
                        usize::try_from(e.bytes).map_err(|_| err("size overflows".into()))?;
                    let t = Instant::now();
                    let a = allocator.allocate_on(bytes, e.category, e.stream);
                    times.push((t.elapsed().as_nanos() as u64).saturating_sub(overhead));
                    let a = match a {
                        Ok(a) => a,
                        Err(AllocError::OutOfMemory(r)) => {
                            let text = AllocError::OutOfMemory(r).to_string();
                            failure = Some(text.lines().next().unwrap_or_default().to_string());
                            break 'replays;
                        }
                        Err(e) => return Err(e),
                    };
                    if live.insert(e.id, a).is_some() {
                        return Err(err(format!("id {} allocated twice", e.id)));
                    }
                    live_bytes += bytes as u64;
                    if live_bytes >= peak_live {
                        peak_live = live_bytes;
                        largest_free_at_peak = allocator.stats().largest_free_block;
                    }
                }
                TraceOp::Free => match live.remove(&e.id) {
                    Some(a) => live_bytes -= a.bytes() as u64,
                    None => return Err(err(format!("free of unknown id {}", e.id))),
                },
            }
        }
    }
    let stats = allocator.stats();
    times.sort_unstable();
    Ok(BenchResult {
        trace: name.to_string(),
        strategy: allocator.strategy().in_effect(),
        backend: allocator.backend().name(),
        events: trace.events.len(),
        replays: replays.max(1),
        allocations: times.len() as u64,
        failure,
        peak_live,
        peak_reserved: stats.peak_reserved,
        reserved_per_peak: if peak_live == 0 {
            0.0
        } else {
            stats.peak_reserved as f64 / peak_live as f64
        },
        largest_free_at_peak,
        backend_calls: stats.backend_calls() - before,
        alloc_ns_p50: percentile(&times, 0.5),
        alloc_ns_p99: percentile(&times, 0.99),
    })
}
