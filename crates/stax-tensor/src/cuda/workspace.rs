//! How much workspace each op of [`CudaBackend`] allocates: one formula per op, used both by
//! the op itself and by [`crate::Backend::workspace_schedule`], so a memory plan built on the
//! answer matches what the op does, to the byte and in order.

use super::{CudaBackend, cublas};
use crate::{TensorError, WorkspaceOp, WorkspaceStep};

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

    /// See [`crate::Backend::workspace_schedule`]. Every op but the convolutions allocates
    /// one buffer (bias partials even of 0 bytes, as `bias_grad` of no rows does).
    pub(super) fn op_workspace_schedule(
        &self,
        op: &WorkspaceOp,
    ) -> Result<Vec<WorkspaceStep>, TensorError> {
        let one = |bytes| vec![WorkspaceStep::Alloc(bytes), WorkspaceStep::Free(0)];
        Ok(match *op {
            WorkspaceOp::Conv { geometry, pass } => {
                self.conv_workspace_schedule(&geometry, pass)?
            }
            WorkspaceOp::Matmul { m, n, k } => WorkspaceStep::single(self.matmul_bytes(m, n, k)),
            WorkspaceOp::BiasGrad { cols: 0, .. } => Vec::new(),
            WorkspaceOp::BiasGrad { rows, cols } => one(self.bias_grad_bytes(rows, cols)),
            WorkspaceOp::SoftmaxXent { rows, classes } => {
                if rows == 0 || classes == 0 {
                    return Err(TensorError::InvalidArgument {
                        op: "workspace_schedule",
                        reason: format!("softmax_xent of empty logits [{rows}, {classes}]"),
                    });
                }
                one(Self::softmax_loss_offset(rows) + 4)
            }
        })
    }
}
