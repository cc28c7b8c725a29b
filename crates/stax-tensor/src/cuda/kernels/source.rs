//! The kernel sources and their compilation: one [`KernelModule`] per `kernels/*.cu` file,
//! `kernels/common.cuh` prepended as text, NVRTC to the device's machine code (CUBIN: the driver
//! loads it without compiling PTX again), a process-wide cache of it and an on-disk one across
//! processes (`disk_cache.rs`).

use super::disk_cache;
use crate::TensorError;
use std::collections::HashMap;
use std::ffi::CString;
use std::path::Path;
use std::sync::{Mutex, OnceLock};

const COMMON: &str = include_str!("../../../../../kernels/common.cuh");
/// What the direct convolution modules share (prepended to both after [`COMMON`]).
const DIRECT_COMMON: &str = include_str!("../../../../../kernels/direct_common.cuh");

/// The per-dtype roots of `kernels/direct_conv.cu`: each pass for patches of 4, 8, ..., 32
/// taps, and the filter gradient's finishing sum.
const DIRECT_ROOTS: [&str; 17] = [
    "direct_conv_fwd_k4",
    "direct_conv_fwd_k8",
    "direct_conv_fwd_k12",
    "direct_conv_fwd_k16",
    "direct_conv_fwd_k20",
    "direct_conv_fwd_k24",
    "direct_conv_fwd_k28",
    "direct_conv_fwd_k32",
    "direct_conv_wgrad_k4",
    "direct_conv_wgrad_k8",
    "direct_conv_wgrad_k12",
    "direct_conv_wgrad_k16",
    "direct_conv_wgrad_k20",
    "direct_conv_wgrad_k24",
    "direct_conv_wgrad_k28",
    "direct_conv_wgrad_k32",
    "direct_conv_wgrad_finish",
];

/// The 16-bit roots of `kernels/direct_mma.cu` (bf16 and f16): each pass for patches of 16 or
/// 32 taps and 32, 64 or 128 output channels.
const DIRECT_MMA_ROOTS: [&str; 12] = [
    "direct_mma_fwd_k16_c32",
    "direct_mma_fwd_k16_c64",
    "direct_mma_fwd_k16_c128",
    "direct_mma_fwd_k32_c32",
    "direct_mma_fwd_k32_c64",
    "direct_mma_fwd_k32_c128",
    "direct_mma_wgrad_k16_c32",
    "direct_mma_wgrad_k16_c64",
    "direct_mma_wgrad_k16_c128",
    "direct_mma_wgrad_k32_c32",
    "direct_mma_wgrad_k32_c64",
    "direct_mma_wgrad_k32_c128",
];

/// Its f32 kernels (TF32): 128 output channels (fewer run `kernels/direct_warp.cu`).
const DIRECT_MMA_F32: [&str; 4] = [
    "direct_mma_fwd_k16_c128_f32",
    "direct_mma_fwd_k32_c128_f32",
    "direct_mma_wgrad_k16_c128_f32",
    "direct_mma_wgrad_k32_c128_f32",
];

/// One `.cu` file: a module loaded once per backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelModule {
    /// `kernels/elementwise.cu`: fills, casts, the 3xTF32 operand split and the vectorized
    /// ReLU and bias paths.
    Elementwise,
    /// `kernels/activation.cu`: activations, binary ops, bias add and gradient, dropout, every
    /// float dtype.
    Activation,
    /// `kernels/softmax_xent.cu`: softmax cross-entropy with its gradient, a mean, softmax and
    /// log-softmax over an axis (every float dtype) and the losses with integer labels.
    SoftmaxXent,
    /// `kernels/adam.cu`: the fused Adam step (every gradient and first-moment dtype; for the
    /// dense update also keeping the old weight in bf16 or f16), the small-batch dense update
    /// in one pass (f32 FMAs) and the loss scale's finiteness check.
    Adam,
    /// `kernels/layout.cu`: filter transposes and padding copies for cuDNN (every float
    /// dtype), block copies.
    Layout,
    /// `kernels/pool.cu`: max, sum and average pooling forward and backward, every float dtype.
    Pool,
    /// `kernels/norm.cu`: per-channel reductions: batch normalization (f32), the channel bias
    /// and its gradient (every float dtype).
    Norm,
    /// `kernels/gemm.cu`: the mixed-precision dense product (bf16 or f16 times an f32 weight
    /// rounded as it is read) on tensor cores, split over k, and its reduction.
    Gemm,
    /// `kernels/direct_conv.cu`: the forward pass and the filter gradient of convolutions with
    /// at most 32 taps, in f32 FMAs, every float dtype.
    DirectConv,
    /// `kernels/direct_mma.cu`: the same passes on the tensor cores (bf16 and f16 mma, TF32
    /// for f32 with 128 output channels), 32 to 128 output channels.
    DirectMma,
    /// `kernels/direct_warp.cu`: the same passes in TF32 with 32 or 64 output channels, a warp
    /// a tile, no barriers (memory-bound shapes: the seed's conv1).
    DirectWarp,
    /// `kernels/dense_mma.cu`: the dense update in one pass on the TF32 tensor cores.
    DenseMma,
    /// `kernels/wgrad_wgmma.cu`: the filter gradient of a 3x3 conv from 64 to 64 channels in
    /// TF32 on Hopper's warpgroup tensor cores (`sm_90a` only: compiled for `sm_90` devices,
    /// not loaded elsewhere).
    WgradWgmma,
    /// `kernels/conv_wgmma.cu`: the forward and backward-data passes of the same conv in full
    /// fp32 as 3xTF32 on Hopper's warpgroup tensor cores (`sm_90a` only, as `WgradWgmma`).
    ConvWgmma,
}

impl KernelModule {
    /// Every module, in index order.
    pub const ALL: [KernelModule; 14] = [
        KernelModule::Elementwise,
        KernelModule::Activation,
        KernelModule::SoftmaxXent,
        KernelModule::Adam,
        KernelModule::Layout,
        KernelModule::Pool,
        KernelModule::Norm,
        KernelModule::Gemm,
        KernelModule::DirectConv,
        KernelModule::DirectMma,
        KernelModule::DirectWarp,
        KernelModule::DenseMma,
        KernelModule::WgradWgmma,
        KernelModule::ConvWgmma,
    ];

    /// The file name, for messages.
    pub fn file(self) -> &'static str {
        match self {
            KernelModule::Elementwise => "elementwise.cu",
            KernelModule::Activation => "activation.cu",
            KernelModule::SoftmaxXent => "softmax_xent.cu",
            KernelModule::Adam => "adam.cu",
            KernelModule::Layout => "layout.cu",
            KernelModule::Pool => "pool.cu",
            KernelModule::Norm => "norm.cu",
            KernelModule::Gemm => "gemm.cu",
            KernelModule::DirectConv => "direct_conv.cu",
            KernelModule::DirectMma => "direct_mma.cu",
            KernelModule::DirectWarp => "direct_warp.cu",
            KernelModule::DenseMma => "dense_mma.cu",
            KernelModule::WgradWgmma => "wgrad_wgmma.cu",
            KernelModule::ConvWgmma => "conv_wgmma.cu",
        }
    }

    /// Whether the backend opens without this module when it fails to compile or load (its
    /// passes then stay on cuDNN): `wgrad_wgmma.cu` and `conv_wgmma.cu`, the modules no pass
    /// depends on.
    pub(super) fn optional(self) -> bool {
        matches!(self, KernelModule::WgradWgmma | KernelModule::ConvWgmma)
    }

    /// The architecture the module is compiled for on a device of `device` (`sm_XY`): the
    /// device's own, except `wgrad_wgmma.cu` and `conv_wgmma.cu`, whose `wgmma` instructions
    /// exist only in `sm_90a` (Hopper's architecture-specific features): compiled for an
    /// `sm_90` device and not loaded elsewhere (`None`).
    pub(super) fn arch(self, device: &str) -> Option<String> {
        match self {
            KernelModule::WgradWgmma | KernelModule::ConvWgmma => {
                (device == "sm_90").then(|| "sm_90a".to_string())
            }
            _ => Some(device.to_string()),
        }
    }

    /// The kernel symbols the module defines: fixed names, and roots instantiated per float
    /// dtype as `{root}_{dtype}`.
    pub(super) fn symbols(self) -> Vec<String> {
        let fixed: &[&str] = match self {
            KernelModule::Elementwise => &[
                "fill_u32",
                "fill_u16",
                "cast_f32_bf16",
                "cast_f32_f16",
                "cast_bf16_f32",
                "cast_f16_f32",
                "cast_bf16_f16",
                "cast_f16_bf16",
                "cast_vec_f32_bf16",
                "cast_vec_f32_f16",
                "cast_vec_bf16_f32",
                "cast_vec_f16_f32",
                "cast_vec_bf16_f16",
                "cast_vec_f16_bf16",
                "tf32_split",
                "tf32_stack",
            ],
            KernelModule::Activation => &[],
            KernelModule::SoftmaxXent => &["softmax_xent_f32", "mean_f64_to_f32", "index_loss_f32"],
            KernelModule::Adam => &[
                "adam_vec_f32",
                "adam_old_bf16",
                "adam_old_f16",
                "adam_old_vec_bf16",
                "adam_old_vec_f16",
            ],
            KernelModule::Layout => &["copy_block_u32", "copy_block_u16"],
            KernelModule::Pool => &[],
            KernelModule::Norm => &[
                "bn_finish_f32",
                "bn_scale_f32",
                "bn_bwd_finish_f32",
                "bn_fold_f32",
            ],
            KernelModule::DirectConv | KernelModule::DenseMma | KernelModule::DirectWarp => &[],
            KernelModule::DirectMma => &DIRECT_MMA_F32,
            KernelModule::WgradWgmma => &[
                super::direct::WGMMA_WGRADS[0].symbol,
                super::direct::WGMMA_WGRADS[1].symbol,
            ],
            KernelModule::ConvWgmma => &["conv_wgmma_pack", super::conv_wgmma::CONV_WGMMA],
            KernelModule::Gemm => &[
                "gemm_wf32_bf16",
                "gemm_wf32_f16",
                "gemm_wf32_reduce_bf16",
                "gemm_wf32_reduce_f16",
                "gemm_wf32_f32x3",
                "gemm_wf32_reduce_f32",
            ],
        };
        let per_dtype: &[&str] = match self {
            KernelModule::Activation => &[
                "unary",
                "unary_bwd",
                "binary",
                "bias_add",
                "bias_grad_partial",
                "bias_grad_finish",
                "dropout",
                "dropout_bwd",
            ],
            KernelModule::SoftmaxXent => &["softmax", "softmax_bwd"],
            KernelModule::Adam => &["adam", "adam_mu_bf16", "adam_mu_f16", "all_finite"],
            KernelModule::Layout => &[
                "filter_permute",
                "filter_transpose",
                "pad_nhwc",
                "crop_nhwc",
                "im2col_nhwc",
            ],
            KernelModule::Pool => &[
                "max_pool",
                "max_pool_vec",
                "max_pool_bwd",
                "max_pool_bwd_vec",
                "sum_pool",
                "sum_pool_bwd",
            ],
            KernelModule::Norm => &[
                "channel_moments",
                "channel_sum_finish",
                "channel_bias_add",
                "bn_apply",
                "bn_apply_relu",
                "bn_bwd_apply",
                "channel_moments_vec",
                "bn_apply_vec",
                "bn_bwd_apply_vec",
                "bn_bwd_apply_sum_vec",
            ],
            KernelModule::Elementwise => &[
                "relu",
                "relu_vec",
                "relu_bwd_vec",
                "binary_vec",
                "binary_masked_vec",
                "bias_add_vec",
                "bias_grad_vec",
            ],
            KernelModule::Gemm
            | KernelModule::DenseMma
            | KernelModule::WgradWgmma
            | KernelModule::ConvWgmma
            | KernelModule::DirectWarp => &[],
            KernelModule::DirectConv => &DIRECT_ROOTS,
            KernelModule::DirectMma => &DIRECT_MMA_ROOTS,
        };
        use crate::DType::{BF16, F16};
        let floats = match self {
            KernelModule::DirectMma => &[BF16, F16][..],
            _ => &crate::DType::FLOATS[..],
        };
        let floats = floats.iter().map(|d| d.name());
        let generic = per_dtype
            .iter()
            .flat_map(|root| floats.clone().map(move |d| format!("{root}_{d}")));
        // the dense update's kernels, one per batch size (or 8 rows of it)
        let batches = super::dense::symbols(self);
        let warp = match self {
            KernelModule::DirectWarp => super::direct::warp_symbols(),
            _ => Vec::new(),
        };
        let fixed = fixed
            .iter()
            .map(|s| s.to_string())
            .chain(batches)
            .chain(warp);
        fixed.chain(generic).collect()
    }

    fn source(self) -> &'static str {
        match self {
            KernelModule::Elementwise => include_str!("../../../../../kernels/elementwise.cu"),
            KernelModule::Activation => include_str!("../../../../../kernels/activation.cu"),
            KernelModule::SoftmaxXent => include_str!("../../../../../kernels/softmax_xent.cu"),
            KernelModule::Adam => include_str!("../../../../../kernels/adam.cu"),
            KernelModule::Layout => include_str!("../../../../../kernels/layout.cu"),
            KernelModule::Pool => include_str!("../../../../../kernels/pool.cu"),
            KernelModule::Norm => include_str!("../../../../../kernels/norm.cu"),
            KernelModule::Gemm => include_str!("../../../../../kernels/gemm.cu"),
            KernelModule::DirectConv => include_str!("../../../../../kernels/direct_conv.cu"),
            KernelModule::DirectMma => include_str!("../../../../../kernels/direct_mma.cu"),
            KernelModule::DirectWarp => include_str!("../../../../../kernels/direct_warp.cu"),
            KernelModule::DenseMma => include_str!("../../../../../kernels/dense_mma.cu"),
            KernelModule::WgradWgmma => include_str!("../../../../../kernels/wgrad_wgmma.cu"),
            KernelModule::ConvWgmma => include_str!("../../../../../kernels/conv_wgmma.cu"),
        }
    }
}

/// CUBIN per (module, architecture).
type Cubins = HashMap<(KernelModule, String), Vec<u8>>;

/// The process's [`Cubins`], shared by every backend.
fn cubin_cache() -> &'static Mutex<Cubins> {
    static CACHE: OnceLock<Mutex<Cubins>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// Compiles `module` for `arch` (e.g. `sm_90`), or returns the CUBIN cached in this process or
/// on disk ([`disk_cache::dir`]).
pub(super) fn compile(module: KernelModule, arch: &str) -> Result<Vec<u8>, TensorError> {
    let key = (module, arch.to_string());
    if let Some(cubin) = cubin_cache()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&key)
    {
        return Ok(cubin.clone());
    }
    let cubin = build(module, arch, disk_cache::dir().as_deref(), Cached::Read)?;
    remember(key, &cubin);
    Ok(cubin)
}

/// Compiles `module` for `arch` again, past both caches, and stores the CUBIN in them: for a
/// cached image the driver refused (a file damaged on disk).
pub(super) fn recompile(module: KernelModule, arch: &str) -> Result<Vec<u8>, TensorError> {
    let cubin = build(module, arch, disk_cache::dir().as_deref(), Cached::Replace)?;
    remember((module, arch.to_string()), &cubin);
    Ok(cubin)
}

fn remember(key: (KernelModule, String), cubin: &[u8]) {
    cubin_cache()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, cubin.to_vec());
}

/// What [`build`] does with a disk cache's file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cached {
    /// Returned if there; else the compiled image is stored.
    Read,
    /// Not read: compiled and stored over it.
    Replace,
}

/// `module`'s CUBIN for `arch` (a real architecture, `sm_XY`): read from the disk cache `dir`
/// if there (and `cached` is [`Cached::Read`]), else compiled by NVRTC and stored there.
pub(super) fn build(
    module: KernelModule,
    arch: &str,
    dir: Option<&Path>,
    cached: Cached,
) -> Result<Vec<u8>, TensorError> {
    let header = match module {
        KernelModule::DirectConv | KernelModule::DirectMma => DIRECT_COMMON,
        _ => "",
    };
    let src = format!(
        "{COMMON}\n{header}\n#line 1 \"{}\"\n{}",
        module.file(),
        module.source()
    );
    let options = vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()];
    let disk = dir.map(|d| (d, disk_cache::key(&src, &options, nvrtc_version())));
    let read = disk.filter(|_| cached == Cached::Read);
    if let Some(cubin) = read.and_then(|(d, k)| disk_cache::read(d, module.file(), k)) {
        return Ok(cubin);
    }
    let cubin = nvrtc_cubin(&src, module.file(), &options).map_err(|log| TensorError::Compile {
        kernel: module.file(),
        log,
    })?;
    if let Some((d, k)) = disk {
        disk_cache::write(d, module.file(), k, &cubin);
    }
    Ok(cubin)
}

/// NVRTC's CUBIN of `src` (named `name`) under `options`, whose `--gpu-architecture` is a real
/// architecture; on failure NVRTC's status and log.
fn nvrtc_cubin(src: &str, name: &str, options: &[String]) -> Result<Vec<u8>, String> {
    use cudarc::nvrtc::{result, sys};
    let text = |e: &dyn std::fmt::Debug| format!("{e:?}");
    let c_src = CString::new(src).map_err(|e| text(&e))?;
    let c_name = CString::new(name).map_err(|e| text(&e))?;
    let prog = result::create_program(&c_src, Some(&c_name)).map_err(|e| text(&e))?;
    // SAFETY: `prog` was created above and is destroyed once, below; the size and the buffer
    // passed to NVRTC agree.
    let cubin = unsafe {
        let compiled = result::compile_program(prog, options).map_err(|e| {
            let log = result::get_program_log(prog).unwrap_or_default();
            let log: Vec<u8> = log
                .iter()
                .map(|&c| c as u8)
                .take_while(|&c| c != 0)
                .collect();
            format!("{e:?}: {}", String::from_utf8_lossy(&log))
        });
        let cubin = compiled.and_then(|()| {
            let mut size = 0usize;
            sys::nvrtcGetCUBINSize(prog, &mut size)
                .result()
                .map_err(|e| text(&e))?;
            let mut buf = vec![0u8; size];
            sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast())
                .result()
                .map_err(|e| text(&e))?;
            Ok(buf)
        });
        let _ = result::destroy_program(prog);
        cubin
    }?;
    Ok(cubin)
}

/// NVRTC's `(major, minor)` version (`(0, 0)` if it cannot say): part of the disk cache's key.
fn nvrtc_version() -> (i32, i32) {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: nvrtcVersion writes two ints through valid pointers; NVRTC is loaded (the
    // backend probed it before compiling anything).
    let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    match status {
        cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS => (major, minor),
        _ => (0, 0),
    }
}

/// Whether the image `cubin` names `symbol` (its ELF string table holds every kernel's name).
#[cfg(test)]
pub(super) fn names(cubin: &[u8], symbol: &str) -> bool {
    cubin.windows(symbol.len()).any(|w| w == symbol.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where NVRTC loads (no GPU needed): a module compiled into an empty disk cache is
    /// stored there, a second build reads the same CUBIN back instead of compiling, and a
    /// replacing build (after the driver refused a damaged file) compiles and stores over it.
    #[test]
    fn a_module_compiled_once_is_read_from_the_disk_cache() {
        // SAFETY: only probes whether the library can be loaded.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            eprintln!("a_module_compiled_once_is_read_from_the_disk_cache: skipped: no NVRTC");
            return;
        }
        let dir = std::env::temp_dir().join(format!("stax-kcache-build-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let module = KernelModule::Gemm;
        let first = build(module, "sm_90", Some(&dir), Cached::Read).unwrap();
        assert!(first.starts_with(b"\x7fELF"), "an ELF image");
        assert!(names(&first, "gemm_wf32_bf16"), "CUBIN of gemm.cu");
        let files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
        assert_eq!(files.len(), 1, "one cached module");
        // the file's content is what a second build returns: replace it to see it is read
        let path = files[0].path();
        std::fs::write(&path, "from the cache").unwrap();
        assert_eq!(
            build(module, "sm_90", Some(&dir), Cached::Read).unwrap(),
            b"from the cache"
        );
        // replaced: compiled again and stored over the damaged file
        let again = build(module, "sm_90", Some(&dir), Cached::Replace).unwrap();
        assert!(names(&again, "gemm_wf32_bf16"), "compiled, not read");
        assert_eq!(std::fs::read(&path).unwrap(), again, "stored over it");
        // another architecture is another key: compiled, not read
        let other = build(module, "sm_80", Some(&dir), Cached::Read).unwrap();
        assert!(
            other.starts_with(b"\x7fELF") && other != first,
            "compiled for sm_80"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
