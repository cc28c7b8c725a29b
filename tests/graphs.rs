//! Models that are not a plain stack train through `Trainer` with exact memory: a residual
//! network built from `FanOut`, `parallel`, `Identity` and `FanInSum`, and an MLP on
//! `[n, features]` inputs. On the CPU, and on the GPU where there is one (GPU = CPU on the same
//! batches, then the full run). Every step's peak equals the plan's, to the byte.

mod common;

use common::{cpu, cuda_or_skip, train, two_steps_match_cpu, with_precision};
use stax::models::mlp;
use stax::{
    Conv, Dense, FanInSum, FanOut, Flatten, Identity, Precision, Relu, Serial, Shape, parallel,
    serial,
};

/// `Conv Relu FanOut(2) parallel(serial(Conv, Relu, Conv), Identity) FanInSum Relu` and a
/// dense head.
fn residual() -> Serial {
    serial![
        Conv::same(8, (3, 3)),
        Relu,
        FanOut(2),
        parallel![
            serial![Conv::same(8, (3, 3)), Relu, Conv::same(8, (3, 3))],
            Identity
        ],
        FanInSum,
        Relu,
        Flatten,
        Dense(2)
    ]
}

#[test]
fn residual_network_trains_on_the_cpu_with_exact_memory() {
    let (accuracy, losses) = train(residual(), Shape::new([50, 28, 28, 1]), &cpu(), 2);
    assert!(losses[losses.len() - 1] < losses[0], "{losses:?}");
    assert!(accuracy >= 0.95, "test accuracy {accuracy}");
}

#[test]
fn mlp_on_flat_features_trains_with_exact_memory() {
    let (accuracy, losses) = train(mlp(&[64], 2), Shape::new([50, 784]), &cpu(), 2);
    assert!(losses[losses.len() - 1] < losses[0], "{losses:?}");
    assert!(accuracy >= 0.95, "test accuracy {accuracy}");
}

/// Two steps on the GPU equal the CPU's (losses, parameters, both Adam moments), then the full
/// run reaches the accuracy with exact memory, for both models.
#[test]
fn residual_network_and_mlp_train_on_the_gpu_as_on_the_cpu() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    let cases: [(Box<dyn Fn() -> Serial>, Shape); 2] = [
        (Box::new(residual), Shape::new([50, 28, 28, 1])),
        (Box::new(|| mlp(&[64], 2)), Shape::new([50, 784])),
    ];
    for (make, input) in cases {
        two_steps_match_cpu(&make, &input, &gpu, 1e-4);
        let (accuracy, _) = train(make(), input, &gpu, 2);
        assert!(accuracy >= 0.95, "gpu test accuracy {accuracy}");
    }
}
