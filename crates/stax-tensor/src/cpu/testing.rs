//! Helpers shared by the CPU backend's unit tests.

use super::CpuBackend;
use crate::{Backend, BackendOptions, Category, Shape, Tensor};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::sync::Arc;

/// A CPU backend with default options.
pub(crate) fn backend() -> Arc<dyn Backend> {
    CpuBackend::new(&BackendOptions::default()).unwrap()
}

/// A CPU backend whose im2col buffers hold only `bytes` (so convs run in many chunks).
pub(crate) fn backend_with_workspace(bytes: usize) -> Arc<dyn Backend> {
    CpuBackend::new(&BackendOptions {
        workspace_limit: Some(bytes),
        ..Default::default()
    })
    .unwrap()
}

/// A seeded RNG.
pub(crate) fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// `n` uniform values in `[-1, 1)`.
pub(crate) fn random_vec(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// An f32 tensor holding `data`.
pub(crate) fn tensor(be: &Arc<dyn Backend>, data: &[f32], shape: impl Into<Shape>) -> Tensor {
    Tensor::from_slice(be, data, shape, Category::Other).unwrap()
}

/// Asserts `|got - want| <= atol + rtol |want|` elementwise; on failure names the worst index.
pub(crate) fn assert_close<W: Copy + Into<f64>>(
    got: &[f32],
    want: &[W],
    rtol: f64,
    atol: f64,
    what: &str,
) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let mut worst: Option<(usize, f64)> = None;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let (g, w) = (f64::from(g), w.into());
        let excess = (g - w).abs() - (atol + rtol * w.abs());
        if (excess > 0.0 || excess.is_nan())
            && worst.is_none_or(|(_, e)| excess > e || excess.is_nan())
        {
            worst = Some((i, excess));
        }
    }
    if let Some((i, _)) = worst {
        panic!(
            "{what}: element {i} is {} but should be {} (rtol {rtol}, atol {atol})",
            got[i],
            want[i].into()
        );
    }
}

/// Adam's hyper-parameters at step `t` with learning rate `lr` (b1 0.9, b2 0.999, eps 1e-8, no
/// eps_root, no gradient scale), bias corrections as optax's `scale_by_adam`.
pub(crate) fn adam_hyper(lr: f32, t: i32) -> crate::AdamHyper {
    let (b1, b2) = (0.9f32, 0.999f32);
    crate::AdamHyper {
        lr,
        b1,
        b2,
        eps: 1e-8,
        eps_root: 0.0,
        bias_correction1: 1.0 - b1.powi(t),
        bias_correction2: 1.0 - b2.powi(t),
        grad_scale: 1.0,
    }
}
