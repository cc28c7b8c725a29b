//! Per-channel ops: batch normalization, and a bias along a channel axis that is not the last
//! (an NCHW convolution's).

use crate::backend::{BatchNorm, BatchNormBwd, ChannelBiasAdd, ChannelBiasGrad, NormStats};
use crate::{ChannelGeometry, Checked, Shape, Tensor, TensorError};

use super::{F32, FLOATS, backend_of, input, output, supports};
use crate::DType;

/// Batch normalization's optional scale and shift, `[c]` each (stax's `scale` and `center`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Affine<'a> {
    /// The scale `gamma`, if any.
    pub gamma: Option<&'a Tensor>,
    /// The shift `beta`, if any.
    pub beta: Option<&'a Tensor>,
}

/// What [`batch_norm`] saved for [`batch_norm_bwd`]: the per-channel mean and `1 / sqrt(var +
/// eps)` (`[c]`), and a fused ReLU's mask.
#[derive(Debug, Clone, Copy)]
pub struct NormSaved<'a> {
    /// The mean.
    pub mean: &'a Tensor,
    /// `1 / sqrt(var + eps)`.
    pub rstd: &'a Tensor,
    /// The fused ReLU's mask, if any.
    pub relu: Option<&'a Tensor>,
}

/// The gradients [`batch_norm_bwd`] writes, each if wanted (`[c]`).
#[derive(Debug, Default)]
pub struct AffineGrads<'a> {
    /// The scale's gradient (f32).
    pub dgamma: Option<&'a mut Tensor>,
    /// The shift's gradient (f32).
    pub dbeta: Option<&'a mut Tensor>,
    /// The per-channel sums of the input gradient, in its dtype (summed in f64 over the values
    /// written, rounded once): the gradient of a bias added to the norm's input along its
    /// channels (a conv's before the norm), computed where the backend can in the pass that
    /// writes the input gradient, one pass over it fewer. Needs `need_dx`.
    pub dx_sum: Option<&'a mut Tensor>,
}

fn check_view(op: &'static str, g: &ChannelGeometry, x: &Tensor) -> Result<(), TensorError> {
    if x.numel() != g.numel() || g.per_channel() == 0 || g.c == 0 {
        return Err(TensorError::Shape {
            op,
            reason: format!("expected a non-empty view {g:?}"),
            got: x.shape().clone(),
        });
    }
    Ok(())
}

/// Batch normalization forward (stax's `BatchNorm`, `jax.nn.standardize` with its one-pass
/// variance `max(E[x²] - E[x]², 0)`): x and y of `g`'s view (same shape), gamma and beta
/// `[g.c]` when given, mean and rstd `[g.c]` (overwritten with the per-channel mean and
/// `1 / sqrt(var + eps)`). x and y of one float dtype (bf16 and f16 read as f32, y rounded
/// once, as PyTorch's batch norm takes half-precision inputs with f32 parameters); gamma, beta,
/// mean and rstd f32. Statistics accumulate in f64. With `relu` (a mask of
/// `ceil(numel / 32)` U32 words), a ReLU follows in place and its mask is written (the fused
/// pair `BatchNorm Relu`).
///
/// # Errors
/// [`TensorError::InvalidArgument`] for a negative or non-finite `eps`; shape (an empty view
/// or one that does not fit `x`), dtype, device and alias errors; workspace and kernel errors.
pub fn batch_norm(
    x: &Tensor,
    g: &ChannelGeometry,
    eps: f32,
    affine: Affine<'_>,
    y: &mut Tensor,
    (mean, rstd): (&mut Tensor, &mut Tensor),
    relu: Option<&mut Tensor>,
) -> Result<(), TensorError> {
    let stats = NormStats::Computed { mean, rstd };
    forward(("batch_norm", x, g, eps), affine, (y, None), stats, relu)
}

/// [`batch_norm`] (with `add`: [`batch_norm_add_relu`]) with the statistics `(mean, rstd)`
/// given rather than computed: those [`batch_norm`] wrote for the same `x` (a rematerialized
/// norm's forward pass run again, one pass over `x` fewer), so `y` and the mask are bit for bit
/// the first run's.
///
/// # Errors
/// As [`batch_norm_add_relu`] (mean and rstd f32 `[g.c]`, read);
/// [`TensorError::InvalidArgument`] for an `add` without a ReLU.
pub fn batch_norm_given(
    x: &Tensor,
    g: &ChannelGeometry,
    affine: Affine<'_>,
    (y, add): (&mut Tensor, Option<&Tensor>),
    (mean, rstd): (&Tensor, &Tensor),
    relu: Option<&mut Tensor>,
) -> Result<(), TensorError> {
    const OP: &str = "batch_norm_given";
    if add.is_some() && relu.is_none() {
        let reason = "an addend is added before a ReLU: give its mask".into();
        return Err(TensorError::InvalidArgument { op: OP, reason });
    }
    let stats = NormStats::Given { mean, rstd };
    forward((OP, x, g, 0.0), affine, (y, add), stats, relu)
}

/// [`batch_norm`] whose output is added to `add` (`x`'s shape and dtype) before a ReLU: `y =
/// relu(batch_norm(x) + add)`, `relu` receiving its mask; bit for bit [`batch_norm`] then
/// [`super::binary_relu`] (the norm's output rounded to the dtype, then the sum rounded), in
/// one pass where the backend fuses them (a ResNet block's last `BatchNorm`, its `FanInSum`
/// and the ReLU after it).
///
/// # Errors
/// As [`batch_norm`]; shape, dtype and device errors of `add`.
pub fn batch_norm_add_relu(
    x: &Tensor,
    g: &ChannelGeometry,
    eps: f32,
    affine: Affine<'_>,
    (y, add): (&mut Tensor, &Tensor),
    (mean, rstd): (&mut Tensor, &mut Tensor),
    relu: &mut Tensor,
) -> Result<(), TensorError> {
    let op = "batch_norm_add_relu";
    let stats = NormStats::Computed { mean, rstd };
    forward((op, x, g, eps), affine, (y, Some(add)), stats, Some(relu))
}

/// The checks and call of [`batch_norm`] and [`batch_norm_add_relu`].
fn forward(
    (op, x, g, eps): (&'static str, &Tensor, &ChannelGeometry, f32),
    affine: Affine<'_>,
    (y, add): (&mut Tensor, Option<&Tensor>),
    stats: NormStats<'_>,
    relu: Option<&mut Tensor>,
) -> Result<(), TensorError> {
    let be = backend_of(x);
    supports(op, x.dtype(), FLOATS)?;
    check_view(op, g, x)?;
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(TensorError::InvalidArgument {
            op,
            reason: format!("epsilon must be finite and non-negative, got {eps}"),
        });
    }
    input(op, &be, x, "x", x.dtype(), None)?;
    let c = Shape::new([g.c]);
    for p in [affine.gamma, affine.beta].into_iter().flatten() {
        input(op, &be, p, "gamma or beta", DType::F32, Some(&c))?;
    }
    output(op, &be, y, "y", x.dtype(), Some(x.shape()))?;
    if let Some(a) = add {
        input(op, &be, a, "add", x.dtype(), Some(x.shape()))?;
    }
    match &stats {
        NormStats::Computed { mean, rstd } => {
            output(op, &be, mean, "mean", DType::F32, Some(&c))?;
            output(op, &be, rstd, "rstd", DType::F32, Some(&c))?;
        }
        NormStats::Given { mean, rstd } => {
            input(op, &be, mean, "mean", DType::F32, Some(&c))?;
            input(op, &be, rstd, "rstd", DType::F32, Some(&c))?;
        }
    }
    if let Some(m) = &relu {
        super::mask(op, &be, m, x.numel())?;
        m.expect_unique(op)?;
    }
    let call = BatchNorm {
        g: *g,
        eps,
        x,
        gamma: affine.gamma,
        beta: affine.beta,
        y,
        stats,
        relu,
        add,
    };
    be.batch_norm(Checked::new(call))
}

/// Batch normalization backward from the forward input `x`, its `gamma` (if any) and what
/// [`batch_norm`] saved: `grads` receives `dgamma = sum dy · z` and `dbeta = sum dy` (`z = (x -
/// mean) · rstd`), and with `need_dx` the input gradient `gamma · rstd · (dy - mean(dy) - z ·
/// mean(dy · z))` overwrites `dy`; with a fused ReLU's mask, `dy` (the gradient after the
/// ReLU) is masked first (so it may be written even without `need_dx`), and `grads.dx_sum`
/// receives the input gradient's per-channel sums. x and dy of one float dtype, the rest f32
/// (as [`batch_norm`]); sums in f64.
///
/// # Errors
/// As [`batch_norm`].
pub fn batch_norm_bwd(
    x: &Tensor,
    g: &ChannelGeometry,
    gamma: Option<&Tensor>,
    saved: NormSaved<'_>,
    dy: &mut Tensor,
    need_dx: bool,
    grads: AffineGrads<'_>,
) -> Result<(), TensorError> {
    const OP: &str = "batch_norm_bwd";
    let be = backend_of(x);
    supports(OP, x.dtype(), FLOATS)?;
    check_view(OP, g, x)?;
    input(OP, &be, x, "x", x.dtype(), None)?;
    let c = Shape::new([g.c]);
    let NormSaved { mean, rstd, relu } = saved;
    for p in [gamma, Some(mean), Some(rstd)].into_iter().flatten() {
        input(OP, &be, p, "gamma, mean or rstd", DType::F32, Some(&c))?;
    }
    if let Some(m) = relu {
        super::mask(OP, &be, m, x.numel())?;
    }
    // dy is written with the input gradient, and (on some backends) masked by a fused ReLU
    match need_dx || relu.is_some() {
        true => output(OP, &be, dy, "dy", x.dtype(), Some(x.shape()))?,
        false => input(OP, &be, dy, "dy", x.dtype(), Some(x.shape()))?,
    }
    let AffineGrads {
        dgamma,
        dbeta,
        dx_sum,
    } = grads;
    for d in [&dgamma, &dbeta].into_iter().flatten() {
        output(OP, &be, d, "dgamma or dbeta", DType::F32, Some(&c))?;
    }
    if let Some(d) = &dx_sum {
        if !need_dx {
            let reason = "the sums of dx need dx (need_dx)".into();
            return Err(TensorError::InvalidArgument { op: OP, reason });
        }
        output(OP, &be, d, "dx_sum", x.dtype(), Some(&c))?;
    }
    let call = BatchNormBwd {
        g: *g,
        x,
        gamma,
        mean,
        rstd,
        relu,
        dy,
        need_dx,
        dgamma,
        dbeta,
        dx_sum,
    };
    be.batch_norm_bwd(Checked::new(call))
}

/// The view of `shape` with channel axis `axis`, or the error naming `op`.
fn channel_view(
    op: &'static str,
    shape: &Shape,
    axis: usize,
) -> Result<ChannelGeometry, TensorError> {
    ChannelGeometry::of(shape, axis..axis + 1).map_err(|_| TensorError::Shape {
        op,
        reason: format!("no channel axis {axis}"),
        got: shape.clone(),
    })
}

/// `y[.., j, ..] += b[j]` along `axis` of y (f32; `b` `[y.dims()[axis]]`): the bias of a
/// convolution or transposed convolution in any layout. On the last axis it is
/// [`super::bias_add`].
///
/// # Errors
/// Shape, dtype, device and alias errors; kernel errors.
pub fn bias_add_channels(y: &mut Tensor, b: &Tensor, axis: usize) -> Result<(), TensorError> {
    const OP: &str = "bias_add_channels";
    let g = channel_view(OP, y.shape(), axis)?;
    if g.inner == 1 {
        return super::bias_add(y, b);
    }
    let be = backend_of(y);
    supports(OP, y.dtype(), F32)?;
    output(OP, &be, y, "y", y.dtype(), None)?;
    input(OP, &be, b, "b", y.dtype(), Some(&Shape::new([g.c])))?;
    be.channel_bias_add(Checked::new(ChannelBiasAdd { g, y, b }))
}

/// `db[j] = sum of dy[.., j, ..]` over every axis but `axis` (f32, summed in f64; `db`
/// `[dy.dims()[axis]]`, overwritten). On the last axis it is [`super::bias_grad`].
///
/// # Errors
/// As [`bias_add_channels`]; workspace allocation errors.
pub fn bias_grad_channels(dy: &Tensor, db: &mut Tensor, axis: usize) -> Result<(), TensorError> {
    const OP: &str = "bias_grad_channels";
    let g = channel_view(OP, dy.shape(), axis)?;
    if g.inner == 1 {
        return super::bias_grad(dy, db);
    }
    let be = backend_of(dy);
    supports(OP, dy.dtype(), F32)?;
    input(OP, &be, dy, "dy", dy.dtype(), None)?;
    output(OP, &be, db, "db", dy.dtype(), Some(&Shape::new([g.c])))?;
    be.channel_bias_grad(Checked::new(ChannelBiasGrad { g, dy, db }))
}
