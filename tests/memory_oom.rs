//! Budgets on the CPU: with memory capped at the plan's figure for batch B, batch B trains and
//! batch B + 1 gets the typed out-of-memory error (naming the failed buffer and the largest
//! batch that fits, B) with parameters and Adam state untouched; `max_batch_that_fits` of that
//! figure is B.

use std::sync::Arc;

use stax::alloc::{Category, Strategy};
use stax::serial;
use stax::tensor::cpu::CpuBackend;
use stax::train::plan::MemoryPlan;
use stax::train::{Feed, TrainError, Trainer, max_batch_that_fits};
use stax::{Adam, Backend, BackendOptions, Conv, Dense, Flatten, Relu, Serial, Shape, Tensor};

const IMG: (usize, usize, usize) = (16, 16, 3);

fn model() -> Serial {
    serial![
        Conv::same(16, (3, 3)),
        Relu,
        Conv::same(16, (3, 3)),
        Relu,
        Flatten,
        Dense(8),
        Relu,
        Dense(2)
    ]
}

fn input(batch: usize) -> Shape {
    Shape::new([batch, IMG.0, IMG.1, IMG.2])
}

fn options(strategy: &Strategy) -> BackendOptions {
    BackendOptions {
        strategy: strategy.clone(),
        ..BackendOptions::default()
    }
}

fn batch(be: &Arc<dyn Backend>, n: usize) -> (Tensor, Tensor) {
    let shape = input(n);
    let images: Vec<f32> = (0..shape.numel()).map(|i| (i % 13) as f32 / 13.0).collect();
    let labels: Vec<f32> = (0..n * 2).map(|i| ((i / 2 + i) % 2) as f32).collect();
    let x = Tensor::from_slice(be, &images, shape, Category::Input).unwrap();
    let y = Tensor::from_slice(be, &labels, [n, 2], Category::Input).unwrap();
    (x, y)
}

fn values<'a>(ts: impl IntoIterator<Item = &'a stax::Tensor>) -> Vec<Vec<f32>> {
    ts.into_iter().map(|t| t.to_vec().unwrap()).collect()
}

/// The smallest budget batch `n` needs under `strategy` on a capped host.
fn figure(template: &Arc<dyn Backend>, n: usize) -> u64 {
    let plan = MemoryPlan::new(&model(), &input(n), &Adam::new(1e-3), template).unwrap();
    let need = plan.min_budget().unwrap();
    assert!(plan.fits(need).unwrap() && !plan.fits(need - 1).unwrap());
    need
}

#[test]
fn budget_of_batch_b_trains_b_and_refuses_b_plus_one() {
    for strategy in [Strategy::Bfc { fraction: 1.0 }, Strategy::Caching] {
        // planning needs only the allocator's kind: a large capped host of the same strategy
        let template: Arc<dyn Backend> =
            CpuBackend::with_capacity(&options(&strategy), 1 << 30).unwrap();
        // budgets move in 2 MiB granules: take the first batch whose successor needs more
        let (b, cap) = (1..64)
            .map(|n| (n, figure(&template, n)))
            .find(|&(n, cap)| figure(&template, n + 1) > cap)
            .expect("a batch size where the budget grows");
        let adam = Adam::new(1e-3);
        assert_eq!(
            max_batch_that_fits(
                &model(),
                &input(1),
                &adam,
                &template,
                Feed::Placed,
                Some(cap)
            )
            .unwrap(),
            b,
            "{strategy}"
        );

        let be: Arc<dyn Backend> = CpuBackend::with_capacity(&options(&strategy), cap).unwrap();
        let mut trainer = Trainer::new(model(), input(b), adam, &be, 11).unwrap();
        let (x, y) = batch(&be, b);
        let r = trainer.step(&x, &y).unwrap();
        let plan = trainer.plan(b).unwrap();
        assert_eq!(r.memory.peak, plan.peak.bytes);
        drop((x, y));
        assert_eq!(
            trainer.max_batch_that_fits(None).unwrap(),
            b,
            "default budget"
        );

        let (params, mu, nu) = (
            values(trainer.params().leaves()),
            values(trainer.state().field("mu")),
            values(trainer.state().field("nu")),
        );
        let (x, y) = batch(&be, b + 1);
        let e = trainer.step(&x, &y).unwrap_err();
        let TrainError::OutOfMemory(oom) = &e else {
            panic!("{strategy}: expected the step's out-of-memory error, got {e}");
        };
        assert_eq!((oom.step, oom.batch, oom.last_finished_step), (2, b + 1, 1));
        assert_eq!(oom.max_batch, Some(b));
        assert!(
            oom.buffer.is_some(),
            "the plan names the failed buffer: {e}"
        );
        let plan_next = trainer.plan(b + 1).unwrap();
        assert_eq!(oom.planned_peak, Some(plan_next.peak.bytes));
        let text = e.to_string();
        assert!(
            text.contains(&format!("the largest batch that fits is {b}")),
            "{text}"
        );
        assert!(text.contains(oom.buffer.as_deref().unwrap()), "{text}");
        assert!(
            text.contains("parameters and optimizer state are those of step 1"),
            "{text}"
        );
        // nothing of the failed step changed the state, and nothing of it stays allocated
        assert_eq!(trainer.steps(), 1);
        assert_eq!(trainer.state().count, 1);
        assert_eq!(values(trainer.params().leaves()), params);
        assert_eq!(values(trainer.state().field("mu")), mu);
        assert_eq!(values(trainer.state().field("nu")), nu);
        assert_eq!(
            be.allocator().stats().requested,
            3 * trainer.params().bytes() as u64 + (x.bytes() + y.bytes()) as u64
        );
        // and the trainer goes on with a batch that fits
        drop((x, y));
        let (x, y) = batch(&be, b);
        assert_eq!(trainer.step(&x, &y).unwrap().step, 2);
    }
}

#[test]
fn max_batch_needs_a_budget_on_an_uncapped_host() {
    let be = stax::Device::Cpu.open(&BackendOptions::default()).unwrap();
    let fit = |budget| {
        let adam = Adam::new(1e-3);
        max_batch_that_fits(&model(), &input(1), &adam, &be, Feed::Placed, budget)
    };
    let e = fit(None).unwrap_err();
    assert!(matches!(e, TrainError::NoBudget { .. }), "{e}");
    // a budget below the persistent state fits no batch
    let n = fit(Some(1 << 10));
    assert_eq!(n.unwrap(), 0);
}

#[test]
fn parameters_that_do_not_fit_are_a_typed_setup_error() {
    let roomy = stax::Device::Cpu.open(&BackendOptions::default()).unwrap();
    let fits = Trainer::new(model(), input(1), Adam::new(1e-3), &roomy, 0).unwrap();
    let state = 3 * fits.params().bytes() as u64;
    // platform: room for the parameters and one moment; caching: not one 2 MiB segment
    let cases = [
        (Strategy::Platform, state * 2 / 3, Category::OptimizerState),
        (Strategy::Caching, 1 << 20, Category::Parameter),
    ];
    for (strategy, cap, failed) in cases {
        let be: Arc<dyn Backend> = CpuBackend::with_capacity(&options(&strategy), cap).unwrap();
        let e = Trainer::new(model(), input(1), Adam::new(1e-3), &be, 0).unwrap_err();
        let TrainError::InitOutOfMemory {
            state_bytes,
            request,
        } = &e
        else {
            panic!("{strategy}: expected the set-up's out-of-memory error, got {e}");
        };
        assert_eq!(*state_bytes, state, "{strategy}");
        assert_eq!(request.category, failed, "{strategy}");
        assert!(
            e.to_string().contains(&stax::alloc::human_bytes(state)),
            "{e}"
        );
    }
}

/// Room for the parameters and Adam's state but not for the step: the trainer's set-up, which
/// reserves the step's memory ahead, fails with the step's out-of-memory error marked as the
/// set-up's (step 1, no step finished), and says so.
#[test]
fn a_step_that_does_not_fit_fails_at_set_up_and_says_so() {
    let roomy = stax::Device::Cpu.open(&BackendOptions::default()).unwrap();
    let plan = MemoryPlan::new(&model(), &input(8), &Adam::new(1e-3), &roomy).unwrap();
    let cap = (plan.persistent_bytes() + plan.peak.bytes) / 2;
    let be: Arc<dyn Backend> =
        CpuBackend::with_capacity(&options(&Strategy::Platform), cap).unwrap();
    let e = Trainer::new(model(), input(8), Adam::new(1e-3), &be, 0).unwrap_err();
    let TrainError::OutOfMemory(oom) = &e else {
        panic!("expected the step's out-of-memory error, got {e}");
    };
    assert!(oom.at_set_up, "{e}");
    assert_eq!((oom.step, oom.batch, oom.last_finished_step), (1, 8, 0));
    let want = "train: set-up (reserving step 1's memory, batch 8) ran out of memory allocating";
    assert!(e.to_string().starts_with(want), "{e}");
}
