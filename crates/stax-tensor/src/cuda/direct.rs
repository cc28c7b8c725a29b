//! The direct passes of [`CudaBackend`]: the forward pass (bias, ReLU and its mask in the same
//! pass) and the filter and bias gradients (the ReLU backward in the same pass) of a
//! convolution with at most 32 taps `kh · kw · c_in` and 32 to 512 output channels (a multiple
//! of 32), NHWC with an HWIO kernel: the seed's conv1 (3x3 on 3 channels, 64 out), or any
//! network's first layer on RGB images with a small kernel. `kernels/direct_conv.cu` computes
//! them in f32 FMAs, the same arithmetic in every precision (so also full fp32).
//!
//! Such a pass is bound by the bytes of its output (forward) or of its output gradient (filter
//! gradient): the seed's is 1.02 GB, about 0.25 ms at the H200's copy bandwidth, against 0.93 ms
//! for cuDNN's TF32 forward with the bias and ReLU fused plus the mask pass, and 1.50 ms for
//! the masked bias gradient then cuDNN's TF32 filter gradient (`step_profile` on the H200,
//! BENCHMARKS.md). The backward-data pass stays on cuDNN (a first layer has none).

use super::CudaBackend;
use super::kernels::direct_applies;
use crate::backend::{Conv2d, Conv2dBwdFilter, Scratch};
use crate::{Activation, Conv2dGeometry, ConvPass, TensorError};

impl CudaBackend {
    /// Whether `pass` of `g` runs the direct kernels: on (see
    /// [`CudaBackend::set_direct_convs`]), forward or filter gradient, and `g` within what
    /// they take (at most 32 taps `kh · kw · c_in`, `c_out` a multiple of 32 from 32 to 512,
    /// NHWC with an HWIO kernel, a non-empty output). A function of the geometry, so a memory
    /// plan made on it holds: such a forward pass allocates no workspace, such a filter
    /// gradient one block of f64 partials.
    pub fn conv_is_direct(&self, g: &Conv2dGeometry, pass: ConvPass) -> bool {
        self.direct_convs() && pass != ConvPass::BackwardData && direct_applies(g)
    }

    /// Bytes of the direct filter gradient's partials for `g` (its whole workspace).
    pub(super) fn direct_wgrad_bytes(&self, g: &Conv2dGeometry) -> usize {
        self.kernels.direct_wgrad_bytes(g)
    }

    /// The forward pass of [`Self::conv_is_direct`]: with the epilogues fused (the default) the
    /// bias and a ReLU (with its mask) in the kernel, else as their own passes, as elsewhere;
    /// another activation after it.
    pub(super) fn direct_forward(&self, c: Conv2d<'_>) -> Result<(), TensorError> {
        let Conv2d {
            g,
            x,
            w,
            b,
            y,
            act,
            aux,
        } = c;
        let dtype = x.dtype();
        let fused = self.fused_epilogues();
        let relu = fused && act == Some(Activation::Relu);
        let mask = aux.map_or(0, |m| m.addr());
        let bias = b.filter(|_| fused).map_or(0, |b| b.addr());
        let addrs = (x.addr(), w.addr(), bias, y.addr());
        let relu_mask = (relu, if relu { mask } else { 0 });
        self.kernels.direct_forward((&g, dtype), addrs, relu_mask)?;
        if let (Some(b), false) = (b, fused) {
            self.add_bias(&g, y, b.addr())?;
        }
        match act {
            Some(act) if !relu => self.activate(act, mask, y),
            _ => Ok(()),
        }
    }

    /// The filter and bias gradients of [`Self::conv_is_direct`], with the ReLU backward in the
    /// same pass when the epilogues are fused (another activation's backward first). Its
    /// workspace is the partials ([`Self::conv_schedule`]).
    pub(super) fn direct_filter_grad(&self, c: Conv2dBwdFilter<'_>) -> Result<(), TensorError> {
        const OP: &str = "conv2d_bwd_filter";
        let Conv2dBwdFilter {
            g,
            x,
            dy,
            dw,
            db,
            act,
        } = c;
        let dtype = x.dtype();
        let mask = match act {
            Some((Activation::Relu, m)) if self.fused_epilogues() => m.addr(),
            Some((a, saved)) => {
                self.activate_bwd(a, saved, dy)?;
                0
            }
            None => 0,
        };
        let bias = db.is_some();
        let schedule = self.conv_schedule(&g, dtype, ConvPass::BackwardFilter, bias)?;
        let mut ws = Scratch::new(OP, &self.allocator, schedule);
        let partial = ws.alloc()?;
        let grads = (dw.addr(), db.map_or(0, |d| d.addr()));
        let inputs = (x.addr(), dy.addr(), mask);
        self.kernels
            .direct_filter_grad((&g, dtype), inputs, ws.addr(partial), grads)?;
        ws.free(partial)?;
        ws.finish()
    }
}
