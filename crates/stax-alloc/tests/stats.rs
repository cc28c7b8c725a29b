//! Exact counters: peaks per category, reset_peak, zero-byte requests, threads.

use std::sync::Arc;

use stax_alloc::{Allocator, Category, PoolKind, SimMemory, Stats, Strategy};

fn sim_alloc(strategy: Strategy) -> (Arc<SimMemory>, Arc<Allocator>) {
    let sim = Arc::new(SimMemory::new(1 << 30, 2 << 20));
    (sim.clone(), Allocator::new(sim, strategy).unwrap())
}

#[test]
fn peak_by_category_is_what_was_live_at_the_peak() {
    let (_, alloc) = sim_alloc(Strategy::Caching);
    let p = alloc.allocate(1000, Category::Parameter).unwrap();
    let a = alloc.allocate(5000, Category::Activation).unwrap();
    drop(a); // peak 6000: parameter 1000 + activation 5000
    let g = alloc.allocate(3000, Category::Gradient).unwrap();
    let s = alloc.stats();
    assert_eq!(s.peak_requested, 6000);
    assert_eq!(s.peak_by_category, [1000, 0, 0, 5000, 0, 0, 0]);
    assert_eq!(s.by_category[Category::Activation.index()].peak, 5000);
    assert_eq!(s.by_category[Category::Activation.index()].live, 0);
    assert_eq!(s.by_category[Category::Gradient.index()].live, 3000);
    assert_eq!(s.peak_allocated, 1024 + 5120);

    alloc.reset_peak();
    let s = alloc.stats();
    assert_eq!(s.peak_requested, 4000);
    assert_eq!(s.peak_by_category, [1000, 0, 3000, 0, 0, 0, 0]);
    assert_eq!(s.by_category[Category::Activation.index()].peak, 0);
    assert_eq!(
        (s.peak_reserved, s.peak_allocated),
        (s.reserved, s.allocated)
    );
    drop((p, g));
    assert_eq!(alloc.stats().peak_requested, 4000);
}

#[test]
fn zero_byte_requests_are_valid_and_free_cleanly() {
    for strategy in [
        Strategy::Caching,
        Strategy::Bfc { fraction: 0.5 },
        Strategy::Platform,
    ] {
        let (sim, alloc) = sim_alloc(strategy);
        let calls = sim.reserve_calls();
        let z = alloc.allocate(0, Category::Other).unwrap();
        assert_eq!((z.bytes(), z.allocated_bytes(), z.addr() % 256), (0, 0, 0));
        assert_ne!(z.addr(), 0);
        assert_eq!(sim.reserve_calls(), calls, "no backend call for zero bytes");
        let s = alloc.stats();
        assert_eq!((s.allocs, s.requested, s.allocated), (1, 0, 0));
        drop(z);
        assert_eq!(alloc.stats().frees, 1);
    }
}

#[test]
fn small_and_large_pools_are_separate() {
    let (_, alloc) = sim_alloc(Strategy::Caching);
    let small = alloc.allocate(1 << 20, Category::Other).unwrap(); // exactly 1 MiB: small pool
    let large = alloc.allocate((1 << 20) + 1, Category::Other).unwrap();
    let snap = alloc.snapshot();
    let pools: Vec<_> = snap.segments.iter().map(|s| (s.pool, s.bytes)).collect();
    assert_eq!(
        pools,
        vec![(PoolKind::Small, 2 << 20), (PoolKind::Large, 2 << 20)]
    );
    // The large block keeps its sub-1 MiB remainder (not split, as PyTorch).
    assert_eq!(large.allocated_bytes(), 2 << 20);
    assert_eq!(small.allocated_bytes(), 1 << 20);
    let json = serde_json::to_string(&snap).unwrap();
    assert!(
        json.contains("\"pool\":\"small\"") && json.contains("\"state\":\"used\""),
        "{json}"
    );
}

#[test]
fn counters_stay_exact_across_threads() {
    let (sim, alloc) = sim_alloc(Strategy::Caching);
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let alloc = alloc.clone();
            std::thread::spawn(move || {
                let mut live = Vec::new();
                for i in 0..2000usize {
                    let bytes = (i * 7919 + t * 104729) % 300_000;
                    live.push(alloc.allocate(bytes, Category::ALL[i % 7]).unwrap());
                    if i % 3 != 0 {
                        live.swap_remove((i * 31) % live.len());
                    }
                }
                live
            })
        })
        .collect();
    let live: Vec<_> = threads
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let s: Stats = alloc.stats();
    assert_eq!(s.allocs, 8000);
    assert_eq!(
        s.requested,
        live.iter().map(|a| a.bytes() as u64).sum::<u64>()
    );
    assert_eq!(
        s.allocated,
        live.iter().map(|a| a.allocated_bytes() as u64).sum::<u64>()
    );
    assert_eq!(s.reserved, sim.used());
    drop(live);
    let s = alloc.stats();
    assert_eq!((s.requested, s.allocated, s.frees), (0, 0, 8000));
}

#[test]
fn allocator_and_allocation_are_send_and_sync() {
    fn is<T: Send + Sync>() {}
    is::<Allocator>();
    is::<stax_alloc::Allocation>();
    is::<stax_alloc::HostMemory>();
    is::<SimMemory>();
}
