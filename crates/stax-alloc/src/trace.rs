//! Traces: every allocation and free, recorded as JSON lines and replayed against any strategy
//! and backend. This is how allocators are benchmarked and compared.
//!
//! ```
//! use stax_alloc::{replay, Allocator, Category, SimMemory, Strategy, Trace, TraceBuilder};
//! use std::sync::Arc;
//! let mut b = TraceBuilder::new();
//! let x = b.alloc(3 << 20, Category::Activation);
//! let w = b.alloc(4096, Category::Workspace);
//! b.free(w);
//! b.free(x);
//! let trace = b.finish();
//! let mut jsonl = Vec::new();
//! trace.write_jsonl(&mut jsonl)?;
//! let back = Trace::read_jsonl(&jsonl[..])?;
//! assert_eq!(back, trace);
//! let alloc = Allocator::new(Arc::new(SimMemory::new(1 << 30, 2 << 20)), Strategy::Caching)?;
//! let report = replay(&back, &alloc)?;
//! assert_eq!(report.peak_requested, (3 << 20) + 4096);
//! assert_eq!(report.placements.len(), 2);
//! # Ok::<(), stax_alloc::AllocError>(())
//! ```

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::sync::Arc;
use std::time::Instant;

use crate::{AllocError, Allocation, Allocator, Category, Tag};

/// Whether an event allocates or frees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceOp {
    /// An allocation.
    Alloc,
    /// A free of an earlier allocation with the same id.
    Free,
}

/// One allocation or free. One JSON object per line in the JSON-lines form.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TraceEvent {
    /// Alloc or free.
    pub op: TraceOp,
    /// Allocation id; a free names the id of its allocation.
    pub id: u64,
    /// Requested bytes.
    pub bytes: u64,
    /// Category of the allocation.
    pub category: Category,
    /// Nanoseconds since the trace started.
    pub t_ns: u64,
    /// Stream the allocation was made on.
    pub stream: u32,
    /// Address handed out to the allocation (its start; the same on its free event), so that
    /// a trace event can be tied to the tensor that owns the buffer. 0 in synthetic traces
    /// ([`TraceBuilder`]) and in traces written before the field existed; not written when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub addr: u64,
    /// The allocation's name, `scope/role` ([`crate::Allocation::name`]); empty in synthetic
    /// traces and in traces written before the field existed; not written when empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// For a tensor's buffer, its shape ([`Allocator::allocate_tensor`]; alloc events only);
    /// None for workspace and in synthetic traces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<Vec<usize>>,
    /// For a tensor's buffer, its element type (`f32`); None otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
}

fn is_zero(x: &u64) -> bool {
    *x == 0
}

/// Something that happened between events of a recorded trace (not an allocation or a free).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mark {
    /// Training step `step` starts before event `at` ([`Allocator::mark_step`]).
    Step {
        /// Index of the first event of the step.
        at: usize,
        /// The step's number (from 1).
        step: u64,
    },
    /// From event `at` on, allocation `id` also plays the role `name`
    /// ([`crate::Allocation::note_role`]: a buffer written over in place).
    Role {
        /// Index of the next event when the role was noted.
        at: usize,
        /// The allocation.
        id: u64,
        /// Its new name, `scope/role`.
        name: String,
    },
}

/// A sequence of allocation and free events, with the marks recorded between them.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Trace {
    /// Events in the order they happened.
    pub events: Vec<TraceEvent>,
    /// Step starts and role changes, in order (recorded traces only; not part of the
    /// JSON-lines form, which holds the events alone).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub marks: Vec<Mark>,
}

impl Trace {
    /// Writes one JSON object per line.
    ///
    /// # Errors
    /// [`AllocError::Trace`] when writing fails.
    pub fn write_jsonl<W: Write>(&self, mut w: W) -> Result<(), AllocError> {
        for (i, e) in self.events.iter().enumerate() {
            let err = |m: String| AllocError::Trace {
                op: "write",
                line: i + 1,
                message: m,
            };
            serde_json::to_writer(&mut w, e).map_err(|e| err(e.to_string()))?;
            w.write_all(b"\n").map_err(|e| err(e.to_string()))?;
        }
        w.flush().map_err(|e| AllocError::Trace {
            op: "write",
            line: 0,
            message: e.to_string(),
        })
    }

    /// Reads JSON lines as written by [`write_jsonl`](Trace::write_jsonl); blank lines are
    /// skipped.
    ///
    /// # Errors
    /// [`AllocError::Trace`] naming the line that failed to read or parse.
    pub fn read_jsonl<R: BufRead>(r: R) -> Result<Trace, AllocError> {
        let mut events = Vec::new();
        for (i, line) in r.lines().enumerate() {
            let err = |m: String| AllocError::Trace {
                op: "read",
                line: i + 1,
                message: m,
            };
            let line = line.map_err(|e| err(e.to_string()))?;
            if line.trim().is_empty() {
                continue;
            }
            events.push(serde_json::from_str(&line).map_err(|e| err(e.to_string()))?);
        }
        Ok(Trace {
            events,
            marks: Vec::new(),
        })
    }

    /// The peak of live requested bytes over the trace (what an ideal allocator would need),
    /// `u64::MAX` where it exceeds that (summed in `u128`, so later frees still count).
    pub fn peak_requested(&self) -> u64 {
        let (mut live, mut peak) = (0u128, 0u128);
        for e in &self.events {
            match e.op {
                TraceOp::Alloc => live += u128::from(e.bytes),
                TraceOp::Free => live = live.saturating_sub(u128::from(e.bytes)),
            }
            peak = peak.max(live);
        }
        u64::try_from(peak).unwrap_or(u64::MAX)
    }
}

/// Builds synthetic traces: ids are assigned in order, time advances 1 us per event.
#[derive(Debug, Default)]
pub struct TraceBuilder {
    trace: Trace,
    live: HashMap<u64, (u64, Category)>,
    next_id: u64,
}

impl TraceBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends an allocation of `bytes` bytes and returns its id.
    pub fn alloc(&mut self, bytes: u64, category: Category) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.live.insert(id, (bytes, category));
        self.push(TraceOp::Alloc, id, bytes, category);
        id
    }

    /// Appends the free of allocation `id`; an unknown or already freed id is ignored.
    pub fn free(&mut self, id: u64) {
        if let Some((bytes, category)) = self.live.remove(&id) {
            self.push(TraceOp::Free, id, bytes, category);
        }
    }

    fn push(&mut self, op: TraceOp, id: u64, bytes: u64, category: Category) {
        let t_ns = self.trace.events.len() as u64 * 1_000;
        self.trace.events.push(TraceEvent {
            op,
            id,
            bytes,
            category,
            t_ns,
            stream: 0,
            addr: 0,
            name: String::new(),
            shape: None,
            dtype: None,
        });
    }

    /// The trace built so far (allocations still live stay live).
    pub fn finish(self) -> Trace {
        self.trace
    }
}

/// What the recorder keeps of one allocation (for its alloc and its free event).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Recorded<'a> {
    pub id: u64,
    pub bytes: u64,
    pub category: Category,
    pub stream: u32,
    pub addr: u64,
    pub name: &'a crate::Name,
    pub layout: Option<(&'a [usize], &'static str)>,
}

/// Records events for [`Allocator::start_trace`].
#[derive(Debug)]
pub(crate) struct Recorder {
    start: Instant,
    events: Vec<TraceEvent>,
    marks: Vec<Mark>,
}

impl Recorder {
    pub fn new() -> Self {
        Recorder {
            start: Instant::now(),
            events: Vec::new(),
            marks: Vec::new(),
        }
    }

    /// Records the mark `make(index of the next event)`.
    pub fn mark(&mut self, make: impl FnOnce(usize) -> Mark) {
        self.marks.push(make(self.events.len()));
    }

    pub fn record(&mut self, op: TraceOp, a: Recorded<'_>) {
        let t_ns = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.events.push(TraceEvent {
            op,
            id: a.id,
            bytes: a.bytes,
            category: a.category,
            t_ns,
            stream: a.stream,
            addr: a.addr,
            name: a.name.to_string(),
            shape: a.layout.map(|(s, _)| s.to_vec()),
            dtype: a.layout.map(|(_, d)| d.to_string()),
        });
    }

    pub fn finish(self) -> Trace {
        Trace {
            events: self.events,
            marks: self.marks,
        }
    }
}

/// Where one allocation of a replayed trace was placed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Placement {
    /// The trace's allocation id.
    pub id: u64,
    /// Address handed out.
    pub addr: u64,
    /// Offset in bytes from its segment's start.
    pub offset: u64,
    /// Requested bytes.
    pub bytes: u64,
    /// Allocated (block) bytes.
    pub allocated: u64,
}

/// What a replay did. Peaks are over the replay (the allocator's peaks are reset at its
/// start); backend calls are those made during the replay. Sizes in bytes.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ReplayReport {
    /// One entry per allocation event, in trace order.
    pub placements: Vec<Placement>,
    /// Peak of live requested bytes.
    pub peak_requested: u64,
    /// Peak of live allocated bytes.
    pub peak_allocated: u64,
    /// Peak of reserved bytes.
    pub peak_reserved: u64,
    /// Reserved bytes after the replay (and after freeing what the trace left live).
    pub reserved_at_end: u64,
    /// Backend reserve calls during the replay.
    pub backend_reserves: u64,
    /// Backend release calls during the replay.
    pub backend_releases: u64,
    /// Virtual-memory map calls during the replay (`expandable`).
    pub backend_maps: u64,
    /// Virtual-memory unmap calls during the replay (`expandable`).
    pub backend_unmaps: u64,
    /// Allocations the trace never freed (freed by the replay at its end).
    pub live_at_end: u64,
}

impl ReplayReport {
    /// Backend calls (reserves + releases + maps + unmaps) during the replay.
    pub fn backend_calls(&self) -> u64 {
        self.backend_reserves + self.backend_releases + self.backend_maps + self.backend_unmaps
    }

    /// `peak_reserved / peak_requested` (1.0 is perfect; 0 for an empty trace).
    pub fn overhead(&self) -> f64 {
        if self.peak_requested == 0 {
            0.0
        } else {
            self.peak_reserved as f64 / self.peak_requested as f64
        }
    }
}

/// The scope and tag of a replayed allocation: its recorded name's (scope `2.conv` and role
/// `workspace` for `2.conv/workspace`), so that an out-of-memory in a replay names the buffer;
/// the category alone for an unnamed event (or past the roles [`crate::name`] interns).
fn replayed_name(e: &TraceEvent) -> (Option<&str>, Tag) {
    let (scope, role) = e.name.rsplit_once('/').unwrap_or(("", &e.name));
    match crate::name::interned_role(role).filter(|r| !r.is_empty()) {
        Some(role) => (
            (!scope.is_empty()).then_some(scope),
            Tag::new(e.category, role),
        ),
        None => (None, Tag::from(e.category)),
    }
}

/// Replays `trace` against `allocator`: every alloc event allocates (same bytes, category and
/// name), every free event drops the matching allocation; what the trace leaves live is freed
/// at the end. The allocator is coalesced first ([`Allocator::coalesce`]), so a replay on a warm
/// allocator starts from a state set by its live blocks alone. Placement is deterministic: the
/// same trace on a fresh allocator of the same strategy and backend gives the same offsets, the
/// offsets the recorded run got from an allocator in that state.
///
/// # Errors
/// The allocator's error when an allocation fails (e.g. [`AllocError::OutOfMemory`]);
/// [`AllocError::Trace`] for a free of an unknown id or a duplicate id.
pub fn replay(trace: &Trace, allocator: &Arc<Allocator>) -> Result<ReplayReport, AllocError> {
    allocator.coalesce();
    allocator.reset_peak();
    let before = allocator.stats();
    let mut live: HashMap<u64, Allocation> = HashMap::new();
    let mut placements = Vec::new();
    for (i, e) in trace.events.iter().enumerate() {
        let err = |m: String| AllocError::Trace {
            op: "replay",
            line: i + 1,
            message: m,
        };
        match e.op {
            TraceOp::Alloc => {
                let bytes = usize::try_from(e.bytes).map_err(|_| err("size overflows".into()))?;
                let (scope, tag) = replayed_name(e);
                let _scope = scope.map(|s| allocator.scope(s));
                let a = allocator.allocate_on(bytes, tag, e.stream)?;
                placements.push(Placement {
                    id: e.id,
                    addr: a.addr(),
                    offset: a.offset(),
                    bytes: e.bytes,
                    allocated: a.allocated_bytes() as u64,
                });
                if live.insert(e.id, a).is_some() {
                    return Err(err(format!("id {} allocated twice", e.id)));
                }
            }
            TraceOp::Free => {
                if live.remove(&e.id).is_none() {
                    return Err(err(format!("free of unknown id {}", e.id)));
                }
            }
        }
    }
    let live_at_end = live.len() as u64;
    let peak = allocator.stats();
    drop(live);
    let after = allocator.stats();
    Ok(ReplayReport {
        placements,
        peak_requested: peak.peak_requested,
        peak_allocated: peak.peak_allocated,
        peak_reserved: peak.peak_reserved,
        reserved_at_end: after.reserved,
        backend_reserves: after.backend_reserves - before.backend_reserves,
        backend_releases: after.backend_releases - before.backend_releases,
        backend_maps: after.backend_maps - before.backend_maps,
        backend_unmaps: after.backend_unmaps - before.backend_unmaps,
        live_at_end,
    })
}
