//! The memory plan on the GPU (skipped, with a notice, without one): for the seed model at two
//! batch sizes and two other models, the plan equals the measured peak and per-category bytes
//! of the allocator on every step; from step 2 on, driver-used minus reserved (what lives
//! outside the allocator) stays constant and, with the caching allocator, reserved stops
//! growing. Then budgets: under a `bfc` arena the plan says holds batch B but not B + 1, B
//! trains and B + 1 gets the typed out-of-memory error with the state unchanged.
//!
//! One test, run in order: the checks read the device's driver figures, which other tests
//! running beside them would move.

mod common;

use std::sync::Arc;

use common::{batch, deep_model, seed_model, strided_model};

use stax::alloc::{Allocator, Category, SimMemory, Strategy, Trace, TraceEvent, replay};
use stax::tensor::cuda::{CudaBackend, DEFAULT_WORKSPACE_LIMIT};
use stax::train::plan::MemoryPlan;
use stax::train::{TrainError, Trainer};
use stax::{Adam, Backend, BackendOptions, Serial, Shape};

fn values<'a>(ts: impl IntoIterator<Item = &'a stax::Tensor>) -> Vec<Vec<f32>> {
    ts.into_iter().map(|t| t.to_vec().unwrap()).collect()
}

/// Plan == measured on every step; no growth outside the allocator or of reserved after step 2.
fn plan_matches(be: &Arc<dyn Backend>, model: fn() -> Serial, input: Shape) {
    let adam = Adam::new(1e-3);
    let plan = MemoryPlan::new(&model(), &input, &adam, be).unwrap();
    let classes = plan.labels.dims()[1];
    let mut trainer = Trainer::new(model(), input.clone(), adam, be, 7).unwrap();
    let (mut outside, mut reserved) = (Vec::new(), Vec::new());
    for _ in 0..4 {
        let (x, y) = batch(be, &input, classes);
        let r = trainer.step(&x, &y).unwrap();
        assert_eq!(
            r.memory.peak, plan.peak.bytes,
            "{input}: step {} peak",
            r.step
        );
        for c in Category::ALL {
            let want = plan.peak.by_category[c.index()];
            assert_eq!(r.memory.at_peak(c), want, "{input}: step {}: {c}", r.step);
        }
        outside.push(r.memory.outside_allocator.expect("the driver's figure"));
        reserved.push(r.memory.reserved);
    }
    eprintln!(
        "{input}: peak {} as planned; outside the allocator {outside:?}; reserved {reserved:?}",
        plan.peak.bytes
    );
    assert!(outside[1..].windows(2).all(|w| w[0] == w[1]), "{outside:?}");
    assert!(
        reserved[1..].windows(2).all(|w| w[0] == w[1]),
        "{reserved:?}"
    );
}

/// A `bfc` backend whose arena is exactly `arena` bytes (a multiple of 2 MiB): the arena is a
/// fraction of the device's total memory, so aim, look, retry (once suffices).
fn bfc_backend(arena: u64, workspace_limit: Option<usize>) -> Arc<dyn Backend> {
    let g = 2u64 << 20;
    let mut total_guess = None;
    for _ in 0..4 {
        let total = match total_guess {
            Some(f) => f,
            None => {
                let probe = CudaBackend::new(0, &BackendOptions::default()).unwrap();
                probe.driver_memory().unwrap().unwrap().1
            }
        };
        let fraction = ((arena + g / 2) as f64 / total as f64).min(1.0);
        let options = BackendOptions {
            strategy: Strategy::Bfc { fraction },
            workspace_limit,
            ..BackendOptions::default()
        };
        let be: Arc<dyn Backend> = CudaBackend::new(0, &options).unwrap();
        let got = be.allocator().stats().reserved;
        if got == arena {
            return be;
        }
        // got = floor(fraction * total / g) * g: total lies in [got, got + g) / fraction
        total_guess = Some(((got as f64 + g as f64 / 2.0) / fraction) as u64);
    }
    panic!("could not make a bfc arena of {arena} bytes");
}

/// Where a recorded run departs from its plan's trace (the first event that differs in kind,
/// size or category), and whether the recording itself fits a simulated arena of `arena`
/// bytes: a failure message that says whether the sequence or the allocator differs.
fn departure(recorded: &Trace, plan: &MemoryPlan, arena: u64) -> String {
    let key = |e: &TraceEvent| (e.op, e.bytes, e.category);
    let planned = &plan.trace().events;
    let first = recorded
        .events
        .iter()
        .zip(planned)
        .position(|(r, p)| key(r) != key(p));
    let around = |events: &[TraceEvent], i: usize| -> Vec<String> {
        let lo = i.saturating_sub(3);
        events[lo..(i + 3).min(events.len())]
            .iter()
            .map(|e| format!("{:?} {} {}", e.op, e.bytes, e.category))
            .collect()
    };
    let sim = SimMemory::new(arena, 2 << 20).with_alignment(256);
    let alloc = Allocator::new(Arc::new(sim), Strategy::Bfc { fraction: 1.0 }).unwrap();
    let replayed = replay(recorded, &alloc)
        .map(|_| ())
        .map_err(|e| e.to_string());
    match first {
        Some(i) => format!(
            "the run departs from the plan at event {i}: recorded {:?}, planned {:?}; the \
             recording replayed on a simulated arena: {replayed:?}",
            around(&recorded.events, i),
            around(planned, i)
        ),
        None => format!(
            "the run's {} events follow the plan; the recording replayed on a simulated arena: \
             {replayed:?}",
            recorded.events.len()
        ),
    }
}

/// The plan's replay decides "fits" for a `bfc` arena as tight as it can be: the smallest
/// arena (whole 2 MiB granules) the plan says batch B fits. At 200x200 one more example adds
/// tens of MB, so B + 1 cannot fit it. The replay holds every workspace block the CUDA ops cut
/// (filter copy, padded input, cuDNN workspace, bias partials) in their order, so with the
/// default workspace limit the real arena fragments exactly as the replay's: B trains, B + 1
/// gets the typed out-of-memory error with nothing changed.
fn budget_b_and_b_plus_one() {
    let limit = None;
    let options = BackendOptions {
        workspace_limit: limit,
        ..BackendOptions::default()
    };
    let caching = common::cuda_or_skip(&options).unwrap();
    let caching = &caching;
    let input = |n: usize| Shape::new([n, 200, 200, 3]);
    let (adam, b, g) = (Adam::new(1e-3), 2, 2u64 << 20);
    let bfc = Strategy::Bfc { fraction: 1.0 };
    let plan = MemoryPlan::new(&seed_model(), &input(b), &adam, caching).unwrap();
    let plan = plan.for_strategy(bfc.clone());
    let arena = plan.min_budget().unwrap().div_ceil(g) * g;
    let next = MemoryPlan::new(&seed_model(), &input(b + 1), &adam, caching).unwrap();
    assert!(!next.for_strategy(bfc).fits(arena).unwrap());
    let be = bfc_backend(arena, limit);
    // cuDNN's choices for batch B, made before the arena holds anything else
    let on_arena = MemoryPlan::new(&seed_model(), &input(b), &adam, &be).unwrap();
    assert_eq!(on_arena.peak.bytes, plan.peak.bytes);
    be.allocator().start_trace();
    let mut trainer = Trainer::new(seed_model(), input(b), adam, &be, 3).unwrap();
    let (x, y) = batch(&be, &input(b), 2);
    let r = trainer.step(&x, &y);
    let recorded = be.allocator().stop_trace();
    let r = r.unwrap_or_else(|e| panic!("{e}\n{}", departure(&recorded, &plan, arena)));
    assert_eq!(r.memory.peak, plan.peak.bytes);
    drop((x, y));
    let state = (
        values(trainer.params().leaves()),
        values(trainer.state().field("mu")),
    );
    let (x, y) = batch(&be, &input(b + 1), 2);
    let e = trainer.step(&x, &y).unwrap_err();
    eprintln!(
        "bfc arena {arena} bytes (batch {b} needs {} by the plan): batch {b} trained; batch {}:\n{e}",
        plan.min_budget().unwrap(),
        b + 1
    );
    let TrainError::OutOfMemory(oom) = &e else {
        panic!("expected the step's out-of-memory error, got {e}");
    };
    assert_eq!((oom.batch, oom.last_finished_step), (b + 1, 1));
    assert!(oom.buffer.is_some(), "the plan names the failed buffer");
    assert_eq!(
        state,
        (
            values(trainer.params().leaves()),
            values(trainer.state().field("mu"))
        )
    );
    assert_eq!(trainer.state().count, 1);
}

#[test]
fn gpu_plan_equals_measured_and_budgets_hold() {
    // a backend of its own (a workspace limit makes the helper open a fresh one)
    let options = BackendOptions {
        workspace_limit: Some(DEFAULT_WORKSPACE_LIMIT),
        ..BackendOptions::default()
    };
    let Some(be) = common::cuda_or_skip(&options) else {
        return;
    };
    plan_matches(&be, seed_model, Shape::new([4, 32, 32, 3]));
    plan_matches(&be, seed_model, Shape::new([16, 32, 32, 3]));
    plan_matches(&be, strided_model, Shape::new([3, 9, 9, 2]));
    plan_matches(&be, deep_model, Shape::new([2, 11, 10, 3]));
    drop(be);
    budget_b_and_b_plus_one();
}
