//! Workspace that costs no peak (issue 12): how many bytes each workspace buffer, and each op
//! that allocates workspace, could grow by while the step stays at its planned peak, and the
//! rule that gives them to the target ([`MemoryPlan::allot_headroom`]).

use super::{MemoryPlan, PlannedBuffer};
use crate::TrainError;
use stax_alloc::Category;
use stax_tensor::{Backend, OpDesc};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

impl MemoryPlan {
    /// Requested bytes live (all categories) after each step event.
    fn live_totals(&self) -> Vec<u64> {
        self.timeline
            .live_by_category()
            .iter()
            .map(|live| live.iter().sum())
            .collect()
    }

    /// The step's peak less the most bytes live over `events` (0 where they reach the peak).
    fn free_below_peak(&self, totals: &[u64], events: Range<usize>) -> Option<u64> {
        let most = totals.get(events)?.iter().max()?;
        Some(self.peak.bytes.saturating_sub(*most))
    }

    /// Each workspace buffer of the step with the bytes it could grow by without raising the
    /// step's peak: the peak less the most bytes live from its allocation to its free (all
    /// categories, requested bytes), in step order. 0 marks a buffer live at the peak; where
    /// it is positive, that pass could take a larger workspace (a faster algorithm, a larger
    /// chunk) at no cost in peak. Growing one buffer by its headroom leaves the peak as it
    /// is; one byte more raises it by one.
    pub fn workspace_headroom(&self) -> Vec<(&PlannedBuffer, u64)> {
        let totals = self.live_totals();
        self.buffers
            .iter()
            .filter(|b| b.category == Category::Workspace)
            .filter_map(|b| {
                let alloc = b.alloc?;
                let free = self.free_below_peak(&totals, alloc..b.free.unwrap_or(totals.len()))?;
                Some((b, free))
            })
            .collect()
    }

    /// Each op of the step that allocates workspace, with the most bytes its workspace could
    /// grow by at every call without raising the step's peak: over each call, the peak less
    /// the most bytes live from its first workspace allocation to its last free; the least
    /// over its calls. In order of first appearance. What [`MemoryPlan::allot_headroom`]
    /// gives the target ([`Backend::allot_workspace`]).
    pub fn op_headroom(&self) -> Vec<(OpDesc, u64)> {
        let totals = self.live_totals();
        let mut least: HashMap<usize, u64> = HashMap::new();
        for (op, events) in &self.op_spans {
            let Some(free) = self.free_below_peak(&totals, events.clone()) else {
                continue;
            };
            let entry = least.entry(*op).or_insert(free);
            *entry = (*entry).min(free);
        }
        let mut ops: Vec<_> = least.into_iter().collect();
        ops.sort_unstable_by_key(|(op, _)| *op);
        ops.into_iter()
            .filter_map(|(op, free)| Some((*self.ops.get(op)?, free)))
            .collect()
    }

    /// The headroom rule: gives each op of this plan its [`MemoryPlan::op_headroom`] on
    /// `target` ([`Backend::allot_workspace`]: on CUDA a cuDNN convolution pass is searched
    /// again within its workspace plus that headroom, where a faster algorithm needs more;
    /// an explicit workspace limit still caps it), so that a plan made afterwards has the
    /// same peak and faster passes. Plan again afterwards: this plan's schedules are the old
    /// ones. Returns how many ops changed schedule.
    ///
    /// # Errors
    /// The target's errors (its algorithm searches).
    pub fn allot_headroom(&self, target: &Arc<dyn Backend>) -> Result<usize, TrainError> {
        let headroom: Vec<(OpDesc, usize)> = self
            .op_headroom()
            .into_iter()
            .map(|(op, free)| (op, usize::try_from(free).unwrap_or(usize::MAX)))
            .collect();
        Ok(target.allot_workspace(&headroom)?)
    }
}
