//! Op descriptions: the values the CPU, CUDA and planning backends all consume.
//!
//! An [`OpDesc`] says what one op call computes, as far as its memory goes: the backends size
//! its workspace from it ([`crate::Backend::workspace_schedule`]), the planner replays that
//! schedule, and the op itself allocates by it ([`crate::backend::Scratch`]). The enums here
//! ([`Activation`], [`BinaryOp`]) are the op codes the elementwise kernels switch on.

use crate::{Conv2dGeometry, DType, IndexLoss, Shape, SoftmaxKind, TensorError, scalar};

/// An elementwise activation function (stax's `elementwise(fun)` layers).
///
/// A new activation is one variant here, its formulas ([`Activation::apply`],
/// [`Activation::grad`]) and one case in each switch of `kernels/activation.cu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Activation {
    /// `jax.nn.relu`: `max(x, 0)`, NaN propagated as `jnp.maximum` does; gradient
    /// `select(x > 0, g, 0)` (relu'(0) = 0), read from a bit mask.
    Relu,
    /// `jnp.tanh`; gradient `g (1 - y²)` from the output `y`.
    Tanh,
    /// `jnp.exp`; gradient `g y` from the output.
    Exp,
    /// `jax.nn.softplus` = `logaddexp(x, 0)`; gradient `g sigmoid(x) = g (1 - exp(-y))` from
    /// the output.
    Softplus,
    /// `jax.nn.sigmoid` (`lax.logistic`); gradient `g y (1 - y)` from the output, as JAX's.
    Sigmoid,
    /// `jax.nn.elu(x, alpha)`: `x` if `x > 0` else `alpha · expm1(x)` (stax's `Elu`: alpha 1);
    /// gradient `g` where `y > 0`, else `g (y + alpha)`, from the output (as PyTorch's in-place
    /// ELU; alpha must be `>= 0`, so that `y > 0` exactly where `x > 0`).
    Elu(Alpha),
    /// `jax.nn.leaky_relu(x, negative_slope)`: `x` if `x >= 0` else `negative_slope · x`
    /// (stax's `LeakyRelu`: 0.01); gradient `g` or `negative_slope · g` from a bit mask of
    /// `x >= 0`.
    LeakyRelu(Alpha),
    /// `jax.nn.selu`: `scale · elu(x, alpha)` with `scale = 1.0507009873554805`,
    /// `alpha = 1.6732632423543772`; gradient from the output as for [`Activation::Elu`].
    Selu,
    /// `jax.nn.gelu(x, approximate=True)` (stax's `Gelu`): the tanh form
    /// `x · 0.5 (1 + tanh(sqrt(2/π) (x + 0.044715 x³)))` of Hendrycks & Gimpel 2016, §2;
    /// its gradient needs the input, which it keeps.
    Gelu,
}

/// An activation's parameter (Elu's `alpha`, LeakyRelu's `negative_slope`): an f32 kept as its
/// bits, so that [`Activation`] (part of the [`OpDesc`] keys) stays `Eq + Hash`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Alpha(u32);

impl Alpha {
    /// The parameter `v`.
    pub const fn new(v: f32) -> Alpha {
        Alpha(v.to_bits())
    }

    /// Its value.
    pub fn get(self) -> f32 {
        f32::from_bits(self.0)
    }
}

/// What an activation's backward pass reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Saves {
    /// A bit mask of `x > 0` (U32 words, one bit an element: 1/32 of an f32 activation).
    Mask,
    /// The activation's output.
    Output,
    /// The activation's input: its output does not determine its gradient (GELU), so in
    /// training it runs out of place, its input kept.
    Input,
}

impl Activation {
    /// stax's name of the layer (`relu`, `tanh`, `leaky_relu`).
    pub fn name(self) -> &'static str {
        match self {
            Activation::Relu => "relu",
            Activation::Tanh => "tanh",
            Activation::Exp => "exp",
            Activation::Softplus => "softplus",
            Activation::Sigmoid => "sigmoid",
            Activation::Elu(_) => "elu",
            Activation::LeakyRelu(_) => "leaky_relu",
            Activation::Selu => "selu",
            Activation::Gelu => "gelu",
        }
    }

    /// What its backward pass reads.
    pub fn saves(self) -> Saves {
        match self {
            Activation::Relu | Activation::LeakyRelu(_) => Saves::Mask,
            Activation::Gelu => Saves::Input,
            _ => Saves::Output,
        }
    }

    /// The bit a mask-saving activation keeps for input `x`: `x >= 0` for the leaky ReLU
    /// (its gradient at 0 is 1, as `jnp.where(x >= 0, ..)`), `x > 0` otherwise.
    pub fn mask_bit(self, x: f32) -> bool {
        match self {
            Activation::LeakyRelu(_) => x >= 0.0,
            _ => x > 0.0,
        }
    }

    /// `f(x)`, in f32 (the CPU backend's formula).
    pub fn apply(self, x: f32) -> f32 {
        match self {
            // NaN <= 0 is false: NaN propagates.
            Activation::Relu => {
                if x <= 0.0 {
                    0.0
                } else {
                    x
                }
            }
            Activation::Tanh => x.tanh(),
            Activation::Exp => x.exp(),
            Activation::Softplus => scalar::softplus(x),
            Activation::Sigmoid => scalar::sigmoid(x),
            Activation::Elu(a) => scalar::elu(x, a.get()),
            Activation::LeakyRelu(s) => {
                if x >= 0.0 {
                    x
                } else {
                    s.get() * x
                }
            }
            Activation::Selu => scalar::SELU_SCALE * scalar::elu(x, scalar::SELU_ALPHA),
            Activation::Gelu => scalar::gelu(x),
        }
    }

    /// `dy · f'`, from what the forward pass saved ([`Activation::saves`]; for a mask, the
    /// bit as 1.0 or 0.0).
    pub fn grad(self, saved: f32, dy: f32) -> f32 {
        match self {
            Activation::Relu => {
                if saved > 0.0 {
                    dy
                } else {
                    0.0
                }
            }
            Activation::Tanh => dy * (1.0 - saved * saved),
            Activation::Exp => dy * saved,
            Activation::Softplus => dy * -(-saved).exp_m1(),
            Activation::Sigmoid => dy * saved * (1.0 - saved),
            Activation::Elu(a) => scalar::elu_grad(saved, dy, 1.0, a.get()),
            Activation::LeakyRelu(s) => {
                if saved > 0.0 {
                    dy
                } else {
                    s.get() * dy
                }
            }
            Activation::Selu => {
                let (scale, alpha) = (scalar::SELU_SCALE, scalar::SELU_ALPHA);
                scalar::elu_grad(saved, dy, scale, scale * alpha)
            }
            Activation::Gelu => scalar::gelu_grad(saved, dy),
        }
    }

    /// The op code `kernels/activation.cu` switches on (`ACT_*`).
    pub fn code(self) -> i32 {
        match self {
            Activation::Relu => 0,
            Activation::Tanh => 1,
            Activation::Exp => 2,
            Activation::Softplus => 3,
            Activation::Sigmoid => 4,
            Activation::Elu(_) => 5,
            Activation::LeakyRelu(_) => 6,
            Activation::Selu => 7,
            Activation::Gelu => 8,
        }
    }

    /// The op's parameter (`alpha` in the kernels): Elu's alpha, LeakyRelu's slope, else 0.
    pub fn alpha(self) -> f32 {
        match self {
            Activation::Elu(a) | Activation::LeakyRelu(a) => a.get(),
            _ => 0.0,
        }
    }

    /// Checks the parameter: finite, and for the ELU `>= 0` (its backward reads the output).
    ///
    /// # Errors
    /// [`crate::TensorError::InvalidArgument`] naming the activation.
    pub fn check(self) -> Result<(), crate::TensorError> {
        let a = self.alpha();
        let bad = match self {
            Activation::Elu(_) => !(a.is_finite() && a >= 0.0),
            _ => !a.is_finite(),
        };
        if bad {
            return Err(crate::TensorError::InvalidArgument {
                op: self.name(),
                reason: format!(
                    "parameter {a} must be finite (and >= 0 for elu, whose gradient is read \
                     from its output)"
                ),
            });
        }
        Ok(())
    }
}

/// An elementwise binary op, in place: `a = a op b`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b` (`FanInSum`, summing gradients).
    Add,
    /// `a · b`.
    Mul,
}

impl BinaryOp {
    /// The op's name.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Mul => "mul",
        }
    }

    /// `a op b` in f32 (the CPU backend's formula).
    pub fn apply(self, a: f32, b: f32) -> f32 {
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Mul => a * b,
        }
    }

    /// The op code `kernels/activation.cu` (`BIN_*`) and `binary_vec` in `kernels/elementwise.cu`
    /// switch on.
    pub fn code(self) -> i32 {
        match self {
            BinaryOp::Add => 0,
            BinaryOp::Mul => 1,
        }
    }
}

/// One of the three passes of a 2-D convolution (or two of a pooling).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConvPass {
    /// `y = conv(x, w) + b`.
    Forward,
    /// `dx` from `dy` and `w`.
    BackwardData,
    /// `dw` and `db` from `x` and `dy`.
    BackwardFilter,
}

/// How a pooling combines its window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolKind {
    /// `lax.reduce_window(max, -inf)`: padding reads -inf; the gradient goes to the first
    /// maximum of each window in window order (XLA's select-and-scatter with `>=`).
    Max,
    /// `lax.reduce_window(add, 0)` (stax's `SumPool`): padding reads 0.
    Sum,
    /// stax's `AvgPool`: the window sum divided by the number of the window's elements inside
    /// the input (stax divides by `reduce_window(add)` of ones over the same windows, so under
    /// SAME the border windows do not count the padding; under VALID it is the window size).
    Avg,
}

impl PoolKind {
    /// stax's name of the layer (`max_pool`, `sum_pool`, `avg_pool`).
    pub fn name(self) -> &'static str {
        match self {
            PoolKind::Max => "max_pool",
            PoolKind::Sum => "sum_pool",
            PoolKind::Avg => "avg_pool",
        }
    }
}

/// What one op call computes, as far as its memory goes (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpDesc {
    /// A pass of a 2-D convolution of this geometry, in `dtype`.
    Conv {
        /// Shapes, strides and padding.
        geometry: Conv2dGeometry,
        /// Which pass.
        pass: ConvPass,
        /// Element type.
        dtype: DType,
        /// Whether the pass adds a bias (forward, backward data) or computes its gradient
        /// (backward filter).
        bias: bool,
    },
    /// A 2-D pooling (`geometry.c_out == geometry.c_in`, the window as the kernel).
    Pool {
        /// Max, sum or average.
        kind: PoolKind,
        /// Shapes, window, strides and padding.
        geometry: Conv2dGeometry,
        /// Whether it is the backward pass.
        backward: bool,
        /// Element type.
        dtype: DType,
        /// Whether max pooling writes (forward) or reads (backward) the windows' argmax
        /// offsets ([`crate::backend::Pool2d`]'s `argmax`).
        argmax: bool,
    },
    /// `op(a) · op(b)` with `op(a)` `[m, k]`, `op(b)` `[k, n]`, in `dtype`.
    Matmul {
        /// Rows of the product.
        m: usize,
        /// Columns of the product.
        n: usize,
        /// The contracted dimension.
        k: usize,
        /// Element type of `a` and the product.
        dtype: DType,
        /// Element type of `b`: `dtype`, or f32 read rounded to a bf16 or f16 `dtype` (see
        /// [`crate::ops::matmul`]).
        b_dtype: DType,
        /// Whether `a` is read transposed.
        transpose_a: bool,
        /// Whether `b` is read transposed.
        transpose_b: bool,
        /// Whether the product is added to `c` ([`crate::ops::matmul_add`]).
        accumulate: bool,
    },
    /// An activation (forward: `backward == false`) over `n` elements.
    Unary {
        /// The activation.
        act: Activation,
        /// Elements.
        n: usize,
        /// Whether it is the backward pass.
        backward: bool,
    },
    /// A binary op over `n` elements.
    Binary {
        /// The op.
        op: BinaryOp,
        /// Elements.
        n: usize,
    },
    /// `y[.., j] += b[j]` on `[rows, cols]`.
    BiasAdd {
        /// Rows.
        rows: usize,
        /// Bias length.
        cols: usize,
    },
    /// `db[j] = sum of dy[.., j]` of `dy` seen as `[rows, cols]`.
    BiasGrad {
        /// Rows summed over.
        rows: usize,
        /// Bias length.
        cols: usize,
    },
    /// Softmax cross-entropy of `[rows, classes]` logits.
    SoftmaxXent {
        /// Batch rows.
        rows: usize,
        /// Classes.
        classes: usize,
    },
    /// One Adam step on `n` parameters.
    Adam {
        /// Elements.
        n: usize,
    },
    /// Whether `n` elements of `dtype` are all finite, into a flag (no workspace: the loss
    /// scaling's check, [`crate::ops::all_finite`]).
    AllFinite {
        /// Elements.
        n: usize,
        /// Element type.
        dtype: DType,
    },
    /// A dense layer's weight gradient `xᵀ · dy` (`[k, n]` from `[m, k]` and `[m, n]`) consumed
    /// by Adam chunk by chunk, with the input gradient `dy · wᵀ`: its workspace is one chunk
    /// of the gradient ([`dense_chunk_rows`]; in `dtype` on CUDA), and for a low-precision
    /// input gradient a chunk of the old weight rounded to `dtype` (see
    /// [`crate::ops::dense_adam`]).
    DenseAdam {
        /// Batch rows.
        m: usize,
        /// Output features.
        n: usize,
        /// Input features (rows of the weight).
        k: usize,
        /// The dtype of `x`, `dy` and `dx` (the weight and its moments are f32).
        dtype: DType,
        /// Whether the input gradient is computed (not [`crate::backend::DenseDx::Skip`]).
        input_grad: bool,
    },
    /// A host/device copy, a fill or a device copy: no workspace.
    Memory,
    /// A softmax or log-softmax over one axis of length `len`, for `rows` rows.
    Softmax {
        /// Which function.
        kind: SoftmaxKind,
        /// Rows (the elements of every other axis).
        rows: usize,
        /// The axis' length.
        len: usize,
        /// Whether it is the backward pass.
        backward: bool,
    },
    /// A dropout (forward: its bit mask made) over `n` elements.
    Dropout {
        /// Elements.
        n: usize,
        /// Whether it is the backward pass.
        backward: bool,
    },
    /// A loss of `[rows, classes]` model outputs against integer labels, with its gradient.
    IndexLoss {
        /// Which loss.
        loss: IndexLoss,
        /// Batch rows.
        rows: usize,
        /// Classes.
        classes: usize,
    },
    /// Batch normalization (forward: `backward == false`) over a `[outer, c, inner]` view.
    BatchNorm {
        /// The view: statistics per channel over `outer` and `inner`.
        geometry: ChannelGeometry,
        /// Whether it is the backward pass.
        backward: bool,
        /// The dtype of the input, output and their gradients (statistics and parameters are
        /// f32).
        dtype: DType,
    },
    /// A bias along a middle axis (`y[o, j, i] += b[j]`), or its gradient (`backward`).
    ChannelBias {
        /// The view.
        geometry: ChannelGeometry,
        /// Whether it is the gradient.
        backward: bool,
    },
    /// The per-channel part of a batch norm's backward pass through the pointwise conv before
    /// it ([`crate::ops::batch_norm_fold`]): `[k, c]` weights, no workspace.
    NormFold {
        /// The conv's input channels.
        k: usize,
        /// Its output channels, the norm's.
        c: usize,
    },
}

/// Rows of the weight [`OpDesc::DenseAdam`] processes at a time, `n` columns wide, within
/// `bytes` of f32 gradient: a multiple of 64 rows when 64 fit (16-byte aligned chunks for any
/// `n`), else as many as fit, at least 1 and at most `k`; 0 for an empty weight.
pub fn dense_chunk_rows(k: usize, n: usize, bytes: usize) -> usize {
    if k == 0 || n == 0 {
        return 0;
    }
    let fit = bytes / (4 * n);
    let rows = if fit >= 64 { fit / 64 * 64 } else { fit.max(1) };
    rows.min(k)
}

/// A tensor seen as `[outer, c, inner]`: a channel axis (or a contiguous run of axes, merged)
/// between the axes before it and after it. Per-channel reductions (BatchNorm's statistics, a
/// channel bias's gradient) sum over `outer` and `inner`. NHWC channels are `[n·h·w, c, 1]`,
/// NCHW channels `[n, c, h·w]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChannelGeometry {
    /// Product of the axes before the channels.
    pub outer: usize,
    /// Channels (the product of the kept axes).
    pub c: usize,
    /// Product of the axes after the channels.
    pub inner: usize,
}

impl ChannelGeometry {
    /// The view of `shape` whose channels are the axes `kept` (a non-empty range).
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] when `kept` is empty or out of range.
    pub fn of(shape: &Shape, kept: std::ops::Range<usize>) -> Result<Self, TensorError> {
        let d = shape.dims();
        if kept.is_empty() || kept.end > d.len() {
            return Err(TensorError::InvalidArgument {
                op: "channel_geometry",
                reason: format!("axes {kept:?} are not a non-empty range of {shape}"),
            });
        }
        let prod = |r: &[usize]| r.iter().product::<usize>();
        Ok(ChannelGeometry {
            outer: prod(&d[..kept.start]),
            c: prod(&d[kept.clone()]),
            inner: prod(&d[kept.end..]),
        })
    }

    /// Elements of the whole view (saturating).
    pub fn numel(&self) -> usize {
        self.outer.saturating_mul(self.c).saturating_mul(self.inner)
    }

    /// Elements each channel reduces over, `outer · inner` (saturating).
    pub fn per_channel(&self) -> usize {
        self.outer.saturating_mul(self.inner)
    }
}

/// One allocation or free of an op's workspace (tagged [`stax_alloc::Category::Workspace`]),
/// in the order the op makes them ([`crate::Backend::workspace_schedule`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkspaceStep {
    /// Allocates this many bytes.
    Alloc(usize),
    /// Frees the schedule's `i`-th allocation (counting [`WorkspaceStep::Alloc`]s from 0).
    Free(usize),
}

impl WorkspaceStep {
    /// The schedule of an op that holds one buffer of `bytes` (none when 0).
    pub fn single(bytes: usize) -> Vec<WorkspaceStep> {
        if bytes == 0 {
            Vec::new()
        } else {
            vec![WorkspaceStep::Alloc(bytes), WorkspaceStep::Free(0)]
        }
    }

    /// The most bytes a schedule holds at once.
    ///
    /// ```
    /// use stax_tensor::WorkspaceStep::{Alloc, Free};
    /// // a filter copy (100), a padded input (50), then the library's workspace (30)
    /// let s = [Alloc(100), Alloc(50), Alloc(30), Free(2), Free(0), Free(1)];
    /// assert_eq!(stax_tensor::WorkspaceStep::peak(&s), 180);
    /// assert_eq!(stax_tensor::WorkspaceStep::peak(&[Alloc(8), Free(0), Alloc(5)]), 8);
    /// ```
    pub fn peak(schedule: &[WorkspaceStep]) -> usize {
        let mut sizes = Vec::new();
        let (mut live, mut peak) = (0usize, 0usize);
        for step in schedule {
            match *step {
                WorkspaceStep::Alloc(b) => {
                    sizes.push(b);
                    live += b;
                    peak = peak.max(live);
                }
                WorkspaceStep::Free(i) => live -= sizes.get(i).copied().unwrap_or(0),
            }
        }
        peak
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activation_formulas() {
        assert_eq!(Activation::Relu.apply(-1.5), 0.0);
        assert_eq!(Activation::Relu.apply(0.0), 0.0);
        assert!(Activation::Relu.apply(f32::NAN).is_nan());
        assert_eq!(Activation::Relu.grad(1.0, 3.0), 3.0);
        assert_eq!(Activation::Relu.grad(0.0, 3.0), 0.0);
        let y = Activation::Tanh.apply(0.5);
        assert!((y - 0.462_117_16).abs() < 1e-7);
        assert!((Activation::Tanh.grad(y, 2.0) - 2.0 * (1.0 - y * y)).abs() < 1e-7);
        assert_eq!(BinaryOp::Add.apply(1.5, 2.0), 3.5);
    }
}
