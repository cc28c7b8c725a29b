//! Host <-> device copies through a pinned staging buffer.
//!
//! Copies from pageable memory are staged by the driver anyway, more slowly; we stage
//! ourselves through two pinned chunks so that the host `memcpy` of one chunk overlaps the DMA
//! of the other. The chunks come from a pinned-host [`Allocator`] (tagged `Input`), are held
//! for the backend's life and guarded by one lock. Both directions run on the compute stream,
//! so they are ordered with the kernels around them.
//!
//! Not done yet: a second stream that prefetches the next batch while a step runs.

use crate::TensorError;
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
    allocator: Arc<Allocator>,
    slots: Mutex<Slots>,
}

fn driver(op: &'static str) -> impl FnOnce(DriverError) -> TensorError {
    move |source| TensorError::Driver { op, source }
}

impl Staging {
    /// Two pinned chunks of [`STAGING_CHUNK_BYTES`] for copies on `stream`.
    ///
    /// # Errors
    /// [`TensorError::Alloc`] if pinned memory cannot be had; [`TensorError::Driver`].
    pub(crate) fn new(stream: Arc<CudaStream>) -> Result<Staging, TensorError> {
        let ctx: Arc<CudaContext> = stream.context().clone();
        let allocator =
            Allocator::new(Arc::new(PinnedMemory::new(ctx.clone())), Strategy::Caching)?;
        let chunk = || allocator.allocate(STAGING_CHUNK_BYTES, Category::Input);
        let chunks = [chunk()?, chunk()?];
        let event = || ctx.new_event(None).map_err(driver("cuEventCreate"));
        let done = [event()?, event()?];
        Ok(Staging {
            stream,
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
