//! Checkpoints on CUDA: exact resume with deterministic cuDNN algorithms (in process and in a
//! fresh process), JAX's fixture at full f32 precision, what loading allocates, and device
//! tensors into `ndarray`. Skipped with a notice without a GPU.
//!
//! Determinism: `CudaBackend::set_deterministic(true)` chooses, for every convolution pass,
//! the first algorithm in cuDNN's heuristic order that cuDNN marks `CUDNN_DETERMINISTIC` and
//! that fits the workspace limit, untimed (the same choice in every process); every other op
//! of the step is deterministic (our kernels use no atomics; cuBLAS on one stream with its
//! workspace). The tests print the algorithms chosen.

mod common;

use std::sync::Arc;

use common::checkpoint::{
    TINY_INPUT, TINY_LR, assert_example_resumes, assert_resume_is_exact, example_binary, fixture,
    fixture_batch, npz_f32, scratch, state_bits, tiny,
};
use common::{cuda_backend_or_skip, cuda_or_skip, small_model, with_precision};
use stax::tensor::cuda::{CudaBackend, DEFAULT_WORKSPACE_LIMIT};
use stax::train::Trainer;
use stax::train::plan::MemoryPlan;
use stax::{Adam, Backend, BackendOptions, Category, Precision, Shape, Tensor, TensorError};

/// A CUDA backend of its own (not the tests' shared one) choosing algorithms
/// deterministically, at `precision`.
fn deterministic(precision: Precision) -> Option<Arc<CudaBackend>> {
    let options = BackendOptions {
        workspace_limit: Some(DEFAULT_WORKSPACE_LIMIT), // not shared: a backend of its own
        ..with_precision(precision)
    };
    let cuda = cuda_backend_or_skip(&options)?;
    cuda.set_deterministic(true);
    Some(cuda)
}

/// Prints the algorithms chosen and checks that cuDNN marks each deterministic.
fn check_algorithms(cuda: &CudaBackend) {
    let plans = cuda.conv_plans();
    assert!(!plans.is_empty());
    for p in plans {
        println!(
            "{:?} {:?}: {} ({})",
            p.geometry, p.pass, p.algorithm, p.math
        );
        let chosen = p.candidates.iter().find(|c| c.algorithm == p.algorithm);
        let status = chosen.map_or("?", |c| c.status.as_str());
        assert!(
            !status.contains("non-deterministic"),
            "{}: {status}",
            p.algorithm
        );
        assert!(p.time_ms.is_nan(), "chosen without timing");
    }
}

#[test]
fn resume_on_cuda_is_bit_exact_with_deterministic_algorithms() {
    for precision in [Precision::Tf32, Precision::Highest] {
        let Some(cuda) = deterministic(precision) else {
            return;
        };
        let be: Arc<dyn Backend> = cuda.clone();
        assert_resume_is_exact(&be, &scratch(&format!("cuda-{precision:?}")), 6);
        check_algorithms(&cuda);
    }
}

#[test]
fn the_example_resumes_bit_exactly_on_cuda_in_a_fresh_process() {
    if cuda_or_skip(&BackendOptions::default()).is_none() {
        return;
    }
    let Some(bin) = example_binary() else { return };
    let common = [
        "--device",
        "cuda",
        "--deterministic",
        "--img",
        "28",
        "--batch",
        "50",
    ];
    assert_example_resumes(&bin, &scratch("cuda-example"), &common, 8);
}

#[test]
fn a_jax_checkpoint_gives_jax_loss_on_cuda_at_full_precision() {
    let Some(cuda) = deterministic(Precision::Highest) else {
        return;
    };
    let be: Arc<dyn Backend> = cuda;
    let input = Shape::new(TINY_INPUT);
    let (t, _) = Trainer::load(tiny(), input, Adam::new(TINY_LR), &be, &fixture()).unwrap();
    let (x, y) = fixture_batch(&be, &fixture());
    let (loss, _) = t.eval_batch(&x, &y).unwrap();
    let jax = npz_f32(&fixture(), "jax/loss")[0];
    assert!((loss - jax).abs() / jax < 1e-5, "cuda {loss} vs JAX {jax}");
}

#[test]
fn loading_on_cuda_allocates_the_state_and_stages_one_array() {
    let Some(cuda) = deterministic(Precision::Tf32) else {
        return;
    };
    let be: Arc<dyn Backend> = cuda;
    let dir = scratch("cuda-memory");
    let input = Shape::new([8, 12, 12, 3]);
    let adam = Adam::new(1e-3);
    let t = Trainer::new(small_model(), input.clone(), adam, &be, 2).unwrap();
    let path = dir.join("ck.npz");
    t.save(&path, None).unwrap();
    let state = state_bits(&t);
    drop(t);
    be.allocator().reset_peak();
    let (loaded, _) = Trainer::load(small_model(), input.clone(), adam, &be, &path).unwrap();
    let plan = MemoryPlan::new(&small_model(), &input, &adam, &be).unwrap();
    let report = loaded.memory_report().unwrap();
    // deterministic choices are made without scratch buffers: the load allocates the
    // parameters and both moments, nothing else
    assert_eq!(report.peak, plan.state_bytes());
    assert_eq!(report.host.pageable.peak, plan.checkpoint_host_bytes());
    assert_eq!(state_bits(&loaded), state);
}

#[test]
fn device_tensors_download_to_ndarray_in_one_call() {
    let Some(be) = cuda_or_skip(&BackendOptions::default()) else {
        return;
    };
    let a = ndarray::Array3::from_shape_fn((3, 4, 5), |(i, j, k)| (i * 20 + j * 5 + k) as f32);
    let t = Tensor::from_ndarray(&be, &a, Category::Other).unwrap();
    assert_eq!(t.to_ndarray::<f32>().unwrap(), a.into_dyn());
    let e = t.ndarray_view::<f32>().unwrap_err();
    assert!(matches!(e, TensorError::InvalidArgument { .. }), "{e}");
    assert!(e.to_string().contains("not in host memory"), "{e}");
    let e = t.to_ndarray::<u32>().unwrap_err();
    assert!(matches!(e, TensorError::DType { .. }), "{e}");
}
