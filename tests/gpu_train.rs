//! One full training step on the GPU matches the same step on the CPU backend (loss and every
//! updated parameter and Adam moment), for a small model, on fresh random inputs.

mod common;

use common::{
    Rng, assert_rel_close, cpu, cuda_or_skip, host_values, on_both, seed_for, small_model,
    with_precision,
};
use stax::train::Trainer;
use stax::{Adam, Precision, Shape};

#[test]
fn two_training_steps_match_the_cpu() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    let cpu = cpu();
    let input = Shape::new([4, 9, 9, 3]);
    let mut on_gpu = Trainer::new(small_model(), input.clone(), Adam::new(1e-2), &gpu, 7).unwrap();
    let mut on_cpu = Trainer::new(small_model(), input.clone(), Adam::new(1e-2), &cpu, 7).unwrap();
    assert_eq!(
        host_values(on_gpu.params().leaves()),
        host_values(on_cpu.params().leaves()),
        "same seed, same initial parameters"
    );
    let mut rng = Rng::new(seed_for("two_training_steps_match_the_cpu", input.dims()));
    for step in 0..2 {
        let (xg, xc) = on_both(
            &gpu,
            &cpu,
            &rng.vec(input.numel(), -1.0, 1.0),
            input.clone(),
        );
        let labels: Vec<f32> = (0..4)
            .flat_map(|i| {
                if (i + step) % 2 == 0 {
                    [1.0, 0.0]
                } else {
                    [0.0, 1.0]
                }
            })
            .collect();
        let (yg, yc) = on_both(&gpu, &cpu, &labels, [4, 2]);
        let rg = on_gpu.step(&xg, &yg).unwrap();
        let rc = on_cpu.step(&xc, &yc).unwrap();
        assert!(
            (rg.loss - rc.loss).abs() <= 1e-5 * rc.loss.abs().max(1.0),
            "step {step}: loss {} vs {}",
            rg.loss,
            rc.loss
        );
        assert_rel_close(
            &host_values(on_gpu.params().leaves()),
            &host_values(on_cpu.params().leaves()),
            1e-4,
            "parameters",
        );
        assert_rel_close(
            &host_values(on_gpu.state().field("mu")),
            &host_values(on_cpu.state().field("mu")),
            1e-4,
            "adam m",
        );
        assert_rel_close(
            &host_values(on_gpu.state().field("nu")),
            &host_values(on_cpu.state().field("nu")),
            1e-4,
            "adam v",
        );
        assert_eq!(
            rg.memory.live, rc.memory.live,
            "live bytes agree across backends"
        );
    }
}
