//! The op families of [`CudaBackend`] but the convolutions (`conv.rs`): copies and fills,
//! our elementwise, loss and Adam kernels. The front end ([`crate::ops`]) has
//! checked every operand; each op binds the context, takes its workspace by its schedule and
//! launches.

use super::{CudaBackend, driver};
use crate::backend::{
    Adam, AllFinite, BiasAdd, BiasGrad, Binary, Cast, Concat, Copy, CopyIn, CopyInAsync, CopyOut,
    DenseAdam, Fill, Scratch, SoftmaxXent, Split, Unary, UnaryBwd,
};
use crate::backend::{Dropout, DropoutBwd, IndexLossCall, Softmax, SoftmaxBwd};
use crate::dtype::{bf16, f16};
use crate::{
    Backend, Checked, DType, ElementwiseOps, LossOps, MemoryOps, OptimOps, TensorError, Upload,
};

impl MemoryOps for CudaBackend {
    fn upload(&self, c: Checked<CopyIn<'_>>) -> Result<(), TensorError> {
        let CopyIn { src, dst } = c.into_inner();
        self.bind()?;
        self.staging.upload(src, dst.addr())
    }

    fn upload_async(&self, c: Checked<CopyInAsync>) -> Result<Upload, TensorError> {
        let CopyInAsync { src, dst } = c.into_inner();
        self.bind()?;
        self.staging.upload_async(src, dst)
    }

    fn download(&self, c: Checked<CopyOut<'_>>) -> Result<(), TensorError> {
        let CopyOut { src, dst } = c.into_inner();
        self.bind()?;
        self.staging.download(src.addr(), dst)
    }

    fn copy(&self, c: Checked<Copy<'_>>) -> Result<(), TensorError> {
        let Copy { src, dst } = c.into_inner();
        if src.bytes() == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: both are live device buffers of this context holding `src.bytes()` bytes
        // (checked: same shape and dtype); distinct allocations never overlap (`dst` is the
        // only handle to its buffer); the copy is ordered on the compute stream.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(
                dst.addr(),
                src.addr(),
                src.bytes(),
                self.stream.cu_stream(),
            )
        }
        .map_err(driver("cuMemcpyDtoDAsync"))
    }

    fn fill(&self, c: Checked<Fill<'_>>) -> Result<(), TensorError> {
        let Fill { t, value } = c.into_inner();
        self.bind()?;
        let (addr, n) = (t.addr(), t.numel());
        match t.dtype() {
            DType::F32 => self.kernels.fill_u32(addr, value.to_bits(), n),
            DType::U32 => self.kernels.fill_u32(addr, 0, n),
            DType::BF16 => self
                .kernels
                .fill_u16(addr, bf16::from_f32(value).to_bits(), n),
            DType::F16 => self
                .kernels
                .fill_u16(addr, f16::from_f32(value).to_bits(), n),
        }
    }

    fn concat(&self, c: Checked<Concat<'_>>) -> Result<(), TensorError> {
        let c = c.into_inner();
        let (outer, inners, total) = c.blocks();
        self.bind()?;
        let mut off = 0;
        for (t, inner) in c.inputs.iter().zip(inners) {
            let block = (outer, inner, (inner, 0), (total, off));
            self.kernels
                .copy_block(c.out.dtype(), t.addr(), c.out.addr(), block)?;
            off += inner;
        }
        Ok(())
    }

    fn split(&self, c: Checked<Split<'_>>) -> Result<(), TensorError> {
        let c = c.into_inner();
        let (outer, inners, total) = c.blocks();
        self.bind()?;
        let mut off = 0;
        for (t, inner) in c.outs.iter().zip(inners) {
            let block = (outer, inner, (total, off), (inner, 0));
            self.kernels
                .copy_block(c.src.dtype(), c.src.addr(), t.addr(), block)?;
            off += inner;
        }
        Ok(())
    }

    fn cast(&self, c: Checked<Cast<'_>>) -> Result<(), TensorError> {
        let Cast { src, dst } = c.into_inner();
        self.bind()?;
        self.kernels.cast(
            (src.dtype(), dst.dtype()),
            src.addr(),
            dst.addr(),
            src.numel(),
        )
    }
}

impl ElementwiseOps for CudaBackend {
    fn unary(&self, c: Checked<Unary<'_>>) -> Result<(), TensorError> {
        let Unary { act, y, aux } = c.into_inner();
        self.bind()?;
        self.activate(act, aux.map_or(0, |m| m.addr()), y)
    }

    fn unary_bwd(&self, c: Checked<UnaryBwd<'_>>) -> Result<(), TensorError> {
        let UnaryBwd { act, saved, dy } = c.into_inner();
        self.bind()?;
        self.activate_bwd(act, saved, dy)
    }

    fn binary(&self, c: Checked<Binary<'_>>) -> Result<(), TensorError> {
        let Binary {
            op,
            a,
            b,
            relu,
            masked_by,
        } = c.into_inner();
        self.bind()?;
        let (n, ab) = (a.numel(), (a.addr(), b.addr()));
        match masked_by {
            Some(m) => (self.kernels).binary_masked(a.dtype(), (ab, m.addr()), n, op.code()),
            None => {
                let mask = relu.map_or(0, |m| m.addr());
                (self.kernels).binary(a.dtype(), (ab.0, ab.1, mask), n, op.code())
            }
        }
    }

    fn bias_add(&self, c: Checked<BiasAdd<'_>>) -> Result<(), TensorError> {
        let BiasAdd { cols, y, b, .. } = c.into_inner();
        self.bind()?;
        if cols == 0 {
            return Ok(());
        }
        self.kernels
            .bias_add(y.dtype(), y.addr(), b.addr(), y.numel(), cols)
    }

    fn bias_grad(&self, c: Checked<BiasGrad<'_>>) -> Result<(), TensorError> {
        const OP: &str = "bias_grad";
        let desc = crate::backend::Call::desc(c.get());
        let BiasGrad { rows, cols, dy, db } = c.into_inner();
        self.bind()?;
        if cols == 0 {
            return Ok(());
        }
        let mut ws = Scratch::new(OP, &self.allocator, self.workspace_schedule(&desc)?);
        let i = ws.alloc()?;
        let (d, p) = (dy.addr(), ws.addr(i));
        self.kernels
            .bias_grad(dy.dtype(), d, 0, p, db.addr(), rows, cols)?;
        ws.free(i)?;
        ws.finish()
    }

    fn softmax(&self, c: Checked<Softmax<'_>>) -> Result<(), TensorError> {
        let Softmax { kind, dims, y } = c.into_inner();
        self.bind()?;
        self.kernels.softmax(y.dtype(), y.addr(), &dims, kind)
    }

    fn softmax_bwd(&self, c: Checked<SoftmaxBwd<'_>>) -> Result<(), TensorError> {
        let SoftmaxBwd { kind, dims, y, dy } = c.into_inner();
        self.bind()?;
        self.kernels
            .softmax_bwd(dy.dtype(), y.addr(), dy.addr(), &dims, kind)
    }

    fn dropout(&self, c: Checked<Dropout<'_>>) -> Result<(), TensorError> {
        let Dropout {
            rate,
            threshold,
            key,
            y,
            mask,
        } = c.into_inner();
        self.bind()?;
        let (n, bufs) = (y.numel(), (y.addr(), mask.addr()));
        self.kernels
            .dropout(y.dtype(), bufs, n, (key, threshold), rate)
    }

    fn dropout_bwd(&self, c: Checked<DropoutBwd<'_>>) -> Result<(), TensorError> {
        let DropoutBwd { rate, mask, dy } = c.into_inner();
        self.bind()?;
        self.kernels
            .dropout_bwd(dy.dtype(), dy.addr(), mask.addr(), dy.numel(), rate)
    }
}

impl LossOps for CudaBackend {
    fn softmax_xent(&self, c: Checked<SoftmaxXent<'_>>) -> Result<f32, TensorError> {
        const OP: &str = "softmax_xent";
        let desc = crate::backend::Call::desc(c.get());
        let SoftmaxXent {
            rows,
            classes,
            logits,
            labels,
            dlogits,
        } = c.into_inner();
        self.bind()?;
        // n row losses (f64), then the mean (f32) at a 256-byte aligned offset.
        let mut ws = Scratch::new(OP, &self.allocator, self.workspace_schedule(&desc)?);
        let i = ws.alloc()?;
        let loss_addr = ws.addr(i) + Self::softmax_loss_offset(rows) as u64;
        let (x, y, d) = (logits.addr(), labels.addr(), dlogits.addr());
        self.kernels
            .softmax_xent(x, y, d, ws.addr(i), loss_addr, rows, classes)?;
        let mut loss = [0u8; 4];
        self.staging.download(loss_addr, &mut loss)?;
        ws.free(i)?;
        ws.finish()?;
        Ok(f32::from_le_bytes(loss))
    }

    /// As `softmax_xent`, the workspace's mean followed (8 bytes on) by the first row whose
    /// label is out of range (`u64::MAX` for none), both read back in one copy.
    fn index_loss(&self, c: Checked<IndexLossCall<'_>>) -> Result<f32, TensorError> {
        const OP: &str = "index_loss";
        let desc = crate::backend::Call::desc(c.get());
        let IndexLossCall {
            loss,
            rows,
            classes,
            logits,
            labels,
            dlogits,
        } = c.into_inner();
        self.bind()?;
        let mut ws = Scratch::new(OP, &self.allocator, self.workspace_schedule(&desc)?);
        let i = ws.alloc()?;
        let mean = ws.addr(i) + Self::softmax_loss_offset(rows) as u64;
        let tensors = (logits.addr(), labels.addr(), dlogits.addr());
        let outs = (ws.addr(i), mean, mean + 8);
        self.kernels
            .index_loss(loss, tensors, outs, rows, classes)?;
        // [mean f32, 4 bytes of padding] and the bad row, as two little-endian words
        let mut back = [0u64; 2];
        self.staging
            .download(mean, bytemuck::bytes_of_mut(&mut back))?;
        ws.free(i)?;
        ws.finish()?;
        if back[1] != u64::MAX {
            let mut label = [0u8; 4];
            self.staging
                .download(labels.addr() + 4 * back[1], &mut label)?;
            let label = u32::from_le_bytes(label);
            return Err(crate::ops::label_out_of_range(
                back[1] as usize,
                label,
                classes,
            ));
        }
        Ok(f32::from_bits(back[0] as u32))
    }
}

impl OptimOps for CudaBackend {
    fn adam(&self, c: Checked<Adam<'_>>) -> Result<(), TensorError> {
        let Adam { p, g, m, v, h } = c.into_inner();
        self.bind()?;
        self.kernels.adam(
            p.addr(),
            (g.addr(), g.dtype()),
            (m.addr(), m.dtype()),
            v.addr(),
            &h,
            p.numel(),
        )
    }

    fn all_finite(&self, c: Checked<AllFinite<'_>>) -> Result<(), TensorError> {
        let AllFinite { x, nonfinite } = c.into_inner();
        self.bind()?;
        self.kernels
            .all_finite((x.addr(), x.dtype()), nonfinite.addr(), x.numel())
    }

    fn dense_adam(&self, c: Checked<DenseAdam<'_>>) -> Result<(), TensorError> {
        self.dense_adam_chunks(c.into_inner())
    }
}
