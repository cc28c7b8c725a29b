//! Models that are not a plain stack train through `Trainer` with exact memory: a residual
//! network built from `FanOut`, `parallel`, `Identity` and `FanInSum`, and an MLP on
//! `[n, features]` inputs. On the CPU, and on the GPU where there is one (GPU = CPU on the same
//! batches, then the full run). Every step's peak equals the plan's, to the byte.

mod common;

use std::sync::Arc;

use common::{assert_rel_close, cpu, cuda_or_skip, host_values, with_precision};
use stax::models::mlp;
use stax::train::Trainer;
use stax::train::data::{Loader, fashion_mnist_2class};
use stax::{
    Adam, Backend, Conv, Dense, FanInSum, FanOut, Flatten, Identity, Layer, Precision, Relu,
    Serial, Shape, parallel, serial,
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

/// Trains `model` on the embedded two-class data for `epochs` (batch 50), checking every
/// step's peak and live bytes against the plan; returns the test accuracy and the losses.
fn train<L: Layer>(model: L, input: Shape, be: &Arc<dyn Backend>, epochs: u64) -> (f32, Vec<f32>) {
    let (train, test) = fashion_mnist_2class().unwrap();
    let batch = input.dims()[0];
    let mut trainer = Trainer::new(model, input, Adam::new(1e-3), be, 5).unwrap();
    let plan = trainer.plan(batch).unwrap();
    assert!(plan.exact);
    let loader = Loader::new(train.len(), batch, 5).unwrap();
    let mut losses = Vec::new();
    for epoch in 0..epochs {
        for indices in loader.batches(epoch) {
            let (x, y) = trainer.place_batch(&train, &indices).unwrap();
            let r = trainer.step(&x, &y).unwrap();
            assert_eq!(r.memory.peak, plan.peak.bytes, "step {} peak", r.step);
            assert_eq!(
                r.memory.live,
                plan.persistent_bytes(),
                "step {} live",
                r.step
            );
            losses.push(r.loss);
        }
    }
    (trainer.evaluate(&test, batch).unwrap().accuracy, losses)
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
    let (train_set, _) = fashion_mnist_2class().unwrap();
    let cases: [(Box<dyn Fn() -> Serial>, Shape); 2] = [
        (Box::new(residual), Shape::new([50, 28, 28, 1])),
        (Box::new(|| mlp(&[64], 2)), Shape::new([50, 784])),
    ];
    for (make, input) in cases {
        let cpu = cpu();
        let mut on_gpu = Trainer::new(make(), input.clone(), Adam::new(1e-3), &gpu, 5).unwrap();
        let mut on_cpu = Trainer::new(make(), input.clone(), Adam::new(1e-3), &cpu, 5).unwrap();
        let loader = Loader::new(train_set.len(), 50, 5).unwrap();
        for indices in loader.batches(0).take(2) {
            let (xg, yg) = on_gpu.place_batch(&train_set, &indices).unwrap();
            let (xc, yc) = on_cpu.place_batch(&train_set, &indices).unwrap();
            let (rg, rc) = (
                on_gpu.step(&xg, &yg).unwrap(),
                on_cpu.step(&xc, &yc).unwrap(),
            );
            assert!(
                (rg.loss - rc.loss).abs() <= 1e-4 * rc.loss.abs().max(1.0),
                "loss {} vs {}",
                rg.loss,
                rc.loss
            );
        }
        let (pg, pc) = (
            host_values(on_gpu.params().leaves()),
            host_values(on_cpu.params().leaves()),
        );
        assert_rel_close(&pg, &pc, 1e-4, "parameters after two steps");
        for field in ["mu", "nu"] {
            let (g, c) = (on_gpu.state().field(field), on_cpu.state().field(field));
            assert_rel_close(&host_values(g), &host_values(c), 1e-3, field);
        }
        // The shared backend counts every live tensor: the comparison's trainers go first.
        drop((on_gpu, on_cpu));
        let (accuracy, _) = train(make(), input, &gpu, 2);
        assert!(accuracy >= 0.95, "gpu test accuracy {accuracy}");
    }
}
