//! Models and batches shared by the memory tests (`memory_plan.rs`, `memory_gpu.rs`), included
//! with `#[path]` so that Cargo does not build this file as a test of its own.
#![allow(dead_code)]

use std::sync::Arc;

use stax::alloc::Category;
use stax::layers::Padding;
use stax::{Backend, Conv, Dense, Flatten, Relu, Serial, Shape, Tensor, serial};

/// The seed's model.
pub fn seed_model() -> Serial {
    serial![
        Conv::same(64, (3, 3)),
        Relu,
        Conv::same(64, (3, 3)),
        Relu,
        Flatten,
        Dense(128),
        Relu,
        Dense(2)
    ]
}

/// Strided SAME, an even VALID kernel.
pub fn strided_model() -> Serial {
    serial![
        Conv::new(8, (3, 3), (2, 2), Padding::Same),
        Relu,
        Conv::new(16, (2, 2), (1, 1), Padding::Valid),
        Relu,
        Flatten,
        Dense(10),
        Relu,
        Dense(3)
    ]
}

/// Deeper: a pointwise conv (no workspace), mixed strides, three convs.
pub fn deep_model() -> Serial {
    serial![
        Conv::new(4, (1, 1), (1, 1), Padding::Valid),
        Relu,
        Conv::new(6, (5, 5), (2, 1), Padding::Same),
        Relu,
        Conv::new(6, (3, 3), (1, 1), Padding::Valid),
        Relu,
        Flatten,
        Dense(16),
        Relu,
        Dense(3)
    ]
}

/// A placed batch of shape `input`: deterministic images, one-hot labels of `classes`.
pub fn batch(be: &Arc<dyn Backend>, input: &Shape, classes: usize) -> (Tensor, Tensor) {
    let n = input.dims()[0];
    let images: Vec<f32> = (0..input.numel())
        .map(|i| ((i * 7919 % 997) as f32 / 997.0) - 0.5)
        .collect();
    let mut labels = vec![0f32; n * classes];
    for i in 0..n {
        labels[i * classes + i % classes] = 1.0;
    }
    let x = Tensor::from_slice(be, &images, input.clone(), Category::Input).unwrap();
    let y = Tensor::from_slice(be, &labels, [n, classes], Category::Input).unwrap();
    (x, y)
}
