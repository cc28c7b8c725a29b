//! Allocator benches on the simulated device (no GPU needed):
//!
//! - `pair/*`: one allocation + free served from a warm cache, for each strategy;
//! - `live/*`: the same pair with 1,000 and 10,000 live blocks around it (best-fit must not
//!   scan a list: the 10k figure should stay within 2x of the 1k one); `*-bestfit` cycles
//!   through 32 sizes so that exact-size reuse of parked blocks never hits and every pair
//!   goes through the ordered best-fit index, split and coalesce;
//! - `tail`: per-pair latency percentiles (p50/p99/p99.9), printed;
//! - `step/*`: replay of the seed model's training at full scale (batch 100, 200x200x3: the
//!   trainer's set-up and two steps, recorded from its code through the memory planner,
//!   `stax_train::seed::seed_step_trace`; virtual addresses, so 1.31 GB is just a number),
//!   printing reserved / peak requested and backend calls per replay; the targets are
//!   reserved <= 1.05 x peak requested for `caching` and zero backend calls from the third
//!   replay on.
//!
//! Run: `cargo bench --bench alloc -- --warm-up-time 1 --measurement-time 2`. For whole-trace
//! comparisons (adversarial traces, your own) see `examples/alloc_bench.rs`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use stax::train::seed::seed_step_trace;
use stax::{BackendOptions, Device};
use stax_alloc::bench::{percentile, timer_overhead_ns};
use stax_alloc::{Allocation, Allocator, Category, SimMemory, Strategy, human_bytes, replay};

/// A virtual H200: 143,771 MiB, 2 MiB granularity.
fn h200() -> Arc<SimMemory> {
    Arc::new(SimMemory::new(143_771 << 20, 2 << 20))
}

fn strategies() -> Vec<(&'static str, Strategy, Arc<SimMemory>)> {
    vec![
        ("caching", Strategy::Caching, h200()),
        ("expandable", Strategy::Expandable, h200()),
        ("bfc", Strategy::Bfc { fraction: 0.75 }, h200()),
        ("platform", Strategy::Platform, h200()),
        (
            "async",
            Strategy::Async {
                release_threshold: u64::MAX,
            },
            Arc::new(SimMemory::new(143_771 << 20, 2 << 20).with_stream_ordered(true)),
        ),
    ]
}

fn pair(c: &mut Criterion) {
    let mut g = c.benchmark_group("pair");
    for (name, strategy, sim) in strategies() {
        let alloc = Allocator::new(sim, strategy).expect("allocator");
        for (label, bytes) in [("64KiB", 64usize << 10), ("16MiB", 16 << 20)] {
            drop(
                alloc
                    .allocate(bytes, Category::Activation)
                    .expect("warm-up"),
            );
            g.bench_function(BenchmarkId::new(name, label), |b| {
                b.iter(|| {
                    let a = alloc
                        .allocate(black_box(bytes), Category::Activation)
                        .unwrap();
                    black_box(a.addr());
                })
            });
        }
    }
    g.finish();
}

/// Builds `n` live blocks of mixed small sizes with a free fragment next to each, so that
/// both the free index and the block lists hold about `n` entries.
fn populate(alloc: &Arc<Allocator>, n: usize) -> Vec<Allocation> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut all = Vec::with_capacity(2 * n);
    for _ in 0..2 * n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let bytes = 256 + (x % (32 << 10)) as usize;
        all.push(
            alloc
                .allocate(bytes, Category::Activation)
                .expect("populate"),
        );
    }
    all.into_iter()
        .enumerate()
        .filter(|(i, _)| i % 2 == 0)
        .map(|(_, a)| a)
        .collect()
}

/// 32 distinct sizes, more than the 16 parked blocks: cycling through them defeats exact-size
/// reuse, so every pair goes through best-fit, split and coalesce.
const CYCLE: [usize; 32] = {
    let mut v = [0usize; 32];
    let mut i = 0;
    while i < 32 {
        v[i] = 4096 + 256 * i;
        i += 1;
    }
    v
};

fn live(c: &mut Criterion) {
    let mut g = c.benchmark_group("live");
    for (name, strategy) in [
        ("caching", Strategy::Caching),
        ("bfc", Strategy::Bfc { fraction: 0.75 }),
    ] {
        for n in [1_000usize, 10_000] {
            let alloc = Allocator::new(h200(), strategy.clone()).expect("allocator");
            let keep = populate(&alloc, n);
            g.bench_function(BenchmarkId::new(name, n), |b| {
                b.iter(|| {
                    let a = alloc
                        .allocate(black_box(4096), Category::Workspace)
                        .unwrap();
                    black_box(a.addr());
                })
            });
            let mut i = 0;
            g.bench_function(BenchmarkId::new(format!("{name}-bestfit"), n), |b| {
                b.iter(|| {
                    i = (i + 1) % CYCLE.len();
                    let a = alloc
                        .allocate(black_box(CYCLE[i]), Category::Workspace)
                        .unwrap();
                    black_box(a.addr());
                })
            });
            drop(keep);
        }
    }
    g.finish();
}

/// Per-pair latency percentiles, timer overhead subtracted; printed, not asserted.
fn tail(_c: &mut Criterion) {
    const N: usize = 400_000;
    let overhead = timer_overhead_ns(N);
    println!("tail: per-pair latency (ns, timer overhead of {overhead} ns subtracted)");
    let mut cases: Vec<(String, Arc<Allocator>, Vec<Allocation>)> = Vec::new();
    for (name, strategy, sim) in strategies() {
        cases.push((
            name.to_string(),
            Allocator::new(sim, strategy).expect("allocator"),
            vec![],
        ));
    }
    for n in [1_000usize, 10_000] {
        let alloc = Allocator::new(h200(), Strategy::Caching).expect("allocator");
        let keep = populate(&alloc, n);
        cases.push((format!("caching, {n} live"), alloc, keep));
        let alloc = Allocator::new(h200(), Strategy::Caching).expect("allocator");
        let keep = populate(&alloc, n);
        cases.push((format!("caching, {n} live, best-fit"), alloc, keep));
    }
    for (name, alloc, _keep) in &cases {
        drop(
            alloc
                .allocate(64 << 10, Category::Activation)
                .expect("warm-up"),
        );
        let cycle = name.contains("best-fit");
        let mut v: Vec<u64> = (0..N)
            .map(|i| {
                let bytes = if cycle {
                    CYCLE[i % CYCLE.len()]
                } else {
                    64 << 10
                };
                let t = Instant::now();
                let a = alloc
                    .allocate(black_box(bytes), Category::Activation)
                    .unwrap();
                black_box(a.addr());
                drop(a);
                (t.elapsed().as_nanos() as u64).saturating_sub(overhead)
            })
            .collect();
        v.sort_unstable();
        let p = |q: f64| percentile(&v, q);
        println!(
            "tail: {name:<30} p50 {:>5}  p99 {:>5}  p99.9 {:>6}",
            p(0.5),
            p(0.99),
            p(0.999)
        );
    }
}

// ---- the seed model's training ----------------------------------------------------------------

fn step(c: &mut Criterion) {
    let cpu = Device::Cpu
        .open(&BackendOptions::default())
        .expect("cpu backend");
    let trace = seed_step_trace(&cpu, 100, (200, 200, 3)).expect("seed plan");
    println!(
        "step: {} events (set-up and two steps), peak requested {}",
        trace.events.len(),
        human_bytes(trace.peak_requested()),
    );
    let mut g = c.benchmark_group("step");
    for (name, strategy, sim) in strategies() {
        let alloc = Allocator::new(sim, strategy).expect("allocator");
        for i in 1..=5 {
            let r = replay(&trace, &alloc).expect("replay");
            println!(
                "step: {name:<10} replay {i}: reserved/peak requested {:.4} (peak reserved {}, \
                 peak requested {}), backend calls {} ({} reserves, {} releases, {} maps, {} \
                 unmaps)",
                r.overhead(),
                human_bytes(r.peak_reserved),
                human_bytes(r.peak_requested),
                r.backend_calls(),
                r.backend_reserves,
                r.backend_releases,
                r.backend_maps,
                r.backend_unmaps
            );
        }
        g.bench_function(name, |b| {
            b.iter(|| black_box(replay(&trace, &alloc).unwrap()))
        });
    }
    g.finish();
}

criterion_group!(benches, pair, live, tail, step);
criterion_main!(benches);
