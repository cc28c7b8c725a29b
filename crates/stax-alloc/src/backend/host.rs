//! Pageable host memory through the global allocator (`std::alloc::alloc_zeroed`).

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::collections::HashMap;
use std::sync::Mutex;

use crate::{AllocError, HostAccess, RawMemory, Segment};

/// Host alignment in bytes (one cache line; enough for any SIMD load of f32).
const HOST_ALIGN: usize = 64;
/// Host granularity in bytes: 2 MiB, the x86-64 huge-page size, so the caching strategy rounds
/// large host segments the way it rounds device segments and reuses them the same way.
const HOST_GRANULARITY: usize = 2 << 20;

/// Plain pageable host memory.
///
/// Segments come from `std::alloc::alloc_zeroed` with 64-byte alignment, so fresh memory is
/// zeroed (CPU code may read it as f32 at once) and every address is a real, dereferenceable
/// pointer valid until the allocation is dropped. [`reserve`](RawMemory::reserve) rounds only to
/// the 64-byte alignment; [`granularity`](RawMemory::granularity) is 2 MiB, which the caching
/// strategy uses to round large segments. Capacity and free bytes are unknown (None), unless
/// the backend was made with [`HostMemory::with_capacity`], which caps what it hands out (so
/// that `bfc` can size an arena and tests can run a CPU step under a memory budget).
///
/// Outstanding segments are tracked, so a release of an unknown segment is an error instead
/// of undefined behaviour, and segments still outstanding are freed when the backend drops.
#[derive(Debug, Default)]
pub struct HostMemory {
    outstanding: Mutex<HashMap<u64, usize>>,
    capacity: Option<u64>,
}

impl HostMemory {
    /// A new host backend with no outstanding segments and no capacity limit.
    pub fn new() -> Self {
        HostMemory {
            outstanding: Mutex::new(HashMap::new()),
            capacity: None,
        }
    }

    /// A host backend that hands out at most `capacity` bytes at once: a reservation that would
    /// take the outstanding bytes past it fails with [`AllocError::BackendOutOfMemory`], as a
    /// full device would. [`capacity`](RawMemory::capacity) reports it and
    /// [`free_bytes`](RawMemory::free_bytes) reports `capacity - outstanding`.
    ///
    /// ```
    /// use stax_alloc::{HostMemory, RawMemory};
    /// let host = HostMemory::with_capacity(1 << 20);
    /// let seg = host.reserve(600 << 10).unwrap();
    /// assert_eq!(host.free_bytes(), Some((1 << 20) - (600 << 10)));
    /// assert!(host.reserve(600 << 10).is_err());
    /// host.release(seg).unwrap();
    /// ```
    pub fn with_capacity(capacity: u64) -> Self {
        HostMemory {
            outstanding: Mutex::new(HashMap::new()),
            capacity: Some(capacity),
        }
    }

    /// Bytes currently reserved through this backend.
    pub fn outstanding_bytes(&self) -> u64 {
        let map = self.outstanding.lock().unwrap_or_else(|e| e.into_inner());
        map.values().map(|&b| b as u64).sum()
    }

    fn error(op: &'static str, message: String) -> AllocError {
        AllocError::Backend {
            backend: "host".into(),
            op,
            message,
        }
    }
}

impl RawMemory for HostMemory {
    fn name(&self) -> String {
        "host".into()
    }

    fn host_access(&self) -> Option<HostAccess> {
        // SAFETY: segments come from `alloc_zeroed` (host memory, initialized), are ours until
        // `release`, and nothing but the allocations' owners touches them.
        Some(unsafe { HostAccess::new() })
    }

    fn reserve(&self, bytes: usize) -> Result<Segment, AllocError> {
        if bytes == 0 {
            return Err(Self::error("reserve", "zero-byte segment".into()));
        }
        // A size no layout can describe (over isize::MAX) is out of memory, not a bug.
        let oom = || AllocError::BackendOutOfMemory {
            backend: "host".into(),
            op: "reserve",
            requested: bytes as u64,
        };
        let size = crate::round_up(bytes, HOST_ALIGN).ok_or_else(oom)?;
        let layout = Layout::from_size_align(size, HOST_ALIGN).map_err(|_| oom())?;
        let over = |cap: u64| self.outstanding_bytes().saturating_add(size as u64) > cap;
        if self.capacity.is_some_and(over) {
            return Err(oom());
        }
        // SAFETY: `layout` has a non-zero size (checked above) and a valid power-of-two
        // alignment (constructed by `Layout::from_size_align`).
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(oom());
        }
        let addr = ptr as usize as u64;
        let mut map = self.outstanding.lock().unwrap_or_else(|e| e.into_inner());
        map.insert(addr, size);
        Ok(Segment { addr, bytes: size })
    }

    fn release(&self, segment: Segment) -> Result<(), AllocError> {
        let mut map = self.outstanding.lock().unwrap_or_else(|e| e.into_inner());
        match map.get(&segment.addr) {
            Some(&size) if size == segment.bytes => {
                map.remove(&segment.addr);
            }
            _ => {
                return Err(Self::error(
                    "release",
                    format!("unknown segment {segment:?}"),
                ));
            }
        }
        drop(map);
        // SAFETY: the segment was returned by `reserve` with exactly this size and alignment
        // (checked against the outstanding map, which it has now left, so it is freed once).
        unsafe { free(segment.addr, segment.bytes) };
        Ok(())
    }

    fn granularity(&self) -> usize {
        HOST_GRANULARITY
    }

    fn alignment(&self) -> usize {
        HOST_ALIGN
    }

    fn capacity(&self) -> Option<u64> {
        self.capacity
    }

    fn free_bytes(&self) -> Option<u64> {
        self.capacity
            .map(|c| c.saturating_sub(self.outstanding_bytes()))
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        let map = std::mem::take(
            self.outstanding
                .get_mut()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for (addr, size) in map {
            // SAFETY: every entry of the map is a live segment from `reserve`.
            unsafe { free(addr, size) };
        }
    }
}

/// # Safety
/// `addr` and `size` must describe a live block from `alloc_zeroed` with `HOST_ALIGN`.
unsafe fn free(addr: u64, size: usize) {
    if let Ok(layout) = Layout::from_size_align(size, HOST_ALIGN) {
        // SAFETY: guaranteed by the caller.
        unsafe { dealloc(addr as usize as *mut u8, layout) };
    }
}
