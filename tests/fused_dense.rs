//! The dense layer's weight gradient consumed by Adam as it is made (`ops::dense_adam`): the
//! GPU equals the CPU on fresh random inputs, over several chunks and a partial one, for every
//! way of writing the input gradient;
//! training with it equals training with every gradient collected, on the CPU.

mod common;

use common::{
    Rng, assert_rel_close, cpu, cuda_or_skip, on_both, poisoned, seed_for, with_precision,
};
use stax::tensor::backend::DenseDx;
use stax::{DType, Precision, Tensor};
use stax_tensor::{AdamHyper, ops};

fn hyper() -> AdamHyper {
    let (b1, b2, t) = (0.9f32, 0.999f32, 2);
    AdamHyper {
        lr: 1e-3,
        b1,
        b2,
        eps: 1e-8,
        eps_root: 0.0,
        bias_correction1: 1.0 - b1.powi(t),
        bias_correction2: 1.0 - b2.powi(t),
        grad_scale: 1.0,
    }
}

#[test]
fn gpu_dense_adam_matches_cpu() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    let cpu = cpu();
    // (m, n, k): chunks of 64 MiB of gradient (70,000 rows of 300 are two, the second
    // partial), one chunk, a batch of one row, the seed's shape at batch 10 and 64
    let cases = [
        ((100, 300, 70_000), 0),
        ((1, 3, 100), 1),
        ((3, 5, 77), 1),
        ((10, 128, 40_000), 2),
        ((64, 128, 5_000), 0),
    ];
    for ((m, n, k), mode) in cases {
        let mut rng = Rng::new(seed_for("dense_adam", &[m, n, k]));
        let mut both = |rows, cols, positive: bool| {
            let mut v = rng.vec(rows * cols, -1.0, 1.0);
            if positive {
                v.iter_mut().for_each(|x| *x = x.abs());
            }
            on_both(&gpu, &cpu, &v, [rows, cols])
        };
        let (mut xg, mut xc) = both(m, k, false);
        let (dyg, dyc) = both(m, n, false);
        let (mut wg, mut wc) = both(k, n, false);
        let (mut mug, mut muc) = both(k, n, false);
        let (mut nug, mut nuc) = both(k, n, true);
        let mut dxg = poisoned(&gpu, [m, k], DType::F32);
        let mut dxc = Tensor::empty(&cpu, [m, k], DType::F32, stax::Category::Other).unwrap();
        let (dx_g, dx_c) = match mode {
            0 => (DenseDx::InPlace, DenseDx::InPlace),
            1 => (DenseDx::Into(&mut dxg), DenseDx::Into(&mut dxc)),
            _ => (DenseDx::Skip, DenseDx::Skip),
        };
        ops::dense_adam(&mut xg, &dyg, &mut wg, &mut mug, &mut nug, dx_g, &hyper()).unwrap();
        ops::dense_adam(&mut xc, &dyc, &mut wc, &mut muc, &mut nuc, dx_c, &hyper()).unwrap();
        let what = |s: &str| format!("{s} of dense_adam m{m} n{n} k{k} mode {mode}");
        let pairs = [(&wg, &wc, "w"), (&mug, &muc, "mu"), (&nug, &nuc, "nu")];
        for (g, c, name) in pairs {
            let (g, c) = (g.to_vec().unwrap(), c.to_vec().unwrap());
            assert_rel_close(&g, &c, 1e-5, &what(name));
        }
        let (g, c) = match mode {
            1 => (dxg.to_vec().unwrap(), dxc.to_vec().unwrap()),
            _ => (xg.to_vec().unwrap(), xc.to_vec().unwrap()),
        };
        // mode 2 only reads x: equal to the bit
        assert_rel_close(&g, &c, if mode == 2 { 0.0 } else { 1e-5 }, &what("dx"));
    }
}

/// Trains `model` three steps on the same batches with Adam updating the dense weights in
/// the backward pass and with every gradient collected: losses, parameters and both moments
/// agree, and the fused plan has no whole dense weight gradient.
#[test]
fn updating_in_backward_trains_as_collecting() {
    use common::{batch, seed_model};
    use stax::train::Trainer;
    use stax::{Adam, Shape, models::mlp};
    let be = cpu();
    let cases: [(fn() -> stax::Serial, Shape); 2] = [
        (seed_model, Shape::new([3, 10, 10, 3])),
        (|| mlp(&[17, 5], 2), Shape::new([4, 300])),
    ];
    for (model, input) in cases {
        let (x, y) = batch(&be, &input, 2);
        let run = |adam: Adam| {
            let mut t = Trainer::new(model(), input.clone(), adam, &be, 9).unwrap();
            let reserves = be.allocator().stats().backend_reserves;
            let losses: Vec<f32> = (0..3).map(|_| t.step(&x, &y).unwrap().loss).collect();
            let params = common::host_values(t.params().leaves());
            let moments = common::host_values(t.state().tree.leaves());
            let plan = t.plan(input.dims()[0]).unwrap();
            let after = be.allocator().stats().backend_reserves - reserves;
            (losses, params, moments, plan, after)
        };
        let (lf, pf, mf, plan_f, reserves_f) = run(Adam::new(1e-3));
        let (lc, pc, mc, plan_c, _) = run(Adam::new(1e-3).collecting());
        assert_rel_close(&lf, &lc, 1e-6, "losses");
        assert_rel_close(&pf, &pc, 1e-6, "parameters");
        assert_rel_close(&mf, &mc, 1e-6, "moments");
        let names = |p: &stax::train::MemoryPlan| -> Vec<String> {
            p.buffers.iter().map(|b| b.name.clone()).collect()
        };
        assert!(names(&plan_c).iter().any(|n| n.ends_with("dense/dw")));
        assert!(
            !names(&plan_f).iter().any(|n| n.ends_with("dense/dw")),
            "{:?}",
            names(&plan_f)
        );
        assert!(plan_f.peak.bytes < plan_c.peak.bytes);
        // the set-up reserved the loop's memory: no step asked the host for more
        assert_eq!(reserves_f, 0, "backend reserves during the fused steps");
    }
}

/// With the dense weights updated in the backward pass, a run that cannot fit fails at
/// set-up (the loop's memory is reserved then), never in a step after an update; a budget
/// of the plan's least memory trains.
#[test]
fn a_loop_that_cannot_fit_fails_at_set_up() {
    use common::{batch, seed_model};
    use stax::train::{MemoryPlan, Trainer};
    use stax::{Adam, BackendOptions, Shape, Strategy, tensor::cpu::CpuBackend};
    let input = Shape::new([3, 10, 10, 3]);
    let options = BackendOptions {
        strategy: Strategy::Caching,
        ..BackendOptions::default()
    };
    let host = cpu();
    let need = MemoryPlan::new(&seed_model(), &input, &Adam::new(1e-3), &host)
        .unwrap()
        .min_budget()
        .unwrap();
    let tight: std::sync::Arc<dyn stax::Backend> =
        CpuBackend::with_capacity(&options, need - (1 << 20)).unwrap();
    let e = Trainer::new(seed_model(), input.clone(), Adam::new(1e-3), &tight, 1).unwrap_err();
    assert!(e.oom().is_some(), "{e}");
    let enough: std::sync::Arc<dyn stax::Backend> =
        CpuBackend::with_capacity(&options, need).unwrap();
    let mut t = Trainer::new(seed_model(), input.clone(), Adam::new(1e-3), &enough, 1).unwrap();
    let (x, y) = batch(&enough, &input, 2);
    for _ in 0..3 {
        t.step(&x, &y).unwrap();
    }
}
