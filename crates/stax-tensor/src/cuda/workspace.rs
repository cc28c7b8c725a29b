//! How much workspace each op of [`CudaBackend`] allocates: one schedule per op, the single
//! source both the op (through a [`crate::backend::Scratch`]) and
//! [`crate::Backend::workspace_schedule`] read, so a memory plan built on the answer matches
//! what the op does, to the byte and in order.

use super::conv::{extended_bytes, filter_copy_bytes, filter_grad_is_gemm, layout};
use super::cudnn::{LOOK_AHEAD_BYTES, Operands};
use super::{CudaBackend, cublas};
use crate::{
    Conv2dGeometry, ConvPass, DType, Layout, OpDesc, PoolKind, TensorError, WorkspaceStep,
};
use stax_alloc::Category;

/// A workspace schedule being written down.
#[derive(Debug, Default)]
pub(super) struct Schedule {
    steps: Vec<WorkspaceStep>,
    allocs: usize,
}

impl Schedule {
    /// Records an allocation of `bytes`; returns its index for [`Schedule::free`].
    pub(super) fn alloc(&mut self, bytes: usize) -> usize {
        self.steps.push(WorkspaceStep::Alloc(bytes));
        self.allocs += 1;
        self.allocs - 1
    }

    /// Records the free of allocation `i`.
    pub(super) fn free(&mut self, i: usize) {
        self.steps.push(WorkspaceStep::Free(i));
    }

    /// Records a buffer of `bytes` allocated and freed at once (none when 0).
    pub(super) fn scoped(&mut self, bytes: usize) {
        if bytes > 0 {
            let i = self.alloc(bytes);
            self.free(i);
        }
    }

    pub(super) fn finish(self) -> Vec<WorkspaceStep> {
        self.steps
    }
}

impl CudaBackend {
    /// Bytes of the f64 partial sums `bias_grad` of `[rows, cols]` uses (0 when `cols == 0`).
    pub(super) fn bias_grad_bytes(&self, rows: usize, cols: usize) -> usize {
        self.kernels.bias_grad_splits(rows) * cols * 8
    }

    /// cuBLAS's workspace per GEMM: [`cublas::CUBLAS_WORKSPACE_BYTES`], at most the backend's
    /// workspace limit; 0 for an empty product (no GEMM runs).
    pub(super) fn matmul_bytes(&self, m: usize, n: usize, k: usize) -> usize {
        if m == 0 || n == 0 || k == 0 {
            0
        } else {
            cublas::CUBLAS_WORKSPACE_BYTES.min(self.workspace_limit)
        }
    }

    /// Offset of the mean loss (one f32) in `softmax_xent`'s workspace, after `rows` f64 row
    /// losses, 256-byte aligned; the workspace is this plus 4 bytes.
    pub(super) fn softmax_loss_offset(rows: usize) -> usize {
        (rows * 8).next_multiple_of(256)
    }

    /// See [`crate::Backend::workspace_schedule`]. A matmul in one dtype, bias gradient, a
    /// channel bias's gradient and the losses allocate one buffer (bias partials even of 0
    /// bytes, as `bias_grad` of no rows does); the convolutions, batch normalization, the mixed
    /// matmul and the dense layer's update in the backward pass several; nothing else
    /// allocates.
    pub(super) fn op_workspace_schedule(
        &self,
        op: &OpDesc,
    ) -> Result<Vec<WorkspaceStep>, TensorError> {
        let one = |bytes| vec![WorkspaceStep::Alloc(bytes), WorkspaceStep::Free(0)];
        Ok(match *op {
            OpDesc::Conv {
                geometry,
                pass,
                bias,
                dtype,
            } => self.conv_schedule(&geometry, dtype, pass, bias)?,
            OpDesc::BatchNorm {
                geometry, backward, ..
            } => self.batch_norm_schedule(&geometry, backward)?,
            OpDesc::ChannelBias {
                backward: true,
                geometry,
            } if geometry.c > 0 && geometry.per_channel() > 0 => {
                one(self.kernels.moments_bytes(&geometry))
            }
            OpDesc::Matmul { .. } => self.matmul_schedule(op),
            OpDesc::BiasGrad { cols: 0, .. } => Vec::new(),
            OpDesc::BiasGrad { rows, cols } => one(self.bias_grad_bytes(rows, cols)),
            OpDesc::SoftmaxXent { rows, classes } => {
                if rows == 0 || classes == 0 {
                    return Err(TensorError::InvalidArgument {
                        op: "workspace_schedule",
                        reason: format!("softmax_xent of empty logits [{rows}, {classes}]"),
                    });
                }
                one(Self::softmax_loss_offset(rows) + 4)
            }
            OpDesc::DenseAdam {
                m,
                n,
                k,
                dtype,
                input_grad,
            } => self.dense_adam_schedule((m, n, k), dtype, input_grad),
            OpDesc::IndexLoss { rows, classes, .. } => {
                if rows == 0 || classes == 0 {
                    return Err(TensorError::InvalidArgument {
                        op: "workspace_schedule",
                        reason: format!("index_loss of empty logits [{rows}, {classes}]"),
                    });
                }
                // row losses, the mean (padded to 8 bytes) and the first bad row (a u64)
                one(Self::softmax_loss_offset(rows) + 16)
            }
            OpDesc::Pool {
                kind: PoolKind::Max,
                geometry,
                backward: true,
                argmax: false,
                ..
            } if geometry.input_shape().numel() > 0 => {
                one(super::kernels::max_pool_bwd_bytes(&geometry).max(4))
            }
            OpDesc::Pool { .. }
            | OpDesc::Unary { .. }
            | OpDesc::Binary { .. }
            | OpDesc::BiasAdd { .. }
            | OpDesc::Adam { .. }
            | OpDesc::AllFinite { .. }
            | OpDesc::Memory
            | OpDesc::Softmax { .. }
            | OpDesc::Dropout { .. }
            | OpDesc::ChannelBias { .. }
            | OpDesc::NormFold { .. } => Vec::new(),
        })
    }

    /// cuDNN's workspace bytes for `pass` of `g` in `dtype`: the chosen algorithm's once
    /// calibrated, else the bound a search would choose within ([`super::cudnn::Dnn::bound`]).
    pub(super) fn cudnn_workspace(
        &self,
        g: &Conv2dGeometry,
        dtype: DType,
        pass: ConvPass,
    ) -> Result<usize, TensorError> {
        match self.dnn.chosen((g, dtype), self.precision, pass) {
            Some((bytes, _)) => Ok(bytes),
            None => {
                let (conv, _) = layout(g, dtype);
                let limit = self.conv_limit(&(*g, dtype, pass));
                self.dnn.bound(pass, &conv, self.precision, limit)
            }
        }
    }

    /// The workspace one call of `pass` in `dtype` allocates and frees, in order: for a direct
    /// pass ([`CudaBackend::conv_is_direct`]) its kernel's workspace
    /// ([`CudaBackend::direct_workspace_bytes`]; before calibration, for a pass calibration may give them, the larger of that
    /// and the following, so that the bound holds either way); else the kernel in
    /// cuDNN's layout (or its gradient) unless it is stored so, the extended input for
    /// asymmetric padding (both in `dtype`), cuDNN's workspace, and for the filter gradient
    /// with a bias first the bias-gradient partials (f64). The passes in `conv.rs` take
    /// exactly these steps.
    pub(super) fn conv_schedule(
        &self,
        g: &Conv2dGeometry,
        dtype: DType,
        pass: ConvPass,
        bias: bool,
    ) -> Result<Vec<WorkspaceStep>, TensorError> {
        g.validate("workspace_schedule")?;
        if self.conv_is_direct(g, dtype, pass) {
            self.note_direct(g, dtype, pass);
            return Ok(self.direct_schedule(g, dtype, pass));
        }
        let cudnn = self.cudnn_schedule(g, dtype, pass, bias)?;
        // before calibration either may be chosen: the bound is the larger
        if self.direct_is_timed(g, dtype, pass) && !self.conv_is_calibrated(g, dtype, pass) {
            let direct = self.direct_schedule(g, dtype, pass);
            if WorkspaceStep::peak(&direct) > WorkspaceStep::peak(&cudnn) {
                return Ok(direct);
            }
        }
        Ok(cudnn)
    }

    /// The direct kernels' schedule: their workspace ([`CudaBackend::direct_workspace_bytes`]:
    /// the filter gradient's partials, `conv_wgmma.cu`'s packed kernel), scoped, or none.
    fn direct_schedule(
        &self,
        g: &Conv2dGeometry,
        dtype: DType,
        pass: ConvPass,
    ) -> Vec<WorkspaceStep> {
        let mut s = Schedule::default();
        let bytes = self.direct_workspace_bytes(g, dtype, pass);
        if bytes > 0 {
            s.scoped(bytes);
        }
        s.finish()
    }

    /// [`Self::conv_schedule`] of a pass cuDNN (or our GEMM or im2col forms) runs.
    fn cudnn_schedule(
        &self,
        g: &Conv2dGeometry,
        dtype: DType,
        pass: ConvPass,
        bias: bool,
    ) -> Result<Vec<WorkspaceStep>, TensorError> {
        let mut s = Schedule::default();
        let (_, ext) = layout(g, dtype);
        let gemm = pass == ConvPass::BackwardFilter
            && (filter_grad_is_gemm(g) || self.filter_grad_is_im2col(g, dtype));
        let cudnn = if gemm {
            0
        } else {
            self.cudnn_workspace(g, dtype, pass)?
        };
        let filter = Some(filter_copy_bytes(g, dtype)).filter(|&b| b > 0);
        let ext_bytes = ext.map(|e| extended_bytes(g, &e, dtype));
        let frees = match pass {
            ConvPass::Forward => {
                let f = filter.map(|b| s.alloc(b));
                let e = ext_bytes.map(|b| s.alloc(b));
                s.scoped(cudnn);
                [f, e]
            }
            ConvPass::BackwardData => {
                let f = filter.map(|b| s.alloc(b));
                let e = ext_bytes.map(|b| s.alloc(b));
                s.scoped(cudnn);
                [e, f]
            }
            ConvPass::BackwardFilter => {
                if bias {
                    let p = s.alloc(self.conv_bias_partials(g).max(1));
                    s.free(p);
                }
                if filter_grad_is_gemm(g) {
                    s.scoped(self.matmul_bytes(g.c_in, g.c_out, g.n * g.h * g.w));
                    return Ok(s.finish());
                }
                if self.filter_grad_is_im2col(g, dtype) {
                    self.im2col_schedule(g, dtype, &mut s);
                    return Ok(s.finish());
                }
                let e = ext_bytes.map(|b| s.alloc(b));
                let d = filter.map(|b| s.alloc(b));
                s.scoped(cudnn);
                [e, d]
            }
        };
        frees.into_iter().flatten().for_each(|i| s.free(i));
        Ok(s.finish())
    }

    /// Bytes of the partial sums of a convolution's bias gradient.
    fn conv_bias_partials(&self, g: &Conv2dGeometry) -> usize {
        let ch = g.output_channels();
        match g.layout {
            Layout::Nhwc => self.bias_grad_bytes(ch.outer, ch.c),
            Layout::Nchw => self.kernels.moments_bytes(&ch),
        }
    }

    /// Batch normalization's workspace: the partial sums, then the per-channel coefficients
    /// (forward: `scale`, `c` floats; backward: the input gradient's three, `3 c`); the
    /// partials are freed first (the input gradient's sums, when asked for, reuse them
    /// before: nothing is allocated in between).
    pub(super) fn batch_norm_schedule(
        &self,
        g: &crate::ChannelGeometry,
        backward: bool,
    ) -> Result<Vec<WorkspaceStep>, TensorError> {
        if g.c == 0 || g.per_channel() == 0 {
            return Err(TensorError::InvalidArgument {
                op: "workspace_schedule",
                reason: format!("batch_norm of an empty view {g:?}"),
            });
        }
        let mut s = Schedule::default();
        let p = s.alloc(self.kernels.moments_bytes(g));
        let c = s.alloc(g.c * if backward { 3 } else { 1 } * 4);
        s.free(p);
        s.free(c);
        Ok(s.finish())
    }

    /// Whether `pass` of `g` in `dtype` runs an algorithm cuDNN's search chooses: not the
    /// direct kernels, nor the filter gradient as a GEMM ([`filter_grad_is_gemm`]) or im2col.
    pub(super) fn conv_is_searched(
        &self,
        g: &Conv2dGeometry,
        dtype: DType,
        pass: ConvPass,
    ) -> bool {
        !(self.conv_is_direct(g, dtype, pass)
            || (pass == ConvPass::BackwardFilter
                && (filter_grad_is_gemm(g) || self.filter_grad_is_im2col(g, dtype))))
    }

    /// Whether `pass` of `g` in `dtype` needs no search: its algorithm is chosen, or it is not
    /// cuDNN's ([`Self::conv_is_searched`]).
    pub(super) fn conv_is_calibrated(
        &self,
        g: &Conv2dGeometry,
        dtype: DType,
        pass: ConvPass,
    ) -> bool {
        !self.conv_is_searched(g, dtype, pass)
            || self.dnn.chosen((g, dtype), self.precision, pass).is_some()
    }

    /// Chooses the algorithm of `pass` for `g` in `dtype`, if not chosen yet, by timing the
    /// candidates on temporary buffers of its shapes, then releases them and what the search
    /// left cached (see [`crate::Backend::calibrate`]). With `look_ahead` (an explicit
    /// calibration, not a pass calibrating itself inside a step) the search also times the
    /// candidates over the limit where the device has room
    /// ([`super::cudnn::LOOK_AHEAD_BYTES`]).
    pub(super) fn calibrate_conv(
        &self,
        (g, dtype, pass): (&Conv2dGeometry, DType, ConvPass),
        look_ahead: bool,
    ) -> Result<(), TensorError> {
        if self.conv_is_calibrated(g, dtype, pass) {
            return Ok(());
        }
        g.validate("calibrate")?;
        self.bind()?;
        let (conv, _) = layout(g, dtype);
        let size = dtype.size_bytes();
        let scratch = |bytes: usize| self.allocator.allocate(bytes.max(1), Category::Workspace);
        // the operands as cuDNN sees them: extended input, channels padded (conv.c)
        let x = scratch(g.n * conv.h * conv.w * conv.c * size)?;
        let w = scratch(g.kh * g.kw * conv.c * g.c_out * size)?;
        let y = scratch(g.output_shape().numel() * size)?;
        let ops = Operands {
            x: x.addr(),
            w: w.addr(),
            y: y.addr(),
        };
        let room = if look_ahead { LOOK_AHEAD_BYTES } else { 0 };
        let search = (self.conv_limit(&(*g, dtype, pass)), &self.allocator, room);
        let key = (pass, &conv, self.precision);
        self.dnn.prepare(key, ops, search, &self.kernels)?;
        if self.direct_is_timed(g, dtype, pass) {
            self.time_direct(g, dtype, pass, ops)?;
        }
        drop((x, w, y));
        super::cudnn::release_search(&self.allocator)
    }
}
