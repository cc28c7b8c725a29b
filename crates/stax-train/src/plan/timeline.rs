//! Timelines: named allocation and free events with the live bytes per category they imply.
//!
//! A [`Timeline`] is what the exporters draw and what the plan's peak is computed from: a
//! baseline (bytes live per category before the first event) and the events in order. The
//! same rule as the allocator's finds the peak: the highest total of live requested bytes,
//! reached at an allocation, the *last* such allocation when it is reached more than once (the
//! allocator updates its peak on `>=`), so the per-category bytes at the peak agree to the byte
//! with [`stax_alloc::Stats::peak_by_category`].
//!
//! [`MemoryPlan::name_trace`](crate::plan::MemoryPlan::name_trace) names the events of a trace
//! recorded while training (on any backend) by matching them against a plan's allocation
//! sequence.
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

use std::collections::HashMap;

use serde::Serialize;
use stax_alloc::{Category, Trace, TraceOp};

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

/// Names for the events of a recorded trace (see
/// [`MemoryPlan::name_trace`](crate::plan::MemoryPlan::name_trace)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamedTrace {
    /// The trace as a timeline with baseline zero: names from the plan where the events match
    /// it, `{layer}.workspace` for extra workspace buffers, the category name otherwise.
    pub timeline: Timeline,
    /// Index of the first event of each training step found (the batch's placement).
    pub step_starts: Vec<usize>,
}

/// One allocation of a plan's sequence: what a recorded allocation must be to take its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Expected {
    pub category: Category,
    pub bytes: u64,
    pub name: String,
}

/// The layer part of a buffer name: `conv2` for `conv2.output`.
pub(crate) fn layer_of(name: &str) -> &str {
    name.split('.').next().unwrap_or(name)
}

/// Names a trace recorded from the start of training: `setup` is the plan's allocations made
/// by `Trainer::new` (parameters, Adam's moments; with prefetching, the first batch), `cycle`
/// those of one loop iteration (a batch's placement, then the step). Recorded allocations are
/// matched in order by category and bytes; a step may also start without its placement (the
/// last step of a prefetched loop, a batch stepped twice). A workspace allocation that matches
/// nothing is named after the layer of the last match (backends such as CUDA make several
/// workspace buffers where the plan holds one), and anything else unmatched (evaluation, a
/// batch of another size) by its category. Frees take the name of their allocation.
pub(crate) fn name_trace(trace: &Trace, setup: &[Expected], cycle: &[Expected]) -> NamedTrace {
    let pattern: Vec<&Expected> = setup.iter().chain(cycle).collect();
    let restart = setup.len();
    let placement = cycle
        .iter()
        .take_while(|x| x.category == Category::Input)
        .count();
    let step_at = restart + placement;
    let mut pos = 0usize;
    let mut names: HashMap<u64, String> = HashMap::new();
    let mut out = NamedTrace::default();
    let mut layer = String::from("setup");
    let fits =
        |x: &Expected, category: Category, bytes: u64| x.category == category && x.bytes == bytes;
    for (i, e) in trace.events.iter().enumerate() {
        let name = match e.op {
            TraceOp::Free => names
                .remove(&e.id)
                .unwrap_or_else(|| e.category.to_string()),
            TraceOp::Alloc => {
                if e.category != Category::Workspace {
                    while pattern
                        .get(pos)
                        .is_some_and(|x| x.category == Category::Workspace)
                    {
                        pos += 1;
                    }
                }
                let at = |p: usize| pattern.get(p).filter(|x| fits(x, e.category, e.bytes));
                let hit = match at(pos) {
                    Some(x) => Some((pos, x)),
                    None => at(restart)
                        .map(|x| (restart, x))
                        .or_else(|| at(step_at).map(|x| (step_at, x))),
                };
                let name = match hit {
                    Some((p, x)) => {
                        let unplaced = p == step_at && pos != step_at && placement > 0;
                        if (p == restart || unplaced) && !cycle.is_empty() {
                            out.step_starts.push(i);
                        }
                        pos = if p + 1 == pattern.len() {
                            restart
                        } else {
                            p + 1
                        };
                        layer = layer_of(&x.name).to_string();
                        x.name.clone()
                    }
                    None if e.category == Category::Workspace => format!("{layer}.workspace"),
                    None => e.category.to_string(),
                };
                names.insert(e.id, name.clone());
                name
            }
        };
        out.timeline.events.push(TimelineEvent {
            op: e.op,
            id: e.id,
            bytes: e.bytes,
            category: e.category,
            name,
            t_ns: e.t_ns,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use stax_alloc::TraceBuilder;

    fn exp(category: Category, bytes: u64, name: &str) -> Expected {
        Expected {
            category,
            bytes,
            name: name.into(),
        }
    }

    #[test]
    fn names_steps_and_extra_workspace() {
        let setup = [exp(Category::Parameter, 40, "dense1.w")];
        let cycle = [
            exp(Category::Input, 8, "input.images"),
            exp(Category::Activation, 16, "dense1.output"),
            exp(Category::Workspace, 4, "dense1.workspace"),
            exp(Category::Gradient, 40, "dense1.dw"),
        ];
        let mut b = TraceBuilder::new();
        b.alloc(40, Category::Parameter);
        for _ in 0..2 {
            let x = b.alloc(8, Category::Input);
            let y = b.alloc(16, Category::Activation);
            let w1 = b.alloc(3, Category::Workspace); // two buffers where the plan has one
            let w2 = b.alloc(1, Category::Workspace);
            b.free(w1);
            b.free(w2);
            let g = b.alloc(40, Category::Gradient);
            b.free(g);
            b.free(y);
            b.free(x);
        }
        b.alloc(99, Category::Activation); // evaluation: unmatched
        let named = name_trace(&b.finish(), &setup, &cycle);
        let names: Vec<&str> = named
            .timeline
            .events
            .iter()
            .map(|e| e.name.as_str())
            .collect();
        assert_eq!(named.step_starts, vec![1, 11]);
        assert_eq!(names[0], "dense1.w");
        let step = [
            "input.images",
            "dense1.output",
            "dense1.workspace",
            "dense1.workspace",
        ];
        assert_eq!(&names[1..5], step);
        assert_eq!(names[7], "dense1.dw");
        assert_eq!(names[10], "input.images"); // the free of x
        assert_eq!(*names.last().unwrap(), "activation");
    }

    #[test]
    fn a_step_without_its_placement_starts_a_step() {
        // A prefetched loop: the first batch belongs to the set-up, each cycle places the next
        // batch before the step, and the last step has no batch left to place.
        let setup = [
            exp(Category::Parameter, 40, "dense1.w"),
            exp(Category::Input, 8, "input.images"),
        ];
        let cycle = [
            exp(Category::Input, 8, "input.images"),
            exp(Category::Activation, 16, "dense1.output"),
        ];
        let mut b = TraceBuilder::new();
        b.alloc(40, Category::Parameter);
        b.alloc(8, Category::Input);
        for last in [false, false, true] {
            if !last {
                b.alloc(8, Category::Input);
            }
            let y = b.alloc(16, Category::Activation);
            b.free(y);
        }
        let named = name_trace(&b.finish(), &setup, &cycle);
        assert_eq!(named.step_starts, vec![2, 5, 8]);
        let last = &named.timeline.events[8];
        assert_eq!(
            (last.op, last.name.as_str()),
            (TraceOp::Alloc, "dense1.output")
        );
    }
}
