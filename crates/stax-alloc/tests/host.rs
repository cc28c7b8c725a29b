//! The host backend: real, aligned, zeroed memory that can be written and read back.

use std::sync::Arc;

use stax_alloc::{Allocator, Category, HostMemory, RawMemory, SimMemory, Strategy};

fn write_read(strategy: Strategy) {
    let host = Arc::new(HostMemory::new());
    let alloc = Allocator::new(host.clone(), strategy.clone()).unwrap();
    for &n in &[1usize, 17, 1000, 300_000, 3_000_000] {
        let mut a = alloc.allocate(n * 4, Category::Activation).unwrap();
        assert_eq!(a.addr() % 64, 0, "{strategy}: 64-byte aligned");
        let bytes = a.host_bytes_mut().expect("host memory gives host slices");
        assert_eq!(bytes.len(), n * 4);
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        let back = a.host_bytes().unwrap();
        assert!(back.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
    }
    assert!(host.outstanding_bytes() > 0 || strategy == Strategy::Platform);
    alloc.empty_cache().unwrap();
    assert_eq!(host.outstanding_bytes(), 0, "{strategy}");
}

#[test]
fn simulated_memory_gives_no_host_slice() {
    let sim = Arc::new(SimMemory::new(1 << 30, 2 << 20));
    let alloc = Allocator::new(sim, Strategy::Caching).unwrap();
    let mut a = alloc.allocate(1000, Category::Input).unwrap();
    assert!(a.host_bytes().is_none() && a.host_bytes_mut().is_none());
    let host = Allocator::new(Arc::new(HostMemory::new()), Strategy::Caching).unwrap();
    let empty = host.allocate(0, Category::Input).unwrap();
    assert_eq!(empty.host_bytes(), Some(&[][..]));
}

#[test]
fn host_caching_write_read() {
    write_read(Strategy::Caching);
}

#[test]
fn host_platform_write_read() {
    write_read(Strategy::Platform);
}

#[test]
fn fresh_host_memory_is_zeroed() {
    let alloc = Allocator::new(Arc::new(HostMemory::new()), Strategy::Caching).unwrap();
    let a = alloc.allocate(3 << 20, Category::Parameter).unwrap();
    assert!(a.host_bytes().unwrap().iter().all(|&b| b == 0));
}

#[test]
fn host_backend_refuses_bad_segments() {
    let host = HostMemory::new();
    assert!(host.reserve(0).is_err());
    let seg = host.reserve(100).unwrap();
    assert_eq!((seg.bytes, seg.addr % 64), (128, 0));
    let mut wrong = seg;
    wrong.bytes = 64;
    assert!(host.release(wrong).is_err());
    host.release(seg).unwrap();
    assert!(
        host.release(seg).is_err(),
        "double release is an error, not UB"
    );
    assert_eq!(
        (host.granularity(), host.alignment(), host.capacity()),
        (2 << 20, 64, None)
    );
}

#[test]
fn absurd_host_requests_are_out_of_memory() {
    let alloc = Allocator::new(Arc::new(HostMemory::new()), Strategy::Caching).unwrap();
    for bytes in [usize::MAX, usize::MAX / 2 + 1, 1 << 62] {
        match alloc.allocate(bytes, Category::Other) {
            Err(stax_alloc::AllocError::OutOfMemory(r)) => assert_eq!(r.requested, bytes as u64),
            other => panic!("{bytes}: expected out of memory, got {other:?}"),
        }
    }
    let a = alloc.allocate(64, Category::Other).unwrap();
    assert_eq!(a.bytes(), 64);
}

#[test]
fn capped_host_memory_runs_a_bfc_arena() {
    let cap = 8u64 << 20;
    let alloc = Allocator::new(
        Arc::new(HostMemory::with_capacity(cap)),
        Strategy::Bfc { fraction: 1.0 },
    )
    .unwrap();
    assert_eq!(alloc.stats().reserved, cap);
    let a = alloc.allocate(6 << 20, Category::Activation).unwrap();
    match alloc.allocate(3 << 20, Category::Activation) {
        Err(stax_alloc::AllocError::OutOfMemory(r)) => assert_eq!(r.limit, Some(cap)),
        other => panic!("expected out of memory, got {other:?}"),
    }
    drop(a);
    let _b = alloc.allocate(3 << 20, Category::Activation).unwrap();
}
