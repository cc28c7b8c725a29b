//! The prefetched loop (`Trainer::step_prefetched`): it trains exactly like placing each batch
//! before its step, its plan counts the prefetched batch to the byte, a bad batch is reported
//! by its own step, and asynchronous uploads are checked and ordered after queued work.

mod common;

use std::sync::Arc;

use common::{
    Rng, assert_rel_close, cpu, cuda_or_skip, host_values, seed_for, small_model, with_precision,
};
use stax::alloc::{Allocator, HostMemory, SimMemory};
use stax::tensor::cuda::CudaBackend;
use stax::tensor::ops;
use stax::train::data::{Dataset, Loader, fashion_mnist_2class};
use stax::train::plan::{Feed, MemoryPlan};
use stax::train::{StepReport, TrainError, Trainer, place_batch};
use stax::{Adam, Backend, Category, DType, Precision, Shape, Strategy, Tensor, TensorError};

const IMG: usize = 12;

fn trainer(backend: &Arc<dyn Backend>, batch: usize) -> Trainer<stax::Serial> {
    let input = Shape::new([batch, IMG, IMG, 3]);
    Trainer::new(small_model(), input, Adam::new(1e-2), backend, 5).unwrap()
}

/// `steps` batches of `batch` examples, in the loader's order.
fn batches(train: &Dataset, batch: usize, steps: usize) -> Vec<Vec<usize>> {
    let loader = Loader::new(train.len(), batch, 11).unwrap();
    loader.batches(0).take(steps).collect()
}

/// Every step of a prefetched loop over `batches` on `backend`.
fn run_prefetched(
    t: &mut Trainer<stax::Serial>,
    train: &Dataset,
    batches: &[Vec<usize>],
) -> Vec<StepReport> {
    let mut feed = t.prefetch(train, batches.to_vec());
    let mut reports = Vec::new();
    while let Some(r) = t.step_prefetched(&mut feed).unwrap() {
        reports.push(r);
    }
    reports
}

#[test]
fn prefetched_loop_trains_like_the_placed_loop_and_its_plan_is_exact() {
    let (be, other) = (cpu(), cpu()); // one allocator each
    let (train, _) = fashion_mnist_2class().unwrap();
    let batch = 16;
    let order = batches(&train, batch, 6);
    let mut placed = trainer(&other, batch);
    let placed_losses: Vec<f32> = order
        .iter()
        .map(|ix| {
            let (x, y) = place_batch(&other, &train, ix, (IMG, IMG, 3)).unwrap();
            placed.step(&x, &y).unwrap().loss
        })
        .collect();
    let mut fed = trainer(&be, batch);
    let plan_placed = fed.plan(batch).unwrap();
    let reports = run_prefetched(&mut fed, &train, &order);
    assert_eq!(fed.feed(), Feed::Prefetched);
    let losses: Vec<f32> = reports.iter().map(|r| r.loss).collect();
    assert_eq!(
        losses, placed_losses,
        "same batches, same order, same arithmetic"
    );
    assert_eq!(
        host_values(fed.params().leaves()),
        host_values(placed.params().leaves())
    );

    let plan = fed.plan(batch).unwrap();
    assert_eq!(plan.feed, Feed::Prefetched);
    let batch_bytes = (4 * batch * (IMG * IMG * 3 + 2)) as u64;
    assert_eq!(plan.peak.bytes, plan_placed.peak.bytes + batch_bytes);
    assert_eq!(
        plan.persistent_bytes(),
        plan_placed.persistent_bytes() + batch_bytes
    );
    let state = 3 * fed.params().bytes() as u64;
    for (i, r) in reports.iter().enumerate() {
        // during every step but the last, the next batch was on the device too
        let last = i + 1 == reports.len();
        let want = if last {
            plan_placed.peak.bytes
        } else {
            plan.peak.bytes
        };
        assert_eq!(r.memory.peak, want, "step {}", r.step);
        // after the step: parameters, m and v, its batch and the next one (none after the last)
        let inputs = if last { batch_bytes } else { 2 * batch_bytes };
        assert_eq!(r.memory.live, state + inputs, "step {}", r.step);
        assert_eq!(r.memory.by_category[Category::Input.index()].live, inputs);
    }
}

#[test]
fn a_bad_batch_is_reported_by_its_own_step_and_the_loop_goes_on() {
    let be = cpu();
    let (train, _) = fashion_mnist_2class().unwrap();
    let mut order = batches(&train, 4, 4);
    order[2] = vec![0, train.len()]; // one index out of range
    let mut t = trainer(&be, 4);
    let mut feed = t.prefetch(&train, order);
    let mut outcomes = Vec::new();
    loop {
        match t.step_prefetched(&mut feed) {
            Ok(Some(r)) => outcomes.push(Ok(r.step)),
            Ok(None) => break,
            Err(e) => outcomes.push(Err(e)),
        }
    }
    assert_eq!(outcomes.len(), 4);
    assert!(matches!(outcomes[..2], [Ok(1), Ok(2)]));
    assert!(
        matches!(outcomes[2], Err(TrainError::IndexOutOfRange { .. })),
        "{:?}",
        outcomes[2]
    );
    assert!(matches!(outcomes[3], Ok(3)), "{:?}", outcomes[3]);
    assert_eq!(t.steps(), 3);
}

#[test]
fn upload_async_rejects_device_memory_and_wrong_sizes() {
    let be = cpu();
    let dst = || Tensor::empty(&be, [3], DType::F32, Category::Input).unwrap();
    let sim = SimMemory::new(1 << 30, 2 << 20);
    let sim = Allocator::new(Arc::new(sim), Strategy::Caching).unwrap();
    let not_host = sim.allocate(12, Category::Input).unwrap();
    let e = ops::upload_async(not_host, dst()).unwrap_err();
    assert!(matches!(e, TensorError::InvalidArgument { .. }), "{e}");
    let host = Allocator::new(Arc::new(HostMemory::new()), Strategy::Caching).unwrap();
    let short = host.allocate(8, Category::Input).unwrap();
    let e = ops::upload_async(short, dst()).unwrap_err();
    assert!(
        matches!(
            e,
            TensorError::HostLength {
                expected: 12,
                got: 8,
                ..
            }
        ),
        "{e}"
    );
}

/// The plan of a prefetched loop of the seed-like model on the GPU equals every measured
/// step's peak, and the losses follow the CPU's (full f32), over fresh random batches.
#[test]
fn prefetched_gpu_loop_matches_the_cpu_and_its_plan() {
    if cuda_or_skip(&with_precision(Precision::Highest)).is_none() {
        return;
    }
    // a backend of its own: other tests of this binary allocate on the shared one meanwhile
    let gpu: Arc<dyn Backend> = CudaBackend::new(0, &with_precision(Precision::Highest)).unwrap();
    let cpu = cpu();
    let (train, _) = fashion_mnist_2class().unwrap();
    let batch = 8;
    let mut rng = Rng::new(seed_for("prefetched_gpu_loop", &[batch]));
    let order: Vec<Vec<usize>> = (0..4)
        .map(|_| (0..batch).map(|_| rng.below(train.len())).collect())
        .collect();
    let mut on_cpu = trainer(&cpu, batch);
    let mut on_gpu = trainer(&gpu, batch);
    let cpu_losses: Vec<f32> = run_prefetched(&mut on_cpu, &train, &order)
        .iter()
        .map(|r| r.loss)
        .collect();
    let gpu_reports = run_prefetched(&mut on_gpu, &train, &order);
    let gpu_losses: Vec<f32> = gpu_reports.iter().map(|r| r.loss).collect();
    assert_rel_close(&gpu_losses, &cpu_losses, 1e-4, "losses");
    assert_rel_close(
        &host_values(on_gpu.params().leaves()),
        &host_values(on_cpu.params().leaves()),
        1e-3,
        "parameters",
    );
    let plan = on_gpu.plan(batch).unwrap();
    let input = Shape::new([batch, IMG, IMG, 3]);
    let placed = MemoryPlan::new(&small_model(), &input, &Adam::new(1e-2), &gpu).unwrap();
    // step 1 also holds cuDNN's algorithm search; from step 2 on the plan is exact
    for r in &gpu_reports[1..gpu_reports.len() - 1] {
        assert_eq!(r.memory.peak, plan.peak.bytes, "step {}", r.step);
    }
    assert_eq!(gpu_reports.last().unwrap().memory.peak, placed.peak.bytes);
}

/// An upload into memory that queued work has just freed waits for that work: a long matmul
/// writes `c`, `c` is dropped, and the upload into the block it leaves must not be overwritten
/// by the matmul finishing after it.
#[test]
fn gpu_upload_async_is_ordered_after_queued_work() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    let n = 4096;
    let mut rng = Rng::new(seed_for("gpu_upload_async_ordered", &[n]));
    let a = Tensor::from_slice(&gpu, &rng.vec(n * n, -1.0, 1.0), [n, n], Category::Other);
    let a = a.unwrap();
    let pinned = gpu.staging_allocator().expect("CUDA has pinned memory");
    let data = rng.vec(n * n, -1.0, 1.0);
    for round in 0..3 {
        let mut c = Tensor::empty(&gpu, [n, n], DType::F32, Category::Other).unwrap();
        ops::matmul(&a, &a, false, false, &mut c).unwrap(); // queued, milliseconds of work
        let freed = c.addr();
        drop(c);
        let dst = Tensor::empty(&gpu, [n, n], DType::F32, Category::Input).unwrap();
        assert_eq!(
            dst.addr(),
            freed,
            "the caching allocator reuses the block at once"
        );
        let mut src = pinned.allocate(n * n * 4, Category::Input).unwrap();
        src.host_bytes_mut()
            .unwrap()
            .copy_from_slice(bytemuck::cast_slice(&data));
        let got = ops::upload_async(src, dst).unwrap().wait().unwrap();
        assert_eq!(got.to_vec().unwrap(), data, "round {round}");
    }
}

#[test]
fn an_empty_batch_is_a_typed_error() {
    let be = cpu();
    let (train, _) = fashion_mnist_2class().unwrap();
    let mut t = trainer(&be, 4);
    let mut feed = t.prefetch(&train, vec![vec![]]);
    let e = t.step_prefetched(&mut feed).unwrap_err();
    assert!(matches!(e, TrainError::ZeroBatchSize { .. }), "{e}");
    assert!(t.step_prefetched(&mut feed).unwrap().is_none());
}

/// `--batch auto` on a capped memory: the largest batch a budget holds for a prefetched loop
/// (`max_batch_that_fits`, its plan's trace replayed on a simulated memory of that size) runs
/// on a CPU capped at that budget, with the allocator's reservation within it. Budgets: the
/// least one of a batch of 24 (one 2 MiB granule) and an odd one of several granules. The
/// set-up's rehearsal (for placed batches) gives back its cache before the prefetched feed's,
/// which runs before any of its batches is placed (it ran out of memory with four batches
/// live: the two placed ones and the replay's two).
#[test]
fn the_largest_prefetched_batch_a_budget_holds_runs_in_it() {
    let (train, _) = fashion_mnist_2class().unwrap();
    let (model, adam) = (small_model(), Adam::new(1e-2));
    let at = |batch: usize| Shape::new([batch, IMG, IMG, 3]);
    let plan = MemoryPlan::with_feed(&model, &at(24), &adam, &cpu(), Feed::Prefetched).unwrap();
    for budget in [plan.min_budget().unwrap(), 7_654_321] {
        let options = stax::BackendOptions::default();
        let capped: Arc<dyn Backend> =
            stax::tensor::cpu::CpuBackend::with_capacity(&options, budget).unwrap();
        let feed = Feed::Prefetched;
        let fit =
            stax::train::max_batch_that_fits(&model, &at(1), &adam, &capped, feed, Some(budget));
        let n = fit.unwrap();
        assert!(n >= 24, "{budget} bytes hold a batch of {n}");
        let mut t = trainer(&capped, n);
        let reports = run_prefetched(&mut t, &train, &batches(&train, n, 3));
        assert_eq!(reports.len(), 3, "batch {n} in {budget} bytes");
        let reserved = capped.allocator().stats().reserved;
        assert!(
            reserved <= budget,
            "batch {n}: reserved {reserved} of {budget} bytes"
        );
    }
}

/// The headroom rule on a tight budget: the seed at batch 100 on 28x28 in 140 MB. Widening
/// conv2's im2col buffer would keep the planned peak yet make the caching allocator empty its
/// cache at every step (a larger block wants its own segment); the trainer revokes it, and the
/// allocator reserves once.
#[test]
fn a_tight_budget_keeps_its_memory_steady_under_the_headroom_rule() {
    let (train, _) = fashion_mnist_2class().unwrap();
    let options = stax::BackendOptions::default();
    let capped: Arc<dyn Backend> =
        stax::tensor::cpu::CpuBackend::with_capacity(&options, 140_000_000).unwrap();
    let input = Shape::new([100, 28, 28, 3]);
    let model = stax::models::seed_cnn(2);
    let mut t = Trainer::new(model, input, Adam::new(1e-3), &capped, 5).unwrap();
    let plan = t.plan_with_feed(100, Feed::Prefetched).unwrap();
    let conv2 = plan.buffers.iter().find(|b| b.name == "2.conv/workspace");
    assert!(conv2.is_some_and(|b| b.bytes <= 4 << 20), "{plan}");
    let mut feed = t.prefetch(&train, batches(&train, 100, 4));
    let mut releases = Vec::new();
    while let Some(r) = t.step_prefetched(&mut feed).unwrap() {
        assert!(r.memory.peak <= plan.peak.bytes);
        releases.push(capped.allocator().stats().backend_releases);
    }
    assert_eq!(releases.len(), 4);
    assert!(releases.windows(2).all(|w| w[0] == w[1]), "{releases:?}");
}
