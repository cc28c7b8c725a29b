//! Out of memory: typed errors that read as a diagnosis, and an allocator that stays usable.

use std::sync::Arc;

use stax_alloc::{AllocError, Allocator, Category, OomReport, SimMemory, Strategy, human_bytes};

const MIB: usize = 1 << 20;

fn oom(r: Result<stax_alloc::Allocation, AllocError>) -> Box<OomReport> {
    match r {
        Err(AllocError::OutOfMemory(report)) => report,
        Err(e) => panic!("expected out of memory, got {e}"),
        Ok(a) => panic!(
            "expected out of memory, got an allocation of {} bytes",
            a.bytes()
        ),
    }
}

#[test]
fn larger_than_capacity_can_never_fit() {
    for strategy in [
        Strategy::Caching,
        Strategy::Platform,
        Strategy::Bfc { fraction: 0.5 },
    ] {
        let sim = Arc::new(SimMemory::new(64 << 20, 2 << 20));
        let alloc = Allocator::new(sim.clone(), strategy.clone()).unwrap();
        let keep = alloc.allocate(MIB, Category::Parameter).unwrap();
        let r = oom(alloc.allocate(100 * MIB, Category::Activation));
        assert!(r.can_never_fit, "{strategy}");
        assert_eq!(r.requested, 100 << 20);
        assert_eq!(r.category, Category::Activation);
        assert_eq!(r.capacity, Some(64 << 20));
        // Platform hands out whole driver segments (rounded to the 2 MiB granularity).
        let param = if strategy == Strategy::Platform {
            2 << 20
        } else {
            1 << 20
        };
        assert_eq!(r.allocated_by_category[Category::Parameter.index()], param);
        let param = format!("parameter {}", human_bytes(param));
        let msg = AllocError::OutOfMemory(r).to_string();
        assert!(
            msg.starts_with("allocate: out of memory: 104.86 MB (104,857,600 bytes)"),
            "{msg}"
        );
        assert!(msg.contains("can never fit"), "{msg}");
        assert!(msg.contains(&param), "{msg}");
        // Still usable.
        let b = alloc.allocate(4 * MIB, Category::Activation).unwrap();
        drop((keep, b));
        assert_eq!(alloc.stats().requested, 0);
    }
    // usize::MAX overflows the alignment rounding: still a typed error.
    let alloc = Allocator::new(
        Arc::new(SimMemory::new(1 << 30, 2 << 20)),
        Strategy::Caching,
    )
    .unwrap();
    assert!(oom(alloc.allocate(usize::MAX, Category::Other)).can_never_fit);
}

#[test]
fn bfc_request_larger_than_arena_can_never_fit() {
    let sim = Arc::new(SimMemory::new(64 << 20, 2 << 20));
    let alloc = Allocator::new(sim, Strategy::Bfc { fraction: 0.25 }).unwrap();
    let r = oom(alloc.allocate(20 * MIB, Category::Gradient));
    assert!(r.can_never_fit);
    assert_eq!(r.limit, Some(16 << 20));
    assert!(
        r.to_string().contains("larger than the arena of 16.78 MB"),
        "{r}"
    );
}

#[test]
fn caching_fits_after_dropping_its_cache() {
    let sim = Arc::new(SimMemory::new(10 << 20, 2 << 20));
    let alloc = Allocator::new(sim.clone(), Strategy::Caching).unwrap();
    drop(alloc.allocate(6 * MIB, Category::Activation).unwrap());
    assert_eq!(alloc.stats().cached, 6 << 20);
    // 8 MiB does not fit in the cached 6 MiB block nor in the 4 MiB left on the device:
    // the cache is released and the reservation retried.
    let a = alloc
        .allocate(8 * MIB, Category::Activation)
        .expect("fits after the cache drops");
    let s = alloc.stats();
    assert_eq!((s.reserved, s.cached, s.segments), (8 << 20, 0, 1));
    assert_eq!(
        s.backend_reserves, 3,
        "first reserve, failed reserve, retry"
    );
    assert_eq!(s.backend_releases, 1);
    drop(a);
}

#[test]
fn fragmentation_names_the_largest_free_block() {
    // Two 10 MiB segments, each pinned by a 5 MiB block with a 5 MiB hole beside it: 10 MiB
    // cached, but no hole holds 8 MiB, and the 4 MiB left on the device cannot either.
    let sim = Arc::new(SimMemory::new(24 << 20, 2 << 20));
    let alloc = Allocator::new(sim.clone(), Strategy::Caching).unwrap();
    let (mut pins, mut rests) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        drop(alloc.allocate(10 * MIB, Category::Activation).unwrap()); // a fresh 10 MiB segment
        let pin = alloc.allocate(5 * MIB, Category::Activation).unwrap();
        let rest = alloc.allocate(5 * MIB, Category::Activation).unwrap();
        assert_eq!(
            (pin.offset(), rest.offset()),
            (0, 5 << 20),
            "both halves of one segment"
        );
        pins.push(pin);
        rests.push(rest);
    }
    drop(rests);
    let s = alloc.stats();
    assert_eq!((s.reserved, s.segments), (20 << 20, 2));
    assert_eq!((s.cached, s.largest_free_block), (10 << 20, 5 << 20));
    assert!((s.fragmentation - 0.5).abs() < 1e-12);
    let r = oom(alloc.allocate(8 * MIB, Category::Workspace));
    assert!(!r.can_never_fit);
    assert_eq!(r.largest_free_block, 5 << 20);
    assert_eq!(r.cached, 10 << 20);
    assert_eq!(r.driver_free, Some(4 << 20));
    let msg = r.to_string();
    assert!(msg.contains("does not fit now: fragmentation"), "{msg}");
    assert!(
        msg.contains(&format!("largest free block is {}", human_bytes(5 << 20))),
        "{msg}"
    );
    assert!(
        r.cause.as_deref().unwrap_or("").contains("out of memory"),
        "{msg}"
    );
    // Still usable: a hole-sized request is served from the cache.
    let calls = alloc.stats().backend_reserves;
    let a = alloc.allocate(5 * MIB, Category::Workspace).unwrap();
    assert_eq!(alloc.stats().backend_reserves, calls);
    drop((a, pins));
}

#[test]
fn bfc_fragmentation_is_a_typed_error() {
    let sim = Arc::new(SimMemory::new(16 << 20, 2 << 20));
    let alloc = Allocator::new(sim, Strategy::Bfc { fraction: 0.5 }).unwrap(); // 8 MiB arena
    let blocks: Vec<_> = (0..4)
        .map(|_| alloc.allocate(2 * MIB, Category::Other).unwrap())
        .collect();
    let kept: Vec<_> = blocks
        .into_iter()
        .enumerate()
        .filter(|(i, _)| i % 2 == 0)
        .collect();
    let r = oom(alloc.allocate(3 * MIB, Category::Other));
    assert!(!r.can_never_fit);
    assert_eq!((r.cached, r.largest_free_block), (4 << 20, 2 << 20));
    assert!(r.to_string().contains("fragmentation"));
    drop(kept);
    let a = alloc
        .allocate(8 * MIB, Category::Other)
        .expect("coalesced back into one block");
    assert_eq!(a.offset(), 0);
}

#[test]
fn platform_out_of_memory_does_not_fit_now() {
    let sim = Arc::new(SimMemory::new(8 << 20, 2 << 20));
    let alloc = Allocator::new(sim, Strategy::Platform).unwrap();
    let a = alloc.allocate(6 * MIB, Category::Input).unwrap();
    let r = oom(alloc.allocate(4 * MIB, Category::Input));
    assert!(!r.can_never_fit);
    assert_eq!((r.reserved, r.driver_free), (6 << 20, Some(2 << 20)));
    drop(a);
    alloc.allocate(4 * MIB, Category::Input).unwrap();
}

/// Requests whose weights (twice their size) pass `u64::MAX` together: the caching strategy's
/// budget does not wrap; the next request is served, a third of 2^63 bytes refused as typed.
#[test]
fn caching_budget_of_huge_blocks_does_not_overflow() {
    let sim = Arc::new(SimMemory::new(u64::MAX, 2 << 20));
    let alloc = Allocator::new(sim, Strategy::Caching).unwrap();
    let huge = alloc.allocate(1 << 63, Category::Other).unwrap();
    let small = alloc.allocate(4 * MIB, Category::Other).unwrap();
    assert_eq!(alloc.stats().requested, (1 << 63) + 4 * MIB as u64);
    let r = oom(alloc.allocate(1 << 63, Category::Other));
    assert_eq!(r.requested, 1 << 63);
    drop((huge, small));
    assert_eq!(alloc.stats().requested, 0);
}

/// Host memory has no known capacity: a request the system refuses (2^60 bytes) is not said to
/// fit later, and the allocator stays usable.
#[test]
fn host_memory_of_unknown_capacity_says_it_may_never_fit() {
    let alloc = Allocator::new(Arc::new(stax_alloc::HostMemory::new()), Strategy::Caching).unwrap();
    let r = oom(alloc.allocate(1 << 60, Category::Activation));
    assert!(!r.can_never_fit);
    assert_eq!((r.capacity, r.driver_free), (None, None));
    let msg = r.to_string();
    assert!(
        msg.contains("capacity is unknown, so it may never fit"),
        "{msg}"
    );
    assert!(!msg.contains("does not fit now"), "{msg}");
    drop(alloc.allocate(MIB, Category::Activation).unwrap());
}
