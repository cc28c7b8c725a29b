//! Exact statistics ([`Stats`]) and the full picture of memory ([`Snapshot`]).
//!
//! Every figure is a counter updated on each allocation, free and backend call, never a sample.
//! All sizes are bytes.
//!
//! ```
//! use stax_alloc::{Allocator, Category, SimMemory, Strategy};
//! use std::sync::Arc;
//! let alloc = Allocator::new(Arc::new(SimMemory::new(1 << 30, 2 << 20)), Strategy::Caching)?;
//! let a = alloc.allocate(1000, Category::Parameter)?;
//! let s = alloc.stats();
//! assert_eq!(s.requested, 1000);
//! assert_eq!(s.allocated, 1024); // rounded to the 256-byte alignment
//! assert_eq!(s.reserved, 2 << 20); // one 2 MiB small-pool segment
//! assert_eq!(s.cached, s.reserved - s.allocated);
//! drop(a);
//! assert_eq!(alloc.stats().peak_by_category[Category::Parameter.index()], 1000);
//! # Ok::<(), stax_alloc::AllocError>(())
//! ```

use crate::Category;

/// Live and peak bytes of one category.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CategoryStats {
    /// Requested bytes of the live allocations of this category.
    pub live: u64,
    /// Allocated (rounded block) bytes of the live allocations of this category.
    pub allocated: u64,
    /// Peak of `live` since the allocator started or [`reset_peak`](crate::Allocator::reset_peak).
    pub peak: u64,
    /// Number of allocations of this category served since the allocator started (never
    /// reset), so a caller can tell how far a known sequence of allocations got.
    pub allocs: u64,
}

/// Exact allocator statistics at one instant. All sizes are bytes.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Stats {
    /// Bytes requested by the live allocations (what the callers asked for).
    pub requested: u64,
    /// Bytes of the blocks given to live allocations (requests rounded up to the alignment,
    /// plus any remainder too small to split).
    pub allocated: u64,
    /// Bytes reserved from the backend (all segments).
    pub reserved: u64,
    /// `reserved - allocated`: reserved bytes no live allocation uses.
    pub cached: u64,
    /// Peak of `requested` since start or the last `reset_peak`.
    pub peak_requested: u64,
    /// Peak of `allocated`.
    pub peak_allocated: u64,
    /// Peak of `reserved`.
    pub peak_reserved: u64,
    /// Requested live bytes per category at the moment `peak_requested` was last reached
    /// (indexed by [`Category::index`]): exactly what was live at the highest point.
    pub peak_by_category: [u64; 7],
    /// Live and peak bytes per category, indexed by [`Category::index`].
    pub by_category: [CategoryStats; 7],
    /// Number of allocations served (zero-byte ones included).
    pub allocs: u64,
    /// Number of allocations freed.
    pub frees: u64,
    /// Number of segments currently reserved from the backend.
    pub segments: u64,
    /// Number of backend `reserve` calls (successful or not).
    pub backend_reserves: u64,
    /// Number of backend `release` calls (successful or not).
    pub backend_releases: u64,
    /// Number of virtual-memory `map` calls (`expandable`; each maps a run of pages).
    pub backend_maps: u64,
    /// Number of virtual-memory `unmap` calls (`expandable`; each unmaps a run of pages).
    pub backend_unmaps: u64,
    /// Number of failed backend calls whose error could not be returned (a release on drop).
    pub backend_errors: u64,
    /// The largest free block inside reserved segments.
    pub largest_free_block: u64,
    /// `1 - largest_free_block / free bytes in reserved segments`; 0 when nothing is free.
    pub fragmentation: f64,
}

impl Stats {
    /// Live allocations: `allocs - frees`.
    pub fn live_allocations(&self) -> u64 {
        self.allocs.saturating_sub(self.frees)
    }

    /// Every backend call counted: reserves, releases, maps and unmaps.
    pub fn backend_calls(&self) -> u64 {
        self.backend_reserves + self.backend_releases + self.backend_maps + self.backend_unmaps
    }
}

/// Which pool of a strategy a segment belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolKind {
    /// `caching`: 2 MiB segments serving requests of at most 1 MiB.
    Small,
    /// `caching`: segments rounded to the backend granularity for larger requests.
    Large,
    /// `bfc`: the one arena reserved at start-up.
    Arena,
    /// `platform` and `async`: one segment per allocation.
    Direct,
    /// `expandable`: a run of mapped pages of the one virtual address range.
    Mapped,
}

/// Whether a block is in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    /// Given to a live allocation.
    Used,
    /// Cached, available for reuse.
    Free,
}

/// One block of a segment.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BlockSnapshot {
    /// Offset in bytes from the segment start.
    pub offset: u64,
    /// Block size in bytes.
    pub bytes: u64,
    /// Used or free.
    pub state: BlockState,
    /// Category of a used block; None for a free block.
    pub category: Option<Category>,
    /// Requested bytes of a used block; 0 for a free block.
    pub requested: u64,
}

/// One backend segment and all its blocks, in address order.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SegmentSnapshot {
    /// Segment start address.
    pub addr: u64,
    /// Segment size in bytes.
    pub bytes: u64,
    /// The pool that owns it.
    pub pool: PoolKind,
    /// Its blocks, covering the segment exactly, in address order.
    pub blocks: Vec<BlockSnapshot>,
}

/// Every segment and block of an allocator, with the statistics taken at the same instant.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Snapshot {
    /// Backend name.
    pub backend: String,
    /// Strategy, as displayed.
    pub strategy: String,
    /// Statistics at the instant of the snapshot.
    pub stats: Stats,
    /// Segments in (pool, address) order.
    pub segments: Vec<SegmentSnapshot>,
}

/// The front's counters of allocations (backend counters live in [`BackendBook`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct Counters {
    pub requested: u64,
    pub allocated: u64,
    pub peak_requested: u64,
    pub peak_allocated: u64,
    pub peak_by_category: [u64; 7],
    pub by_category: [CategoryStats; 7],
    pub allocs: u64,
    pub frees: u64,
}

impl Counters {
    pub fn on_alloc(&mut self, category: Category, requested: u64, allocated: u64) {
        self.allocs += 1;
        self.requested += requested;
        self.allocated += allocated;
        let c = &mut self.by_category[category.index()];
        c.live += requested;
        c.allocated += allocated;
        c.allocs += 1;
        c.peak = c.peak.max(c.live);
        self.peak_allocated = self.peak_allocated.max(self.allocated);
        if self.requested >= self.peak_requested {
            self.peak_requested = self.requested;
            for (p, c) in self.peak_by_category.iter_mut().zip(&self.by_category) {
                *p = c.live;
            }
        }
    }

    pub fn on_free(&mut self, category: Category, requested: u64, allocated: u64) {
        self.frees += 1;
        self.requested = self.requested.saturating_sub(requested);
        self.allocated = self.allocated.saturating_sub(allocated);
        let c = &mut self.by_category[category.index()];
        c.live = c.live.saturating_sub(requested);
        c.allocated = c.allocated.saturating_sub(allocated);
    }

    pub fn reset_peak(&mut self) {
        self.peak_requested = self.requested;
        self.peak_allocated = self.allocated;
        for (p, c) in self
            .peak_by_category
            .iter_mut()
            .zip(self.by_category.iter_mut())
        {
            *p = c.live;
            c.peak = c.live;
        }
    }

    pub fn allocated_by_category(&self) -> [u64; 7] {
        self.by_category.map(|c| c.allocated)
    }
}

/// Counters of backend traffic, kept by [`crate::strategy::Metered`].
#[derive(Debug, Clone, Default)]
pub(crate) struct BackendBook {
    pub reserved: u64,
    pub peak_reserved: u64,
    pub segments: u64,
    pub reserves: u64,
    pub releases: u64,
    pub maps: u64,
    pub unmaps: u64,
    pub errors: u64,
}

/// Assembles [`Stats`] from the counters and the pool's free-space figures.
pub(crate) fn assemble(c: &Counters, b: &BackendBook, largest_free: u64, free: u64) -> Stats {
    Stats {
        requested: c.requested,
        allocated: c.allocated,
        reserved: b.reserved,
        cached: b.reserved.saturating_sub(c.allocated),
        peak_requested: c.peak_requested,
        peak_allocated: c.peak_allocated,
        peak_reserved: b.peak_reserved,
        peak_by_category: c.peak_by_category,
        by_category: c.by_category,
        allocs: c.allocs,
        frees: c.frees,
        segments: b.segments,
        backend_reserves: b.reserves,
        backend_releases: b.releases,
        backend_maps: b.maps,
        backend_unmaps: b.unmaps,
        backend_errors: b.errors,
        largest_free_block: largest_free,
        fragmentation: if free == 0 {
            0.0
        } else {
            1.0 - largest_free as f64 / free as f64
        },
    }
}
