//! The crate's one error enum, [`AllocError`], and the out-of-memory diagnosis [`OomReport`].
//!
//! ```
//! use stax_alloc::{Allocator, Category, SimMemory, Strategy, AllocError};
//! use std::sync::Arc;
//! let sim = Arc::new(SimMemory::new(8 << 20, 2 << 20));
//! let alloc = Allocator::new(sim, Strategy::Caching).unwrap();
//! match alloc.allocate(16 << 20, Category::Activation) {
//!     Err(AllocError::OutOfMemory(report)) => {
//!         assert!(report.can_never_fit);
//!         assert_eq!(report.requested, 16 << 20);
//!         assert!(report.to_string().contains("can never fit"));
//!     }
//!     other => panic!("expected out of memory, got {other:?}"),
//! }
//! ```

use std::fmt;

use crate::{Category, human_bytes};

/// Every error of `stax-alloc`. Messages are lowercase and name the operation first.
#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    // ---- memory ----------------------------------------------------------------------------
    /// The allocator could not serve a request, even after releasing its cache (caching
    /// strategy). The report says why, in numbers. The allocator stays usable.
    #[error("allocate: out of memory: {0}")]
    OutOfMemory(Box<OomReport>),
    /// The backend itself is out of memory (what `cuMemAlloc` reports as
    /// `CUDA_ERROR_OUT_OF_MEMORY`). [`RawMemory`](crate::RawMemory) implementations return
    /// this variant for that case, so that the allocator knows releasing its cache may help;
    /// the front turns it into [`AllocError::OutOfMemory`] with a full report.
    #[error("{backend}: {op} of {} failed: out of memory", human_bytes(*.requested))]
    BackendOutOfMemory {
        /// Backend name ([`RawMemory::name`](crate::RawMemory::name)).
        backend: String,
        /// The backend operation, e.g. `"reserve"`.
        op: &'static str,
        /// Bytes asked of the backend.
        requested: u64,
    },
    // ---- backend ---------------------------------------------------------------------------
    /// Any other backend failure (driver error, bad segment, ...).
    #[error("{backend}: {op} failed: {message}")]
    Backend {
        /// Backend name ([`RawMemory::name`](crate::RawMemory::name)).
        backend: String,
        /// The backend operation, e.g. `"reserve"` or `"release"`.
        op: &'static str,
        /// What went wrong, in words.
        message: String,
    },
    /// The strategy cannot run on this backend (e.g. `async` on a backend that is not
    /// stream-ordered, or `bfc` on a backend with no capacity figure).
    #[error("allocator: strategy {strategy} is not supported on backend {backend}: {reason}")]
    Unsupported {
        /// The strategy, as displayed (`"async"`).
        strategy: String,
        /// Backend name.
        backend: String,
        /// Why, in words.
        reason: String,
    },
    /// `bfc` sizes its arena as a fraction of the device's *total* memory (as JAX's
    /// `XLA_PYTHON_CLIENT_MEM_FRACTION`), and less than that is free now (another process, or
    /// this one, holds the rest). Refused at start-up instead of silently reserving less.
    #[error(
        "allocator: {strategy} wants an arena of {} ({fraction} of the {} total) but {backend} \
         has only {} free: lower the fraction or free the memory held elsewhere (another \
         process on the same device?)",
        human_bytes(*.requested), human_bytes(*.total), human_bytes(*.free)
    )]
    ArenaUnavailable {
        /// The strategy, as displayed (`"bfc:fraction=0.75"`).
        strategy: String,
        /// Backend name.
        backend: String,
        /// The fraction of the total asked for.
        fraction: f64,
        /// Bytes the arena needs: `fraction x total`, rounded down to the granularity.
        requested: u64,
        /// Bytes the backend says are free.
        free: u64,
        /// The backend's total bytes ([`RawMemory::capacity`](crate::RawMemory::capacity)).
        total: u64,
    },
    // ---- configuration and input -----------------------------------------------------------
    /// A strategy string (from code, a command line or `STAX_ALLOCATOR`) did not parse.
    #[error("{origin}={value:?}: {reason}")]
    InvalidStrategy {
        /// Where the text came from: `strategy` (parsed from a string) or `STAX_ALLOCATOR`.
        origin: &'static str,
        /// The text that failed to parse.
        value: String,
        /// What is wrong, followed by the accepted forms.
        reason: String,
    },
    /// A category name did not parse.
    #[error(
        "category: unknown category {value:?}; expected one of parameter, optimizer_state, \
         gradient, activation, input, workspace, other"
    )]
    InvalidCategory {
        /// The text that failed to parse.
        value: String,
    },
    /// Reading, writing or replaying a trace failed.
    #[error("trace: {op} failed at line {line}: {message}")]
    Trace {
        /// `"read"`, `"write"` or `"replay"`.
        op: &'static str,
        /// 1-based line (event) number; 0 when not tied to a line.
        line: usize,
        /// What went wrong.
        message: String,
    },
}

/// Why an allocation failed, in numbers. All sizes are bytes.
///
/// `Display` reads as a diagnosis: what was asked, what the allocator holds and for which
/// categories, what is cached, the largest free block, what the driver says is free, and
/// whether the request can never fit (larger than the device or arena), does not fit now, or
/// (a backend of unknown capacity) may never fit.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OomReport {
    /// Bytes requested by the caller.
    pub requested: u64,
    /// Category of the failed request.
    pub category: Category,
    /// Name of the failed request, `scope/role` (`2.conv/workspace`; see [`crate::Name`]).
    pub name: String,
    /// Bytes reserved from the backend at the time of failure.
    pub reserved: u64,
    /// Bytes allocated (rounded block sizes) to live allocations.
    pub allocated: u64,
    /// Allocated bytes per category, indexed by [`Category::index`].
    pub allocated_by_category: [u64; 7],
    /// Reserved but unallocated bytes (`reserved - allocated`), after the cache release.
    pub cached: u64,
    /// The largest free block inside reserved segments.
    pub largest_free_block: u64,
    /// What the backend says is free ([`RawMemory::free_bytes`](crate::RawMemory::free_bytes)).
    pub driver_free: Option<u64>,
    /// Backend capacity ([`RawMemory::capacity`](crate::RawMemory::capacity)).
    pub capacity: Option<u64>,
    /// True when no state of this allocator could ever serve the request: it is larger than
    /// the backend capacity, or (bfc) than the arena.
    pub can_never_fit: bool,
    /// The most this allocator could ever hand out in one block: the arena size for `bfc`,
    /// the capacity otherwise (None when unknown).
    pub limit: Option<u64>,
    /// Backend name.
    pub backend: String,
    /// Strategy, as displayed (`"caching"`).
    pub strategy: String,
    /// What the backend said, when a backend call failed.
    pub cause: Option<String>,
}

impl fmt::Display for OomReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} requested for {} ({}) on {} (strategy {})",
            human_bytes(self.requested),
            self.name,
            self.category,
            self.backend,
            self.strategy
        )?;
        if self.can_never_fit {
            match self.limit {
                Some(l) => writeln!(
                    f,
                    "  can never fit: larger than the {} of {}",
                    if self.strategy.starts_with("bfc") {
                        "arena"
                    } else {
                        "capacity"
                    },
                    human_bytes(l)
                )?,
                None => writeln!(f, "  can never fit: the request size overflows")?,
            }
        } else if self.cached >= self.requested && self.largest_free_block < self.requested {
            writeln!(
                f,
                "  does not fit now: fragmentation: {} is free in reserved segments but the \
                 largest free block is {}",
                human_bytes(self.cached),
                human_bytes(self.largest_free_block)
            )?;
        } else {
            let available = self.cached.saturating_add(self.driver_free.unwrap_or(0));
            match self.driver_free {
                Some(free) if available < self.requested => writeln!(
                    f,
                    "  does not fit now: the device has {} free and the allocator caches {}: \
                     {} short; free live allocations and retry",
                    human_bytes(free),
                    human_bytes(self.cached),
                    human_bytes(self.requested - available)
                )?,
                Some(_) => writeln!(
                    f,
                    "  does not fit now: free live allocations (or reserve less elsewhere) and retry"
                )?,
                // host memory without a capacity: the system refused, and whether any state
                // could serve the request is not known
                None => writeln!(
                    f,
                    "  the backend refused it and its capacity is unknown, so it may never fit: \
                     ask for less, or free live allocations and retry"
                )?,
            }
        }
        writeln!(f, "  reserved           {}", human_bytes(self.reserved))?;
        write!(f, "  allocated          {}", human_bytes(self.allocated))?;
        let mut first = true;
        for c in Category::ALL {
            let b = self.allocated_by_category[c.index()];
            if b > 0 {
                write!(
                    f,
                    "{}{} {}",
                    if first { ": " } else { ", " },
                    c,
                    human_bytes(b)
                )?;
                first = false;
            }
        }
        writeln!(f)?;
        writeln!(f, "  cached             {}", human_bytes(self.cached))?;
        writeln!(
            f,
            "  largest free block {}",
            human_bytes(self.largest_free_block)
        )?;
        match self.driver_free {
            Some(free) => write!(f, "  driver free        {}", human_bytes(free))?,
            None => write!(f, "  driver free        unknown")?,
        }
        if let Some(cap) = self.capacity {
            write!(f, " of capacity {}", human_bytes(cap))?;
        }
        if let Some(cause) = &self.cause {
            write!(f, "\n  backend said: {cause}")?;
        }
        Ok(())
    }
}
