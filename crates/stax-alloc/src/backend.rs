//! Raw memory: the bottom layer. A [`RawMemory`] hands out whole segments and takes them back;
//! it knows nothing of blocks, categories or caching (cubecl's `ComputeStorage`).
//!
//! Implementations here: [`HostMemory`] (pageable host memory) and [`SimMemory`] (a simulated
//! device with fixed capacity, used by tests and benches). The CUDA device implementation
//! (`cuMemAlloc`/`cuMemFree`, the stream-ordered `cuMemAllocAsync` pool, and CUDA's virtual
//! memory management) lives in `stax-tensor`, so that this crate has no CUDA types.
//!
//! Two optional capabilities: [`RawMemory::virtual_memory`] (address ranges reserved once and
//! physical pages mapped into them on demand, CUDA's `cuMemAddressReserve`/`cuMemCreate`/
//! `cuMemMap`; what the `expandable` strategy runs on) and [`RawMemory::pool_usage`] (a
//! stream-ordered pool's own reserved and used bytes, for reports).
//!
//! ```
//! use stax_alloc::{RawMemory, SimMemory};
//! let sim = SimMemory::new(1 << 30, 2 << 20);
//! let seg = sim.reserve(3 << 20).unwrap(); // rounded up to the 2 MiB granularity
//! assert_eq!(seg.bytes, 4 << 20);
//! assert_eq!(sim.free_bytes(), Some((1 << 30) - (4 << 20)));
//! sim.release(seg).unwrap();
//! assert!(sim.outstanding().is_empty());
//! ```

use std::fmt::Debug;

use crate::AllocError;

mod host;
mod sim;

pub use host::HostMemory;
pub use sim::SimMemory;

/// A contiguous range of backend memory: `bytes` bytes starting at address `addr`.
///
/// For device backends `addr` is a device pointer (`CUdeviceptr`); for [`HostMemory`] it is a
/// real host pointer; for [`SimMemory`] a virtual address that must not be dereferenced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct Segment {
    /// Start address, aligned to [`RawMemory::alignment`].
    pub addr: u64,
    /// Length in bytes (what the backend really reserved, which may be more than asked).
    pub bytes: usize,
}

impl Segment {
    /// One past the last byte: `addr + bytes`.
    pub fn end(&self) -> u64 {
        self.addr.saturating_add(self.bytes as u64)
    }
}

/// Proof that a [`RawMemory`]'s segments are host memory that Rust code may read and write
/// ([`RawMemory::host_access`], [`Allocation::host_bytes`](crate::Allocation::host_bytes)).
/// Only an `unsafe` promise makes one, so the safety of host slices rests on that promise.
#[derive(Debug, Clone, Copy)]
pub struct HostAccess(());

impl HostAccess {
    /// The promise that the memory returning it is host memory.
    ///
    /// # Safety
    /// Only for a [`RawMemory`] whose every reserved segment `[addr, addr + bytes)` is host
    /// memory this process may read and write through `addr as *mut u8` until the segment is
    /// released, initialized (zeroed, say) when reserved, and written by nothing but Rust code
    /// holding the allocation (no device writes into it behind the allocator's back).
    pub unsafe fn new() -> HostAccess {
        HostAccess(())
    }
}

/// A source of raw memory segments (device memory, pinned or pageable host memory, or a
/// simulation). The strategies of this crate are generic over it.
///
/// Implementations must be thread-safe; the allocator calls them under its own lock, so they
/// need no lock of their own for correctness, only for their own bookkeeping.
pub trait RawMemory: Send + Sync + Debug + 'static {
    /// A short name for messages and reports, e.g. `"cuda:0"`, `"host"`, `"sim"`.
    fn name(&self) -> String;

    /// Reserves a segment of at least `bytes` bytes (`bytes > 0`), aligned to
    /// [`alignment`](RawMemory::alignment). The returned segment's `bytes` says how much was
    /// really reserved (a backend may round up, as `cuMemAlloc` rounds to 2 MiB).
    ///
    /// # Errors
    /// [`AllocError::BackendOutOfMemory`] when the memory is exhausted (the allocator then
    /// releases its cache and retries once); [`AllocError::Backend`] for anything else.
    fn reserve(&self, bytes: usize) -> Result<Segment, AllocError>;

    /// Returns a segment obtained from [`reserve`](RawMemory::reserve), exactly as returned.
    ///
    /// # Errors
    /// [`AllocError::Backend`] when the segment is unknown or the driver fails.
    fn release(&self, segment: Segment) -> Result<(), AllocError>;

    /// The size multiple, in bytes, that the allocator rounds large segment requests up to
    /// (2 MiB on CUDA devices, like PyTorch's CUDACachingAllocator).
    fn granularity(&self) -> usize;

    /// Alignment in bytes of every address the allocator hands out: 256 on devices (what
    /// cuBLAS/cuDNN want), 64 on the host. Must be a power of two.
    fn alignment(&self) -> usize;

    /// Total bytes of the memory (device memory size), or None when unbounded or unknown.
    fn capacity(&self) -> Option<u64>;

    /// What the driver says is free right now, in bytes (`cuMemGetInfo`), or None (host).
    fn free_bytes(&self) -> Option<u64>;

    /// True when the backend is a stream-ordered pool (`cuMemAllocAsync`/`cuMemFreeAsync`),
    /// which the `async` strategy requires.
    fn stream_ordered(&self) -> bool {
        false
    }

    /// `Some` when segments are host memory Rust code may read and write (see
    /// [`HostAccess::new`]): pageable host memory, pinned host memory. Default: None (devices,
    /// simulations).
    fn host_access(&self) -> Option<HostAccess> {
        None
    }

    /// Sets how many bytes a stream-ordered pool keeps cached across synchronizations
    /// (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`; CUDA's default 0 returns memory at every sync,
    /// see rapidsai/rmm#2379). Called once by the `async` strategy. Default: does nothing.
    ///
    /// # Errors
    /// [`AllocError::Backend`] when the driver refuses.
    fn set_release_threshold(&self, bytes: u64) -> Result<(), AllocError> {
        let _ = bytes;
        Ok(())
    }

    /// Returns a stream-ordered pool's unused memory to the device (`cuMemPoolTrimTo(0)`).
    /// Called by [`Allocator::empty_cache`](crate::Allocator::empty_cache) under the `async`
    /// strategy. Default: does nothing.
    ///
    /// # Errors
    /// [`AllocError::Backend`] when the driver refuses.
    fn trim(&self) -> Result<(), AllocError> {
        Ok(())
    }

    /// A stream-ordered pool's own figures: what it holds from the device and what of that
    /// live allocations use (`cuMemPoolGetAttribute` with `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`
    /// and `CU_MEMPOOL_ATTR_USED_MEM_CURRENT`), so a report can show the pool's cache instead
    /// of counting it as memory outside the allocator. Default: `Ok(None)` (not a pool).
    ///
    /// # Errors
    /// [`AllocError::Backend`] when the driver refuses the query.
    fn pool_usage(&self) -> Result<Option<PoolUsage>, AllocError> {
        Ok(None)
    }

    /// The virtual-memory capability, when the backend has one (CUDA devices with virtual
    /// memory management; [`SimMemory`] models it): the `expandable` strategy reserves one
    /// address range and maps physical pages into it as it grows. Default: None.
    fn virtual_memory(&self) -> Option<&dyn VirtualMemory> {
        None
    }
}

/// A stream-ordered pool's own usage figures, in bytes ([`RawMemory::pool_usage`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PoolUsage {
    /// Bytes the pool holds from the device (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`).
    pub reserved: u64,
    /// Bytes of it backing live allocations (`CU_MEMPOOL_ATTR_USED_MEM_CURRENT`).
    pub used: u64,
}

impl PoolUsage {
    /// `reserved - used`: what the pool keeps cached for later allocations.
    pub fn cached(&self) -> u64 {
        self.reserved.saturating_sub(self.used)
    }
}

/// Virtual memory management (CUDA's VMM driver API): address ranges that hold no memory until
/// physical pages are mapped into them, and pages that can be unmapped again one by one.
///
/// Addresses and sizes are multiples of [`page_size`](VirtualMemory::page_size). Each page
/// mapped is its own physical allocation (one `cuMemCreate` handle), so any page can later be
/// unmapped and its memory returned to the device while its neighbours stay mapped.
pub trait VirtualMemory: Send + Sync + Debug {
    /// The size in bytes of one physical page, the unit of mapping
    /// (`cuMemGetAllocationGranularity`, minimum granularity: 2 MiB on current NVIDIA GPUs).
    fn page_size(&self) -> usize;

    /// Reserves `bytes` (a multiple of the page size) of address space, holding no memory
    /// (`cuMemAddressReserve`), aligned to the page size.
    ///
    /// # Errors
    /// [`AllocError::Backend`] when the driver has no such range to give.
    fn reserve_range(&self, bytes: usize) -> Result<Segment, AllocError>;

    /// Returns a range from [`reserve_range`](VirtualMemory::reserve_range), exactly as
    /// returned; nothing may be mapped in it any more (`cuMemAddressFree`).
    ///
    /// # Errors
    /// [`AllocError::Backend`] for an unknown range, one with pages still mapped, or a driver
    /// failure.
    fn release_range(&self, range: Segment) -> Result<(), AllocError>;

    /// Backs `pages` (page-aligned, inside a reserved range, nothing mapped there yet) with
    /// fresh physical memory, one page at a time (`cuMemCreate` + `cuMemMap`), readable and
    /// writable by the device (`cuMemSetAccess`). All or nothing: on failure nothing stays
    /// mapped.
    ///
    /// # Errors
    /// [`AllocError::BackendOutOfMemory`] when the device memory is exhausted (the strategy
    /// may unmap cached pages and retry); [`AllocError::Backend`] for anything else.
    fn map(&self, pages: Segment) -> Result<(), AllocError>;

    /// Unmaps every page of `pages` (each mapped by [`map`](VirtualMemory::map)) and returns
    /// its memory to the device (`cuMemUnmap` + `cuMemRelease`), after the work already queued
    /// that may use it.
    ///
    /// # Errors
    /// [`AllocError::Backend`] when a page is not mapped or the driver fails.
    fn unmap(&self, pages: Segment) -> Result<(), AllocError>;
}
