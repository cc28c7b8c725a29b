//! `stax-alloc`: a device memory allocator with exact per-category accounting, usable on its
//! own. Strategies after PyTorch's CUDACachingAllocator (`caching`, the default), PyTorch's
//! `expandable_segments` (`expandable`, on virtual memory) and XLA's BFC allocator (`bfc`),
//! plus `platform` (no caching) and `async` (stream-ordered pool), all generic over a
//! [`RawMemory`] backend, so the core has no CUDA types: the CUDA backend lives in
//! `stax-tensor`, and [`SimMemory`] simulates a device (virtual memory and stream-ordered pool
//! included) for tests and benches. Every strategy states a bound on the memory it reserves,
//! tested on random and [`adversarial`] traces ([`Strategy`]). Every allocation carries a
//! [`Category`]; [`Stats`] are exact counters (requested, allocated, reserved, cached, peaks,
//! per category), [`Snapshot`] lists every segment and block, and out of memory is a typed
//! [`AllocError::OutOfMemory`] whose [`OomReport`] reads as a diagnosis. [`mod@bench`] measures
//! strategies on traces (what the `alloc_bench` example prints).
//!
//! # Trace format
//!
//! A [`Trace`] is written and read as JSON lines ([`Trace::write_jsonl`],
//! [`Trace::read_jsonl`]): one object per event, in the order the events happened, blank lines
//! ignored. Fields:
//!
//! | field | type | meaning |
//! | --- | --- | --- |
//! | `op` | `"alloc"` or `"free"` | the event |
//! | `id` | integer | the allocation's id, unique among live allocations; a free names the id of its allocation |
//! | `bytes` | integer | requested bytes (on a free: the allocation's) |
//! | `category` | `"parameter"`, `"optimizer_state"`, `"gradient"`, `"activation"`, `"input"`, `"workspace"` or `"other"` | what the memory holds |
//! | `t_ns` | integer | nanoseconds since the trace started |
//! | `stream` | integer | the stream it was allocated on (recorded; placement does not depend on it) |
//! | `addr` | integer, optional | the address the recorded run handed out (0 or absent in synthetic traces) |
//!
//! ```text
//! {"op":"alloc","id":0,"bytes":1310720000,"category":"parameter","t_ns":0,"stream":0}
//! {"op":"alloc","id":1,"bytes":4194304,"category":"workspace","t_ns":1000,"stream":0}
//! {"op":"free","id":1,"bytes":4194304,"category":"workspace","t_ns":2000,"stream":0}
//! ```
//!
//! A replay frees what a trace leaves live. `scripts/torch_snapshot_to_trace.py` converts a
//! PyTorch memory snapshot (`torch.cuda.memory._snapshot()`) into this format.
//!
//! ```
//! use std::sync::Arc;
//! use stax_alloc::{Allocator, Category, SimMemory, Strategy};
//!
//! // A simulated 1 GiB device with CUDA's 2 MiB granularity.
//! let sim = Arc::new(SimMemory::new(1 << 30, 2 << 20));
//! let alloc = Allocator::new(sim.clone(), Strategy::Caching)?;
//! let w = alloc.allocate(10_000_000, Category::Parameter)?;
//! let x = alloc.allocate(100, Category::Activation)?;
//! let s = alloc.stats();
//! assert_eq!(s.requested, 10_000_100);
//! assert_eq!(s.by_category[Category::Parameter.index()].live, 10_000_000);
//! assert_eq!(s.reserved, (10 << 20) + (2 << 20)); // one large + one small segment
//! assert_eq!(sim.reserve_calls(), 2);
//! drop((w, x));
//! let again = alloc.allocate(9_000_000, Category::Gradient)?; // served from the cache
//! assert_eq!(sim.reserve_calls(), 2);
//! assert_eq!(alloc.stats().peak_requested, 10_000_100);
//! # drop(again);
//! # Ok::<(), stax_alloc::AllocError>(())
//! ```

pub mod adversarial;
mod allocator;
mod backend;
pub mod bench;
mod block;
mod category;
mod error;
mod name;
mod stats;
mod strategy;
mod trace;

pub use allocator::{Allocation, Allocator, ScopeGuard};
pub use backend::{
    HostAccess, HostMemory, PoolUsage, RawMemory, Segment, SimMemory, VirtualMemory,
};
pub use category::Category;
pub use error::{AllocError, OomReport};
pub use name::{Name, Tag};
pub use stats::{
    BlockSnapshot, BlockState, CategoryStats, PoolKind, SegmentSnapshot, Snapshot, Stats,
};
pub use strategy::{DEFAULT_BFC_FRACTION, ENV_VAR, Strategy, format_size, parse_size};
pub use trace::{Mark, Placement, ReplayReport, Trace, TraceBuilder, TraceEvent, TraceOp, replay};

/// Formats a byte count for people: `"1.31 GB (1,310,876,424 bytes)"`, decimal units (kB, MB,
/// GB, TB), two decimals; below 1000 just `"512 bytes"`.
///
/// ```
/// assert_eq!(stax_alloc::human_bytes(1_310_876_424), "1.31 GB (1,310,876,424 bytes)");
/// assert_eq!(stax_alloc::human_bytes(512), "512 bytes");
/// ```
pub fn human_bytes(bytes: u64) -> String {
    let units = [("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)];
    for (unit, scale) in units {
        if bytes as f64 >= scale {
            return format!(
                "{:.2} {unit} ({} bytes)",
                bytes as f64 / scale,
                group_digits(bytes)
            );
        }
    }
    format!("{bytes} bytes")
}

/// A byte (or any) count with thousands separators, as tables print exact figures.
///
/// ```
/// assert_eq!(stax_alloc::group_digits(1_310_876_424), "1,310,876,424");
/// assert_eq!(stax_alloc::group_digits(512), "512");
/// ```
pub fn group_digits(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// `x` rounded up to a multiple of `m` (`m >= 1`); None on overflow.
pub(crate) fn round_up(x: usize, m: usize) -> Option<usize> {
    x.checked_next_multiple_of(m.max(1))
}
