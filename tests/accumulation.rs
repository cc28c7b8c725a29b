//! Gradient accumulation: four micro-batches give the update of their concatenation (losses,
//! parameters and both Adam moments, to f32 summation order), on the CPU and on the GPU, and
//! every accumulated step's peak equals its plan to the byte, below the big batch's.

mod common;

use std::sync::Arc;

use common::{Rng, assert_rel_close, cpu, cuda_or_skip, host_values, seed_model, with_precision};
use stax::train::{Feed, MemoryPlan, Trainer};
use stax::{Adam, Backend, Category, Precision, Shape, Tensor};

const MICRO: usize = 4;

/// `n` random images `[n, 10, 10, 3]` and one-hot labels of two classes, as host vectors.
fn data(n: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let mut rng = Rng::new(seed);
    let images = rng.vec(n * 300, 0.0, 1.0);
    let labels = (0..n)
        .flat_map(|i| if i % 3 == 0 { [1.0, 0.0] } else { [0.0, 1.0] })
        .collect();
    (images, labels)
}

/// Rows `rows` of the host batch, placed on `be`.
fn place(
    be: &Arc<dyn Backend>,
    (images, labels): &(Vec<f32>, Vec<f32>),
    rows: std::ops::Range<usize>,
) -> (Tensor, Tensor) {
    let n = rows.len();
    let x = &images[rows.start * 300..rows.end * 300];
    let y = &labels[rows.start * 2..rows.end * 2];
    (
        Tensor::from_slice(be, x, [n, 10, 10, 3], Category::Input).unwrap(),
        Tensor::from_slice(be, y, [n, 2], Category::Input).unwrap(),
    )
}

/// Two updates of batch `4 * micro` whole and as four micro-batches on `be`: equal losses,
/// parameters and moments; each accumulated step's peak equals its plan, below the whole's.
fn compare(be: &Arc<dyn Backend>, micro: usize) {
    let host = data(MICRO * micro, 17);
    let whole_input = Shape::new([MICRO * micro, 10, 10, 3]);
    let micro_input = Shape::new([micro, 10, 10, 3]);
    let adam = Adam::new(1e-3).collecting();
    let values = |t: &Trainer<stax::Serial>| {
        let p = host_values(t.params().leaves());
        (p, host_values(t.state().tree.leaves()))
    };
    // the whole batch first, then gone: the backend counts every live tensor in a peak
    let (lw, (pw, mw)) = {
        let mut whole = Trainer::new(seed_model(), whole_input.clone(), adam, be, 5).unwrap();
        let (x, y) = place(be, &host, 0..MICRO * micro);
        let losses: Vec<f32> = (0..2).map(|_| whole.step(&x, &y).unwrap().loss).collect();
        (losses, values(&whole))
    };
    let mut parts = Trainer::new(seed_model(), micro_input.clone(), adam, be, 5).unwrap();
    let micro_batches: Vec<(Tensor, Tensor)> = (0..MICRO)
        .map(|i| place(be, &host, i * micro..(i + 1) * micro))
        .collect();
    let refs: Vec<(&Tensor, &Tensor)> = micro_batches.iter().map(|(x, y)| (x, y)).collect();
    let feed = Feed::Accumulated(MICRO);
    let plan = MemoryPlan::with_feed(&seed_model(), &micro_input, &adam, be, feed).unwrap();
    let whole_plan = MemoryPlan::new(&seed_model(), &whole_input, &adam, be).unwrap();
    let (p, w) = (plan.peak.bytes, whole_plan.peak.bytes);
    assert!(p < w, "accumulated {p} vs whole {w}");
    let mut lp = Vec::new();
    for _ in 0..2 {
        let r = parts.step_accumulated(&refs).unwrap();
        assert_eq!(r.memory.peak, plan.peak.bytes, "step {} peak", r.step);
        lp.push(r.loss);
    }
    assert_eq!(parts.feed(), Feed::Accumulated(MICRO));
    assert_eq!(parts.plan(micro).unwrap().peak.bytes, plan.peak.bytes);
    assert_rel_close(&lp, &lw, 1e-5, "losses");
    let (pp, mp) = values(&parts);
    assert_rel_close(&pp, &pw, 1e-5, "parameters");
    assert_rel_close(&mp, &mw, 1e-4, "moments");
}

#[test]
fn four_micro_batches_update_as_their_concatenation_on_the_cpu() {
    compare(&cpu(), 5);
}

#[test]
fn four_micro_batches_update_as_their_concatenation_on_the_gpu() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    compare(&gpu, 25);
}

#[test]
fn no_micro_batches_is_an_error() {
    let be = cpu();
    let mut t = Trainer::new(
        seed_model(),
        Shape::new([2, 10, 10, 3]),
        Adam::new(1e-3),
        &be,
        1,
    )
    .unwrap();
    assert!(t.step_accumulated(&[]).is_err());
    assert_eq!(t.steps(), 0);
}
