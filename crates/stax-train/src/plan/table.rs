//! The plan as a table for people: one row per buffer (name, shape, dtype, bytes, category,
//! live range in step events), then the persistent bytes, the peak and where it falls.

use std::fmt;

use stax_alloc::{Category, human_bytes};

use super::{MemoryPlan, PlannedBuffer};
use crate::report::{group, short};

/// `"parameter 1.31 GB, optimizer_state 2.62 GB"`: the non-zero categories of `bytes`.
pub(crate) fn by_category(bytes: &[u64; 7]) -> String {
    Category::ALL
        .iter()
        .filter(|c| bytes[c.index()] > 0)
        .map(|c| format!("{c} {}", short(bytes[c.index()])))
        .collect::<Vec<_>>()
        .join(", ")
}

fn live_range(b: &PlannedBuffer) -> String {
    match (b.alloc, b.free) {
        (None, None) => "persistent".into(),
        (Some(a), Some(f)) => format!("{a}-{f}"),
        (Some(a), None) => format!("{a}-end"),
        (None, Some(f)) => format!("start-{f}"),
    }
}

impl fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "memory plan: {}", self.model)?;
        writeln!(
            f,
            "  on {}, input {} f32, labels {} f32, {} step events (allocations and frees); {}",
            self.device,
            self.input,
            self.labels,
            self.timeline.events.len(),
            match self.feed {
                super::Feed::Placed => "each batch placed before its step".to_string(),
                super::Feed::Prefetched =>
                    "the next batch prefetched: two batches live".to_string(),
                super::Feed::Accumulated(n) => format!("{n} micro-batches accumulated, all placed"),
            }
        )?;
        if let Some(comm) = &self.comm {
            write!(f, "{comm}")?;
        }
        writeln!(
            f,
            "  {:<22} {:<22} {:<5} {:>16}  {:<16} {:<11} later roles",
            "name", "shape", "dtype", "bytes", "category", "live"
        )?;
        for b in &self.buffers {
            let shape = b.shape.as_ref().map_or("-".into(), |s| s.to_string());
            let dtype = b.dtype.map_or("-".into(), |d| d.to_string());
            writeln!(
                f,
                "  {:<22} {:<22} {:<5} {:>16}  {:<16} {:<11} {}",
                b.name,
                shape,
                dtype,
                group(b.bytes),
                b.category,
                live_range(b),
                b.reused_as.join(", ")
            )?;
        }
        writeln!(
            f,
            "persistent {}: {}",
            human_bytes(self.persistent_bytes()),
            by_category(&self.timeline.baseline)
        )?;
        write!(f, "peak       {}", human_bytes(self.peak.bytes))?;
        if let Some(i) = self.peak.event {
            let phase = self
                .phase_at(i)
                .map_or(String::new(), |p| format!(" ({p})"));
            let name = self.allocated_at(i).map_or("?", |b| b.name.as_str());
            write!(
                f,
                " at step event {i} of {}{phase}, allocating {name}",
                self.timeline.events.len()
            )?;
        }
        writeln!(f)?;
        writeln!(f, "  at the peak: {}", by_category(&self.peak.by_category))?;
        writeln!(
            f,
            "  the step adds {} to the persistent bytes",
            human_bytes(self.peak.bytes - self.persistent_bytes())
        )?;
        headroom(f, &self.workspace_headroom())?;
        if let Some(b) = self.largest() {
            write!(f, "largest buffer: {}, {}", b.name, human_bytes(b.bytes))?;
        }
        Ok(())
    }
}

/// One line on [`MemoryPlan::workspace_headroom`]: how many workspace buffers there are, which
/// are live at the peak, and the least and most the others could grow by.
fn headroom(f: &mut fmt::Formatter<'_>, rows: &[(&PlannedBuffer, u64)]) -> fmt::Result {
    if rows.is_empty() {
        return Ok(());
    }
    let at_peak: Vec<&str> = rows
        .iter()
        .filter(|(_, h)| *h == 0)
        .map(|(b, _)| b.name.as_str())
        .collect();
    let free = rows.iter().map(|(_, h)| *h).filter(|&h| h > 0);
    let (least, most) = (free.clone().min(), free.max());
    write!(f, "  workspace headroom: {} buffers", rows.len())?;
    if !at_peak.is_empty() {
        write!(
            f,
            ", {} at the peak ({})",
            at_peak.len(),
            at_peak.join(", ")
        )?;
    }
    if let (Some(least), Some(most)) = (least, most) {
        write!(
            f,
            "; the others could grow by {} to {} without raising it",
            human_bytes(least),
            human_bytes(most)
        )?;
    }
    writeln!(f)
}
