//! [`Trainer::profile_step`]: one training step with the time of each phase and each layer.

use std::fmt;

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Value, json};

use stax_layers::{Layer, LayerTime, Loss, Profile, Profiler};
use stax_optim::Optimizer;
use stax_tensor::Tensor;

use super::Trainer;
use crate::TrainError;
use crate::report::StepReport;

/// One profiled training step: its report, and each phase's and each layer's time as the
/// backend ran them ([`stax_layers::profile`]: on CUDA, events on the compute stream).
#[derive(Debug, Clone)]
pub struct StepProfile {
    /// The step's report (its `step_ms` includes the marks' few microseconds per layer).
    pub report: StepReport,
    /// The phases' and the layers' times.
    pub profile: Profile,
}

/// As JSON (`--json`'s last line): `{"report": the step's report, "phases": [{"phase",
/// "ms"}], "layers": [{"path", "kind", "phase", "ms", "leaf"}] in the order they ended,
/// "by_kind": [{"kind", "count", "forward_ms", "backward_ms"}]}`, times in milliseconds.
impl Serialize for StepProfile {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let phases = self.profile.phases.iter();
        let phases: Vec<Value> = phases
            .map(|(p, ms)| json!({"phase": p, "ms": ms}))
            .collect();
        let layers = self.profile.layers.iter().map(|l| {
            json!({"path": l.path.to_string(), "kind": l.kind, "phase": l.phase, "ms": l.ms,
                   "leaf": l.leaf})
        });
        let kinds = self.by_kind().into_iter().map(|k| {
            json!({"kind": k.kind, "count": k.count, "forward_ms": k.forward_ms,
                   "backward_ms": k.backward_ms})
        });
        let mut m = s.serialize_map(Some(4))?;
        m.serialize_entry("report", &self.report)?;
        m.serialize_entry("phases", &phases)?;
        m.serialize_entry("layers", &layers.collect::<Vec<_>>())?;
        m.serialize_entry("by_kind", &kinds.collect::<Vec<_>>())?;
        m.end()
    }
}

/// The leaf layers of one kind in a [`StepProfile`] (see [`StepProfile::by_kind`]).
#[derive(Debug, Clone, PartialEq)]
pub struct KindTime {
    /// The layer kind (`conv`, `batch_norm`, ...).
    pub kind: &'static str,
    /// Leaf layers of this kind timed in the forward phase.
    pub count: usize,
    /// Their milliseconds in the forward phase.
    pub forward_ms: f64,
    /// Their milliseconds in the backward phase (a rematerialized forward pass included).
    pub backward_ms: f64,
}

impl StepProfile {
    /// The leaf layers' times summed by kind, the most expensive kind first.
    pub fn by_kind(&self) -> Vec<KindTime> {
        let mut kinds: Vec<KindTime> = Vec::new();
        for l in self.profile.layers.iter().filter(|l| l.leaf) {
            let at = match kinds.iter().position(|k| k.kind == l.kind) {
                Some(i) => i,
                None => {
                    kinds.push(KindTime {
                        kind: l.kind,
                        count: 0,
                        forward_ms: 0.0,
                        backward_ms: 0.0,
                    });
                    kinds.len() - 1
                }
            };
            let k = &mut kinds[at];
            match l.phase {
                "forward" => {
                    k.count += 1;
                    k.forward_ms += l.ms;
                }
                _ => k.backward_ms += l.ms,
            }
        }
        kinds.sort_by(|a, b| {
            (b.forward_ms + b.backward_ms).total_cmp(&(a.forward_ms + a.backward_ms))
        });
        kinds
    }

    /// The `n` slowest leaf layers, slowest first.
    pub fn slowest(&self, n: usize) -> Vec<&LayerTime> {
        let mut leaves: Vec<&LayerTime> = self.profile.layers.iter().filter(|l| l.leaf).collect();
        leaves.sort_by(|a, b| b.ms.total_cmp(&a.ms));
        leaves.truncate(n);
        leaves
    }
}

impl fmt::Display for StepProfile {
    /// The phases, the leaf layers by kind (with their share of the phases' sum), what the
    /// phases spent outside leaf layers (the loss, the update after the backward pass,
    /// combinators' own work), and the ten slowest leaf layers. A layer's row holds what runs
    /// inside it: an activation fused into it, and an optimizer applied in its backward pass
    /// (Adam on the dense weights, [`stax_optim::Optimizer::in_backward`]).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total: f64 = self.profile.phases.iter().map(|p| p.1).sum();
        let r = &self.report;
        write!(
            f,
            "step {}: loss {:.4}, {:.2} ms;",
            r.step, r.loss, r.step_ms
        )?;
        for (phase, ms) in &self.profile.phases {
            write!(f, " {phase} {ms:.3} ms")?;
        }
        if let Some(s) = r.loss_scale.filter(|s| s.skipped) {
            let (a, b) = (s.scale, s.next_scale);
            write!(f, "; skipped: non-finite gradients, loss scale {a} -> {b}")?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "{:<16} {:>5} {:>11} {:>12} {:>10} {:>6}",
            "kind", "count", "forward ms", "backward ms", "total ms", "share"
        )?;
        let kinds = self.by_kind();
        let leaves: f64 = kinds.iter().map(|k| k.forward_ms + k.backward_ms).sum();
        for k in kinds {
            let sum = k.forward_ms + k.backward_ms;
            writeln!(
                f,
                "{:<16} {:>5} {:>11.3} {:>12.3} {:>10.3} {:>5.1}%",
                k.kind,
                k.count,
                k.forward_ms,
                k.backward_ms,
                sum,
                100.0 * sum / total.max(f64::MIN_POSITIVE)
            )?;
        }
        let rest = total - leaves;
        writeln!(
            f,
            "{:<16} {:>5} {:>11} {:>12} {:>10.3} {:>5.1}%",
            "(outside layers)",
            "",
            "",
            "",
            rest,
            100.0 * rest / total.max(f64::MIN_POSITIVE)
        )?;
        write!(f, "slowest layers:")?;
        for l in self.slowest(10) {
            write!(f, "\n{:>10.3} ms  {:<8} {}", l.ms, l.phase, l.path)?;
        }
        Ok(())
    }
}

impl<L: Layer, O: Optimizer, F: Loss> Trainer<L, O, F> {
    /// One training step, the same update as [`Trainer::step`], with its phases and every
    /// layer's forward and backward pass timed by backend marks ([`stax_tensor::Mark`]: CUDA
    /// events on the compute stream, the host clock on the CPU). The marks add a few
    /// microseconds of host time per layer; reading them waits for the step to finish.
    ///
    /// # Errors
    /// As [`Trainer::step`]; the marks' device errors.
    pub fn profile_step(&mut self, x: &Tensor, y: &Tensor) -> Result<StepProfile, TrainError> {
        let profiler = Profiler::new();
        let report = self.step_with(&[(x, y)], &mut || {}, Some(&profiler))?;
        Ok(StepProfile {
            report,
            profile: profiler.finish()?,
        })
    }
}
