//! The `expandable` strategy on the simulated device's virtual memory: pages mapped only under
//! live blocks, one map call per run of missing pages, the cache of idle pages unmapped when a
//! new mapping would pass the bound, when the device runs out, and on `empty_cache`.

use std::sync::Arc;

use stax_alloc::{Allocator, Category, PoolKind, RawMemory, SimMemory, Strategy};

const MIB: usize = 1 << 20;

fn expandable(capacity: usize) -> (Arc<SimMemory>, Arc<Allocator>) {
    let sim = Arc::new(SimMemory::new(capacity as u64, 2 * MIB));
    let alloc = Allocator::new(sim.clone(), Strategy::Expandable).unwrap();
    (sim, alloc)
}

#[test]
fn growth_maps_only_the_pages_live_blocks_touch() {
    let (sim, alloc) = expandable(64 * MIB);
    let range = sim.ranges()[0];
    assert_eq!(
        (range.bytes, sim.mapped()),
        (128 * MIB, 0),
        "twice the capacity, unmapped"
    );
    let a = alloc.allocate(5 * MIB + 100, Category::Activation).unwrap();
    assert_eq!((a.addr(), a.offset()), (range.addr, 0));
    // 5 MiB + 356 bytes (rounded to 256) touch three 2 MiB pages, mapped in one call
    let s = alloc.stats();
    assert_eq!((s.reserved, s.segments, s.backend_maps), (6 << 20, 1, 1));
    assert_eq!(sim.mapped(), 6 << 20);
    // the next block starts in the third page: nothing to map
    let b = alloc.allocate(MIB / 2, Category::Activation).unwrap();
    assert_eq!(b.offset(), (5 * MIB + 256) as u64);
    assert_eq!(alloc.stats().backend_maps, 1);
    // and the one after extends the same run by one page
    let c = alloc.allocate(2 * MIB, Category::Activation).unwrap();
    let s = alloc.stats();
    assert_eq!((s.reserved, s.segments, s.backend_maps), (8 << 20, 1, 2));
    let snap = alloc.snapshot();
    assert_eq!(snap.segments.len(), 1);
    assert_eq!(snap.segments[0].pool, PoolKind::Mapped);
    assert_eq!(snap.segments[0].bytes, 8 << 20);
    // freed pages stay mapped as the cache until empty_cache unmaps them
    drop((a, b, c));
    let s = alloc.stats();
    assert_eq!(
        (s.reserved, s.cached, s.largest_free_block),
        (8 << 20, 8 << 20, 8 << 20)
    );
    alloc.empty_cache().unwrap();
    let s = alloc.stats();
    assert_eq!((s.reserved, s.segments, s.backend_unmaps), (0, 0, 1));
    assert_eq!(
        (sim.map_calls(), sim.unmap_calls()),
        (2, 1),
        "the driver saw the same"
    );
    assert_eq!(sim.mapped(), 0);
    assert_eq!(sim.used(), 0);
    drop(alloc);
    assert!(
        sim.ranges().is_empty(),
        "the range is freed with the allocator"
    );
}

/// A new mapping that would pass the highest number of pages live blocks touched so far
/// first unmaps idle pages, highest addresses first: reserved never passes that peak.
#[test]
fn idle_pages_are_unmapped_before_reserved_passes_the_peak() {
    let (sim, alloc) = expandable(64 * MIB);
    let a = alloc.allocate(8 * MIB, Category::Activation).unwrap(); // pages 0-3
    let pin = alloc.allocate(2 * MIB, Category::Parameter).unwrap(); // page 4
    assert_eq!(pin.offset(), 8 << 20);
    drop(a); // pages 0-3 idle; peak: 5 pages touched
    // 12 MiB do not fit the 8 MiB hole: pages 5-10. Budget max(5, 1 + 6) = 7 pages (slack
    // 7 / 8 = 0 pages): 11 would pass it, so the mapping must fit 7 pages itself: 4 of
    // the 5 + 6 would-be pages must go: the four idle ones, in one call.
    let c = alloc.allocate(12 * MIB, Category::Activation).unwrap();
    assert_eq!(c.offset(), 10 << 20);
    let s = alloc.stats();
    assert_eq!((s.reserved, s.backend_unmaps, s.segments), (14 << 20, 1, 1));
    assert_eq!(sim.mapped(), 14 << 20);
    drop((c, pin));
}

/// When the device is short (another process took memory), idle pages outside the new block
/// are unmapped and the mapping retried.
#[test]
fn out_of_memory_unmaps_idle_pages_and_retries() {
    let (sim, alloc) = expandable(48 * MIB);
    drop(alloc.allocate(40 * MIB, Category::Activation).unwrap()); // peak: 20 pages
    alloc.empty_cache().unwrap();
    let other = sim.reserve(30 * MIB).unwrap(); // another process
    let a = alloc.allocate(8 * MIB, Category::Activation).unwrap(); // pages 0-3
    let pin = alloc.allocate(2 * MIB, Category::Parameter).unwrap(); // page 4
    drop(a);
    // 10 MiB at page 5: the budget (20 pages) allows keeping pages 0-3, the device does not
    // (30 + 10 + 10 > 48 MiB): they are unmapped and the mapping retried.
    let c = alloc.allocate(10 * MIB, Category::Activation).unwrap();
    assert_eq!(c.offset(), 10 << 20);
    let s = alloc.stats();
    assert_eq!(
        (s.reserved, s.backend_maps, s.backend_unmaps),
        (12 << 20, 5, 2)
    );
    assert_eq!(sim.used(), (30 + 12) << 20);
    // What cannot fit is a typed error and changes nothing.
    assert!(alloc.allocate(8 * MIB, Category::Activation).is_err());
    assert_eq!(alloc.stats().reserved, 12 << 20);
    drop((c, pin));
    sim.release(other).unwrap();
}
