//! Our own CUDA kernels: sources in `kernels/*.cu`, compiled by NVRTC for the device's compute
//! capability, loaded once per backend, launched through one typed function each.
//!
//! Each source is embedded with `include_str!` and `kernels/common.cuh` is prepended as text
//! (NVRTC's include paths want files on disk). NVRTC compiles each module to the device's
//! machine code (CUBIN, loaded by the driver as it is), cached per process and architecture and
//! on disk (`kernels/disk_cache.rs`), so opening a second backend, or a second process, does not
//! compile again. Symbols are
//! `{op}_{dtype}`: kernels written once as templates are instantiated per float dtype
//! (`unary_f32`, `unary_bf16`, `unary_f16`), and the loaded functions are found by that name.
//! cudarc's `.arg()` is unchecked, so every kernel has exactly one launcher (in `launch.rs`,
//! `rows.rs` and `spatial.rs`), which owns the argument order and quotes the C signature in its
//! `// SAFETY:` comment. Addresses are raw `CUdeviceptr`s of allocator-owned buffers
//! ([`crate::Tensor::addr`]).

use crate::{AdamHyper, DType, TensorError};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaStream, DeviceRepr, DriverError, LaunchConfig,
};
/// `stream.launch_builder(f)`, each argument pushed in order, then `.launch(cfg)`: the
/// driver's result. Unsafe as cudarc's `launch` is: use it inside an `unsafe` block whose
/// SAFETY comment states the kernel's signature and the sizes of the buffers passed.
macro_rules! launch {
    ($stream:expr, $f:expr, $cfg:expr; $($arg:expr),+ $(,)?) => {{
        let mut builder = $stream.launch_builder($f);
        $(builder.arg($arg);)+
        builder.launch($cfg)
    }};
}

mod conv_wgmma;
mod dense;
mod direct;
mod disk_cache;
mod gemm;
mod launch;
mod norm;
mod rows;
mod source;
mod spatial;

pub(crate) use conv_wgmma::CONV_WGMMA_PACKED;
pub(crate) use dense::dense_rows_apply;
pub(crate) use direct::{DirectMath, direct_applies};
pub use source::KernelModule;
use source::compile;
pub(crate) use spatial::{OHWI, max_pool_bwd_bytes};

use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::sync::Arc;

// SAFETY: `AdamHyper` is `#[repr(C)]` with eight f32 fields, the layout of `struct AdamHyper`
// in kernels/adam.cu, and holds no pointers; it is passed by value as a kernel parameter.
unsafe impl DeviceRepr for AdamHyper {}

/// Threads per block of the 1-D launches.
const BLOCK: u32 = 256;

/// Whether every address is 16-byte aligned (the vectorized kernels load `float4`s).
fn aligned16(addrs: &[u64]) -> bool {
    addrs.iter().all(|a| a % 16 == 0)
}

/// The loaded kernel modules of one backend and their launchers (all on the compute stream).
#[derive(Debug)]
pub(crate) struct Kernels {
    stream: Arc<CudaStream>,
    /// Loaded modules: those of [`KernelModule::ALL`] the device takes.
    _modules: Vec<Arc<CudaModule>>,
    /// Every kernel, by symbol.
    functions: HashMap<String, CudaFunction>,
    /// Upper bound on blocks of a grid-stride launch (32 per multiprocessor).
    max_blocks: u32,
    /// Multiprocessors of the device.
    sms: u32,
    /// The most dynamic shared memory one block may take on the device, in bytes (227 KiB on
    /// Hopper, 163 KiB on the A100, 99 KiB on sm_86 and sm_89).
    shared_optin: usize,
}

/// Lets `f` take up to `bytes` of dynamic shared memory (more than the default 48 KiB), once
/// at load.
fn allow_shared(f: &CudaFunction, bytes: usize) -> Result<(), TensorError> {
    use cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as MAX;
    f.set_attribute(MAX, bytes as i32)
        .map_err(driver("cuFuncSetAttribute"))
}

/// A loaded module and its kernels by symbol.
type Loaded = (Arc<CudaModule>, Vec<(String, CudaFunction)>);

/// Loads module `m` from `cubin` (compiled for `arch`), compiling it again once if the driver
/// refuses a cached image (a damaged file), and each of its kernels with the dynamic shared
/// memory it needs on a device allowing `shared_optin` bytes a block.
fn load_module(
    ctx: &Arc<CudaContext>,
    m: KernelModule,
    arch: &str,
    cubin: Vec<u8>,
    shared_optin: usize,
) -> Result<Loaded, TensorError> {
    let module = match ctx.load_module(Ptx::from_binary(cubin)) {
        Ok(module) => module,
        Err(_) => ctx
            .load_module(Ptx::from_binary(source::recompile(m, arch)?))
            .map_err(driver("cuModuleLoadData"))?,
    };
    let mut functions = Vec::new();
    for symbol in m.symbols() {
        let f = module
            .load_function(&symbol)
            .map_err(driver("cuModuleGetFunction"))?;
        if let Some((_, bytes)) = gemm::SHARED_KERNELS.iter().find(|k| k.0 == symbol) {
            // not loaded where its shared memory does not fit: gemm_wf32_fits says so
            if *bytes > shared_optin {
                continue;
            }
            allow_shared(&f, *bytes)?;
        } else if dense::is_mma(&symbol) {
            // what the device allows: a shape needing more is not dispatched there
            allow_shared(&f, dense::MMA_SHARED_MAX.min(shared_optin))?;
        } else if let Some(bytes) = wgmma_shared(&symbol) {
            // not loaded where its shared memory does not fit: its pass stays on cuDNN
            if bytes > shared_optin {
                continue;
            }
            allow_shared(&f, bytes)?;
        }
        functions.push((symbol, f));
    }
    Ok((module, functions))
}

/// The dynamic shared memory of a warpgroup kernel (`kernels/wgrad_wgmma.cu`,
/// `kernels/conv_wgmma.cu`), none for another symbol.
fn wgmma_shared(symbol: &str) -> Option<usize> {
    let wgrad = direct::WGMMA_WGRADS.iter().find(|k| k.symbol == symbol);
    match wgrad {
        Some(k) => Some(k.shared),
        None => (symbol == conv_wgmma::CONV_WGMMA).then_some(conv_wgmma::CONV_WGMMA_SMEM),
    }
}

fn driver(op: &'static str) -> impl FnOnce(DriverError) -> TensorError {
    move |source| TensorError::Driver { op, source }
}

impl Kernels {
    /// Compiles (in parallel, or from the process cache) and loads every module for the
    /// device of `stream`. This is the backend's `warm_up`: it runs before the allocator makes
    /// its first reservation, so a preallocating arena cannot starve a module load.
    ///
    /// # Errors
    /// [`TensorError::Compile`] with NVRTC's log; [`TensorError::Driver`] if a module or
    /// function fails to load.
    pub(crate) fn load(stream: Arc<CudaStream>) -> Result<Kernels, TensorError> {
        let ctx: &Arc<CudaContext> = stream.context();
        let (major, minor) = ctx
            .compute_capability()
            .map_err(driver("cuDeviceGetAttribute"))?;
        let arch = &format!("sm_{major}{minor}");
        use cudarc::driver::sys::CUdevice_attribute as Attr;
        let attribute = |a| ctx.attribute(a).map_err(driver("cuDeviceGetAttribute"));
        let sms = attribute(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let shared_optin =
            attribute(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?.max(0) as usize;
        // the modules for this device, each with its architecture (KernelModule::arch)
        let wanted: Vec<(KernelModule, String)> = KernelModule::ALL
            .iter()
            .filter_map(|&m| m.arch(arch).map(|a| (m, a)))
            .collect();
        let cubins: Vec<Result<Vec<u8>, TensorError>> = std::thread::scope(|s| {
            let jobs: Vec<_> = wanted
                .iter()
                .map(|(m, a)| s.spawn(move || compile(*m, a)))
                .collect();
            jobs.into_iter()
                .zip(&wanted)
                .map(|(j, (m, _))| {
                    j.join().unwrap_or_else(|_| {
                        Err(TensorError::Compile {
                            kernel: m.file(),
                            log: "nvrtc panicked".into(),
                        })
                    })
                })
                .collect()
        });
        let mut modules = Vec::with_capacity(wanted.len());
        let mut functions = HashMap::new();
        for (cubin, (m, a)) in cubins.into_iter().zip(&wanted) {
            match cubin.and_then(|c| load_module(ctx, *m, a, c, shared_optin)) {
                Ok((module, loaded)) => {
                    functions.extend(loaded);
                    modules.push(module);
                }
                // its passes stay on cuDNN (Kernels::wgmma_takes sees no kernel)
                Err(_) if m.optional() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(Kernels {
            stream,
            _modules: modules,
            functions,
            max_blocks: (sms.max(1) as u32) * 32,
            sms: sms.max(1) as u32,
            shared_optin,
        })
    }

    /// The kernel `symbol`.
    fn function(&self, symbol: &str) -> Result<&CudaFunction, TensorError> {
        self.functions
            .get(symbol)
            .ok_or_else(|| TensorError::InvalidArgument {
                op: "kernel",
                reason: format!("no kernel {symbol} is loaded"),
            })
    }

    /// The kernel `{root}_{dtype}`, or [`TensorError::UnsupportedDType`] naming `root`.
    fn typed(&self, root: &'static str, dtype: DType) -> Result<&CudaFunction, TensorError> {
        let symbol = format!("{root}_{}", dtype.name());
        match self.functions.get(&symbol) {
            Some(f) => Ok(f),
            None => Err(TensorError::UnsupportedDType {
                op: root,
                dtype,
                supported: "f32, bf16, f16",
            }),
        }
    }

    /// The launch of a reduction's finishing kernel over `c` channels: blocks of 32 x 32
    /// threads, 32 channels a block (`column_sums` in `kernels/common.cuh`).
    fn finish_grid(c: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (c.div_ceil(32).max(1) as u32, 1, 1),
            block_dim: (32, 32, 1),
            shared_mem_bytes: 0,
        }
    }

    /// A 1-D grid-stride configuration for `n` work items.
    fn grid(&self, n: usize) -> LaunchConfig {
        let blocks = n
            .div_ceil(BLOCK as usize)
            .clamp(1, self.max_blocks as usize) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NVRTC needs no GPU: wherever libnvrtc loads, every module must compile for Hopper and
    /// define every symbol the registry loads.
    #[test]
    fn every_module_compiles_where_nvrtc_is_present() {
        // SAFETY: only probes whether the library can be opened.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            let required = std::env::var("STAX_REQUIRE_GPU").is_ok_and(|v| v == "1");
            assert!(
                !required,
                "STAX_REQUIRE_GPU=1 but libnvrtc is not on the loader path"
            );
            // Straight to stderr: libtest captures `eprintln!`, and CI must show the skip.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "skipped: libnvrtc not on the loader path"
            );
            return;
        }
        for m in KernelModule::ALL {
            // compiled for a Hopper device (sm_90, sm_90a for wgmma), not read from a disk cache
            let arch = m.arch("sm_90").expect("every module loads on Hopper");
            let cubin = source::build(m, &arch, None, source::Cached::Read)
                .unwrap_or_else(|e| panic!("{e}"));
            for symbol in m.symbols() {
                assert!(
                    source::names(&cubin, &symbol),
                    "{} lacks {symbol}",
                    m.file()
                );
            }
        }
    }
}
