//! The poolings of [`CudaBackend`] (max, sum, average; forward and backward): our
//! `kernels/pool.cu` kernels in the operands' dtype (f32, bf16 or f16; sums accumulated in
//! f32, each output rounded once). Max pooling's backward pass gathers each input's gradient
//! from the windows' argmax offsets: those its forward pass wrote ([`crate::ops::max_pool2d_argmax`]),
//! or ones it computes first into one scheduled buffer.

use super::CudaBackend;
use crate::backend::{MaxFrom, Pool2d, Pool2dBwd, Scratch};
use crate::{OpDesc, PoolKind, TensorError};

impl CudaBackend {
    /// The forward pooling (see [`crate::ops::pool2d`], [`crate::ops::max_pool2d_argmax`]).
    pub(super) fn pool_forward(&self, c: Pool2d<'_>) -> Result<(), TensorError> {
        let Pool2d {
            kind,
            g,
            x,
            y,
            argmax,
        } = c;
        self.bind()?;
        let dtype = x.dtype();
        match kind {
            PoolKind::Max => {
                let arg = argmax.map_or(0, |a| a.addr());
                self.kernels.max_pool(dtype, &g, (x.addr(), y.addr(), arg))
            }
            _ => self.kernels.sum_pool(dtype, kind, &g, x.addr(), y.addr()),
        }
    }

    /// The input gradient of a pooling (see [`crate::ops::pool2d_bwd`],
    /// [`crate::ops::max_pool2d_bwd_argmax`]).
    pub(super) fn pool_backward(&self, c: Pool2dBwd<'_>) -> Result<(), TensorError> {
        let Pool2dBwd {
            kind,
            g,
            from,
            dy,
            dx,
        } = c;
        self.bind()?;
        let dtype = dy.dtype();
        match (kind, from) {
            (PoolKind::Max, Some(MaxFrom::Argmax(arg))) => {
                let addrs = (arg.addr(), dy.addr(), dx.addr());
                self.kernels.max_pool_gather(dtype, &g, addrs)
            }
            (PoolKind::Max, Some(MaxFrom::Input(x))) => {
                let desc = OpDesc::Pool {
                    kind,
                    geometry: g,
                    backward: true,
                    dtype,
                    argmax: false,
                };
                let mut ws = Scratch::new("pool2d_bwd", &self.allocator, {
                    self.op_workspace_schedule(&desc)?
                });
                let i = ws.alloc()?;
                self.kernels
                    .max_pool(dtype, &g, (x.addr(), 0, ws.addr(i)))?;
                let addrs = (ws.addr(i), dy.addr(), dx.addr());
                self.kernels.max_pool_gather(dtype, &g, addrs)?;
                ws.free(i)?;
                ws.finish()
            }
            (PoolKind::Max, None) => Err(TensorError::InvalidArgument {
                op: "pool2d_bwd",
                reason: "max pooling's gradient reads the forward input or its argmax".into(),
            }),
            _ => self
                .kernels
                .sum_pool_bwd(dtype, kind, &g, dy.addr(), dx.addr()),
        }
    }
}
