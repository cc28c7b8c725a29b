//! The losses with integer labels through `Trainer`: stax's MNIST classifier MLP (ending in
//! `LogSoftmax`) trains with the negative log-likelihood on the embedded two-class data with
//! every step's peak equal to the plan; softmax cross-entropy with integer labels trains
//! exactly as with one-hot labels (a model with `Dropout`, batches placed and prefetched); on
//! the GPU as on the CPU.

mod common;

use std::sync::Arc;

use common::{assert_rel_close, cpu, cuda_or_skip, host_values, with_precision};
use stax::layers::Loss;
use stax::models::mnist_classifier;
use stax::train::data::{Loader, fashion_mnist_2class};
use stax::train::{Labels, Trainer};
use stax::{
    Adam, Backend, Category, DType, Dense, Dropout, NegLogLikelihood, Precision, Relu, Serial,
    Shape, SoftmaxCrossEntropy, SoftmaxCrossEntropyWithIntegerLabels, serial,
};

/// Trains `model` with `loss` for `epochs` over the embedded data (batch 50), checking every
/// step's peak and bytes per category against the plan; returns the test accuracy and losses.
fn train<F: Loss>(model: Serial, loss: F, be: &Arc<dyn Backend>, epochs: u64) -> (f32, Vec<f32>) {
    let (train, test) = fashion_mnist_2class().unwrap();
    let input = Shape::new([50, 784]);
    let mut trainer = Trainer::with_loss(model, input, Adam::new(1e-3), loss, be, 3).unwrap();
    let plan = trainer.plan(50).unwrap();
    assert!(plan.exact);
    let loader = Loader::new(train.len(), 50, 3).unwrap();
    let mut losses = Vec::new();
    for epoch in 0..epochs {
        for indices in loader.batches(epoch) {
            let (x, y) = trainer.place_batch(&train, &indices).unwrap();
            let r = trainer.step(&x, &y).unwrap();
            assert_eq!(r.memory.peak, plan.peak.bytes, "step {} peak", r.step);
            for c in Category::ALL {
                let want = plan.peak.by_category[c.index()];
                assert_eq!(r.memory.at_peak(c), want, "step {}: {c}", r.step);
            }
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
fn mnist_classifier_trains_with_nll_and_exact_memory() {
    let be = cpu();
    let (accuracy, losses) = train(mnist_classifier(2), NegLogLikelihood, &be, 1);
    assert!(losses[losses.len() - 1] < losses[0] / 2.0, "{losses:?}");
    assert!(accuracy >= 0.95, "test accuracy {accuracy}");
}

/// The plan of the classifier's step names its labels: `[50]` u32 class indices, 200 bytes.
#[test]
fn the_plan_places_integer_labels() {
    let be = cpu();
    let input = Shape::new([50, 784]);
    let t = Trainer::with_loss(
        mnist_classifier(2),
        input,
        Adam::new(1e-3),
        NegLogLikelihood,
        &be,
        0,
    )
    .unwrap();
    let plan = t.plan(50).unwrap();
    assert_eq!(plan.labels, Shape::new([50]));
    let labels = plan
        .buffers
        .iter()
        .find(|b| b.name == "input/labels")
        .unwrap();
    assert_eq!((labels.dtype, labels.bytes), (Some(DType::U32), 200));
    let (train, _) = fashion_mnist_2class().unwrap();
    assert_eq!(t.layout(&train).unwrap().labels, Labels::Index);
    let (_, y) = t.place_batch(&train, &[0, 1, 2]).unwrap();
    let want: Vec<u32> = train.labels()[..3].to_vec();
    assert_eq!((y.dtype(), y.to_vec_u32().unwrap()), (DType::U32, want));
}

fn with_dropout() -> Serial {
    serial![Dense(16), Relu, Dropout::new(0.8), Dense(2)]
}

/// Five steps of the same model and seed with one-hot labels on `be_a` and with integer labels
/// on `be_b`: the same losses and parameters, to `tol` (the dropout masks too: both step keys
/// are `fold_in(seed, step)`). The integer-label run is prefetched; with `own_b` (nothing else
/// on `be_b`) its peak is the prefetched plan's.
fn one_hot_equals_integer(be_a: &Arc<dyn Backend>, be_b: &Arc<dyn Backend>, tol: f64, own_b: bool) {
    let (train, _) = fashion_mnist_2class().unwrap();
    let input = Shape::new([20, 784]);
    let opt = || Adam::new(1e-2);
    let mut a = Trainer::with_loss(
        with_dropout(),
        input.clone(),
        opt(),
        SoftmaxCrossEntropy,
        be_a,
        9,
    )
    .unwrap();
    let loss = SoftmaxCrossEntropyWithIntegerLabels;
    let mut b = Trainer::with_loss(with_dropout(), input, opt(), loss, be_b, 9).unwrap();
    let loader = Loader::new(train.len(), 20, 9).unwrap();
    let batches: Vec<Vec<usize>> = loader.batches(0).take(5).collect();
    let mut feed = b.prefetch(&train, batches.clone());
    let plan = b.plan(20).unwrap();
    for (k, indices) in batches.iter().enumerate() {
        let (x, y) = a.place_batch(&train, indices).unwrap();
        let ra = a.step(&x, &y).unwrap();
        let rb = b.step_prefetched(&mut feed).unwrap().unwrap();
        let close = f64::from((ra.loss - rb.loss).abs()) <= tol * f64::from(ra.loss.abs());
        assert!(close, "step {}: {} vs {}", k + 1, ra.loss, rb.loss);
        if own_b && k + 1 < batches.len() {
            assert_eq!(rb.memory.peak, plan.peak.bytes, "step {} peak", k + 1);
        }
    }
    let (pa, pb) = (
        host_values(a.params().leaves()),
        host_values(b.params().leaves()),
    );
    assert_rel_close(&pb, &pa, tol, "parameters after five steps");
}

#[test]
fn integer_labels_train_as_one_hot_labels() {
    one_hot_equals_integer(&cpu(), &cpu(), 1e-5, true);
}

#[test]
fn integer_labels_on_the_gpu() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    one_hot_equals_integer(&cpu(), &gpu, 1e-4, false);
    let (accuracy, _) = train(mnist_classifier(2), NegLogLikelihood, &gpu, 1);
    assert!(accuracy >= 0.95, "gpu test accuracy {accuracy}");
}
