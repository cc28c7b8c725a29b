//! A simulated device: fixed capacity, configurable granularity and per-call cost, virtual
//! addresses. Used by the tests and benches on machines without a GPU.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::{AllocError, RawMemory, Segment};

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
/// Outstanding segments and call counts are tracked, so tests can check for leaks.
#[derive(Debug)]
pub struct SimMemory {
    capacity: u64,
    granularity: usize,
    alignment: usize,
    call_cost: Duration,
    stream_ordered: bool,
    state: Mutex<SimState>,
}

#[derive(Debug, Default)]
struct SimState {
    next_addr: u64,
    used: u64,
    outstanding: BTreeMap<u64, usize>,
    reserves: u64,
    releases: u64,
    release_threshold: Option<u64>,
    trims: u64,
}

impl SimMemory {
    /// A simulated device of `capacity` bytes whose reservations are rounded up to
    /// `granularity` bytes (rounded up to a power of two, at least 1; 2 MiB mirrors CUDA).
    /// Alignment is 256 bytes, as on a CUDA device; calls are free; not stream-ordered.
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

    /// Makes every `reserve` and `release` busy-wait for `cost` (a driver call's latency).
    pub fn with_call_cost(mut self, cost: Duration) -> Self {
        self.call_cost = cost;
        self
    }

    /// Makes the backend claim to be a stream-ordered pool (`cuMemAllocAsync`), so that the
    /// `async` strategy can be exercised without a GPU.
    pub fn with_stream_ordered(mut self, on: bool) -> Self {
        self.stream_ordered = on;
        self
    }

    /// Segments reserved and not yet released, in address order.
    pub fn outstanding(&self) -> Vec<Segment> {
        let st = self.lock();
        st.outstanding
            .iter()
            .map(|(&addr, &bytes)| Segment { addr, bytes })
            .collect()
    }

    /// Bytes currently reserved (sum of outstanding segments).
    pub fn used(&self) -> u64 {
        self.lock().used
    }

    /// Number of `reserve` calls so far (successful or not).
    pub fn reserve_calls(&self) -> u64 {
        self.lock().reserves
    }

    /// Number of `release` calls so far (successful or not).
    pub fn release_calls(&self) -> u64 {
        self.lock().releases
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
            return Err(AllocError::Backend {
                backend: "sim".into(),
                op: "reserve",
                message: "zero-byte segment".into(),
            });
        }
        let oom = || AllocError::BackendOutOfMemory {
            backend: "sim".into(),
            op: "reserve",
            requested: bytes as u64,
        };
        let size = crate::round_up(bytes, self.granularity).ok_or_else(oom)?;
        if st.used.saturating_add(size as u64) > self.capacity {
            return Err(oom());
        }
        let step = self.granularity.max(self.alignment) as u64;
        let addr = st.next_addr;
        let next = addr
            .checked_add(size as u64)
            .and_then(|e| e.checked_add(step))
            .and_then(|e| e.checked_next_multiple_of(step))
            .ok_or_else(oom)?;
        st.next_addr = next;
        st.used += size as u64;
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
                st.used -= size as u64;
                Ok(())
            }
            _ => Err(AllocError::Backend {
                backend: "sim".into(),
                op: "release",
                message: format!("unknown segment {segment:?}"),
            }),
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
        Some(self.capacity.saturating_sub(self.lock().used))
    }

    fn stream_ordered(&self) -> bool {
        self.stream_ordered
    }

    fn set_release_threshold(&self, bytes: u64) -> Result<(), AllocError> {
        self.lock().release_threshold = Some(bytes);
        Ok(())
    }

    fn trim(&self) -> Result<(), AllocError> {
        self.lock().trims += 1;
        Ok(())
    }
}
