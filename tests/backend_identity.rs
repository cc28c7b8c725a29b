//! Backends are told apart by identity, not by device label: tensors of two backends opened
//! on one device (each with its own allocator and, on CUDA, its own stream) are a typed
//! mismatch naming both. And making a memory plan allocates nothing on the target.

mod common;

use std::sync::Arc;

use common::{cpu, cuda_backend_or_skip, with_precision};
use stax::models::seed_cnn;
use stax::tensor::cuda::CudaBackend;
use stax::tensor::ops;
use stax::train::plan::MemoryPlan;
use stax::{Adam, Backend, Category, Precision, Shape, Tensor, TensorError};

/// Two backends on the same device: an op mixing their tensors names both backends.
fn mixing_is_a_typed_error(a: &Arc<dyn Backend>, b: &Arc<dyn Backend>) {
    let x = Tensor::from_slice(a, &[1.0f32, 2.0], [2], Category::Other).unwrap();
    let mut y = Tensor::from_slice(b, &[0.0f32, 0.0], [2], Category::Other).unwrap();
    let e = ops::copy(&x, &mut y).unwrap_err();
    match &e {
        TensorError::BackendMismatch {
            device, lhs, rhs, ..
        } => {
            assert_eq!(*device, a.device());
            assert_eq!((*lhs, *rhs), (a.id(), b.id()));
        }
        other => panic!("expected a backend mismatch, got {other}"),
    }
    let text = e.to_string();
    for want in [a.id().to_string(), b.id().to_string()] {
        assert!(text.contains(&want), "{want} missing from {text}");
    }
    // the same tensors on one backend are fine
    let mut z = Tensor::from_slice(a, &[0.0f32, 0.0], [2], Category::Other).unwrap();
    ops::copy(&x, &mut z).unwrap();
    assert_eq!(z.to_vec().unwrap(), [1.0, 2.0]);
}

#[test]
fn two_cpu_backends_do_not_mix() {
    mixing_is_a_typed_error(&cpu(), &cpu());
}

#[test]
fn two_gpu_backends_on_one_device_do_not_mix() {
    let Some(shared) = cuda_backend_or_skip(&with_precision(Precision::Tf32)) else {
        return;
    };
    let own: Arc<dyn Backend> = CudaBackend::new(0, &with_precision(Precision::Tf32)).unwrap();
    mixing_is_a_typed_error(&(shared as Arc<dyn Backend>), &own);
}

#[test]
fn making_a_plan_on_the_gpu_allocates_nothing() {
    if cuda_backend_or_skip(&with_precision(Precision::Tf32)).is_none() {
        return;
    }
    // A backend of its own: the shared one is busy with the other tests of this file.
    let gpu: Arc<dyn Backend> = CudaBackend::new(0, &with_precision(Precision::Tf32)).unwrap();
    let (before, pinned) = (
        gpu.allocator().stats(),
        gpu.staging_allocator().unwrap().stats(),
    );
    // nothing is calibrated on a fresh backend: its convolutions are planned with the bound
    let input = Shape::new([3, 37, 41, 3]);
    let plan = MemoryPlan::new(&seed_cnn(2), &input, &Adam::new(1e-3), &gpu).unwrap();
    let after = gpu.allocator().stats();
    assert_eq!(
        after.allocs, before.allocs,
        "allocations made while planning"
    );
    assert_eq!(
        after.reserved, before.reserved,
        "memory reserved while planning"
    );
    assert_eq!(
        gpu.staging_allocator().unwrap().stats().allocs,
        pinned.allocs
    );
    assert!(!plan.exact, "an uncalibrated plan says so");
    // calibrating is the explicit step that may allocate; then the plan is exact and no larger
    plan.calibrate(&gpu).unwrap();
    let exact = MemoryPlan::new(&seed_cnn(2), &input, &Adam::new(1e-3), &gpu).unwrap();
    assert!(exact.exact);
    assert!(exact.peak.bytes <= plan.peak.bytes);
}
