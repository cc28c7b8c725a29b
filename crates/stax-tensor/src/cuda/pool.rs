//! The poolings of [`CudaBackend`] (max, sum, average; forward and backward): our
//! `kernels/pool.cu` kernels in the operands' dtype (f32, bf16 or f16; sums accumulated in
//! f32, each output rounded once), max pooling's backward pass through one scheduled argmax
//! buffer.

use super::CudaBackend;
use crate::backend::{Pool2d, Pool2dBwd, Scratch};
use crate::{OpDesc, PoolKind, TensorError};

impl CudaBackend {
    /// The forward pooling (see [`crate::ops::pool2d`]).
    pub(super) fn pool_forward(&self, c: Pool2d<'_>) -> Result<(), TensorError> {
        let Pool2d { kind, g, x, y } = c;
        self.bind()?;
        let dtype = x.dtype();
        match kind {
            PoolKind::Max => self.kernels.max_pool(dtype, &g, x.addr(), y.addr()),
            _ => self.kernels.sum_pool(dtype, kind, &g, x.addr(), y.addr()),
        }
    }

    /// The input gradient of a pooling (see [`crate::ops::pool2d_bwd`]).
    pub(super) fn pool_backward(&self, c: Pool2dBwd<'_>) -> Result<(), TensorError> {
        let Pool2dBwd { kind, g, x, dy, dx } = c;
        self.bind()?;
        let dtype = dy.dtype();
        match (kind, x) {
            (PoolKind::Max, Some(x)) => {
                let desc = OpDesc::Pool {
                    kind,
                    geometry: g,
                    backward: true,
                    dtype,
                };
                let mut ws = Scratch::new("pool2d_bwd", &self.allocator, {
                    self.op_workspace_schedule(&desc)?
                });
                let i = ws.alloc()?;
                let addrs = (x.addr(), dy.addr(), dx.addr());
                self.kernels.max_pool_bwd(dtype, &g, addrs, ws.addr(i))?;
                ws.free(i)?;
                ws.finish()
            }
            (PoolKind::Max, None) => Err(TensorError::InvalidArgument {
                op: "pool2d_bwd",
                reason: "max pooling's gradient reads the forward input".into(),
            }),
            _ => self
                .kernels
                .sum_pool_bwd(dtype, kind, &g, dy.addr(), dx.addr()),
        }
    }
}
