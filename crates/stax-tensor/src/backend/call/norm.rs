//! The calls of the normalization family ([`crate::NormOps`]): batch normalization and a
//! bias along a middle (channel) axis, each on a `[outer, c, inner]` view
//! ([`ChannelGeometry`]).

use super::Call;
use crate::{ChannelGeometry, OpDesc, Tensor};

/// Batch normalization forward (`jax.nn.standardize` then scale and shift, as stax's
/// `BatchNorm`): per channel `j`, over the `outer · inner` elements of `x`,
/// `mean = E[x]`, `var = max(E[x²] - mean², 0)` (stax's one-pass variance), `rstd =
/// 1 / sqrt(var + eps)`, `y = gamma · (x - mean) · rstd + beta` (gamma 1 and beta 0 when not
/// given), then with `relu` a ReLU in place whose bit mask (`x > 0` of its input) `relu`
/// receives. `mean` and `rstd` (`[c]`) are written for the backward pass, or given
/// ([`NormStats`]).
#[derive(Debug)]
pub struct BatchNorm<'a> {
    /// The view.
    pub g: ChannelGeometry,
    /// Added to the variance.
    pub eps: f32,
    /// Input.
    pub x: &'a Tensor,
    /// Scale `[c]`, if any.
    pub gamma: Option<&'a Tensor>,
    /// Shift `[c]`, if any.
    pub beta: Option<&'a Tensor>,
    /// Output (overwritten).
    pub y: &'a mut Tensor,
    /// The per-channel statistics, computed or given.
    pub stats: NormStats<'a>,
    /// A following ReLU's mask (U32, `ceil(numel / 32)` words), when the ReLU is fused.
    pub relu: Option<&'a mut Tensor>,
    /// A tensor of `x`'s shape and dtype added to the output (rounded to the dtype first)
    /// before the ReLU, if any ([`crate::ops::batch_norm_add_relu`]).
    pub add: Option<&'a Tensor>,
}

/// The statistics of a [`BatchNorm`], `[c]` f32 each: the mean and `1 / sqrt(var + eps)`.
#[derive(Debug)]
pub enum NormStats<'a> {
    /// Computed from the batch, written here (overwritten).
    Computed {
        /// The mean.
        mean: &'a mut Tensor,
        /// `1 / sqrt(var + eps)`.
        rstd: &'a mut Tensor,
    },
    /// Given: those an earlier run on the same input computed (a rematerialized norm's,
    /// [`crate::ops::batch_norm_given`]), read; `eps` is not used.
    Given {
        /// The mean.
        mean: &'a Tensor,
        /// `1 / sqrt(var + eps)`.
        rstd: &'a Tensor,
    },
}

impl NormStats<'_> {
    /// The mean and rstd buffers' device addresses, computed or given.
    pub fn addrs(&self) -> (u64, u64) {
        match self {
            NormStats::Computed { mean, rstd } => (mean.addr(), rstd.addr()),
            NormStats::Given { mean, rstd } => (mean.addr(), rstd.addr()),
        }
    }
}

/// Batch normalization backward, from the forward input and its statistics: with `z = (x -
/// mean) · rstd`, `dbeta = sum dy`, `dgamma = sum dy · z`, and (when `need_dx`) `dx = gamma ·
/// rstd · (dy - dbeta / m - z · dgamma / m)` written over `dy` (`m = outer · inner`). With
/// `relu` (a fused ReLU's mask), `dy` is the gradient after the ReLU and is masked first.
#[derive(Debug)]
pub struct BatchNormBwd<'a> {
    /// The view.
    pub g: ChannelGeometry,
    /// The forward input.
    pub x: &'a Tensor,
    /// Scale `[c]`, if the forward pass had one.
    pub gamma: Option<&'a Tensor>,
    /// The forward mean `[c]`.
    pub mean: &'a Tensor,
    /// The forward `rstd` `[c]`.
    pub rstd: &'a Tensor,
    /// The fused ReLU's mask, if the forward pass had one.
    pub relu: Option<&'a Tensor>,
    /// Output gradient in; the input gradient out when `need_dx`.
    pub dy: &'a mut Tensor,
    /// Whether to write the input gradient.
    pub need_dx: bool,
    /// Scale gradient `[c]`, if wanted.
    pub dgamma: Option<&'a mut Tensor>,
    /// Shift gradient `[c]`, if wanted.
    pub dbeta: Option<&'a mut Tensor>,
    /// Per-channel sums of the input gradient `[c]` (its dtype), if wanted (with `need_dx`).
    pub dx_sum: Option<&'a mut Tensor>,
}

/// `y[o, j, i] += b[j]` (a convolution's bias in NCHW).
#[derive(Debug)]
pub struct ChannelBiasAdd<'a> {
    /// The view.
    pub g: ChannelGeometry,
    /// Output.
    pub y: &'a mut Tensor,
    /// Bias `[c]`.
    pub b: &'a Tensor,
}

/// `db[j] = sum over o, i of dy[o, j, i]`, in f64.
#[derive(Debug)]
pub struct ChannelBiasGrad<'a> {
    /// The view.
    pub g: ChannelGeometry,
    /// Output gradient.
    pub dy: &'a Tensor,
    /// Bias gradient `[c]` (overwritten).
    pub db: &'a mut Tensor,
}

/// The per-channel part of the backward pass of a batch norm over the output of a pointwise
/// conv, computed from sums over the conv's input and the norm's output gradient instead of
/// from that output ([`crate::ops::batch_norm_fold`] gives the formulas): the weight's `[k,
/// c]`.
#[derive(Debug)]
pub struct BatchNormFold<'a> {
    /// The conv's input channels.
    pub k: usize,
    /// The norm's channels.
    pub c: usize,
    /// What it reads.
    pub inputs: FoldInputs<'a>,
    /// What it writes.
    pub outputs: FoldOutputs<'a>,
}

/// The conv and norm tensors [`crate::ops::batch_norm_fold`] reads, all f32: the conv's weight `w`
/// `[k, c]` (a 1x1 HWIO filter's view) and bias `b0` `[c]`, the norm's scale `gamma` `[c]`
/// (if any) and saved `mean` and `rstd` `[c]`, and the sums over the `count` rows of the
/// conv's input `h` `[count, k]` and the norm's output gradient `dy` `[count, c]`: `gt = hᵀ ·
/// dy` `[k, c]`, `sh = Σ h` `[k]`, `sd = Σ dy` `[c]`.
#[derive(Debug, Clone, Copy)]
pub struct FoldInputs<'a> {
    /// The conv's weight `[k, c]`.
    pub w: &'a Tensor,
    /// The conv's bias `[c]`.
    pub b0: &'a Tensor,
    /// The norm's scale `[c]`, if any.
    pub gamma: Option<&'a Tensor>,
    /// The norm's saved mean `[c]`.
    pub mean: &'a Tensor,
    /// The norm's saved `1 / sqrt(var + eps)` `[c]`.
    pub rstd: &'a Tensor,
    /// `hᵀ · dy` `[k, c]`.
    pub gt: &'a Tensor,
    /// `Σ h` over the rows `[k]`.
    pub sh: &'a Tensor,
    /// `Σ dy` over the rows `[c]`.
    pub sd: &'a Tensor,
    /// The rows summed over.
    pub count: usize,
}

/// What [`crate::ops::batch_norm_fold`] writes, all f32 (`dw` also read).
#[derive(Debug)]
pub struct FoldOutputs<'a> {
    /// `hᵀ · h · w` `[k, c]` on entry, the conv's weight gradient on return.
    pub dw: &'a mut Tensor,
    /// The conv's bias gradient `[c]`.
    pub db0: &'a mut Tensor,
    /// `w · diag(a)` `[k, c]`.
    pub w_a: &'a mut Tensor,
    /// `w · diag(cz)` `[k, c]`.
    pub w_c: &'a mut Tensor,
    /// `bp` `[c]`.
    pub bp: &'a mut Tensor,
    /// The norm's scale gradient `[c]`, if wanted.
    pub dgamma: Option<&'a mut Tensor>,
    /// The norm's shift gradient `[c]`, if wanted.
    pub dbeta: Option<&'a mut Tensor>,
}

impl Call for BatchNormFold<'_> {
    fn desc(&self) -> OpDesc {
        OpDesc::NormFold {
            k: self.k,
            c: self.c,
        }
    }
}

impl Call for BatchNorm<'_> {
    fn desc(&self) -> OpDesc {
        OpDesc::BatchNorm {
            geometry: self.g,
            backward: false,
            dtype: self.x.dtype(),
        }
    }
}

impl Call for BatchNormBwd<'_> {
    fn desc(&self) -> OpDesc {
        OpDesc::BatchNorm {
            geometry: self.g,
            backward: true,
            dtype: self.x.dtype(),
        }
    }
}

impl Call for ChannelBiasAdd<'_> {
    fn desc(&self) -> OpDesc {
        OpDesc::ChannelBias {
            geometry: self.g,
            backward: false,
        }
    }
}

impl Call for ChannelBiasGrad<'_> {
    fn desc(&self) -> OpDesc {
        OpDesc::ChannelBias {
            geometry: self.g,
            backward: true,
        }
    }
}
