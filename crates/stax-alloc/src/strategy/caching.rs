//! The `caching` strategy, after PyTorch's CUDACachingAllocator.
//!
//! Two arenas: requests of at most 1 MiB (`kSmallSize`) come from 2 MiB segments
//! (`kSmallBuffer`) so that they never fragment large segments; larger requests get segments
//! rounded up to the backend granularity. Both use best-fit with splitting (small blocks split
//! at any aligned remainder, large ones only when more than 1 MiB would remain, as PyTorch's
//! `should_split`) and coalesce on free. Freed blocks stay cached until `empty_cache`, or until
//! a backend reservation fails: then every fully free segment is released and the reservation
//! retried once (PyTorch's `release_cached_blocks` retry). The last 16 freed blocks are parked
//! for exact-size reuse before they are coalesced (see `block.rs`), which makes the common
//! "same sizes every step" pattern a pair of O(1) operations.

use crate::block::{Arena, Tag};
use crate::stats::{PoolKind, SegmentSnapshot};
use crate::strategy::{Grant, Metered, Pool, Refusal};
use crate::{AllocError, RawMemory, round_up};

/// Requests of at most this many bytes use the small pool (PyTorch `kSmallSize`).
pub(crate) const SMALL_LIMIT: usize = 1 << 20;
/// Size of small-pool segments (PyTorch `kSmallBuffer`), rounded up to the granularity.
pub(crate) const SMALL_SEGMENT: usize = 2 << 20;

const SMALL: u64 = 0;
const LARGE: u64 = 1;

#[derive(Debug)]
pub(crate) struct Caching {
    small: Arena,
    large: Arena,
    small_segment: usize,
    granularity: usize,
    capacity: Option<u64>,
}

impl Caching {
    pub fn new(raw: &dyn RawMemory) -> Self {
        let align = raw.alignment().max(1);
        let granularity = raw.granularity().max(align);
        Caching {
            small: Arena::new(align, PoolKind::Small),
            large: Arena::new(
                round_up(SMALL_LIMIT + 1, align).unwrap_or(align),
                PoolKind::Large,
            ),
            small_segment: round_up(SMALL_SEGMENT, granularity).unwrap_or(SMALL_SEGMENT),
            granularity,
            capacity: raw.capacity(),
        }
    }

    fn arena(&mut self, pool: u64) -> &mut Arena {
        if pool == SMALL {
            &mut self.small
        } else {
            &mut self.large
        }
    }

    fn grant(pool: u64, t: crate::block::Taken) -> Grant {
        Grant {
            addr: t.addr,
            handle: (pool << 32) | t.id as u64,
            block: t.size,
            segment: t.segment,
        }
    }

    fn release_idle(&mut self, mem: &mut Metered<'_>) -> Result<(), AllocError> {
        let mut first_err = None;
        let segs = [
            self.small.take_free_segments(),
            self.large.take_free_segments(),
        ];
        for seg in segs.into_iter().flatten() {
            if let Err(e) = mem.release(seg) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl Pool for Caching {
    fn alloc(&mut self, mem: &mut Metered<'_>, size: usize, tag: Tag) -> Result<Grant, Refusal> {
        let pool = if size <= SMALL_LIMIT { SMALL } else { LARGE };
        if let Some(t) = self.arena(pool).alloc(size, tag) {
            return Ok(Self::grant(pool, t));
        }
        let never = Refusal::NoFit {
            can_never_fit: true,
            cause: None,
        };
        let seg_bytes = if pool == SMALL {
            self.small_segment
        } else {
            round_up(size, self.granularity).ok_or(never)?
        };
        if self.capacity.is_some_and(|cap| seg_bytes as u64 > cap) {
            return Err(Refusal::NoFit {
                can_never_fit: true,
                cause: None,
            });
        }
        let seg = match mem.reserve(seg_bytes) {
            Ok(seg) => seg,
            Err(_) => {
                // Out of memory (or a transient failure): drop the cache, retry once.
                let _ = self.release_idle(mem);
                match mem.reserve(seg_bytes) {
                    Ok(seg) => seg,
                    Err(e @ AllocError::BackendOutOfMemory { .. }) => {
                        return Err(Refusal::NoFit {
                            can_never_fit: false,
                            cause: Some(e.to_string()),
                        });
                    }
                    Err(e) => return Err(Refusal::Error(e)),
                }
            }
        };
        let arena = self.arena(pool);
        if !arena.add_segment(seg) {
            let _ = mem.release(seg);
            return Err(Refusal::Error(AllocError::Backend {
                backend: mem.raw.name(),
                op: "reserve",
                message: format!("segment {seg:?} could not be added to the pool"),
            }));
        }
        match arena.alloc(size, tag) {
            Some(t) => Ok(Self::grant(pool, t)),
            None => Err(Refusal::NoFit {
                can_never_fit: false,
                cause: None,
            }),
        }
    }

    fn free(&mut self, _mem: &mut Metered<'_>, handle: u64) -> Option<(usize, Tag)> {
        let pool = handle >> 32;
        if pool > LARGE {
            return None;
        }
        self.arena(pool).free(handle as u32)
    }

    fn release_cached(&mut self, mem: &mut Metered<'_>) -> Result<(), AllocError> {
        self.release_idle(mem)
    }

    fn release_all(&mut self, mem: &mut Metered<'_>) {
        let segs = [
            self.small.take_all_segments(),
            self.large.take_all_segments(),
        ];
        for seg in segs.into_iter().flatten() {
            let _ = mem.release(seg);
        }
    }

    fn settle(&mut self) {
        self.small.settle();
        self.large.settle();
    }

    fn largest_free(&self) -> u64 {
        self.small.largest_free().max(self.large.largest_free()) as u64
    }

    fn free_bytes(&self) -> u64 {
        self.small.free_bytes() + self.large.free_bytes()
    }

    fn limit(&self) -> Option<u64> {
        self.capacity
    }

    fn snapshot(&self) -> Vec<SegmentSnapshot> {
        let mut v = self.small.snapshot();
        v.extend(self.large.snapshot());
        v
    }
}
