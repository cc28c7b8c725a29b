//! f16 training with dynamic loss scaling (jmp's `DynamicLossScale`) and Adam with a bf16 first
//! moment (optax's `mu_dtype`), on the CPU: an f16 MLP trains close to the f32 run with every
//! step's peak equal to its plan; a forced overflow is skipped, reported and not trained on (the
//! parameters and both moments bit for bit as before), the scale halved; after `period` finite
//! steps it doubles; a bf16 `mu` is an f32 Adam whose `mu` is rounded after every step.

mod common;

use std::sync::Arc;

use common::{cpu, host_values};
use stax::layers::{LayerError, Mixed, Policy};
use stax::models::mlp;
use stax::tensor::AdamHyper;
use stax::tensor::dtype::bf16;
use stax::tensor::ops;
use stax::train::data::{Dataset, Loader, fashion_mnist_2class};
use stax::train::{DynamicLossScale, StepReport, TrainError, Trainer};
use stax::{Adam, Backend, Category, DType, Layer, Serial, Shape, Tensor};

const BATCH: usize = 50;

fn input() -> Shape {
    Shape::new([BATCH, 784])
}

fn f16_mlp() -> Mixed<Serial> {
    Mixed::new(mlp(&[64], 2), Policy::F16)
}

/// Every parameter and both moments, as bits.
fn state_bits<L: Layer>(t: &Trainer<L>) -> Vec<u32> {
    let mut all: Vec<&Tensor> = t.params().leaves();
    all.extend(t.state().field("mu"));
    all.extend(t.state().field("nu"));
    all.iter()
        .flat_map(|x| {
            let mut w =
                Tensor::empty(x.backend(), x.shape().clone(), DType::F32, Category::Other).unwrap();
            ops::cast(x, &mut w).unwrap();
            w.to_vec().unwrap()
        })
        .map(f32::to_bits)
        .collect()
}

/// `steps` steps of `trainer` on the embedded two-class data (batch 50, loader seed 5),
/// asserting every step's peak equals the trainer's plan; returns the reports.
fn run<L: Layer>(trainer: &mut Trainer<L>, data: &Dataset, steps: usize) -> Vec<StepReport> {
    let plan = trainer.plan(BATCH).unwrap();
    let loader = Loader::new(data.len(), BATCH, 5).unwrap();
    let mut reports = Vec::new();
    for epoch in 0.. {
        for indices in loader.batches(epoch) {
            let (x, y) = trainer.place_batch(data, &indices).unwrap();
            let r = trainer.step(&x, &y).unwrap();
            assert_eq!(
                r.memory.peak, plan.peak.bytes,
                "step {} peak = plan",
                r.step
            );
            reports.push(r);
            if reports.len() == steps {
                return reports;
            }
        }
    }
    reports
}

fn trainer<L: Layer>(model: L, adam: Adam, be: &Arc<dyn Backend>) -> Trainer<L> {
    Trainer::new(model, input(), adam, be, 5).unwrap()
}

#[test]
fn f16_with_dynamic_loss_scaling_trains_close_to_f32_with_exact_memory() {
    // one backend each: a trainer's peak counts every live buffer of its allocator
    let (train, test) = fashion_mnist_2class().unwrap();
    let mut f32_run = trainer(mlp(&[64], 2), Adam::new(1e-3), &cpu());
    let f32_losses: Vec<f32> = run(&mut f32_run, &train, 40)
        .iter()
        .map(|r| r.loss)
        .collect();
    let mut f16_run = trainer(f16_mlp(), Adam::new(1e-3), &cpu());
    assert_eq!(f16_run.loss_scale(), Some(DynamicLossScale::default()));
    let reports = run(&mut f16_run, &train, 40);
    for r in &reports {
        let s = r.loss_scale.expect("an f16 step reports its loss scale");
        assert!(!s.skipped, "step {}: {s:?}", r.step);
        assert_eq!((s.scale, s.next_scale), (32768.0, 32768.0));
    }
    let losses: Vec<f32> = reports.iter().map(|r| r.loss).collect();
    let gap = losses
        .iter()
        .zip(&f32_losses)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    // measured: the largest gap over 40 steps is 0.00035 (test accuracy 0.974 in f16 and f32)
    let acc = f16_run.evaluate(&test, BATCH).unwrap().accuracy;
    let f32_acc = f32_run.evaluate(&test, BATCH).unwrap().accuracy;
    assert!(
        gap < 0.02,
        "f16 losses differ from f32 by up to {gap}; accuracy {acc} (f32 {f32_acc})"
    );
    assert!(losses[39] < 0.5 * losses[0], "{losses:?}");
    assert!(acc >= 0.95, "f16 test accuracy {acc}");
    assert_eq!(f16_run.state().count, 40);
}

#[test]
fn a_forced_overflow_is_skipped_reported_and_not_trained_on() {
    let be = cpu();
    let (train, _) = fashion_mnist_2class().unwrap();
    let mut t = trainer(f16_mlp(), Adam::new(1e-3), &be);
    run(&mut t, &train, 2);
    // dlogits (at most 1/50 per element) times 2^24 overflow f16 (65504) in the backward pass
    let huge = DynamicLossScale::new(2f32.powi(24));
    t.set_loss_scale(Some(huge)).unwrap();
    let (before, count) = (state_bits(&t), t.state().count);
    let loader = Loader::new(train.len(), BATCH, 9).unwrap();
    let mut scales = Vec::new();
    for indices in loader.batches(0) {
        let (x, y) = t.place_batch(&train, &indices).unwrap();
        let r = t.step(&x, &y).unwrap();
        let s = r.loss_scale.unwrap();
        scales.push((s.scale, s.skipped));
        if !s.skipped {
            assert_eq!(t.state().count, count + 1);
            assert_ne!(state_bits(&t), before);
            break;
        }
        assert!(r.loss.is_finite());
        assert_eq!(s.next_scale, s.scale / 2.0, "{s:?}");
        assert_eq!(t.loss_scale().unwrap().counter, 0);
        assert_eq!(
            state_bits(&t),
            before,
            "skipped step {} changed the state",
            r.step
        );
        assert_eq!(t.state().count, count);
    }
    // measured: 2^24 down to 2^19 overflow (six skipped steps), 2^18 trains
    assert!(
        scales.len() >= 2 && scales[0] == (2f32.powi(24), true),
        "{scales:?}"
    );
    assert!(!scales[scales.len() - 1].1, "{scales:?}");
    // the scale never falls below min_scale
    let floor = DynamicLossScale {
        min_scale: 2f32.powi(23),
        ..huge
    };
    assert_eq!(floor.adjust(false).scale, 2f32.powi(23));
    assert_eq!(floor.adjust(false).adjust(false).scale, 2f32.powi(23));
}

#[test]
fn the_scale_grows_after_period_finite_steps() {
    let be = cpu();
    let (train, _) = fashion_mnist_2class().unwrap();
    let mut t = trainer(f16_mlp(), Adam::new(1e-3), &be);
    let scale = DynamicLossScale {
        period: 3,
        ..DynamicLossScale::new(1024.0)
    };
    t.set_loss_scale(Some(scale)).unwrap();
    let reports = run(&mut t, &train, 7);
    let seen: Vec<(f32, f32)> = reports
        .iter()
        .map(|r| r.loss_scale.map(|s| (s.scale, s.next_scale)).unwrap())
        .collect();
    assert_eq!(
        seen,
        [
            (1024.0, 1024.0),
            (1024.0, 1024.0),
            (1024.0, 2048.0),
            (2048.0, 2048.0),
            (2048.0, 2048.0),
            (2048.0, 4096.0),
            (4096.0, 4096.0)
        ]
    );
    assert_eq!(t.loss_scale().unwrap().counter, 1);
    // jmp keeps the scale when growing it would not be finite
    let top = DynamicLossScale {
        counter: 2,
        ..DynamicLossScale::new(f32::MAX)
    };
    assert_eq!(top.adjust(true).scale, f32::MAX);
    assert!(matches!(
        t.set_loss_scale(Some(DynamicLossScale::new(0.0))),
        Err(TrainError::LossScale { name: "scale", .. })
    ));
}

#[test]
fn f16_policies_need_loss_scaling_and_f32_parameters() {
    let f16_params = Policy {
        param: DType::F16,
        ..Policy::F16
    };
    let e = f16_params.check(false).unwrap_err();
    assert!(e.to_string().contains("without loss scaling"), "{e}");
    let e = f16_params.check(true).unwrap_err();
    assert!(e.to_string().contains("f32 master weights"), "{e}");
    let e = Policy::F16.check(false).unwrap_err();
    assert!(e.to_string().contains("DynamicLossScale"), "{e}");
    assert!(Policy::F16.check(true).is_ok());
    // turning the loss scale off makes the next f16 step a typed error that changes nothing
    let be = cpu();
    let mut t = trainer(f16_mlp(), Adam::new(1e-3), &be);
    t.set_loss_scale(None).unwrap();
    let before = state_bits(&t);
    let (x, y) = common::batch(&be, &input(), 2);
    match t.step(&x, &y) {
        Err(TrainError::Layer(e @ LayerError::Config { .. })) => {
            assert!(e.to_string().contains("loss scaling"), "{e}")
        }
        other => panic!("expected the policy's refusal, got {other:?}"),
    }
    assert_eq!(state_bits(&t), before);
}

/// optax's `adam(mu_dtype=bfloat16)`: each step computes in f32 from the widened bf16 `mu`, then
/// rounds the new `mu` to bf16. Three steps of the op equal that computation bit for bit.
#[test]
fn adam_with_a_bf16_mu_is_f32_adam_with_mu_rounded_each_step() {
    let be = cpu();
    let n = 257;
    let mut rng = common::Rng::new(11);
    let p0 = rng.vec(n, -1.0, 1.0);
    let mut p = Tensor::from_slice(&be, &p0, [n], Category::Parameter).unwrap();
    let mut m = Tensor::empty(&be, [n], DType::BF16, Category::OptimizerState).unwrap();
    ops::fill(&mut m, 0.0).unwrap();
    let mut v = Tensor::zeros(&be, [n], Category::OptimizerState).unwrap();
    let (mut rp, mut rm, mut rv) = (p0.clone(), vec![0f32; n], vec![0f32; n]);
    let adam = Adam::new(1e-2);
    for t in 1..=3u32 {
        let gv = rng.vec(n, -1.0, 1.0);
        let g = Tensor::from_slice(&be, &gv, [n], Category::Gradient).unwrap();
        let h: AdamHyper = adam.hyper(t);
        ops::adam(&mut p, &g, &mut m, &mut v, &h).unwrap();
        for i in 0..n {
            let mi = (1.0 - h.b1) * gv[i] + h.b1 * rm[i];
            rv[i] = (1.0 - h.b2) * (gv[i] * gv[i]) + h.b2 * rv[i];
            let upd = (mi / h.bias_correction1)
                / ((rv[i] / h.bias_correction2 + h.eps_root).sqrt() + h.eps);
            rp[i] += -h.lr * upd;
            rm[i] = bf16::from_f32(mi).to_f32();
        }
    }
    let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    assert_eq!(bits(p.to_vec().unwrap()), bits(rp));
    assert_eq!(bits(v.to_vec().unwrap()), bits(rv));
    let mu: Vec<f32> = m
        .to_host::<bf16>()
        .unwrap()
        .iter()
        .map(|b| b.to_f32())
        .collect();
    assert!(rm.iter().any(|&x| x != 0.0));
    assert_eq!(bits(mu), bits(rm));
}

#[test]
fn adam_with_a_bf16_mu_trains_with_exact_memory() {
    let (train, test) = fashion_mnist_2class().unwrap();
    let plain = Adam::new(1e-3).collecting();
    let mut f32_mu = trainer(mlp(&[64], 2), plain, &cpu());
    let base: Vec<f32> = run(&mut f32_mu, &train, 40)
        .iter()
        .map(|r| r.loss)
        .collect();
    let bf16_mu = Adam::new(1e-3).with_mu_dtype(DType::BF16);
    let mut t = trainer(mlp(&[64], 2), bf16_mu, &cpu());
    assert!(
        t.state()
            .field("mu")
            .iter()
            .all(|m| m.dtype() == DType::BF16)
    );
    assert!(
        t.state()
            .field("nu")
            .iter()
            .all(|m| m.dtype() == DType::F32)
    );
    // the first moment is half its f32 size
    let mu_bytes = |t: &Trainer<Serial>| {
        t.state()
            .field("mu")
            .iter()
            .map(|m| m.bytes())
            .sum::<usize>()
    };
    assert_eq!(2 * mu_bytes(&t), mu_bytes(&f32_mu));
    let losses: Vec<f32> = run(&mut t, &train, 40).iter().map(|r| r.loss).collect();
    let gap = losses
        .iter()
        .zip(&base)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    // measured: the largest gap over 40 steps is 0.000023
    assert!(
        gap < 0.02,
        "bf16 mu losses differ from f32 mu by up to {gap}"
    );
    let acc = t.evaluate(&test, BATCH).unwrap().accuracy;
    assert!(acc >= 0.95, "test accuracy {acc}");
    let mu = t.state().field("mu");
    assert!(mu.iter().any(|m| {
        m.to_host::<bf16>()
            .unwrap()
            .iter()
            .any(|x| x.to_f32() != 0.0)
    }));
    assert!(host_values(t.state().field("nu")).iter().any(|&x| x != 0.0));
}

/// The plan's bytes by dtype sum to its peak and its state bytes, every step's measured peak
/// equals the plan's and its measured state by dtype the planned one, in f32, bf16 and f16
/// (an MLP, and the seed CNN at a small size).
#[test]
fn bytes_by_dtype_sum_to_the_plan_and_the_peaks_are_exact_in_bf16_and_f16() {
    let (train, _) = fashion_mnist_2class().unwrap();
    for policy in [Policy::default(), Policy::BF16, Policy::F16] {
        let cases = [
            (Mixed::new(mlp(&[64], 2), policy), input()),
            (
                Mixed::new(stax::models::seed_cnn(2), policy),
                Shape::new([10, 28, 28, 3]),
            ),
        ];
        for (model, shape) in cases {
            let what = format!("{} under {policy}", model.describe());
            let n = shape.dims()[0];
            let mut t = Trainer::new(model, shape, Adam::new(1e-3), &cpu(), 5).unwrap();
            let plan = t.plan(n).unwrap();
            let (at_peak, state) = (plan.by_dtype(), plan.state_by_dtype());
            assert_eq!(plan.peak_by_dtype, at_peak, "{what}");
            assert_eq!(at_peak.total(), plan.peak.bytes, "{what}: {at_peak:?}");
            assert_eq!(state.total(), plan.state_bytes(), "{what}: {state:?}");
            // f32 master weights and moments whatever the compute dtype
            assert_eq!(state.f32, plan.state_bytes(), "{what}");
            let (low, other) = match policy.compute {
                DType::BF16 => (at_peak.bf16, at_peak.f16),
                DType::F16 => (at_peak.f16, at_peak.bf16),
                _ => (0, at_peak.bf16 + at_peak.f16),
            };
            assert_eq!(other, 0, "{what}: {at_peak:?}");
            assert_eq!(low > 0, policy.compute != DType::F32, "{what}: {at_peak:?}");
            let loader = Loader::new(train.len(), n, 5).unwrap();
            for indices in loader.batches(0).take(2) {
                let (x, y) = t.place_batch(&train, &indices).unwrap();
                let r = t.step(&x, &y).unwrap();
                assert_eq!(r.memory.peak, plan.peak.bytes, "{what}: step {}", r.step);
                assert_eq!(r.state_by_dtype, state, "{what}");
                assert_eq!(r.loss_scale.is_some(), policy.compute == DType::F16);
            }
        }
    }
}

/// A checkpoint's `stax.json` records the policy the model trained under.
#[test]
fn checkpoints_record_the_policy_used() {
    let dir = std::env::temp_dir().join(format!("stax-loss-scale-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (policy, compute) in [
        (Policy::default(), "f32"),
        (Policy::BF16, "bf16"),
        (Policy::F16, "f16"),
    ] {
        let t = trainer(Mixed::new(mlp(&[8], 2), policy), Adam::new(1e-3), &cpu());
        let path = dir.join(format!("{compute}.npz"));
        t.save(&path, None).unwrap();
        let ckpt = stax::train::Checkpoint::open(&path).unwrap();
        let meta = ckpt.meta().unwrap();
        let got = &meta.policy;
        assert_eq!(
            (
                got.param.as_str(),
                got.compute.as_str(),
                got.output.as_str()
            ),
            ("f32", compute, "f32")
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An f16 trainer's loss scale survives a checkpoint: saved part-way through a period with a
/// scale of its own, the resumed trainer holds the same state and its next two steps are the
/// original's to the bit (loss, scale, parameters and moments). Resumed under bf16 (no loss
/// scaling) the scale is dropped; a saved scale that cannot work (period 0) is refused.
#[test]
fn the_loss_scale_is_saved_and_resumed() {
    let (train, _) = fashion_mnist_2class().unwrap();
    let mut a = trainer(f16_mlp(), Adam::new(1e-3), &cpu());
    let state = DynamicLossScale {
        counter: 7,
        period: 10,
        ..DynamicLossScale::new(1024.0)
    };
    a.set_loss_scale(Some(state)).unwrap();
    run(&mut a, &train, 2);
    let dir = common::checkpoint::scratch("loss-scale");
    let path = dir.join("f16.npz");
    a.save(&path, None).unwrap();
    let load = |model| Trainer::load(model, input(), Adam::new(1e-3), &cpu(), &path);
    let (mut b, _) = load(f16_mlp()).unwrap();
    let saved = a.loss_scale().unwrap();
    assert_eq!(saved.counter, 9);
    assert_eq!(b.loss_scale(), Some(saved));
    let (ra, rb) = (run(&mut a, &train, 2), run(&mut b, &train, 2));
    for (x, y) in ra.iter().zip(&rb) {
        assert_eq!(x.loss.to_bits(), y.loss.to_bits(), "step {}", x.step);
        assert_eq!(x.loss_scale, y.loss_scale, "step {}", x.step);
    }
    assert_eq!(
        b.loss_scale().unwrap().scale,
        2048.0,
        "grew at the period's end"
    );
    assert_eq!(state_bits(&a), state_bits(&b));
    let (bf16, _) = load(Mixed::new(mlp(&[64], 2), Policy::BF16)).unwrap();
    assert_eq!(bf16.loss_scale(), None);
    let bad = dir.join("period0.npz");
    common::checkpoint::rewrite(&path, &bad, |_, mut bytes| {
        if let Some(at) = bytes.windows(11).position(|w| w == b"\"period\":10") {
            bytes[at + 9..at + 11].copy_from_slice(b"0 "); // the text keeps its length
        }
        Some(bytes)
    });
    match Trainer::load(f16_mlp(), input(), Adam::new(1e-3), &cpu(), &bad) {
        Err(TrainError::LossScale { .. }) => {}
        other => panic!(
            "a period of 0 should be refused, got {:?}",
            other.map(|_| ())
        ),
    }
}

#[test]
fn an_f16_layer_inside_a_model_turns_the_loss_scale_on() {
    use stax::{Dense, Relu, serial};
    let (train, _) = fashion_mnist_2class().unwrap();
    let be = cpu();
    // f16 only for the hidden layer: its output cast back to f32 for the head
    let hidden = Mixed::new(serial![Dense(64), Relu], Policy::F16);
    let mut t = trainer(serial![hidden, Dense(2)], Adam::new(1e-3), &be);
    assert_eq!(t.loss_scale(), Some(DynamicLossScale::default()));
    for r in run(&mut t, &train, 3) {
        let scaled = r.loss_scale.expect("a loss-scaled step");
        assert!(!scaled.skipped && r.loss.is_finite(), "{r:?}");
    }
}

#[test]
fn policies_nest_and_a_shape_dependent_layer_shows_its_own() {
    use stax::{Dense, Relu, ShapeDependent, serial};
    let (train, _) = fashion_mnist_2class().unwrap();
    let be = cpu();
    // f16 and bf16 inside bf16: each inner output is handed on in bf16, the outer compute dtype
    for inner in [Policy::F16, Policy::BF16] {
        let model = Mixed::new(
            serial![
                Dense(32),
                Relu,
                Mixed::new(serial![Dense(16), Relu], inner),
                Dense(2)
            ],
            Policy::BF16,
        );
        let mut t = trainer(model, Adam::new(1e-3).collecting(), &be);
        let scaled = inner == Policy::F16;
        assert_eq!(t.loss_scale().is_some(), scaled, "{inner}");
        for r in run(&mut t, &train, 2) {
            assert!(
                r.loss.is_finite() && r.loss_scale.is_some() == scaled,
                "{inner}: {r:?}"
            );
        }
    }
    // the layer a ShapeDependent makes for the input computes in f16: the loss scale is on
    let made = ShapeDependent::new(|_| {
        Box::new(Mixed::new(serial![Dense(16), Relu], Policy::F16)) as Box<dyn Layer>
    });
    let t = trainer(serial![made, Dense(2)], Adam::new(1e-3), &be);
    assert_eq!(t.loss_scale(), Some(DynamicLossScale::default()));
}
