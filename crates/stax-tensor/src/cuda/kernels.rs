//! Our own CUDA kernels: sources in `kernels/*.cu`, compiled by NVRTC for the device's compute
//! capability, loaded once per backend, launched through one typed function each.
//!
//! Each source is embedded with `include_str!` and `kernels/common.cuh` is prepended as text
//! (NVRTC's include paths want files on disk). Compiled PTX is cached per process and
//! architecture, so opening a second backend does not compile again. cudarc's `.arg()` is
//! unchecked, so every kernel has exactly one launcher here, which owns the argument order and
//! quotes the C signature in its `// SAFETY:` comment. Addresses are raw `CUdeviceptr`s of
//! allocator-owned buffers ([`crate::Tensor::addr`]).

use crate::{AdamHyper, TensorError};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaStream, DeviceRepr, DriverError, LaunchConfig,
    PushKernelArg,
};
mod source;

pub use source::KernelModule;
use source::compile;

use cudarc::nvrtc::Ptx;
use std::sync::Arc;

// SAFETY: `AdamHyper` is `#[repr(C)]` with seven f32 fields, the layout of `struct AdamHyper`
// in kernels/adam.cu, and holds no pointers; it is passed by value as a kernel parameter.
unsafe impl DeviceRepr for AdamHyper {}

/// Every kernel symbol, indexing the loaded functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kernel {
    FillU32,
    BiasAdd,
    BiasAddVec,
    BiasGradPartial,
    BiasGradVec,
    BiasGradFinish,
    Relu,
    ReluVec,
    ReluBwd,
    ReluBwdVec,
    SoftmaxXent,
    MeanF64,
    Adam,
    AdamVec,
    HwioToOhwi,
    OhwiToHwio,
    PadNhwc,
    CropNhwc,
}

impl Kernel {
    const ALL: [Kernel; 18] = [
        Kernel::FillU32,
        Kernel::BiasAdd,
        Kernel::BiasAddVec,
        Kernel::BiasGradPartial,
        Kernel::BiasGradVec,
        Kernel::BiasGradFinish,
        Kernel::Relu,
        Kernel::ReluVec,
        Kernel::ReluBwd,
        Kernel::ReluBwdVec,
        Kernel::SoftmaxXent,
        Kernel::MeanF64,
        Kernel::Adam,
        Kernel::AdamVec,
        Kernel::HwioToOhwi,
        Kernel::OhwiToHwio,
        Kernel::PadNhwc,
        Kernel::CropNhwc,
    ];

    fn symbol(self) -> &'static str {
        match self {
            Kernel::FillU32 => "fill_u32",
            Kernel::BiasAdd => "bias_add_f32",
            Kernel::BiasAddVec => "bias_add_vec_f32",
            Kernel::BiasGradPartial => "bias_grad_partial_f32",
            Kernel::BiasGradVec => "bias_grad_vec_f32",
            Kernel::BiasGradFinish => "bias_grad_finish_f32",
            Kernel::Relu => "relu_f32",
            Kernel::ReluVec => "relu_vec_f32",
            Kernel::ReluBwd => "relu_bwd_f32",
            Kernel::ReluBwdVec => "relu_bwd_vec_f32",
            Kernel::SoftmaxXent => "softmax_xent_f32",
            Kernel::MeanF64 => "mean_f64_to_f32",
            Kernel::Adam => "adam_f32",
            Kernel::AdamVec => "adam_vec_f32",
            Kernel::HwioToOhwi => "hwio_to_ohwi_f32",
            Kernel::OhwiToHwio => "ohwi_to_hwio_f32",
            Kernel::PadNhwc => "pad_nhwc_f32",
            Kernel::CropNhwc => "crop_nhwc_f32",
        }
    }

    fn module(self) -> KernelModule {
        match self {
            Kernel::FillU32
            | Kernel::BiasAdd
            | Kernel::BiasAddVec
            | Kernel::BiasGradPartial
            | Kernel::BiasGradVec
            | Kernel::BiasGradFinish
            | Kernel::Relu
            | Kernel::ReluVec
            | Kernel::ReluBwd
            | Kernel::ReluBwdVec => KernelModule::Elementwise,
            Kernel::SoftmaxXent | Kernel::MeanF64 => KernelModule::SoftmaxXent,
            Kernel::Adam | Kernel::AdamVec => KernelModule::Adam,
            Kernel::HwioToOhwi | Kernel::OhwiToHwio | Kernel::PadNhwc | Kernel::CropNhwc => {
                KernelModule::Layout
            }
        }
    }
}

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
    /// Loaded modules, indexed like [`KernelModule::ALL`].
    _modules: Vec<Arc<CudaModule>>,
    /// Functions, indexed like `Kernel::ALL`.
    functions: Vec<CudaFunction>,
    /// Upper bound on blocks of a grid-stride launch (32 per multiprocessor).
    max_blocks: u32,
    /// Multiprocessors of the device.
    sms: u32,
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
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(driver("cuDeviceGetAttribute"))?;
        let ptxs: Vec<Result<String, TensorError>> = std::thread::scope(|s| {
            let jobs: Vec<_> = KernelModule::ALL
                .iter()
                .map(|&m| s.spawn(move || compile(m, arch)))
                .collect();
            jobs.into_iter()
                .zip(KernelModule::ALL)
                .map(|(j, m)| {
                    j.join().unwrap_or_else(|_| {
                        Err(TensorError::Compile {
                            kernel: m.file(),
                            log: "nvrtc panicked".into(),
                        })
                    })
                })
                .collect()
        });
        let mut modules = Vec::with_capacity(KernelModule::ALL.len());
        for ptx in ptxs {
            modules.push(
                ctx.load_module(Ptx::from_src(ptx?))
                    .map_err(driver("cuModuleLoadData"))?,
            );
        }
        let functions = Kernel::ALL
            .iter()
            .map(|k| {
                let index = KernelModule::ALL
                    .iter()
                    .position(|&m| m == k.module())
                    .unwrap_or(0);
                modules[index]
                    .load_function(k.symbol())
                    .map_err(driver(k.symbol()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Kernels {
            stream,
            _modules: modules,
            functions,
            max_blocks: (sms.max(1) as u32) * 32,
            sms: sms.max(1) as u32,
        })
    }

    fn function(&self, k: Kernel) -> &CudaFunction {
        &self.functions[k as usize]
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

    /// `p[i] = value` for `n` 32-bit words at `p`.
    pub(crate) fn fill_u32(&self, p: u64, value: u32, n: usize) -> Result<(), TensorError> {
        if n == 0 {
            return Ok(());
        }
        let k = Kernel::FillU32;
        // SAFETY: `fill_u32(u32 *p, u32 value, size_t n)`; p holds n words.
        unsafe {
            self.stream
                .launch_builder(self.function(k))
                .arg(&p)
                .arg(&value)
                .arg(&n)
                .launch(self.grid(n))
        }
        .map(drop)
        .map_err(driver(k.symbol()))
    }

    /// `y[i] += b[i % c]` over `n` floats at `y`, `c` floats at `b` (16 bytes per thread when
    /// `c % 4 == 0` and both are 16-byte aligned).
    pub(crate) fn bias_add(&self, y: u64, b: u64, n: usize, c: usize) -> Result<(), TensorError> {
        if n == 0 {
            return Ok(());
        }
        if c % 4 == 0 && n % 4 == 0 && aligned16(&[y, b]) {
            let (n4, c4) = (n / 4, c / 4);
            let k = Kernel::BiasAddVec;
            // SAFETY: `bias_add_vec_f32(float *y, const float *b, size_t n4, size_t c4)`; y holds
            // 4 n4 floats and b 4 c4 >= 4, both 16-byte aligned.
            return unsafe {
                self.stream
                    .launch_builder(self.function(k))
                    .arg(&y)
                    .arg(&b)
                    .arg(&n4)
                    .arg(&c4)
                    .launch(self.grid(n4))
            }
            .map(drop)
            .map_err(driver(k.symbol()));
        }
        let k = Kernel::BiasAdd;
        // SAFETY: `bias_add_f32(float *y, const float *b, size_t n, size_t c)`; y holds n
        // floats, b holds c >= 1 floats.
        unsafe {
            self.stream
                .launch_builder(self.function(k))
                .arg(&y)
                .arg(&b)
                .arg(&n)
                .arg(&c)
                .launch(self.grid(n))
        }
        .map(drop)
        .map_err(driver(k.symbol()))
    }

    /// How many row splits `bias_grad` uses for `rows` rows: the size, in `c` doubles each, of
    /// the partial-sum workspace it needs. At most 4 blocks of 256 threads per multiprocessor,
    /// so the vectorized kernel runs as one wave.
    pub(crate) fn bias_grad_splits(&self, rows: usize) -> usize {
        rows.div_ceil(256).clamp(1, 4 * self.sms as usize)
    }

    /// Whether `bias_grad` of `c` columns at `dy` takes the vectorized path, the one that can
    /// fuse the ReLU backward (`mask`): `c` a multiple of 4 dividing 1024, `dy` 16-byte aligned.
    pub(crate) fn bias_grad_vectorizes(&self, c: usize, dy: u64) -> bool {
        c % 4 == 0 && c > 0 && 1024 % c == 0 && aligned16(&[dy])
    }

    /// `db[j] = sum_r dy[r, j]` for dy `[rows, c]`, through `partial`, a workspace of
    /// `bias_grad_splits(rows) * c` doubles. With `mask != 0` (only where
    /// [`Self::bias_grad_vectorizes`]), `dy` is first masked in place as [`Self::relu_bwd`]
    /// does, in the same pass.
    pub(crate) fn bias_grad(
        &self,
        dy: u64,
        mask: u64,
        partial: u64,
        db: u64,
        rows: usize,
        c: usize,
    ) -> Result<(), TensorError> {
        if c == 0 {
            return Ok(());
        }
        let splits = self.bias_grad_splits(rows);
        if self.bias_grad_vectorizes(c, dy) {
            let n4 = rows * c / 4;
            let k = Kernel::BiasGradVec;
            let cfg = LaunchConfig {
                grid_dim: (splits as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: `bias_grad_vec_f32(float *dy, const u32 *mask, double *partial, size_t n4,
            // size_t c)`; dy holds 4 n4 = rows*c floats (16-byte aligned), mask is null or
            // holds ceil(rows*c / 32) words, partial splits*c doubles; blocks of 256 threads and
            // c divides 1024 (bias_grad_vectorizes), as the kernel needs.
            unsafe {
                self.stream
                    .launch_builder(self.function(k))
                    .arg(&dy)
                    .arg(&mask)
                    .arg(&partial)
                    .arg(&n4)
                    .arg(&c)
                    .launch(cfg)
            }
            .map_err(driver(k.symbol()))?;
        } else {
            if mask != 0 {
                self.relu_bwd(dy, mask, rows * c)?;
            }
            let rows_per_split = rows.div_ceil(splits).max(1);
            let k = Kernel::BiasGradPartial;
            let cfg = LaunchConfig {
                grid_dim: (c.div_ceil(32) as u32, splits as u32, 1),
                block_dim: (32, 8, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: `bias_grad_partial_f32(const float *dy, double *partial, size_t rows,
            // size_t c, size_t rows_per_split)`; dy holds rows*c floats, partial splits*c
            // doubles, and the grid has exactly `splits` rows of blocks of 32x8 threads.
            unsafe {
                self.stream
                    .launch_builder(self.function(k))
                    .arg(&dy)
                    .arg(&partial)
                    .arg(&rows)
                    .arg(&c)
                    .arg(&rows_per_split)
                    .launch(cfg)
            }
            .map_err(driver(k.symbol()))?;
        }
        let k = Kernel::BiasGradFinish;
        // SAFETY: `bias_grad_finish_f32(const double *partial, float *db, size_t splits,
        // size_t c)`; partial holds splits*c doubles, db holds c floats.
        unsafe {
            self.stream
                .launch_builder(self.function(k))
                .arg(&partial)
                .arg(&db)
                .arg(&splits)
                .arg(&c)
                .launch(self.grid(c))
        }
        .map(drop)
        .map_err(driver(k.symbol()))
    }

    /// In-place ReLU on `n` floats at `x`; `mask` (0 for none) receives `ceil(n/32)` words.
    /// With `apply == false` `x` is only read: the mask of an `x` that is already ReLU'd.
    pub(crate) fn relu(&self, x: u64, mask: u64, n: usize, apply: bool) -> Result<(), TensorError> {
        if n == 0 {
            return Ok(());
        }
        let apply = i32::from(apply);
        // Whole chunks of 128 floats (32 lanes x 16 bytes, 4 mask words) vectorized.
        let chunks = if aligned16(&[x]) { n / 128 } else { 0 };
        if chunks > 0 {
            let k = Kernel::ReluVec;
            // SAFETY: `relu_vec_f32(float *x, u32 *mask, size_t chunks, int apply)`; x holds
            // at least 128 chunks floats, 16-byte aligned; mask is null or holds at least
            // 4 chunks words; blocks are whole warps (256 threads), as the shuffles need.
            unsafe {
                self.stream
                    .launch_builder(self.function(k))
                    .arg(&x)
                    .arg(&mask)
                    .arg(&chunks)
                    .arg(&apply)
                    .launch(self.grid(chunks * 32))
            }
            .map_err(driver(k.symbol()))?;
        }
        let done = chunks * 128;
        if done == n {
            return Ok(());
        }
        let (xt, nt) = (x + 4 * done as u64, n - done);
        let mt = if mask == 0 {
            0
        } else {
            mask + 4 * (done / 32) as u64
        };
        let k = Kernel::Relu;
        // SAFETY: `relu_f32(float *x, u32 *mask, size_t n, int apply)`; the tail of x from
        // element `done` (a multiple of 32) holds nt floats, the mask from word done/32 holds
        // ceil(nt/32) words or is null. Blocks are whole warps (256 threads), as the ballot needs.
        unsafe {
            self.stream
                .launch_builder(self.function(k))
                .arg(&xt)
                .arg(&mt)
                .arg(&nt)
                .arg(&apply)
                .launch(self.grid(nt))
        }
        .map(drop)
        .map_err(driver(k.symbol()))
    }

    /// `dy[i] = 0` where mask bit `i` is clear, for `n` floats at `dy`.
    pub(crate) fn relu_bwd(&self, dy: u64, mask: u64, n: usize) -> Result<(), TensorError> {
        if n == 0 {
            return Ok(());
        }
        // Whole groups of 32 floats (8 float4s, one mask word) vectorized.
        let n4 = if aligned16(&[dy]) { n / 32 * 8 } else { 0 };
        if n4 > 0 {
            let k = Kernel::ReluBwdVec;
            // SAFETY: `relu_bwd_vec_f32(float *dy, const u32 *mask, size_t n4)`; dy holds at
            // least 4 n4 floats, 16-byte aligned; mask at least n4/8 words.
            unsafe {
                self.stream
                    .launch_builder(self.function(k))
                    .arg(&dy)
                    .arg(&mask)
                    .arg(&n4)
                    .launch(self.grid(n4))
            }
            .map_err(driver(k.symbol()))?;
        }
        let done = n4 * 4;
        if done == n {
            return Ok(());
        }
        let (dt, mt, nt) = (
            dy + 4 * done as u64,
            mask + 4 * (done / 32) as u64,
            n - done,
        );
        let k = Kernel::ReluBwd;
        // SAFETY: `relu_bwd_f32(float *dy, const u32 *mask, size_t n)`; from element `done` (a
        // multiple of 32) dy holds nt floats and the mask, from word done/32, ceil(nt/32) words.
        unsafe {
            self.stream
                .launch_builder(self.function(k))
                .arg(&dt)
                .arg(&mt)
                .arg(&nt)
                .launch(self.grid(nt))
        }
        .map(drop)
        .map_err(driver(k.symbol()))
    }

    /// Softmax cross-entropy of `[n, k]` logits and labels: writes `dlogits` and the mean loss
    /// (one f32) to `loss`, through `row_loss`, a workspace of `n` doubles.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn softmax_xent(
        &self,
        logits: u64,
        labels: u64,
        dlogits: u64,
        row_loss: u64,
        loss: u64,
        n: usize,
        k: usize,
    ) -> Result<(), TensorError> {
        let kern = Kernel::SoftmaxXent;
        // One warp per row.
        // SAFETY: `softmax_xent_f32(const float *logits, const float *labels, float *dlogits,
        // double *row_loss, size_t n, size_t k)`; the three matrices hold n*k floats,
        // row_loss n doubles; blocks are whole warps.
        unsafe {
            self.stream
                .launch_builder(self.function(kern))
                .arg(&logits)
                .arg(&labels)
                .arg(&dlogits)
                .arg(&row_loss)
                .arg(&n)
                .arg(&k)
                .launch(self.grid(n.saturating_mul(32)))
        }
        .map_err(driver(kern.symbol()))?;
        let kern = Kernel::MeanF64;
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: `mean_f64_to_f32(const double *v, float *out, size_t n)`; v holds n doubles,
        // out one float; one block of 256 threads (8 warps, the size of its shared array).
        unsafe {
            self.stream
                .launch_builder(self.function(kern))
                .arg(&row_loss)
                .arg(&loss)
                .arg(&n)
                .launch(cfg)
        }
        .map(drop)
        .map_err(driver(kern.symbol()))
    }

    /// One Adam step over `n` elements of p, g, m, v.
    pub(crate) fn adam(
        &self,
        p: u64,
        g: u64,
        m: u64,
        v: u64,
        h: &AdamHyper,
        n: usize,
    ) -> Result<(), TensorError> {
        if n == 0 {
            return Ok(());
        }
        let vec = aligned16(&[p, g, m, v]);
        let (k, threads) = if vec {
            (Kernel::AdamVec, (n / 4).max(n % 4))
        } else {
            (Kernel::Adam, n)
        };
        // SAFETY: `adam_f32` / `adam_vec_f32(float *p, const float *g, float *m, float *v,
        // AdamHyper h, size_t n)`; the four arrays hold n floats (16-byte aligned for the vector
        // kernel, whose grid has at least n % 4 threads in block 0 for the tail); AdamHyper's
        // layout matches (see the DeviceRepr impl above).
        unsafe {
            self.stream
                .launch_builder(self.function(k))
                .arg(&p)
                .arg(&g)
                .arg(&m)
                .arg(&v)
                .arg(h)
                .arg(&n)
                .launch(self.grid(threads))
        }
        .map(drop)
        .map_err(driver(k.symbol()))
    }

    /// Filter transpose between HWIO `[kh, kw, ci, co]` and OHWI `[co, kh, kw, ci]`
    /// (`to_ohwi` picks the direction); `hw = kh * kw`.
    pub(crate) fn transpose_filter(
        &self,
        src: u64,
        dst: u64,
        hw: usize,
        ci: usize,
        co: usize,
        to_ohwi: bool,
    ) -> Result<(), TensorError> {
        let n = hw * ci * co;
        if n == 0 {
            return Ok(());
        }
        let k = if to_ohwi {
            Kernel::HwioToOhwi
        } else {
            Kernel::OhwiToHwio
        };
        // SAFETY: `hwio_to_ohwi_f32` / `ohwi_to_hwio_f32(const float *src, float *dst,
        // size_t hw, size_t ci, size_t co)`; src and dst hold hw*ci*co floats, distinct buffers.
        unsafe {
            self.stream
                .launch_builder(self.function(k))
                .arg(&src)
                .arg(&dst)
                .arg(&hw)
                .arg(&ci)
                .arg(&co)
                .launch(self.grid(n))
        }
        .map(drop)
        .map_err(driver(k.symbol()))
    }

    /// Copies between an NHWC image `small` `[nb, h, w, c]` and a larger one `big`
    /// `[nb, big_h, big_w, c]` at offset `(top, left)`: `pad` writes all of `big` (zeros
    /// around), otherwise the window of `big` is cropped into `small`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn pad_or_crop(
        &self,
        pad: bool,
        small: u64,
        big: u64,
        [nb, h, w, c]: [usize; 4],
        [big_h, big_w]: [usize; 2],
        [top, left]: [usize; 2],
    ) -> Result<(), TensorError> {
        let (k, src, dst, [hs, ws], [hd, wd]) = if pad {
            (Kernel::PadNhwc, small, big, [h, w], [big_h, big_w])
        } else {
            (Kernel::CropNhwc, big, small, [big_h, big_w], [h, w])
        };
        let n = nb * hd * wd * c;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: `pad_nhwc_f32` / `crop_nhwc_f32(const float *src, float *dst, size_t nb,
        // size_t hs, size_t ws, size_t c, size_t hd, size_t wd, size_t top, size_t left)`;
        // src holds nb*hs*ws*c floats and dst nb*hd*wd*c; the caller ensures
        // big_h >= top + h and big_w >= left + w.
        unsafe {
            self.stream
                .launch_builder(self.function(k))
                .arg(&src)
                .arg(&dst)
                .arg(&nb)
                .arg(&hs)
                .arg(&ws)
                .arg(&c)
                .arg(&hd)
                .arg(&wd)
                .arg(&top)
                .arg(&left)
                .launch(self.grid(n))
        }
        .map(drop)
        .map_err(driver(k.symbol()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NVRTC needs no GPU: wherever libnvrtc loads, every module must compile for Hopper.
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
            let ptx = compile(m, "sm_90").unwrap_or_else(|e| panic!("{e}"));
            for k in Kernel::ALL.iter().filter(|k| k.module() == m) {
                assert!(
                    ptx.contains(k.symbol()),
                    "{} lacks {}",
                    m.file(),
                    k.symbol()
                );
            }
        }
    }
}
