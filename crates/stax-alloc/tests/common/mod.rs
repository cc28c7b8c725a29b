//! Shared by the property tests and the adversarial suite (the one `mod.rs` of these tests:
//! Cargo would otherwise build it as a test of its own): [`Checker`] runs allocations and
//! frees on a simulated device and checks, after every one, that live bytes are exact, no
//! two live blocks overlap, blocks tile their segments, and `reserved` stays within the bound
//! each strategy states (see `stax_alloc::Strategy`), computed here from the live allocations
//! alone.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use stax_alloc::{
    AllocError, Allocation, Allocator, BlockState, Category, PoolKind, RawMemory, SimMemory,
    Strategy, Trace, TraceOp,
};

/// Requests of at most this many bytes use `caching`'s small pool.
const SMALL_LIMIT: u64 = 1 << 20;
/// `caching`'s small segments.
const SMALL_SEGMENT: u64 = 2 << 20;

/// Live allocations on one allocator, checked after every operation.
pub struct Checker {
    pub strategy: Strategy,
    pub sim: Arc<SimMemory>,
    pub alloc: Arc<Allocator>,
    pub live: Vec<Allocation>,
    /// The highest value of the strategy's bound quantity so far (bytes).
    bound_peak: u64,
    /// `bfc`: the arena; `platform`/`async`: unused.
    arena: u64,
}

fn round_up(x: u64, m: u64) -> u64 {
    x.div_ceil(m) * m
}

impl Checker {
    /// A fresh allocator of `strategy` on `sim`.
    ///
    /// # Errors
    /// The allocator's construction error.
    pub fn new(strategy: Strategy, sim: Arc<SimMemory>) -> Result<Checker, AllocError> {
        let alloc = Allocator::new(sim.clone(), strategy.clone())?;
        let g = sim.granularity() as u64;
        let capacity = sim.capacity().expect("a sim has a capacity");
        let arena = match strategy {
            Strategy::Bfc { fraction } => (capacity as f64 * fraction) as u64 / g * g,
            _ => 0,
        };
        let c = Checker {
            strategy,
            sim,
            alloc,
            live: Vec::new(),
            bound_peak: 0,
            arena,
        };
        c.check();
        Ok(c)
    }

    fn granularity(&self) -> u64 {
        self.sim.granularity() as u64
    }

    /// The strategy's bound quantity for the live allocations now (bytes): see the bounds
    /// table in `stax_alloc::Strategy`'s module docs.
    pub fn bound_now(&self) -> u64 {
        let g = self.granularity();
        let live = self.live.iter().filter(|a| a.bytes() > 0);
        match self.strategy {
            Strategy::Caching => live
                .map(|a| {
                    let b = a.allocated_bytes() as u64;
                    let fresh = if b <= SMALL_LIMIT {
                        round_up(SMALL_SEGMENT, g)
                    } else {
                        round_up(b, g)
                    };
                    fresh.max(2 * b)
                })
                .sum(),
            Strategy::Expandable => {
                let pages: BTreeSet<u64> = live
                    .flat_map(|a| {
                        let (first, last) = (
                            a.addr() / g,
                            (a.addr() + a.allocated_bytes() as u64 - 1) / g,
                        );
                        first..=last
                    })
                    .collect();
                pages.len() as u64 * g
            }
            Strategy::Bfc { .. } => self.arena,
            Strategy::Platform | Strategy::Async { .. } => {
                live.map(|a| round_up(a.bytes() as u64, g)).sum()
            }
        }
    }

    /// Allocates and checks; Ok(None) when the allocator is out of memory (a typed report
    /// for exactly this request).
    pub fn alloc(&mut self, bytes: usize, category: Category) -> Option<&Allocation> {
        let r = self.alloc.allocate(bytes, category);
        let out = match r {
            Ok(a) => {
                assert_eq!(a.bytes(), bytes);
                self.live.push(a);
                true
            }
            Err(AllocError::OutOfMemory(r)) => {
                assert_eq!(r.requested, bytes as u64);
                assert!(!r.to_string().is_empty());
                false
            }
            Err(e) => panic!("{}: unexpected error {e}", self.strategy),
        };
        self.bound_peak = self.bound_peak.max(self.bound_now());
        self.check();
        out.then(|| self.live.last().expect("just pushed"))
    }

    /// Frees live allocation `pick % live.len()` (nothing when none is live) and checks.
    pub fn free(&mut self, pick: usize) {
        if !self.live.is_empty() {
            let n = self.live.len();
            drop(self.live.swap_remove(pick % n));
        }
        self.check();
    }

    /// Frees every live allocation (checking after each).
    pub fn free_all(&mut self) {
        while !self.live.is_empty() {
            self.free(self.live.len() - 1);
        }
    }

    /// Replays `trace`, checking after every event, up to its end or the first allocation
    /// that runs out of memory (whose event index is returned); frees what is left either way.
    pub fn run_trace(&mut self, trace: &Trace) -> Option<usize> {
        let mut ids: HashMap<u64, u64> = HashMap::new();
        let mut failed = None;
        for (i, e) in trace.events.iter().enumerate() {
            match e.op {
                TraceOp::Alloc => match self.alloc(e.bytes as usize, e.category) {
                    Some(a) => {
                        ids.insert(e.id, a.id());
                    }
                    None => {
                        failed = Some(i);
                        break;
                    }
                },
                TraceOp::Free => {
                    let id = ids.remove(&e.id).expect("a free of a live id");
                    let at = self.live.iter().position(|a| a.id() == id).expect("live");
                    self.free(at);
                }
            }
        }
        self.free_all();
        failed
    }

    /// The bound `reserved` must stay under (bytes).
    pub fn bound(&self) -> u64 {
        let g = self.granularity();
        match self.strategy {
            Strategy::Caching => self.bound_peak,
            // the peak of pages touched, and an eighth of it (whole pages) of slack
            Strategy::Expandable => self.bound_peak + self.bound_peak / g / 8 * g,
            _ => self.bound_now(),
        }
    }

    /// Checks every invariant, the strategy's bound included.
    pub fn check(&self) {
        let snap = self.alloc.snapshot();
        let s = &snap.stats;
        let align = self.alloc.alignment() as u64;
        let name = &self.strategy;

        // Blocks tile their segments; recompute the counters.
        let (mut reserved, mut allocated, mut requested, mut free_bytes, mut largest) =
            (0, 0, 0, 0, 0);
        let mut cat_live = [0u64; 7];
        let mut cat_alloc = [0u64; 7];
        let mut used = Vec::new();
        for seg in &snap.segments {
            reserved += seg.bytes;
            let mut offset = 0;
            for b in &seg.blocks {
                assert_eq!(
                    b.offset, offset,
                    "{name}: blocks must tile segment {:#x}",
                    seg.addr
                );
                assert_eq!(
                    (seg.addr + b.offset) % align,
                    0,
                    "{name}: block not aligned"
                );
                offset += b.bytes;
                match b.state {
                    BlockState::Used => {
                        let c = b.category.expect("used block has a category").index();
                        allocated += b.bytes;
                        requested += b.requested;
                        cat_live[c] += b.requested;
                        cat_alloc[c] += b.bytes;
                        assert!(b.requested <= b.bytes);
                        used.push((seg.addr + b.offset, b.bytes, seg.addr, seg.bytes, seg.pool));
                    }
                    BlockState::Free => {
                        free_bytes += b.bytes;
                        largest = largest.max(b.bytes);
                    }
                }
            }
            assert_eq!(
                offset, seg.bytes,
                "{name}: blocks must cover segment {:#x}",
                seg.addr
            );
        }
        assert_eq!(s.reserved, reserved, "{name}");
        assert_eq!(s.allocated, allocated, "{name}");
        assert_eq!(s.requested, requested, "{name}");
        assert_eq!(s.cached, reserved - allocated, "{name}");
        assert_eq!(s.largest_free_block, largest, "{name}");
        assert_eq!(s.segments, snap.segments.len() as u64, "{name}");
        let frag = if free_bytes == 0 {
            0.0
        } else {
            1.0 - largest as f64 / free_bytes as f64
        };
        assert!((s.fragmentation - frag).abs() < 1e-12, "{name}");
        for c in Category::ALL {
            let i = c.index();
            assert_eq!(s.by_category[i].live, cat_live[i], "{name}: {c} live");
            assert_eq!(
                s.by_category[i].allocated, cat_alloc[i],
                "{name}: {c} allocated"
            );
            assert!(s.by_category[i].peak >= cat_live[i]);
        }
        assert!(s.peak_requested >= s.requested && s.peak_reserved >= s.reserved);
        assert_eq!(s.live_allocations(), self.live.len() as u64, "{name}");
        // Exact live bytes: the counters equal what the live handles asked for.
        let want: u64 = self.live.iter().map(|a| a.bytes() as u64).sum();
        assert_eq!(s.requested, want, "{name}: live bytes are exact");
        let pool_cache = self.sim.pool_usage().unwrap().map_or(0, |p| p.cached());
        assert_eq!(
            self.sim.used(),
            reserved + pool_cache,
            "{name}: the backend holds exactly the reserved segments (and a pool's cache)"
        );

        // Live allocations: aligned, inside their block and segment, disjoint, one per used block.
        let mut by_addr: BTreeMap<u64, &Allocation> = BTreeMap::new();
        for a in self.live.iter().filter(|a| a.bytes() > 0) {
            assert_eq!(a.addr() % align, 0);
            assert!(
                by_addr.insert(a.addr(), a).is_none(),
                "{name}: two live allocations at one address"
            );
        }
        assert_eq!(
            by_addr.len(),
            used.len(),
            "{name}: one used block per live allocation"
        );
        used.sort_by_key(|u| u.0);
        let ranges = self.sim.ranges();
        let mut prev_end = 0;
        for (addr, bytes, seg_addr, seg_bytes, pool) in used {
            let a = by_addr
                .get(&addr)
                .expect("used block belongs to a live allocation");
            assert_eq!(a.allocated_bytes() as u64, bytes);
            assert!(a.bytes() as u64 <= bytes);
            assert!(
                addr >= seg_addr && addr + bytes <= seg_addr + seg_bytes,
                "{name}: inside segment"
            );
            // expandable: offsets are from the start of the one address range
            let base = if pool == PoolKind::Mapped {
                ranges[0].addr
            } else {
                seg_addr
            };
            assert_eq!(a.offset(), addr - base, "{name}");
            assert!(addr >= prev_end, "{name}: live blocks overlap");
            prev_end = addr + bytes;
        }

        // The stated bound.
        let bound = self.bound();
        match self.strategy {
            Strategy::Caching | Strategy::Expandable => assert!(
                s.reserved <= bound,
                "{name}: reserved {} exceeds the bound {bound}",
                s.reserved
            ),
            _ => assert_eq!(s.reserved, bound, "{name}: reserved is exactly the bound"),
        }
    }
}
