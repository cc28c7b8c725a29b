//! The calls of the ops that work along rows or with random bits: softmax and log-softmax over
//! an axis, the losses with integer labels, and dropout. Like every call, made only by the
//! front end ([`crate::ops`]) once its operands are checked.

use super::Call;
use crate::{IndexLoss, OpDesc, SoftmaxKind, Tensor};

/// A tensor seen as `[outer, len, inner]` around one axis of length `len`: element `(o, j, i)`
/// is at `(o · len + j) · inner + i`, so a row (fixed `o` and `i`) is `len` elements
/// `inner` apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AxisDims {
    /// The product of the extents before the axis.
    pub outer: usize,
    /// The axis' extent.
    pub len: usize,
    /// The product of the extents after it.
    pub inner: usize,
}

impl AxisDims {
    /// The rows: every combination of the other axes' indices.
    pub fn rows(&self) -> usize {
        self.outer * self.inner
    }

    /// The offset of row `r`'s first element (`r = o · inner + i`).
    pub fn row_start(&self, r: usize) -> usize {
        (r / self.inner) * self.len * self.inner + r % self.inner
    }
}

/// In place `y = softmax(y)` or `log_softmax(y)` along the axis of `dims`.
#[derive(Debug)]
pub struct Softmax<'a> {
    /// Which function.
    pub kind: SoftmaxKind,
    /// The axis.
    pub dims: AxisDims,
    /// Input and output.
    pub y: &'a mut Tensor,
}

/// In place `dy = dL/dx` from the forward output `y` (same shape) and `dy = dL/dy`.
#[derive(Debug)]
pub struct SoftmaxBwd<'a> {
    /// Which function.
    pub kind: SoftmaxKind,
    /// The axis.
    pub dims: AxisDims,
    /// The forward pass' output.
    pub y: &'a Tensor,
    /// Output gradient in, input gradient out.
    pub dy: &'a mut Tensor,
}

/// A loss of `[rows, classes]` f32 model outputs against `[rows]` u32 class indices, fused with
/// the gradient of its mean (see [`crate::ops::index_loss`]).
#[derive(Debug)]
pub struct IndexLossCall<'a> {
    /// Which loss.
    pub loss: IndexLoss,
    /// Batch rows.
    pub rows: usize,
    /// Classes.
    pub classes: usize,
    /// Model outputs.
    pub logits: &'a Tensor,
    /// Class indices.
    pub labels: &'a Tensor,
    /// The gradient of the mean loss (overwritten).
    pub dlogits: &'a mut Tensor,
}

/// In place `y = keep ? y / rate : 0` with `keep` drawn per element from `key` (see
/// [`crate::ops::dropout`]); `mask` receives the keep bits.
#[derive(Debug)]
pub struct Dropout<'a> {
    /// The keep probability, in (0, 1].
    pub rate: f32,
    /// An element is kept when its random bits are below this (`rate · 2^32`, floored).
    pub threshold: u64,
    /// The random key.
    pub key: u64,
    /// Input and output.
    pub y: &'a mut Tensor,
    /// The keep bits: U32, `ceil(numel / 32)` words.
    pub mask: &'a mut Tensor,
}

/// In place `dy = keep ? dy / rate : 0` from the forward pass' mask.
#[derive(Debug)]
pub struct DropoutBwd<'a> {
    /// The keep probability.
    pub rate: f32,
    /// The keep bits.
    pub mask: &'a Tensor,
    /// Output gradient in, input gradient out.
    pub dy: &'a mut Tensor,
}

impl Call for Softmax<'_> {
    fn desc(&self) -> OpDesc {
        softmax(self.kind, &self.dims, false)
    }
}

impl Call for SoftmaxBwd<'_> {
    fn desc(&self) -> OpDesc {
        softmax(self.kind, &self.dims, true)
    }
}

fn softmax(kind: SoftmaxKind, dims: &AxisDims, backward: bool) -> OpDesc {
    OpDesc::Softmax {
        kind,
        rows: dims.rows(),
        len: dims.len,
        backward,
    }
}

impl Call for IndexLossCall<'_> {
    fn desc(&self) -> OpDesc {
        OpDesc::IndexLoss {
            loss: self.loss,
            rows: self.rows,
            classes: self.classes,
        }
    }
}

impl Call for Dropout<'_> {
    fn desc(&self) -> OpDesc {
        OpDesc::Dropout {
            n: self.y.numel(),
            backward: false,
        }
    }
}

impl Call for DropoutBwd<'_> {
    fn desc(&self) -> OpDesc {
        OpDesc::Dropout {
            n: self.dy.numel(),
            backward: true,
        }
    }
}
