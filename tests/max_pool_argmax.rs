//! Max pooling that keeps its windows' argmax offsets instead of its input
//! (`ops::max_pool2d_argmax`, `ops::max_pool2d_bwd_argmax`): the offsets are each window's
//! first maximum in window order (ties, padding), the gradient from them is the gradient from
//! the input bit for bit (f32 and bf16, overlapping windows, padding), bad buffers are typed
//! errors, `MaxPool` keeps the offsets only where they are smaller and the input is its own,
//! and on the GPU the offsets, outputs and gradients equal the CPU's, with no workspace.

mod common;

use std::sync::Arc;

use common::{Rng, cpu, cuda_or_skip, poisoned, seed_for, typed, with_precision};
use stax::train::Trainer;
use stax_tensor::{
    Backend, Category, Conv2dGeometry, DType, OpDesc, Padding, PoolKind, Precision, Shape, Tensor,
    TensorError, ops,
};

fn geometry(
    x: [usize; 4],
    window: (usize, usize),
    strides: (usize, usize),
    p: Padding,
) -> Conv2dGeometry {
    let c = x[3];
    Conv2dGeometry::new(&x.into(), &[window.0, window.1, c, c].into(), strides, p).unwrap()
}

/// Pooling geometries: overlapping windows, SAME and explicit padding, a window as large as the
/// image, batch 1; channels a multiple of 8 (the GPU's vectorized kernels) and not.
fn geometries() -> Vec<Conv2dGeometry> {
    vec![
        geometry([2, 9, 8, 3], (3, 3), (2, 2), Padding::Same),
        geometry([2, 9, 8, 8], (3, 3), (2, 2), Padding::Same),
        geometry(
            [1, 6, 5, 16],
            (2, 3),
            (1, 2),
            Padding::Explicit([(1, 0), (0, 1)]),
        ),
        geometry([1, 7, 6, 2], (3, 3), (2, 2), Padding::Valid),
        geometry([2, 5, 4, 3], (2, 2), (1, 1), Padding::Valid),
        geometry(
            [1, 6, 5, 2],
            (2, 3),
            (1, 2),
            Padding::Explicit([(1, 0), (0, 1)]),
        ),
        geometry([2, 4, 4, 5], (4, 4), (1, 1), Padding::Valid),
    ]
}

/// `y`, the argmax offsets, and the input gradients from the offsets and from the input, of
/// `x` and `dy` (host values rounded to `dtype`) on `be`.
fn run(
    be: &Arc<dyn Backend>,
    g: &Conv2dGeometry,
    (x, dy): (&[f32], &[f32]),
    dtype: DType,
) -> (Vec<f32>, Vec<u32>, Vec<f32>, Vec<f32>) {
    let xt = typed(be, x, g.input_shape().dims(), dtype);
    let dyt = typed(be, dy, g.output_shape().dims(), dtype);
    let mut y = poisoned(be, g.output_shape(), dtype);
    let mut arg = Tensor::empty(be, g.output_shape(), DType::U32, Category::Other).unwrap();
    ops::max_pool2d_argmax(g, &xt, &mut y, &mut arg).unwrap();
    let mut from_arg = poisoned(be, g.input_shape(), dtype);
    ops::max_pool2d_bwd_argmax(g, &arg, &dyt, &mut from_arg).unwrap();
    let mut from_x = poisoned(be, g.input_shape(), dtype);
    ops::pool2d_bwd(PoolKind::Max, g, Some(&xt), &dyt, &mut from_x).unwrap();
    let v = |t: &Tensor| t.to_vec().unwrap();
    (v(&y), arg.to_vec_u32().unwrap(), v(&from_arg), v(&from_x))
}

/// Random values with ties: drawn from eight levels, so windows often hold equal maxima.
fn tied(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.below(8) as f32 * 0.25 - 1.0).collect()
}

#[test]
fn the_offsets_are_each_windows_first_maximum() {
    let be = cpu();
    // one 3x3 image, one channel; 2x2 windows of stride 1 over
    //   1 3 3
    //   0 3 2
    //   5 5 1
    let g = geometry([1, 3, 3, 1], (2, 2), (1, 1), Padding::Valid);
    let x = [1.0, 3.0, 3.0, 0.0, 3.0, 2.0, 5.0, 5.0, 1.0];
    let (y, arg, dx, _) = run(&be, &g, (&x, &[1.0, 10.0, 100.0, 1000.0]), DType::F32);
    assert_eq!(y, [3.0, 3.0, 5.0, 5.0]);
    // ties go to the first in window order (row-major over ky, kx)
    assert_eq!(arg, [1, 0, 2, 2]);
    // each window's gradient lands on its argmax: the first two windows share x[0, 1]
    assert_eq!(dx, [0.0, 11.0, 0.0, 0.0, 0.0, 0.0, 100.0, 1000.0, 0.0]);
    // SAME padding: the window at the top-left corner starts in the padding
    let g = geometry([1, 3, 3, 1], (3, 3), (2, 2), Padding::Same);
    let (_, arg, _, _) = run(&be, &g, (&x, &[1.0; 4]), DType::F32);
    // window (0, 0) covers rows -1..=1 and columns -1..=1: its first maximum, x[0, 1] = 3,
    // is at ky = 1, kx = 2, offset 1 * 3 + 2
    assert_eq!(arg[0], 5);
}

#[test]
fn the_gradient_from_the_offsets_is_the_gradient_from_the_input() {
    let be = cpu();
    for g in geometries() {
        let mut rng = Rng::new(seed_for("argmax", g.input_shape().dims()));
        let x = tied(&mut rng, g.input_shape().numel());
        let dy = rng.vec(g.output_shape().numel(), -1.0, 1.0);
        for dtype in [DType::F32, DType::BF16] {
            let (y, arg, from_arg, from_x) = run(&be, &g, (&x, &dy), dtype);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&from_arg), bits(&from_x), "{g:?} {dtype}");
            // the output is plain max pooling's, and every offset lies in its window
            let mut plain = poisoned(&be, g.output_shape(), dtype);
            let xt = typed(&be, &x, g.input_shape().dims(), dtype);
            ops::pool2d(PoolKind::Max, &g, &xt, &mut plain).unwrap();
            assert_eq!(bits(&plain.to_vec().unwrap()), bits(&y), "{g:?} {dtype}: y");
            assert!(
                arg.iter().all(|&k| (k as usize) < g.kh * g.kw),
                "{g:?}: {arg:?}"
            );
        }
    }
}

#[test]
fn bad_offset_buffers_are_typed_errors() {
    let be = cpu();
    let g = geometry([1, 4, 4, 2], (2, 2), (2, 2), Padding::Valid);
    let x = Tensor::empty(&be, g.input_shape(), DType::F32, Category::Other).unwrap();
    let mut y = Tensor::empty(&be, g.output_shape(), DType::F32, Category::Other).unwrap();
    let mut f32_arg = Tensor::empty(&be, g.output_shape(), DType::F32, Category::Other).unwrap();
    let e = ops::max_pool2d_argmax(&g, &x, &mut y, &mut f32_arg).unwrap_err();
    assert!(matches!(e, TensorError::DType { .. }), "{e}");
    let mut short = Tensor::empty(&be, [1, 2, 2, 1], DType::U32, Category::Other).unwrap();
    let e = ops::max_pool2d_argmax(&g, &x, &mut y, &mut short).unwrap_err();
    assert!(matches!(e, TensorError::Shape { .. }), "{e}");
    let mut dx = Tensor::empty(&be, g.input_shape(), DType::F32, Category::Other).unwrap();
    let e = ops::max_pool2d_bwd_argmax(&g, &short, &y, &mut dx).unwrap_err();
    assert!(matches!(e, TensorError::Shape { .. }), "{e}");
    let e = ops::pool2d_bwd(PoolKind::Max, &g, None, &y, &mut dx).unwrap_err();
    assert!(e.to_string().contains("forward input or its argmax"), "{e}");
}

/// The buffers a one-layer model's plan keeps under `3.max_pool/` or `0.max_pool/`.
fn pool_buffers(model: stax::Serial, input: [usize; 4], prefix: &str) -> Vec<(String, u64)> {
    let be = cpu();
    let t = Trainer::new(model, Shape::new(input), stax::Adam::new(1e-3), &be, 0).unwrap();
    let plan = t.plan(input[0]).unwrap();
    let mut out: Vec<(String, u64)> = plan
        .buffers
        .iter()
        .filter(|b| b.name.starts_with(prefix) && b.name.ends_with("argmax"))
        .map(|b| (b.name.clone(), b.bytes))
        .collect();
    out.sort();
    out
}

#[test]
fn max_pool_keeps_the_offsets_only_where_they_are_smaller_and_its_input_its_own() {
    use stax::{Conv, Dense, FanInConcat, FanOut, Flatten, MaxPool, Relu, parallel, serial};
    let stride2 = || MaxPool::new((3, 3)).with((2, 2), Padding::Same);
    // conv, ReLU, 3x3 stride-2 pooling: 2 x 4 x 4 x 4 outputs of u32 (a quarter of the input)
    let model = serial![Conv::same(4, (3, 3)), Relu, stride2(), Flatten, Dense(2)];
    let kept = pool_buffers(model, [2, 8, 8, 3], "2.max_pool/");
    assert_eq!(kept, [("2.max_pool/argmax".to_string(), 2 * 4 * 4 * 4 * 4)]);
    // stride 1 SAME: as many offsets as inputs, not fewer bytes: the input is kept
    let same = MaxPool::new((3, 3)).with((1, 1), Padding::Same);
    let model = serial![Conv::same(4, (3, 3)), Relu, same, Flatten, Dense(2)];
    assert!(pool_buffers(model, [2, 8, 8, 3], "2.max_pool/").is_empty());
    // the input shared with another branch: keeping it costs nothing
    let branches = parallel![stride2(), stride2()];
    let model = serial![
        Conv::same(4, (3, 3)),
        FanOut(2),
        branches,
        FanInConcat(3),
        Flatten,
        Dense(2)
    ];
    assert!(pool_buffers(model, [2, 8, 8, 3], "2.parallel/").is_empty());
}

#[test]
fn the_gpu_writes_the_cpus_offsets_and_gradients() {
    let Some(gpu) = cuda_or_skip(&with_precision(Precision::Highest)) else {
        return;
    };
    let host = cpu();
    for g in geometries() {
        let mut rng = Rng::new(seed_for("gpu argmax", g.input_shape().dims()));
        let x = tied(&mut rng, g.input_shape().numel());
        let dy = rng.vec(g.output_shape().numel(), -1.0, 1.0);
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let on_gpu = run(&gpu, &g, (&x, &dy), dtype);
            let on_cpu = run(&host, &g, (&x, &dy), dtype);
            let what = format!("{g:?} {dtype}");
            assert_eq!(on_gpu.0, on_cpu.0, "{what}: y");
            assert_eq!(on_gpu.1, on_cpu.1, "{what}: offsets");
            // f32 sums of at most four terms in the same order: the same gradients
            common::assert_rel_close(&on_gpu.2, &on_cpu.2, 1e-6, &format!("{what}: dx"));
            assert_eq!(on_gpu.2, on_gpu.3, "{what}: the GPU's two gradients");
        }
        let desc = OpDesc::Pool {
            kind: PoolKind::Max,
            geometry: g,
            backward: true,
            dtype: DType::F32,
            argmax: true,
        };
        assert!(gpu.workspace_schedule(&desc).unwrap().is_empty(), "{g:?}");
    }
}
