//! Property tests: random allocation/free sequences for every strategy on the simulated
//! backend. After every step: no two live blocks overlap, every block is aligned and inside
//! its segment, the snapshot's blocks tile each segment, and the counters equal the sums
//! recomputed from the snapshot. Per strategy: `caching` leaves each segment one free block
//! once everything is freed, `bfc` never calls the backend after start-up, `platform` makes
//! exactly one backend call per allocation and per free.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use proptest::strategy::Strategy as _;
use stax_alloc::{
    AllocError, Allocation, Allocator, BlockState, Category, RawMemory, SimMemory, Strategy,
};

const CAPACITY: u64 = 96 << 20;
const GRANULARITY: usize = 2 << 20;

#[derive(Debug, Clone)]
enum Op {
    Alloc { bytes: usize, category: usize },
    Free { pick: usize },
}

fn size() -> impl proptest::strategy::Strategy<Value = usize> {
    prop_oneof![
        1 => Just(0usize),
        6 => 1usize..=4096,
        3 => 4097usize..=(1 << 20),
        3 => ((1usize << 20) + 1)..=(12 << 20),
        1 => (40usize << 20)..=(120 << 20), // sometimes too big for what is left
    ]
}

fn ops() -> impl proptest::strategy::Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        3 => (size(), 0usize..7).prop_map(|(bytes, category)| Op::Alloc { bytes, category }),
        2 => any::<usize>().prop_map(|pick| Op::Free { pick }),
    ];
    proptest::collection::vec(op, 1..80)
}

/// Checks every invariant that holds for all strategies.
fn check(alloc: &Arc<Allocator>, sim: &SimMemory, live: &[Allocation]) {
    let snap = alloc.snapshot();
    let s = &snap.stats;
    let align = alloc.alignment() as u64;

    // Blocks tile their segments; recompute the counters.
    let (mut reserved, mut allocated, mut requested, mut free_bytes, mut largest) = (0, 0, 0, 0, 0);
    let mut cat_live = [0u64; 7];
    let mut cat_alloc = [0u64; 7];
    let mut used_addrs = Vec::new();
    for seg in &snap.segments {
        reserved += seg.bytes;
        let mut offset = 0;
        for b in &seg.blocks {
            assert_eq!(b.offset, offset, "blocks must tile segment {:#x}", seg.addr);
            assert_eq!((seg.addr + b.offset) % align, 0, "block not aligned");
            offset += b.bytes;
            match b.state {
                BlockState::Used => {
                    let c = b.category.expect("used block has a category").index();
                    allocated += b.bytes;
                    requested += b.requested;
                    cat_live[c] += b.requested;
                    cat_alloc[c] += b.bytes;
                    assert!(b.requested <= b.bytes);
                    used_addrs.push((seg.addr + b.offset, b.bytes, seg.addr, seg.bytes));
                }
                BlockState::Free => {
                    free_bytes += b.bytes;
                    largest = largest.max(b.bytes);
                }
            }
        }
        assert_eq!(
            offset, seg.bytes,
            "blocks must cover segment {:#x}",
            seg.addr
        );
    }
    assert_eq!(s.reserved, reserved);
    assert_eq!(s.allocated, allocated);
    assert_eq!(s.requested, requested);
    assert_eq!(s.cached, reserved - allocated);
    assert_eq!(s.largest_free_block, largest);
    assert_eq!(s.segments, snap.segments.len() as u64);
    let frag = if free_bytes == 0 {
        0.0
    } else {
        1.0 - largest as f64 / free_bytes as f64
    };
    assert!((s.fragmentation - frag).abs() < 1e-12);
    for c in Category::ALL {
        assert_eq!(
            s.by_category[c.index()].live,
            cat_live[c.index()],
            "{c} live"
        );
        assert_eq!(
            s.by_category[c.index()].allocated,
            cat_alloc[c.index()],
            "{c} allocated"
        );
        assert!(s.by_category[c.index()].peak >= cat_live[c.index()]);
    }
    assert!(s.peak_requested >= s.requested && s.peak_reserved >= s.reserved);
    assert_eq!(s.live_allocations(), live.len() as u64);
    assert_eq!(
        sim.used(),
        reserved,
        "the backend holds exactly the reserved segments"
    );

    // Live allocations: aligned, inside their block and segment, disjoint, one per used block.
    let mut by_addr: BTreeMap<u64, &Allocation> = BTreeMap::new();
    for a in live.iter().filter(|a| a.bytes() > 0) {
        assert_eq!(a.addr() % align, 0);
        assert!(
            by_addr.insert(a.addr(), a).is_none(),
            "two live allocations at one address"
        );
    }
    assert_eq!(
        by_addr.len(),
        used_addrs.len(),
        "one used block per live allocation"
    );
    used_addrs.sort();
    let mut prev_end = 0;
    for (addr, bytes, seg_addr, seg_bytes) in used_addrs {
        let a = by_addr
            .get(&addr)
            .expect("used block belongs to a live allocation");
        assert_eq!(a.allocated_bytes() as u64, bytes);
        assert!(a.bytes() as u64 <= bytes);
        assert!(
            addr >= seg_addr && addr + bytes <= seg_addr + seg_bytes,
            "inside segment"
        );
        assert_eq!(a.offset(), addr - seg_addr);
        assert!(addr >= prev_end, "live blocks overlap");
        prev_end = addr + bytes;
    }
}

/// Runs `ops`, checking after every step; returns the counts of backend calls expected for
/// `platform` (reserve attempts for non-zero requests, frees of non-zero allocations).
fn run(strategy: Strategy, sim: Arc<SimMemory>, ops: &[Op]) -> (Arc<Allocator>, u64, u64) {
    let alloc = Allocator::new(sim.clone(), strategy.clone()).expect("allocator");
    let mut live: Vec<Allocation> = Vec::new();
    let (mut attempts, mut nonzero_frees) = (0, 0);
    for op in ops {
        match *op {
            Op::Alloc { bytes, category } => {
                attempts += u64::from(bytes > 0);
                match alloc.allocate(bytes, Category::ALL[category]) {
                    Ok(a) => {
                        assert_eq!(a.bytes(), bytes);
                        live.push(a);
                    }
                    Err(AllocError::OutOfMemory(r)) => {
                        assert_eq!(r.requested, bytes as u64);
                        assert!(!r.to_string().is_empty());
                    }
                    Err(e) => panic!("{strategy}: unexpected error {e}"),
                }
            }
            Op::Free { pick } => {
                if !live.is_empty() {
                    let a = live.swap_remove(pick % live.len());
                    nonzero_frees += u64::from(a.bytes() > 0);
                }
            }
        }
        // Reading stats or a snapshot changes nothing, so the checks run after every step
        // while freed blocks stay parked and exact-size reuse is exercised.
        check(&alloc, &sim, &live);
    }
    check(&alloc, &sim, &live);
    for a in live.drain(..) {
        nonzero_frees += u64::from(a.bytes() > 0);
    }
    check(&alloc, &sim, &live);
    (alloc, attempts, nonzero_frees)
}

fn sim() -> Arc<SimMemory> {
    Arc::new(SimMemory::new(CAPACITY, GRANULARITY))
}

/// The offset of every allocation of `ops` under `strategy` (None where it failed), reading
/// the statistics and a snapshot after every op when `observe` is set.
fn placements(strategy: &Strategy, ops: &[Op], observe: bool) -> Vec<Option<u64>> {
    let alloc = Allocator::new(sim(), strategy.clone()).unwrap();
    let mut live: Vec<Allocation> = Vec::new();
    let mut out = Vec::new();
    for op in ops {
        match *op {
            Op::Alloc { bytes, category } => {
                let a = alloc.allocate(bytes, Category::ALL[category]).ok();
                out.push(a.as_ref().map(|a| a.addr()));
                live.extend(a);
            }
            Op::Free { pick } if !live.is_empty() => drop(live.swap_remove(pick % live.len())),
            Op::Free { .. } => {}
        }
        if observe {
            let _ = (alloc.stats(), alloc.snapshot());
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Placement depends only on the allocations and frees, never on reading figures (so a
    /// replay places as the recorded run did, whatever that run read meanwhile).
    #[test]
    fn reading_figures_never_changes_placement(ops in ops(), bfc in any::<bool>()) {
        let strategy = if bfc { Strategy::Bfc { fraction: 0.5 } } else { Strategy::Caching };
        prop_assert_eq!(placements(&strategy, &ops, true), placements(&strategy, &ops, false));
    }

    #[test]
    fn caching_invariants(ops in ops()) {
        let sim = sim();
        let (alloc, _, _) = run(Strategy::Caching, sim.clone(), &ops);
        let snap = alloc.snapshot();
        for seg in &snap.segments {
            prop_assert_eq!(seg.blocks.len(), 1, "segment {:#x} not coalesced", seg.addr);
            prop_assert_eq!(seg.blocks[0].state, BlockState::Free);
        }
        prop_assert_eq!(snap.stats.cached, snap.stats.reserved);
        alloc.empty_cache().unwrap();
        prop_assert_eq!(alloc.stats().reserved, 0);
        prop_assert!(sim.outstanding().is_empty());
    }

    #[test]
    fn bfc_invariants(ops in ops(), fraction in 0.3f64..=1.0) {
        let sim = sim();
        let (alloc, _, _) = run(Strategy::Bfc { fraction }, sim.clone(), &ops);
        let s = alloc.stats();
        prop_assert_eq!(s.backend_reserves, 1);
        prop_assert_eq!(s.backend_releases, 0);
        prop_assert_eq!(sim.reserve_calls(), 1);
        prop_assert_eq!(s.segments, 1);
        let expect = (CAPACITY as f64 * fraction) as u64 / GRANULARITY as u64 * GRANULARITY as u64;
        prop_assert_eq!(s.reserved, expect);
        prop_assert_eq!(alloc.snapshot().segments[0].blocks.len(), 1);
        drop(alloc);
        prop_assert!(sim.outstanding().is_empty(), "dropping the allocator releases the arena");
    }

    #[test]
    fn platform_invariants(ops in ops()) {
        let sim = sim();
        let (alloc, attempts, frees) = run(Strategy::Platform, sim.clone(), &ops);
        let s = alloc.stats();
        prop_assert_eq!(s.backend_reserves, attempts);
        prop_assert_eq!(s.backend_releases, frees);
        prop_assert_eq!(sim.reserve_calls(), attempts);
        prop_assert_eq!(sim.release_calls(), frees);
        prop_assert_eq!(s.reserved, 0);
        prop_assert!(sim.outstanding().is_empty());
    }

    #[test]
    fn async_invariants(ops in ops()) {
        let sim = Arc::new(SimMemory::new(CAPACITY, GRANULARITY).with_stream_ordered(true));
        let (alloc, attempts, frees) = run(Strategy::Async { release_threshold: 1 << 30 }, sim.clone(), &ops);
        prop_assert_eq!(sim.release_threshold(), Some(1 << 30));
        prop_assert_eq!(alloc.stats().backend_reserves, attempts);
        prop_assert_eq!(alloc.stats().backend_releases, frees);
        prop_assert!(sim.outstanding().is_empty());
    }
}

#[test]
fn dropping_the_allocator_releases_every_segment() {
    let sim = sim();
    let alloc = Allocator::new(sim.clone(), Strategy::Caching).unwrap();
    let a = alloc.allocate(100, Category::Other).unwrap();
    let b = alloc.allocate(5 << 20, Category::Other).unwrap();
    drop((a, b));
    assert_eq!(sim.outstanding().len(), 2);
    drop(alloc);
    assert!(sim.outstanding().is_empty());
    assert_eq!(sim.used(), 0);
    assert_eq!(sim.capacity(), Some(CAPACITY));
}
