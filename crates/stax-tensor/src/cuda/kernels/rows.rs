//! Launchers of the row kernels (softmax and log-softmax over an axis, the losses with integer
//! labels) and of dropout.

use super::{Kernels, driver};
use crate::backend::AxisDims;
use crate::{DType, IndexLoss, SoftmaxKind, TensorError};
use cudarc::driver::PushKernelArg;

impl Kernels {
    /// In place softmax or log-softmax of `dtype` elements at `y` along the axis of `dims`.
    pub(crate) fn softmax(
        &self,
        dtype: DType,
        y: u64,
        dims: &AxisDims,
        kind: SoftmaxKind,
    ) -> Result<(), TensorError> {
        let (rows, len, inner, code) = (dims.rows(), dims.len, dims.inner, kind.code());
        if rows == 0 || len == 0 {
            return Ok(());
        }
        let (f, sym) = (self.typed("softmax", dtype)?, "softmax");
        // SAFETY: `softmax_<dtype>(T *y, size_t rows, size_t len, size_t inner, int kind)`; y
        // holds rows * len elements of `dtype` (outer * len * inner); one warp per row, blocks
        // of whole warps.
        unsafe {
            launch!(self.stream, f, self.grid(rows.saturating_mul(32)); &y, &rows, &len, &inner, &code)
                .map(drop)
        }
        .map_err(driver(sym))
    }

    /// In place `dy = dL/dx` of the softmax or log-softmax from its output `y` (both `dtype`,
    /// shaped as `dims`).
    pub(crate) fn softmax_bwd(
        &self,
        dtype: DType,
        y: u64,
        dy: u64,
        dims: &AxisDims,
        kind: SoftmaxKind,
    ) -> Result<(), TensorError> {
        let (rows, len, inner, code) = (dims.rows(), dims.len, dims.inner, kind.code());
        if rows == 0 || len == 0 {
            return Ok(());
        }
        let (f, sym) = (self.typed("softmax_bwd", dtype)?, "softmax_bwd");
        // SAFETY: `softmax_bwd_<dtype>(const T *y, T *dy, size_t rows, size_t len, size_t
        // inner, int kind)`; y and dy hold rows * len elements of `dtype` each; one warp per
        // row, blocks of whole warps.
        unsafe {
            launch!(self.stream, f, self.grid(rows.saturating_mul(32)); &y, &dy, &rows, &len, &inner, &code)
                .map(drop)
        }
        .map_err(driver(sym))
    }

    /// The losses of `[n, k]` f32 logits against `n` u32 labels: writes `dlogits`, the row
    /// losses (`n` doubles at `row_loss`), their mean (one f32 at `loss`) and, at `bad` (a u64,
    /// set to all ones first), the first row whose label is out of range.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn index_loss(
        &self,
        which: IndexLoss,
        (logits, labels, dlogits): (u64, u64, u64),
        (row_loss, loss, bad): (u64, u64, u64),
        n: usize,
        k: usize,
    ) -> Result<(), TensorError> {
        self.fill_u32(bad, u32::MAX, 2)?;
        let (kern, code) = ("index_loss_f32", which.code());
        // SAFETY: `index_loss_f32(const float *logits, const u32 *labels, float *dlogits,
        // double *row_loss, u64 *bad, size_t n, size_t k, int loss)`; logits and dlogits hold
        // n*k floats, labels n words, row_loss n doubles, bad one 8-byte aligned u64; one warp
        // per row, blocks of whole warps.
        unsafe {
            launch!(self.stream, self.function(kern)?, self.grid(n.saturating_mul(32));
                &logits, &labels, &dlogits, &row_loss, &bad, &n, &k, &code)
        }
        .map_err(driver(kern))?;
        self.mean_f64(row_loss, loss, n)
    }

    /// In place dropout of `n` elements of `dtype` at `y` (keep when the element's bits under
    /// `key` are below `threshold`, then divide by `rate`); `mask` receives `ceil(n/32)` words.
    pub(crate) fn dropout(
        &self,
        dtype: DType,
        (y, mask): (u64, u64),
        n: usize,
        (key, threshold): (u64, u64),
        rate: f32,
    ) -> Result<(), TensorError> {
        if n == 0 {
            return Ok(());
        }
        let (f, sym) = (self.typed("dropout", dtype)?, "dropout");
        // SAFETY: `dropout_<dtype>(T *y, u32 *mask, size_t n, u64 key, u64 threshold, float
        // rate)`; y holds n elements of `dtype`, mask ceil(n/32) words; blocks are whole warps
        // (256 threads), as the ballot needs.
        unsafe {
            launch!(self.stream, f, self.grid(n); &y, &mask, &n, &key, &threshold, &rate).map(drop)
        }
        .map_err(driver(sym))
    }

    /// In place dropout backward of `n` elements of `dtype` at `dy` from `mask`.
    pub(crate) fn dropout_bwd(
        &self,
        dtype: DType,
        dy: u64,
        mask: u64,
        n: usize,
        rate: f32,
    ) -> Result<(), TensorError> {
        if n == 0 {
            return Ok(());
        }
        let (f, sym) = (self.typed("dropout_bwd", dtype)?, "dropout_bwd");
        // SAFETY: `dropout_bwd_<dtype>(T *dy, const u32 *mask, size_t n, float rate)`; dy holds
        // n elements of `dtype`, mask ceil(n/32) words.
        unsafe { launch!(self.stream, f, self.grid(n); &dy, &mask, &n, &rate).map(drop) }
            .map_err(driver(sym))
    }
}
