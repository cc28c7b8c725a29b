//! Softmax and log-softmax over an axis, the losses with integer labels, and dropout.

use crate::backend::{AxisDims, Dropout, DropoutBwd, IndexLossCall, Softmax, SoftmaxBwd};
use crate::{Checked, DType, IndexLoss, Shape, SoftmaxKind, Tensor, TensorError, class_dims};

use super::{F32, FLOATS, backend_of, input, loss_operands, mask, output, supports};

/// `t`'s shape seen around `axis` (`< rank`).
fn axis_dims(op: &'static str, shape: &Shape, axis: usize) -> Result<AxisDims, TensorError> {
    let d = shape.dims();
    if axis >= d.len() {
        return Err(TensorError::InvalidArgument {
            op,
            reason: format!("axis {axis} is out of range for {shape}"),
        });
    }
    Ok(AxisDims {
        outer: d[..axis].iter().product(),
        len: d[axis],
        inner: d[axis + 1..].iter().product(),
    })
}

/// In place `y = softmax(y)` or `log_softmax(y)` along `axis` (`jax.nn.softmax(x, axis)`,
/// `jax.nn.log_softmax(x, axis)`: the axis' maximum subtracted first, so large inputs stay
/// finite), any shape, any float dtype; each row is computed in f64 and rounded once.
///
/// ```
/// use stax_tensor::{ops, BackendOptions, Category, Device, SoftmaxKind, Tensor};
/// let cpu = Device::Cpu.open(&BackendOptions::default())?;
/// let mut y = Tensor::from_slice(&cpu, &[0.0, 0.0, 1000.0, 1000.0], [2, 2], Category::Other)?;
/// ops::softmax(SoftmaxKind::Softmax, 1, &mut y)?;
/// assert_eq!(y.to_vec()?, vec![0.5; 4]);
/// # Ok::<(), stax_tensor::TensorError>(())
/// ```
///
/// # Errors
/// [`TensorError::InvalidArgument`] for an axis out of range; dtype, device and alias errors.
pub fn softmax(kind: SoftmaxKind, axis: usize, y: &mut Tensor) -> Result<(), TensorError> {
    const OP: &str = "softmax";
    let be = backend_of(y);
    supports(OP, y.dtype(), FLOATS)?;
    output(OP, &be, y, "y", y.dtype(), None)?;
    let dims = axis_dims(OP, y.shape(), axis)?;
    be.softmax(Checked::new(Softmax { kind, dims, y }))
}

/// In place `dy = dL/dx` of [`softmax`] along `axis`, from its output `y` (`dy`'s shape and
/// dtype): `y (dy - sum(y dy))` for the softmax, `dy - exp(y) sum(dy)` for the log-softmax.
///
/// # Errors
/// As [`softmax`]; shape errors for `y`.
pub fn softmax_bwd(
    kind: SoftmaxKind,
    axis: usize,
    y: &Tensor,
    dy: &mut Tensor,
) -> Result<(), TensorError> {
    const OP: &str = "softmax_bwd";
    let be = backend_of(dy);
    supports(OP, dy.dtype(), FLOATS)?;
    output(OP, &be, dy, "dy", dy.dtype(), None)?;
    input(OP, &be, y, "y", dy.dtype(), Some(dy.shape()))?;
    let dims = axis_dims(OP, dy.shape(), axis)?;
    be.softmax_bwd(Checked::new(SoftmaxBwd { kind, dims, y, dy }))
}

/// A loss with integer labels, fused with its gradient: model outputs `[n, k]` f32, labels
/// `[n]` u32 class indices. Returns the mean over rows of the per-row loss and writes
/// `dlogits` (`[n, k]`), the gradient of that mean ([`IndexLoss`] gives both formulas):
/// `jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))`, or stax's
/// examples' `-jnp.mean(jnp.sum(logp * one_hot(labels), 1))`. Rows are computed in f64.
///
/// ```
/// use stax_tensor::{ops, BackendOptions, Category, DType, Device, IndexLoss, Tensor};
/// let cpu = Device::Cpu.open(&BackendOptions::default())?;
/// let logp = Tensor::from_slice(&cpu, &[-0.5, -1.0, -2.0, -0.25], [2, 2], Category::Other)?;
/// let mut labels = Tensor::empty(&cpu, [2], DType::U32, Category::Input)?;
/// ops::upload(bytemuck::cast_slice(&[1u32, 0]), &mut labels)?;
/// let mut d = Tensor::empty(&cpu, [2, 2], DType::F32, Category::Gradient)?;
/// let loss = ops::index_loss(IndexLoss::NegLogLikelihood, &logp, &labels, &mut d)?;
/// assert_eq!(loss, 1.5);
/// assert_eq!(d.to_vec()?, vec![0.0, -0.5, -0.5, 0.0]);
/// # Ok::<(), stax_tensor::TensorError>(())
/// ```
///
/// # Errors
/// [`TensorError::InvalidArgument`] for a label `>= k` (optax returns NaN for it, silently)
/// and for no rows or classes; shape, dtype, device and alias errors.
pub fn index_loss(
    loss: IndexLoss,
    logits: &Tensor,
    labels: &Tensor,
    dlogits: &mut Tensor,
) -> Result<f32, TensorError> {
    const OP: &str = "index_loss";
    let be = backend_of(logits);
    supports(OP, logits.dtype(), F32)?;
    let (rows, classes) = class_dims(OP, logits.shape())?;
    let label_shape = Shape::new([rows]);
    loss_operands(OP, [logits, labels, dlogits], (DType::U32, &label_shape))?;
    let call = IndexLossCall {
        loss,
        rows,
        classes,
        logits,
        labels,
        dlogits,
    };
    be.index_loss(Checked::new(call))
}

/// The error of a row whose label is out of range (shared by the backends).
pub fn label_out_of_range(row: usize, label: u32, classes: usize) -> TensorError {
    TensorError::InvalidArgument {
        op: "index_loss",
        reason: format!("label {label} of row {row} is out of range for {classes} classes"),
    }
}

/// The random bits of element `index` under `key`: the high 32 bits of output `index + 1` of
/// SplitMix64 seeded with `key` (Steele, Lea & Flood 2014; `java.util.SplittableRandom`).
/// Counter-based, so each element's bits are computed on their own, identically on the CPU,
/// in `kernels/activation.cu` and in `scripts/jax_fixtures.py`.
///
/// ```
/// // SplitMix64 from seed 0 starts 0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4
/// assert_eq!(stax_tensor::ops::dropout_bits(0, 0), 0xe220_a839);
/// assert_eq!(stax_tensor::ops::dropout_bits(0, 1), 0x6e78_9e6a);
/// ```
pub fn dropout_bits(key: u64, index: u64) -> u32 {
    let z = key.wrapping_add(index.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    (mix64(z) >> 32) as u32
}

/// SplitMix64's output function (Stafford's "Mix13" variant of MurmurHash3's finalizer): a
/// bijection of `u64` whose every output bit depends on every input bit.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// An element is kept when its [`dropout_bits`] are below `floor(rate · 2^32)`: with
/// probability `rate` (all of them for `rate = 1`).
pub fn keep_threshold(rate: f32) -> u64 {
    (f64::from(rate) * 4_294_967_296.0) as u64
}

/// Checks a keep rate: in (0, 1] (stax's `Dropout(rate)`: the KEEP probability).
///
/// # Errors
/// [`TensorError::InvalidArgument`] otherwise.
pub fn check_keep_rate(op: &'static str, rate: f32) -> Result<(), TensorError> {
    if rate > 0.0 && rate <= 1.0 {
        return Ok(());
    }
    Err(TensorError::InvalidArgument {
        op,
        reason: format!("the keep rate {rate} is not in (0, 1]"),
    })
}

/// In place stax's dropout in training mode, `jnp.where(keep, y / rate, 0)`, any shape and
/// float dtype: element `i` is kept when [`dropout_bits`]`(key, i)` is below
/// [`keep_threshold`]`(rate)` (a Bernoulli(`rate`) draw), and bit `i % 32` of word `i / 32` of
/// `mask` (U32, `ceil(numel / 32)` words; the bits past `numel` clear) records it.
///
/// # Errors
/// [`TensorError::InvalidArgument`] for a rate outside (0, 1]; mask shape, dtype, device and
/// alias errors.
pub fn dropout(rate: f32, key: u64, y: &mut Tensor, m: &mut Tensor) -> Result<(), TensorError> {
    const OP: &str = "dropout";
    let be = backend_of(y);
    check_keep_rate(OP, rate)?;
    supports(OP, y.dtype(), FLOATS)?;
    output(OP, &be, y, "y", y.dtype(), None)?;
    mask(OP, &be, m, y.numel())?;
    m.expect_unique(OP)?;
    let threshold = keep_threshold(rate);
    let call = Dropout {
        rate,
        threshold,
        key,
        y,
        mask: m,
    };
    be.dropout(Checked::new(call))
}

/// In place `dy = keep ? dy / rate : 0` from [`dropout`]'s mask: its backward pass.
///
/// # Errors
/// As [`dropout`].
pub fn dropout_bwd(rate: f32, m: &Tensor, dy: &mut Tensor) -> Result<(), TensorError> {
    const OP: &str = "dropout_bwd";
    let be = backend_of(dy);
    check_keep_rate(OP, rate)?;
    supports(OP, dy.dtype(), FLOATS)?;
    output(OP, &be, dy, "dy", dy.dtype(), None)?;
    mask(OP, &be, m, dy.numel())?;
    be.dropout_bwd(Checked::new(DropoutBwd { rate, mask: m, dy }))
}
