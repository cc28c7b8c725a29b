//! Allocator strategies on the device: `expandable` growing and shrinking through CUDA's
//! virtual memory management (pages mapped under live blocks, data intact across remapping,
//! pages unmapped and returned to the driver by `empty_cache`), and the `async` pool's own
//! figures in the step report. Without a CUDA device every test prints a skip notice and
//! passes (`STAX_REQUIRE_GPU=1` turns that into a failure).

mod common;

use stax::train::MemoryReport;
use stax_tensor::{Backend, BackendOptions, Category, DType, Strategy, Tensor, ops};

const MIB: u64 = 1 << 20;

/// The tests here read the driver's device-wide usage: they run one at a time, so that one's
/// context, handles and pool do not show up in the other's figures.
static DRIVER: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    DRIVER.lock().unwrap_or_else(|p| p.into_inner())
}

/// Bytes the driver says are used on the device.
fn driver_used(gpu: &dyn Backend) -> u64 {
    let (free, total) = gpu
        .driver_memory()
        .unwrap()
        .expect("a device reports memory");
    total - free
}

#[test]
fn expandable_grows_and_shrinks_on_the_device() {
    let _serial = one_at_a_time();
    let options = BackendOptions {
        strategy: Strategy::Expandable,
        ..BackendOptions::default()
    };
    let Some(gpu) = common::cuda_or_skip(&options) else {
        return;
    };
    let alloc = gpu.allocator().clone();
    let page = alloc
        .backend()
        .virtual_memory()
        .expect("the device has virtual memory management")
        .page_size() as u64;
    assert_eq!(
        alloc.stats().reserved,
        0,
        "nothing is mapped before the first tensor"
    );
    // Warm up the copy paths (modules load lazily, on the device), then unmap: the start.
    let warm = Tensor::from_slice(&gpu, &[1.0, 2.0, 3.0], [3], Category::Activation).unwrap();
    let mut copied = Tensor::empty(&gpu, [3], DType::F32, Category::Activation).unwrap();
    ops::copy(&warm, &mut copied).unwrap();
    assert_eq!(copied.to_vec().unwrap(), [1.0, 2.0, 3.0]);
    drop((warm, copied));
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.stats().reserved, 0, "the warm-up's page is unmapped");
    let used0 = driver_used(&*gpu);

    // Grow: 100 MB of values, then a small tensor in the same run of pages.
    let mut rng = common::Rng::new(common::seed_for("expandable", &[25_000_000]));
    let values = rng.vec(25_000_000, -1.0, 1.0);
    let a = Tensor::from_slice(&gpu, &values, [25_000_000], Category::Activation).unwrap();
    let small = Tensor::from_slice(&gpu, &[1.0, 2.0, 3.0], [3], Category::Parameter).unwrap();
    let s = alloc.stats();
    let pages = 100_000_256u64.div_ceil(page) * page; // a, rounded to 256, then small
    assert_eq!(
        (s.reserved, s.segments),
        (pages, 1),
        "one run of mapped pages"
    );
    let grown = driver_used(&*gpu) - used0;
    assert!(
        grown >= pages && grown <= pages + 64 * MIB,
        "the driver holds the mapped pages: {grown} for {pages}"
    );
    // The memory is the device's: kernels and copies read and write it.
    assert_eq!(a.to_vec().unwrap(), values);
    let mut b = Tensor::empty(&gpu, [3], DType::F32, Category::Activation).unwrap();
    ops::copy(&small, &mut b).unwrap();
    assert_eq!(b.to_vec().unwrap(), [1.0, 2.0, 3.0]);

    // Shrink: freed pages stay mapped as the cache until empty_cache unmaps them.
    drop(a);
    assert_eq!(alloc.stats().reserved, pages);
    alloc.empty_cache().unwrap();
    let s = alloc.stats();
    assert_eq!(
        s.reserved, page,
        "only the page the small tensors live in stays mapped"
    );
    assert!(s.backend_unmaps >= 1);
    let shrunk = driver_used(&*gpu) - used0;
    assert!(
        shrunk + 90 * MIB <= grown,
        "unmapped pages go back to the driver: {shrunk}"
    );

    // Grow again over the unmapped addresses: fresh pages, the data intact.
    let again: Vec<f32> = values.iter().map(|v| -v).collect();
    let a = Tensor::from_slice(&gpu, &again, [25_000_000], Category::Activation).unwrap();
    assert_eq!(a.to_vec().unwrap(), again);
    assert_eq!(small.to_vec().unwrap(), [1.0, 2.0, 3.0]);
    drop((a, b, small));
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.stats().reserved, 0);
    let back = driver_used(&*gpu).saturating_sub(used0);
    assert!(
        back <= 8 * MIB,
        "everything unmapped: {back} bytes still above the start"
    );
}

#[test]
fn the_async_pools_cache_is_reported_as_its_own() {
    let _serial = one_at_a_time();
    let options = BackendOptions {
        strategy: Strategy::Async {
            release_threshold: u64::MAX,
        },
        ..BackendOptions::default()
    };
    let Some(gpu) = common::cuda_or_skip(&options) else {
        return;
    };
    let t = Tensor::empty(&gpu, [64 << 20], DType::F32, Category::Activation).unwrap();
    drop(t); // 256 MiB back to the pool, which keeps it (release threshold unlimited)
    gpu.synchronize().unwrap();
    let r = MemoryReport::read(&*gpu).unwrap();
    assert_eq!(r.allocator, "async:release_threshold=unlimited");
    let pool = r.pool.expect("async reports the pool's figures");
    let cache = r.pool_cache.expect("and its cache");
    assert!(
        pool.reserved >= 256 * MIB && pool.used <= pool.reserved,
        "{pool:?}"
    );
    assert!(
        cache >= 256 * MIB,
        "the freed 256 MiB is the pool's cache: {cache}"
    );
    let used = r.driver_used.unwrap();
    assert_eq!(r.outside_allocator, Some(used - r.reserved - cache));
    eprintln!("{r}\n{}", r.breakdown());
    gpu.allocator().empty_cache().unwrap(); // trims the pool
    let after = MemoryReport::read(&*gpu).unwrap();
    assert!(
        after.pool_cache.unwrap() < cache,
        "{:?} after the trim",
        after.pool
    );
}
