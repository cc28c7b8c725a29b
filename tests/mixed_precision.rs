//! Mixed precision on the CPU: the bf16 and f16 ops equal the f32 op on the widened inputs,
//! rounded once; casts round to nearest even; the seed model trains under `Policy::BF16` to 95%
//! with losses close to the f32 run's and every step's peak equal to its plan; bad dtypes and
//! policies are typed errors naming what is wrong.

use std::sync::Arc;

mod common;

use common::Rng;
use stax::layers::{LayerError, Mixed, Policy};
use stax::models::seed_cnn;
use stax::tensor::dtype::{bf16, f16};
use stax::tensor::ops::{self, Epilogue};
use stax::tensor::{Conv2dGeometry, Float, Padding, PoolKind};
use stax::train::data::{Loader, fashion_mnist_2class};
use stax::train::plan::MemoryPlan;
use stax::train::{Trainer, place_batch};
use stax::{Adam, Backend, BackendOptions, Category, DType, Device, Layer, Shape, Tensor};

fn cpu() -> Arc<dyn Backend> {
    Device::Cpu.open(&BackendOptions::default()).unwrap()
}

/// `values` rounded to `dtype`, as a tensor of that dtype.
fn of(be: &Arc<dyn Backend>, values: &[f32], shape: &[usize], dtype: DType) -> Tensor {
    let wide = Tensor::from_slice(be, values, shape.to_vec(), Category::Other).unwrap();
    let mut t = Tensor::empty(be, shape.to_vec(), dtype, Category::Other).unwrap();
    ops::cast(&wide, &mut t).unwrap();
    t
}

/// The f32 values of a float tensor of any dtype.
fn wide(t: &Tensor) -> Vec<f32> {
    let mut w = Tensor::empty(t.backend(), t.shape().clone(), DType::F32, Category::Other).unwrap();
    ops::cast(t, &mut w).unwrap();
    w.to_vec().unwrap()
}

/// `v` rounded to `dtype` and read back as f32.
fn rounded(v: &[f32], dtype: DType) -> Vec<f32> {
    match dtype {
        DType::BF16 => v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect(),
        DType::F16 => v
            .iter()
            .map(|&x| <f16 as Float>::from_f32(x).to_f32())
            .collect(),
        _ => v.to_vec(),
    }
}

/// `n` values uniform in `[-1, 1)`.
fn normal(rng: &mut Rng, n: usize) -> Vec<f32> {
    rng.vec(n, -1.0, 1.0)
}

/// An NHWC / HWIO geometry with SAME padding.
fn geometry(x: [usize; 4], k: [usize; 4], stride: (usize, usize)) -> Conv2dGeometry {
    Conv2dGeometry::new(&x.into(), &k.into(), stride, Padding::Same).unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn casts_round_to_nearest_even_and_saturate_f16() {
    let be = cpu();
    let v = [
        1.0 + 1.0 / 256.0,
        1.0 + 3.0 / 256.0,
        -2.5,
        65520.0,
        f32::NAN,
        1e-30,
    ];
    let b = of(&be, &v, &[6], DType::BF16);
    let got = b.to_host::<bf16>().unwrap();
    let want: Vec<bf16> = v.iter().map(|&x| bf16::from_f32(x)).collect();
    assert_eq!(bits(&wide(&b))[..4], bits(&rounded(&v, DType::BF16))[..4]);
    assert_eq!(got[0], bf16::from_f32(1.0), "ties to even");
    assert_eq!(got[1].to_f32(), 1.0 + 4.0 / 256.0);
    assert!(got[4].is_nan());
    assert_eq!(got.len(), want.len());
    let h = of(&be, &v, &[6], DType::F16);
    let hw = wide(&h);
    assert_eq!(hw[3], f32::INFINITY, "65520 overflows f16");
    assert_eq!(hw[5], 0.0, "1e-30 underflows f16");
    // bf16 -> f16 -> f32 goes through f32 exactly once per rounding
    let mut hb = Tensor::empty(&be, [6], DType::F16, Category::Other).unwrap();
    ops::cast(&b, &mut hb).unwrap();
    assert_eq!(wide(&hb)[2], -2.5);
}

/// A conv, its two gradients, a GEMM and a pooling in `dtype` equal the f32 op on the same
/// (already rounded) inputs, rounded once, bit for bit; and are within the dtype's rounding of
/// the f32 op on unrounded inputs.
fn ops_equal_rounded_f32(dtype: DType) {
    let be = cpu();
    let mut rng = Rng::new(11);
    let g = geometry([2, 7, 6, 3], [3, 3, 3, 5], (1, 1));
    let xs = normal(&mut rng, g.input_shape().numel());
    let ws = normal(&mut rng, g.filter_shape().numel());
    let bs = normal(&mut rng, g.c_out);
    let dys = normal(&mut rng, g.output_shape().numel());
    // the rounded inputs, in f32 and in dtype
    let (xr, wr, br, dyr) = (
        rounded(&xs, dtype),
        rounded(&ws, dtype),
        rounded(&bs, dtype),
        rounded(&dys, dtype),
    );
    let f = |v: &[f32], s: Shape| Tensor::from_slice(&be, v, s, Category::Other).unwrap();
    let l = |v: &[f32], s: Shape| of(&be, v, s.dims(), dtype);
    let empty = |s: Shape, d: DType| Tensor::empty(&be, s, d, Category::Other).unwrap();
    // forward
    let mut y32 = empty(g.output_shape(), DType::F32);
    let (x32, w32, b32) = (
        f(&xr, g.input_shape()),
        f(&wr, g.filter_shape()),
        f(&br, [5].into()),
    );
    ops::conv2d(&x32, &w32, &b32, &g, &mut y32, Epilogue::default()).unwrap();
    let mut y = empty(g.output_shape(), dtype);
    let (x, w, b) = (
        l(&xs, g.input_shape()),
        l(&ws, g.filter_shape()),
        l(&bs, [5].into()),
    );
    ops::conv2d(&x, &w, &b, &g, &mut y, Epilogue::default()).unwrap();
    assert_eq!(
        bits(&wide(&y)),
        bits(&rounded(&y32.to_vec().unwrap(), dtype)),
        "conv2d"
    );
    // backward data and filter
    let mut dx32 = empty(g.input_shape(), DType::F32);
    let dy32 = f(&dyr, g.output_shape());
    ops::conv2d_bwd_data(&dy32, &w32, &g, &mut dx32).unwrap();
    let mut dx = empty(g.input_shape(), dtype);
    let dy = l(&dys, g.output_shape());
    ops::conv2d_bwd_data(&dy, &w, &g, &mut dx).unwrap();
    assert_eq!(
        bits(&wide(&dx)),
        bits(&rounded(&dx32.to_vec().unwrap(), dtype)),
        "bwd data"
    );
    let (mut dw32, mut db32) = (
        empty(g.filter_shape(), DType::F32),
        empty([5].into(), DType::F32),
    );
    ops::conv2d_bwd_filter(&x32, &mut dy32.clone(), &g, &mut dw32, &mut db32, None).unwrap();
    let (mut dw, mut db) = (empty(g.filter_shape(), dtype), empty([5].into(), dtype));
    ops::conv2d_bwd_filter(&x, &mut dy.clone(), &g, &mut dw, &mut db, None).unwrap();
    assert_eq!(
        bits(&wide(&dw)),
        bits(&rounded(&dw32.to_vec().unwrap(), dtype)),
        "dw"
    );
    assert_eq!(
        bits(&wide(&db)),
        bits(&rounded(&db32.to_vec().unwrap(), dtype)),
        "db"
    );
    // against unrounded f32 inputs: within a few roundings of the dtype, relative to the scale
    let mut yf = empty(g.output_shape(), DType::F32);
    let (xf, wf, bf) = (
        f(&xs, g.input_shape()),
        f(&ws, g.filter_shape()),
        f(&bs, [5].into()),
    );
    ops::conv2d(&xf, &wf, &bf, &g, &mut yf, Epilogue::default()).unwrap();
    let eps = if dtype == DType::BF16 {
        2f64.powi(-8)
    } else {
        2f64.powi(-11)
    };
    let scale = yf
        .to_vec()
        .unwrap()
        .iter()
        .fold(0f64, |m, v| m.max(v.abs() as f64));
    for (a, e) in wide(&y).iter().zip(yf.to_vec().unwrap()) {
        assert!(
            ((a - e).abs() as f64) < 8.0 * eps * scale,
            "conv2d {a} vs f32 {e}"
        );
    }
    // GEMM with a transposed operand
    let (m, k, n) = (5, 9, 4);
    let (a_s, b_s) = (normal(&mut rng, k * m), normal(&mut rng, k * n));
    let mut c32 = empty([m, n].into(), DType::F32);
    let (a32, bb32) = (
        f(&rounded(&a_s, dtype), [k, m].into()),
        f(&rounded(&b_s, dtype), [k, n].into()),
    );
    ops::matmul(&a32, &bb32, true, false, &mut c32).unwrap();
    let mut c = empty([m, n].into(), dtype);
    ops::matmul(
        &l(&a_s, [k, m].into()),
        &l(&b_s, [k, n].into()),
        true,
        false,
        &mut c,
    )
    .unwrap();
    assert_eq!(
        bits(&wide(&c)),
        bits(&rounded(&c32.to_vec().unwrap(), dtype)),
        "matmul"
    );
    // max and average pooling, forward and backward
    let p = geometry([2, 7, 6, 3], [2, 2, 3, 3], (2, 2));
    for kind in [PoolKind::Max, PoolKind::Avg] {
        let mut py32 = empty(p.output_shape(), DType::F32);
        let px32 = f(
            &rounded(&xs[..p.input_shape().numel()], dtype),
            p.input_shape(),
        );
        ops::pool2d(kind, &p, &px32, &mut py32).unwrap();
        let px = l(&xs[..p.input_shape().numel()], p.input_shape());
        let mut py = empty(p.output_shape(), dtype);
        ops::pool2d(kind, &p, &px, &mut py).unwrap();
        assert_eq!(
            bits(&wide(&py)),
            bits(&rounded(&py32.to_vec().unwrap(), dtype)),
            "{kind:?}"
        );
        let pdy = &dys[..p.output_shape().numel()];
        let mut pdx32 = empty(p.input_shape(), DType::F32);
        let saved32 = (kind == PoolKind::Max).then_some(&px32);
        ops::pool2d_bwd(
            kind,
            &p,
            saved32,
            &f(&rounded(pdy, dtype), p.output_shape()),
            &mut pdx32,
        )
        .unwrap();
        let mut pdx = empty(p.input_shape(), dtype);
        let saved = (kind == PoolKind::Max).then_some(&px);
        ops::pool2d_bwd(kind, &p, saved, &l(pdy, p.output_shape()), &mut pdx).unwrap();
        let want = rounded(&pdx32.to_vec().unwrap(), dtype);
        assert_eq!(bits(&wide(&pdx)), bits(&want), "{kind:?} backward");
    }
}

#[test]
fn bf16_ops_equal_the_f32_op_rounded() {
    ops_equal_rounded_f32(DType::BF16);
}

#[test]
fn f16_ops_equal_the_f32_op_rounded() {
    ops_equal_rounded_f32(DType::F16);
}

/// Adam on f32 master weights reads a bf16 gradient as its f32 value.
#[test]
fn adam_reads_low_precision_gradients_as_f32() {
    let be = cpu();
    let h = stax::tensor::AdamHyper {
        lr: 0.1,
        b1: 0.9,
        b2: 0.999,
        eps: 1e-8,
        eps_root: 0.0,
        bias_correction1: 0.1,
        bias_correction2: 1.0 - 0.999,
        grad_scale: 1.0,
    };
    let gv = [0.3f32, -1.7, 2.0e-3];
    let run = |g: &Tensor| {
        let mut p = Tensor::from_slice(&be, &[1.0f32, 2.0, 3.0], [3], Category::Parameter).unwrap();
        let mut m = Tensor::zeros(&be, [3], Category::OptimizerState).unwrap();
        let mut v = Tensor::zeros(&be, [3], Category::OptimizerState).unwrap();
        ops::adam(&mut p, g, &mut m, &mut v, &h).unwrap();
        (p.to_vec().unwrap(), m.to_vec().unwrap())
    };
    for dtype in [DType::BF16, DType::F16] {
        let low = of(&be, &gv, &[3], dtype);
        let as_f32 = Tensor::from_slice(&be, &rounded(&gv, dtype), [3], Category::Other).unwrap();
        assert_eq!(run(&low), run(&as_f32), "{dtype}");
        assert_ne!(run(&low).1, vec![0.0; 3]);
    }
}

/// Trains `model` (the seed model, under a policy or not) for `steps` steps (or two epochs) and
/// returns the losses, the test accuracy and the largest measured peak, asserting every step's
/// peak equals the plan's.
fn train<L: Layer>(model: L, steps: usize) -> (Vec<f32>, f32, u64) {
    let be = cpu();
    let (train, test) = fashion_mnist_2class().unwrap();
    let (batch, img) = (100, 28);
    let input = Shape::new([batch, img, img, 3]);
    let plan = MemoryPlan::new(&model, &input, &Adam::new(1e-3), &be).unwrap();
    let mut trainer = Trainer::new(model, input, Adam::new(1e-3), &be, 2793).unwrap();
    let loader = Loader::new(train.len(), batch, 2793).unwrap();
    let (mut losses, mut peak) = (Vec::new(), 0);
    'epochs: for epoch in 0..2 {
        for indices in loader.batches(epoch) {
            let (x, y) = place_batch(&be, &train, &indices, (img, img, 3)).unwrap();
            let r = trainer.step(&x, &y).unwrap();
            assert_eq!(
                r.memory.peak, plan.peak.bytes,
                "step {} peak = plan",
                r.step
            );
            peak = peak.max(r.memory.peak);
            losses.push(r.loss);
            if losses.len() == steps {
                break 'epochs;
            }
        }
    }
    let eval = trainer.evaluate(&test, batch).unwrap();
    (losses, eval.accuracy, peak)
}

#[test]
fn seed_model_trains_in_bf16_close_to_f32_with_exact_memory() {
    let (f32_losses, f32_acc, f32_peak) = train(seed_cnn(2), 40);
    let (losses, acc, peak) = train(Mixed::new(seed_cnn(2), Policy::BF16), usize::MAX);
    let gap = losses[..40]
        .iter()
        .zip(&f32_losses)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    eprintln!(
        "bf16: test accuracy {acc}, peak {peak} B; f32 (40 steps): accuracy {f32_acc}, peak \
         {f32_peak} B; largest loss gap over 40 steps {gap}"
    );
    assert!(acc >= 0.95, "bf16 test accuracy {acc}");
    assert!(
        gap < 0.08,
        "bf16 losses differ from f32 by up to {gap} (0.044 measured)"
    );
    assert!(
        losses[0] > 0.5 && losses[39] < 0.5 * losses[0],
        "{:?}",
        &losses[..40]
    );
}

#[test]
fn bad_policies_and_dtypes_are_typed_errors() {
    let f16_params = Policy {
        param: DType::F16,
        ..Policy::BF16
    };
    let e = f16_params.check(false).unwrap_err();
    assert!(
        matches!(e, LayerError::Config { .. }) && e.to_string().contains("loss scaling"),
        "{e}"
    );
    let f16_compute = Policy {
        compute: DType::F16,
        ..Policy::BF16
    };
    assert!(
        f16_compute
            .check(false)
            .unwrap_err()
            .to_string()
            .contains("DynamicLossScale")
    );
    assert!(Policy::BF16.check(false).is_ok());
    // a model under a refused policy fails before it allocates a thing
    let be = cpu();
    let input = Shape::new([2, 8, 8, 3]);
    let made = Trainer::new(
        Mixed::new(seed_cnn(2), f16_params),
        input,
        Adam::new(1e-3),
        &be,
        1,
    );
    let Err(e) = made else {
        panic!("a policy with f16 parameters was accepted")
    };
    assert!(e.to_string().contains("f16"), "{e}");
    // an op without a bf16 kernel names itself and the dtype
    let x = of(&be, &[1.0; 8], &[2, 4], DType::BF16);
    let labels = of(&be, &[0.5; 8], &[2, 4], DType::BF16);
    let mut d = Tensor::empty(&be, [2, 4], DType::BF16, Category::Gradient).unwrap();
    let e = ops::softmax_xent(&x, &labels, &mut d).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("softmax_xent") && msg.contains("bf16"),
        "{msg}"
    );
    let mut u = Tensor::empty(&be, [2, 4], DType::U32, Category::Other).unwrap();
    let e = ops::cast(&x, &mut u).unwrap_err().to_string();
    assert!(e.contains("cast") && e.contains("u32"), "{e}");
}
