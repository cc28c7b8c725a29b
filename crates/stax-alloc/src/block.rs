//! Segments and blocks: the arena shared by the `caching` and `bfc` strategies.
//!
//! An [`Arena`] owns whole backend segments and cuts them into blocks. Blocks of a segment form
//! a doubly linked list in address order (PyTorch CUDACachingAllocator's `Block::prev/next`,
//! XLA BFC's chunks), stored in a slab so that a live allocation's handle finds its block in
//! O(1). Free blocks are indexed by `(size, addr)` in a `BTreeMap`, so best-fit is one ordered
//! lookup, O(log n), never a list scan (XLA's bins, exact). Allocation splits the chosen block
//! when the remainder is at least `min_split` bytes; freeing coalesces with free neighbours.
//! Ties between equal sizes go to the lowest address, so placement is deterministic.
//!
//! Quick reuse: the last [`PARK_SLOTS`] freed blocks are *parked* (dlmalloc's fastbins,
//! tcmalloc's per-size lists) so that an allocation of exactly the same size takes one back
//! without touching the index. A parked block is coalesced as usual when it leaves the quick
//! list and when a best-fit lookup misses (so no request ever fails or reserves more because of
//! it). Reading figures never coalesces: [`Arena::largest_free`] and [`Arena::snapshot`]
//! compute the coalesced picture without changing the arena, so placement depends only on the
//! sequence of allocations and frees (a replay of a trace places as the recorded run did, however
//! often that run read its statistics).

use std::collections::BTreeMap;

use crate::stats::{BlockSnapshot, BlockState, PoolKind, SegmentSnapshot};
use crate::{Category, Segment};

/// "No block" in the prev/next links.
const NIL: u32 = u32::MAX;

/// What a used block holds: its category and the caller's requested bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tag {
    pub category: Category,
    pub requested: u64,
}

/// Number of freed blocks kept for exact-size reuse before they are coalesced.
pub(crate) const PARK_SLOTS: usize = 16;

#[derive(Debug, Clone)]
struct Node {
    addr: u64,
    size: usize,
    segment: u64,
    prev: u32,
    next: u32,
    /// Some for a used block; None for a free or parked block (or a vacant slab slot).
    tag: Option<Tag>,
    /// Free but parked on the quick list: not in the index, not coalesced.
    parked: bool,
}

impl Node {
    /// Free and in the index (may be merged with a neighbour).
    fn is_free(&self) -> bool {
        self.tag.is_none() && !self.parked
    }
}

#[derive(Debug, Clone, Copy)]
struct SegRec {
    bytes: usize,
    first: u32,
}

/// A block handed out by [`Arena::alloc`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Taken {
    /// Slab index of the block (the allocation's handle inside this arena).
    pub id: u32,
    /// Start address.
    pub addr: u64,
    /// Block size in bytes (at least the size asked).
    pub size: usize,
    /// Start address of the block's segment.
    pub segment: u64,
}

/// The free index key: size in the high 64 bits, address in the low ones, so one integer
/// comparison orders by (size, addr).
fn key(size: usize, addr: u64) -> u128 {
    ((size as u128) << 64) | addr as u128
}

/// Segments cut into blocks, with an ordered index of free blocks.
#[derive(Debug)]
pub(crate) struct Arena {
    nodes: Vec<Node>,
    vacant: Vec<u32>,
    free: BTreeMap<u128, u32>,
    segments: BTreeMap<u64, SegRec>,
    /// Parked blocks, oldest first: (size, id).
    parked: [(usize, u32); PARK_SLOTS],
    parked_len: usize,
    /// Bytes of free and parked blocks.
    free_bytes: u64,
    reserved: u64,
    min_split: usize,
    kind: PoolKind,
    /// Coalesce every parked block before a best-fit lookup (see [`Arena::coalescing_first`]).
    coalesce_first: bool,
}

impl Arena {
    /// An empty arena. Remainders smaller than `min_split` bytes are not split off (they
    /// stay part of the allocated block); `min_split` must be a multiple of the alignment.
    pub fn new(min_split: usize, kind: PoolKind) -> Self {
        Arena {
            nodes: Vec::new(),
            vacant: Vec::new(),
            free: BTreeMap::new(),
            segments: BTreeMap::new(),
            parked: [(0, NIL); PARK_SLOTS],
            parked_len: 0,
            free_bytes: 0,
            reserved: 0,
            min_split: min_split.max(1),
            kind,
            coalesce_first: false,
        }
    }

    /// The arena with parked blocks coalesced before every best-fit lookup (exact-size reuse
    /// stays): best-fit then sees every free block, which `expandable` wants so that a freed,
    /// still mapped block is found before unmapped addresses are.
    pub fn coalescing_first(mut self) -> Self {
        self.coalesce_first = true;
        self
    }

    /// Bytes of all segments.
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// Bytes of all free blocks (parked ones included).
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Size of the largest free block, as if every parked block were coalesced (0 when none).
    pub fn largest_free(&self) -> usize {
        let indexed = self
            .free
            .keys()
            .next_back()
            .map_or(0, |k| (k >> 64) as usize);
        let parked = self.parked[..self.parked_len]
            .iter()
            .map(|&(_, id)| self.free_run(id))
            .max()
            .unwrap_or(0);
        indexed.max(parked)
    }

    /// The size of the run of free blocks (indexed or parked) that free block `id` is in.
    fn free_run(&self, id: u32) -> usize {
        let mut first = id;
        loop {
            let prev = self.nodes[first as usize].prev;
            if prev == NIL || self.nodes[prev as usize].tag.is_some() {
                return self.run_end(first).0;
            }
            first = prev;
        }
    }

    /// Number of segments.
    #[cfg(test)]
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    fn new_node(&mut self, node: Node) -> Option<u32> {
        if let Some(id) = self.vacant.pop() {
            self.nodes[id as usize] = node;
            return Some(id);
        }
        let id = u32::try_from(self.nodes.len()).ok().filter(|&i| i != NIL)?;
        self.nodes.push(node);
        Some(id)
    }

    fn vacate(&mut self, id: u32) {
        let n = &mut self.nodes[id as usize];
        n.tag = None;
        n.parked = false;
        n.prev = NIL;
        n.next = NIL;
        n.size = 0;
        self.vacant.push(id);
    }

    /// Adds a whole segment as one free block. Returns false (and adds nothing) when the slab
    /// is full or the segment is already known.
    pub fn add_segment(&mut self, seg: Segment) -> bool {
        if seg.bytes == 0 || self.segments.contains_key(&seg.addr) {
            return false;
        }
        let node = Node {
            addr: seg.addr,
            size: seg.bytes,
            segment: seg.addr,
            prev: NIL,
            next: NIL,
            tag: None,
            parked: false,
        };
        let Some(id) = self.new_node(node) else {
            return false;
        };
        self.segments.insert(
            seg.addr,
            SegRec {
                bytes: seg.bytes,
                first: id,
            },
        );
        self.free.insert(key(seg.bytes, seg.addr), id);
        self.free_bytes += seg.bytes as u64;
        self.reserved += seg.bytes as u64;
        true
    }

    /// A block of at least `size` bytes in a segment of at most `max_segment` bytes, marked
    /// used with `tag`: a parked block of exactly `size` bytes if there is one (the most
    /// recently freed), else best-fit; when best-fit misses, the parked blocks are coalesced and
    /// best-fit tried again. `usize::MAX` puts no limit on the segment.
    ///
    /// A parked block is taken back without checking `max_segment`: callers whose limit grows
    /// with the request size (the `caching` strategy) placed it for a request no larger.
    pub fn alloc(&mut self, size: usize, max_segment: usize, tag: Tag) -> Option<Taken> {
        if let Some(t) = self.unpark(size, tag) {
            return Some(t);
        }
        if self.coalesce_first {
            self.settle();
        }
        if let Some(t) = self.best_fit(size, max_segment, tag) {
            return Some(t);
        }
        if self.parked_len == 0 {
            return None;
        }
        self.settle();
        self.best_fit(size, max_segment, tag)
    }

    fn unpark(&mut self, size: usize, tag: Tag) -> Option<Taken> {
        let i = self.parked[..self.parked_len]
            .iter()
            .rposition(|p| p.0 == size)?;
        let id = self.parked[i].1;
        self.parked.copy_within(i + 1..self.parked_len, i);
        self.parked_len -= 1;
        self.free_bytes -= size as u64;
        Some(self.mark_used(id, tag))
    }

    fn mark_used(&mut self, id: u32, tag: Tag) -> Taken {
        let n = &mut self.nodes[id as usize];
        n.parked = false;
        n.tag = Some(tag);
        Taken {
            id,
            addr: n.addr,
            size: n.size,
            segment: n.segment,
        }
    }

    /// Best-fit: the smallest free block of at least `size` bytes (lowest address on ties) in
    /// a segment of at most `max_segment` bytes, split if the remainder is at least
    /// `min_split`. With a limit, only blocks of at most `max_segment` bytes can qualify, so the
    /// lookup is one range of the index, skipping only blocks of segments that are too large.
    fn best_fit(&mut self, size: usize, max_segment: usize, tag: Tag) -> Option<Taken> {
        let (k, id) = if max_segment == usize::MAX {
            let (&k, &id) = self.free.range(key(size, 0)..).next()?;
            (k, id)
        } else {
            let fits = |id: u32| {
                let seg = self.nodes[id as usize].segment;
                self.segments
                    .get(&seg)
                    .is_some_and(|s| s.bytes <= max_segment)
            };
            let upper = key(max_segment.saturating_add(1), 0);
            let (&k, &id) = self
                .free
                .range(key(size, 0)..upper)
                .find(|&(_, &id)| fits(id))?;
            (k, id)
        };
        self.free.remove(&k);
        let (bsize, baddr) = ((k >> 64) as usize, k as u64);
        self.free_bytes -= bsize as u64;
        let rem = bsize - size;
        if rem >= self.min_split {
            let (segment, next) = {
                let n = &self.nodes[id as usize];
                (n.segment, n.next)
            };
            let raddr = baddr + size as u64;
            let rest = Node {
                addr: raddr,
                size: rem,
                segment,
                prev: id,
                next,
                tag: None,
                parked: false,
            };
            if let Some(rid) = self.new_node(rest) {
                if next != NIL {
                    self.nodes[next as usize].prev = rid;
                }
                let n = &mut self.nodes[id as usize];
                n.next = rid;
                n.size = size;
                self.free.insert(key(rem, raddr), rid);
                self.free_bytes += rem as u64;
            }
        }
        Some(self.mark_used(id, tag))
    }

    /// The address and size of the used block `id`, or None when `id` is not a used block.
    pub fn used_block(&self, id: u32) -> Option<(u64, usize)> {
        let n = self.nodes.get(id as usize)?;
        n.tag.map(|_| (n.addr, n.size))
    }

    /// Frees the used block `id`: it is parked for exact-size reuse (the oldest parked block
    /// is coalesced when the quick list is full). Returns the block's size and tag, or None
    /// when `id` is not a used block (nothing changes then).
    pub fn free(&mut self, id: u32) -> Option<(usize, Tag)> {
        let node = self.nodes.get_mut(id as usize)?;
        let tag = node.tag.take()?;
        node.parked = true;
        let size = node.size;
        self.free_bytes += size as u64;
        if self.parked_len == PARK_SLOTS {
            let oldest = self.parked[0].1;
            self.parked.copy_within(1.., 0);
            self.parked_len -= 1;
            self.release_parked(oldest);
        }
        self.parked[self.parked_len] = (size, id);
        self.parked_len += 1;
        Some((size, tag))
    }

    /// Coalesces every parked block, so that the index and all figures are exact.
    pub fn settle(&mut self) {
        for i in 0..self.parked_len {
            let id = self.parked[i].1;
            self.release_parked(id);
        }
        self.parked_len = 0;
    }

    /// Takes parked block `id` off the quick list state and coalesces it into the index.
    fn release_parked(&mut self, id: u32) {
        let n = &mut self.nodes[id as usize];
        n.parked = false;
        self.free_bytes -= n.size as u64;
        self.coalesce(id);
    }

    /// Inserts the free block `id` (not in the index, its bytes not in `free_bytes`) into the
    /// index, merged with its free neighbours.
    fn coalesce(&mut self, id: u32) {
        let mut id = id;
        // Merge with the next block.
        let next = self.nodes[id as usize].next;
        if next != NIL && self.nodes[next as usize].is_free() {
            let (naddr, nsize, nnext) = {
                let n = &self.nodes[next as usize];
                (n.addr, n.size, n.next)
            };
            self.free.remove(&key(nsize, naddr));
            self.free_bytes -= nsize as u64;
            let n = &mut self.nodes[id as usize];
            n.size += nsize;
            n.next = nnext;
            if nnext != NIL {
                self.nodes[nnext as usize].prev = id;
            }
            self.vacate(next);
        }
        // Merge into the previous block.
        let prev = self.nodes[id as usize].prev;
        if prev != NIL && self.nodes[prev as usize].is_free() {
            let (size, next) = {
                let n = &self.nodes[id as usize];
                (n.size, n.next)
            };
            let p = &mut self.nodes[prev as usize];
            self.free.remove(&key(p.size, p.addr));
            self.free_bytes -= p.size as u64;
            p.size += size;
            p.next = next;
            if next != NIL {
                self.nodes[next as usize].prev = prev;
            }
            self.vacate(id);
            id = prev;
        }
        let n = &self.nodes[id as usize];
        self.free.insert(key(n.size, n.addr), id);
        self.free_bytes += n.size as u64;
    }

    /// Removes every segment that is one free block and returns them, in address order, for
    /// the caller to release to the backend.
    pub fn take_free_segments(&mut self) -> Vec<Segment> {
        self.settle();
        let idle: Vec<u64> = self.idle_segments().map(|(a, _)| a).collect();
        idle.into_iter()
            .filter_map(|a| self.remove_segment(a))
            .collect()
    }

    /// Removes the largest segment that is one free block (the lowest address among equals)
    /// and returns it, for the caller to release; None when every segment holds a used block.
    pub fn take_largest_free_segment(&mut self) -> Option<Segment> {
        self.settle();
        let (addr, _) = self
            .idle_segments()
            .fold(None, |best: Option<(u64, usize)>, (a, b)| match best {
                Some((_, bb)) if bb >= b => best,
                _ => Some((a, b)),
            })?;
        self.remove_segment(addr)
    }

    /// Segments that are one free block (indexed, not parked): `(addr, bytes)`.
    fn idle_segments(&self) -> impl Iterator<Item = (u64, usize)> + '_ {
        self.segments.iter().filter_map(|(&a, s)| {
            let n = &self.nodes[s.first as usize];
            (n.is_free() && n.next == NIL).then_some((a, s.bytes))
        })
    }

    /// Removes idle segment `addr` (one free block) from the arena.
    fn remove_segment(&mut self, addr: u64) -> Option<Segment> {
        let s = self.segments.remove(&addr)?;
        self.free.remove(&key(s.bytes, addr));
        self.free_bytes -= s.bytes as u64;
        self.reserved -= s.bytes as u64;
        self.vacate(s.first);
        Some(Segment {
            addr,
            bytes: s.bytes,
        })
    }

    /// Removes and returns every segment, used or not (for dropping the allocator, when no
    /// allocation can be live any more).
    pub fn take_all_segments(&mut self) -> Vec<Segment> {
        let out = self
            .segments
            .iter()
            .map(|(&addr, s)| Segment {
                addr,
                bytes: s.bytes,
            })
            .collect();
        let coalesce_first = self.coalesce_first;
        *self = Arena::new(self.min_split, self.kind);
        self.coalesce_first = coalesce_first;
        out
    }

    /// Every segment and its blocks, in address order, adjacent free blocks (parked ones
    /// included) shown as the one block they coalesce into.
    pub fn snapshot(&self) -> Vec<SegmentSnapshot> {
        self.segments
            .iter()
            .map(|(&addr, s)| {
                let mut blocks = Vec::new();
                let mut id = s.first;
                while id != NIL {
                    let n = &self.nodes[id as usize];
                    let (bytes, next) = match n.tag {
                        Some(_) => (n.size, n.next),
                        None => self.run_end(id),
                    };
                    blocks.push(BlockSnapshot {
                        offset: n.addr - addr,
                        bytes: bytes as u64,
                        state: if n.tag.is_some() {
                            BlockState::Used
                        } else {
                            BlockState::Free
                        },
                        category: n.tag.map(|t| t.category),
                        requested: n.tag.map_or(0, |t| t.requested),
                    });
                    id = next;
                }
                SegmentSnapshot {
                    addr,
                    bytes: s.bytes as u64,
                    pool: self.kind,
                    blocks,
                }
            })
            .collect()
    }

    /// The total size of the run of free blocks starting at free block `id`, and the block
    /// after the run.
    fn run_end(&self, id: u32) -> (usize, u32) {
        let (mut size, mut i) = (0, id);
        while i != NIL && self.nodes[i as usize].tag.is_none() {
            size += self.nodes[i as usize].size;
            i = self.nodes[i as usize].next;
        }
        (size, i)
    }
}

#[cfg(test)]
mod tests;
