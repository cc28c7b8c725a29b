//! Launchers of `kernels/direct_conv.cu`, `kernels/direct_mma.cu` and `kernels/direct_warp.cu`:
//! the forward pass (with the bias, a ReLU and its mask) and the filter and bias gradients (with
//! the ReLU backward) of a convolution with at most 32 taps, where cuDNN's algorithms run far
//! from the memory floor (see [`direct_applies`]): on the tensor cores where [`direct_math`]
//! allows it, else in f32 FMAs. And of `kernels/wgrad_wgmma.cu`: the same filter gradient for a
//! 3x3 conv from 64 to 64 channels in TF32 on Hopper's warpgroup tensor cores (see
//! [`wgmma_applies`]), where cuDNN's TF32 algorithms run at about a fifth of the tensor cores'
//! rate (the seed's conv2 at batch 100: cuDNN's `BWD_FILTER_ALGO_1` 2.82 ms, this kernel 1.46 ms
//! with the ReLU backward, one calibration on the H100, 2026-12-05, BENCHMARKS.md).

use super::spatial::WindowGeometry;
use super::{Kernels, driver};
use crate::{Conv2dGeometry, DType, FilterLayout, Layout, TensorError};
use cudarc::driver::{LaunchConfig, PushKernelArg};

/// Threads per block (`DC_THREADS` in the source).
const THREADS: u32 = 256;
/// Output positions per tile (`DC_PIXELS`).
const PIXELS: usize = 64;
/// The most taps `kh · kw · c_in` a direct kernel takes (its patch row in shared memory).
pub(crate) const MAX_TAPS: usize = 32;
/// Warps a block of `kernels/direct_warp.cu` (`DW_WARPS`), each streaming its own tiles.
const WARP_WARPS: usize = 4;
/// Its blocks a multiprocessor (`__launch_bounds__(DW_THREADS, 3)`: at most 170 registers).
const WARP_BLOCKS_PER_SM: usize = 3;

/// A kernel of `kernels/wgrad_wgmma.cu`: the filter gradient of [`wgmma_applies`] in one
/// arithmetic (`WgSizes<X3>` in the source).
pub(crate) struct WgmmaKernel {
    /// Its symbol.
    pub(crate) symbol: &'static str,
    /// Its dynamic shared memory in bytes (`WgSizes::smem`): 5 input-row slots of
    /// `2 ksteps + 2` column groups and 3 dy slots of `2 ksteps`, each group 1,152 bytes (twice
    /// under 3xTF32: the TF32 rounding and the rest's), and two raw stages of 30,720 bytes.
    pub(crate) shared: usize,
    /// The most 8-position k-steps of one of its tiles (`WgSizes::ksteps`).
    ksteps: usize,
}

/// The TF32 kernel (operands rounded once, `Precision::Tf32`) and the 3xTF32 one (each operand
/// as its TF32 rounding plus the rounded rest, three products: about f32's accuracy, for
/// `Precision::Highest`).
pub(crate) const WGMMA_WGRADS: [WgmmaKernel; 2] = [
    WgmmaKernel {
        symbol: "wgmma_wgrad_3x3_c64_f32",
        shared: 165_120,
        ksteps: 5,
    },
    WgmmaKernel {
        symbol: "wgmma_wgrad_3x3_c64_f32x3",
        shared: 231_936,
        ksteps: 4,
    },
];

/// The kernel of [`WGMMA_WGRADS`] for f32 operands rounded to TF32 where `tf32`, else for full
/// fp32 (3xTF32).
fn wgmma_kernel(tf32: bool) -> &'static WgmmaKernel {
    &WGMMA_WGRADS[usize::from(!tf32)]
}

/// Its threads a block (`WG_THREADS`: three warpgroups, one a kernel row).
const WGMMA_THREADS: u32 = 384;

/// Whether `kernels/wgrad_wgmma.cu` takes `g` (in f32 under TF32, on an `sm_90` device): an
/// NHWC input with an HWIO kernel, 3x3, stride 1, undilated, 64 input and 64 output channels,
/// any padding, a non-empty output, and sizes within `i32` (its tile arithmetic). The seed's
/// conv2, ResNet-50's first 3x3 convs.
pub(crate) fn wgmma_applies(g: &Conv2dGeometry) -> bool {
    let small = |v: usize| v <= i32::MAX as usize;
    g.layout == Layout::Nhwc
        && g.filter == FilterLayout::Hwio
        && (g.kh, g.kw, g.c_in, g.c_out) == (3, 3, 64, 64)
        && (g.stride_h, g.stride_w, g.dilation_h, g.dilation_w) == (1, 1, 1, 1)
        && g.output_shape().numel() > 0
        && [g.h, g.w, g.out_h, g.out_w].into_iter().all(small)
}

/// The 8-position k-steps of a wgmma tile `tw` positions wide: `ceil(ceil(tw / 4) / 2)` (4
/// positions a column group, 2 groups a k-step).
fn wgmma_ksteps(tw: usize) -> usize {
    tw.div_ceil(4).div_ceil(2)
}

/// The width of a wgmma kernel's tiles (output positions of one row) for rows of `out_w`, at
/// most `most` k-steps a tile ([`WgmmaKernel`]): the strips per row that take the fewest
/// k-steps in all ([`wgmma_ksteps`] a tile), the fewest strips among equals. The seed's 200
/// columns: in TF32 5 tiles of 40 (5 k-steps each, every k-slot a position), in 3xTF32 9 of
/// 23 (3 k-steps each).
fn wgmma_tile_width(out_w: usize, most: usize) -> usize {
    let widest = 8 * most;
    let least = out_w.div_ceil(widest);
    (least..least + 5)
        .map(|strips| out_w.div_ceil(strips))
        .map(|tw| (out_w.div_ceil(tw), tw))
        .filter(|&(_, tw)| wgmma_ksteps(tw) <= most)
        .min_by_key(|&(strips, tw)| (strips * wgmma_ksteps(tw), strips))
        .map_or(widest, |(_, tw)| tw)
}

/// The taps `K = kh · kw · c_in` of `g`: the length of one output position's patch.
fn taps(g: &Conv2dGeometry) -> usize {
    g.kh * g.kw * g.c_in
}

/// Whether both direct kernels take `g`: an NHWC input with an HWIO kernel, 1 to
/// [`MAX_TAPS`] taps, `c_out` a power of two from 32 to 512 (whole mask words of one position;
/// 2 channels a thread, a divisor of the block's 256 threads a position), a non-empty output, and
/// window offsets within `i32` (the kernel's tap tables).
pub(crate) fn direct_applies(g: &Conv2dGeometry) -> bool {
    let small = |v: usize| v <= i32::MAX as usize;
    g.layout == Layout::Nhwc
        && g.filter == FilterLayout::Hwio
        && (1..=MAX_TAPS).contains(&taps(g))
        && g.c_out.is_power_of_two()
        && (32..=512).contains(&g.c_out)
        && g.output_shape().numel() > 0
        && small(g.h)
        && small(g.w)
        && small(g.kh * g.dilation_h)
        && small(g.kw * g.dilation_w)
}

/// The arithmetic of the direct kernels for `g` in `dtype`: the tensor cores
/// (`kernels/direct_mma.cu`: bf16 or f16 products, exact, or f32 operands rounded to TF32 where
/// `tf32` allows it; f32 sums either way, the bias gradient in f32 adds) for 32, 64 or 128
/// output channels, those of f32 with 32 or 64 in `kernels/direct_warp.cu`, else f32 FMAs
/// (`kernels/direct_conv.cu`: exact f32 products).
pub(crate) fn direct_math(g: &Conv2dGeometry, dtype: DType, tf32: bool) -> DirectMath {
    let mma = [32, 64, 128].contains(&g.c_out) && taps(g) <= MAX_TAPS;
    match dtype {
        DType::F32 if mma && tf32 && g.c_out <= 64 => DirectMath::Tf32Warp,
        DType::F32 if mma && tf32 => DirectMath::Tf32Mma,
        DType::BF16 | DType::F16 if mma => DirectMath::HalfMma,
        _ => DirectMath::Fma,
    }
}

/// How a direct kernel multiplies ([`direct_math`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DirectMath {
    /// `kernels/direct_conv.cu`: f32 FMAs.
    Fma,
    /// `kernels/direct_mma.cu`: f32 operands rounded to TF32, `mma.m16n8k8` (128 outputs).
    Tf32Mma,
    /// `kernels/direct_warp.cu`: the same a warp a tile, no barriers (32 or 64 outputs).
    Tf32Warp,
    /// `kernels/direct_mma.cu`: bf16 or f16 operands, `mma.m16n8k16`.
    HalfMma,
    /// `kernels/wgrad_wgmma.cu`: f32 operands rounded to TF32, `wgmma.mma_async` (the filter
    /// gradient of [`wgmma_applies`] only).
    Tf32Wgmma,
    /// The same in full fp32 as 3xTF32: each operand its TF32 rounding plus the rounded rest,
    /// three products (the small-small one dropped), about f32's accuracy.
    Tf32x3Wgmma,
}

impl DirectMath {
    /// The plan's name of the arithmetic.
    pub(crate) fn name(self) -> &'static str {
        match self {
            DirectMath::Fma => "f32 FMA",
            DirectMath::Tf32Mma => "TF32 tensor cores (mma), f32 sums",
            DirectMath::Tf32Warp => "TF32 tensor cores (mma, a warp a tile), f32 sums",
            DirectMath::HalfMma => "16-bit tensor cores (mma), f32 sums",
            DirectMath::Tf32Wgmma => "TF32 tensor cores (wgmma), f32 sums",
            DirectMath::Tf32x3Wgmma => "3xTF32 tensor cores (wgmma), f32 sums",
        }
    }
}

/// The kernel of `pass` (`fwd` or `wgrad`) for `g` in `dtype` with arithmetic `math`: the
/// FMA kernel for `g`'s taps rounded up to a multiple of 4, the tensor-core kernels for them
/// rounded up to 16 and `g`'s output channels.
fn symbol(pass: &str, g: &Conv2dGeometry, dtype: DType, math: DirectMath) -> String {
    let (d, kp, c) = (dtype.name(), taps(g).next_multiple_of(16), g.c_out);
    match math {
        DirectMath::Fma => format!("direct_conv_{pass}_k{}_{d}", taps(g).next_multiple_of(4)),
        DirectMath::Tf32Warp => format!("direct_warp_{pass}_k{kp}_c{c}_{d}"),
        _ => format!("direct_mma_{pass}_k{kp}_c{c}_{d}"),
    }
}

/// The kernels of `kernels/direct_warp.cu` ([`DirectMath::Tf32Warp`]): each pass for patches of
/// 16 or 32 taps and 32 or 64 output channels.
pub(super) fn warp_symbols() -> Vec<String> {
    let shapes = [16, 32]
        .into_iter()
        .flat_map(|kp| [32, 64].map(|c| (kp, c)));
    ["fwd", "wgrad"]
        .into_iter()
        .flat_map(|pass| shapes.clone().map(move |(kp, c)| (pass, kp, c)))
        .map(|(pass, kp, c)| format!("direct_warp_{pass}_k{kp}_c{c}_f32"))
        .collect()
}

/// Tiles of [`PIXELS`] output positions in `g`.
fn tiles(g: &Conv2dGeometry) -> usize {
    (g.n * g.out_h * g.out_w).div_ceil(PIXELS)
}

/// Fails unless `addr` is 8-byte aligned (two f32 or 16-bit elements a thread at even channel
/// offsets); the tensor cores' 16-byte accesses fall back to `DirectMath::Fma` below 16.
fn aligned(op: &'static str, addr: u64, math: DirectMath) -> Result<DirectMath, TensorError> {
    match (addr % 16, addr % 8) {
        (0, _) => Ok(math),
        (_, 0) => Ok(DirectMath::Fma),
        _ => Err(TensorError::InvalidArgument {
            op,
            reason: format!("direct conv buffers must be 8-byte aligned: {addr:#x}"),
        }),
    }
}

impl Kernels {
    /// Whether the filter gradient of `g` in `dtype` (f32 operands rounded to TF32 where `tf32`,
    /// else full fp32) runs `kernels/wgrad_wgmma.cu`: f32, [`wgmma_applies`], and the kernel
    /// of that arithmetic loaded (an `sm_90` device allowing its shared memory: `load_module`).
    pub(crate) fn wgmma_takes(&self, g: &Conv2dGeometry, dtype: DType, tf32: bool) -> bool {
        let symbol = wgmma_kernel(tf32).symbol;
        dtype == DType::F32 && wgmma_applies(g) && self.functions.contains_key(symbol)
    }

    /// Blocks of the filter gradient's grid for `g` with arithmetic `math`: for the FMA and
    /// mma kernels two per multiprocessor, at most one per tile; for the wgmma kernel one per
    /// multiprocessor (its shared memory), at most one per tile; for the warp kernels
    /// [`Self::warp_blocks`] of 8-position steps. A function of the geometry only, so the
    /// partials' size is known to the plan; the FMA kernel (an unaligned dy's fallback) never
    /// takes more blocks than the warp kernel.
    fn direct_wgrad_blocks(&self, g: &Conv2dGeometry, math: DirectMath) -> usize {
        match math {
            DirectMath::Tf32Wgmma => self.wgmma_blocks(g, wgmma_kernel(true)),
            DirectMath::Tf32x3Wgmma => self.wgmma_blocks(g, wgmma_kernel(false)),
            DirectMath::Tf32Warp => self.warp_blocks(g, 8),
            _ => tiles(g).clamp(1, 2 * self.sms as usize),
        }
    }

    /// Blocks of `kernel`'s grid for `g`: one a multiprocessor (its shared memory), at most one
    /// a tile.
    fn wgmma_blocks(&self, g: &Conv2dGeometry, kernel: &WgmmaKernel) -> usize {
        let strips = g.out_w.div_ceil(wgmma_tile_width(g.out_w, kernel.ksteps));
        (g.n * g.out_h * strips).clamp(1, self.sms as usize)
    }

    /// Blocks of a `kernels/direct_warp.cu` grid for `g` whose warps take segments of `unit`
    /// positions of one output row at a time: as many as the multiprocessors hold at once
    /// ([`WARP_BLOCKS_PER_SM`]), at most one per [`WARP_WARPS`] segments.
    fn warp_blocks(&self, g: &Conv2dGeometry, unit: usize) -> usize {
        let units = g.n * g.out_h * g.out_w.div_ceil(unit);
        units
            .div_ceil(WARP_WARPS)
            .clamp(1, WARP_BLOCKS_PER_SM * self.sms as usize)
    }

    /// The arithmetic of the direct kernels for `g` in `dtype` (`tf32` as for
    /// [`Self::wgmma_takes`]) before any alignment fallback: the wgmma filter gradient where it
    /// takes `g` (its only pass), else [`direct_math`].
    pub(crate) fn math(&self, g: &Conv2dGeometry, dtype: DType, tf32: bool) -> DirectMath {
        match (self.wgmma_takes(g, dtype, tf32), tf32) {
            (true, true) => DirectMath::Tf32Wgmma,
            (true, false) => DirectMath::Tf32x3Wgmma,
            (false, _) => direct_math(g, dtype, tf32),
        }
    }

    /// Bytes of the filter gradient's f64 partials for `g` in `dtype` (`tf32` as for
    /// [`Self::wgmma_takes`]): `[blocks, K + 1, c_out]`.
    pub(crate) fn direct_wgrad_bytes(&self, g: &Conv2dGeometry, dtype: DType, tf32: bool) -> usize {
        let blocks = self.direct_wgrad_blocks(g, self.math(g, dtype, tf32));
        blocks * (taps(g) + 1) * g.c_out * 8
    }

    /// `y = conv(x, w) (+ b)` for `g` of [`direct_applies`], every operand of `dtype` (x NHWC,
    /// w HWIO, b `[c_out]` or 0 for none, y NHWC, overwritten), summed in f32 with the
    /// arithmetic of [`direct_math`] and rounded once; with `relu`, then the ReLU of the
    /// rounded output and, when `mask != 0`, its packed mask (`ceil(numel / 32)` words, as
    /// `relu`'s).
    pub(crate) fn direct_forward(
        &self,
        (g, dtype, tf32): (&Conv2dGeometry, DType, bool),
        (x, w, b, y): (u64, u64, u64, u64),
        (relu, mask): (bool, u64),
    ) -> Result<(), TensorError> {
        const OP: &str = "direct_conv_fwd";
        let math = aligned(OP, y, direct_math(g, dtype, tf32))?;
        let sym = symbol("fwd", g, dtype, math);
        let (blocks, threads) = match math {
            DirectMath::Tf32Warp => (self.warp_blocks(g, 16), 32 * WARP_WARPS as u32),
            _ => (tiles(g).clamp(1, 8 * self.sms as usize), THREADS),
        };
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let (wg, k, c_out, relu) = (
            WindowGeometry::of(g),
            taps(g) as i32,
            g.c_out as i32,
            i32::from(relu),
        );
        let f = self.function(&sym)?;
        // SAFETY: `direct_conv_fwd_k<KP>_<dtype>(const T *x, const T *w, const T *b, T *y,
        // u32 *mask, WindowGeometry g, int K, int c_out, int relu)` with KP = K rounded up to
        // a multiple of 4 (<= 32, direct_applies), or `direct_mma_fwd_k<KP>_c<c_out>_<dtype>`
        // (the same without c_out) with KP = K rounded up to 16 (direct_math); x holds g's
        // NHWC input, w its K*c_out HWIO taps, b null or c_out elements, y g's NHWC output (8-
        // or for mma 16-byte aligned: `aligned`) and mask null or numel/32 words (c_out % 32 ==
        // 0), all of `dtype`; blocks of 256 threads, as the staging (4 threads a position of
        // 64), the 16-lane mask shuffles and the 8 warps of the mma tiles need; or
        // `direct_warp_fwd_k<KP>_c<c_out>_f32` (the mma kernel's arguments) with blocks of 128
        // threads (DW_THREADS), each warp on its own tiles (16 positions of an output row).
        unsafe {
            match math {
                DirectMath::Fma => {
                    launch!(self.stream, f, cfg; &x, &w, &b, &y, &mask, &wg, &k, &c_out, &relu)
                }
                _ => launch!(self.stream, f, cfg; &x, &w, &b, &y, &mask, &wg, &k, &relu),
            }
            .map(drop)
        }
        .map_err(driver(OP))
    }

    /// `dw = Σ patch · dy` (HWIO, overwritten) and `db = Σ dy` (when `db != 0`) for `g` of
    /// [`direct_applies`], every operand of `dtype`, through `partial`
    /// ([`Self::direct_wgrad_bytes`]): f32 sums per thread (or per warp on the tensor cores,
    /// [`direct_math`]), f64 over threads and blocks (a fixed order), rounded once. With
    /// `mask != 0` dy is first masked by the ReLU backward (it becomes the pre-activation
    /// gradient) in the same pass, and written back in place when `keep` (else left as it was).
    pub(crate) fn direct_filter_grad(
        &self,
        (g, dtype, tf32): (&Conv2dGeometry, DType, bool),
        (x, dy, (mask, keep)): (u64, u64, (u64, bool)),
        partial: u64,
        (dw, db): (u64, u64),
    ) -> Result<(), TensorError> {
        const OP: &str = "direct_conv_wgrad";
        if self.wgmma_takes(g, dtype, tf32) {
            let kernel = wgmma_kernel(tf32);
            let blocks = self.wgmma_blocks(g, kernel);
            self.wgmma_filter_grad(g, (x, dy, (mask, keep)), (kernel, partial, blocks))?;
            return self.direct_wgrad_finish(g, dtype, partial, blocks, (dw, db));
        }
        let math = aligned(OP, dy, direct_math(g, dtype, tf32))?;
        let blocks = self.direct_wgrad_blocks(g, math);
        let threads = match math {
            DirectMath::Tf32Warp => 32 * WARP_WARPS as u32,
            _ => THREADS,
        };
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let (wg, k, c_out) = (WindowGeometry::of(g), taps(g) as i32, g.c_out as i32);
        let keep = i32::from(keep);
        let f = self.function(&symbol("wgrad", g, dtype, math))?;
        // SAFETY: `direct_conv_wgrad_k<KP>_<dtype>(const T *x, T *dy, const u32 *mask, int
        // keep, double *partial, WindowGeometry g, int K, int c_out)`, or
        // `direct_mma_wgrad_k<KP>_c<c_out>_<dtype>` (the same without c_out, KP = K rounded up
        // to 16: direct_math); x holds g's NHWC input, dy its NHWC output gradient (8-, for
        // mma 16-byte aligned), mask null or numel/32 words, partial blocks*(K+1)*c_out doubles
        // (direct_wgrad_bytes, the grid's blocks: never more for the FMA fallback than
        // planned); blocks of 256 threads, or for `direct_warp_wgrad_k<KP>_c<c_out>_f32` (the
        // mma kernel's arguments) 128 (DW_THREADS), each
        // warp on its own steps (8 positions of an output row).
        unsafe {
            match math {
                DirectMath::Fma => {
                    launch!(self.stream, f, cfg; &x, &dy, &mask, &keep, &partial, &wg, &k, &c_out)
                }
                _ => launch!(self.stream, f, cfg; &x, &dy, &mask, &keep, &partial, &wg, &k),
            }
            .map(drop)
        }
        .map_err(driver(OP))?;
        self.direct_wgrad_finish(g, dtype, partial, blocks, (dw, db))
    }

    /// `kernel` of `kernels/wgrad_wgmma.cu` for `g` of [`Self::wgmma_takes`]: the partials of
    /// [`Self::direct_filter_grad`] from a grid of `blocks` ([`Self::direct_wgrad_blocks`]).
    fn wgmma_filter_grad(
        &self,
        g: &Conv2dGeometry,
        (x, dy, (mask, keep)): (u64, u64, (u64, bool)),
        (kernel, partial, blocks): (&WgmmaKernel, u64, usize),
    ) -> Result<(), TensorError> {
        const OP: &str = "wgmma_wgrad";
        if x % 16 != 0 || dy % 16 != 0 {
            return Err(TensorError::InvalidArgument {
                op: OP,
                reason: format!("x and dy must be 16-byte aligned: {x:#x}, {dy:#x}"),
            });
        }
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (WGMMA_THREADS, 1, 1),
            shared_mem_bytes: kernel.shared as u32,
        };
        let (wg, keep) = (WindowGeometry::of(g), i32::from(keep));
        let tw = wgmma_tile_width(g.out_w, kernel.ksteps) as i32;
        let f = self.function(kernel.symbol)?;
        // SAFETY: `wgmma_wgrad_3x3_c64_f32[x3](const float *x, float *dy, const u32 *mask, int
        // keep, double *partial, WindowGeometry g, int tw)`; x holds g's NHWC f32 input and dy
        // its NHWC output gradient (64 channels each, 16-byte aligned: checked above), mask
        // null or numel/32 words, partial blocks*577*64 doubles (direct_wgrad_bytes, the
        // grid's blocks); blocks of 384 threads with the kernel's shared bytes of dynamic
        // shared memory (allowed at load: load_module, wgmma_takes), tiles tw <= 8 ksteps wide
        // (wgmma_tile_width).
        unsafe { launch!(self.stream, f, cfg; &x, &dy, &mask, &keep, &partial, &wg, &tw).map(drop) }
            .map_err(driver(OP))
    }

    /// Sums the `splits` blocks' partials into `dw` (and `db` unless 0), rounded once to
    /// `dtype`.
    fn direct_wgrad_finish(
        &self,
        g: &Conv2dGeometry,
        dtype: DType,
        partial: u64,
        splits: usize,
        (dw, db): (u64, u64),
    ) -> Result<(), TensorError> {
        const OP: &str = "direct_conv_wgrad";
        let (k, c_out) = (taps(g), g.c_out);
        let sym = format!("direct_conv_wgrad_finish_{}", dtype.name());
        let cfg = Self::finish_grid((k + 1) * c_out);
        // SAFETY: `direct_conv_wgrad_finish_<dtype>(const double *partial, T *dw, T *db,
        // size_t splits, size_t K, size_t c_out)`; partial holds splits*(K+1)*c_out doubles,
        // dw K*c_out elements of `dtype`, db null or c_out; blocks of 32 x 32 threads
        // (finish_grid over (K+1)*c_out columns), as column_sums needs.
        unsafe {
            launch!(self.stream, self.function(&sym)?, cfg; &partial, &dw, &db, &splits, &k, &c_out)
                .map(drop)
        }
        .map_err(driver(OP))
    }
}

#[cfg(test)]
mod tests {
    use super::wgmma_tile_width;

    /// The fewest k-steps in all, then the fewest strips. TF32 (5 k-steps a tile at most): the
    /// seed's 200 columns in 5 tiles of 40 (every k-slot a position), ResNet-50's 56 in 2 of
    /// 28, 95 in 3 of 32, 48 in 2 of 24, widths up to 40 in one tile. 3xTF32 (4 at most): 200
    /// in 9 tiles of 23 (27 k-steps; 7 of 29 would take 28), 56 in 2 of 28, 40 in 5 of 8 (5
    /// k-steps; 2 of 20 would take 6).
    #[test]
    fn tile_widths_take_the_fewest_k_steps_then_the_fewest_strips() {
        for (out_w, tw) in [
            (200, 40),
            (56, 28),
            (95, 32),
            (40, 40),
            (48, 24),
            (1, 1),
            (7, 7),
        ] {
            assert_eq!(wgmma_tile_width(out_w, 5), tw, "{out_w}");
        }
        for (out_w, tw) in [(200, 23), (56, 28), (40, 8), (32, 32), (33, 7), (1, 1)] {
            assert_eq!(wgmma_tile_width(out_w, 4), tw, "{out_w}");
        }
    }
}
