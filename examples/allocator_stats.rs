//! A tour of `stax-alloc`: tagged allocations, exact statistics, the cache, a snapshot, an
//! out-of-memory diagnosis and a trace. Runs anywhere (no GPU): the device is simulated.
//!
//! ```text
//! cargo run --example allocator_stats
//! STAX_ALLOCATOR=bfc:fraction=0.5 cargo run --example allocator_stats
//! ```

use std::sync::Arc;

use stax_alloc::{AllocError, Allocator, BlockState, Category, SimMemory, Strategy, human_bytes};

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), AllocError> {
    // 1. A strategy, from STAX_ALLOCATOR if set (caching when unset).
    let strategy = Strategy::from_env()?;

    // 2. A backend: a simulated 10 GiB device with CUDA's 2 MiB granularity and 256-byte
    //    alignment (stream-ordered, like a cuMemAllocAsync pool, when the strategy is async).
    //    `HostMemory::new()` would give real host memory instead.
    let stream_ordered = matches!(strategy, Strategy::Async { .. });
    let device = Arc::new(SimMemory::new(10 << 30, 2 << 20).with_stream_ordered(stream_ordered));
    let alloc = Allocator::new(device.clone(), strategy)?;
    println!(
        "allocator: {} on {}",
        alloc.strategy(),
        alloc.backend().name()
    );

    // 3. Allocations carry a category. They are RAII handles: dropping one frees it.
    let weights = alloc.allocate(1_310_876_424, Category::Parameter)?; // the seed's Dense(128)
    let adam_m = alloc.allocate(1_310_876_424, Category::OptimizerState)?;
    let adam_v = alloc.allocate(1_310_876_424, Category::OptimizerState)?;
    let batch = alloc.allocate(48_000_000, Category::Input)?;
    let act = alloc.allocate(1_024_000_000, Category::Activation)?;
    let scratch = alloc.allocate(3_000, Category::Workspace)?;
    println!(
        "weights at {:#x}, {} (aligned to {})",
        weights.addr(),
        human_bytes(weights.bytes() as u64),
        alloc.alignment()
    );
    drop(act); // freed: the block stays cached for the next step (caching strategy)

    // 4. Exact statistics: counters, never samples.
    let s = alloc.stats();
    println!("\nrequested {}", human_bytes(s.requested));
    println!(
        "allocated {}  (requests rounded up to the alignment)",
        human_bytes(s.allocated)
    );
    println!(
        "reserved  {}  (segments held from the device)",
        human_bytes(s.reserved)
    );
    println!(
        "cached    {}  (reserved - allocated)",
        human_bytes(s.cached)
    );
    println!("peak      {}", human_bytes(s.peak_requested));
    println!(
        "backend calls: {} reserves, {} releases",
        s.backend_reserves, s.backend_releases
    );
    println!("\nper category (live / peak):");
    for c in Category::ALL {
        let cs = s.by_category[c.index()];
        if cs.peak > 0 {
            println!(
                "  {c:<16} {:>32} / {}",
                human_bytes(cs.live),
                human_bytes(cs.peak)
            );
        }
    }

    // 5. A snapshot lists every segment and block.
    println!("\nsnapshot:");
    for seg in alloc.snapshot().segments {
        let used = seg
            .blocks
            .iter()
            .filter(|b| b.state == BlockState::Used)
            .count();
        println!(
            "  {:?} segment {:#x}: {}, blocks: {} ({used} used)",
            seg.pool,
            seg.addr,
            human_bytes(seg.bytes),
            seg.blocks.len()
        );
    }

    // 6. Out of memory is a typed error that reads as a diagnosis; the allocator stays usable.
    match alloc.allocate(8 << 30, Category::Activation) {
        Err(e @ AllocError::OutOfMemory(_)) => println!("\n{e}"),
        Err(e) => return Err(e),
        Ok(_) => println!("\n(8 GiB fit: this strategy had room)"),
    }

    // 7. A trace of one "step", replayed: the second replay is served from the cache.
    alloc.start_trace();
    for _ in 0..3 {
        let x = alloc.allocate(512_000_000, Category::Activation)?;
        let g = alloc.allocate(512_000_000, Category::Gradient)?;
        drop((x, g));
    }
    let trace = alloc.stop_trace();
    let report = stax_alloc::replay(&trace, &alloc)?;
    println!(
        "\nreplayed {} events: peak requested {}, peak reserved {}, {} backend calls",
        trace.events.len(),
        human_bytes(report.peak_requested),
        human_bytes(report.peak_reserved),
        report.backend_calls()
    );

    drop((weights, adam_m, adam_v, batch, scratch));
    alloc.empty_cache()?;
    println!(
        "after empty_cache: {} still reserved on the device",
        human_bytes(device.used())
    );
    Ok(())
}
