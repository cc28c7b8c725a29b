//! The front: [`Allocator`] routes requests to the strategy's pool, tags categories, keeps
//! the exact counters and peaks, records traces, and turns "no memory" into an
//! [`OomReport`]. [`Allocation`] is the RAII handle that frees on drop.
//!
//! ```
//! use stax_alloc::{Allocator, Category, SimMemory, Strategy};
//! use std::sync::Arc;
//! let sim = Arc::new(SimMemory::new(64 << 20, 2 << 20));
//! let alloc = Allocator::new(sim.clone(), Strategy::Caching)?;
//! let a = alloc.allocate(3 << 20, Category::Activation)?;
//! assert_eq!(a.addr() % 256, 0);
//! drop(a); // the block stays cached...
//! assert_eq!(alloc.stats().cached, 4 << 20);
//! alloc.empty_cache()?; // ...until the cache is emptied
//! assert_eq!(sim.used(), 0);
//! # Ok::<(), stax_alloc::AllocError>(())
//! ```

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::block::Tag as BlockTag;
use crate::name::{Name, Scopes, Tag};
use crate::stats::{BackendBook, Counters, Snapshot, Stats, assemble};
use crate::strategy::{self, Grant, Metered, Pool, Refusal};
use crate::trace::{Mark, Recorded, Recorder, Trace, TraceOp};
use crate::{AllocError, Category, OomReport, RawMemory, Strategy, round_up};

/// Handle of a zero-byte allocation (no block behind it).
const ZERO_HANDLE: u64 = u64::MAX;

/// A memory allocator over one backend (one per device), with exact accounting.
///
/// Thread-safe (`Send + Sync`): every operation takes one short lock; best-fit is an ordered
/// index lookup, so the hot path never scans a list. See [`Strategy`] for the designs
/// (PyTorch CUDACachingAllocator, XLA BFC, platform, stream-ordered).
pub struct Allocator {
    backend: Arc<dyn RawMemory>,
    strategy: Strategy,
    alignment: usize,
    inner: Mutex<Inner>,
}

struct Inner {
    pool: Box<dyn Pool>,
    counters: Counters,
    book: BackendBook,
    next_id: u64,
    trace: Option<Recorder>,
    scopes: Scopes,
}

impl fmt::Debug for Allocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Allocator")
            .field("backend", &self.backend.name())
            .field("strategy", &self.strategy.to_string())
            .field("alignment", &self.alignment)
            .finish_non_exhaustive()
    }
}

impl Allocator {
    /// An allocator serving `strategy` from `backend`. `bfc` reserves its arena here.
    ///
    /// # Errors
    /// [`AllocError::Unsupported`] for `async` on a backend that is not stream-ordered,
    /// `expandable` on one without virtual memory, or `bfc` on a backend with neither
    /// free-bytes nor capacity figures; [`AllocError::ArenaUnavailable`] when `bfc`'s fraction
    /// of the total is not free; the backend's error when the `bfc` arena cannot be reserved.
    pub fn new(
        backend: Arc<dyn RawMemory>,
        strategy: Strategy,
    ) -> Result<Arc<Allocator>, AllocError> {
        let alignment = backend
            .alignment()
            .max(1)
            .checked_next_power_of_two()
            .unwrap_or(256);
        let mut book = BackendBook::default();
        let pool = strategy::build(
            &strategy,
            &mut Metered {
                raw: &*backend,
                book: &mut book,
            },
        )?;
        let inner = Inner {
            pool,
            counters: Counters::default(),
            book,
            next_id: 0,
            trace: None,
            scopes: Scopes::default(),
        };
        Ok(Arc::new(Allocator {
            backend,
            strategy,
            alignment,
            inner: Mutex::new(inner),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Allocates `bytes` bytes tagged `tag` (a [`Category`], or a [`Tag`] with a role), on
    /// stream 0, named after the current scope and the role ([`Allocation::name`]). The
    /// address is aligned to the backend's alignment (256 on devices, 64 on the host). Zero
    /// bytes is valid: the handle has an aligned dangling address, takes no memory and frees
    /// cleanly.
    ///
    /// # Errors
    /// [`AllocError::OutOfMemory`] with a diagnosis when no memory can be found (`caching`
    /// first releases its cache and retries once); the allocator stays usable.
    /// [`AllocError::Backend`] when the backend fails for another reason.
    pub fn allocate(
        self: &Arc<Self>,
        bytes: usize,
        tag: impl Into<Tag>,
    ) -> Result<Allocation, AllocError> {
        self.allocate_on(bytes, tag, 0)
    }

    /// As [`allocate`](Allocator::allocate), recording `stream` in the trace (placement does
    /// not depend on it).
    ///
    /// # Errors
    /// As [`allocate`](Allocator::allocate).
    pub fn allocate_on(
        self: &Arc<Self>,
        bytes: usize,
        tag: impl Into<Tag>,
        stream: u32,
    ) -> Result<Allocation, AllocError> {
        self.allocate_with(bytes, tag.into(), stream, None)
    }

    /// As [`allocate`](Allocator::allocate), for a tensor: `shape` and `dtype` (its name,
    /// `f32`) are written to the trace's event, if one is being recorded, so a plan or a
    /// recorded run can say what the buffer holds.
    ///
    /// # Errors
    /// As [`allocate`](Allocator::allocate).
    pub fn allocate_tensor(
        self: &Arc<Self>,
        bytes: usize,
        tag: impl Into<Tag>,
        shape: &[usize],
        dtype: &'static str,
    ) -> Result<Allocation, AllocError> {
        self.allocate_with(bytes, tag.into(), 0, Some((shape, dtype)))
    }

    fn allocate_with(
        self: &Arc<Self>,
        bytes: usize,
        tag: Tag,
        stream: u32,
        layout: Option<(&[usize], &'static str)>,
    ) -> Result<Allocation, AllocError> {
        let category = tag.category;
        let mut guard = self.lock();
        let inner = &mut *guard;
        let name = Name::new(inner.scopes.current(), tag.role);
        let grant = if bytes == 0 {
            let addr = self.alignment as u64;
            Grant {
                addr,
                handle: ZERO_HANDLE,
                block: 0,
                segment: addr,
            }
        } else {
            let Some(size) = round_up(bytes, self.alignment) else {
                return Err(self.oom(inner, bytes, &name, category, true, None));
            };
            let tag = BlockTag {
                category,
                requested: bytes as u64,
            };
            let mut mem = Metered {
                raw: &*self.backend,
                book: &mut inner.book,
            };
            match inner.pool.alloc(&mut mem, size, tag) {
                Ok(g) => g,
                Err(Refusal::NoFit {
                    can_never_fit,
                    cause,
                }) => {
                    return Err(self.oom(inner, bytes, &name, category, can_never_fit, cause));
                }
                Err(Refusal::Error(e)) => return Err(e),
            }
        };
        let id = inner.next_id;
        inner.next_id += 1;
        inner
            .counters
            .on_alloc(category, bytes as u64, grant.block as u64);
        if let Some(rec) = &mut inner.trace {
            let a = Recorded {
                id,
                bytes: bytes as u64,
                category,
                stream,
                addr: grant.addr,
                name: &name,
                layout,
            };
            rec.record(TraceOp::Alloc, a);
        }
        drop(guard);
        Ok(Allocation {
            addr: grant.addr,
            bytes,
            category,
            name,
            stream,
            id,
            handle: grant.handle,
            block: grant.block,
            segment: grant.segment,
            owner: Arc::clone(self),
        })
    }

    fn oom(
        &self,
        inner: &Inner,
        bytes: usize,
        name: &Name,
        category: Category,
        can_never_fit: bool,
        cause: Option<String>,
    ) -> AllocError {
        let c = &inner.counters;
        let limit = inner.pool.limit();
        AllocError::OutOfMemory(Box::new(OomReport {
            requested: bytes as u64,
            category,
            name: name.to_string(),
            reserved: inner.book.reserved,
            allocated: c.allocated,
            allocated_by_category: c.allocated_by_category(),
            cached: inner.book.reserved.saturating_sub(c.allocated),
            largest_free_block: inner.pool.largest_free(),
            driver_free: self.backend.free_bytes(),
            capacity: self.backend.capacity(),
            can_never_fit: can_never_fit || limit.is_some_and(|l| bytes as u64 > l),
            limit,
            backend: self.backend.name(),
            strategy: self.strategy.to_string(),
            cause,
        }))
    }

    fn free(&self, a: &Allocation) {
        let mut guard = self.lock();
        let inner = &mut *guard;
        if a.handle == ZERO_HANDLE {
            inner.counters.on_free(a.category, 0, 0);
        } else {
            let mut mem = Metered {
                raw: &*self.backend,
                book: &mut inner.book,
            };
            match inner.pool.free(&mut mem, a.handle) {
                Some((block, tag)) => {
                    inner
                        .counters
                        .on_free(tag.category, tag.requested, block as u64)
                }
                None => {
                    inner.book.errors += 1;
                    return;
                }
            }
        }
        if let Some(rec) = &mut inner.trace {
            let r = Recorded {
                id: a.id,
                bytes: a.bytes as u64,
                category: a.category,
                stream: a.stream,
                addr: a.addr,
                name: &a.name,
                layout: None,
            };
            rec.record(TraceOp::Free, r);
        }
    }

    /// Exact statistics at this instant (see [`Stats`]).
    pub fn stats(&self) -> Stats {
        let g = self.lock();
        assemble(
            &g.counters,
            &g.book,
            g.pool.largest_free(),
            g.pool.free_bytes(),
        )
    }

    /// Resets every peak (requested, allocated, reserved, per category) to its current value.
    pub fn reset_peak(&self) {
        let mut g = self.lock();
        g.counters.reset_peak();
        g.book.peak_reserved = g.book.reserved;
    }

    /// Coalesces every parked block (see the crate's `block` module): the placement of later
    /// allocations then depends only on which blocks are live, not on the order of recent
    /// frees. [`replay`](crate::replay) starts with it; reading figures never does it.
    pub fn coalesce(&self) {
        self.lock().pool.settle();
    }

    /// Returns cached memory to the backend: `caching` releases every segment that is one free
    /// block; `expandable` unmaps every page no live block touches; `async` trims the backend
    /// pool; `bfc` keeps its arena but coalesces every freed block (a fully free arena is one
    /// block again); `platform` caches nothing.
    ///
    /// # Errors
    /// The first backend error; the other segments are still released.
    pub fn empty_cache(&self) -> Result<(), AllocError> {
        let mut guard = self.lock();
        let inner = &mut *guard;
        inner.pool.release_cached(&mut Metered {
            raw: &*self.backend,
            book: &mut inner.book,
        })
    }

    /// Every segment and block (offset, size, state, category), with the stats of the same
    /// instant.
    pub fn snapshot(&self) -> Snapshot {
        let g = self.lock();
        Snapshot {
            backend: self.backend.name(),
            strategy: self.strategy.to_string(),
            stats: assemble(
                &g.counters,
                &g.book,
                g.pool.largest_free(),
                g.pool.free_bytes(),
            ),
            segments: g.pool.snapshot(),
        }
    }

    /// The raw memory backend.
    pub fn backend(&self) -> &Arc<dyn RawMemory> {
        &self.backend
    }

    /// The strategy this allocator runs.
    pub fn strategy(&self) -> &Strategy {
        &self.strategy
    }

    /// Alignment in bytes of every address handed out (the backend's).
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// Starts recording every allocation and free (discarding any trace being recorded).
    /// Times are nanoseconds since this call.
    pub fn start_trace(&self) {
        self.lock().trace = Some(Recorder::new());
    }

    /// Stops recording and returns the trace (empty when none was being recorded).
    pub fn stop_trace(&self) -> Trace {
        self.lock()
            .trace
            .take()
            .map(Recorder::finish)
            .unwrap_or_default()
    }

    /// Whether a trace is being recorded.
    pub fn is_tracing(&self) -> bool {
        self.lock().trace.is_some()
    }

    /// Enters the scope `segment` (a layer's key, `2.conv`) below the current one, until the
    /// guard drops: allocations made meanwhile are named `{scope}/{role}`
    /// (`3.parallel/0.serial/2.conv/workspace`). The scope belongs to the allocator, not to a
    /// thread: set scopes from the one thread that runs the step.
    pub fn scope(self: &Arc<Self>, segment: &str) -> ScopeGuard {
        self.lock().scopes.push(segment);
        ScopeGuard {
            owner: Arc::clone(self),
        }
    }

    /// The current scope path (empty outside any scope).
    pub fn current_scope(&self) -> String {
        self.lock().scopes.current().to_string()
    }

    /// Marks, in the trace being recorded (if any), that training step `step` starts here.
    pub fn mark_step(&self, step: u64) {
        if let Some(rec) = &mut self.lock().trace {
            rec.mark(|at| Mark::Step { at, step });
        }
    }

    fn note_role(&self, id: u64, role: &'static str) {
        let mut g = self.lock();
        let name = Name::new(g.scopes.current(), role).to_string();
        if let Some(rec) = &mut g.trace {
            rec.mark(|at| Mark::Role { at, id, name });
        }
    }
}

/// The scope entered by [`Allocator::scope`]; leaving it when dropped.
#[derive(Debug)]
pub struct ScopeGuard {
    owner: Arc<Allocator>,
}

impl Drop for ScopeGuard {
    fn drop(&mut self) {
        self.owner.lock().scopes.pop();
    }
}

impl Drop for Allocator {
    fn drop(&mut self) {
        // No allocation can be live: each holds an Arc to this allocator.
        let inner = self.inner.get_mut().unwrap_or_else(|e| e.into_inner());
        inner.pool.release_all(&mut Metered {
            raw: &*self.backend,
            book: &mut inner.book,
        });
    }
}

/// A live allocation: RAII, returned to its allocator when dropped. `Send + Sync`.
#[derive(Debug)]
pub struct Allocation {
    addr: u64,
    bytes: usize,
    category: Category,
    name: Name,
    stream: u32,
    id: u64,
    handle: u64,
    block: usize,
    segment: u64,
    owner: Arc<Allocator>,
}

impl Allocation {
    /// Start address, aligned to the allocator's alignment. A device pointer on device
    /// backends; for [`HostMemory`](crate::HostMemory) a real pointer to `bytes()` bytes,
    /// valid while this handle lives (fresh segments are zeroed; reused blocks hold whatever
    /// was last written).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Requested bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Bytes of the block behind it (the request rounded up; 0 for a zero-byte request).
    pub fn allocated_bytes(&self) -> usize {
        self.block
    }

    /// Offset in bytes of the block from the start of its backend segment.
    pub fn offset(&self) -> u64 {
        self.addr - self.segment
    }

    /// The category it was tagged with.
    pub fn category(&self) -> Category {
        self.category
    }

    /// Its name: the allocator's scope when it was made and its role (`2.conv/workspace`).
    pub fn name(&self) -> &Name {
        &self.name
    }

    /// Records, in the allocator's trace (if one is being recorded), that from now on this
    /// buffer plays `role` in the current scope: a buffer written over in place (a ReLU on its
    /// input, a gradient over a dead activation) keeps its first name and gains this one.
    pub fn note_role(&self, role: &'static str) {
        self.owner.note_role(self.id, role);
    }

    /// Allocation id, unique per allocator (the id used in traces).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The stream recorded for it ([`Allocator::allocate_on`]).
    pub fn stream(&self) -> u32 {
        self.stream
    }

    /// The allocator it came from.
    pub fn allocator(&self) -> &Arc<Allocator> {
        &self.owner
    }

    /// Its requested bytes as a host slice, when its memory is host memory
    /// ([`RawMemory::host_access`](crate::RawMemory::host_access)); None on devices and
    /// simulations.
    pub fn host_bytes(&self) -> Option<&[u8]> {
        self.owner.backend().host_access()?;
        if self.bytes == 0 {
            return Some(&[]);
        }
        // SAFETY: `host_access` promises the segment is readable, initialized host memory; the
        // block [addr, addr + bytes) lies inside it and is this allocation's while it lives.
        Some(unsafe { std::slice::from_raw_parts(self.addr as usize as *const u8, self.bytes) })
    }

    /// As [`Allocation::host_bytes`], writable: `&mut self` makes the slice the only access.
    pub fn host_bytes_mut(&mut self) -> Option<&mut [u8]> {
        self.owner.backend().host_access()?;
        if self.bytes == 0 {
            return Some(&mut []);
        }
        // SAFETY: as in `host_bytes`; the allocation is owned and borrowed mutably, so no
        // other slice of the block exists.
        Some(unsafe { std::slice::from_raw_parts_mut(self.addr as usize as *mut u8, self.bytes) })
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        self.owner.free(self);
    }
}
