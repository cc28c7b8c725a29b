use super::*;

fn geo(x: [usize; 4], w: [usize; 4], s: (usize, usize), p: Padding) -> Conv2dGeometry {
    Conv2dGeometry::new(&x.into(), &w.into(), s, p).unwrap()
}

#[test]
fn same_padding_matches_lax() {
    let g = geo([1, 200, 200, 3], [3, 3, 3, 64], (1, 1), Padding::Same);
    assert_eq!(
        (g.out_h, g.out_w, g.pad_top, g.pad_bottom),
        (200, 200, 1, 1)
    );
    // stride 2 on an even input: out 4, total pad (4-1)*2+3-8 = 1 -> (0, 1)
    let g = geo([1, 8, 8, 1], [3, 3, 1, 1], (2, 2), Padding::Same);
    assert_eq!((g.out_h, g.pad_top, g.pad_bottom), (4, 0, 1));
    let g = geo([1, 5, 5, 1], [2, 2, 1, 1], (1, 1), Padding::Same);
    assert_eq!((g.out_h, g.pad_top, g.pad_bottom), (5, 0, 1));
}

#[test]
fn valid_padding() {
    let g = geo([2, 7, 6, 1], [3, 2, 1, 4], (2, 1), Padding::Valid);
    assert_eq!(g.output_shape(), Shape::new([2, 3, 5, 4]));
    let e = Conv2dGeometry::new(
        &[1, 2, 2, 1].into(),
        &[3, 3, 1, 1].into(),
        (1, 1),
        Padding::Valid,
    );
    assert!(matches!(e, Err(TensorError::InvalidArgument { .. })));
}

#[test]
fn channel_mismatch_names_the_kernel() {
    let e = Conv2dGeometry::new(
        &[1, 4, 4, 3].into(),
        &[3, 3, 4, 64].into(),
        (1, 1),
        Padding::Same,
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "conv2d: input has 3 channels but the kernel expects 4 (HWIO [3, 3, 4, 64]) (got [1, 4, 4, 3])"
    );
}

/// `lax.conv_general_dilated` shapes, checked against JAX 0.10.2 (`jax.eval_shape`).
#[test]
fn dilation_explicit_padding_and_nchw_match_lax() {
    // x NCHW [2, 3, 9, 8], w OIHW [4, 3, 3, 2], strides (2, 1), dilation (2, 3), SAME:
    // dilated kernel 5x4, out (5, 8), pads h: (5-1)*2+5-9 = 4 -> (2, 2), w: 7+4-8 = 3 -> (1, 2)
    let spec = ConvSpec {
        strides: (2, 1),
        padding: Padding::Same,
        dilation: (2, 3),
        layout: Layout::Nchw,
        filter: FilterLayout::Oihw,
    };
    let g = Conv2dGeometry::with_spec(&[2, 3, 9, 8].into(), &[4, 3, 3, 2].into(), &spec).unwrap();
    assert_eq!(g.output_shape(), Shape::new([2, 4, 5, 8]));
    assert_eq!(
        (g.pad_top, g.pad_bottom, g.pad_left, g.pad_right),
        (2, 2, 1, 2)
    );
    assert_eq!(g.dilated_kernel(), (5, 4));
    assert_eq!(g.filter_shape(), Shape::new([4, 3, 3, 2]));
    // explicit [(1, 0), (2, 3)] on 7x6 with a 3x3 kernel, stride 2: (1+7-3)/2+1 = 3, (11-3)/2+1 = 5
    let spec = ConvSpec {
        strides: (2, 2),
        padding: Padding::Explicit([(1, 0), (2, 3)]),
        ..ConvSpec::default()
    };
    let g = Conv2dGeometry::with_spec(&[1, 7, 6, 2].into(), &[3, 3, 2, 5].into(), &spec).unwrap();
    assert_eq!(g.output_shape(), Shape::new([1, 3, 5, 5]));
    let zero = ConvSpec {
        dilation: (0, 1),
        ..spec
    };
    let e = Conv2dGeometry::with_spec(&[1, 7, 6, 2].into(), &[3, 3, 2, 5].into(), &zero);
    assert!(matches!(e, Err(TensorError::InvalidArgument { .. })));
}

/// `lax.conv_transpose` output shapes (`conv_transpose_shape_tuple`), checked against JAX
/// 0.10.2: SAME gives `in · s`, VALID `in · s + max(k - s, 0)`.
#[test]
fn transposed_shapes_match_lax() {
    let t = |x: [usize; 4], w: [usize; 4], s: (usize, usize), p: Padding| {
        let spec = ConvSpec {
            strides: s,
            padding: p,
            ..ConvSpec::default()
        };
        Conv2dGeometry::transposed(&x.into(), &w.into(), &spec).unwrap()
    };
    let g = t([2, 5, 4, 3], [3, 3, 3, 6], (2, 2), Padding::Same);
    assert_eq!(g.input_shape(), Shape::new([2, 10, 8, 6]));
    assert_eq!((g.c_in, g.c_out, g.out_h, g.out_w), (6, 3, 5, 4));
    assert_eq!(g.filter, FilterLayout::TransposedHwio);
    let g = t([1, 5, 4, 2], [3, 2, 2, 1], (2, 3), Padding::Valid);
    // 5*2 + max(3-2, 0) = 11, 4*3 + max(2-3, 0) = 12
    assert_eq!(g.input_shape(), Shape::new([1, 11, 12, 1]));
    let g = t([1, 3, 3, 1], [1, 1, 1, 1], (2, 2), Padding::Same);
    assert_eq!(g.input_shape(), Shape::new([1, 6, 6, 1]));
    // explicit pads of the spread-out input: (3-1)*2 - 3 + 2 + 1 + 2 = 6
    let g = t(
        [1, 3, 3, 1],
        [3, 3, 1, 1],
        (2, 2),
        Padding::Explicit([(1, 2), (0, 0)]),
    );
    assert_eq!((g.h, g.w), (6, 3));
    let spec = ConvSpec {
        padding: Padding::Explicit([(3, 0), (0, 0)]),
        ..ConvSpec::default()
    };
    let e = Conv2dGeometry::transposed(&[1, 3, 3, 1].into(), &[3, 3, 1, 1].into(), &spec);
    assert!(
        matches!(e, Err(TensorError::InvalidArgument { .. })),
        "{e:?}"
    );
}
