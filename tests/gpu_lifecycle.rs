//! A CUDA backend gives back everything it holds when it is dropped: segments, an `expandable`
//! range and its pages, a `bfc` arena, an `async` pool, its pinned staging memory, its cuBLAS
//! and cuDNN handles and its modules. Backends of every strategy are opened, trained with and
//! dropped, twice, and the driver's used bytes return to the same figure each time. `run.sh`
//! runs this binary once more under `compute-sanitizer --tool memcheck --leak-check full`.
//!
//! It opens its own backends only (never the shared one of `tests/common`), so at its end no
//! device allocation of this process is left for the sanitizer to report.

mod common;

use common::{batch, cuda_or_skip, seed_model};
use stax::train::Trainer;
use stax::{Adam, Backend, BackendOptions, Device, Precision, Shape, Strategy};
use std::sync::Arc;

const MIB: u64 = 1 << 20;

fn strategies() -> [Strategy; 5] {
    [
        Strategy::Caching,
        Strategy::Expandable,
        Strategy::Bfc { fraction: 0.02 },
        Strategy::Platform,
        Strategy::Async {
            release_threshold: u64::MAX,
        },
    ]
}

/// Bytes the driver says are used on device 0, read through `observer`.
fn used(observer: &dyn Backend) -> u64 {
    observer.synchronize().unwrap();
    let (free, total) = observer.driver_memory().unwrap().expect("a device");
    total - free
}

/// Opens a backend with `strategy`, trains two steps and evaluates, then drops it all.
fn train_and_drop(strategy: Strategy) {
    let options = BackendOptions {
        strategy: strategy.clone(),
        precision: Precision::Tf32,
        workspace_limit: None,
    };
    let be: Arc<dyn Backend> = Device::Cuda(0).open(&options).unwrap();
    let input = Shape::new([4, 16, 16, 3]);
    let mut trainer = Trainer::new(seed_model(), input.clone(), Adam::new(1e-3), &be, 7).unwrap();
    let (x, y) = batch(&be, &input, 2);
    for _ in 0..2 {
        let loss = trainer.step(&x, &y).unwrap().loss;
        assert!(loss.is_finite(), "{strategy}: loss {loss}");
    }
    assert!(trainer.predict(&x).is_ok());
    assert!(
        be.allocator().stats().reserved > 0,
        "{strategy} held memory"
    );
}

#[test]
fn dropped_backends_give_everything_back() {
    // The observer keeps the device's primary context alive between the rounds, so its own
    // memory (and what the libraries load into it once) stays out of the comparison.
    let observer = BackendOptions {
        strategy: Strategy::Platform,
        ..BackendOptions::default()
    };
    let Some(observer) = cuda_or_skip(&observer) else {
        return;
    };
    // Round 0 warms up: cuDNN and cuBLAS load their kernels into the context once.
    for strategy in strategies() {
        train_and_drop(strategy);
    }
    let baseline = used(&*observer);
    for round in 1..=2 {
        for strategy in strategies() {
            train_and_drop(strategy.clone());
            let now = used(&*observer);
            eprintln!("round {round}, {strategy}: driver used {now} (baseline {baseline})");
            assert!(
                now <= baseline + 2 * MIB,
                "round {round}, {strategy}: {} bytes more than after the warm-up",
                now - baseline
            );
        }
    }
    assert_eq!(observer.allocator().stats().reserved, 0);
}
