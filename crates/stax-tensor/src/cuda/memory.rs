//! Raw memory for the allocator: device memory (`cuMemAlloc`/`cuMemFree`, and virtual memory
//! management for the `expandable` strategy: `cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`,
//! `cuMemSetAccess`, `cuMemUnmap`, `cuMemRelease`, `cuMemAddressFree`), a stream-ordered pool
//! (`cuMemAllocAsync`/`cuMemFreeAsync`, whose own figures `cuMemPoolGetAttribute` reads) and
//! pinned host memory (`cuMemHostAlloc`).
//!
//! These are the bottom layer of [`stax_alloc`]: whole segments handed out as raw addresses
//! (`CUdeviceptr`, or a host pointer for pinned memory). No `CudaSlice` owns any of this memory,
//! so nothing frees it behind the allocator's back.

use cudarc::driver::{CudaContext, CudaStream, DriverError, result, sys};
use stax_alloc::{AllocError, HostAccess, PoolUsage, RawMemory, Segment, VirtualMemory};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Alignment of device segments and allocations, in bytes (what cuBLAS and cuDNN want).
pub const DEVICE_ALIGNMENT: usize = 256;
/// Size multiple, in bytes, that the allocator rounds large device segments to (2 MiB, the
/// driver's own page size for `cuMemAlloc`, as PyTorch's caching allocator).
pub const DEVICE_GRANULARITY: usize = 2 << 20;
/// Alignment of pinned host allocations, in bytes (a cache line).
pub const PINNED_ALIGNMENT: usize = 64;

/// Turns a driver error of `op` into an [`AllocError`]: `CUDA_ERROR_OUT_OF_MEMORY` becomes
/// [`AllocError::BackendOutOfMemory`] (so the allocator may release its cache and retry),
/// anything else [`AllocError::Backend`].
fn alloc_error(backend: String, op: &'static str, bytes: usize, e: DriverError) -> AllocError {
    if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        AllocError::BackendOutOfMemory {
            backend,
            op,
            requested: bytes as u64,
        }
    } else {
        AllocError::Backend {
            backend,
            op,
            message: e.to_string(),
        }
    }
}

/// Runs driver call `op` (`f`) of backend `name` with `ctx` current and
/// [`super::exclusive`] held. A failure becomes an [`AllocError`]; for a reservation of
/// `reserving` bytes, out of memory becomes [`AllocError::BackendOutOfMemory`].
fn call<T>(
    ctx: &CudaContext,
    name: impl FnOnce() -> String,
    op: &'static str,
    reserving: Option<usize>,
    f: impl FnOnce() -> Result<T, DriverError>,
) -> Result<T, AllocError> {
    let run = || {
        let _exclusive = super::exclusive();
        ctx.bind_to_thread()?;
        f()
    };
    run().map_err(|e| match reserving {
        Some(bytes) => alloc_error(name(), op, bytes, e),
        None => AllocError::Backend {
            backend: name(),
            op,
            message: e.to_string(),
        },
    })
}

/// `(free, total)` device bytes of `ctx`'s device (`cuMemGetInfo`).
pub(crate) fn mem_info(ctx: &CudaContext) -> Result<(usize, usize), DriverError> {
    ctx.bind_to_thread()?;
    result::mem_get_info()
}

/// Device memory from `cuMemAlloc`, freed with `cuMemFree` after the compute stream drained;
/// on devices with virtual memory management also address ranges and pages
/// ([`RawMemory::virtual_memory`]), unmapped after the compute stream drained.
#[derive(Debug)]
pub struct DeviceMemory {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    total: u64,
    /// Page size of virtual memory (`cuMemGetAllocationGranularity`, minimum), None when the
    /// device has no virtual memory management.
    page: Option<usize>,
    /// The physical allocation behind every mapped page: page address -> handle.
    pages: Mutex<BTreeMap<u64, sys::CUmemGenericAllocationHandle>>,
}

impl DeviceMemory {
    /// Device memory of `stream`'s device; releases wait for `stream` first.
    ///
    /// # Errors
    /// The driver's error when the device size cannot be read.
    pub fn new(stream: Arc<CudaStream>) -> Result<Self, DriverError> {
        let ctx = stream.context().clone();
        let total = ctx.total_mem()? as u64;
        // Without virtual memory management (or when the driver cannot say) the device still
        // serves every strategy but `expandable`.
        let vmm = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED;
        let page = match ctx.attribute(vmm) {
            Ok(0) | Err(_) => None,
            Ok(_) => {
                let mut page = 0usize;
                let prop = allocation_prop(ctx.cu_device());
                let min = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
                // SAFETY: `prop` is a valid pinned-device allocation description and `page` a
                // valid out-pointer.
                let r = unsafe { sys::cuMemGetAllocationGranularity(&mut page, &prop, min) };
                (r.result().is_ok() && page > 0).then(|| page.max(DEVICE_ALIGNMENT))
            }
        };
        Ok(DeviceMemory {
            ctx,
            stream,
            total,
            page,
            pages: Mutex::new(BTreeMap::new()),
        })
    }

    fn pages(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, sys::CUmemGenericAllocationHandle>> {
        self.pages.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Unmaps and releases the given pages (one page each, with the handle mapped there).
    fn drop_pages(
        &self,
        mapped: &[(u64, sys::CUmemGenericAllocationHandle)],
        page: usize,
    ) -> Result<(), DriverError> {
        let mut first = Ok(());
        for &(addr, handle) in mapped {
            // SAFETY: `addr` was mapped with `handle` by `map`, over one page, and is unmapped
            // once; releasing the handle afterwards frees its physical memory.
            let r = unsafe { sys::cuMemUnmap(addr, page).result() }
                .and_then(|()| unsafe { sys::cuMemRelease(handle).result() });
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

/// The allocation properties of pinned device memory on `device`, no shareable handle.
fn allocation_prop(device: sys::CUdevice) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

impl RawMemory for DeviceMemory {
    fn name(&self) -> String {
        format!("cuda:{}", self.ctx.ordinal())
    }

    fn reserve(&self, bytes: usize) -> Result<Segment, AllocError> {
        let name = || self.name();
        // SAFETY: the context is current; the memory is returned uninitialized, which is
        // fine for raw bytes that no Rust reference ever points to.
        let addr = call(&self.ctx, name, "cuMemAlloc", Some(bytes), || unsafe {
            result::malloc_sync(bytes)
        })?;
        Ok(Segment { addr, bytes })
    }

    fn release(&self, segment: Segment) -> Result<(), AllocError> {
        call(
            &self.ctx,
            || self.name(),
            "cuMemFree",
            None,
            || {
                // Work queued on the stream may still read or write the segment.
                self.stream.synchronize()?;
                // SAFETY: `segment` came from `reserve` (cuMemAlloc) and the allocator releases
                // each segment once; no queued work uses it after the synchronization above.
                unsafe { result::free_sync(segment.addr) }
            },
        )
    }

    fn granularity(&self) -> usize {
        DEVICE_GRANULARITY
    }

    fn alignment(&self) -> usize {
        DEVICE_ALIGNMENT
    }

    fn capacity(&self) -> Option<u64> {
        Some(self.total)
    }

    fn free_bytes(&self) -> Option<u64> {
        mem_info(&self.ctx).ok().map(|(free, _)| free as u64)
    }

    fn virtual_memory(&self) -> Option<&dyn VirtualMemory> {
        self.page.map(|_| self as &dyn VirtualMemory)
    }
}

impl VirtualMemory for DeviceMemory {
    fn page_size(&self) -> usize {
        self.page.unwrap_or(DEVICE_GRANULARITY)
    }

    fn reserve_range(&self, bytes: usize) -> Result<Segment, AllocError> {
        let page = self.page_size();
        let addr = call(
            &self.ctx,
            || self.name(),
            "cuMemAddressReserve",
            None,
            || {
                let mut addr: sys::CUdeviceptr = 0;
                // SAFETY: a plain reservation of address space at no fixed address, aligned to
                // the page size; `addr` is a valid out-pointer.
                unsafe { sys::cuMemAddressReserve(&mut addr, bytes, page, 0, 0) }.result()?;
                Ok(addr)
            },
        )?;
        Ok(Segment { addr, bytes })
    }

    fn release_range(&self, range: Segment) -> Result<(), AllocError> {
        // SAFETY: the range came from `reserve_range` and the allocator unmapped every page in
        // it first; it is freed once.
        call(
            &self.ctx,
            || self.name(),
            "cuMemAddressFree",
            None,
            || unsafe { sys::cuMemAddressFree(range.addr, range.bytes).result() },
        )
    }

    fn map(&self, pages: Segment) -> Result<(), AllocError> {
        let page = self.page_size();
        let prop = allocation_prop(self.ctx.cu_device());
        let access = sys::CUmemAccessDesc {
            location: prop.location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        type Mapped = Vec<(u64, sys::CUmemGenericAllocationHandle)>;
        let map_all = |mapped: &mut Mapped| -> Result<(), DriverError> {
            for addr in (pages.addr..pages.end()).step_by(page) {
                let mut handle: sys::CUmemGenericAllocationHandle = 0;
                // SAFETY: `prop` describes pinned memory on this device; one page, a multiple
                // of the granularity; `handle` is a valid out-pointer.
                unsafe { sys::cuMemCreate(&mut handle, page, &prop, 0) }.result()?;
                // SAFETY: `addr` is a page of a range reserved by `reserve_range` with nothing
                // mapped there (the allocator maps each page once); the whole handle is mapped.
                if let Err(e) = unsafe { sys::cuMemMap(addr, page, 0, handle, 0) }.result() {
                    // SAFETY: the handle was just created and is mapped nowhere.
                    let _ = unsafe { sys::cuMemRelease(handle) };
                    return Err(e);
                }
                mapped.push((addr, handle));
            }
            // SAFETY: every page of `pages` is mapped now; read-write for this device only.
            unsafe { sys::cuMemSetAccess(pages.addr, pages.bytes, &access, 1) }.result()
        };
        let mut mapped = Mapped::new();
        let run = || {
            map_all(&mut mapped).inspect_err(|_| {
                // All or nothing: undo the pages mapped before the failure.
                let _ = self.drop_pages(&mapped, page);
            })
        };
        call(
            &self.ctx,
            || self.name(),
            "cuMemMap",
            Some(pages.bytes),
            run,
        )?;
        self.pages().extend(mapped);
        Ok(())
    }

    fn unmap(&self, pages: Segment) -> Result<(), AllocError> {
        let page = self.page_size();
        let handles: Option<Vec<(u64, sys::CUmemGenericAllocationHandle)>> = {
            let mut book = self.pages();
            let addrs: Vec<u64> = (pages.addr..pages.end()).step_by(page).collect();
            if addrs.iter().all(|a| book.contains_key(a)) {
                Some(
                    addrs
                        .into_iter()
                        .filter_map(|a| book.remove(&a).map(|h| (a, h)))
                        .collect(),
                )
            } else {
                None
            }
        };
        let Some(handles) = handles else {
            return Err(AllocError::Backend {
                backend: self.name(),
                op: "cuMemUnmap",
                message: format!("{pages:?} is not mapped in full"),
            });
        };
        call(
            &self.ctx,
            || self.name(),
            "cuMemUnmap",
            None,
            || {
                // Work queued on the stream may still read or write the pages.
                self.stream.synchronize()?;
                self.drop_pages(&handles, page)
            },
        )
    }
}

/// A stream-ordered pool: `cuMemAllocAsync`/`cuMemFreeAsync` on the device's default memory
/// pool, ordered on the compute stream. Its release threshold is set explicitly by the `async`
/// strategy ([`RawMemory::set_release_threshold`]).
#[derive(Debug)]
pub struct AsyncPoolMemory {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    pool: PoolHandle,
    total: u64,
}

/// The device's default `CUmemoryPool` (owned by the driver, never destroyed by us).
#[derive(Debug, Clone, Copy)]
struct PoolHandle(sys::CUmemoryPool);

// SAFETY: a CUmemoryPool handle is a driver object usable from any thread of the process.
unsafe impl Send for PoolHandle {}
// SAFETY: as above; the driver synchronizes access to the pool internally.
unsafe impl Sync for PoolHandle {}

impl AsyncPoolMemory {
    /// The default pool of `stream`'s device, with allocations ordered on `stream`.
    ///
    /// # Errors
    /// The driver's error when the device has no memory pools or the pool cannot be read.
    pub fn new(stream: Arc<CudaStream>) -> Result<Self, DriverError> {
        let ctx = stream.context().clone();
        ctx.bind_to_thread()?;
        if !ctx.has_async_alloc() {
            return Err(DriverError(sys::CUresult::CUDA_ERROR_NOT_SUPPORTED));
        }
        // SAFETY: `cu_device` is the valid device of a live context.
        let pool = unsafe { result::device::get_default_mem_pool(ctx.cu_device()) }?;
        let total = ctx.total_mem()? as u64;
        Ok(AsyncPoolMemory {
            ctx,
            stream,
            pool: PoolHandle(pool),
            total,
        })
    }
}

impl RawMemory for AsyncPoolMemory {
    fn name(&self) -> String {
        format!("cuda:{} (async pool)", self.ctx.ordinal())
    }

    fn reserve(&self, bytes: usize) -> Result<Segment, AllocError> {
        let name = || self.name();
        // SAFETY: the stream is live; the memory is used only by work on this stream (one
        // compute stream per backend), uninitialized raw bytes.
        let addr = call(&self.ctx, name, "cuMemAllocAsync", Some(bytes), || unsafe {
            result::malloc_async(self.stream.cu_stream(), bytes)
        })?;
        Ok(Segment { addr, bytes })
    }

    fn release(&self, segment: Segment) -> Result<(), AllocError> {
        // SAFETY: `segment` came from cuMemAllocAsync on this stream and is released once; the
        // free is ordered after all work queued on the stream so far.
        call(
            &self.ctx,
            || self.name(),
            "cuMemFreeAsync",
            None,
            || unsafe { result::free_async(segment.addr, self.stream.cu_stream()) },
        )
    }

    fn granularity(&self) -> usize {
        DEVICE_GRANULARITY
    }

    fn alignment(&self) -> usize {
        DEVICE_ALIGNMENT
    }

    fn capacity(&self) -> Option<u64> {
        Some(self.total)
    }

    fn free_bytes(&self) -> Option<u64> {
        mem_info(&self.ctx).ok().map(|(free, _)| free as u64)
    }

    fn stream_ordered(&self) -> bool {
        true
    }

    fn set_release_threshold(&self, bytes: u64) -> Result<(), AllocError> {
        let mut value: u64 = bytes;
        let op = "cuMemPoolSetAttribute(RELEASE_THRESHOLD)";
        // SAFETY: the pool is the device's default pool; RELEASE_THRESHOLD takes a
        // cuuint64_t, which `value` is.
        call(
            &self.ctx,
            || self.name(),
            op,
            None,
            || unsafe {
                result::mem_pool::set_attribute(
                    self.pool.0,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    (&mut value as *mut u64).cast(),
                )
            },
        )
    }

    fn pool_usage(&self) -> Result<Option<PoolUsage>, AllocError> {
        let read = |attr: sys::CUmemPool_attribute, op: &'static str| {
            let mut value: u64 = 0;
            // SAFETY: the pool is the device's default pool; RESERVED_MEM_CURRENT and
            // USED_MEM_CURRENT are cuuint64_t, which `value` is.
            call(
                &self.ctx,
                || self.name(),
                op,
                None,
                || unsafe {
                    result::mem_pool::get_attribute(
                        self.pool.0,
                        attr,
                        (&mut value as *mut u64).cast(),
                    )
                },
            )
            .map(|()| value)
        };
        use sys::CUmemPool_attribute::{
            CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
        };
        Ok(Some(PoolUsage {
            reserved: read(
                CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                "cuMemPoolGetAttribute(RESERVED_MEM_CURRENT)",
            )?,
            used: read(
                CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
                "cuMemPoolGetAttribute(USED_MEM_CURRENT)",
            )?,
        }))
    }

    fn trim(&self) -> Result<(), AllocError> {
        call(
            &self.ctx,
            || self.name(),
            "cuMemPoolTrimTo",
            None,
            || {
                self.stream.synchronize()?;
                // SAFETY: the pool is the device's default pool, valid for the context's life.
                unsafe { result::mem_pool::trim_to(self.pool.0, 0) }
            },
        )
    }
}

impl Drop for AsyncPoolMemory {
    /// The default pool is the device's, shared by the process: give back what this backend's
    /// allocations left cached in it and restore the driver's default release threshold (0).
    fn drop(&mut self) {
        let _ = self.set_release_threshold(0);
        let _ = self.trim();
    }
}

/// Page-locked host memory from `cuMemHostAlloc` (portable), for fast host-device copies.
#[derive(Debug)]
pub struct PinnedMemory {
    ctx: Arc<CudaContext>,
}

impl PinnedMemory {
    /// Pinned host memory registered with `ctx`.
    pub fn new(ctx: Arc<CudaContext>) -> Self {
        PinnedMemory { ctx }
    }
}

impl RawMemory for PinnedMemory {
    fn name(&self) -> String {
        format!("pinned host (cuda:{})", self.ctx.ordinal())
    }

    fn host_access(&self) -> Option<HostAccess> {
        // SAFETY: segments are host memory from cuMemHostAlloc, zeroed in `reserve`, ours until
        // `release`. The device only writes them in `Staging::download`, into the staging
        // chunks, which are never handed out as allocations of their own.
        Some(unsafe { HostAccess::new() })
    }

    fn reserve(&self, bytes: usize) -> Result<Segment, AllocError> {
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: plain page-locked allocation; the bytes are only touched through the
        // address the allocator hands out, within `bytes`.
        let p = call(
            &self.ctx,
            || self.name(),
            "cuMemHostAlloc",
            Some(bytes),
            || unsafe { result::malloc_host(bytes, flags) },
        )?;
        // SAFETY: `p` points to `bytes` fresh host bytes; zeroing them makes every byte a
        // host slice may show initialized (see `host_access`).
        unsafe { std::ptr::write_bytes(p as *mut u8, 0, bytes) };
        Ok(Segment {
            addr: p as u64,
            bytes,
        })
    }

    fn release(&self, segment: Segment) -> Result<(), AllocError> {
        // SAFETY: the address came from cuMemHostAlloc in `reserve` and is freed once; copies
        // that use it are synchronized before their staging buffer is returned.
        call(
            &self.ctx,
            || self.name(),
            "cuMemFreeHost",
            None,
            || unsafe { result::free_host(segment.addr as *mut std::ffi::c_void) },
        )
    }

    fn granularity(&self) -> usize {
        DEVICE_GRANULARITY
    }

    fn alignment(&self) -> usize {
        PINNED_ALIGNMENT
    }

    fn capacity(&self) -> Option<u64> {
        None
    }

    fn free_bytes(&self) -> Option<u64> {
        None
    }
}
