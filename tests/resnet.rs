//! stax's ResNet blocks train: a shallow ResNet (one `ConvBlock` per stage, no identity
//! blocks beyond it, narrow) on the embedded two-class data reaches 95% on the CPU with every
//! step's peak and live bytes equal to the plan; on the GPU, two steps equal the CPU's, then
//! the same run. The full ResNet-50 runs on the GPU in `examples/resnet50.rs`.

mod common;

use std::sync::Arc;

use common::{assert_rel_close, cpu, cuda_or_skip, host_values, with_precision};
use stax::models::ResNet;
use stax::train::Trainer;
use stax::train::data::{Loader, fashion_mnist_2class};
use stax::{Adam, Backend, Precision, Serial, Shape};

/// Blocks `[1, 1, 1, 1]`, widths `[8, 16, 16, 16]` (blocks of 4x): the structure of ResNet-50 at
/// a size the CPU trains in seconds. At 28x28 the feature map is 1x1 after the fourth stage.
fn shallow() -> Serial {
    let net = ResNet {
        blocks: [1, 1, 1, 1],
        widths: [8, 16, 16, 16],
        classes: 2,
    };
    net.build((28, 28, 1)).unwrap()
}

/// Passes over the embedded training set.
const EPOCHS: u64 = 4;

/// Trains for `epochs` at batch 50, every step's peak and live bytes against the plan;
/// returns the test accuracy and the losses.
fn train(be: &Arc<dyn Backend>, epochs: u64) -> (f32, Vec<f32>) {
    let (train, test) = fashion_mnist_2class().unwrap();
    let input = Shape::new([50, 28, 28, 1]);
    let mut trainer = Trainer::new(shallow(), input, Adam::new(1e-3), be, 7).unwrap();
    let plan = trainer.plan(50).unwrap();
    assert!(plan.exact);
    let loader = Loader::new(train.len(), 50, 7).unwrap();
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
    (trainer.evaluate(&test, 50).unwrap().accuracy, losses)
}

#[test]
fn shallow_resnet_reaches_95_percent_on_the_cpu_with_exact_memory() {
    let (accuracy, losses) = train(&cpu(), EPOCHS);
    let (first, last) = (
        losses[..5].iter().sum::<f32>(),
        losses[losses.len() - 5..].iter().sum::<f32>(),
    );
    assert!(last < first, "loss did not fall: {losses:?}");
    println!("shallow resnet: test accuracy {accuracy}");
    assert!(accuracy >= 0.95, "test accuracy {accuracy}");
}

#[test]
fn shallow_resnet_trains_on_the_gpu_as_on_the_cpu() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    let cpu = cpu();
    let (train_set, _) = fashion_mnist_2class().unwrap();
    let input = Shape::new([50, 28, 28, 1]);
    let mut on_gpu = Trainer::new(shallow(), input.clone(), Adam::new(1e-3), &gpu, 7).unwrap();
    let mut on_cpu = Trainer::new(shallow(), input, Adam::new(1e-3), &cpu, 7).unwrap();
    let loader = Loader::new(train_set.len(), 50, 7).unwrap();
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
    assert_rel_close(&pg, &pc, 1e-3, "parameters after two steps");
    drop((on_gpu, on_cpu));
    let (accuracy, _) = train(&gpu, EPOCHS);
    assert!(accuracy >= 0.95, "gpu test accuracy {accuracy}");
}
