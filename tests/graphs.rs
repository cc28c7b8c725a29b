//! Models that are not a plain stack train through `Trainer` with exact memory: a residual
//! network built from `FanOut`, `parallel`, `Identity` and `FanInSum`, and an MLP on
//! `[n, features]` inputs. On the CPU, and on the GPU where there is one (GPU = CPU on the same
//! batches, then the full run). Every step's peak equals the plan's, to the byte.

mod common;

use common::{
    cpu, cuda_or_skip, host_values, private_cuda_with, train, two_steps_match_cpu, with_precision,
};
use stax::models::mlp;
use stax::tensor::Backend;
use stax::{
    Conv, Dense, FanInSum, FanOut, Flatten, Identity, Precision, Relu, Serial, Shape, parallel,
    serial,
};
use std::sync::Arc;

/// `Conv Relu FanOut(2) parallel(serial(Conv, Relu, Conv), Identity) FanInSum Relu` and a
/// dense head.
fn residual() -> Serial {
    residual_with(FanInSum)
}

/// [`residual`] with its `FanInSum` in a `serial` of its own: the ReLU after it cannot fuse.
fn residual_unfused() -> Serial {
    residual_with(serial![FanInSum])
}

/// [`residual`] with `fan_in` in the `FanInSum`'s place.
fn residual_with(fan_in: impl stax::Layer + 'static) -> Serial {
    serial![
        Conv::same(8, (3, 3)),
        Relu,
        FanOut(2),
        parallel![
            serial![Conv::same(8, (3, 3)), Relu, Conv::same(8, (3, 3))],
            Identity
        ],
        fan_in,
        Relu,
        Flatten,
        Dense(2)
    ]
}

/// The ReLU after a `FanInSum` runs in the sum's last add (`ops::binary_relu`): three
/// training steps give the losses, parameters and Adam moments of the unfused pair bit for
/// bit, each step's peak the plan's and the same as the unfused pair's, on the CPU and on the
/// GPU (each model on a backend of its own, so that each peak is its own, with the same cuDNN
/// algorithms).
#[test]
fn the_relu_fused_into_fan_in_sum_trains_as_the_unfused_pair() {
    use stax::train::Trainer;
    use stax::train::data::{Loader, fashion_mnist_2class};
    let (train_set, _) = fashion_mnist_2class().unwrap();
    let input = Shape::new([20, 28, 28, 1]);
    // private backends with cuDNN's deterministic choices: two timed searches may pick
    // different algorithms for the same conv, which round differently
    let gpu = || {
        let be = private_cuda_with(Precision::Highest)?;
        be.set_deterministic(true);
        Some(be as Arc<dyn Backend>)
    };
    let pairs = [Some((cpu(), cpu())), gpu().zip(gpu())];
    for (bf, ba) in pairs.into_iter().flatten() {
        let adam = stax::Adam::new(1e-3);
        let mut fused = Trainer::new(residual(), input.clone(), adam, &bf, 5).unwrap();
        let mut apart = Trainer::new(residual_unfused(), input.clone(), adam, &ba, 5).unwrap();
        let plan = fused.plan(20).unwrap().peak.bytes;
        assert_eq!(plan, apart.plan(20).unwrap().peak.bytes, "{}", bf.device());
        let loader = Loader::new(train_set.len(), 20, 5).unwrap();
        for indices in loader.batches(0).take(3) {
            let (xf, yf) = fused.place_batch(&train_set, &indices).unwrap();
            let (xa, ya) = apart.place_batch(&train_set, &indices).unwrap();
            let (rf, ra) = (fused.step(&xf, &yf).unwrap(), apart.step(&xa, &ya).unwrap());
            assert_eq!(rf.loss.to_bits(), ra.loss.to_bits(), "{} loss", bf.device());
            assert_eq!(
                (rf.memory.peak, ra.memory.peak),
                (plan, plan),
                "{}",
                bf.device()
            );
        }
        // the fused pair runs as one span: no ReLU layer of its own after the sum
        let relus = |t: &mut Trainer<Serial>| {
            let batch = loader.batches(1).next().unwrap();
            let (x, y) = t.place_batch(&train_set, &batch).unwrap();
            let p = t.profile_step(&x, &y).unwrap().profile;
            p.layers.iter().filter(|l| l.kind == "relu").count()
        };
        assert_eq!(relus(&mut apart) - relus(&mut fused), 2, "{}", bf.device());
        let bits = |v: Vec<f32>| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        let values = |t: &Trainer<Serial>| bits(host_values(t.params().leaves()));
        assert_eq!(values(&fused), values(&apart), "{} parameters", bf.device());
        for field in ["mu", "nu"] {
            let (f, a) = (fused.state().field(field), apart.state().field(field));
            assert_eq!(bits(host_values(f)), bits(host_values(a)), "{field}");
        }
    }
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
