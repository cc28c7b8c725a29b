//! How much workspace each op of [`CudaBackend`] allocates: one formula per op, used both by
//! the op itself and by [`crate::Backend::workspace_bytes`], so a memory plan built on the
//! answer matches what the op does, to the byte.

use super::{CudaBackend, cublas};
use crate::{TensorError, WorkspaceOp};

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

    /// See [`crate::Backend::workspace_bytes`].
    pub(super) fn op_workspace_bytes(&self, op: &WorkspaceOp) -> Result<usize, TensorError> {
        Ok(match *op {
            WorkspaceOp::Conv { geometry, pass } => self.conv_workspace_bytes(&geometry, pass)?,
            WorkspaceOp::Matmul { m, n, k } => self.matmul_bytes(m, n, k),
            WorkspaceOp::BiasGrad { rows, cols } => self.bias_grad_bytes(rows, cols),
            WorkspaceOp::SoftmaxXent { rows, classes } => {
                if rows == 0 || classes == 0 {
                    return Err(TensorError::InvalidArgument {
                        op: "workspace_bytes",
                        reason: format!("softmax_xent of empty logits [{rows}, {classes}]"),
                    });
                }
                Self::softmax_loss_offset(rows) + 4
            }
        })
    }
}
