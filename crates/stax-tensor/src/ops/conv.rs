//! Convolutions and pooling.

use crate::backend::{Conv2d, Conv2dBwdData, Conv2dBwdFilter, MaxFrom, Pool2d, Pool2dBwd};
use crate::{
    Activation, Checked, Conv2dGeometry, DType, PoolKind, Saves, Shape, Tensor, TensorError,
};

use super::{FLOATS, backend_of, input, mask, output, supports};

/// What a forward convolution adds after the convolution and its bias: an activation, and
/// where it keeps its mask when it keeps one (training).
#[derive(Debug, Default)]
pub struct Epilogue<'a> {
    /// The activation, if any.
    pub act: Option<Activation>,
    /// Its mask (U32, `ceil(numel / 32)` words), for an activation that saves one.
    pub aux: Option<&'a mut Tensor>,
}

/// Checks an activation's saved tensor against the gradient it is applied to: a mask of
/// `numel` bits, or a tensor of the output's shape and dtype.
pub(super) fn check_saved(
    op: &'static str,
    act: Activation,
    saved: &Tensor,
    like: &Tensor,
) -> Result<(), TensorError> {
    let be = backend_of(like);
    act.check()?;
    match act.saves() {
        Saves::Mask => mask(op, &be, saved, like.numel()),
        Saves::Output | Saves::Input => {
            input(op, &be, saved, "saved", like.dtype(), Some(like.shape()))
        }
    }
}

/// Checks an activation's mask output: the activation keeps one, and it fits `y`.
pub(super) fn check_aux(
    op: &'static str,
    act: Option<Activation>,
    aux: &Tensor,
    y: &Tensor,
) -> Result<(), TensorError> {
    if act.is_none_or(|a| a.saves() != Saves::Mask) {
        return Err(TensorError::InvalidArgument {
            op,
            reason: format!("{act:?} keeps no mask"),
        });
    }
    mask(op, &backend_of(y), aux, y.numel())?;
    aux.expect_unique(op)
}

/// `y = act(conv(x, w) + b)`: x `g.input_shape()`, w `g.filter_shape()`, b `[c_out]` (`&b`,
/// or `None` for no bias), y `g.output_shape()`, all of one float dtype (accumulated in f32; cross-correlation with kernel dilation,
/// as `lax.conv_general_dilated`; layouts as `g` says). With `epi.act`, the activation runs in
/// the epilogue (fused by the backend where it can); `epi.aux` receives a ReLU's mask, or an
/// activation that saves its output reads `y` later.
///
/// # Errors
/// [`TensorError::InvalidArgument`] for an inconsistent geometry; shape, dtype
/// ([`TensorError::UnsupportedDType`] for U32), device and alias errors;
/// workspace allocation and library errors.
pub fn conv2d<'b>(
    x: &Tensor,
    w: &Tensor,
    b: impl Into<Option<&'b Tensor>>,
    g: &Conv2dGeometry,
    y: &mut Tensor,
    epi: Epilogue<'_>,
) -> Result<(), TensorError> {
    const OP: &str = "conv2d";
    g.validate(OP)?;
    let be = backend_of(x);
    supports(OP, x.dtype(), FLOATS)?;
    input(OP, &be, x, "x", x.dtype(), Some(&g.input_shape()))?;
    input(OP, &be, w, "w", x.dtype(), Some(&g.filter_shape()))?;
    let b = b.into();
    if let Some(b) = b {
        input(OP, &be, b, "b", x.dtype(), Some(&Shape::new([g.c_out])))?;
    }
    output(OP, &be, y, "y", x.dtype(), Some(&g.output_shape()))?;
    let Epilogue { act, aux } = epi;
    if let Some(m) = &aux {
        check_aux(OP, act, m, y)?;
    }
    let call = Conv2d {
        g: *g,
        x,
        w,
        b,
        y,
        act,
        aux,
    };
    be.conv2d(Checked::new(call))
}

/// `dx = conv_transpose(dy, w)`: dy `g.output_shape()`, w `g.filter_shape()`, dx
/// `g.input_shape()` (overwritten), one float dtype. A transposed convolution's forward pass is this op on
/// its geometry ([`Conv2dGeometry::transposed`]).
///
/// # Errors
/// As [`conv2d`].
pub fn conv2d_bwd_data(
    dy: &Tensor,
    w: &Tensor,
    g: &Conv2dGeometry,
    dx: &mut Tensor,
) -> Result<(), TensorError> {
    const OP: &str = "conv2d_bwd_data";
    g.validate(OP)?;
    let be = backend_of(dy);
    supports(OP, dy.dtype(), FLOATS)?;
    input(OP, &be, dy, "dy", dy.dtype(), Some(&g.output_shape()))?;
    input(OP, &be, w, "w", dy.dtype(), Some(&g.filter_shape()))?;
    output(OP, &be, dx, "dx", dy.dtype(), Some(&g.input_shape()))?;
    be.conv2d_bwd_data(Checked::new(Conv2dBwdData { g: *g, dy, w, dx }))
}

/// Kernel and bias gradients: dw `g.filter_shape()` and db `[c_out]` (`&mut db`, or `None`
/// for no bias; both overwritten), from x `g.input_shape()` and dy `g.output_shape()`, one float dtype.
/// With `act` (the forward epilogue's activation and what it saved), `dy` is first turned, in
/// place, into the gradient before that activation (fused with the bias gradient where the
/// backend can).
///
/// # Errors
/// As [`conv2d`].
pub fn conv2d_bwd_filter<'d>(
    x: &Tensor,
    dy: &mut Tensor,
    g: &Conv2dGeometry,
    dw: &mut Tensor,
    db: impl Into<Option<&'d mut Tensor>>,
    act: Option<(Activation, &Tensor)>,
) -> Result<(), TensorError> {
    let call = ("conv2d_bwd_filter", true);
    bwd_filter(x, dy, g, (dw, db.into()), act, call)
}

/// [`conv2d_bwd_filter`] for a caller that has no further use for `dy` (a network's first
/// layer, whose input gradient is not wanted): it is consumed, so the backend need not write
/// the gradient before `act` back (the direct kernels then read dy once, 512 MB less traffic
/// on the seed's conv1 in bf16). dw and db are the same bits as [`conv2d_bwd_filter`]'s. With
/// `act`, a `dy` whose buffer other handles share is first copied ([`Tensor::into_unique`]), so
/// they never see it masked.
///
/// # Errors
/// As [`conv2d`]; out of memory for that copy.
pub fn conv2d_bwd_filter_consuming<'d>(
    x: &Tensor,
    dy: Tensor,
    g: &Conv2dGeometry,
    dw: &mut Tensor,
    db: impl Into<Option<&'d mut Tensor>>,
    act: Option<(Activation, &Tensor)>,
) -> Result<(), TensorError> {
    let mut dy = match act {
        Some(_) => dy.into_unique()?,
        None => dy,
    };
    let call = ("conv2d_bwd_filter_consuming", false);
    bwd_filter(x, &mut dy, g, (dw, db.into()), act, call)
}

fn bwd_filter(
    x: &Tensor,
    dy: &mut Tensor,
    g: &Conv2dGeometry,
    (dw, db): (&mut Tensor, Option<&mut Tensor>),
    act: Option<(Activation, &Tensor)>,
    (op, keep_dy): (&'static str, bool),
) -> Result<(), TensorError> {
    g.validate(op)?;
    let be = backend_of(x);
    supports(op, x.dtype(), FLOATS)?;
    input(op, &be, x, "x", x.dtype(), Some(&g.input_shape()))?;
    input(op, &be, dy, "dy", x.dtype(), Some(&g.output_shape()))?;
    output(op, &be, dw, "dw", x.dtype(), Some(&g.filter_shape()))?;
    if let Some(db) = &db {
        output(op, &be, db, "db", x.dtype(), Some(&Shape::new([g.c_out])))?;
    }
    if let Some((a, saved)) = act {
        check_saved(op, a, saved, dy)?;
        dy.expect_unique(op).map_err(|e| e.for_operand("dy"))?;
    }
    let call = Conv2dBwdFilter {
        g: *g,
        x,
        dy,
        dw,
        db,
        act,
        keep_dy,
    };
    be.conv2d_bwd_filter(Checked::new(call))
}

/// A 2-D pooling of `kind`: x NHWC `g.input_shape()`, y NHWC `g.output_shape()` (window
/// `g.kh x g.kw`, `g.c_out == g.c_in`, no dilation), one float dtype.
///
/// # Errors
/// As [`conv2d`]; [`TensorError::InvalidArgument`] when `c_out != c_in`, or for a window
/// wholly in the padding of a max or average pooling ([`check_pool_padding`]).
pub fn pool2d(
    kind: PoolKind,
    g: &Conv2dGeometry,
    x: &Tensor,
    y: &mut Tensor,
) -> Result<(), TensorError> {
    pool_forward(kind, g, x, y, None)
}

/// Max pooling as [`pool2d`], also writing each window's argmax: `arg` (u32
/// `g.output_shape()`) gets the window offset `ky · kw + kx` of the window's first maximum in
/// window order, what [`max_pool2d_bwd_argmax`] reads instead of `x` (a quarter of an f32
/// input's bytes under a 3x3 window of stride 2).
///
/// # Errors
/// As [`pool2d`]; [`TensorError::DType`] or [`TensorError::Shape`] for `arg`.
pub fn max_pool2d_argmax(
    g: &Conv2dGeometry,
    x: &Tensor,
    y: &mut Tensor,
    arg: &mut Tensor,
) -> Result<(), TensorError> {
    pool_forward(PoolKind::Max, g, x, y, Some(arg))
}

fn pool_forward(
    kind: PoolKind,
    g: &Conv2dGeometry,
    x: &Tensor,
    y: &mut Tensor,
    argmax: Option<&mut Tensor>,
) -> Result<(), TensorError> {
    const OP: &str = "pool2d";
    check_pool(OP, kind, g)?;
    let be = backend_of(x);
    supports(OP, x.dtype(), FLOATS)?;
    input(OP, &be, x, "x", x.dtype(), Some(&g.input_shape()))?;
    output(OP, &be, y, "y", x.dtype(), Some(&g.output_shape()))?;
    if let Some(arg) = &argmax {
        output(OP, &be, arg, "argmax", DType::U32, Some(&g.output_shape()))?;
    }
    let call = Pool2d {
        kind,
        g: *g,
        x,
        y,
        argmax,
    };
    be.pool2d(Checked::new(call))
}

/// Refuses a max or average pooling with a window wholly in the padding: there JAX's
/// `MaxPool` gives -inf and `AvgPool` 0/0 = NaN (its divisor counts in-image positions).
/// Sum pooling's such windows are 0, and allowed.
///
/// # Errors
/// [`TensorError::InvalidArgument`] naming the first such window's output row or column.
pub fn check_pool_padding(
    op: &'static str,
    kind: PoolKind,
    g: &Conv2dGeometry,
) -> Result<(), TensorError> {
    match g.window_in_padding() {
        Some((axis, o)) if kind != PoolKind::Sum => Err(TensorError::InvalidArgument {
            op,
            reason: format!(
                "the window of output {axis} {o} lies wholly in the padding (pad top {}, \
                 bottom {}, left {}, right {}; window {}x{}): {} has no value there",
                g.pad_top,
                g.pad_bottom,
                g.pad_left,
                g.pad_right,
                g.kh,
                g.kw,
                kind.name()
            ),
        }),
        _ => Ok(()),
    }
}

/// A pooling's input gradient: dx NHWC `g.input_shape()` (overwritten) from dy NHWC
/// `g.output_shape()` and, for max pooling, the forward input `x` (sum and average pooling
/// need none: their gradient depends on the shapes alone), one float dtype.
///
/// # Errors
/// As [`pool2d`]; [`TensorError::InvalidArgument`] for max pooling without `x`.
pub fn pool2d_bwd(
    kind: PoolKind,
    g: &Conv2dGeometry,
    x: Option<&Tensor>,
    dy: &Tensor,
    dx: &mut Tensor,
) -> Result<(), TensorError> {
    pool_backward(kind, g, x.map(MaxFrom::Input), dy, dx)
}

/// Max pooling's input gradient as [`pool2d_bwd`], from the argmax offsets `arg` (u32
/// `g.output_shape()`) that [`max_pool2d_argmax`] wrote instead of the forward input: each
/// window's gradient goes to its first maximum, summed where windows overlap.
///
/// # Errors
/// As [`pool2d_bwd`]; [`TensorError::DType`] or [`TensorError::Shape`] for `arg`.
pub fn max_pool2d_bwd_argmax(
    g: &Conv2dGeometry,
    arg: &Tensor,
    dy: &Tensor,
    dx: &mut Tensor,
) -> Result<(), TensorError> {
    pool_backward(PoolKind::Max, g, Some(MaxFrom::Argmax(arg)), dy, dx)
}

fn pool_backward(
    kind: PoolKind,
    g: &Conv2dGeometry,
    from: Option<MaxFrom<'_>>,
    dy: &Tensor,
    dx: &mut Tensor,
) -> Result<(), TensorError> {
    const OP: &str = "pool2d_bwd";
    check_pool(OP, kind, g)?;
    let be = backend_of(dy);
    supports(OP, dy.dtype(), FLOATS)?;
    let from = from.filter(|_| kind == PoolKind::Max);
    match from {
        Some(MaxFrom::Input(x)) => input(OP, &be, x, "x", dy.dtype(), Some(&g.input_shape()))?,
        Some(MaxFrom::Argmax(a)) => {
            input(OP, &be, a, "argmax", DType::U32, Some(&g.output_shape()))?
        }
        None if kind == PoolKind::Max => {
            return Err(TensorError::InvalidArgument {
                op: OP,
                reason: "max pooling's gradient reads the forward input or its argmax".into(),
            });
        }
        None => {}
    }
    input(OP, &be, dy, "dy", dy.dtype(), Some(&g.output_shape()))?;
    output(OP, &be, dx, "dx", dy.dtype(), Some(&g.input_shape()))?;
    be.pool2d_bwd(Checked::new(Pool2dBwd {
        kind,
        g: *g,
        from,
        dy,
        dx,
    }))
}

fn check_pool(op: &'static str, kind: PoolKind, g: &Conv2dGeometry) -> Result<(), TensorError> {
    g.validate(op)?;
    check_pool_padding(op, kind, g)?;
    if g.c_out != g.c_in {
        return Err(TensorError::InvalidArgument {
            op,
            reason: format!("a pooling keeps its {} channels, not {}", g.c_in, g.c_out),
        });
    }
    if g.canonical() != *g || (g.dilation_h, g.dilation_w) != (1, 1) {
        return Err(TensorError::InvalidArgument {
            op,
            reason: format!(
                "pooling is NHWC without dilation, not {} with dilation ({}, {})",
                g.layout, g.dilation_h, g.dilation_w
            ),
        });
    }
    Ok(())
}
