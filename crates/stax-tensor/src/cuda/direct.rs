//! The direct passes of [`CudaBackend`]: the forward pass (bias, ReLU and its mask in the same
//! pass) and the filter and bias gradients (the ReLU backward in the same pass) of a
//! convolution with at most 32 taps `kh · kw · c_in` and 32 to 512 output channels (a multiple
//! of 32), NHWC with an HWIO kernel: the seed's conv1 (3x3 on 3 channels, 64 out), or any
//! network's first layer on RGB images with a small kernel. `kernels/direct_mma.cu` computes
//! them on the tensor cores for 32 to 128 output channels in bf16 and f16 (exact products) and
//! in f32 under [`Precision::Tf32`] (TF32 products, as cuDNN's TF32 algorithms);
//! `kernels/direct_conv.cu` otherwise in f32 FMAs (so in full fp32 exact f32 products).
//!
//! Such a pass moves the bytes of its output (forward) or of its output gradient (filter
//! gradient) and little else: the seed's is 1.02 GB, about 0.25 ms at the H200's copy
//! bandwidth. Measured on the H200 at batch 100: the FMA forward pass with bias, ReLU and
//! mask 1.09 ms against cuDNN's 2.31 ms in full fp32 (its FMA algorithms; 2026-12-03); on the
//! tensor cores the forward pass 0.72 ms in TF32 and 0.71 in bf16, the masked filter gradient
//! with the bias gradient 1.11 ms in TF32 (calibration times, 2026-12-04, BENCHMARKS.md).
//! [`DirectConvs`] picks where they run (see [`DirectConvs::Winning`]). Their backward-data pass
//! stays on cuDNN (a first layer has none).
//!
//! One wider filter gradient is direct too: a 3x3, stride-1 conv from 64 to 64 channels in f32
//! on an `sm_90` device (`kernels/wgrad_wgmma.cu`, Hopper's `wgmma`; the seed's conv2), under
//! TF32, where cuDNN's best TF32 algorithm reaches about 104 TFLOP/s (at the seed's batch 100
//! calibration timed it at 2.82 ms and the kernel, with the ReLU backward, at 1.46 ms, H100,
//! 2026-12-05, BENCHMARKS.md), and in full fp32 as 3xTF32 (three TF32 products of each
//! operand's rounding and rounded rest), beside cuDNN's FMA algorithms and 3xTF32 composites.
//! In full fp32 that conv's forward pass (bias, ReLU, mask) and backward-data pass run
//! `kernels/conv_wgmma.cu` (3xTF32 on `wgmma`, the backward data as the forward conv of dy
//! with the kernel flipped) where calibration times it faster than cuDNN's choice: at the
//! seed's conv2 (batch 100) calibration timed it at 4.71 ms forward with the epilogue and 4.67
//! ms backward data against cuDNN's stacked 3xTF32 composites' 5.69 (without the epilogue)
//! and 6.03 (H100, 2026-12-07, BENCHMARKS.md); its cheaper operand split since took 4.43 and
//! 4.31 ms in its harness.

use super::CudaBackend;
use super::cudnn::{ConvCandidate, ConvPlanInfo, Fp32Convs, Operands, mean_ms};
use super::kernels::{CONV_WGMMA_PACKED, DirectMath, direct_applies};
use crate::backend::{Conv2d, Conv2dBwdData, Conv2dBwdFilter, Scratch};
use crate::{Activation, Conv2dGeometry, ConvPass, DType, Precision, TensorError};
use stax_alloc::Category;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

/// The direct kernels' times at calibration, per (geometry, dtype, pass), in ms per run, and
/// whether they beat cuDNN's choice (see [`DirectConvs::Winning`]).
pub(super) type DirectTimes = Mutex<HashMap<(Conv2dGeometry, DType, ConvPass), (f32, bool)>>;

/// The passes that ran (or were planned on) the direct kernels, per (geometry, dtype, pass):
/// [`CudaBackend::with_direct`] lists those no calibration timed.
pub(super) type DirectUsed = Mutex<HashSet<(Conv2dGeometry, DType, ConvPass)>>;

/// The report's name of a pass run by the direct kernels.
const DIRECT: &str = "stax direct kernel";

/// Which conv passes run the direct kernels (see [`CudaBackend::set_direct_convs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DirectConvs {
    /// None: every pass on cuDNN.
    Off,
    /// The f32 forward pass under [`crate::Precision::Highest`] always (the seed's conv1 with
    /// bias, ReLU and mask: 1.09 ms against cuDNN's 2.31 at batch 100, H200, 2026-12-03); the
    /// forward pass and the filter gradient wherever the tensor-core kernels take them (bf16
    /// and f16, f32 under TF32; 32 to 128 outputs): with their epilogues and no layout copy
    /// the seed's step at batch 100 takes 12.70 ms in TF32 against 13.37 with cuDNN's passes
    /// and theirs, 8.30 against 8.55 in bf16 (H200, 2026-12-04, BENCHMARKS.md), though alone
    /// they time slower than cuDNN's convolution without its epilogue (TF32 forward 0.72
    /// against 0.55 ms), so timing them at calibration would keep cuDNN; and any other
    /// forward pass or filter gradient where the FMA kernel, timed at calibration on the
    /// search's buffers (CUDA events, as cuDNN's candidates), is faster than cuDNN's choice
    /// (TF32 at batch 10 the seed's forward, 0.116 ms; at batch 100 cuDNN's, 0.55 against
    /// 1.07). The kernel is timed with its epilogue (bias, ReLU, mask), cuDNN's
    /// choice without (its epilogue may be fused or a separate pass), so it leans to cuDNN
    /// (a first form that timed the kernels without theirs made the seed's TF32 step at batch
    /// 100 0.2-0.3 ms slower, H200, 2026-12-03).
    /// The wgmma filter gradients (3x3, 64 to 64 channels; TF32, and 3xTF32 under full fp32)
    /// and, under full fp32, that conv's wgmma forward and backward-data passes are timed the
    /// same way.
    /// Not timed with [`CudaBackend::set_deterministic`] (the rule alone then).
    #[default]
    Winning,
    /// Every pass the kernels take (forward and filter gradient in every float dtype, and in
    /// full fp32 the wgmma conv's backward data): for tests and A/B timing.
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
    /// Whether this backend's precision lets the direct kernels round f32 operands to TF32.
    fn tf32(&self) -> bool {
        self.precision == Precision::Tf32
    }

    /// The direct kernel of `pass` for `g` in `dtype` with this backend's precision: its
    /// geometry, dtype and whether f32 operands may be rounded to TF32.
    fn direct_kernel<'g>(
        &self,
        g: &'g Conv2dGeometry,
        dtype: DType,
    ) -> (&'g Conv2dGeometry, DType, bool) {
        (g, dtype, self.tf32())
    }

    /// The arithmetic the direct kernels use for `g` in `dtype` under this backend's
    /// precision (`Kernels::math`).
    fn direct_math(&self, g: &Conv2dGeometry, dtype: DType) -> DirectMath {
        self.kernels.math(g, dtype, self.tf32())
    }

    /// The arithmetic of the direct kernel of `pass` for `g` in `dtype`: 3xTF32 on `wgmma`
    /// where `conv_wgmma.cu` takes the forward or backward-data pass, else
    /// [`Self::direct_math`] (the filter gradient's, or the small-tap kernels').
    fn pass_math(&self, g: &Conv2dGeometry, dtype: DType, pass: ConvPass) -> DirectMath {
        match pass != ConvPass::BackwardFilter && self.conv_wgmma_takes(g, dtype, pass) {
            true => DirectMath::Tf32x3Wgmma,
            false => self.direct_math(g, dtype),
        }
    }

    /// Whether a direct kernel takes `pass` of `g` in `dtype`: the forward pass and the filter
    /// gradient of [`direct_applies`], the filter gradient of the wgmma kernels (TF32, and
    /// 3xTF32 in full fp32), and the forward and backward-data passes of `conv_wgmma.cu` (3xTF32
    /// in full fp32).
    fn direct_takes(&self, g: &Conv2dGeometry, dtype: DType, pass: ConvPass) -> bool {
        let conv_wgmma = self.conv_wgmma_takes(g, dtype, pass);
        match pass {
            ConvPass::BackwardData => conv_wgmma,
            ConvPass::Forward => direct_applies(g) || conv_wgmma,
            ConvPass::BackwardFilter => {
                direct_applies(g) || self.kernels.wgmma_takes(g, dtype, self.tf32())
            }
        }
    }

    /// Whether `conv_wgmma.cu` runs `pass` of `g` in `dtype` (see [`Self::direct_takes`]).
    fn conv_wgmma_takes(&self, g: &Conv2dGeometry, dtype: DType, pass: ConvPass) -> bool {
        self.kernels.conv_wgmma_takes(g, dtype, self.tf32(), pass)
    }

    /// The workspace of the direct kernel of `pass` for `g` in `dtype`: the filter gradient's
    /// partials; `conv_wgmma.cu`'s packed kernel ([`CONV_WGMMA_PACKED`] bytes), else none, for
    /// the forward and backward-data passes.
    pub(super) fn direct_workspace_bytes(
        &self,
        g: &Conv2dGeometry,
        dtype: DType,
        pass: ConvPass,
    ) -> usize {
        match pass {
            ConvPass::BackwardFilter => self.direct_wgrad_bytes(g, dtype),
            _ if self.conv_wgmma_takes(g, dtype, pass) => CONV_WGMMA_PACKED,
            _ => 0,
        }
    }

    /// Whether `pass` of `g` in `dtype` runs the direct kernels: the mode
    /// ([`CudaBackend::set_direct_convs`]) selects it and a kernel takes the pass (the forward
    /// pass and filter gradient of at most 32 taps `kh · kw · c_in`, `c_out` a power of two
    /// from 32 to 512, NHWC with an HWIO kernel, a non-empty output; the wgmma kernels' passes
    /// of a 3x3, stride-1 conv from 64 to 64 channels). A function of the geometry, dtype and
    /// backend settings, so a memory plan made on it holds: its workspace is fixed by them
    /// (none for a small-tap forward pass, one block of f64 partials a filter gradient, the
    /// packed kernel for `conv_wgmma.cu`).
    pub fn conv_is_direct(&self, g: &Conv2dGeometry, dtype: DType, pass: ConvPass) -> bool {
        let chosen = match self.direct_convs() {
            DirectConvs::Off => false,
            DirectConvs::Winning => {
                (self.direct_by_rule(g, dtype, pass) || self.direct_won(g, dtype, pass))
                    && self.direct_fits(g, dtype, pass)
            }
            DirectConvs::All => true,
        };
        chosen && self.direct_takes(g, dtype, pass)
    }

    /// [`DirectConvs::Winning`]'s fixed rule: the f32 forward pass of [`direct_applies`] under
    /// full fp32, and every forward pass and filter gradient of `kernels/direct_mma.cu` (see
    /// [`DirectConvs::Winning`]); the wgmma kernels are timed.
    fn direct_by_rule(&self, g: &Conv2dGeometry, dtype: DType, pass: ConvPass) -> bool {
        let full_fp32 = self.precision == Precision::Highest;
        let mma = matches!(
            self.direct_math(g, dtype),
            DirectMath::Tf32Mma | DirectMath::Tf32Warp | DirectMath::HalfMma
        );
        let fp32_forward = pass == ConvPass::Forward && dtype == DType::F32 && full_fp32;
        pass != ConvPass::BackwardData && (mma || (fp32_forward && direct_applies(g)))
    }

    /// Whether the direct kernel's workspace for `pass` of `g` in `dtype` (the filter gradient's
    /// partials) is within the pass's workspace limit (the user's, or its allotment): under
    /// [`DirectConvs::Winning`] a kernel over it neither runs nor is timed, as a cuDNN
    /// algorithm over it would not be chosen.
    fn direct_fits(&self, g: &Conv2dGeometry, dtype: DType, pass: ConvPass) -> bool {
        self.direct_workspace_bytes(g, dtype, pass) <= self.conv_limit(&(*g, dtype, pass))
    }

    /// Whether the kernel was timed faster than cuDNN for `pass` of `g` in `dtype`.
    fn direct_won(&self, g: &Conv2dGeometry, dtype: DType, pass: ConvPass) -> bool {
        let times = self.direct_times.lock().unwrap_or_else(|p| p.into_inner());
        times.get(&(*g, dtype, pass)).is_some_and(|&(_, won)| won)
    }

    /// Whether calibration times the kernel for `pass` of `g` in `dtype` against cuDNN's
    /// choice: under [`DirectConvs::Winning`], for a pass the kernels take that the rule does
    /// not already give them and whose workspace fits the limit ([`Self::direct_fits`]),
    /// unless cuDNN's choice is made without timing, or the kernel is the 3xTF32 wgmma one and
    /// [`Fp32Convs::Fma`] keeps full fp32 on FMA algorithms. Read when the pass is calibrated:
    /// a later setting leaves the choice made.
    pub(super) fn direct_is_timed(&self, g: &Conv2dGeometry, dtype: DType, pass: ConvPass) -> bool {
        let fma_only = self.pass_math(g, dtype, pass) == DirectMath::Tf32x3Wgmma
            && self.dnn.fp32() == Fp32Convs::Fma;
        self.direct_convs() == DirectConvs::Winning
            && self.direct_takes(g, dtype, pass)
            && !self.direct_by_rule(g, dtype, pass)
            && self.direct_fits(g, dtype, pass)
            && !self.dnn.is_deterministic()
            && !fma_only
    }

    /// Times the kernel of `pass` for `g` in `dtype` on the search's buffers `ops`, with its
    /// epilogue (forward: bias, ReLU and mask; filter gradient: the ReLU backward and the bias
    /// gradient; backward data: none), against cuDNN's choice without one, and records whether
    /// the kernel is faster. Allocates the bias, the mask and the kernel's workspace (the
    /// filter gradient's partials, `conv_wgmma.cu`'s packed kernel) as workspace, zeroed.
    ///
    /// # Errors
    /// The kernel's and the events' errors; out of memory for the buffers.
    pub(super) fn time_direct(
        &self,
        g: &Conv2dGeometry,
        dtype: DType,
        pass: ConvPass,
        ops: Operands,
    ) -> Result<(), TensorError> {
        let scratch = |bytes: usize| self.allocator.allocate(bytes.max(4), Category::Workspace);
        let words = g.output_shape().numel() / 32;
        let (bias, mask) = (scratch(g.c_out * dtype.size_bytes())?, scratch(words * 4)?);
        self.kernels.zero(bias.addr(), dtype, g.c_out)?;
        self.kernels.fill_u32(mask.addr(), 0, words)?;
        let ws = scratch(self.direct_workspace_bytes(g, dtype, pass))?;
        let run = || match pass {
            ConvPass::BackwardFilter => {
                let inputs = (ops.x, ops.y, (mask.addr(), true));
                let grads = (ops.w, bias.addr());
                let kernel = self.direct_kernel(g, dtype);
                self.kernels
                    .direct_filter_grad(kernel, inputs, ws.addr(), grads)
            }
            ConvPass::Forward => {
                let addrs = (ops.x, ops.w, bias.addr(), ops.y);
                self.forward_kernel((g, dtype), addrs, (true, mask.addr()), ws.addr())
            }
            ConvPass::BackwardData => {
                let addrs = (ops.y, ops.w, 0, ops.x);
                self.kernels
                    .conv_wgmma((g, pass), addrs, (false, 0), ws.addr())
            }
        };
        run()?;
        let ms = mean_ms(&self.stream, run, None)?;
        let cudnn = self.dnn.chosen((g, dtype), self.precision, pass);
        let won = cudnn.is_some_and(|(_, c)| ms < c);
        let mut times = self.direct_times.lock().unwrap_or_else(|p| p.into_inner());
        times.insert((*g, dtype, pass), (ms, won));
        Ok(())
    }

    /// Records that `pass` of `g` in `dtype` runs the direct kernels (its schedule was asked
    /// for), so that [`Self::with_direct`] lists it.
    pub(super) fn note_direct(&self, g: &Conv2dGeometry, dtype: DType, pass: ConvPass) {
        let mut used = self.direct_used.lock().unwrap_or_else(|p| p.into_inner());
        used.insert((*g, dtype, pass));
    }

    /// cuDNN's choices ([`super::cudnn::Dnn::plans`]) with each timed direct kernel added as a
    /// candidate, and as the choice where it won; then each pass the direct kernels run
    /// untimed (by [`DirectConvs::Winning`]'s rule, or under [`DirectConvs::All`]) as its own
    /// entry: the kernel, its arithmetic and workspace, `untimed`, no candidates.
    pub(super) fn with_direct(&self, plans: Vec<ConvPlanInfo>) -> Vec<ConvPlanInfo> {
        let mut plans = self.with_timed_direct(plans);
        let used = self.direct_used.lock().unwrap_or_else(|p| p.into_inner());
        let mut untimed: Vec<_> = used
            .iter()
            .filter(|(g, dtype, pass)| {
                !plans
                    .iter()
                    .any(|p| p.geometry == *g && p.dtype == *dtype && p.pass == *pass)
            })
            .map(|&(geometry, dtype, pass)| ConvPlanInfo {
                geometry,
                dtype,
                precision: self.precision,
                pass,
                algorithm: DIRECT.into(),
                math: self.pass_math(&geometry, dtype, pass).name().into(),
                workspace_bytes: self.direct_workspace_bytes(&geometry, dtype, pass),
                layout_bytes: 0,
                time_ms: f32::NAN,
                candidates: Vec::new(),
                epilogue: match pass {
                    ConvPass::Forward => "in the kernel".into(),
                    _ => String::new(),
                },
            })
            .collect();
        untimed.sort_by_key(|p| {
            let g = &p.geometry;
            let shape = [
                g.n, g.h, g.w, g.c_in, g.c_out, g.kh, g.kw, g.stride_h, g.stride_w,
            ];
            (shape, p.dtype.name(), p.pass as u8)
        });
        plans.extend(untimed);
        plans
    }

    /// cuDNN's choices with each timed direct kernel added as a candidate, and as the choice
    /// where it won.
    fn with_timed_direct(&self, mut plans: Vec<ConvPlanInfo>) -> Vec<ConvPlanInfo> {
        let times = self.direct_times.lock().unwrap_or_else(|p| p.into_inner());
        for p in &mut plans {
            let Some(&(ms, won)) = times.get(&(p.geometry, p.dtype, p.pass)) else {
                continue;
            };
            let workspace = self.direct_workspace_bytes(&p.geometry, p.dtype, p.pass);
            let math = self
                .pass_math(&p.geometry, p.dtype, p.pass)
                .name()
                .to_string();
            p.candidates.push(ConvCandidate {
                algorithm: DIRECT.into(),
                math: math.clone(),
                workspace_bytes: workspace,
                time_ms: Some(ms),
                status: if won { "chosen" } else { "slower" }.into(),
            });
            if won {
                (p.algorithm, p.math, p.workspace_bytes) = (DIRECT.into(), math, workspace);
                (p.time_ms, p.layout_bytes) = (ms, 0);
                if p.pass == ConvPass::Forward {
                    p.epilogue = "in the kernel".into();
                }
            }
        }
        plans
    }

    /// Bytes of the direct filter gradient's partials for `g` in `dtype` (its whole workspace).
    pub(super) fn direct_wgrad_bytes(&self, g: &Conv2dGeometry, dtype: DType) -> usize {
        self.kernels.direct_wgrad_bytes(g, dtype, self.tf32())
    }

    /// The direct forward kernel of `g` in `dtype`: `conv_wgmma.cu` where it takes the pass
    /// (its packed kernel at `packed`), else those of [`direct_applies`] (no workspace).
    fn forward_kernel(
        &self,
        (g, dtype): (&Conv2dGeometry, DType),
        addrs: (u64, u64, u64, u64),
        relu_mask: (bool, u64),
        packed: u64,
    ) -> Result<(), TensorError> {
        match self.conv_wgmma_takes(g, dtype, ConvPass::Forward) {
            true => {
                let pass = (g, ConvPass::Forward);
                self.kernels.conv_wgmma(pass, addrs, relu_mask, packed)
            }
            false => {
                let kernel = self.direct_kernel(g, dtype);
                self.kernels.direct_forward(kernel, addrs, relu_mask)
            }
        }
    }

    /// The forward pass of [`Self::conv_is_direct`]: with the epilogues fused (the default) the
    /// bias and a ReLU (with its mask) in the kernel, else as their own passes, as elsewhere;
    /// another activation after it. Its workspace is `conv_wgmma.cu`'s packed kernel, or none
    /// ([`Self::conv_schedule`]).
    pub(super) fn direct_forward(&self, c: Conv2d<'_>) -> Result<(), TensorError> {
        const OP: &str = "conv2d";
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
        let schedule = self.conv_schedule(&g, dtype, ConvPass::Forward, b.is_some())?;
        let mut ws = Scratch::new(OP, &self.allocator, schedule);
        let packed = match self.conv_wgmma_takes(&g, dtype, ConvPass::Forward) {
            true => Some(ws.alloc()?),
            false => None,
        };
        let fused = self.fused_epilogues();
        let relu = fused && act == Some(Activation::Relu);
        let mask = aux.map_or(0, |m| m.addr());
        let bias = b.filter(|_| fused).map_or(0, |b| b.addr());
        let addrs = (x.addr(), w.addr(), bias, y.addr());
        let relu_mask = (relu, if relu { mask } else { 0 });
        let packed_addr = packed.map_or(0, |i| ws.addr(i));
        self.forward_kernel((&g, dtype), addrs, relu_mask, packed_addr)?;
        if let Some(i) = packed {
            ws.free(i)?;
        }
        ws.finish()?;
        if let (Some(b), false) = (b, fused) {
            self.add_bias(&g, y, b.addr())?;
        }
        match act {
            Some(act) if !relu => self.activate(act, mask, y),
            _ => Ok(()),
        }
    }

    /// The backward-data pass of [`Self::conv_is_direct`] (`conv_wgmma.cu`): dx of dy through the
    /// kernel flipped, its workspace the packed kernel ([`Self::conv_schedule`]).
    pub(super) fn direct_backward_data(&self, c: Conv2dBwdData<'_>) -> Result<(), TensorError> {
        const OP: &str = "conv2d_bwd_data";
        let Conv2dBwdData { g, dy, w, dx } = c;
        let pass = ConvPass::BackwardData;
        let schedule = self.conv_schedule(&g, dy.dtype(), pass, false)?;
        let mut ws = Scratch::new(OP, &self.allocator, schedule);
        let packed = ws.alloc()?;
        let addrs = (dy.addr(), w.addr(), 0, dx.addr());
        self.kernels
            .conv_wgmma((&g, pass), addrs, (false, 0), ws.addr(packed))?;
        ws.free(packed)?;
        ws.finish()
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
            keep_dy,
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
        let inputs = (x.addr(), dy.addr(), (mask, keep_dy));
        let kernel = self.direct_kernel(&g, dtype);
        self.kernels
            .direct_filter_grad(kernel, inputs, ws.addr(partial), grads)?;
        ws.free(partial)?;
        ws.finish()
    }
}
