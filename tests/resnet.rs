//! stax's ResNet blocks train: a shallow ResNet (one `ConvBlock` per stage, no identity
//! blocks beyond it, narrow) on the embedded two-class data reaches 95% on the CPU with every
//! step's peak and live bytes equal to the plan; on the GPU, two steps equal the CPU's, then
//! the same run; under the bf16 policy it trains on both (BatchNorm on bf16 activations with
//! f32 parameters and statistics) with exact memory, the GPU's two steps equal to the CPU's.
//! The full ResNet-50 runs on the GPU in `examples/resnet50.rs`.

mod common;

use common::{cpu, private_gpu_with, train, two_steps_match_cpu};
use stax::layers::{Mixed, Policy};
use stax::models::ResNet;
use stax::{Precision, Serial, Shape};

/// Blocks `[1, 1, 1, 1]`, widths `[8, 16, 16, 16]` (blocks of 4x): the structure of ResNet-50 at
/// a size the CPU trains in seconds. At 28x28 the feature map is 1x1 after the fourth stage.
fn shallow() -> Serial {
    let net = ResNet {
        blocks: [1, 1, 1, 1],
        widths: [8, 16, 16, 16],
        classes: 2,
        remat_stages: 0,
        bn_spans: Default::default(),
    };
    net.build((28, 28, 1)).unwrap()
}

/// Batch 50 of 28x28 gray images.
fn input() -> Shape {
    Shape::new([50, 28, 28, 1])
}

/// Passes over the embedded training set.
const EPOCHS: u64 = 4;

#[test]
fn shallow_resnet_reaches_95_percent_on_the_cpu_with_exact_memory() {
    let (accuracy, losses) = train(shallow(), input(), &cpu(), EPOCHS);
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
    // a backend of its own: the other GPU test's buffers would count in its peaks
    let Some(gpu) = private_gpu_with(Precision::Highest) else {
        return;
    };
    two_steps_match_cpu(shallow, &input(), &gpu, 1e-3);
    let (accuracy, _) = train(shallow(), input(), &gpu, EPOCHS);
    assert!(accuracy >= 0.95, "gpu test accuracy {accuracy}");
}

/// The shallow ResNet under `Policy::BF16`.
fn shallow_bf16() -> Mixed<Serial> {
    Mixed::new(shallow(), Policy::BF16)
}

#[test]
fn shallow_resnet_trains_in_bf16_on_the_cpu_with_exact_memory() {
    let (accuracy, losses) = train(shallow_bf16(), input(), &cpu(), 2);
    let (first, last) = (
        losses[..5].iter().sum::<f32>(),
        losses[losses.len() - 5..].iter().sum::<f32>(),
    );
    assert!(last < first, "bf16 loss did not fall: {losses:?}");
    println!("shallow resnet, bf16: test accuracy {accuracy}");
    assert!(accuracy >= 0.9, "bf16 test accuracy {accuracy}");
}

#[test]
fn shallow_resnet_trains_in_bf16_on_the_gpu_as_on_the_cpu() {
    // a backend of its own: the other GPU test's buffers would count in its peaks
    let Some(gpu) = private_gpu_with(Precision::Highest) else {
        return;
    };
    two_steps_match_cpu(shallow_bf16, &input(), &gpu, 2e-2);
    let (accuracy, _) = train(shallow_bf16(), input(), &gpu, EPOCHS);
    assert!(accuracy >= 0.95, "gpu bf16 test accuracy {accuracy}");
}
