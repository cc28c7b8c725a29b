//! The `expandable` strategy, after PyTorch's `expandable_segments`: one virtual address range,
//! physical pages mapped under the blocks that need them.
//!
//! At start-up one address range of twice the backend's capacity is reserved
//! ([`crate::VirtualMemory::reserve_range`]; it holds no memory). Blocks are cut from it by best-fit
//! with coalescing (the arena of `block.rs`, one segment; a freed block of exactly the size
//! asked is taken back first, otherwise every freed block is coalesced before the lookup, so
//! mapped holes are found before unmapped addresses), so the address space never fragments
//! into segments: a request fits wherever a free run of addresses is long enough.
//! Memory lives in *chunks* (the backend's page size, or a power-of-two multiple of it when
//! the range would hold more than [`MAX_CHUNKS`] pages): a chunk is mapped when a block that
//! touches it is allocated, one [`crate::VirtualMemory::map`] call per run of missing chunks, and
//! every chunk is its own physical allocation, so it can be unmapped alone.
//!
//! Chunks no live block touches stay mapped (the cache) until
//! - a new mapping would take `reserved` past 9/8 of the highest number of chunks live blocks
//!   have touched so far (this request included; the eighth is slack, so that a workload
//!   moving around does not unmap and map at every allocation): idle chunks are unmapped,
//!   highest addresses first, until the mapping fits that highest number itself. Unmapping
//!   every idle chunk always suffices, which gives the bound `reserved <= chunk x (p + p / 8)`
//!   with `p` the most chunks live blocks have touched at once so far;
//! - mapping fails for lack of memory: every idle chunk is unmapped and the mapping retried;
//! - `empty_cache`: every idle chunk is unmapped.
//!
//! [`crate::Allocation::offset`] is the offset from the start of the address range; snapshot
//! segments are the runs of mapped chunks, their blocks' offsets relative to the run.

use std::collections::BTreeMap;

use crate::block::{Arena, Tag};
use crate::stats::{BlockSnapshot, BlockState, PoolKind, SegmentSnapshot};
use crate::strategy::{Grant, Metered, Pool, Refusal, Strategy};
use crate::{AllocError, Segment, round_up};

/// The most chunks the address range is cut into (their per-chunk counters take 5 bytes each).
pub(crate) const MAX_CHUNKS: u64 = 1 << 22;

#[derive(Debug)]
pub(crate) struct Expandable {
    arena: Arena,
    range: Segment,
    chunk: usize,
    capacity: u64,
    /// Per chunk: the number of live blocks touching it.
    live: Vec<u32>,
    /// Per chunk: mapped or not (mapped with no live block: idle, the cache).
    mapped: Vec<bool>,
    /// The runs of mapped chunks: first -> last (inclusive).
    runs: BTreeMap<usize, usize>,
    mapped_chunks: u64,
    touched: u64,
    touched_peak: u64,
    /// Bytes of the live blocks.
    live_bytes: u64,
}

impl Expandable {
    pub fn new(mem: &mut Metered<'_>, strategy: &Strategy) -> Result<Self, AllocError> {
        let vm = mem.virtual_memory(strategy)?;
        let raw = mem.raw;
        let unsupported = |reason: String| AllocError::Unsupported {
            strategy: strategy.to_string(),
            backend: raw.name(),
            reason,
        };
        let capacity = raw
            .capacity()
            .ok_or_else(|| unsupported("the backend reports no capacity".into()))?;
        let align = raw.alignment().max(1);
        let mut chunk = vm.page_size().max(align).next_power_of_two();
        let want = capacity.saturating_mul(2).max(chunk as u64);
        while want.div_ceil(chunk as u64) > MAX_CHUNKS {
            chunk *= 2;
        }
        let bytes = usize::try_from(want)
            .ok()
            .and_then(|w| round_up(w, chunk))
            .ok_or_else(|| unsupported(format!("an address range of {want} bytes overflows")))?;
        let range = mem.reserve_range(vm, bytes)?;
        let mut arena = Arena::new(align, PoolKind::Mapped).coalescing_first();
        if range.addr % chunk as u64 != 0 || range.bytes < bytes || !arena.add_segment(range) {
            let _ = mem.release_range(vm, range);
            return Err(unsupported(format!(
                "the address range {range:?} is not {bytes} bytes aligned to {chunk}"
            )));
        }
        let n = range.bytes / chunk;
        Ok(Expandable {
            arena,
            range,
            chunk,
            capacity,
            live: vec![0; n],
            mapped: vec![false; n],
            runs: BTreeMap::new(),
            mapped_chunks: 0,
            touched: 0,
            touched_peak: 0,
            live_bytes: 0,
        })
    }

    /// The chunks `[first, last]` that `[addr, addr + size)` touches (`size > 0`).
    fn chunks(&self, addr: u64, size: usize) -> (usize, usize) {
        let off = (addr - self.range.addr) as usize;
        (off / self.chunk, (off + size - 1) / self.chunk)
    }

    fn pages(&self, first: usize, last: usize) -> Segment {
        Segment {
            addr: self.range.addr + (first * self.chunk) as u64,
            bytes: (last + 1 - first) * self.chunk,
        }
    }

    fn is_mapped(&self, c: Option<usize>) -> bool {
        c.is_some_and(|c| self.mapped.get(c).copied().unwrap_or(false))
    }

    /// Maps every unmapped chunk of `[first, last]`, one call per run. On failure the runs
    /// mapped by this call are unmapped again and the error returned.
    fn map_missing(
        &mut self,
        mem: &mut Metered<'_>,
        first: usize,
        last: usize,
    ) -> Result<(), AllocError> {
        let raw = mem.raw;
        let vm = raw.virtual_memory().ok_or_else(|| AllocError::Backend {
            backend: raw.name(),
            op: "map",
            message: "virtual memory disappeared".into(),
        })?;
        let mut done = Vec::new();
        let mut c = first;
        while c <= last {
            if self.mapped[c] {
                c += 1;
                continue;
            }
            let start = c;
            while c <= last && !self.mapped[c] {
                c += 1;
            }
            let runs = 1
                - i64::from(self.is_mapped(start.checked_sub(1)))
                - i64::from(self.is_mapped(Some(c)));
            if let Err(e) = mem.map(vm, self.pages(start, c - 1), runs) {
                for (a, b) in done {
                    self.unmap_run(mem, a, b);
                }
                return Err(e);
            }
            self.mapped[start..c].fill(true);
            self.mapped_chunks += (c - start) as u64;
            self.add_run(start, c - 1);
            done.push((start, c - 1));
        }
        Ok(())
    }

    /// Unmaps the mapped, idle chunks `[a, b]` (a failure is counted in `backend_errors`).
    fn unmap_run(&mut self, mem: &mut Metered<'_>, a: usize, b: usize) {
        let runs = i64::from(self.is_mapped(a.checked_sub(1)))
            + i64::from(self.is_mapped(Some(b + 1)))
            - 1;
        let raw = mem.raw;
        if let Some(vm) = raw.virtual_memory() {
            let _ = mem.unmap(vm, self.pages(a, b), runs);
        }
        self.mapped[a..=b].fill(false);
        self.mapped_chunks -= (b + 1 - a) as u64;
        self.remove_run(a, b);
    }

    /// Records the newly mapped chunks `[a, b]`, merged with the runs beside them.
    fn add_run(&mut self, a: usize, b: usize) {
        let (mut first, mut last) = (a, b);
        if let Some((&s, &e)) = self.runs.range(..a).next_back() {
            if e + 1 == a {
                first = s;
                self.runs.remove(&s);
            }
        }
        if let Some(e) = self.runs.remove(&(b + 1)) {
            last = e;
        }
        self.runs.insert(first, last);
    }

    /// Records the unmapped chunks `[a, b]`, a part of one run.
    fn remove_run(&mut self, a: usize, b: usize) {
        let Some((&s, &e)) = self.runs.range(..=a).next_back() else {
            return;
        };
        self.runs.remove(&s);
        if s < a {
            self.runs.insert(s, a - 1);
        }
        if b < e {
            self.runs.insert(b + 1, e);
        }
    }

    /// Unmaps idle chunks outside `[keep.0, keep.1]`, highest first, `count` of them (all when
    /// None), one call per run. Scans every chunk: this runs only when the cache shrinks.
    fn unmap_idle(&mut self, mem: &mut Metered<'_>, count: Option<u64>, keep: (usize, usize)) {
        let mut left = count.unwrap_or(u64::MAX);
        let idle = |s: &Self, c: usize| s.mapped[c] && s.live[c] == 0 && (c < keep.0 || c > keep.1);
        let mut c = self.mapped.len();
        while left > 0 && c > 0 {
            c -= 1;
            if !idle(self, c) {
                continue;
            }
            // a run of idle chunks ending at `c`, at most `left` long
            let end = c;
            while left > 1 && c > 0 && idle(self, c - 1) {
                c -= 1;
                left -= 1;
            }
            left -= 1;
            self.unmap_run(mem, c, end);
        }
    }

    /// The runs of mapped chunks, as `[first, last]`, in address order.
    fn mapped_runs(&self) -> Vec<(usize, usize)> {
        self.runs.iter().map(|(&a, &b)| (a, b)).collect()
    }
}

impl Pool for Expandable {
    fn alloc(&mut self, mem: &mut Metered<'_>, size: usize, tag: Tag) -> Result<Grant, Refusal> {
        let Some(t) = self.arena.alloc(size, usize::MAX, tag) else {
            return Err(Refusal::NoFit {
                can_never_fit: size as u64 > self.capacity,
                cause: Some(format!(
                    "no free run of {size} bytes left in the address range of {} bytes",
                    self.range.bytes
                )),
            });
        };
        let (first, last) = self.chunks(t.addr, t.size);
        let missing = self.mapped[first..=last].iter().filter(|&&m| !m).count() as u64;
        if missing > 0 {
            let fresh = self.live[first..=last].iter().filter(|&&n| n == 0).count() as u64;
            let budget = self.touched_peak.max(self.touched + fresh);
            if self.mapped_chunks + missing > budget + budget / 8 {
                let over = self.mapped_chunks + missing - budget;
                self.unmap_idle(mem, Some(over), (first, last));
            }
            let mapped = match self.map_missing(mem, first, last) {
                Err(AllocError::BackendOutOfMemory { .. }) => {
                    self.unmap_idle(mem, None, (first, last));
                    self.map_missing(mem, first, last)
                }
                other => other,
            };
            if let Err(e) = mapped {
                self.arena.free(t.id);
                return Err(match e {
                    AllocError::BackendOutOfMemory { .. } => Refusal::NoFit {
                        can_never_fit: false,
                        cause: Some(e.to_string()),
                    },
                    other => Refusal::Error(other),
                });
            }
        }
        for c in first..=last {
            self.touched += u64::from(self.live[c] == 0);
            self.live[c] += 1;
        }
        self.touched_peak = self.touched_peak.max(self.touched);
        self.live_bytes += t.size as u64;
        Ok(Grant {
            addr: t.addr,
            handle: t.id as u64,
            block: t.size,
            segment: self.range.addr,
        })
    }

    fn free(&mut self, _mem: &mut Metered<'_>, handle: u64) -> Option<(usize, Tag)> {
        let id = u32::try_from(handle).ok()?;
        let (addr, size) = self.arena.used_block(id)?;
        let freed = self.arena.free(id)?;
        let (first, last) = self.chunks(addr, size);
        for c in first..=last {
            self.live[c] -= 1;
            self.touched -= u64::from(self.live[c] == 0);
        }
        self.live_bytes -= size as u64;
        Some(freed)
    }

    fn release_cached(&mut self, mem: &mut Metered<'_>) -> Result<(), AllocError> {
        self.arena.settle();
        let errors = mem.book.errors;
        self.unmap_idle(mem, None, (usize::MAX, 0));
        if mem.book.errors > errors {
            return Err(AllocError::Backend {
                backend: mem.raw.name(),
                op: "unmap",
                message: format!("{} unmap calls failed", mem.book.errors - errors),
            });
        }
        Ok(())
    }

    fn release_all(&mut self, mem: &mut Metered<'_>) {
        for (a, b) in self.mapped_runs() {
            self.unmap_run(mem, a, b);
        }
        let raw = mem.raw;
        if let Some(vm) = raw.virtual_memory() {
            let _ = mem.release_range(vm, self.range);
        }
        self.arena.take_all_segments();
    }

    fn settle(&mut self) {
        self.arena.settle();
    }

    fn largest_free(&self) -> u64 {
        self.snapshot()
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| b.state == BlockState::Free)
            .map(|b| b.bytes)
            .max()
            .unwrap_or(0)
    }

    fn free_bytes(&self) -> u64 {
        self.mapped_chunks * self.chunk as u64 - self.live_bytes
    }

    fn limit(&self) -> Option<u64> {
        Some(self.capacity)
    }

    fn snapshot(&self) -> Vec<SegmentSnapshot> {
        let Some(whole) = self.arena.snapshot().pop() else {
            return Vec::new();
        };
        let base = self.range.addr;
        let mut out = Vec::new();
        let mut blocks = whole.blocks.iter().peekable();
        for (a, b) in self.mapped_runs() {
            let seg = self.pages(a, b);
            let (start, end) = (seg.addr - base, seg.end() - base);
            let mut clipped = Vec::new();
            // Blocks before this run end before it (runs ascend); skip them.
            while blocks
                .peek()
                .is_some_and(|blk| blk.offset + blk.bytes <= start)
            {
                blocks.next();
            }
            let mut iter = blocks.clone();
            while let Some(blk) = iter.next_if(|blk| blk.offset < end) {
                let (lo, hi) = (blk.offset.max(start), (blk.offset + blk.bytes).min(end));
                clipped.push(BlockSnapshot {
                    offset: lo - start,
                    bytes: hi - lo,
                    ..blk.clone()
                });
            }
            out.push(SegmentSnapshot {
                addr: seg.addr,
                bytes: seg.bytes as u64,
                pool: PoolKind::Mapped,
                blocks: clipped,
            });
        }
        out
    }
}
