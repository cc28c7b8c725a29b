//! The `platform` strategy: no caching, one backend reserve per allocation and one release per
//! free (like `XLA_PYTHON_CLIENT_ALLOCATOR=platform`; the debugging mode). The `async`
//! strategy reuses it over a stream-ordered backend.

use crate::block::Tag;
use crate::stats::{BlockSnapshot, BlockState, PoolKind, SegmentSnapshot};
use crate::strategy::{Grant, Metered, Pool, Refusal};
use crate::{AllocError, RawMemory, Segment};

/// One backend segment per live allocation, in a slab indexed by the handle.
#[derive(Debug)]
pub(crate) struct Direct {
    slots: Vec<Option<(Segment, Tag)>>,
    vacant: Vec<usize>,
    capacity: Option<u64>,
    trim_on_empty: bool,
}

impl Direct {
    /// `trim_on_empty`: `empty_cache` asks the backend to trim its pool (async).
    pub fn new(raw: &dyn RawMemory, trim_on_empty: bool) -> Self {
        Direct {
            slots: Vec::new(),
            vacant: Vec::new(),
            capacity: raw.capacity(),
            trim_on_empty,
        }
    }
}

impl Pool for Direct {
    fn alloc(&mut self, mem: &mut Metered<'_>, size: usize, tag: Tag) -> Result<Grant, Refusal> {
        let seg = match mem.reserve(size) {
            Ok(seg) => seg,
            Err(e @ AllocError::BackendOutOfMemory { .. }) => {
                let can_never_fit = self.capacity.is_some_and(|c| size as u64 > c);
                return Err(Refusal::NoFit {
                    can_never_fit,
                    cause: Some(e.to_string()),
                });
            }
            Err(e) => return Err(Refusal::Error(e)),
        };
        let id = match self.vacant.pop() {
            Some(id) => {
                self.slots[id] = Some((seg, tag));
                id
            }
            None => {
                self.slots.push(Some((seg, tag)));
                self.slots.len() - 1
            }
        };
        Ok(Grant {
            addr: seg.addr,
            handle: id as u64,
            block: seg.bytes,
            segment: seg.addr,
        })
    }

    fn free(&mut self, mem: &mut Metered<'_>, handle: u64) -> Option<(usize, Tag)> {
        let id = usize::try_from(handle).ok()?;
        let (seg, tag) = self.slots.get_mut(id)?.take()?;
        self.vacant.push(id);
        // A failed release is counted in `backend_errors`; the drop path cannot return it.
        let _ = mem.release(seg);
        Some((seg.bytes, tag))
    }

    fn release_cached(&mut self, mem: &mut Metered<'_>) -> Result<(), AllocError> {
        if self.trim_on_empty {
            mem.raw.trim()
        } else {
            Ok(())
        }
    }

    fn release_all(&mut self, mem: &mut Metered<'_>) {
        for (seg, _) in self.slots.drain(..).flatten() {
            let _ = mem.release(seg);
        }
        self.vacant.clear();
    }

    fn largest_free(&self) -> u64 {
        0
    }

    fn free_bytes(&self) -> u64 {
        0
    }

    fn limit(&self) -> Option<u64> {
        self.capacity
    }

    fn snapshot(&self) -> Vec<SegmentSnapshot> {
        let mut v: Vec<SegmentSnapshot> = self
            .slots
            .iter()
            .flatten()
            .map(|(seg, tag)| SegmentSnapshot {
                addr: seg.addr,
                bytes: seg.bytes as u64,
                pool: PoolKind::Direct,
                blocks: vec![BlockSnapshot {
                    offset: 0,
                    bytes: seg.bytes as u64,
                    state: BlockState::Used,
                    category: Some(tag.category),
                    requested: tag.requested,
                }],
            })
            .collect();
        v.sort_by_key(|s| s.addr);
        v
    }
}
