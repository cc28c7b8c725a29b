//! Strategies: how segments are obtained from the backend and cut into blocks.
//!
//! [`Strategy`] is the user's choice (in code, or from `STAX_ALLOCATOR`); each variant is
//! implemented by one file under `strategy/` behind the crate-private `Pool` trait:
//! `caching` (PyTorch CUDACachingAllocator, hardened against fragmentation), `expandable`
//! (PyTorch's `expandable_segments` on virtual memory), `bfc` (XLA's BFC arena), `platform`
//! (one driver call per allocation and per free, like `XLA_PYTHON_CLIENT_ALLOCATOR=platform`)
//! and `async` (a stream-ordered `cuMemAllocAsync` pool).
//!
//! Each strategy states a bound on `reserved` (the bytes it holds from the backend) in terms
//! of the live allocations, which the property tests check after every allocation and free of
//! random sequences (`tests/props.rs`) and of the adversarial traces ([`crate::adversarial`]):
//!
//! | strategy | `reserved` is at most |
//! | --- | --- |
//! | `caching` | the highest value so far of the sum over live blocks of `max(2 x block, fresh segment)`, where a block of at most 1 MiB has a fresh segment of 2 MiB and a larger one its size rounded up to the granularity: about 2x the peak of live bytes |
//! | `expandable` | `page x (p + p / 8)`, `p` the most pages live blocks have touched at once so far: 9/8 of the peak of live bytes plus at most two pages per live block |
//! | `bfc` | the arena, always: `fraction x total` rounded down to the granularity |
//! | `platform`, `async` | exactly the sum over live allocations of their size rounded up to the granularity |
//!
//! ```
//! use stax_alloc::Strategy;
//! assert_eq!("bfc:fraction=0.5".parse::<Strategy>()?, Strategy::Bfc { fraction: 0.5 });
//! assert_eq!(
//!     "async:release_threshold=1GiB".parse::<Strategy>()?,
//!     Strategy::Async { release_threshold: 1 << 30 }
//! );
//! assert_eq!("expandable".parse::<Strategy>()?, Strategy::Expandable);
//! assert_eq!(Strategy::Bfc { fraction: 0.75 }.to_string(), "bfc:fraction=0.75");
//! assert_eq!(
//!     Strategy::Async { release_threshold: u64::MAX }.in_effect(),
//!     "async:release_threshold=unlimited"
//! );
//! assert!("bfc:fraction=2".parse::<Strategy>().is_err());
//! # Ok::<(), stax_alloc::AllocError>(())
//! ```

use std::fmt;
use std::str::FromStr;

use crate::block::Tag;
use crate::stats::{BackendBook, SegmentSnapshot};
use crate::{AllocError, RawMemory, Segment, VirtualMemory};

mod r#async;
mod bfc;
mod caching;
mod expandable;
mod platform;

/// The environment variable read by [`Strategy::from_env`].
pub const ENV_VAR: &str = "STAX_ALLOCATOR";

/// Default fraction of the device's total memory that `bfc` reserves (XLA's
/// `XLA_PYTHON_CLIENT_MEM_FRACTION` default).
pub const DEFAULT_BFC_FRACTION: f64 = 0.75;

const FORMS: &str = "accepted forms: caching | expandable | bfc | bfc:fraction=F (0 < F <= 1 of \
                     the total memory, default 0.75) | platform | async | \
                     async:release_threshold=SIZE (bytes, or a number with KiB, MiB, GiB, KB, MB \
                     or GB, or unlimited; default: unlimited, keep everything)";

/// How the allocator gets memory from the backend. Default: [`Strategy::Caching`].
///
/// Text forms (`FromStr`, `Display`, `STAX_ALLOCATOR`): `caching`, `expandable`, `bfc`,
/// `bfc:fraction=0.5`, `platform`, `async`, `async:release_threshold=1GiB`.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Strategy {
    /// Segments reserved on demand, after PyTorch's CUDACachingAllocator: requests of at most
    /// 1 MiB from 2 MiB segments of their own pool, larger ones from segments of their size
    /// rounded up to the granularity ("sized to fit"); best-fit with splitting, coalescing on
    /// free (the last 16 freed blocks are first parked for exact-size reuse), freed blocks kept
    /// cached. Two rules keep it from growing without bound (pytorch#35901, rmm#35):
    /// a large request of `s` bytes is never cut out of a segment larger than `max(2 s, its
    /// fresh segment)` (so small blocks cannot pin a large cached segment), and before a new
    /// segment would take `reserved` past the bound below, wholly free segments are released,
    /// largest first. On out-of-memory every wholly free segment is released and the
    /// reservation retried once.
    ///
    /// Bound: `reserved <= max over time of sum over live blocks of max(2 x block, fresh
    /// segment of the block)` (fresh segment: 2 MiB for a block of at most 1 MiB, else the
    /// block rounded up to the granularity), about twice the peak of live bytes.
    #[default]
    Caching,
    /// PyTorch's `expandable_segments` on the backend's virtual memory (CUDA VMM): one address
    /// range of twice the device's capacity is reserved at start-up, blocks are cut from it by
    /// best-fit with coalescing, and physical pages are mapped under a block when it needs
    /// them (one `cuMemCreate` handle per page, so pages can be unmapped one by one). Pages no
    /// live block touches stay mapped as the cache until a new mapping would take `reserved`
    /// past the bound below (then they are unmapped, highest addresses first, down to the
    /// peak itself), an out-of-memory retry, or `empty_cache`. Needs
    /// [`RawMemory::virtual_memory`].
    ///
    /// Bound: `reserved <= page size x (p + p / 8)`, where `p` is the most pages live blocks
    /// have touched at once so far: 9/8 of the peak of live bytes, plus two pages per live
    /// block at most (the eighth is slack against unmapping and mapping at every allocation).
    Expandable,
    /// Reserves `fraction` of the device's *total* memory (as JAX's
    /// `XLA_PYTHON_CLIENT_MEM_FRACTION`) once, at start-up, and serves everything from that
    /// arena with best-fit-with-coalescing; never asks the backend again. When that much is not
    /// free, construction fails with [`AllocError::ArenaUnavailable`]. Mirrors XLA's BFC
    /// allocator (default fraction 0.75).
    ///
    /// Bound: `reserved` is the arena, always.
    Bfc {
        /// Fraction of the total memory to reserve, in (0, 1].
        fraction: f64,
    },
    /// No caching: one backend reserve per allocation and one release per free (debugging;
    /// like `XLA_PYTHON_CLIENT_ALLOCATOR=platform`).
    ///
    /// Bound: `reserved` is exactly the sum over live allocations of their size rounded up
    /// to the granularity.
    Platform,
    /// Stream-ordered allocation through the backend's own pool (`cuMemAllocAsync`/
    /// `cuMemFreeAsync`); requires a backend whose `stream_ordered()` is true. The pool's own
    /// cache is not in `reserved` (reports read it with [`RawMemory::pool_usage`]).
    ///
    /// Bound: as `platform` (the allocator's books hold only live allocations).
    Async {
        /// Bytes the pool keeps cached across synchronizations
        /// (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`); `u64::MAX` keeps everything.
        release_threshold: u64,
    },
}

impl Strategy {
    /// Reads the strategy from `STAX_ALLOCATOR`; unset or empty gives [`Strategy::Caching`].
    ///
    /// # Errors
    /// [`AllocError::InvalidStrategy`] when the value does not parse (the message lists the
    /// accepted forms) or is not valid Unicode.
    pub fn from_env() -> Result<Strategy, AllocError> {
        match std::env::var(ENV_VAR) {
            Err(std::env::VarError::NotPresent) => Ok(Strategy::Caching),
            Err(std::env::VarError::NotUnicode(v)) => Err(AllocError::InvalidStrategy {
                origin: ENV_VAR,
                value: v.to_string_lossy().into_owned(),
                reason: format!("not valid unicode; {FORMS}"),
            }),
            Ok(v) if v.trim().is_empty() => Ok(Strategy::Caching),
            Ok(v) => v.parse().map_err(|e| match e {
                AllocError::InvalidStrategy { value, reason, .. } => AllocError::InvalidStrategy {
                    origin: ENV_VAR,
                    value,
                    reason,
                },
                other => other,
            }),
        }
    }

    /// The strategy's name without parameters: `caching`, `expandable`, `bfc`, `platform` or
    /// `async`.
    pub fn name(&self) -> &'static str {
        match self {
            Strategy::Caching => "caching",
            Strategy::Expandable => "expandable",
            Strategy::Bfc { .. } => "bfc",
            Strategy::Platform => "platform",
            Strategy::Async { .. } => "async",
        }
    }

    /// The strategy with every parameter in effect spelled out, defaults included
    /// (`async:release_threshold=unlimited` for plain `async`); it parses back to the same
    /// strategy. Reports print this.
    pub fn in_effect(&self) -> String {
        match self {
            Strategy::Async {
                release_threshold: u64::MAX,
            } => "async:release_threshold=unlimited".into(),
            other => other.to_string(),
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Strategy::Bfc { fraction } => write!(f, "bfc:fraction={fraction}"),
            Strategy::Async { release_threshold } if *release_threshold != u64::MAX => {
                write!(
                    f,
                    "async:release_threshold={}",
                    format_size(*release_threshold)
                )
            }
            other => f.write_str(other.name()),
        }
    }
}

impl FromStr for Strategy {
    type Err = AllocError;

    /// Parses `caching`, `expandable`, `bfc`, `bfc:fraction=F`, `platform`, `async` or
    /// `async:release_threshold=SIZE` (`SIZE` as [`parse_size`] reads it, or `unlimited`;
    /// case-insensitive, surrounding spaces ignored).
    ///
    /// # Errors
    /// [`AllocError::InvalidStrategy`] naming what is wrong and listing the accepted forms.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason: String| AllocError::InvalidStrategy {
            origin: "strategy",
            value: s.to_string(),
            reason: format!("{reason}; {FORMS}"),
        };
        let t = s.trim();
        let (name, params) = match t.split_once(':') {
            Some((n, p)) => (n.trim(), Some(p)),
            None => (t, None),
        };
        let mut pairs = Vec::new();
        if let Some(p) = params {
            for item in p.split(',') {
                let (k, v) = item
                    .split_once('=')
                    .ok_or_else(|| bad(format!("expected key=value, found {:?}", item.trim())))?;
                pairs.push((k.trim().to_ascii_lowercase(), v.trim()));
            }
        }
        let name = name.to_ascii_lowercase();
        let allowed = match name.as_str() {
            "caching" | "expandable" | "platform" => "",
            "bfc" => "fraction",
            "async" => "release_threshold",
            "" => return Err(bad("empty strategy name".into())),
            _ => return Err(bad(format!("unknown strategy {name:?}"))),
        };
        for (k, _) in &pairs {
            if k != allowed {
                return Err(bad(format!("{name} takes no parameter {k:?}")));
            }
        }
        let value = pairs.last().map(|(_, v)| *v);
        match name.as_str() {
            "caching" => Ok(Strategy::Caching),
            "expandable" => Ok(Strategy::Expandable),
            "platform" => Ok(Strategy::Platform),
            "bfc" => {
                let fraction = match value {
                    None => DEFAULT_BFC_FRACTION,
                    Some(v) => v
                        .parse::<f64>()
                        .ok()
                        .filter(|f| *f > 0.0 && *f <= 1.0)
                        .ok_or_else(|| bad(format!("fraction {v:?} is not a number in (0, 1]")))?,
                };
                Ok(Strategy::Bfc { fraction })
            }
            _ => {
                let release_threshold = match value {
                    None => u64::MAX,
                    Some(v) if v.eq_ignore_ascii_case("unlimited") => u64::MAX,
                    Some(v) => parse_size(v)
                        .ok_or_else(|| bad(format!("release_threshold {v:?} is not a size")))?,
                };
                Ok(Strategy::Async { release_threshold })
            }
        }
    }
}

/// Parses a size in bytes: `1048576`, `512KiB`, `1.5 GiB`, `2MB` (binary units KiB/MiB/GiB/TiB
/// are powers of 1024, decimal KB/MB/GB/TB powers of 1000; units are case-insensitive; a
/// fraction of a unit is rounded to the nearest byte). Returns None for anything else,
/// negative or overflowing values, and a fraction of a byte (`1.5`, `1.5B`).
pub fn parse_size(s: &str) -> Option<u64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return None,
    };
    if num.is_empty() {
        return None;
    }
    if num.contains('.') {
        let v = num.parse::<f64>().ok()? * mult as f64;
        let whole = mult > 1 || v.fract() == 0.0;
        (whole && v.is_finite() && v >= 0.0 && v < u64::MAX as f64).then(|| v.round() as u64)
    } else {
        num.parse::<u64>().ok()?.checked_mul(mult)
    }
}

/// Formats a byte count in the largest binary unit that divides it exactly (`1GiB`,
/// `512KiB`), or as plain bytes; [`parse_size`] reads it back.
pub fn format_size(bytes: u64) -> String {
    for (unit, m) in [
        ("TiB", 1u64 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ] {
        if bytes > 0 && bytes % m == 0 {
            return format!("{}{unit}", bytes / m);
        }
    }
    bytes.to_string()
}

// ---- the crate-private strategy interface ------------------------------------------------------

/// A block handed out by a pool.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grant {
    pub addr: u64,
    pub handle: u64,
    pub block: usize,
    pub segment: u64,
}

/// Why a pool could not serve a request.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// No memory: the front builds an [`crate::OomReport`].
    NoFit {
        can_never_fit: bool,
        cause: Option<String>,
    },
    /// Any other failure, returned as is.
    Error(AllocError),
}

/// One strategy's state. All sizes are bytes; `size` is already rounded to the alignment.
pub(crate) trait Pool: Send + fmt::Debug {
    fn alloc(&mut self, mem: &mut Metered<'_>, size: usize, tag: Tag) -> Result<Grant, Refusal>;
    /// Frees a handle from `alloc`; returns the block size and tag, None for a bad handle.
    fn free(&mut self, mem: &mut Metered<'_>, handle: u64) -> Option<(usize, Tag)>;
    /// Returns cached memory to the backend (`empty_cache`).
    fn release_cached(&mut self, mem: &mut Metered<'_>) -> Result<(), AllocError>;
    /// Returns every segment (the allocator is being dropped; nothing is live).
    fn release_all(&mut self, mem: &mut Metered<'_>);
    /// Coalesces every parked block ([`crate::Allocator::coalesce`]).
    fn settle(&mut self) {}
    fn largest_free(&self) -> u64;
    /// Free bytes inside reserved memory (`reserved - allocated`).
    fn free_bytes(&self) -> u64;
    /// The largest block this pool could ever hand out, if bounded.
    fn limit(&self) -> Option<u64>;
    fn snapshot(&self) -> Vec<SegmentSnapshot>;
}

/// Builds the pool of `strategy` on `raw` (bfc reserves its arena here).
pub(crate) fn build(
    strategy: &Strategy,
    mem: &mut Metered<'_>,
) -> Result<Box<dyn Pool>, AllocError> {
    Ok(match strategy {
        Strategy::Caching => Box::new(caching::Caching::new(mem.raw)),
        Strategy::Expandable => Box::new(expandable::Expandable::new(mem, strategy)?),
        Strategy::Bfc { fraction } => Box::new(bfc::Bfc::new(mem, *fraction, strategy)?),
        Strategy::Platform => Box::new(platform::Direct::new(mem.raw, false)),
        Strategy::Async { release_threshold } => {
            Box::new(r#async::new(mem.raw, *release_threshold, strategy)?)
        }
    })
}

/// The backend seen through the allocator's books: every call is counted, reserved bytes and
/// segments are tracked, and a returned segment is checked (size, alignment).
pub(crate) struct Metered<'a> {
    pub raw: &'a dyn RawMemory,
    pub book: &'a mut BackendBook,
}

impl<'a> Metered<'a> {
    pub fn reserve(&mut self, bytes: usize) -> Result<Segment, AllocError> {
        self.book.reserves += 1;
        let seg = self.raw.reserve(bytes)?;
        let align = self.raw.alignment().max(1) as u64;
        if seg.bytes < bytes || seg.addr % align != 0 {
            let _ = self.raw.release(seg);
            return Err(AllocError::Backend {
                backend: self.raw.name(),
                op: "reserve",
                message: format!("asked {bytes} bytes aligned to {align}, got {seg:?}"),
            });
        }
        self.book.reserved += seg.bytes as u64;
        self.book.segments += 1;
        self.book.peak_reserved = self.book.peak_reserved.max(self.book.reserved);
        Ok(seg)
    }

    /// Releases a segment. It leaves the books even when the backend fails (the failure is
    /// counted in `backend_errors` and returned).
    pub fn release(&mut self, seg: Segment) -> Result<(), AllocError> {
        self.book.releases += 1;
        self.book.reserved = self.book.reserved.saturating_sub(seg.bytes as u64);
        self.book.segments = self.book.segments.saturating_sub(1);
        self.raw.release(seg).inspect_err(|_| self.book.errors += 1)
    }

    /// The backend's virtual memory, or the error `strategy` gives without it.
    pub fn virtual_memory(&self, strategy: &Strategy) -> Result<&'a dyn VirtualMemory, AllocError> {
        let raw: &'a dyn RawMemory = self.raw;
        raw.virtual_memory().ok_or_else(|| AllocError::Unsupported {
            strategy: strategy.to_string(),
            backend: raw.name(),
            reason: "the backend has no virtual memory management (cuMemAddressReserve, \
                         cuMemMap); use caching"
                .into(),
        })
    }

    /// Reserves an address range (counted as a reserve call; it holds no memory, so
    /// `reserved` does not change).
    pub fn reserve_range(
        &mut self,
        vm: &dyn VirtualMemory,
        bytes: usize,
    ) -> Result<Segment, AllocError> {
        self.book.reserves += 1;
        vm.reserve_range(bytes)
    }

    /// Releases an address range (counted as a release call).
    pub fn release_range(
        &mut self,
        vm: &dyn VirtualMemory,
        range: Segment,
    ) -> Result<(), AllocError> {
        self.book.releases += 1;
        vm.release_range(range)
            .inspect_err(|_| self.book.errors += 1)
    }

    /// Maps pages: `reserved` grows by their bytes on success; `segments` (runs of mapped
    /// pages) changes by `runs`, which the caller computes.
    pub fn map(
        &mut self,
        vm: &dyn VirtualMemory,
        pages: Segment,
        runs: i64,
    ) -> Result<(), AllocError> {
        self.book.maps += 1;
        vm.map(pages)?;
        self.book.reserved += pages.bytes as u64;
        self.book.segments = self.book.segments.saturating_add_signed(runs);
        self.book.peak_reserved = self.book.peak_reserved.max(self.book.reserved);
        Ok(())
    }

    /// Unmaps pages; they leave the books even when the backend fails (counted in
    /// `backend_errors` and returned).
    pub fn unmap(
        &mut self,
        vm: &dyn VirtualMemory,
        pages: Segment,
        runs: i64,
    ) -> Result<(), AllocError> {
        self.book.unmaps += 1;
        self.book.reserved = self.book.reserved.saturating_sub(pages.bytes as u64);
        self.book.segments = self.book.segments.saturating_add_signed(runs);
        vm.unmap(pages).inspect_err(|_| self.book.errors += 1)
    }
}
