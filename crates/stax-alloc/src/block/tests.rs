//! Unit tests of the arena: split, coalesce, best-fit, parking, segment limits.
use super::*;

fn tag(requested: u64) -> Tag {
    Tag {
        category: Category::Other,
        requested,
    }
}

#[test]
fn split_coalesce_and_best_fit() {
    let mut a = Arena::new(256, PoolKind::Large);
    assert!(a.add_segment(Segment {
        addr: 4096,
        bytes: 4096
    }));
    let x = a.alloc(1024, usize::MAX, tag(1000)).unwrap();
    let y = a.alloc(1024, usize::MAX, tag(1024)).unwrap();
    let z = a.alloc(1024, usize::MAX, tag(1)).unwrap();
    assert_eq!((x.addr, y.addr, z.addr), (4096, 5120, 6144));
    assert_eq!(a.free_bytes(), 1024);
    // Free the middle: two free blocks of 1024; best fit of 512 takes the lowest address.
    a.free(y.id).unwrap();
    a.settle();
    let w = a.alloc(512, usize::MAX, tag(512)).unwrap();
    assert_eq!(w.addr, 5120);
    a.free(w.id).unwrap();
    a.free(x.id).unwrap();
    a.free(z.id).unwrap();
    a.settle();
    assert_eq!(a.largest_free(), 4096);
    assert_eq!(a.free(z.id), None, "double free is refused");
    let segs = a.take_free_segments();
    assert_eq!(
        segs,
        vec![Segment {
            addr: 4096,
            bytes: 4096
        }]
    );
    assert_eq!((a.reserved(), a.free_bytes(), a.segment_count()), (0, 0, 0));
}

#[test]
fn small_remainder_is_not_split() {
    let mut a = Arena::new(1024, PoolKind::Large);
    a.add_segment(Segment {
        addr: 0,
        bytes: 4096,
    });
    let t = a.alloc(3584, usize::MAX, tag(3584)).unwrap();
    assert_eq!(t.size, 4096);
    assert_eq!(a.free_bytes(), 0);
    assert_eq!(a.free(t.id).map(|f| f.0), Some(4096));
}

#[test]
fn parked_blocks_are_reused_exactly_and_coalesced_on_demand() {
    let mut a = Arena::new(256, PoolKind::Small);
    a.add_segment(Segment {
        addr: 0,
        bytes: 1 << 20,
    });
    let x = a.alloc(4096, usize::MAX, tag(4000)).unwrap();
    a.free(x.id).unwrap();
    assert_eq!(a.free_bytes(), 1 << 20, "parked bytes count as free");
    let y = a.alloc(4096, usize::MAX, tag(4096)).unwrap();
    assert_eq!(
        (y.id, y.addr),
        (x.id, x.addr),
        "the parked block is taken back"
    );
    a.free(y.id).unwrap();
    // A request no parked block fits exactly and best-fit cannot serve: settle, retry.
    let big = a.alloc(1 << 20, usize::MAX, tag(1 << 20)).unwrap();
    assert_eq!((big.addr, big.size), (0, 1 << 20));
    a.free(big.id).unwrap();
    // More frees than slots: the oldest are coalesced as they leave the quick list.
    let blocks: Vec<_> = (0..40)
        .map(|_| a.alloc(512, usize::MAX, tag(512)).unwrap())
        .collect();
    for b in &blocks {
        a.free(b.id).unwrap();
    }
    assert_eq!(a.parked_len, PARK_SLOTS);
    a.settle();
    assert_eq!(
        (a.parked_len, a.largest_free(), a.free_bytes()),
        (0, 1 << 20, 1 << 20)
    );
    assert_eq!(a.snapshot()[0].blocks.len(), 1);
    assert_eq!(a.take_free_segments().len(), 1);
}
#[test]
fn segment_limits_and_idle_segments() {
    let mut a = Arena::new(256, PoolKind::Large);
    let seg = |addr, bytes| Segment { addr, bytes };
    a.add_segment(seg(0, 8192));
    a.add_segment(seg(1 << 20, 2048));
    // Best-fit alone takes the exact 2048 segment; capped at 4096 it still does.
    let x = a.alloc(2048, 4096, tag(2048)).unwrap();
    assert_eq!(x.segment, 1 << 20);
    // Nothing of at most 4096 bytes is left: the 8192 segment is too large for the cap.
    assert!(a.alloc(1024, 4096, tag(1024)).is_none());
    let y = a.alloc(1024, 8192, tag(1024)).unwrap();
    assert_eq!((y.segment, y.addr), (0, 0));
    assert_eq!(a.used_block(y.id), Some((0, 1024)));
    // Only wholly free segments are taken, the largest first.
    assert_eq!(a.take_largest_free_segment(), None);
    a.free(y.id).unwrap();
    a.free(x.id).unwrap();
    assert_eq!(a.used_block(y.id), None);
    assert_eq!(a.take_largest_free_segment(), Some(seg(0, 8192)));
    assert_eq!(a.take_largest_free_segment(), Some(seg(1 << 20, 2048)));
    assert_eq!((a.reserved(), a.free_bytes(), a.segment_count()), (0, 0, 0));
}
