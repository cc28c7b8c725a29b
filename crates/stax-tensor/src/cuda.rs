//! The CUDA backend: one context and compute stream per device, cuBLAS and cuDNN handles,
//! NVRTC-compiled kernels, and an allocator over device memory.
//!
//! Everything is loaded at run time (cudarc's `dynamic-loading`): building needs no CUDA, and
//! on a machine without it [`CudaBackend::new`] returns [`TensorError::CudaUnavailable`] naming
//! the missing library, or [`TensorError::NoSuchDevice`].
//!
//! `new` works in the order that keeps a preallocating allocator from starving the driver
//! (the failure of `seeds/004`): context and stream, cuBLAS and cuDNN handles, every kernel
//! module compiled and loaded (`warm_up`), and only then the [`Allocator`]. Every device
//! buffer comes from that allocator; kernels and libraries get raw `CUdeviceptr`s
//! ([`crate::Tensor::addr`]). Ops are queued on the one compute stream; downloads and
//! [`Backend::synchronize`] wait for it.
//! [`Backend::upload_async`](crate::MemoryOps::upload_async) copies on a second stream,
//! so the next batch's copy overlaps the current step.
//!
//! ```
//! use stax_tensor::{BackendOptions, Device, TensorError};
//! match Device::Cuda(0).open(&BackendOptions::default()) {
//!     Ok(gpu) => assert_eq!(gpu.device(), Device::Cuda(0)),
//!     Err(e) => assert!(matches!(
//!         e,
//!         TensorError::CudaUnavailable { .. } | TensorError::NoSuchDevice { .. }
//!     )),
//! }
//! ```

mod conv;
pub mod cublas;
pub mod cudnn;
mod dense_adam;
mod direct;
mod headroom;
mod im2col;
pub mod kernels;
mod matmul;
pub mod memory;
pub mod nccl;
mod norm;
mod ops;
mod pool;
mod transfer;
mod workspace;

use crate::{
    Backend, BackendId, BackendOptions, Device, OpDesc, Precision, TensorError, WorkspaceStep,
};
use cudarc::driver::{CudaContext, CudaStream, DriverError, sys};
use stax_alloc::{Allocator, RawMemory, Strategy};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

pub use cudnn::{
    ConvApis, ConvCandidate, ConvPlanInfo, DEFAULT_WORKSPACE_LIMIT, Fp32Convs, LOOK_AHEAD_BYTES,
};
pub use direct::DirectConvs;
pub use transfer::STAGING_CHUNK_BYTES;

/// A CUDA device opened for computing (see the module docs).
#[derive(Debug)]
pub struct CudaBackend {
    id: BackendId,
    ordinal: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: cublas::Blas,
    dnn: cudnn::Dnn,
    kernels: kernels::Kernels,
    staging: transfer::Staging,
    allocator: Arc<Allocator>,
    precision: Precision,
    workspace_limit: usize,
    /// The user's explicit workspace limit, which caps allotted headroom too (`usize::MAX`
    /// when none was given; see [`Backend::allot_workspace`]).
    workspace_cap: usize,
    /// cuDNN passes searched within more than `workspace_limit` (`headroom.rs`).
    allowances: headroom::Allowances,
    /// Whether epilogues are fused (see [`CudaBackend::set_fused_epilogues`]).
    fused: AtomicBool,
    /// Which passes run the direct conv kernels ([`DirectConvs::code`]).
    direct: AtomicU8,
    /// Whether small-batch dense updates run in one pass (see
    /// [`CudaBackend::set_dense_adam_rows`]).
    dense_rows: AtomicBool,
    /// Whether full fp32's plain f32 products run our 3xTF32 kernel (see
    /// [`CudaBackend::set_fp32_gemm_3xtf32`]).
    gemm_x3: AtomicBool,
    /// Whether full fp32's dense update by chunks takes its products from our 3xTF32 kernel
    /// (see [`CudaBackend::set_fp32_dense_chunks_3xtf32`]).
    dense_x3: AtomicBool,
    /// The direct conv kernels' calibration times ([`DirectConvs::Winning`]).
    direct_times: direct::DirectTimes,
    /// The passes whose schedules were asked for while they ran the direct kernels (listed
    /// by [`CudaBackend::conv_plans`]).
    direct_used: direct::DirectUsed,
}

/// cudarc's probe of whether a library can be loaded.
type Probe = unsafe fn() -> bool;

/// The libraries the backend loads at run time, with a probe for each.
const LIBRARIES: [(&str, Probe); 4] = [
    (
        "libcuda.so (the NVIDIA driver)",
        cudarc::driver::sys::is_culib_present,
    ),
    (
        "libnvrtc.so (CUDA 13 NVRTC)",
        cudarc::nvrtc::sys::is_culib_present,
    ),
    (
        "libcublas.so (CUDA 13 cuBLAS)",
        cudarc::cublas::sys::is_culib_present,
    ),
    (
        "libcudnn.so (cuDNN 9)",
        cudarc::cudnn::sys::is_culib_present,
    ),
];

/// Fails with [`TensorError::CudaUnavailable`] naming the first library that cannot be loaded
/// (cudarc would panic on first use of a missing one).
fn probe_libraries() -> Result<(), TensorError> {
    for (library, present) in LIBRARIES {
        // SAFETY: the probe only `dlopen`s candidate names and drops the handles.
        if !unsafe { present() } {
            return Err(TensorError::CudaUnavailable {
                library,
                hint: "put the CUDA 13 and cuDNN 9 libraries on the loader path: add their \
                       directories to LD_LIBRARY_PATH (a `cargo xtask gpu-bundle` bundle \
                       carries an env.sh that does it: `source bundle/env.sh`)"
                    .into(),
            });
        }
    }
    Ok(())
}

/// A process-wide lock for the CUDA calls that must not overlap cuDNN's algorithm search.
///
/// It was made for `cudnnFind*AlgorithmEx`, which may capture CUDA graphs in global mode;
/// while it did, other threads of the process could not create streams or allocate and free
/// device or pinned memory (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`: seen on the H200 on
/// 2026-11-30, a backend opened while another thread's search ran). The search now times the
/// candidates itself, with no capture; the lock stays so that a search's timings never share
/// the device with another thread's set-up. The search, backend set-up and every raw memory
/// reserve and release take it; none of them allocates while holding it.
pub(crate) fn exclusive() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn driver(op: &'static str) -> impl FnOnce(DriverError) -> TensorError {
    move |source| TensorError::Driver { op, source }
}

/// Initializes the driver and checks that `ordinal` names a device.
fn check_ordinal(ordinal: usize) -> Result<(), TensorError> {
    match cudarc::driver::result::init() {
        Ok(()) => {}
        Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NO_DEVICE => {
            return Err(TensorError::NoSuchDevice { ordinal, count: 0 });
        }
        Err(source) => {
            return Err(TensorError::Driver {
                op: "cuInit",
                source,
            });
        }
    }
    let count = CudaContext::device_count().map_err(driver("cuDeviceGetCount"))?;
    let count = usize::try_from(count).unwrap_or(0);
    if ordinal >= count {
        return Err(TensorError::NoSuchDevice { ordinal, count });
    }
    Ok(())
}

impl CudaBackend {
    /// Opens device `ordinal`: context, compute stream, cuBLAS and cuDNN handles, every kernel
    /// compiled and loaded, then the allocator of `options.strategy` (`async` uses the
    /// device's stream-ordered pool, the others `cuMemAlloc`), and pinned staging buffers.
    ///
    /// `options.workspace_limit` bounds each cuDNN call's workspace (default
    /// [`DEFAULT_WORKSPACE_LIMIT`]) and cuBLAS's ([`cublas::CUBLAS_WORKSPACE_BYTES`] at most).
    /// A conv pass whose fast algorithms need more at the whole batch may run over batch
    /// chunks whose workspace fits, when that is timed faster (its plan says so:
    /// [`ConvPlanInfo::algorithm`]). A pass may later be allotted more where a step has
    /// headroom below its peak ([`Backend::allot_workspace`]), up to `options.workspace_limit`
    /// when one is given.
    ///
    /// # Errors
    /// [`TensorError::CudaUnavailable`] when a CUDA library cannot be loaded (with a hint);
    /// [`TensorError::NoSuchDevice`] for a bad ordinal or no device; [`TensorError::Compile`]
    /// when NVRTC rejects a kernel; [`TensorError::Driver`], [`TensorError::Cublas`],
    /// [`TensorError::Cudnn`] for failed calls; [`TensorError::Alloc`] for the strategy.
    pub fn new(ordinal: usize, options: &BackendOptions) -> Result<Arc<CudaBackend>, TensorError> {
        probe_libraries()?;
        let exclusive = exclusive();
        check_ordinal(ordinal)?;
        let ctx = CudaContext::new(ordinal).map_err(driver("cuDevicePrimaryCtxRetain"))?;
        let stream = ctx.new_stream().map_err(driver("cuStreamCreate"))?;
        let copy_stream = ctx.new_stream().map_err(driver("cuStreamCreate"))?;
        let blas = cublas::Blas::new(&stream, options.precision)?;
        let dnn = cudnn::Dnn::new(&stream)?;
        let kernels = kernels::Kernels::load(stream.clone())?;
        drop(exclusive); // the allocator's reservations take it again
        let raw: Arc<dyn RawMemory> = match options.strategy {
            Strategy::Async { .. } => Arc::new(
                memory::AsyncPoolMemory::new(stream.clone())
                    .map_err(driver("cuDeviceGetDefaultMemPool"))?,
            ),
            _ => Arc::new(
                memory::DeviceMemory::new(stream.clone()).map_err(driver("cuDeviceTotalMem"))?,
            ),
        };
        let allocator = Allocator::new(raw, options.strategy.clone())?;
        let staging = transfer::Staging::new(stream.clone(), copy_stream)?;
        Ok(Arc::new(CudaBackend {
            id: BackendId::fresh(),
            ordinal,
            ctx,
            stream,
            blas,
            dnn,
            kernels,
            staging,
            allocator,
            precision: options.precision,
            workspace_limit: options.workspace_limit.unwrap_or(DEFAULT_WORKSPACE_LIMIT),
            workspace_cap: options.workspace_limit.unwrap_or(usize::MAX),
            allowances: Default::default(),
            fused: AtomicBool::new(true),
            direct: AtomicU8::new(DirectConvs::Winning.code()),
            dense_rows: AtomicBool::new(true),
            gemm_x3: AtomicBool::new(true),
            dense_x3: AtomicBool::new(false),
            direct_times: Default::default(),
            direct_used: Default::default(),
        }))
    }

    /// The algorithm chosen for every convolution pass run so far, with its workspace bytes
    /// (a pass the direct kernels won at calibration names them; see [`DirectConvs::Winning`]).
    pub fn conv_plans(&self) -> Vec<ConvPlanInfo> {
        self.with_direct(self.dnn.plans())
    }

    /// Turns the fused epilogues on (the default) or off: the conv bias and ReLU in cuDNN's
    /// forward epilogue, the ReLU backward in the bias-gradient pass. Off, each runs as its own
    /// pass over the activation, as in the unfused ops; results agree to rounding and workspace
    /// bytes are the same either way. For A/B timing and tests.
    pub fn set_fused_epilogues(&self, on: bool) {
        self.fused.store(on, Ordering::Relaxed);
    }

    /// Chooses cuDNN algorithms deterministically from now on (off by default): for each
    /// convolution pass the first algorithm in cuDNN's heuristic order
    /// (`cudnnGet*Algorithm_v7`) that cuDNN marks `CUDNN_DETERMINISTIC`, succeeds and fits the
    /// workspace limit, chosen without timing, as PyTorch's `cudnn.deterministic = True` with
    /// `benchmark = False`. Every other op of a step is deterministic already (our kernels
    /// reduce in a fixed order without atomics; cuBLAS gives the same bits on the same GPU
    /// with its workspace on one stream), so training runs, and runs resumed from a
    /// checkpoint in another process, agree to the bit. Set it before the first convolution
    /// runs or is calibrated: choices already made stay ([`CudaBackend::conv_plans`] lists
    /// them, with each candidate's determinism).
    pub fn set_deterministic(&self, on: bool) {
        self.dnn.set_deterministic(on);
    }

    /// Chooses which of cuDNN's APIs the conv algorithm search takes candidates from (default
    /// [`ConvApis::Legacy`]). Set it before the first convolution runs or is calibrated: choices
    /// already made stay. For tests and A/B timing of the graph API's engines against the
    /// legacy algorithms.
    pub fn set_conv_apis(&self, apis: ConvApis) {
        self.dnn.set_apis(apis);
    }

    /// Chooses how full fp32 ([`crate::Precision::Highest`]) f32 convolutions may run from now
    /// on (default [`Fp32Convs::Fastest`]: cuDNN's FMA algorithms or 3xTF32 composites on the
    /// operands' high and low parts, whichever the search times faster: three TF32 tensor-core
    /// passes, or for the forward and backward-data passes one TF32 pass over the parts stacked
    /// along the summed channels; each product then keeps about 21 of f32's 24 bits, against
    /// TF32's 11; the wgmma kernels of a 3x3 conv from 64 to 64 channels do the same for its
    /// three passes, timed beside them; [`Fp32Convs::Fma`] keeps those on cuDNN's FMA
    /// algorithms too). Set it before the first convolution runs or is calibrated: choices already made
    /// stay. [`ConvPlanInfo::algorithm`] names a composite `3xTF32 <algorithm>` or `3xTF32
    /// stacked <algorithm>`.
    pub fn set_fp32_convs(&self, fp32: Fp32Convs) {
        self.dnn.set_fp32(fp32);
    }

    /// Chooses which conv passes run our direct kernels (default [`DirectConvs::Winning`]):
    /// the forward pass and the filter gradient of a convolution with at most 32 taps (a first
    /// layer on RGB images), on the tensor cores or in f32 FMAs, and the wgmma kernels of a 3x3
    /// conv from 64 to 64 channels (see [`CudaBackend::conv_is_direct`]), instead of cuDNN's
    /// algorithms. Their workspace differs from cuDNN's, so set it before a memory
    /// plan is made (before training starts).
    pub fn set_direct_convs(&self, mode: DirectConvs) {
        self.direct.store(mode.code(), Ordering::Relaxed);
    }

    /// Which conv passes run the direct kernels (see [`CudaBackend::set_direct_convs`]).
    pub fn direct_convs(&self) -> DirectConvs {
        DirectConvs::from_code(self.direct.load(Ordering::Relaxed))
    }

    /// Whether the epilogues are fused (see [`CudaBackend::set_fused_epilogues`]).
    pub fn fused_epilogues(&self) -> bool {
        self.fused.load(Ordering::Relaxed)
    }

    /// The bound on one cuDNN call's workspace, in bytes.
    pub fn workspace_limit(&self) -> usize {
        self.workspace_limit
    }

    /// The pinned-host allocator of the staging buffers (two chunks of
    /// [`STAGING_CHUNK_BYTES`], tagged `Input`).
    pub fn pinned_allocator(&self) -> &Arc<Allocator> {
        self.staging.allocator()
    }

    /// The device time of the work `f` queues on the compute stream, in ms, measured with a
    /// pair of CUDA events around it (host-side launch overhead is not counted unless the
    /// stream runs dry waiting for it). Blocks until that work is done.
    ///
    /// # Errors
    /// [`TensorError::Driver`] for event calls; whatever `f` returns.
    pub fn time_ms(
        &self,
        f: &mut dyn FnMut() -> Result<(), TensorError>,
    ) -> Result<f32, TensorError> {
        self.bind()?;
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self
            .stream
            .record_event(flags)
            .map_err(driver("cuEventRecord"))?;
        f()?;
        let end = self
            .stream
            .record_event(flags)
            .map_err(driver("cuEventRecord"))?;
        start.elapsed_ms(&end).map_err(driver("cuEventElapsedTime"))
    }

    /// Makes the context current on the calling thread (raw driver and library calls need it).
    fn bind(&self) -> Result<(), TensorError> {
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))
    }
}

impl Drop for CudaBackend {
    /// Lets queued work finish with the context current, before the handles, modules and
    /// stream are destroyed (possibly on a thread that never used the device).
    fn drop(&mut self) {
        let _ = self.bind();
        let _ = self.stream.synchronize();
    }
}

impl Backend for CudaBackend {
    fn id(&self) -> BackendId {
        self.id
    }

    fn as_cuda(&self) -> Option<&CudaBackend> {
        Some(self)
    }

    fn device(&self) -> Device {
        Device::Cuda(self.ordinal)
    }

    fn allocator(&self) -> &Arc<Allocator> {
        &self.allocator
    }

    fn precision(&self) -> Precision {
        self.precision
    }

    fn synchronize(&self) -> Result<(), TensorError> {
        self.stream
            .synchronize()
            .map_err(driver("cuStreamSynchronize"))
    }

    /// An event recorded on the compute stream, with timing.
    fn mark(&self) -> Result<crate::Mark, TensorError> {
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let event = self
            .stream
            .record_event(flags)
            .map_err(driver("cuEventRecord"))?;
        Ok(crate::Mark::cuda(event))
    }

    fn driver_memory(&self) -> Result<Option<(u64, u64)>, TensorError> {
        let (free, total) = memory::mem_info(&self.ctx).map_err(driver("cuMemGetInfo"))?;
        Ok(Some((free as u64, total as u64)))
    }

    /// Exact for a calibrated convolution pass; for an uncalibrated one, cuDNN's workspace is
    /// the bound the algorithm search would choose within: the largest workspace, at most the
    /// limit, of the candidates cuDNN's heuristics list (a query that allocates nothing).
    fn workspace_schedule(&self, op: &OpDesc) -> Result<Vec<WorkspaceStep>, TensorError> {
        self.op_workspace_schedule(op)
    }

    /// Runs cuDNN's algorithm search for a convolution pass not chosen yet (see
    /// [`Backend::calibrate`]); nothing for any other op.
    fn calibrate(&self, op: &OpDesc) -> Result<(), TensorError> {
        match *op {
            OpDesc::Conv {
                geometry,
                pass,
                dtype,
                ..
            } => self.calibrate_conv((&geometry, dtype, pass), true),
            _ => Ok(()),
        }
    }

    fn is_calibrated(&self, op: &OpDesc) -> bool {
        match op {
            OpDesc::Conv {
                geometry,
                pass,
                dtype,
                ..
            } => self.conv_is_calibrated(geometry, *dtype, *pass),
            _ => true,
        }
    }

    /// Searches cuDNN passes again within their allotted headroom (see `headroom.rs`).
    fn allot_workspace(&self, headroom: &[(OpDesc, usize)]) -> Result<usize, TensorError> {
        self.allot(headroom)
    }

    fn workspace_allotted(&self, op: &OpDesc) -> bool {
        self.allotted(op)
    }

    fn revoke_workspace(&self, ops: &[OpDesc]) -> Result<(), TensorError> {
        self.revoke(ops)
    }

    fn staging_allocator(&self) -> Option<&Arc<Allocator>> {
        Some(self.staging.allocator())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs everywhere: without CUDA the open fails with a typed error, never a panic.
    #[test]
    fn open_fails_cleanly_or_works() {
        match CudaBackend::new(0, &BackendOptions::default()) {
            Ok(gpu) => {
                assert_eq!(gpu.device(), Device::Cuda(0));
                assert!(gpu.driver_memory().unwrap().is_some());
            }
            Err(TensorError::CudaUnavailable { library, hint }) => {
                assert!(!library.is_empty());
                assert!(hint.contains("LD_LIBRARY_PATH"), "{hint}");
            }
            Err(TensorError::NoSuchDevice { ordinal: 0, .. }) => {}
            Err(e) => panic!("unexpected error opening cuda:0: {e}"),
        }
    }

    #[test]
    fn bad_ordinal_is_no_such_device() {
        match CudaBackend::new(1000, &BackendOptions::default()) {
            Err(TensorError::NoSuchDevice { ordinal: 1000, .. })
            | Err(TensorError::CudaUnavailable { .. }) => {}
            other => panic!("expected NoSuchDevice, got {other:?}"),
        }
    }
}
