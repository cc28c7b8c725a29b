//! The `caching` strategy, after PyTorch's CUDACachingAllocator, with two rules that keep it
//! from fragmenting and growing without bound.
//!
//! Two arenas: requests of at most 1 MiB (`kSmallSize`) come from 2 MiB segments
//! (`kSmallBuffer`) so that they never fragment large segments; larger requests get segments
//! of their size rounded up to the backend granularity (sized to fit). Both use best-fit with
//! splitting (small blocks split at any aligned remainder, large ones only when more than 1 MiB
//! would remain, as PyTorch's `should_split`) and coalesce on free. The last 16 freed blocks
//! are parked for exact-size reuse before they are coalesced (see `block.rs`), which makes the
//! common "same sizes every step" pattern a pair of O(1) operations.
//!
//! The rules (the pytorch#35901 and rmm#35 sequences; PyTorch's `max_split_size` made
//! relative):
//!
//! - Every live block has a *weight*: the most a segment serving it may hold, `max(2 x
//!   block, fresh segment)`, where the fresh segment is what a reservation for that block
//!   would get (2 MiB for a small block, the block rounded up to the granularity for a large
//!   one). A large request is never cut out of a segment heavier than its weight, so ten
//!   20 MiB blocks cannot pin a cached 1.2 GiB segment: they get segments of their own and the
//!   1.2 GiB one stays whole for the next 1.2 GiB request.
//! - Before a new segment is reserved, if `reserved` plus the new segment would pass the
//!   highest total weight of live blocks so far (this request included), wholly free segments
//!   are released, largest first, until it does not. Releasing all of them always suffices:
//!   every remaining segment then holds a live block it is no heavier than, and distinct
//!   segments hold distinct blocks. Hence the bound stated in the strategy docs:
//!   `reserved <= max over time of the live blocks' total weight`.
//! - When a reservation fails, every wholly free segment is released and the reservation
//!   retried once (PyTorch's `release_cached_blocks` retry).

use crate::block::{Arena, Tag, Taken};
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
    /// Total weight of the live blocks, bytes (in `u128`: weights of huge blocks saturate at
    /// `u64::MAX` each, and their sum must not wrap).
    weight: u128,
    /// Highest `weight` so far: the bound `reserved` stays under.
    weight_peak: u128,
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
            weight: 0,
            weight_peak: 0,
        }
    }

    fn arena(&mut self, pool: u64) -> &mut Arena {
        if pool == SMALL {
            &mut self.small
        } else {
            &mut self.large
        }
    }

    /// The segment a reservation for a block of `size` bytes gets (None on overflow).
    fn fresh(&self, size: usize) -> Option<usize> {
        if size <= SMALL_LIMIT {
            Some(self.small_segment)
        } else {
            round_up(size, self.granularity)
        }
    }

    /// The most a segment serving a block of `size` bytes may hold (see the module docs).
    fn weight_of(&self, size: usize) -> usize {
        self.fresh(size)
            .unwrap_or(usize::MAX)
            .max(size.saturating_mul(2))
    }

    fn reserved(&self) -> u64 {
        self.small.reserved() + self.large.reserved()
    }

    fn grant(&mut self, pool: u64, t: Taken) -> Grant {
        self.weight += self.weight_of(t.size) as u128;
        self.weight_peak = self.weight_peak.max(self.weight);
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

    /// Releases wholly free segments, largest first, until `reserved + adding <= budget` or
    /// none is left. A failed release is counted in `backend_errors` (the segment is gone
    /// from the books either way).
    fn trim_to(&mut self, mem: &mut Metered<'_>, budget: u64, adding: u64) {
        while self.reserved().saturating_add(adding) > budget {
            let seg = match self.large.take_largest_free_segment() {
                Some(seg) => seg,
                None => match self.small.take_largest_free_segment() {
                    Some(seg) => seg,
                    None => return,
                },
            };
            let _ = mem.release(seg);
        }
    }
}

impl Pool for Caching {
    fn alloc(&mut self, mem: &mut Metered<'_>, size: usize, tag: Tag) -> Result<Grant, Refusal> {
        let pool = if size <= SMALL_LIMIT { SMALL } else { LARGE };
        let max_segment = if pool == SMALL {
            usize::MAX
        } else {
            self.weight_of(size)
        };
        if let Some(t) = self.arena(pool).alloc(size, max_segment, tag) {
            return Ok(self.grant(pool, t));
        }
        let never = Refusal::NoFit {
            can_never_fit: true,
            cause: None,
        };
        let seg_bytes = self.fresh(size).ok_or(never)?;
        if self.capacity.is_some_and(|cap| seg_bytes as u64 > cap) {
            return Err(Refusal::NoFit {
                can_never_fit: true,
                cause: None,
            });
        }
        let budget = self
            .weight_peak
            .max(self.weight + self.weight_of(size) as u128);
        let budget = u64::try_from(budget).unwrap_or(u64::MAX);
        self.trim_to(mem, budget, seg_bytes as u64);
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
        // The new segment is within the limit; so is whatever best-fit takes instead.
        match arena.alloc(size, max_segment, tag) {
            Some(t) => Ok(self.grant(pool, t)),
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
        let freed = self.arena(pool).free(handle as u32)?;
        self.weight -= self.weight_of(freed.0) as u128;
        Some(freed)
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
