//! Chrome trace / Perfetto JSON of a memory timeline (open it in ui.perfetto.dev or
//! chrome://tracing).
//!
//! The file is one JSON object `{"traceEvents": [...], "displayTimeUnit": "ns"}` in the Trace
//! Event Format: timestamps `ts` in microseconds, one process (`pid` 1) named after the run.
//! - a counter event (`"ph": "C"`, name `memory`) whenever the live bytes change, with one
//!   argument per category (`parameter`, `optimizer_state`, ...): Perfetto draws one counter
//!   track per category, chrome://tracing stacks them;
//! - one complete event (`"ph": "X"`) per buffer, from its allocation to its free (or the end),
//!   named after the buffer (`conv2.output`), with its bytes, category and allocation id; the
//!   buffers are spread over as few thread lanes as needed so that slices never overlap on one;
//! - an instant event (`"ph": "i"`) at the peak, and one complete event per training step on
//!   lane 0 when step boundaries are known.
//!
//! ```
//! use stax_alloc::{Category, TraceOp};
//! use stax_train::export::perfetto_json;
//! use stax_train::plan::{Timeline, TimelineEvent};
//! let ev = |op, id| TimelineEvent {
//!     op, id, bytes: 64, category: Category::Activation, name: "relu1.mask".into(), t_ns: id * 1000,
//! };
//! let t = Timeline { baseline: [0; 7], events: vec![ev(TraceOp::Alloc, 1), ev(TraceOp::Free, 1)] };
//! let json = perfetto_json(&t, &[], "demo");
//! let events = json["traceEvents"].as_array().unwrap();
//! assert!(events.iter().any(|e| e["ph"] == "X" && e["name"] == "relu1.mask"));
//! assert!(events.iter().any(|e| e["ph"] == "C" && e["args"]["activation"] == 64));
//! ```

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use serde_json::{Value, json};
use stax_alloc::{Category, TraceOp, human_bytes};

use super::io_error;
use crate::TrainError;
use crate::plan::Timeline;

const PID: u64 = 1;

fn us(t_ns: u64) -> f64 {
    t_ns as f64 / 1000.0
}

fn counter(t_ns: u64, live: &[u64; 7]) -> Value {
    let args: serde_json::Map<String, Value> = Category::ALL
        .iter()
        .map(|c| (c.name().to_string(), json!(live[c.index()])))
        .collect();
    json!({"ph": "C", "name": "memory", "pid": PID, "ts": us(t_ns), "args": args})
}

/// A buffer's life: start and end in ns, and its allocation event.
struct Life {
    start: u64,
    end: u64,
    event: usize,
}

/// Lanes (thread ids from 1) so that lives on one lane never overlap.
fn lanes(lives: &[Life]) -> Vec<u64> {
    let mut order: Vec<usize> = (0..lives.len()).collect();
    order.sort_by_key(|&i| (lives[i].start, i));
    let mut ends: Vec<u64> = Vec::new();
    let mut lane = vec![0u64; lives.len()];
    for i in order {
        let l = &lives[i];
        let k = match ends.iter().position(|&e| e <= l.start) {
            Some(k) => k,
            None => {
                ends.push(0);
                ends.len() - 1
            }
        };
        ends[k] = l.end;
        lane[i] = k as u64 + 1;
    }
    lane
}

/// The Trace Event Format JSON of `timeline` (see the module docs). `step_starts` are the
/// events where training steps begin (may be empty); `process` names the process track.
pub fn perfetto_json(timeline: &Timeline, step_starts: &[usize], process: &str) -> Value {
    let events = &timeline.events;
    let end_ns = events.last().map_or(0, |e| e.t_ns);
    let mut out = vec![
        json!({"ph": "M", "name": "process_name", "pid": PID, "args": {"name": process}}),
        json!({"ph": "M", "name": "thread_name", "pid": PID, "tid": 0, "args": {"name": "steps"}}),
    ];
    let mut live = timeline.baseline;
    out.push(counter(events.first().map_or(0, |e| e.t_ns), &live));
    let mut open: HashMap<u64, usize> = HashMap::new();
    let mut lives: Vec<Life> = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let c = &mut live[e.category.index()];
        match e.op {
            TraceOp::Alloc => {
                *c += e.bytes;
                open.insert(e.id, lives.len());
                lives.push(Life {
                    start: e.t_ns,
                    end: end_ns,
                    event: i,
                });
            }
            TraceOp::Free => {
                *c = c.saturating_sub(e.bytes);
                if let Some(k) = open.remove(&e.id) {
                    lives[k].end = e.t_ns;
                }
            }
        }
        out.push(counter(e.t_ns, &live));
    }
    let lane = lanes(&lives);
    let lanes_used = lane.iter().copied().max().unwrap_or(0);
    for tid in 1..=lanes_used {
        let name = format!("buffers {tid}");
        out.push(json!({"ph": "M", "name": "thread_name", "pid": PID, "tid": tid, "args": {"name": name}}));
    }
    for (l, tid) in lives.iter().zip(lane) {
        let e = &events[l.event];
        out.push(json!({
            "ph": "X", "name": e.name, "cat": e.category.name(), "pid": PID, "tid": tid,
            "ts": us(l.start), "dur": us(l.end - l.start),
            "args": {"bytes": e.bytes, "category": e.category.name(), "id": e.id},
        }));
    }
    let peak = timeline.peak();
    if let Some(i) = peak.event {
        let e = &events[i];
        let by: serde_json::Map<String, Value> = Category::ALL
            .iter()
            .map(|c| (c.name().to_string(), json!(peak.by_category[c.index()])))
            .collect();
        out.push(json!({
            "ph": "i", "s": "g", "name": format!("peak {} ({})", human_bytes(peak.bytes), e.name),
            "pid": PID, "tid": 0, "ts": us(e.t_ns), "args": {"bytes": peak.bytes, "at_peak": by},
        }));
    }
    for (k, &s) in step_starts.iter().enumerate() {
        let start = events.get(s).map_or(end_ns, |e| e.t_ns);
        let stop = step_starts
            .get(k + 1)
            .and_then(|&n| events.get(n))
            .map_or(end_ns, |e| e.t_ns);
        out.push(json!({
            "ph": "X", "name": format!("step {}", k + 1), "pid": PID, "tid": 0,
            "ts": us(start), "dur": us(stop.saturating_sub(start)),
        }));
    }
    json!({"traceEvents": out, "displayTimeUnit": "ns"})
}

/// Writes [`perfetto_json`] to `path`.
///
/// # Errors
/// [`TrainError::Io`] when the file cannot be written.
pub fn write_perfetto(
    timeline: &Timeline,
    step_starts: &[usize],
    process: &str,
    path: &Path,
) -> Result<(), TrainError> {
    let json = perfetto_json(timeline, step_starts, process);
    let file = std::fs::File::create(path).map_err(|source| TrainError::Io {
        op: "write_perfetto",
        path: path.to_path_buf(),
        source,
    })?;
    let mut w = std::io::BufWriter::new(file);
    serde_json::to_writer(&mut w, &json).map_err(|e| io_error("write_perfetto", path, e))?;
    w.flush().map_err(|e| io_error("write_perfetto", path, e))
}
