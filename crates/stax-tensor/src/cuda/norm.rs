//! The per-channel ops of [`CudaBackend`] (batch normalization, the channel bias): our
//! `kernels/norm.cu` reductions, each workspace block taken by the op's schedule
//! ([`CudaBackend::batch_norm_schedule`]).

use super::CudaBackend;
use crate::backend::{
    BatchNorm, BatchNormBwd, BatchNormFold, Call, ChannelBiasAdd, ChannelBiasGrad, NormStats,
    Scratch,
};
use crate::{Backend, Checked, NormOps, TensorError};

/// The address of an optional tensor (0 for none).
fn addr(t: Option<&crate::Tensor>) -> u64 {
    t.map_or(0, crate::Tensor::addr)
}

impl NormOps for CudaBackend {
    fn batch_norm(&self, c: Checked<BatchNorm<'_>>) -> Result<(), TensorError> {
        const OP: &str = "batch_norm";
        let desc = c.get().desc();
        let BatchNorm {
            g,
            eps,
            x,
            gamma,
            beta,
            y,
            stats,
            relu,
            add,
        } = c.into_inner();
        self.bind()?;
        let mut ws = Scratch::new(OP, &self.allocator, self.workspace_schedule(&desc)?);
        let (partial, scale) = (ws.alloc()?, ws.alloc()?);
        let (xa, dtype) = (x.addr(), x.dtype());
        let (mean, rstd) = stats.addrs();
        let out = (mean, rstd, ws.addr(scale));
        if let NormStats::Computed { .. } = stats {
            let splits =
                self.kernels
                    .channel_moments(dtype, &g, (xa, xa, 0, 0), ws.addr(partial))?;
            let m = g.per_channel() as f64;
            self.kernels
                .bn_finish((ws.addr(partial), splits), g.c, m, eps, addr(gamma), out)?;
        } else {
            self.kernels
                .bn_scale(g.c, (addr(gamma), rstd, ws.addr(scale)))?;
        }
        ws.free(partial)?;
        let per_channel = (mean, ws.addr(scale), addr(beta));
        let (mask, add) = (addr(relu.as_deref()), addr(add));
        self.kernels
            .bn_apply((&g, dtype), (xa, y.addr(), add, mask), per_channel)?;
        ws.free(scale)?;
        ws.finish()
    }

    fn batch_norm_bwd(&self, c: Checked<BatchNormBwd<'_>>) -> Result<(), TensorError> {
        const OP: &str = "batch_norm_bwd";
        let desc = c.get().desc();
        let BatchNormBwd {
            g,
            x,
            gamma,
            mean,
            rstd,
            relu,
            dy,
            need_dx,
            dgamma,
            dbeta,
            dx_sum,
        } = c.into_inner();
        self.bind()?;
        let mut ws = Scratch::new(OP, &self.allocator, self.workspace_schedule(&desc)?);
        let (partial, coef) = (ws.alloc()?, ws.alloc()?);
        let (xa, dya, dtype) = (x.addr(), dy.addr(), x.dtype());
        let mask = addr(relu);
        let moments = (dya, xa, mean.addr(), mask);
        let splits = self
            .kernels
            .channel_moments(dtype, &g, moments, ws.addr(partial))?;
        let m = g.per_channel() as f64;
        let grads = (addr(dgamma.as_deref()), addr(dbeta.as_deref()));
        let (p, k) = (ws.addr(partial), ws.addr(coef));
        self.kernels
            .bn_bwd_finish((p, splits), g.c, m, (addr(gamma), rstd.addr()), grads, k)?;
        let view = (&g, dtype);
        match (need_dx, dx_sum) {
            (true, Some(db)) => {
                // the partials again: the sums in the apply pass where it vectorizes, else after
                let (sums, per_channel) = ((xa, dya, mask), (mean.addr(), k));
                let splits = match self.kernels.bn_bwd_apply_sum(view, sums, per_channel, p)? {
                    Some(splits) => splits,
                    None => {
                        self.kernels.bn_bwd_apply(view, sums, per_channel)?;
                        (self.kernels).channel_moments(dtype, &g, (dya, 0, 0, 0), p)?
                    }
                };
                (self.kernels).channel_sum_finish(dtype, p, splits, g.c, db.addr())?;
                ws.free(partial)?;
            }
            (true, None) => {
                ws.free(partial)?;
                (self.kernels).bn_bwd_apply(view, (xa, dya, mask), (mean.addr(), k))?;
            }
            (false, _) => ws.free(partial)?,
        }
        ws.free(coef)?;
        ws.finish()
    }

    fn channel_bias_add(&self, c: Checked<ChannelBiasAdd<'_>>) -> Result<(), TensorError> {
        let ChannelBiasAdd { g, y, b } = c.into_inner();
        self.bind()?;
        self.kernels
            .channel_bias_add(y.dtype(), &g, y.addr(), b.addr())
    }

    fn channel_bias_grad(&self, c: Checked<ChannelBiasGrad<'_>>) -> Result<(), TensorError> {
        const OP: &str = "channel_bias_grad";
        let desc = c.get().desc();
        let ChannelBiasGrad { g, dy, db } = c.into_inner();
        self.bind()?;
        if g.c == 0 {
            return Ok(());
        }
        if g.per_channel() == 0 {
            return self.kernels.fill_u32(db.addr(), 0, g.c);
        }
        let mut ws = Scratch::new(OP, &self.allocator, self.workspace_schedule(&desc)?);
        let partial = ws.alloc()?;
        let p = ws.addr(partial);
        let dtype = dy.dtype();
        let splits = self
            .kernels
            .channel_moments(dtype, &g, (dy.addr(), 0, 0, 0), p)?;
        self.kernels
            .channel_sum_finish(dtype, p, splits, g.c, db.addr())?;
        ws.free(partial)?;
        ws.finish()
    }

    fn batch_norm_fold(&self, c: Checked<BatchNormFold<'_>>) -> Result<(), TensorError> {
        let BatchNormFold {
            k,
            c,
            inputs,
            outputs,
        } = c.into_inner();
        self.bind()?;
        if c == 0 {
            return Ok(());
        }
        let i = inputs;
        let ins = [
            i.w.addr(),
            i.b0.addr(),
            addr(i.gamma),
            i.mean.addr(),
            i.rstd.addr(),
            i.gt.addr(),
            i.sh.addr(),
            i.sd.addr(),
        ];
        let o = outputs;
        let outs = [
            o.dw.addr(),
            o.w_a.addr(),
            o.w_c.addr(),
            o.bp.addr(),
            o.db0.addr(),
            addr(o.dgamma.as_deref()),
            addr(o.dbeta.as_deref()),
        ];
        self.kernels.bn_fold((k, c, i.count), ins, outs)
    }
}
