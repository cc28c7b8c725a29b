//! Host <-> device copies: through a pinned staging buffer on the compute stream, and
//! asynchronous uploads on a second (copy) stream.
//!
//! Copies from pageable memory are staged by the driver anyway, more slowly; we stage
//! ourselves through two pinned chunks so that the host `memcpy` of one chunk overlaps the DMA
//! of the other. The chunks come from a pinned-host [`Allocator`] (tagged `Input`), are held
//! for the backend's life and guarded by one lock. Both directions run on the compute stream,
//! so they are ordered with the kernels around them.
//!
//! [`Staging::upload_async`] copies a host allocation (pinned, from the same allocator, for
//! DMA at full speed) on the copy stream, which first waits for the compute work queued so
//! far: the allocator is not stream-aware, so the destination may be memory that queued work
//! freed. Work queued on the compute stream afterwards (the current step) runs alongside the
//! copy. [`InFlight`] holds the source until the copy's event completes.

use crate::upload::{PendingCopy, Upload, host_source};
use crate::{Tensor, TensorError};
use cudarc::driver::{CudaContext, CudaEvent, CudaStream, DriverError, result};
use stax_alloc::{Allocation, Allocator, Category, Strategy};
use std::sync::{Arc, Mutex};

use super::memory::PinnedMemory;

/// Bytes of one staging chunk (two are held): 8 MiB.
pub const STAGING_CHUNK_BYTES: usize = 8 << 20;

#[derive(Debug)]
struct Slots {
    chunks: [Allocation; 2],
    /// Recorded after the copy that last used each chunk.
    done: [CudaEvent; 2],
}

/// Pinned staging buffers of one backend.
#[derive(Debug)]
pub(crate) struct Staging {
    stream: Arc<CudaStream>,
    copy_stream: Arc<CudaStream>,
    allocator: Arc<Allocator>,
    slots: Mutex<Slots>,
}

fn driver(op: &'static str) -> impl FnOnce(DriverError) -> TensorError {
    move |source| TensorError::Driver { op, source }
}

impl Staging {
    /// Two pinned chunks of [`STAGING_CHUNK_BYTES`] for copies on `stream`, and `copy_stream`
    /// for [`Staging::upload_async`].
    ///
    /// # Errors
    /// [`TensorError::Alloc`] if pinned memory cannot be had; [`TensorError::Driver`].
    pub(crate) fn new(
        stream: Arc<CudaStream>,
        copy_stream: Arc<CudaStream>,
    ) -> Result<Staging, TensorError> {
        let ctx: Arc<CudaContext> = stream.context().clone();
        let allocator =
            Allocator::new(Arc::new(PinnedMemory::new(ctx.clone())), Strategy::Caching)?;
        let chunk = || allocator.allocate(STAGING_CHUNK_BYTES, Category::Input);
        let chunks = [chunk()?, chunk()?];
        let event = || ctx.new_event(None).map_err(driver("cuEventCreate"));
        let done = [event()?, event()?];
        Ok(Staging {
            stream,
            copy_stream,
            allocator,
            slots: Mutex::new(Slots { chunks, done }),
        })
    }

    /// The pinned-host allocator the staging chunks come from (for reports).
    pub(crate) fn allocator(&self) -> &Arc<Allocator> {
        &self.allocator
    }

    /// Queues the copy of `src` to device address `dst` (which holds `src.len()` bytes).
    /// Returns once `src` has been read; the device copy completes in stream order.
    pub(crate) fn upload(&self, src: &[u8], dst: u64) -> Result<(), TensorError> {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        for (i, part) in src.chunks(STAGING_CHUNK_BYTES).enumerate() {
            let s = i % 2;
            slots.done[s]
                .synchronize()
                .map_err(driver("cuEventSynchronize"))?;
            let pinned = slots.chunks[s].addr() as *mut u8;
            // SAFETY: the chunk holds STAGING_CHUNK_BYTES >= part.len() bytes of pinned host
            // memory that no copy uses any more (its last copy's event completed above).
            let staged = unsafe {
                std::ptr::copy_nonoverlapping(part.as_ptr(), pinned, part.len());
                std::slice::from_raw_parts(pinned, part.len())
            };
            let offset = (i * STAGING_CHUNK_BYTES) as u64;
            // SAFETY: dst + offset .. + part.len() lies inside the destination buffer; the
            // pinned source stays untouched until `done[s]` (recorded next) completes.
            unsafe { result::memcpy_htod_async(dst + offset, staged, self.stream.cu_stream()) }
                .map_err(driver("cuMemcpyHtoDAsync"))?;
            slots.done[s]
                .record(&self.stream)
                .map_err(driver("cuEventRecord"))?;
        }
        Ok(())
    }

    /// Starts copying host memory `src` into `dst` on the copy stream, after the compute work
    /// queued so far (see the module docs).
    ///
    /// # Errors
    /// As [`host_source`]; [`TensorError::Driver`] for the stream and copy calls.
    pub(crate) fn upload_async(&self, src: Allocation, dst: Tensor) -> Result<Upload, TensorError> {
        let bytes = host_source("upload_async", &src, &dst)?;
        self.copy_stream
            .join(&self.stream)
            .map_err(driver("cuStreamWaitEvent"))?;
        // SAFETY: `dst` holds `bytes.len()` device bytes and stays alive (in the `Upload`)
        // until the copy's event completes; `src` is kept in `InFlight` until then too.
        unsafe { result::memcpy_htod_async(dst.addr(), bytes, self.copy_stream.cu_stream()) }
            .map_err(driver("cuMemcpyHtoDAsync"))?;
        let done = self
            .copy_stream
            .record_event(None)
            .map_err(driver("cuEventRecord"))?;
        Ok(Upload::pending(dst, Box::new(InFlight { done, _src: src })))
    }

    /// Copies device address `src` (holding `dst.len()` bytes) to `dst`, after all work queued
    /// on the stream; returns when `dst` is filled.
    pub(crate) fn download(&self, src: u64, dst: &mut [u8]) -> Result<(), TensorError> {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let parts: Vec<&mut [u8]> = dst.chunks_mut(STAGING_CHUNK_BYTES).collect();
        let mut pending: Option<(usize, &mut [u8])> = None;
        for (i, part) in parts.into_iter().enumerate() {
            let s = i % 2;
            let pinned = slots.chunks[s].addr() as *mut u8;
            // SAFETY: the chunk holds >= part.len() pinned bytes; the host finished reading
            // it (chunk i-2 was drained before chunk i-1 was queued).
            let staging = unsafe { std::slice::from_raw_parts_mut(pinned, part.len()) };
            let offset = (i * STAGING_CHUNK_BYTES) as u64;
            // SAFETY: src + offset .. + part.len() lies inside the source buffer.
            unsafe { result::memcpy_dtoh_async(staging, src + offset, self.stream.cu_stream()) }
                .map_err(driver("cuMemcpyDtoHAsync"))?;
            slots.done[s]
                .record(&self.stream)
                .map_err(driver("cuEventRecord"))?;
            if let Some((prev, out)) = pending.take() {
                self.drain(&slots, prev, out)?;
            }
            pending = Some((i, part));
        }
        if let Some((prev, out)) = pending {
            self.drain(&slots, prev, out)?;
        }
        Ok(())
    }

    /// Waits for chunk `i`'s copy and moves it from pinned memory to `out`.
    fn drain(&self, slots: &Slots, i: usize, out: &mut [u8]) -> Result<(), TensorError> {
        let s = i % 2;
        slots.done[s]
            .synchronize()
            .map_err(driver("cuEventSynchronize"))?;
        // SAFETY: the copy into the chunk completed (event above); it holds >= out.len() bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                slots.chunks[s].addr() as *const u8,
                out.as_mut_ptr(),
                out.len(),
            )
        };
        Ok(())
    }
}

/// An upload on the copy stream: its completion event and the host source it reads.
#[derive(Debug)]
struct InFlight {
    done: CudaEvent,
    _src: Allocation,
}

impl PendingCopy for InFlight {
    fn wait(self: Box<Self>) -> Result<(), TensorError> {
        self.done
            .synchronize()
            .map_err(driver("cuEventSynchronize"))
    }
}

impl Drop for InFlight {
    /// The DMA may still read the source: wait before it goes back to its allocator.
    fn drop(&mut self) {
        let _ = self.done.synchronize();
    }
}
