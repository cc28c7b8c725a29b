//! The direct passes of [`CudaBackend`]: the forward pass (bias, ReLU and its mask in the same
//! pass) and the filter and bias gradients (the ReLU backward in the same pass) of a
//! convolution with at most 32 taps `kh · kw · c_in` and 32 to 512 output channels (a multiple
//! of 32), NHWC with an HWIO kernel: the seed's conv1 (3x3 on 3 channels, 64 out), or any
//! network's first layer on RGB images with a small kernel. `kernels/direct_conv.cu` computes
//! them in f32 FMAs, the same arithmetic in every precision (so also full fp32).
//!
//! Such a pass moves the bytes of its output (forward) or of its output gradient (filter
//! gradient) and little else: the seed's is 1.02 GB, about 0.25 ms at the H200's copy
//! bandwidth. Measured on the H200 (2026-12-03, BENCHMARKS.md) at batch 100 the forward pass
//! with bias, ReLU and mask takes 1.09 ms against cuDNN's 2.31 ms in full fp32 (its FMA
//! algorithms) but 0.95 ms in TF32, and the masked filter gradient 1.68 ms against cuDNN's
//! 1.46; at batch 10 the forward pass takes 0.12 ms against cuDNN's 0.28 in TF32.
//! [`DirectConvs`] picks where they run; by default by a fixed rule (see
//! [`DirectConvs::Winning`]). The backward-data pass stays on cuDNN (a first layer has none).

use super::CudaBackend;
use super::kernels::direct_applies;
use crate::backend::{Conv2d, Conv2dBwdFilter, Scratch};
use crate::{Activation, Conv2dGeometry, ConvPass, DType, Precision, TensorError};

/// Which conv passes run the direct kernels (see [`CudaBackend::set_direct_convs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DirectConvs {
    /// None: every pass on cuDNN.
    Off,
    /// Where they measured faster than cuDNN at every batch tried: the f32 forward pass under
    /// [`crate::Precision::Highest`] (the seed's conv1 with bias, ReLU and mask: 1.09 ms
    /// against cuDNN's 2.31 at batch 100, H200, 2026-12-03). Under TF32 cuDNN's forward is
    /// faster at batch 100 (0.95 ms) but not at batch 10 (0.28 against 0.12: not chosen yet,
    /// the rule does not look at the batch); in both precisions cuDNN's filter gradient is
    /// faster (1.46 ms against 1.68); bf16 and f16 were not measured yet.
    #[default]
    Winning,
    /// Every pass the kernels take, forward and filter gradient in every float dtype: for tests
    /// and A/B timing.
    All,
}

impl DirectConvs {
    /// The mode stored in the backend's atomic.
    pub(super) fn code(self) -> u8 {
        self as u8
    }

    /// The mode of [`DirectConvs::code`].
    pub(super) fn from_code(code: u8) -> DirectConvs {
        match code {
            0 => DirectConvs::Off,
            1 => DirectConvs::Winning,
            _ => DirectConvs::All,
        }
    }
}

impl std::str::FromStr for DirectConvs {
    type Err = TensorError;

    /// `off`, `winning` or `all`.
    fn from_str(s: &str) -> Result<Self, TensorError> {
        match s {
            "off" => Ok(DirectConvs::Off),
            "winning" => Ok(DirectConvs::Winning),
            "all" => Ok(DirectConvs::All),
            other => Err(TensorError::InvalidArgument {
                op: "direct_convs",
                reason: format!("{other:?}: expected off, winning or all"),
            }),
        }
    }
}

impl CudaBackend {
    /// Whether `pass` of `g` in `dtype` runs the direct kernels: the mode
    /// ([`CudaBackend::set_direct_convs`]) selects it, it is the forward pass or the filter
    /// gradient, and `g` is within what they take (at most 32 taps `kh · kw · c_in`, `c_out` a
    /// power of two from 32 to 512, NHWC with an HWIO kernel, a non-empty output). A function
    /// of the geometry, dtype and backend settings, so a memory plan made on it holds: such a
    /// forward pass allocates no workspace, such a filter gradient one block of f64 partials.
    pub fn conv_is_direct(&self, g: &Conv2dGeometry, dtype: DType, pass: ConvPass) -> bool {
        let chosen = match self.direct_convs() {
            DirectConvs::Off => false,
            DirectConvs::Winning => {
                pass == ConvPass::Forward
                    && dtype == DType::F32
                    && self.precision == Precision::Highest
            }
            DirectConvs::All => pass != ConvPass::BackwardData,
        };
        chosen && direct_applies(g)
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
