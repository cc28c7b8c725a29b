//! The convolutions against a direct seven-loop convolution and its exact adjoint, in f64.

use super::super::testing::{
    assert_close, backend, backend_with_workspace, random_vec, rng, tensor,
};
use crate::{
    Backend, Category, Conv2dGeometry, ConvSpec, DType, FilterLayout, Layout, Padding, Tensor,
    TensorError, ops,
};
use rand::rngs::StdRng;
use std::sync::Arc;

/// Index of element `(image, row, column, channel)` of an activation of `g`'s layout with
/// `h x w x c` images.
fn at(g: &Conv2dGeometry, (h, w, c): (usize, usize, usize), [i, y, x, ch]: [usize; 4]) -> usize {
    let (si, sc, sr, sx) = g.layout.strides(h, w, c);
    i * si + ch * sc + y * sr + x * sx
}

/// Visits every tap `(x index, w index, y index)` of the convolution: the seven loops over
/// image, output row and column, kernel row and column, input and output channel, skipping
/// taps that fall in the padding; indices through `g`'s layouts and dilation.
fn taps(g: &Conv2dGeometry, mut f: impl FnMut(usize, usize, usize)) {
    let dims = (g.kh, g.kw, g.c_in, g.c_out);
    for i in 0..g.n {
        for oy in 0..g.out_h {
            for ox in 0..g.out_w {
                for ky in 0..g.kh {
                    for kx in 0..g.kw {
                        let iy =
                            (oy * g.stride_h + ky * g.dilation_h) as isize - g.pad_top as isize;
                        let ix =
                            (ox * g.stride_w + kx * g.dilation_w) as isize - g.pad_left as isize;
                        if iy < 0 || ix < 0 || iy >= g.h as isize || ix >= g.w as isize {
                            continue;
                        }
                        let (iy, ix) = (iy as usize, ix as usize);
                        for c in 0..g.c_in {
                            for o in 0..g.c_out {
                                let xi = at(g, (g.h, g.w, g.c_in), [i, iy, ix, c]);
                                let wi = g.filter.index(dims, [ky, kx, c, o]);
                                let yi = at(g, (g.out_h, g.out_w, g.c_out), [i, oy, ox, o]);
                                f(xi, wi, yi);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Calls `f(y index, channel)` for every output element.
fn outputs(g: &Conv2dGeometry, mut f: impl FnMut(usize, usize)) {
    for i in 0..g.n {
        for oy in 0..g.out_h {
            for ox in 0..g.out_w {
                for o in 0..g.c_out {
                    f(at(g, (g.out_h, g.out_w, g.c_out), [i, oy, ox, o]), o);
                }
            }
        }
    }
}

/// Naive forward `y = conv(x, w) + b` in f64.
fn naive_forward(g: &Conv2dGeometry, x: &[f32], w: &[f32], b: &[f32]) -> Vec<f64> {
    let mut y = vec![0f64; g.output_shape().numel()];
    outputs(g, |yi, o| y[yi] = f64::from(b[o]));
    taps(g, |xi, wi, yi| y[yi] += f64::from(x[xi]) * f64::from(w[wi]));
    y
}

/// Exact adjoint of the naive convolution in f64: `(dx, dw, db)` for output gradient `dy`.
fn naive_backward(g: &Conv2dGeometry, x: &[f32], w: &[f32], dy: &[f32]) -> [Vec<f64>; 3] {
    let mut dx = vec![0f64; x.len()];
    let mut dw = vec![0f64; w.len()];
    let mut db = vec![0f64; g.c_out];
    taps(g, |xi, wi, yi| {
        dx[xi] += f64::from(dy[yi]) * f64::from(w[wi]);
        dw[wi] += f64::from(dy[yi]) * f64::from(x[xi]);
    });
    outputs(g, |yi, o| db[o] += f64::from(dy[yi]));
    [dx, dw, db]
}

/// The geometry list: SAME and VALID, strides (1,1) (2,2) (2,1) (1,3), odd sizes, batch 1 to 3,
/// kernels 1x1 2x2 3x3 5x3, one and three input channels, one and four output channels, and
/// a few edge cases (padding wider than the image, kernel as large as the input, stride larger
/// than the kernel, a 28x28 seed-like image).
fn geometries() -> Vec<Conv2dGeometry> {
    let mut out = Vec::new();
    let mut push = |x: [usize; 4], w: [usize; 4], s: (usize, usize), p: Padding| {
        if let Ok(g) = Conv2dGeometry::new(&x.into(), &w.into(), s, p) {
            out.push(g);
        }
    };
    for (n, h, wd, c_in, c_out) in [(1, 7, 5, 3, 4), (3, 6, 6, 1, 1), (2, 5, 8, 3, 1)] {
        for (kh, kw) in [(1, 1), (3, 3), (2, 2), (5, 3)] {
            for s in [(1, 1), (2, 2), (2, 1), (1, 3)] {
                for p in [Padding::Same, Padding::Valid] {
                    push([n, h, wd, c_in], [kh, kw, c_in, c_out], s, p);
                }
            }
        }
    }
    push([2, 2, 3, 2], [5, 3, 2, 3], (1, 1), Padding::Same);
    push([1, 4, 4, 2], [4, 4, 2, 3], (1, 1), Padding::Valid);
    push([2, 9, 7, 2], [2, 2, 2, 3], (3, 3), Padding::Same);
    push([1, 9, 7, 2], [3, 3, 2, 2], (3, 3), Padding::Valid);
    push([2, 28, 28, 8], [3, 3, 8, 16], (1, 1), Padding::Same);
    out.extend(general_geometries());
    out
}

/// Every activation and kernel layout with kernel dilation and explicit padding, on a few
/// shapes (odd sizes, strides, batch 1), given as NHWC dims and HWIO kernel dims.
fn general_geometries() -> Vec<Conv2dGeometry> {
    let mut out = Vec::new();
    let filters = [
        FilterLayout::Hwio,
        FilterLayout::Oihw,
        FilterLayout::TransposedHwio,
        FilterLayout::TransposedOihw,
    ];
    let paddings = [
        Padding::Same,
        Padding::Valid,
        Padding::Explicit([(2, 0), (1, 3)]),
    ];
    let shapes = [
        ([2, 7, 6, 3], (3, 2, 4), (1, 1)),
        ([1, 9, 8, 2], (2, 3, 3), (2, 1)),
        ([2, 5, 5, 1], (1, 1, 2), (2, 2)),
    ];
    for ([n, h, w, c], (kh, kw, co), strides) in shapes {
        for layout in [Layout::Nhwc, Layout::Nchw] {
            for (i, filter) in filters.into_iter().enumerate() {
                for dilation in [(1, 1), (2, 1), (2, 3)] {
                    let padding = paddings[(i + dilation.0) % 3];
                    let spec = ConvSpec {
                        strides,
                        padding,
                        dilation,
                        layout,
                        filter,
                    };
                    let x = layout.dims(n, h, w, c).into();
                    let k = filter.dims(kh, kw, c, co).into();
                    if let Ok(g) = Conv2dGeometry::with_spec(&x, &k, &spec) {
                        out.push(g);
                    }
                }
            }
        }
    }
    assert!(out.len() > 50, "only {} general geometries", out.len());
    out
}

/// A tensor on `be` of random values with `g`-derived shape.
fn random(be: &Arc<dyn Backend>, r: &mut StdRng, shape: crate::Shape) -> (Tensor, Vec<f32>) {
    let v = random_vec(r, shape.numel());
    (tensor(be, &v, shape), v)
}

/// A tensor full of NaN, so an element the op forgets to write fails the comparison.
fn poisoned(be: &Arc<dyn Backend>, shape: crate::Shape) -> Tensor {
    let mut t = Tensor::empty(be, shape, DType::F32, Category::Other).unwrap();
    ops::fill(&mut t, f32::NAN).unwrap();
    t
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum()
}

/// Forward, backward data and backward filter against the naive loops, on a default backend and
/// on one whose workspace holds only a few patch rows (chunks that split images).
#[test]
fn conv_matches_naive_loops_for_all_geometries() {
    let backends = [backend(), backend_with_workspace(700)];
    let geos = geometries();
    assert!(geos.len() > 80, "only {} geometries", geos.len());
    let mut r = rng(42);
    for g in &geos {
        for be in &backends {
            let (x, xv) = random(be, &mut r, g.input_shape());
            let (w, wv) = random(be, &mut r, g.filter_shape());
            let (b, bv) = random(be, &mut r, [g.c_out].into());
            let (dy, dyv) = random(be, &mut r, g.output_shape());
            let what = |op: &str| format!("{op} {g:?}");

            let mut y = poisoned(be, g.output_shape());
            ops::conv2d(&x, &w, &b, g, &mut y, Default::default()).unwrap();
            let want = naive_forward(g, &xv, &wv, &bv);
            assert_close(&y.to_vec().unwrap(), &want, 1e-4, 1e-5, &what("conv2d"));

            let [want_dx, want_dw, want_db] = naive_backward(g, &xv, &wv, &dyv);
            let mut dx = poisoned(be, g.input_shape());
            ops::conv2d_bwd_data(&dy, &w, g, &mut dx).unwrap();
            assert_close(
                &dx.to_vec().unwrap(),
                &want_dx,
                1e-4,
                1e-5,
                &what("bwd_data"),
            );

            let mut dw = poisoned(be, g.filter_shape());
            let mut db = poisoned(be, [g.c_out].into());
            ops::conv2d_bwd_filter(&x, &mut dy.clone(), g, &mut dw, &mut db, None).unwrap();
            assert_close(
                &dw.to_vec().unwrap(),
                &want_dw,
                1e-4,
                1e-4,
                &what("bwd_filter dw"),
            );
            assert_close(
                &db.to_vec().unwrap(),
                &want_db,
                1e-5,
                1e-5,
                &what("bwd_filter db"),
            );
            let (mut dw_c, mut db_c) = (
                poisoned(be, g.filter_shape()),
                poisoned(be, [g.c_out].into()),
            );
            ops::conv2d_bwd_filter_consuming(&x, dy.clone(), g, &mut dw_c, &mut db_c, None)
                .unwrap();
            assert_eq!(
                dw_c.to_vec().unwrap(),
                dw.to_vec().unwrap(),
                "{}",
                what("consumed dw")
            );
            assert_eq!(
                db_c.to_vec().unwrap(),
                db.to_vec().unwrap(),
                "{}",
                what("consumed db")
            );
        }
    }
}

/// `<conv(x, w), dy> == <x, bwd_data(dy)> == <w, bwd_filter(x, dy)>` with zero bias: the two
/// backward passes are the adjoints of the forward one.
#[test]
fn backward_passes_are_adjoints_of_forward() {
    let be = backend();
    let mut r = rng(3);
    for g in &geometries() {
        let (x, xv) = random(&be, &mut r, g.input_shape());
        let (w, wv) = random(&be, &mut r, g.filter_shape());
        let (dy, dyv) = random(&be, &mut r, g.output_shape());
        let zero = tensor(&be, &vec![0.0; g.c_out], [g.c_out]);
        let mut y = poisoned(&be, g.output_shape());
        ops::conv2d(&x, &w, &zero, g, &mut y, Default::default()).unwrap();
        let mut dx = poisoned(&be, g.input_shape());
        ops::conv2d_bwd_data(&dy, &w, g, &mut dx).unwrap();
        let mut dw = poisoned(&be, g.filter_shape());
        let mut db = poisoned(&be, [g.c_out].into());
        ops::conv2d_bwd_filter(&x, &mut dy.clone(), g, &mut dw, &mut db, None).unwrap();
        let lhs = dot(&y.to_vec().unwrap(), &dyv);
        let via_x = dot(&xv, &dx.to_vec().unwrap());
        let via_w = dot(&wv, &dw.to_vec().unwrap());
        let tol = 1e-4 * (1.0 + lhs.abs());
        assert!(
            (lhs - via_x).abs() < tol,
            "{g:?}: <y, dy> {lhs} vs <x, dx> {via_x}"
        );
        assert!(
            (lhs - via_w).abs() < tol,
            "{g:?}: <y, dy> {lhs} vs <w, dw> {via_w}"
        );
    }
}

#[test]
fn bad_operands_are_typed_errors() {
    let be = backend();
    let g = Conv2dGeometry::new(
        &[2, 5, 5, 3].into(),
        &[3, 3, 3, 4].into(),
        (2, 2),
        Padding::Same,
    )
    .unwrap();
    let x = tensor(&be, &[0.5; 150], g.input_shape());
    let w = tensor(&be, &[0.5; 108], g.filter_shape());
    let b = tensor(&be, &[0.0; 4], [4]);
    let mut y = poisoned(&be, g.output_shape());
    let shape_err = |r: Result<(), TensorError>| matches!(r, Err(TensorError::Shape { .. }));

    let x_bad = tensor(&be, &[0.5; 150], [2, 5, 3, 5]);
    assert!(shape_err(ops::conv2d(
        &x_bad,
        &w,
        &b,
        &g,
        &mut y,
        Default::default()
    )));
    let b_bad = tensor(&be, &[0.0; 3], [3]);
    assert!(shape_err(ops::conv2d(
        &x,
        &w,
        &b_bad,
        &g,
        &mut y,
        Default::default()
    )));
    let mut y_bad = poisoned(&be, [2, 5, 5, 4].into());
    assert!(shape_err(ops::conv2d(
        &x,
        &w,
        &b,
        &g,
        &mut y_bad,
        Default::default()
    )));
    let mut dx_bad = poisoned(&be, [2, 5, 5, 4].into());
    assert!(shape_err(ops::conv2d_bwd_data(&y, &w, &g, &mut dx_bad)));
    let (mut dw, mut db) = (poisoned(&be, g.filter_shape()), poisoned(&be, [4].into()));
    assert!(shape_err(ops::conv2d_bwd_filter(
        &x,
        &mut x.clone(),
        &g,
        &mut dw,
        &mut db,
        None
    )));

    let x_u32 = Tensor::empty(&be, g.input_shape(), DType::U32, Category::Other).unwrap();
    let e = ops::conv2d(&x_u32, &w, &b, &g, &mut y, Default::default()).unwrap_err();
    assert!(
        matches!(e, TensorError::UnsupportedDType { op: "conv2d", .. }),
        "{e}"
    );

    let y_view = y.clone();
    let e = ops::conv2d(&x, &w, &b, &g, &mut y, Default::default()).unwrap_err();
    assert!(
        matches!(e, TensorError::Aliased { op: "conv2d", .. }),
        "{e}"
    );
    drop(y_view);
    let _db_view = db.clone();
    let e = ops::conv2d_bwd_filter(&x, &mut y, &g, &mut dw, &mut db, None).unwrap_err();
    assert!(
        matches!(
            e,
            TensorError::Aliased {
                op: "conv2d_bwd_filter",
                ..
            }
        ),
        "{e}"
    );

    // Hand-built geometries that do not add up are rejected before any memory is touched.
    let inconsistent = Conv2dGeometry { out_h: 4, ..g };
    let e = ops::conv2d(&x, &w, &b, &inconsistent, &mut y, Default::default()).unwrap_err();
    assert!(matches!(e, TensorError::InvalidArgument { .. }), "{e}");
    let zero_stride = Conv2dGeometry { stride_w: 0, ..g };
    let e = ops::conv2d_bwd_data(&y, &w, &zero_stride, &mut poisoned(&be, g.input_shape()));
    assert!(matches!(e, Err(TensorError::InvalidArgument { .. })));
    let huge_pad = Conv2dGeometry {
        pad_left: usize::MAX,
        ..g
    };
    assert!(ops::conv2d(&x, &w, &b, &huge_pad, &mut y, Default::default()).is_err());
}

/// A `(height, width)` pair.
type Pair = (usize, usize);

/// `lax.conv_transpose(x, w, strides, padding, rhs_dilation)` (NHWC, HWIO, no kernel flip)
/// computed directly from lax's definition: the input spread out by the strides, padded by
/// `pads[axis] = (before, after)`, cross-correlated with `w` (dilated).
fn naive_conv_transpose(
    x: &[f32],
    [n, h, w, c]: [usize; 4],
    k: &[f32],
    [kh, kw, co]: [usize; 3],
    (s, d, pads): (Pair, Pair, [Pair; 2]),
) -> (Vec<f64>, [usize; 2]) {
    let ext = |len: usize, k: usize, s: usize, d: usize, (a, b): (usize, usize)| {
        (len - 1) * s + 1 + a + b - ((k - 1) * d + 1) + 1
    };
    let (oh, ow) = (ext(h, kh, s.0, d.0, pads[0]), ext(w, kw, s.1, d.1, pads[1]));
    // the spread-out, padded input's row p holds x row (p - a) / s when that divides
    let src = |p: usize, a: usize, s: usize, len: usize| {
        let q = p.checked_sub(a)?;
        (q % s == 0 && q / s < len).then_some(q / s)
    };
    let mut y = vec![0f64; n * oh * ow * co];
    for i in 0..n {
        for yy in 0..oh {
            for xx in 0..ow {
                for ky in 0..kh {
                    let Some(iy) = src(yy + ky * d.0, pads[0].0, s.0, h) else {
                        continue;
                    };
                    for kx in 0..kw {
                        let Some(ix) = src(xx + kx * d.1, pads[1].0, s.1, w) else {
                            continue;
                        };
                        for ch in 0..c {
                            let xv = f64::from(x[((i * h + iy) * w + ix) * c + ch]);
                            for o in 0..co {
                                let wv = f64::from(k[((ky * kw + kx) * c + ch) * co + o]);
                                y[((i * oh + yy) * ow + xx) * co + o] += xv * wv;
                            }
                        }
                    }
                }
            }
        }
    }
    (y, [oh, ow])
}

/// A transposed convolution run as the backward-data pass of its geometry
/// ([`Conv2dGeometry::transposed`]) equals lax's definition, for SAME (`_conv_transpose_padding`
/// with the dilated kernel), VALID and explicit padding, strides above and below the kernel
/// size, and dilation.
#[test]
fn transposed_conv_is_lax_conv_transpose() {
    let be = backend();
    let mut r = rng(9);
    // lax's SAME and VALID pads for dilated kernel size k and stride s
    let same = |k: usize, s: usize| {
        let len = k + s - 2;
        let a = if s > k - 1 { k - 1 } else { len.div_ceil(2) };
        (a, len - a)
    };
    let valid = |k: usize, s: usize| (k - 1, s - 1 + k.saturating_sub(s));
    let cases: [([usize; 4], [usize; 3], Pair, Pair); 4] = [
        ([2, 4, 3, 3], [3, 3, 2], (2, 2), (1, 1)),
        ([1, 3, 5, 2], [2, 3, 3], (3, 1), (1, 2)),
        ([1, 2, 2, 1], [1, 1, 2], (2, 3), (1, 1)),
        ([2, 5, 4, 2], [3, 2, 1], (1, 2), (2, 1)),
    ];
    for (xd, [kh, kw, co], s, d) in cases {
        let (ke_h, ke_w) = ((kh - 1) * d.0 + 1, (kw - 1) * d.1 + 1);
        // explicit pads within what the mapping supports (before <= k - 1)
        let explicit = [(1.min(ke_h - 1), 0), (0, 1)];
        let modes = [
            (Padding::Same, [same(ke_h, s.0), same(ke_w, s.1)]),
            (Padding::Valid, [valid(ke_h, s.0), valid(ke_w, s.1)]),
            (Padding::Explicit(explicit), explicit),
        ];
        for (padding, pads) in modes {
            let spec = ConvSpec {
                strides: s,
                padding,
                dilation: d,
                ..ConvSpec::default()
            };
            let w_shape = [kh, kw, xd[3], co];
            let g = Conv2dGeometry::transposed(&xd.into(), &w_shape.into(), &spec).unwrap();
            let (x, xv) = random(&be, &mut r, xd.into());
            let (w, wv) = random(&be, &mut r, w_shape.into());
            let (want, [oh, ow]) = naive_conv_transpose(&xv, xd, &wv, [kh, kw, co], (s, d, pads));
            assert_eq!(
                g.input_shape(),
                crate::Shape::new([xd[0], oh, ow, co]),
                "{g:?}"
            );
            let mut y = poisoned(&be, g.input_shape());
            ops::conv2d_bwd_data(&x, &w, &g, &mut y).unwrap();
            let what = format!("conv_transpose {padding} {xd:?} {w_shape:?} s {s:?} d {d:?}");
            assert_close(&y.to_vec().unwrap(), &want, 1e-4, 1e-5, &what);
        }
    }
}
