//! Workspace that costs no peak (issue 12): how many bytes each workspace buffer, and each op
//! that allocates workspace, could grow by while the step stays at its planned peak, and the
//! rule that gives them to the target ([`MemoryPlan::allot_headroom`]).

use super::{Feed, MemoryPlan, PlannedBuffer, default_budget};
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

    /// Gives each op of this plan its [`MemoryPlan::op_headroom`] on `target`
    /// ([`Backend::allot_workspace`]: on CUDA a cuDNN convolution pass is searched again
    /// within its workspace plus that headroom, where a faster algorithm needs more; an
    /// explicit workspace limit still caps it), so that a plan made afterwards has the same
    /// peak and faster passes. The bare step of the rule: [`headroom_rule`] is the rule with
    /// its checks. Plan again afterwards: this plan's schedules are the old ones. Returns how
    /// many ops changed schedule.
    ///
    /// # Errors
    /// The target's errors (its algorithm searches).
    pub fn allot_headroom(&self, target: &Arc<dyn Backend>) -> Result<usize, TrainError> {
        Ok(target.allot_workspace(&self.allotment(&[]))?)
    }

    /// [`MemoryPlan::op_headroom`] as [`Backend::allot_workspace`] takes it, without the ops
    /// of `leave_out`.
    fn allotment(&self, leave_out: &[OpDesc]) -> Vec<(OpDesc, usize)> {
        self.op_headroom()
            .into_iter()
            .filter(|(op, _)| !leave_out.contains(op))
            .map(|(op, free)| (op, usize::try_from(free).unwrap_or(usize::MAX)))
            .collect()
    }
}

/// The headroom rule ("workspace that costs no peak", issue 12) for the step `replan` plans
/// (by feed) on `target`, as [`crate::Trainer::calibrate`] applies it after calibrating:
/// 1. the step's ops an allotment already claimed ([`Backend::workspace_allotted`]: another
///    trainer's on the same backend, or an earlier rule for this step) return to the
///    backend's limit ([`Backend::revoke_workspace`]) and get no allotment here: the plans
///    made before stay upper bounds, and no model pays for another's headroom (so applying
///    the rule twice to one step gives its widened ops up, for good);
/// 2. each other op gets its [`MemoryPlan::op_headroom`] ([`MemoryPlan::allot_headroom`]);
/// 3. where the step, fed as `feed` and prefetched, fitted the device's memory
///    ([`default_budget`]; nothing is checked on a backend of no memory size) with some
///    number of allocator releases before and now does not fit or needs more (a larger
///    block can make a caching allocator reserve a new segment at the same peak, then empty
///    its cache under the budget at every step), the allotment is revoked.
///
/// Returns how many ops keep a changed schedule.
///
/// # Errors
/// Planning errors; the target's (its algorithm searches).
pub fn headroom_rule(
    target: &Arc<dyn Backend>,
    feed: Feed,
    replan: impl Fn(Feed) -> Result<MemoryPlan, TrainError>,
) -> Result<usize, TrainError> {
    let plan = replan(feed)?;
    let taken: Vec<OpDesc> = plan
        .ops
        .iter()
        .filter(|op| target.workspace_allotted(op))
        .copied()
        .collect();
    let plan = if taken.is_empty() {
        plan
    } else {
        target.revoke_workspace(&taken)?;
        replan(feed)?
    };
    // one budget for both sides of the comparison; none on a backend of no memory size
    let budget = match default_budget(target.as_ref()) {
        Ok(budget) => Some(budget),
        Err(TrainError::NoBudget { .. }) => None,
        Err(e) => return Err(e),
    };
    let releases = |placed: &MemoryPlan| -> Result<Vec<Option<u64>>, TrainError> {
        let Some(budget) = budget else {
            return Ok(Vec::new());
        };
        let prefetched = replan(Feed::Prefetched)?;
        [placed, &prefetched]
            .into_iter()
            .map(|p| p.releases_within(budget))
            .collect()
    };
    let before = releases(&plan)?;
    let headroom = plan.allotment(&taken);
    let changed = target.allot_workspace(&headroom)?;
    if changed == 0 {
        return Ok(0);
    }
    let worse = |(was, is): (&Option<u64>, &Option<u64>)| match (was, is) {
        (Some(_), None) => true,
        (Some(was), Some(is)) => is > was,
        (None, _) => false,
    };
    if budget.is_some() && before.iter().zip(&releases(&replan(feed)?)?).any(worse) {
        let ops: Vec<OpDesc> = headroom.into_iter().map(|(op, _)| op).collect();
        target.revoke_workspace(&ops)?;
        return Ok(0);
    }
    Ok(changed)
}
