//! NCCL for the CUDA backend: one communicator per process (per rank), its collectives in
//! place on a stream of their own.
//!
//! Each group first makes the communication stream wait for the work queued on the compute
//! stream so far (the bucket's gradients exist), then runs there while the compute stream goes
//! on (the backward pass of earlier layers: the overlap DDP gets); [`Collective::wait`] makes
//! the compute stream wait for the communication stream (what follows, the update, reads the
//! reduced gradients) and waits on the host until the collectives are done. The tensors a
//! collective reads must stay alive until then (the step's sink holds them, and waits before
//! letting go of them on every path, failures included): the allocator is not stream-aware.
//!
//! The library is loaded at run time, as cudarc loads the others, but by this module:
//! cudarc's NCCL loader looks for `libnccl.so` and `libnccl.so.<CUDA major>`, while NCCL 2
//! (the pip package `nvidia-nccl-cu13`, what PyTorch uses) installs `libnccl.so.2`. So
//! `load` opens `libnccl.so.2` (then `libnccl.so`) from the loader path
//! (`LD_LIBRARY_PATH`) and resolves the dozen entry points used here; without it, NCCL is
//! [`TensorError::CudaUnavailable`] and nothing else changes (the backend never needs it).
//!
//! Deadlines: `ncclCommInitRank` blocks until every rank joined, so it runs on a helper thread
//! waited for at most the timeout (a rank that never comes leaves that thread blocked, and
//! the error names the timeout); [`Collective::wait`] polls the communication stream and
//! `ncclCommGetAsyncError` and aborts the communicator at the deadline, so a dead peer is an
//! error on every live rank.

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaStream, sys};

use crate::collective::{Collective, CommMemory, check_tensors, failed};
use crate::{Backend, BackendId, Category, Tensor, TensorError};

const NCCL_UINT8: c_int = 1;
const NCCL_FLOAT32: c_int = 7;
const NCCL_AVG: c_int = 4;
const NCCL_SUCCESS: c_int = 0;
const NCCL_IN_PROGRESS: c_int = 7;

/// `ncclUniqueId`: what rank 0 makes and every rank needs to join (128 opaque bytes,
/// exchanged through the rendezvous).
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct NcclId(pub [u8; 128]);

impl std::fmt::Debug for NcclId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NcclId(..)")
    }
}

type Comm = *mut c_void;
type Stream = *mut c_void;
type Xfer =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> c_int;

/// The entry points of `libnccl.so.2` used here.
struct Api {
    get_unique_id: unsafe extern "C" fn(*mut NcclId) -> c_int,
    comm_init_rank: unsafe extern "C" fn(*mut Comm, c_int, NcclId, c_int) -> c_int,
    all_reduce: Xfer,
    /// `ncclBroadcast(send, recv, count, type, root, comm, stream)`: the same signature.
    broadcast: Xfer,
    group_start: unsafe extern "C" fn() -> c_int,
    group_end: unsafe extern "C" fn() -> c_int,
    comm_abort: unsafe extern "C" fn(Comm) -> c_int,
    comm_get_async_error: unsafe extern "C" fn(Comm, *mut c_int) -> c_int,
    get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    get_version: unsafe extern "C" fn(*mut c_int) -> c_int,
    _lib: libloading::Library,
}

/// The library's names, tried in order on the loader path.
const NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

/// Loads NCCL once per process (see the module docs).
///
/// # Errors
/// [`TensorError::CudaUnavailable`] when no `libnccl.so.2` is on the loader path or it lacks
/// an entry point.
fn load() -> Result<&'static Api, TensorError> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    let api = API.get_or_init(|| {
        let mut why = Vec::new();
        for name in NAMES {
            // SAFETY: loading NCCL runs its initializers, which have no preconditions.
            match unsafe { libloading::Library::new(name) } {
                Ok(lib) => return resolve(lib),
                Err(e) => why.push(e.to_string()),
            }
        }
        Err(why.join("; "))
    });
    api.as_ref().map_err(|why| TensorError::CudaUnavailable {
        library: "libnccl.so.2 (NCCL 2)",
        hint: format!(
            "put NCCL's directory on LD_LIBRARY_PATH (pip's nvidia-nccl-cu13: \
             site-packages/nvidia/nccl/lib): {why}"
        ),
    })
}

fn resolve(lib: libloading::Library) -> Result<Api, String> {
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the symbol is NCCL 2's function of that name, whose C signature the
            // field's type spells.
            *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                .map_err(|e| format!("{}: {e}", $name))?
        };
    }
    Ok(Api {
        get_unique_id: sym!("ncclGetUniqueId"),
        comm_init_rank: sym!("ncclCommInitRank"),
        all_reduce: sym!("ncclAllReduce"),
        broadcast: sym!("ncclBroadcast"),
        group_start: sym!("ncclGroupStart"),
        group_end: sym!("ncclGroupEnd"),
        comm_abort: sym!("ncclCommAbort"),
        comm_get_async_error: sym!("ncclCommGetAsyncError"),
        get_error_string: sym!("ncclGetErrorString"),
        get_version: sym!("ncclGetVersion"),
        _lib: lib,
    })
}

/// `code` as a [`TensorError::Nccl`] of `op`, or Ok.
fn check(api: &Api, op: &'static str, code: c_int) -> Result<(), TensorError> {
    if code == NCCL_SUCCESS {
        return Ok(());
    }
    // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
    let text = unsafe { std::ffi::CStr::from_ptr((api.get_error_string)(code)) };
    Err(TensorError::Nccl {
        op,
        code,
        message: text.to_string_lossy().into_owned(),
    })
}

impl NcclId {
    /// A fresh id (`ncclGetUniqueId`), made by rank 0 once per communicator.
    ///
    /// # Errors
    /// [`TensorError::CudaUnavailable`] without NCCL; [`TensorError::Nccl`].
    pub fn new() -> Result<NcclId, TensorError> {
        let api = load()?;
        let mut id = NcclId([0; 128]);
        // SAFETY: `id` is a writable ncclUniqueId.
        check(api, "ncclGetUniqueId", unsafe {
            (api.get_unique_id)(&mut id)
        })?;
        Ok(id)
    }
}

/// NCCL's version, `major * 10000 + minor * 100 + patch` (2.27.7 is 22707).
///
/// # Errors
/// [`TensorError::CudaUnavailable`] without NCCL.
pub fn version() -> Result<i32, TensorError> {
    let api = load()?;
    let mut v = 0;
    // SAFETY: `v` is a writable int.
    check(api, "ncclGetVersion", unsafe { (api.get_version)(&mut v) })?;
    Ok(v)
}

/// The communicator handle; NCCL allows its use from any thread, one call at a time (the
/// collective's lock).
struct Handle(Comm);
// SAFETY: a communicator is not tied to a thread; every use is under `NcclCollective::comm`.
unsafe impl Send for Handle {}

/// A rank of an NCCL communicator on a CUDA backend (see the module docs).
pub struct NcclCollective {
    api: &'static Api,
    backend: Arc<dyn Backend>,
    rank: usize,
    world: usize,
    comm: Mutex<Handle>,
    /// The stream the collectives run on.
    stream: Arc<CudaStream>,
    timeout: Duration,
    broken: AtomicBool,
    /// The driver's free memory that set-up took (`None`: could not be told apart).
    device_bytes: Option<u64>,
}

impl std::fmt::Debug for NcclCollective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclCollective")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("device_bytes", &self.device_bytes)
            .finish_non_exhaustive()
    }
}

impl NcclCollective {
    /// Joins rank `rank` of `world` to the communicator of `id` on `backend` (a CUDA
    /// backend), waiting at most `timeout` for the others; then runs one all-reduce of a
    /// single float, so that NCCL's connection buffers exist, and measures what both took
    /// from the driver's free memory (net of what the allocator reserved meanwhile):
    /// [`Collective::outside_bytes`].
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] for a backend not CUDA or a rank outside the world;
    /// [`TensorError::CudaUnavailable`] without NCCL; [`TensorError::Collective`] when the
    /// ranks do not all join in time; [`TensorError::Nccl`].
    pub fn new(
        backend: &Arc<dyn Backend>,
        rank: usize,
        world: usize,
        id: NcclId,
        timeout: Duration,
    ) -> Result<NcclCollective, TensorError> {
        let Some(cuda) = backend.as_cuda() else {
            return Err(TensorError::InvalidArgument {
                op: "NcclCollective::new",
                reason: format!("NCCL communicates CUDA tensors, not {}'s", backend.device()),
            });
        };
        if rank >= world {
            return Err(TensorError::InvalidArgument {
                op: "NcclCollective::new",
                reason: format!("rank {rank} of a world of {world}"),
            });
        }
        let api = load()?;
        let driver = |op| move |source| TensorError::Driver { op, source };
        let free = || {
            backend
                .driver_memory()
                .map(|m| m.map_or(0, |(free, _)| free))
        };
        let reserved = || backend.allocator().stats().reserved;
        backend.synchronize()?;
        let (free0, reserved0) = (free()?, reserved());
        let ctx = cuda.ctx.clone();
        let stream = cuda.stream.fork().map_err(driver("cuStreamCreate"))?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let joined = ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"));
            let joined = joined.and_then(|()| {
                let mut comm: Comm = std::ptr::null_mut();
                // SAFETY: `comm` is writable; rank and world were checked.
                let code =
                    unsafe { (api.comm_init_rank)(&mut comm, world as c_int, id, rank as c_int) };
                check(api, "ncclCommInitRank", code).map(|()| Handle(comm))
            });
            // the receiver may have given up (timeout)
            let _ = tx.send(joined);
        });
        let comm = rx.recv_timeout(timeout).map_err(|_| {
            failed(
                "connect",
                rank,
                format!("not every one of the {world} ranks joined NCCL within {timeout:?}"),
            )
        })??;
        let mut nccl = NcclCollective {
            api,
            backend: backend.clone(),
            rank,
            world,
            comm: Mutex::new(comm),
            stream,
            timeout,
            broken: AtomicBool::new(false),
            device_bytes: None,
        };
        let mut one = Tensor::zeros(backend, [1], Category::Other)?;
        nccl.all_reduce_mean(&mut [&mut one])?;
        nccl.wait()?;
        drop(one);
        backend.synchronize()?;
        let taken = free0.saturating_sub(free()?);
        nccl.device_bytes = Some(taken.saturating_sub(reserved().saturating_sub(reserved0)));
        Ok(nccl)
    }

    /// Queues `each` for every tensor inside one NCCL group on the communication stream, after
    /// the compute stream's work so far; on failure the communicator is aborted.
    fn group(
        &self,
        op: &'static str,
        tensors: &mut [&mut Tensor],
        each: impl Fn(&Api, u64, usize, Comm, Stream) -> c_int,
    ) -> Result<(), TensorError> {
        if self.broken.load(Ordering::SeqCst) {
            return Err(failed(op, self.rank, "the communicator failed earlier"));
        }
        let Some(cuda) = self.backend.as_cuda() else {
            return Err(failed(op, self.rank, "the backend is no longer CUDA"));
        };
        cuda.ctx
            .bind_to_thread()
            .map_err(|source| TensorError::Driver {
                op: "cuCtxSetCurrent",
                source,
            })?;
        let ordered = self.stream.join(&cuda.stream);
        ordered.map_err(|source| TensorError::Driver {
            op: "cuStreamWaitEvent",
            source,
        })?;
        let stream = self.stream.cu_stream() as Stream;
        let comm = self.comm.lock().unwrap_or_else(|p| p.into_inner());
        let api = self.api;
        // SAFETY: no arguments.
        let mut result = check(api, "ncclGroupStart", unsafe { (api.group_start)() });
        for t in tensors.iter() {
            if result.is_err() {
                break;
            }
            result = check(api, op, each(api, t.addr(), t.bytes(), comm.0, stream));
        }
        // SAFETY: closes the group opened above (also after a failed call inside it).
        let end = check(api, "ncclGroupEnd", unsafe { (api.group_end)() });
        let result = result.and(end);
        if result.is_err() {
            self.abort(&comm);
        }
        result
    }

    /// Aborts the communicator (its queued work and peers' waits fail) and marks it broken.
    fn abort(&self, comm: &Handle) {
        if !self.broken.swap(true, Ordering::SeqCst) {
            // SAFETY: the handle is a live communicator, aborted once.
            unsafe { (self.api.comm_abort)(comm.0) };
        }
    }
}

impl Drop for NcclCollective {
    fn drop(&mut self) {
        let comm = self.comm.lock().unwrap_or_else(|p| p.into_inner());
        self.abort(&comm);
    }
}

impl Collective for NcclCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn library(&self) -> &'static str {
        "nccl"
    }

    fn backend(&self) -> BackendId {
        self.backend.id()
    }

    fn all_reduce_mean(&self, tensors: &mut [&mut Tensor]) -> Result<(), TensorError> {
        const OP: &str = "ncclAllReduce";
        check_tensors(OP, &self.backend, tensors, false)?;
        self.group(OP, tensors, |api, addr, bytes, comm, stream| {
            let p = addr as *mut c_void;
            // SAFETY: `p` is the tensor's device buffer of `bytes` bytes (f32, checked), solely
            // owned, on the backend whose stream NCCL runs on; in place is allowed.
            unsafe { (api.all_reduce)(p, p, bytes / 4, NCCL_FLOAT32, NCCL_AVG, comm, stream) }
        })
    }

    fn broadcast(&self, tensors: &mut [&mut Tensor]) -> Result<(), TensorError> {
        const OP: &str = "ncclBroadcast";
        check_tensors(OP, &self.backend, tensors, true)?;
        self.group(OP, tensors, |api, addr, bytes, comm, stream| {
            let p = addr as *mut c_void;
            // SAFETY: as in all_reduce_mean, any dtype sent as bytes from rank 0.
            unsafe { (api.broadcast)(p, p, bytes, NCCL_UINT8, 0, comm, stream) }
        })
    }

    fn barrier(&self) -> Result<(), TensorError> {
        let mut one = Tensor::zeros(&self.backend, [1], Category::Other)?;
        self.all_reduce_mean(&mut [&mut one])?;
        self.wait()
    }

    fn wait(&self) -> Result<(), TensorError> {
        const OP: &str = "wait";
        // an aborted communicator's work is gone (ncclCommAbort ends it), its handle too
        if self.broken.load(Ordering::SeqCst) {
            return Err(failed(OP, self.rank, "the communicator failed earlier"));
        }
        let Some(cuda) = self.backend.as_cuda() else {
            return Err(failed(OP, self.rank, "the backend is no longer CUDA"));
        };
        let deadline = Instant::now() + self.timeout;
        let ordered = cuda.stream.join(&self.stream);
        ordered.map_err(|source| TensorError::Driver {
            op: "cuStreamWaitEvent",
            source,
        })?;
        let stream = self.stream.cu_stream();
        loop {
            // SAFETY: the communication stream, alive with `self`.
            match unsafe { sys::cuStreamQuery(stream) } {
                sys::CUresult::CUDA_SUCCESS => return Ok(()),
                sys::CUresult::CUDA_ERROR_NOT_READY => {}
                other => {
                    return Err(TensorError::Driver {
                        op: "cuStreamQuery",
                        source: cudarc::driver::DriverError(other),
                    });
                }
            }
            let comm = self.comm.lock().unwrap_or_else(|p| p.into_inner());
            let mut status = NCCL_SUCCESS;
            // SAFETY: a live communicator; `status` is writable.
            unsafe { (self.api.comm_get_async_error)(comm.0, &mut status) };
            if status != NCCL_SUCCESS && status != NCCL_IN_PROGRESS {
                self.abort(&comm);
                let e = check(self.api, "ncclCommGetAsyncError", status).err();
                return Err(failed(
                    OP,
                    self.rank,
                    e.map_or_else(String::new, |e| e.to_string()),
                ));
            }
            if Instant::now() >= deadline {
                self.abort(&comm);
                return Err(failed(
                    OP,
                    self.rank,
                    format!(
                        "the collectives did not finish within {:?}: a peer died or is stuck; the communicator was aborted",
                        self.timeout
                    ),
                ));
            }
            drop(comm);
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    fn outside_bytes(&self) -> CommMemory {
        CommMemory {
            device: self.device_bytes,
            host: 0,
        }
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }
}
