//! Models defined once, for the examples, benches and tests: the seed's CNN, an MLP, stax's
//! MNIST classifier ([`mnist_classifier`]) and stax's ResNet-50 ([`resnet`]).

pub mod resnet;

pub use resnet::{BnSpans, ResNet, conv_block, identity_block};

use crate::{Conv, Dense, Flatten, LogSoftmax, Relu, Serial, serial};

/// The seed's model (`seeds/000`): `Conv(64, (3, 3), SAME) Relu Conv(64, (3, 3), SAME) Relu
/// Flatten Dense(128) Relu Dense(classes)`, NHWC input.
pub fn seed_cnn(classes: usize) -> Serial {
    serial![
        Conv::same(64, (3, 3)),
        Relu,
        Conv::same(64, (3, 3)),
        Relu,
        Flatten,
        Dense(128),
        Relu,
        Dense(classes)
    ]
}

/// An MLP of `hidden` widths with ReLUs and a `classes`-way head, on `[n, features]` inputs:
/// stax's `examples/mnist_classifier.py` is `mlp(&[1024, 1024], 10)` (before its `LogSoftmax`).
pub fn mlp(hidden: &[usize], classes: usize) -> Serial {
    let mut layers: Vec<Box<dyn crate::Layer>> = Vec::new();
    for &h in hidden {
        layers.push(Box::new(Dense(h)));
        layers.push(Box::new(Relu));
    }
    layers.push(Box::new(Dense(classes)));
    Serial(layers)
}

/// stax's MNIST classifier (`examples/mnist_classifier.py`): `Dense(1024) Relu Dense(1024) Relu
/// Dense(classes) LogSoftmax` on `[n, features]` inputs (`(-1, 28 * 28)` there, 10 classes).
/// It outputs log-probabilities: train it with [`crate::NegLogLikelihood`], the example's
/// `-mean(sum(preds * targets))`.
pub fn mnist_classifier(classes: usize) -> Serial {
    serial![
        Dense(1024),
        Relu,
        Dense(1024),
        Relu,
        Dense(classes),
        LogSoftmax
    ]
}
