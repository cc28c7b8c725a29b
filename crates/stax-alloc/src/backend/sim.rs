//! A simulated device: fixed capacity, configurable granularity and per-call cost, virtual
//! addresses, CUDA's virtual memory management, and (optionally) a stream-ordered pool that
//! keeps freed memory cached. Used by the tests and benches on machines without a GPU.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::{AllocError, PoolUsage, RawMemory, Segment, VirtualMemory};

/// First virtual address handed out (4 GiB, so that 0 is never a valid address).
const SIM_BASE: u64 = 1 << 32;

/// A simulated device memory with a fixed `capacity` in bytes.
///
/// Like `cuMemAlloc`, [`reserve`](RawMemory::reserve) rounds every request up to the
/// granularity and fails with [`AllocError::BackendOutOfMemory`] when the rounded size does not
/// fit in what is left. Addresses are virtual (never dereference them), aligned to the
/// granularity and never reused, and separated by a gap so that a block straying out of its
/// segment is caught by the tests. Every call may cost a configurable busy-wait, to model the
/// 30-60 us a real `cuMemAlloc`/`cuMemFree` takes.
///
/// Virtual memory ([`RawMemory::virtual_memory`], on unless
/// [`with_virtual_memory(false)`](SimMemory::with_virtual_memory)) is modelled as CUDA's: an
/// address range costs nothing until pages (of the granularity) are mapped into it, mapped
/// pages count against the capacity, and every misuse (a page mapped twice, unmapped when not
/// mapped, outside a range, a range released with pages mapped) is an error.
///
/// A stream-ordered sim ([`with_stream_ordered`](SimMemory::with_stream_ordered)) models the
/// pool's cache too: released segments stay held by the pool, up to the release threshold
/// the `async` strategy sets, and are reused by later reservations; [`RawMemory::trim`] gives
/// them back. [`RawMemory::pool_usage`] reports held and used bytes as a CUDA pool does.
///
/// Outstanding segments and call counts are tracked, so tests can check for leaks.
#[derive(Debug)]
pub struct SimMemory {
    capacity: u64,
    granularity: usize,
    alignment: usize,
    call_cost: Duration,
    stream_ordered: bool,
    virtual_memory: bool,
    state: Mutex<SimState>,
}

#[derive(Debug, Default)]
struct SimState {
    next_addr: u64,
    /// Bytes of outstanding segments and mapped pages.
    live: u64,
    /// Bytes a stream-ordered pool keeps cached (counted as used on the device).
    pool_cached: u64,
    outstanding: BTreeMap<u64, usize>,
    /// Reserved address ranges: start -> bytes.
    ranges: BTreeMap<u64, usize>,
    /// Start addresses of mapped pages.
    pages: BTreeSet<u64>,
    reserves: u64,
    releases: u64,
    maps: u64,
    unmaps: u64,
    release_threshold: Option<u64>,
    trims: u64,
}

impl SimMemory {
    /// A simulated device of `capacity` bytes whose reservations are rounded up to
    /// `granularity` bytes (rounded up to a power of two, at least 1; 2 MiB mirrors CUDA).
    /// Alignment is 256 bytes, as on a CUDA device; calls are free; not stream-ordered;
    /// virtual memory on, with pages of the granularity.
    pub fn new(capacity: u64, granularity: usize) -> Self {
        let granularity = granularity
            .max(1)
            .checked_next_power_of_two()
            .unwrap_or(1 << 30);
        SimMemory {
            capacity,
            granularity,
            alignment: 256,
            call_cost: Duration::ZERO,
            stream_ordered: false,
            virtual_memory: true,
            state: Mutex::new(SimState {
                next_addr: SIM_BASE,
                ..SimState::default()
            }),
        }
    }

    /// Sets the alignment in bytes (rounded up to a power of two) that the allocator uses.
    pub fn with_alignment(mut self, alignment: usize) -> Self {
        self.alignment = alignment.max(1).checked_next_power_of_two().unwrap_or(256);
        self
    }

    /// Makes every backend call (reserve, release, map, unmap) busy-wait for `cost` (a driver
    /// call's latency).
    pub fn with_call_cost(mut self, cost: Duration) -> Self {
        self.call_cost = cost;
        self
    }

    /// Makes the backend a stream-ordered pool (`cuMemAllocAsync`) that caches what is
    /// released up to its release threshold, so that the `async` strategy can be exercised
    /// without a GPU.
    pub fn with_stream_ordered(mut self, on: bool) -> Self {
        self.stream_ordered = on;
        self
    }

    /// Turns the virtual-memory capability on (the default) or off (a device without VMM).
    pub fn with_virtual_memory(mut self, on: bool) -> Self {
        self.virtual_memory = on;
        self
    }

    /// Segments reserved and not yet released, in address order (mapped pages not included).
    pub fn outstanding(&self) -> Vec<Segment> {
        let st = self.lock();
        st.outstanding
            .iter()
            .map(|(&addr, &bytes)| Segment { addr, bytes })
            .collect()
    }

    /// Bytes of the device in use: outstanding segments, mapped pages and what a
    /// stream-ordered pool keeps cached.
    pub fn used(&self) -> u64 {
        let st = self.lock();
        st.live + st.pool_cached
    }

    /// Bytes of mapped pages (virtual memory).
    pub fn mapped(&self) -> u64 {
        self.lock().pages.len() as u64 * self.granularity as u64
    }

    /// Address ranges reserved and not yet released, in address order.
    pub fn ranges(&self) -> Vec<Segment> {
        let st = self.lock();
        st.ranges
            .iter()
            .map(|(&addr, &bytes)| Segment { addr, bytes })
            .collect()
    }

    /// Number of `reserve` calls so far (successful or not).
    pub fn reserve_calls(&self) -> u64 {
        self.lock().reserves
    }

    /// Number of `release` calls so far (successful or not).
    pub fn release_calls(&self) -> u64 {
        self.lock().releases
    }

    /// Number of `map` calls so far (successful or not).
    pub fn map_calls(&self) -> u64 {
        self.lock().maps
    }

    /// Number of `unmap` calls so far (successful or not).
    pub fn unmap_calls(&self) -> u64 {
        self.lock().unmaps
    }

    /// The release threshold last set by the `async` strategy, if any.
    pub fn release_threshold(&self) -> Option<u64> {
        self.lock().release_threshold
    }

    /// Number of `trim` calls so far.
    pub fn trim_calls(&self) -> u64 {
        self.lock().trims
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SimState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn pay(&self) {
        if self.call_cost > Duration::ZERO {
            let t = Instant::now();
            while t.elapsed() < self.call_cost {
                std::hint::spin_loop();
            }
        }
    }

    /// The next fresh address range of `size` bytes (followed by a one-step gap).
    fn fresh_addr(&self, st: &mut SimState, size: usize) -> Option<u64> {
        let step = self.granularity.max(self.alignment) as u64;
        let addr = st.next_addr;
        st.next_addr = addr
            .checked_add(size as u64)
            .and_then(|e| e.checked_add(step))
            .and_then(|e| e.checked_next_multiple_of(step))?;
        Some(addr)
    }

    /// Checks that `pages` is page-aligned, non-empty and inside one reserved range.
    fn check_pages(
        &self,
        st: &SimState,
        op: &'static str,
        pages: Segment,
    ) -> Result<(), AllocError> {
        let g = self.granularity as u64;
        let inside = st
            .ranges
            .range(..=pages.addr)
            .next_back()
            .is_some_and(|(&a, &b)| pages.end() <= a + b as u64);
        if pages.bytes == 0 || pages.addr % g != 0 || pages.bytes as u64 % g != 0 || !inside {
            return Err(sim_error(
                op,
                format!("{pages:?} is not whole pages of a reserved range"),
            ));
        }
        Ok(())
    }
}

fn sim_error(op: &'static str, message: String) -> AllocError {
    AllocError::Backend {
        backend: "sim".into(),
        op,
        message,
    }
}

impl RawMemory for SimMemory {
    fn name(&self) -> String {
        "sim".into()
    }

    fn reserve(&self, bytes: usize) -> Result<Segment, AllocError> {
        self.pay();
        let mut st = self.lock();
        st.reserves += 1;
        if bytes == 0 {
            return Err(sim_error("reserve", "zero-byte segment".into()));
        }
        let oom = || AllocError::BackendOutOfMemory {
            backend: "sim".into(),
            op: "reserve",
            requested: bytes as u64,
        };
        let size = crate::round_up(bytes, self.granularity).ok_or_else(oom)?;
        // A pool's cache can always be reused or given back for a new reservation.
        if st.live.saturating_add(size as u64) > self.capacity {
            return Err(oom());
        }
        let addr = self.fresh_addr(&mut st, size).ok_or_else(oom)?;
        st.live += size as u64;
        st.pool_cached = st
            .pool_cached
            .saturating_sub(size as u64)
            .min(self.capacity - st.live);
        st.outstanding.insert(addr, size);
        Ok(Segment { addr, bytes: size })
    }

    fn release(&self, segment: Segment) -> Result<(), AllocError> {
        self.pay();
        let mut st = self.lock();
        st.releases += 1;
        match st.outstanding.get(&segment.addr) {
            Some(&size) if size == segment.bytes => {
                st.outstanding.remove(&segment.addr);
                st.live -= size as u64;
                if self.stream_ordered {
                    let keep = st.release_threshold.unwrap_or(0);
                    st.pool_cached = (st.pool_cached + size as u64).min(keep);
                }
                Ok(())
            }
            _ => Err(sim_error("release", format!("unknown segment {segment:?}"))),
        }
    }

    fn granularity(&self) -> usize {
        self.granularity
    }

    fn alignment(&self) -> usize {
        self.alignment
    }

    fn capacity(&self) -> Option<u64> {
        Some(self.capacity)
    }

    fn free_bytes(&self) -> Option<u64> {
        Some(self.capacity.saturating_sub(self.used()))
    }

    fn stream_ordered(&self) -> bool {
        self.stream_ordered
    }

    fn set_release_threshold(&self, bytes: u64) -> Result<(), AllocError> {
        self.lock().release_threshold = Some(bytes);
        Ok(())
    }

    fn trim(&self) -> Result<(), AllocError> {
        let mut st = self.lock();
        st.trims += 1;
        st.pool_cached = 0;
        Ok(())
    }

    fn pool_usage(&self) -> Result<Option<PoolUsage>, AllocError> {
        if !self.stream_ordered {
            return Ok(None);
        }
        let st = self.lock();
        let used: u64 = st.outstanding.values().map(|&b| b as u64).sum();
        Ok(Some(PoolUsage {
            reserved: used + st.pool_cached,
            used,
        }))
    }

    fn virtual_memory(&self) -> Option<&dyn VirtualMemory> {
        self.virtual_memory.then_some(self as &dyn VirtualMemory)
    }
}

impl VirtualMemory for SimMemory {
    fn page_size(&self) -> usize {
        self.granularity
    }

    fn reserve_range(&self, bytes: usize) -> Result<Segment, AllocError> {
        self.pay();
        let mut st = self.lock();
        st.reserves += 1;
        let size = crate::round_up(bytes, self.granularity).filter(|&s| s > 0);
        let Some((size, addr)) = size.and_then(|s| Some((s, self.fresh_addr(&mut st, s)?))) else {
            return Err(sim_error(
                "reserve_range",
                format!("no range of {bytes} bytes"),
            ));
        };
        st.ranges.insert(addr, size);
        Ok(Segment { addr, bytes: size })
    }

    fn release_range(&self, range: Segment) -> Result<(), AllocError> {
        self.pay();
        let mut st = self.lock();
        st.releases += 1;
        let known = st.ranges.get(&range.addr) == Some(&range.bytes);
        let mapped = st.pages.range(range.addr..range.end()).next().is_some();
        if !known || mapped {
            let why = if known {
                "has pages mapped"
            } else {
                "is unknown"
            };
            return Err(sim_error("release_range", format!("range {range:?} {why}")));
        }
        st.ranges.remove(&range.addr);
        Ok(())
    }

    fn map(&self, pages: Segment) -> Result<(), AllocError> {
        self.pay();
        let mut st = self.lock();
        st.maps += 1;
        self.check_pages(&st, "map", pages)?;
        if st.pages.range(pages.addr..pages.end()).next().is_some() {
            return Err(sim_error(
                "map",
                format!("{pages:?} is already mapped in part"),
            ));
        }
        if st.live.saturating_add(pages.bytes as u64) > self.capacity {
            return Err(AllocError::BackendOutOfMemory {
                backend: "sim".into(),
                op: "map",
                requested: pages.bytes as u64,
            });
        }
        let g = self.granularity as u64;
        st.pages
            .extend((pages.addr..pages.end()).step_by(g as usize));
        st.live += pages.bytes as u64;
        st.pool_cached = st.pool_cached.min(self.capacity - st.live);
        Ok(())
    }

    fn unmap(&self, pages: Segment) -> Result<(), AllocError> {
        self.pay();
        let mut st = self.lock();
        st.unmaps += 1;
        self.check_pages(&st, "unmap", pages)?;
        let g = self.granularity as u64;
        let count = st.pages.range(pages.addr..pages.end()).count() as u64;
        if count * g != pages.bytes as u64 {
            return Err(sim_error(
                "unmap",
                format!("{pages:?} is not mapped in full"),
            ));
        }
        for p in (pages.addr..pages.end()).step_by(g as usize) {
            st.pages.remove(&p);
        }
        st.live -= pages.bytes as u64;
        Ok(())
    }
}
