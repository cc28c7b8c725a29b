//! Launchers of `kernels/conv_wgmma.cu`: the forward pass (bias, ReLU and its mask) and the
//! backward-data pass of a 3x3, stride-1 conv from 64 to 64 channels in full fp32 as 3xTF32 on
//! Hopper's warpgroup tensor cores (see [`conv_wgmma_applies`]), where cuDNN's full-fp32
//! forms run at about a third of its TF32 rate (the seed's conv2 at batch 100: the stacked
//! 3xTF32 composite 6.1 ms a pass on the H100, 2026-12-07, BENCHMARKS.md).

use super::spatial::WindowGeometry;
use super::{Kernels, direct::wgmma_applies, driver};
use crate::{Conv2dGeometry, ConvPass, DType, TensorError};
use cudarc::driver::{LaunchConfig, PushKernelArg};

/// The pass kernel's symbol.
pub(crate) const CONV_WGMMA: &str = "conv_wgmma_3x3_c64_f32x3";
/// Its dynamic shared memory in bytes (`CW_SMEM`): three strips of 148 staged input positions of
/// 256 bytes and three tap buffers of 32,768 (the packed kernel's TF32 rounding and rest).
pub(crate) const CONV_WGMMA_SMEM: usize = 211_968;
/// Bytes of the packed kernel (`conv_wgmma_pack`): 9 taps, two parts of 64 x 64 TF32 words.
pub(crate) const CONV_WGMMA_PACKED: usize = 9 * 2 * 64 * 64 * 4;
/// Its threads a block (`CW_THREADS`: two warpgroups).
const THREADS: u32 = 256;
/// Output positions a tile (`CW_TILE`).
const TILE: usize = 128;
/// The narrowest output rows it takes (`CW_SEGS` segments a tile: 1 + ceil(127 / 15) = 10).
const MIN_OUT_W: usize = 15;

/// Whether the kernel takes `pass` of `g` (of [`wgmma_applies`]): the forward pass where
/// output rows are at least [`MIN_OUT_W`] wide; the backward-data pass (the forward pass of dy
/// with the kernel flipped, padded by `2 - pad`) where input rows are, and the top and left
/// padding at most 2.
pub(crate) fn conv_wgmma_applies(g: &Conv2dGeometry, pass: ConvPass) -> bool {
    wgmma_applies(g)
        && match pass {
            ConvPass::Forward => g.out_w >= MIN_OUT_W,
            ConvPass::BackwardData => g.w >= MIN_OUT_W && g.pad_top <= 2 && g.pad_left <= 2,
            ConvPass::BackwardFilter => false,
        }
}

impl Kernels {
    /// Whether `pass` of `g` in `dtype` runs the kernel: f32 in full fp32 (`tf32` false),
    /// [`conv_wgmma_applies`], and the kernel loaded (an `sm_90` device allowing its shared
    /// memory: `load_module`).
    pub(crate) fn conv_wgmma_takes(
        &self,
        g: &Conv2dGeometry,
        dtype: DType,
        tf32: bool,
        pass: ConvPass,
    ) -> bool {
        dtype == DType::F32
            && !tf32
            && conv_wgmma_applies(g, pass)
            && self.functions.contains_key(CONV_WGMMA)
    }

    /// `pass` of `g` of [`Self::conv_wgmma_takes`], f32 throughout: forward, `out = conv(input,
    /// w) (+ b)` (input x, out y; b null or `[64]`), then with `relu` its ReLU and, when `mask
    /// != 0`, its packed mask; backward data, `out = dx` of `input = dy` (b, relu and mask
    /// unused). `w` is HWIO, packed first into `packed` ([`CONV_WGMMA_PACKED`] bytes). Sums
    /// of 3xTF32 products in f32, rounded once.
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] unless `input` is 16-byte and `out` 8-byte aligned; the
    /// driver's errors.
    pub(crate) fn conv_wgmma(
        &self,
        (g, pass): (&Conv2dGeometry, ConvPass),
        (input, w, b, out): (u64, u64, u64, u64),
        (relu, mask): (bool, u64),
        packed: u64,
    ) -> Result<(), TensorError> {
        const OP: &str = "conv_wgmma";
        if input % 16 != 0 || out % 8 != 0 {
            return Err(TensorError::InvalidArgument {
                op: OP,
                reason: format!("input 16- and output 8-byte aligned: {input:#x}, {out:#x}"),
            });
        }
        let data = pass == ConvPass::BackwardData;
        let pack = LaunchConfig {
            grid_dim: (144, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let flip = i32::from(data);
        // SAFETY: `conv_wgmma_pack(const float *w, u32 *packed, int flip)`; w holds the 3x3x64x64
        // HWIO kernel, packed CONV_WGMMA_PACKED bytes; a grid-stride loop, any grid.
        unsafe {
            launch!(self.stream, self.function("conv_wgmma_pack")?, pack; &w, &packed, &flip)
        }
        .map_err(driver(OP))?;
        // a stride-1 conv's backward data is the forward conv of dy with the kernel flipped
        let (win, outputs) = match data {
            true => (WindowGeometry::transposed(g), g.input_shape().numel()),
            false => (WindowGeometry::of(g), g.output_shape().numel()),
        };
        let tiles = (outputs / 64).div_ceil(TILE);
        let cfg = LaunchConfig {
            grid_dim: (tiles.min(self.sms as usize) as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: CONV_WGMMA_SMEM as u32,
        };
        let (b, mask) = if data { (0, 0) } else { (b, mask) };
        let relu = i32::from(relu && !data);
        // SAFETY: `conv_wgmma_3x3_c64_f32x3(const float *x, const u32 *packed, const float
        // *bias, float *y, u32 *mask, WindowGeometry g, int relu)`; input holds win's NHWC
        // input of 64 channels (16-byte aligned: checked), packed the kernel packed above, b
        // null or 64 floats, out win's NHWC output (8-byte aligned), mask null or its
        // numel/32 words; win 3x3, stride 1, out_w >= 15 (conv_wgmma_applies); blocks of 256
        // threads with CW_SMEM bytes of dynamic shared memory (allowed at load), at most one a
        // tile.
        unsafe {
            launch!(self.stream, self.function(CONV_WGMMA)?, cfg; &input, &packed, &b, &out, &mask, &win, &relu)
        }
        .map(drop)
        .map_err(driver(OP))
    }
}
