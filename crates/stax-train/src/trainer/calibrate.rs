//! Calibration at set-up: cuDNN's algorithm choice for every conv pass of the step, then the
//! headroom rule ("workspace that costs no peak", issue 12: [`plan::headroom_rule`]).

use super::Trainer;
use crate::TrainError;
use crate::plan;
use stax_layers::{Layer, Loss};
use stax_optim::Optimizer;

impl<L: Layer, O: Optimizer, F: Loss> Trainer<L, O, F> {
    /// Makes the ops of a step with batch size `batch` exact on this trainer's backend
    /// ([`crate::MemoryPlan::calibrate`]: on CUDA, cuDNN's algorithm search for every
    /// convolution pass not chosen yet; it allocates scratch buffers on the device and releases
    /// them before it returns), then gives each op the workspace the step has free below its
    /// peak while the op runs ([`plan::headroom_rule`]: a faster cuDNN algorithm where it
    /// costs no peak; an explicit workspace limit of the backend caps it; ops another
    /// trainer's allotment widened return to the limit; revoked where the step, placed or
    /// prefetched, would no longer fit the device's memory as steadily). The step's planned
    /// peak stays what it was. A step of a batch size not calibrated calibrates itself first
    /// (without the allotment).
    ///
    /// # Errors
    /// Planning errors; the device's errors (out of memory for the search's buffers).
    pub fn calibrate(&self, batch: usize) -> Result<(), TrainError> {
        self.plan(batch)?.calibrate(self.backend())?;
        let replan = |feed| self.plan_with_feed(batch, feed);
        plan::headroom_rule(self.backend(), self.feed(), replan)?;
        Ok(())
    }
}
