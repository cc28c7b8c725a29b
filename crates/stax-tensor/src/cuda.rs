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
//! [`Backend::synchronize`] wait for it. [`Backend::upload_async`] copies on a second stream,
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
pub mod kernels;
pub mod memory;
mod transfer;
mod workspace;

use crate::{
    AdamHyper, Backend, BackendId, BackendOptions, Conv2dGeometry, DType, Device, Precision, Shape,
    Tensor, TensorError, Upload, WorkspaceOp, WorkspaceStep,
};
use cudarc::driver::{CudaContext, CudaStream, DriverError, sys};
use stax_alloc::{Allocation, Allocator, Category, RawMemory, Strategy};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

pub use cudnn::{ConvCandidate, ConvPlanInfo, DEFAULT_WORKSPACE_LIMIT};
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
    /// Whether epilogues are fused (see [`CudaBackend::set_fused_epilogues`]).
    fused: AtomicBool,
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
/// `cudnnFind*AlgorithmEx` may capture CUDA graphs in global mode; while it does, other
/// threads of the process may not create streams or allocate and free device or pinned memory
/// (they fail with `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`: seen on the H200 on 2026-11-30,
/// a backend opened while another thread's search ran). The search, backend set-up and every
/// raw memory reserve and release take this lock; none of them allocates while holding it.
pub(crate) fn exclusive() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn driver(op: &'static str) -> impl FnOnce(DriverError) -> TensorError {
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
            fused: AtomicBool::new(true),
        }))
    }

    /// The algorithm chosen for every convolution pass run so far, with its workspace bytes.
    pub fn conv_plans(&self) -> Vec<ConvPlanInfo> {
        self.dnn.plans()
    }

    /// Turns the fused epilogues on (the default) or off: the conv bias and ReLU in cuDNN's
    /// forward epilogue, the ReLU backward in the bias-gradient pass. Off, each runs as its own
    /// pass over the activation, as in the unfused ops; results agree to rounding and workspace
    /// bytes are the same either way. For A/B timing and tests.
    pub fn set_fused_epilogues(&self, on: bool) {
        self.fused.store(on, Ordering::Relaxed);
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

    /// An f32 operand of `op` on this device with `shape`.
    fn check_input(&self, op: &'static str, t: &Tensor, shape: &Shape) -> Result<(), TensorError> {
        t.expect_device(op, self.device())?;
        t.expect_dtype(op, DType::F32)?;
        t.expect_shape(op, shape)
    }

    /// As [`Self::check_input`], for an output that must not be shared.
    fn check_output(&self, op: &'static str, t: &Tensor, shape: &Shape) -> Result<(), TensorError> {
        self.check_input(op, t, shape)?;
        t.expect_unique(op)
    }

    /// A u32 mask of `ceil(numel / 32)` words on this device (any shape of that size).
    fn check_mask(&self, op: &'static str, mask: &Tensor, numel: usize) -> Result<(), TensorError> {
        mask.expect_device(op, self.device())?;
        mask.expect_dtype(op, DType::U32)?;
        if mask.numel() != numel.div_ceil(32) {
            return Err(TensorError::Shape {
                op,
                reason: format!(
                    "mask needs ceil({numel} / 32) = {} words",
                    numel.div_ceil(32)
                ),
                got: mask.shape().clone(),
            });
        }
        Ok(())
    }

    fn check_bytes(&self, op: &'static str, t: &Tensor, len: usize) -> Result<(), TensorError> {
        t.expect_device(op, self.device())?;
        if len != t.bytes() {
            return Err(TensorError::HostLength {
                op,
                expected: t.bytes(),
                got: len,
                shape: t.shape().clone(),
            });
        }
        Ok(())
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

    fn device(&self) -> Device {
        Device::Cuda(self.ordinal)
    }

    fn allocator(&self) -> &Arc<Allocator> {
        &self.allocator
    }

    fn precision(&self) -> Precision {
        self.precision
    }

    fn upload(&self, src: &[u8], dst: &mut Tensor) -> Result<(), TensorError> {
        self.check_bytes("upload", dst, src.len())?;
        dst.expect_unique("upload")?;
        self.bind()?;
        self.staging.upload(src, dst.addr())
    }

    fn upload_async(&self, src: Allocation, dst: Tensor) -> Result<Upload, TensorError> {
        dst.expect_device("upload_async", self.device())?;
        dst.expect_unique("upload_async")?;
        self.bind()?;
        self.staging.upload_async(src, dst)
    }

    fn download(&self, src: &Tensor, dst: &mut [u8]) -> Result<(), TensorError> {
        self.check_bytes("download", src, dst.len())?;
        self.bind()?;
        self.staging.download(src.addr(), dst)
    }

    fn copy(&self, src: &Tensor, dst: &mut Tensor) -> Result<(), TensorError> {
        const OP: &str = "copy";
        src.expect_device(OP, self.device())?;
        dst.expect_device(OP, self.device())?;
        dst.expect_dtype(OP, src.dtype())?;
        dst.expect_shape(OP, src.shape())?;
        dst.expect_unique(OP)?;
        if src.same_buffer(dst) || src.bytes() == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: both are live device buffers of this context holding `src.bytes()` bytes;
        // distinct allocations never overlap; the copy is ordered on the compute stream.
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

    fn fill(&self, t: &mut Tensor, value: f32) -> Result<(), TensorError> {
        const OP: &str = "fill";
        t.expect_device(OP, self.device())?;
        t.expect_unique(OP)?;
        if t.dtype() == DType::U32 && value != 0.0 {
            return Err(TensorError::InvalidArgument {
                op: OP,
                reason: format!("u32 tensors can only be filled with 0, got {value}"),
            });
        }
        self.bind()?;
        self.kernels.fill_u32(t.addr(), value.to_bits(), t.numel())
    }

    fn conv2d(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        g: &Conv2dGeometry,
        y: &mut Tensor,
    ) -> Result<(), TensorError> {
        self.conv_forward(x, w, b, g, y, None)
    }

    fn conv2d_relu(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        g: &Conv2dGeometry,
        y: &mut Tensor,
        mask: &mut Tensor,
    ) -> Result<(), TensorError> {
        self.conv_forward(x, w, b, g, y, Some(mask))
    }

    fn conv2d_bwd_data(
        &self,
        dy: &Tensor,
        w: &Tensor,
        g: &Conv2dGeometry,
        dx: &mut Tensor,
    ) -> Result<(), TensorError> {
        self.conv_backward_data(dy, w, g, dx)
    }

    fn conv2d_bwd_filter(
        &self,
        x: &Tensor,
        dy: &Tensor,
        g: &Conv2dGeometry,
        dw: &mut Tensor,
        db: &mut Tensor,
    ) -> Result<(), TensorError> {
        self.conv_backward_filter(x, dy, g, dw, db, None)
    }

    fn conv2d_bwd_filter_relu(
        &self,
        x: &Tensor,
        dy: &mut Tensor,
        mask: &Tensor,
        g: &Conv2dGeometry,
        dw: &mut Tensor,
        db: &mut Tensor,
    ) -> Result<(), TensorError> {
        dy.expect_unique("conv2d_bwd_filter_relu")?;
        self.conv_backward_filter(x, dy, g, dw, db, Some(mask))
    }

    fn matmul(
        &self,
        a: &Tensor,
        b: &Tensor,
        transpose_a: bool,
        transpose_b: bool,
        c: &mut Tensor,
    ) -> Result<(), TensorError> {
        const OP: &str = "matmul";
        let dims2 = |t: &Tensor| match *t.dims() {
            [r, c] => Ok((r, c)),
            _ => Err(TensorError::Shape {
                op: OP,
                reason: "expected a 2-D matrix".into(),
                got: t.shape().clone(),
            }),
        };
        let (ar, ac) = dims2(a)?;
        let (br, bc) = dims2(b)?;
        let (m, k) = if transpose_a { (ac, ar) } else { (ar, ac) };
        let (kb, n) = if transpose_b { (bc, br) } else { (br, bc) };
        if k != kb {
            return Err(TensorError::Shape {
                op: OP,
                reason: format!("op(a) is [{m}, {k}] but op(b) is [{kb}, {n}]"),
                got: b.shape().clone(),
            });
        }
        self.check_input(OP, a, a.shape())?;
        self.check_input(OP, b, b.shape())?;
        self.check_output(OP, c, &[m, n].into())?;
        self.bind()?;
        if m == 0 || n == 0 {
            return Ok(());
        }
        if k == 0 {
            return self.kernels.fill_u32(c.addr(), 0, m * n);
        }
        let ws_bytes = self.matmul_bytes(m, n, k);
        let ws = (ws_bytes > 0)
            .then(|| self.allocator.allocate(ws_bytes, Category::Workspace))
            .transpose()?;
        let gemm = cublas::Gemm {
            m,
            n,
            k,
            transpose_a,
            transpose_b,
        };
        let ws_addr = ws.as_ref().map_or(0, |w| w.addr());
        self.blas
            .sgemm(gemm, a.addr(), b.addr(), c.addr(), ws_addr, ws_bytes)
    }

    fn bias_add(&self, y: &mut Tensor, b: &Tensor) -> Result<(), TensorError> {
        const OP: &str = "bias_add";
        self.check_output(OP, y, &y.shape().clone())?;
        self.check_input(OP, b, &[y.shape().last()].into())?;
        self.bind()?;
        self.kernels
            .bias_add(y.addr(), b.addr(), y.numel(), y.shape().last())
    }

    fn bias_grad(&self, dy: &Tensor, db: &mut Tensor) -> Result<(), TensorError> {
        const OP: &str = "bias_grad";
        let c = dy.shape().last();
        self.check_input(OP, dy, dy.shape())?;
        self.check_output(OP, db, &[c].into())?;
        self.bind()?;
        let rows = dy.numel().checked_div(c).unwrap_or(0);
        if c == 0 {
            return Ok(());
        }
        let partial = self
            .allocator
            .allocate(self.bias_grad_bytes(rows, c), Category::Workspace)?;
        self.kernels
            .bias_grad(dy.addr(), 0, partial.addr(), db.addr(), rows, c)
    }

    fn relu(&self, x: &mut Tensor, mask: Option<&mut Tensor>) -> Result<(), TensorError> {
        const OP: &str = "relu";
        self.check_output(OP, x, &x.shape().clone())?;
        let mask_addr = match mask {
            Some(m) => {
                self.check_mask(OP, m, x.numel())?;
                m.expect_unique(OP)?;
                m.addr()
            }
            None => 0,
        };
        self.bind()?;
        self.kernels.relu(x.addr(), mask_addr, x.numel(), true)
    }

    fn relu_bwd(&self, dy: &mut Tensor, mask: &Tensor) -> Result<(), TensorError> {
        const OP: &str = "relu_bwd";
        self.check_output(OP, dy, &dy.shape().clone())?;
        self.check_mask(OP, mask, dy.numel())?;
        self.bind()?;
        self.kernels.relu_bwd(dy.addr(), mask.addr(), dy.numel())
    }

    fn softmax_xent(
        &self,
        logits: &Tensor,
        labels: &Tensor,
        dlogits: &mut Tensor,
    ) -> Result<f32, TensorError> {
        const OP: &str = "softmax_xent";
        let (n, k) = crate::backend::softmax_xent_dims(logits.shape())?;
        self.check_input(OP, logits, logits.shape())?;
        self.check_input(OP, labels, logits.shape())?;
        self.check_output(OP, dlogits, logits.shape())?;
        self.bind()?;
        // n row losses (f64), then the mean (f32) at a 256-byte aligned offset.
        let loss_offset = Self::softmax_loss_offset(n);
        let ws = self
            .allocator
            .allocate(loss_offset + 4, Category::Workspace)?;
        let loss_addr = ws.addr() + loss_offset as u64;
        self.kernels.softmax_xent(
            logits.addr(),
            labels.addr(),
            dlogits.addr(),
            ws.addr(),
            loss_addr,
            n,
            k,
        )?;
        let mut loss = [0u8; 4];
        self.staging.download(loss_addr, &mut loss)?;
        Ok(f32::from_le_bytes(loss))
    }

    fn adam_update(
        &self,
        p: &mut Tensor,
        g: &Tensor,
        m: &mut Tensor,
        v: &mut Tensor,
        h: &AdamHyper,
    ) -> Result<(), TensorError> {
        const OP: &str = "adam_update";
        let shape = p.shape().clone();
        self.check_output(OP, p, &shape)?;
        self.check_input(OP, g, &shape)?;
        self.check_output(OP, m, &shape)?;
        self.check_output(OP, v, &shape)?;
        self.bind()?;
        self.kernels
            .adam(p.addr(), g.addr(), m.addr(), v.addr(), h, p.numel())
    }

    fn synchronize(&self) -> Result<(), TensorError> {
        self.stream
            .synchronize()
            .map_err(driver("cuStreamSynchronize"))
    }

    fn driver_memory(&self) -> Result<Option<(u64, u64)>, TensorError> {
        let (free, total) = memory::mem_info(&self.ctx).map_err(driver("cuMemGetInfo"))?;
        Ok(Some((free as u64, total as u64)))
    }

    fn workspace_schedule(&self, op: &WorkspaceOp) -> Result<Vec<WorkspaceStep>, TensorError> {
        self.op_workspace_schedule(op)
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
