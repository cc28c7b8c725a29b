//! Timelines: named allocation and free events with the live bytes per category they imply.
//!
//! A [`Timeline`] is what the exporters draw and what the plan's peak is computed from: a
//! baseline (bytes live per category before the first event) and the events in order. The
//! same rule as the allocator's finds the peak: the highest total of live requested bytes,
//! reached at an allocation, the *last* such allocation when it is reached more than once (the
//! allocator updates its peak on `>=`), so the per-category bytes at the peak agree to the byte
//! with [`stax_alloc::Stats::peak_by_category`].
//!
//! [`NamedTrace::of`] reads a trace recorded while training (on any backend) as a timeline:
//! every event carries its buffer's name from the allocation itself, and the trainer's step
//! marks say where each step starts.
//!
//! ```
//! use stax_alloc::{Category, TraceOp};
//! use stax_train::plan::{Timeline, TimelineEvent};
//! let ev = |op, id, bytes, category| TimelineEvent {
//!     op, id, bytes, category, name: format!("b{id}"), t_ns: id * 1000,
//! };
//! let mut baseline = [0; 7];
//! baseline[Category::Parameter.index()] = 100;
//! let t = Timeline {
//!     baseline,
//!     events: vec![
//!         ev(TraceOp::Alloc, 1, 50, Category::Activation),
//!         ev(TraceOp::Alloc, 2, 20, Category::Workspace),
//!         ev(TraceOp::Free, 2, 20, Category::Workspace),
//!     ],
//! };
//! let peak = t.peak();
//! assert_eq!((peak.bytes, peak.event), (170, Some(1)));
//! assert_eq!(peak.by_category[Category::Workspace.index()], 20);
//! ```

use serde::Serialize;
use stax_alloc::{Category, Mark, Trace, TraceEvent, TraceOp};

/// One allocation or free, with the name of its buffer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TimelineEvent {
    /// Alloc or free.
    pub op: TraceOp,
    /// Allocation id (a free names its allocation's id).
    pub id: u64,
    /// Requested bytes of the buffer.
    pub bytes: u64,
    /// Category of the buffer.
    pub category: Category,
    /// Name of the buffer, e.g. `conv2.output`.
    pub name: String,
    /// Time of the event in ns (since the trace started; a plan counts 1 us per event).
    pub t_ns: u64,
}

/// Named events and the bytes live per category before the first of them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Timeline {
    /// Requested bytes live per category before the first event (indexed by
    /// [`Category::index`]).
    pub baseline: [u64; 7],
    /// The events, in the order they happened.
    pub events: Vec<TimelineEvent>,
}

/// The highest point of a timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Peak {
    /// Index of the allocation event that reached it last; `None` when no allocation rose
    /// above the baseline.
    pub event: Option<usize>,
    /// Requested bytes live at the peak (all categories).
    pub bytes: u64,
    /// Requested bytes live per category at the peak.
    pub by_category: [u64; 7],
}

impl Timeline {
    /// Requested bytes live per category after each event (one entry per event).
    pub fn live_by_category(&self) -> Vec<[u64; 7]> {
        let mut live = self.baseline;
        self.events
            .iter()
            .map(|e| {
                let c = &mut live[e.category.index()];
                match e.op {
                    TraceOp::Alloc => *c += e.bytes,
                    TraceOp::Free => *c = c.saturating_sub(e.bytes),
                }
                live
            })
            .collect()
    }

    /// The peak, by the allocator's rule (see the module docs).
    pub fn peak(&self) -> Peak {
        let mut peak = Peak {
            event: None,
            bytes: self.baseline.iter().sum(),
            by_category: self.baseline,
        };
        for (i, (e, live)) in self.events.iter().zip(self.live_by_category()).enumerate() {
            let total: u64 = live.iter().sum();
            if e.op == TraceOp::Alloc && total >= peak.bytes {
                peak = Peak {
                    event: Some(i),
                    bytes: total,
                    by_category: live,
                };
            }
        }
        peak
    }
}

/// A recorded trace as a timeline (see [`NamedTrace::of`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamedTrace {
    /// The trace as a timeline with baseline zero, each event named after its buffer.
    pub timeline: Timeline,
    /// Index of the first event of each training step (the trainer marks each step's start:
    /// [`stax_alloc::Allocator::mark_step`]).
    pub step_starts: Vec<usize>,
}

impl NamedTrace {
    /// The timeline of a recorded trace: events named as their allocations were
    /// ([`stax_alloc::Name`]; the category for unnamed ones), steps where the trace marks them.
    pub fn of(trace: &Trace) -> NamedTrace {
        let events = trace
            .events
            .iter()
            .map(|e| TimelineEvent::of(e, e.t_ns))
            .collect();
        let step_starts = trace
            .marks
            .iter()
            .filter_map(|m| match m {
                Mark::Step { at, .. } => Some(*at),
                Mark::Role { .. } => None,
            })
            .collect();
        NamedTrace {
            timeline: Timeline {
                baseline: [0; 7],
                events,
            },
            step_starts,
        }
    }
}

/// The name of a trace event's buffer: its allocation's name, or its category's when it has
/// none (a synthetic trace).
pub(crate) fn event_name(e: &TraceEvent) -> String {
    if e.name.is_empty() {
        e.category.to_string()
    } else {
        e.name.clone()
    }
}

impl TimelineEvent {
    /// The timeline event of trace event `e`, at time `t_ns`.
    pub fn of(e: &TraceEvent, t_ns: u64) -> TimelineEvent {
        TimelineEvent {
            op: e.op,
            id: e.id,
            bytes: e.bytes,
            category: e.category,
            name: event_name(e),
            t_ns,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stax_alloc::{Allocator, Category, SimMemory, Strategy, Tag};
    use std::sync::Arc;

    #[test]
    fn a_recorded_trace_reads_with_names_and_steps() {
        let alloc = Allocator::new(
            Arc::new(SimMemory::new(64 << 20, 2 << 20)),
            Strategy::Caching,
        )
        .unwrap();
        alloc.start_trace();
        let w = alloc
            .allocate(40, Tag::new(Category::Parameter, "w"))
            .unwrap();
        for step in 1..=2 {
            alloc.mark_step(step);
            let _s = alloc.scope("0.dense");
            let y = alloc
                .allocate(16, Tag::new(Category::Activation, "output"))
                .unwrap();
            drop(alloc.allocate(4, Category::Workspace).unwrap());
            drop(y);
        }
        drop(w);
        let named = NamedTrace::of(&alloc.stop_trace());
        assert_eq!(named.step_starts, vec![1, 5]);
        let names: Vec<&str> = named
            .timeline
            .events
            .iter()
            .map(|e| e.name.as_str())
            .collect();
        assert_eq!(
            names[..5],
            [
                "w",
                "0.dense/output",
                "0.dense/workspace",
                "0.dense/workspace",
                "0.dense/output"
            ]
        );
        assert_eq!(named.timeline.peak().bytes, 60);
    }
}
