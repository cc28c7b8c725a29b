//! The `bfc` strategy, after XLA's BFC ("best-fit with coalescing") allocator.
//!
//! One arena of `fraction` x the device's *total* memory (as JAX's
//! `XLA_PYTHON_CLIENT_MEM_FRACTION`: 0.75 of a 141 GB H200 is 106 GB whatever else runs),
//! rounded down to the granularity, is reserved when the allocator is built; when that much is
//! not free (a second process holds memory), construction fails with
//! [`AllocError::ArenaUnavailable`] naming the requested and the free bytes, instead of
//! silently reserving less. A backend with no total figure (a host without capacity) sizes the
//! arena from its free figure. The backend is never called again until the allocator drops.
//! Blocks are cut from the arena by best-fit (an exact ordered index instead of XLA's
//! power-of-two bins), split at any aligned remainder, and coalesced on free. A request larger
//! than the arena can never fit.
//!
//! Bound: `reserved` is the arena, always (it never grows or shrinks with the live bytes).

use crate::AllocError;
use crate::block::{Arena, Tag};
use crate::stats::{PoolKind, SegmentSnapshot};
use crate::strategy::{Grant, Metered, Pool, Refusal, Strategy};

#[derive(Debug)]
pub(crate) struct Bfc {
    arena: Arena,
    arena_bytes: u64,
}

impl Bfc {
    pub fn new(
        mem: &mut Metered<'_>,
        fraction: f64,
        strategy: &Strategy,
    ) -> Result<Self, AllocError> {
        let raw = mem.raw;
        let unsupported = |reason: String| AllocError::Unsupported {
            strategy: strategy.to_string(),
            backend: raw.name(),
            reason,
        };
        if !(fraction > 0.0 && fraction <= 1.0) {
            return Err(unsupported(format!("fraction {fraction} is not in (0, 1]")));
        }
        let free = raw.free_bytes();
        let base = raw.capacity().or(free).ok_or_else(|| {
            unsupported("the backend reports neither capacity nor free bytes".into())
        })?;
        let align = raw.alignment().max(1) as u64;
        let gran = (raw.granularity() as u64).max(align);
        let want = (base as f64 * fraction) as u64;
        let bytes = want / gran * gran;
        let bytes =
            usize::try_from(bytes).unwrap_or(usize::MAX / 2 / gran as usize * gran as usize);
        if bytes == 0 {
            return Err(unsupported(format!(
                "{fraction} of {base} bytes is less than one {gran}-byte granule"
            )));
        }
        if let Some(free) = free.filter(|&f| f < bytes as u64) {
            return Err(AllocError::ArenaUnavailable {
                strategy: strategy.to_string(),
                backend: raw.name(),
                fraction,
                requested: bytes as u64,
                free,
                total: base,
            });
        }
        let seg = mem.reserve(bytes)?;
        let mut arena = Arena::new(align as usize, PoolKind::Arena);
        if !arena.add_segment(seg) {
            let _ = mem.release(seg);
            return Err(unsupported(
                "the arena segment could not be registered".into(),
            ));
        }
        Ok(Bfc {
            arena,
            arena_bytes: seg.bytes as u64,
        })
    }
}

impl Pool for Bfc {
    fn alloc(&mut self, _mem: &mut Metered<'_>, size: usize, tag: Tag) -> Result<Grant, Refusal> {
        match self.arena.alloc(size, usize::MAX, tag) {
            Some(t) => Ok(Grant {
                addr: t.addr,
                handle: t.id as u64,
                block: t.size,
                segment: t.segment,
            }),
            None => Err(Refusal::NoFit {
                can_never_fit: size as u64 > self.arena_bytes,
                cause: None,
            }),
        }
    }

    fn free(&mut self, _mem: &mut Metered<'_>, handle: u64) -> Option<(usize, Tag)> {
        self.arena.free(u32::try_from(handle).ok()?)
    }

    /// The arena is kept for the allocator's lifetime, as XLA does; parked blocks are
    /// coalesced, so a fully free arena is one block again, as when it was reserved.
    fn release_cached(&mut self, _mem: &mut Metered<'_>) -> Result<(), AllocError> {
        self.settle();
        Ok(())
    }

    fn release_all(&mut self, mem: &mut Metered<'_>) {
        for seg in self.arena.take_all_segments() {
            let _ = mem.release(seg);
        }
    }

    fn settle(&mut self) {
        self.arena.settle();
    }

    fn largest_free(&self) -> u64 {
        self.arena.largest_free() as u64
    }

    fn free_bytes(&self) -> u64 {
        self.arena.free_bytes()
    }

    fn limit(&self) -> Option<u64> {
        Some(self.arena_bytes)
    }

    fn snapshot(&self) -> Vec<SegmentSnapshot> {
        self.arena.snapshot()
    }
}
