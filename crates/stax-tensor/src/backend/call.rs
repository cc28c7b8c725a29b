//! The operands of each op, as the front end ([`crate::ops`]) checks them and hands them to a
//! backend inside a [`crate::Checked`]. Shapes are the front end's; each call says what it
//! computes as an [`OpDesc`] ([`Call::desc`]).

use crate::{Activation, AdamHyper, BinaryOp, Conv2dGeometry, DType, OpDesc, PoolKind, Tensor};

/// What an op call computes, as far as its memory goes.
pub trait Call {
    /// The op's description.
    fn desc(&self) -> OpDesc;
}

macro_rules! memory_calls {
    ($($name:ident),*) => {$(
        impl Call for $name<'_> {
            fn desc(&self) -> OpDesc {
                OpDesc::Memory
            }
        }
    )*};
}

/// Host bytes into a tensor (`src.len() == dst.bytes()`).
#[derive(Debug)]
pub struct CopyIn<'a> {
    /// Raw little-endian element bytes.
    pub src: &'a [u8],
    /// The destination.
    pub dst: &'a mut Tensor,
}

/// A tensor's bytes to the host (`dst.len() == src.bytes()`).
#[derive(Debug)]
pub struct CopyOut<'a> {
    /// The source.
    pub src: &'a Tensor,
    /// Raw element bytes.
    pub dst: &'a mut [u8],
}

/// A device copy (same shape and dtype).
#[derive(Debug)]
pub struct Copy<'a> {
    /// The source.
    pub src: &'a Tensor,
    /// The destination.
    pub dst: &'a mut Tensor,
}

/// `dst = src` converted to `dst`'s float dtype (same shape; read as f32, rounded to nearest
/// even): the casts of a mixed-precision step.
#[derive(Debug)]
pub struct Cast<'a> {
    /// The source.
    pub src: &'a Tensor,
    /// The destination, of another float dtype.
    pub dst: &'a mut Tensor,
}

/// Every element of `t` set to `value` rounded to `t`'s dtype (a U32 tensor: `value == 0`).
#[derive(Debug)]
pub struct Fill<'a> {
    /// The tensor.
    pub t: &'a mut Tensor,
    /// The value.
    pub value: f32,
}

/// Host memory from an allocator into a tensor, started now and finished later
/// ([`crate::MemoryOps::upload_async`]): `src` is host memory of exactly `dst.bytes()` bytes.
#[derive(Debug)]
pub struct CopyInAsync {
    /// The host source (pinned on CUDA for full speed).
    pub src: stax_alloc::Allocation,
    /// The destination.
    pub dst: Tensor,
}

impl Call for CopyInAsync {
    fn desc(&self) -> OpDesc {
        OpDesc::Memory
    }
}

/// `out` = the `inputs` concatenated along `axis` (same rank, dtype and extents but on `axis`).
#[derive(Debug)]
pub struct Concat<'a> {
    /// The axis.
    pub axis: usize,
    /// The pieces, in order.
    pub inputs: &'a [&'a Tensor],
    /// Their concatenation.
    pub out: &'a mut Tensor,
}

/// The `outs` = consecutive pieces of `src` along `axis` (the reverse of [`Concat`]).
#[derive(Debug)]
pub struct Split<'a> {
    /// The axis.
    pub axis: usize,
    /// The whole.
    pub src: &'a Tensor,
    /// The pieces, in order.
    pub outs: &'a mut [Tensor],
}

impl Concat<'_> {
    /// `(outer, inner)` of each input, and the output's inner size (elements): the
    /// concatenation is a block copy of `[outer, inner_i]` matrices into `[outer, total]`.
    pub fn blocks(&self) -> (usize, Vec<usize>, usize) {
        blocks(self.axis, self.inputs.iter().copied(), self.out)
    }
}

impl Split<'_> {
    /// As [`Concat::blocks`], for the pieces.
    pub fn blocks(&self) -> (usize, Vec<usize>, usize) {
        blocks(self.axis, self.outs.iter(), self.src)
    }
}

fn blocks<'t>(
    axis: usize,
    pieces: impl Iterator<Item = &'t Tensor>,
    whole: &Tensor,
) -> (usize, Vec<usize>, usize) {
    let inner = |t: &Tensor| t.dims()[axis..].iter().product::<usize>();
    let outer = whole.dims()[..axis].iter().product::<usize>();
    (outer, pieces.map(inner).collect(), inner(whole))
}

memory_calls!(CopyIn, CopyOut, Copy, Cast, Fill, Concat, Split);

mod norm;
pub use norm::{
    BatchNorm, BatchNormBwd, BatchNormFold, ChannelBiasAdd, ChannelBiasGrad, FoldInputs,
    FoldOutputs, NormStats,
};

/// `y = act(conv(x, w) + b)`: x `g.input_shape()`, w `g.filter_shape()`, b `[c_out]` (or no
/// bias), y `g.output_shape()` (cross-correlation, as `lax.conv_general_dilated`). With an
/// activation that saves a mask, `aux` receives it.
#[derive(Debug)]
pub struct Conv2d<'a> {
    /// Shapes, strides, padding.
    pub g: Conv2dGeometry,
    /// Input.
    pub x: &'a Tensor,
    /// Kernel.
    pub w: &'a Tensor,
    /// Bias, if any.
    pub b: Option<&'a Tensor>,
    /// Output.
    pub y: &'a mut Tensor,
    /// The activation of the epilogue, if any.
    pub act: Option<Activation>,
    /// Its mask (ReLU), if it keeps one.
    pub aux: Option<&'a mut Tensor>,
}

/// `dx = conv_transpose(dy, w)`: dy `g.output_shape()`, dx `g.input_shape()`.
#[derive(Debug)]
pub struct Conv2dBwdData<'a> {
    /// Shapes, strides, padding.
    pub g: Conv2dGeometry,
    /// Output gradient.
    pub dy: &'a Tensor,
    /// Kernel.
    pub w: &'a Tensor,
    /// Input gradient (overwritten).
    pub dx: &'a mut Tensor,
}

/// Kernel and bias gradients: dw `g.filter_shape()`, db `[c_out]` if given (overwritten). With
/// `act`, `dy` is first turned in place into the gradient before the epilogue's activation
/// (its backward, from what it saved); unless `keep_dy`, the backend may skip writing it back
/// (the caller drops `dy`: [`crate::ops::conv2d_bwd_filter_consuming`]).
#[derive(Debug)]
pub struct Conv2dBwdFilter<'a> {
    /// Shapes, strides, padding.
    pub g: Conv2dGeometry,
    /// The forward input.
    pub x: &'a Tensor,
    /// Output gradient.
    pub dy: &'a mut Tensor,
    /// Kernel gradient.
    pub dw: &'a mut Tensor,
    /// Bias gradient, if wanted.
    pub db: Option<&'a mut Tensor>,
    /// The epilogue's activation and what it saved.
    pub act: Option<(Activation, &'a Tensor)>,
    /// Whether `dy` must hold the gradient before `act` afterwards (false: its contents are
    /// unspecified, as the caller drops it).
    pub keep_dy: bool,
}

/// A 2-D pooling: x NHWC `g.input_shape()`, y NHWC `g.output_shape()`; for max pooling
/// optionally also each window's argmax (u32 `g.output_shape()`: the window offset `ky · kw +
/// kx` of its first maximum in window order), what its backward pass reads instead of `x`.
#[derive(Debug)]
pub struct Pool2d<'a> {
    /// How the window is combined.
    pub kind: PoolKind,
    /// Shapes, window (as the kernel), strides, padding.
    pub g: Conv2dGeometry,
    /// Input.
    pub x: &'a Tensor,
    /// Output.
    pub y: &'a mut Tensor,
    /// The windows' argmax offsets (max pooling), written when given.
    pub argmax: Option<&'a mut Tensor>,
}

/// A pooling's input gradient: dx NHWC `g.input_shape()` (overwritten) from dy (and, for max
/// pooling, the forward input or the argmax offsets the forward pass wrote; sum and average
/// pooling read neither).
#[derive(Debug)]
pub struct Pool2dBwd<'a> {
    /// How the window is combined.
    pub kind: PoolKind,
    /// Shapes, window, strides, padding.
    pub g: Conv2dGeometry,
    /// What max pooling's gradient reads.
    pub from: Option<MaxFrom<'a>>,
    /// Output gradient.
    pub dy: &'a Tensor,
    /// Input gradient.
    pub dx: &'a mut Tensor,
}

/// What max pooling's backward pass finds each window's maximum from.
#[derive(Debug, Clone, Copy)]
pub enum MaxFrom<'a> {
    /// The forward input (NHWC `g.input_shape()`, the op's dtype): the argmax is recomputed.
    Input(&'a Tensor),
    /// The argmax offsets [`Pool2d`] wrote (u32 `g.output_shape()`).
    Argmax(&'a Tensor),
}

/// `c = op(a) · op(b)` for row-major matrices, `op` transposing when its flag is set:
/// `op(a)` `[m, k]`, `op(b)` `[k, n]`, `c` `[m, n]` (overwritten, or added to with
/// `accumulate`).
#[derive(Debug)]
pub struct Matmul<'a> {
    /// Rows of `c`.
    pub m: usize,
    /// Columns of `c`.
    pub n: usize,
    /// The contracted dimension.
    pub k: usize,
    /// Left operand.
    pub a: &'a Tensor,
    /// Right operand.
    pub b: &'a Tensor,
    /// Whether `a` is transposed.
    pub transpose_a: bool,
    /// Whether `b` is transposed.
    pub transpose_b: bool,
    /// The product.
    pub c: &'a mut Tensor,
    /// Whether the product is added to `c` (`a` and `b` then of one dtype).
    pub accumulate: bool,
}

/// In place `y = act(y)`; `aux` receives the activation's mask (ReLU) in training.
#[derive(Debug)]
pub struct Unary<'a> {
    /// The activation.
    pub act: Activation,
    /// Input and output.
    pub y: &'a mut Tensor,
    /// The mask, for an activation that saves one.
    pub aux: Option<&'a mut Tensor>,
}

/// In place `dy = dy · act'`, from what the forward pass saved (a mask or the output).
#[derive(Debug)]
pub struct UnaryBwd<'a> {
    /// The activation.
    pub act: Activation,
    /// What the forward pass saved.
    pub saved: &'a Tensor,
    /// Output gradient in, input gradient out.
    pub dy: &'a mut Tensor,
}

/// In place `a = a op b` (same shape and dtype); with `relu`, then `a = relu(a)` writing the
/// ReLU's mask ([`crate::ops::binary_relu`]); with `masked_by`, then `a = 0` where that saved
/// mask's bit is clear ([`crate::ops::binary_masked`]). Never both.
#[derive(Debug)]
pub struct Binary<'a> {
    /// The op.
    pub op: BinaryOp,
    /// Left operand and result.
    pub a: &'a mut Tensor,
    /// Right operand.
    pub b: &'a Tensor,
    /// A fused ReLU's bit mask (U32, `ceil(numel / 32)` words), if any.
    pub relu: Option<&'a mut Tensor>,
    /// A ReLU's saved bit mask the result is masked by (the ReLU's backward pass), if any.
    pub masked_by: Option<&'a Tensor>,
}

/// `y[.., j] += b[j]`, b `[cols]`, y seen as `[rows, cols]`.
#[derive(Debug)]
pub struct BiasAdd<'a> {
    /// Rows of y.
    pub rows: usize,
    /// Bias length.
    pub cols: usize,
    /// Output.
    pub y: &'a mut Tensor,
    /// Bias.
    pub b: &'a Tensor,
}

/// `db[j] = sum of dy[.., j]`, dy seen as `[rows, cols]`.
#[derive(Debug)]
pub struct BiasGrad<'a> {
    /// Rows of dy.
    pub rows: usize,
    /// Bias length.
    pub cols: usize,
    /// Output gradient.
    pub dy: &'a Tensor,
    /// Bias gradient (overwritten).
    pub db: &'a mut Tensor,
}

/// Softmax cross-entropy of `[rows, classes]` logits with probability labels, fused with its
/// gradient (see [`crate::ops::softmax_xent`]).
#[derive(Debug)]
pub struct SoftmaxXent<'a> {
    /// Batch rows.
    pub rows: usize,
    /// Classes.
    pub classes: usize,
    /// Logits.
    pub logits: &'a Tensor,
    /// Labels.
    pub labels: &'a Tensor,
    /// The gradient of the mean loss (overwritten).
    pub dlogits: &'a mut Tensor,
}

/// One fused, in-place Adam step on one parameter tensor (see [`AdamHyper`]).
#[derive(Debug)]
pub struct Adam<'a> {
    /// Parameter.
    pub p: &'a mut Tensor,
    /// Gradient.
    pub g: &'a Tensor,
    /// First moment.
    pub m: &'a mut Tensor,
    /// Second moment.
    pub v: &'a mut Tensor,
    /// Hyper-parameters of this step.
    pub h: AdamHyper,
}

/// Whether every element of a float tensor is finite, folded into a flag (see
/// [`crate::ops::all_finite`]).
#[derive(Debug)]
pub struct AllFinite<'a> {
    /// The tensor checked (any float dtype).
    pub x: &'a Tensor,
    /// A U32 `[1]` flag, set to 1 when an element of `x` is NaN or infinite, else unchanged.
    pub nonfinite: &'a mut Tensor,
}

/// Where [`DenseAdam`] writes the input gradient `dx = dy · wᵀ` `[m, k]`.
#[derive(Debug)]
pub enum DenseDx<'a> {
    /// Not computed (the model's input).
    Skip,
    /// Over `x`, chunk by chunk after each chunk's `dw` has been read from it.
    InPlace,
    /// Into this tensor.
    Into(&'a mut Tensor),
}

/// A dense layer's weight gradient consumed by Adam as it is made (see
/// [`crate::ops::dense_adam`]): x `[m, k]` and dy `[m, n]` of one float dtype, w, mu and nu
/// `[k, n]` f32, dx of x's dtype.
#[derive(Debug)]
pub struct DenseAdam<'a> {
    /// The layer's input (it holds `dx` afterwards with [`DenseDx::InPlace`]).
    pub x: &'a mut Tensor,
    /// Output gradient.
    pub dy: &'a Tensor,
    /// The weight, updated in place.
    pub w: &'a mut Tensor,
    /// Adam's first moment of `w`, updated in place.
    pub mu: &'a mut Tensor,
    /// Adam's second moment of `w`, updated in place.
    pub nu: &'a mut Tensor,
    /// Where the input gradient goes.
    pub dx: DenseDx<'a>,
    /// Hyper-parameters of this step.
    pub h: AdamHyper,
}

impl Call for Conv2d<'_> {
    fn desc(&self) -> OpDesc {
        let bias = self.b.is_some();
        conv(self.g, crate::ConvPass::Forward, self.x.dtype(), bias)
    }
}

impl Call for Conv2dBwdData<'_> {
    fn desc(&self) -> OpDesc {
        conv(
            self.g,
            crate::ConvPass::BackwardData,
            self.dy.dtype(),
            false,
        )
    }
}

impl Call for Conv2dBwdFilter<'_> {
    fn desc(&self) -> OpDesc {
        let bias = self.db.is_some();
        conv(
            self.g,
            crate::ConvPass::BackwardFilter,
            self.x.dtype(),
            bias,
        )
    }
}

fn conv(geometry: Conv2dGeometry, pass: crate::ConvPass, dtype: DType, bias: bool) -> OpDesc {
    OpDesc::Conv {
        geometry,
        pass,
        dtype,
        bias,
    }
}

impl Call for Pool2d<'_> {
    fn desc(&self) -> OpDesc {
        OpDesc::Pool {
            kind: self.kind,
            geometry: self.g,
            backward: false,
            dtype: self.x.dtype(),
            argmax: self.argmax.is_some(),
        }
    }
}

impl Call for Pool2dBwd<'_> {
    fn desc(&self) -> OpDesc {
        OpDesc::Pool {
            kind: self.kind,
            geometry: self.g,
            backward: true,
            dtype: self.dy.dtype(),
            argmax: matches!(self.from, Some(MaxFrom::Argmax(_))),
        }
    }
}

impl Call for Matmul<'_> {
    fn desc(&self) -> OpDesc {
        OpDesc::Matmul {
            m: self.m,
            n: self.n,
            k: self.k,
            dtype: self.a.dtype(),
            b_dtype: self.b.dtype(),
            transpose_a: self.transpose_a,
            transpose_b: self.transpose_b,
            accumulate: self.accumulate,
        }
    }
}

impl Call for Unary<'_> {
    fn desc(&self) -> OpDesc {
        OpDesc::Unary {
            act: self.act,
            n: self.y.numel(),
            backward: false,
        }
    }
}

impl Call for UnaryBwd<'_> {
    fn desc(&self) -> OpDesc {
        OpDesc::Unary {
            act: self.act,
            n: self.dy.numel(),
            backward: true,
        }
    }
}

impl Call for Binary<'_> {
    fn desc(&self) -> OpDesc {
        OpDesc::Binary {
            op: self.op,
            n: self.a.numel(),
        }
    }
}

impl Call for BiasAdd<'_> {
    fn desc(&self) -> OpDesc {
        OpDesc::BiasAdd {
            rows: self.rows,
            cols: self.cols,
        }
    }
}

impl Call for BiasGrad<'_> {
    fn desc(&self) -> OpDesc {
        OpDesc::BiasGrad {
            rows: self.rows,
            cols: self.cols,
        }
    }
}

impl Call for SoftmaxXent<'_> {
    fn desc(&self) -> OpDesc {
        OpDesc::SoftmaxXent {
            rows: self.rows,
            classes: self.classes,
        }
    }
}

impl Call for Adam<'_> {
    fn desc(&self) -> OpDesc {
        OpDesc::Adam { n: self.p.numel() }
    }
}

impl Call for AllFinite<'_> {
    fn desc(&self) -> OpDesc {
        OpDesc::AllFinite {
            n: self.x.numel(),
            dtype: self.x.dtype(),
        }
    }
}

impl Call for DenseAdam<'_> {
    fn desc(&self) -> OpDesc {
        let (m, k) = (self.x.dims()[0], self.x.dims()[1]);
        OpDesc::DenseAdam {
            m,
            n: self.dy.dims()[1],
            k,
            dtype: self.x.dtype(),
            input_grad: !matches!(self.dx, DenseDx::Skip),
        }
    }
}
