//! The static memory plan: every buffer one training step allocates, with its name, shape,
//! bytes, category and live range, the peak and where in the step it falls, computed before
//! anything runs, from the model, the batch shape, the optimizer and the target backend.
//!
//! The plan is exact by construction: it is a dry run of the real step code
//! (`apply`, the loss, `vjp`, the optimizer's update: the same function
//! [`crate::Trainer::step`] runs, [`crate::step`]) on a planning backend that allocates from an allocator over
//! simulated memory and computes nothing, asking the target backend what workspace each op
//! allocates, block by block ([`stax_tensor::Backend::workspace_schedule`]). So no byte is
//! counted that the step would not allocate, none is missed, and nothing large is allocated:
//! the seed model at batch 100 and 200x200x3 plans in milliseconds on a laptop.
//!
//! Step events are the allocator's allocations and frees during the step (after the batch is
//! placed), numbered from 0; a buffer lives from its allocation event to its free event.
//! Persistent buffers (parameters, Adam's moments, the placed batch) live across the step.
//! Every buffer is named by the allocation itself (its scope and role, `2.conv/output`: see
//! [`stax_alloc::Name`]); a buffer written over in place lists its later roles.
//!
//! ```
//! use stax_train::plan::MemoryPlan;
//! use stax_layers::{serial, Conv, Dense, Flatten, Relu};
//! use stax_tensor::{BackendOptions, Category, Device, Shape};
//! use stax_optim::Adam;
//! let cpu = Device::Cpu.open(&BackendOptions::default())?;
//! let model = serial![Conv::same(8, (3, 3)), Relu, Flatten, Dense(2)];
//! let plan = MemoryPlan::new(&model, &Shape::new([4, 6, 6, 3]), &Adam::new(1e-3), &cpu)?;
//! let conv = plan.buffers.iter().find(|b| b.name == "0.conv/output").unwrap();
//! assert_eq!(conv.reused_as, ["1.relu/output", "3.dense/dx", "1.relu/dx"]);
//! assert_eq!(conv.bytes, 4 * 6 * 6 * 8 * 4);
//! assert_eq!(conv.category, Category::Activation);
//! // parameters + Adam's m and v + the batch live across the step; the peak is above them
//! let params = (3 * 3 * 3 * 8 + 8 + 288 * 2 + 2) * 4;
//! assert_eq!(plan.persistent_bytes(), 3 * params + (4 * 6 * 6 * 3 + 4 * 2) * 4);
//! assert!(plan.peak.bytes > plan.persistent_bytes());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod backend;
mod dtypes;
pub(crate) mod fit;
mod headroom;
mod table;
mod timeline;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde::Serialize;
use stax_alloc::{Category, Mark, Trace, TraceOp};
use stax_layers::{Layer, Loss, ParamSource, SoftmaxCrossEntropy, init_params};
use stax_optim::Optimizer;
use stax_tensor::{Backend, DType, Device, OpDesc, Shape, Tensor, Tree};

use crate::TrainError;
use crate::staging::input_tensors;
use crate::step::{Parts, Phase, check_input_shape, output_shape, run_step};
use backend::{OpSpan, PlanBackend};
pub use dtypes::DTypeBytes;
pub(crate) use fit::AllocatorModel;
pub use fit::{MAX_BATCH, default_budget, max_batch_that_fits};
pub use headroom::headroom_rule;
pub use timeline::{NamedTrace, Peak, Timeline, TimelineEvent};

/// One buffer of the plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlannedBuffer {
    /// Its name, the path and role it was allocated with: `2.conv/output`, `1.relu/mask`,
    /// `5.dense/dw`, `2.conv/workspace`, `0.conv/w/mu` (Adam's first moment of `0.conv/w`),
    /// `input/images`.
    pub name: String,
    /// Later roles of the same buffer (a gradient written over a dead activation, an
    /// activation in place), in order.
    pub reused_as: Vec<String>,
    /// Shape, for tensors (None for workspace).
    #[serde(serialize_with = "dims")]
    pub shape: Option<Shape>,
    /// Element type, for tensors (None for workspace).
    #[serde(serialize_with = "dtype")]
    pub dtype: Option<DType>,
    /// Requested bytes.
    pub bytes: u64,
    /// Allocator category.
    pub category: Category,
    /// Step event that allocates it; None when it is allocated before the step (persistent).
    pub alloc: Option<usize>,
    /// Step event that frees it; None when it outlives the step.
    pub free: Option<usize>,
}

fn dims<S: serde::Serializer>(shape: &Option<Shape>, s: S) -> Result<S::Ok, S::Error> {
    shape.as_ref().map(|sh| sh.dims().to_vec()).serialize(s)
}

fn dtype<S: serde::Serializer>(dtype: &Option<DType>, s: S) -> Result<S::Ok, S::Error> {
    dtype.map(|d| d.to_string()).serialize(s)
}

/// How batches reach the step, which decides how many are on the device while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Feed {
    /// The caller places each batch before its step ([`crate::Trainer::step`]): one batch is
    /// live during the step.
    #[default]
    Placed,
    /// [`crate::Trainer::step_prefetched`]: the next batch is placed, its copy running on a
    /// second stream, before the step starts, so two batches are live during it.
    Prefetched,
    /// [`crate::Trainer::step_accumulated`]: this many micro-batches are placed before the
    /// step, which sums their gradients for one update (gradient accumulation); all are live
    /// during it, one micro-batch's activations at a time.
    Accumulated(usize),
}

impl Feed {
    /// Batches the step takes: the micro-batches of [`Feed::Accumulated`], else one.
    pub fn micro_batches(self) -> usize {
        match self {
            Feed::Accumulated(n) => n,
            Feed::Placed | Feed::Prefetched => 1,
        }
    }
}

/// The memory plan of one training step (see the module docs). All sizes are bytes.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryPlan {
    /// The model, described.
    pub model: String,
    /// How batches reach the step.
    pub feed: Feed,
    /// The device planned for.
    #[serde(serialize_with = "device")]
    pub device: Device,
    /// Input batch shape.
    #[serde(serialize_with = "shape")]
    pub input: Shape,
    /// Labels shape (one-hot `[n, classes]` for softmax cross-entropy, `[n]` class indices for
    /// the losses with integer labels).
    #[serde(serialize_with = "shape")]
    pub labels: Shape,
    /// Persistent buffers (in allocation order), then the step's (in allocation order).
    pub buffers: Vec<PlannedBuffer>,
    /// The step's events, named, with the persistent bytes as baseline.
    pub timeline: Timeline,
    /// The step's peak (requested bytes live, persistent included) and where it falls.
    pub peak: Peak,
    /// The bytes live at the peak by dtype ([`MemoryPlan::by_dtype`]; in the JSON export).
    pub peak_by_dtype: DTypeBytes,
    /// First step event of each phase.
    pub phases: Vec<(Phase, usize)>,
    /// Whether every op's workspace is exact. False when the target has ops not yet
    /// calibrated ([`Backend::calibrate`]: cuDNN's algorithm choice), whose workspace is then
    /// the documented bound: the plan's peak is at least the step's.
    pub exact: bool,
    /// A data-parallel rank's communication: the buckets its step reduces (in place) and
    /// what the library holds outside the allocator ([`crate::distributed`]); `None` for a
    /// single process.
    pub comm: Option<crate::CommReport>,
    /// Every op of the step (and of the set-up), in order of first appearance: what
    /// [`MemoryPlan::calibrate`] calibrates.
    #[serde(skip)]
    pub ops: Vec<OpDesc>,
    /// The dry run's trace up to the end of the planned step: set-up, then placement and step
    /// twice (the second is the one planned).
    #[serde(skip)]
    pub(crate) trace: Trace,
    /// The first event of the trace after the trainer's set-up (the first placement).
    #[serde(skip)]
    pub(crate) loop_start: usize,
    #[serde(skip)]
    pub(crate) allocator: AllocatorModel,
    /// The planned step's op calls that allocate workspace: each op (an index into `ops`)
    /// with its step events ([`MemoryPlan::op_headroom`]).
    #[serde(skip)]
    pub(crate) op_spans: Vec<OpSpan>,
}

/// The placed batches as the step takes them.
fn refs(batches: &[(Tensor, Tensor)]) -> Vec<(&Tensor, &Tensor)> {
    batches.iter().map(|(x, y)| (x, y)).collect()
}

fn device<S: serde::Serializer>(d: &Device, s: S) -> Result<S::Ok, S::Error> {
    d.to_string().serialize(s)
}

fn shape<S: serde::Serializer>(sh: &Shape, s: S) -> Result<S::Ok, S::Error> {
    sh.dims().serialize(s)
}

impl MemoryPlan {
    /// Plans one step of `model` with softmax cross-entropy on batches of shape `input`
    /// (batch first) with `opt`, for `target` (whose workspace sizes and allocator are used),
    /// each batch placed before its step ([`Feed::Placed`]). Nothing is allocated on `target`.
    ///
    /// # Errors
    /// Shape errors (before anything else); [`stax_tensor::TensorError`]s when the target
    /// cannot size an op's workspace.
    pub fn new<L: Layer, O: Optimizer>(
        model: &L,
        input: &Shape,
        opt: &O,
        target: &Arc<dyn Backend>,
    ) -> Result<MemoryPlan, TrainError> {
        MemoryPlan::with_feed(model, input, opt, target, Feed::Placed)
    }

    /// As [`MemoryPlan::new`], for batches fed as `feed` says.
    ///
    /// # Errors
    /// As [`MemoryPlan::new`].
    pub fn with_feed<L: Layer, O: Optimizer>(
        model: &L,
        input: &Shape,
        opt: &O,
        target: &Arc<dyn Backend>,
        feed: Feed,
    ) -> Result<MemoryPlan, TrainError> {
        MemoryPlan::with_loss(model, input, opt, &SoftmaxCrossEntropy, target, feed)
    }

    /// As [`MemoryPlan::with_feed`], with the loss `loss`.
    ///
    /// # Errors
    /// As [`MemoryPlan::new`].
    pub fn with_loss<L: Layer, O: Optimizer, F: Loss>(
        model: &L,
        input: &Shape,
        opt: &O,
        loss: &F,
        target: &Arc<dyn Backend>,
        feed: Feed,
    ) -> Result<MemoryPlan, TrainError> {
        let parts = Parts::new(model, input, loss, opt);
        MemoryPlan::of(parts, input, target, feed)
    }

    /// The plan of a step of `parts` (see [`MemoryPlan::new`]).
    pub(crate) fn of(
        parts: Parts<'_>,
        input: &Shape,
        target: &Arc<dyn Backend>,
        feed: Feed,
    ) -> Result<MemoryPlan, TrainError> {
        check_input_shape(input)?;
        let labels = parts.loss.labels_shape(&output_shape(parts.model, input)?);
        let pb = PlanBackend::new(target)?;
        let be: Arc<dyn Backend> = pb.clone();
        let source = ParamSource::Empty;
        let (_, mut params) = init_params(parts.model, &Tree::leaf(input.clone()), &be, source)?;
        let mut state = parts.opt.init(&params)?;
        let labels_dtype = parts.loss.labels_dtype();
        let place = || -> Result<(Tensor, Tensor), TrainError> {
            Ok(input_tensors(
                &be,
                input.clone(),
                (labels.clone(), labels_dtype),
            )?)
        };
        // The loop as the trainer runs it. Placed: [place k, step k] per iteration (with
        // accumulation, place k is its micro-batches). Prefetched: place 1 once, then
        // [place k + 1, step k].
        let loop_start = pb.events();
        let place_all = || {
            (0..feed.micro_batches())
                .map(|_| place())
                .collect::<Result<Vec<_>, _>>()
        };
        let batches = place_all()?;
        let mut next = match feed {
            Feed::Prefetched => Some(place_all()?),
            Feed::Placed | Feed::Accumulated(_) => None,
        };
        let no_hook = &mut |_: Phase| {};
        run_step(
            parts,
            &mut params,
            &mut state,
            &refs(&batches),
            (1, 0),
            no_hook,
        )?;
        drop(batches);
        let batches = match next.take() {
            Some(batch) => {
                next = Some(place_all()?);
                batch
            }
            None => place_all()?,
        };
        let step_start = pb.events();
        let mut phases = Vec::new();
        let hook = &mut |p: Phase| phases.push((p, pb.events() - step_start));
        run_step(
            parts,
            &mut params,
            &mut state,
            &refs(&batches),
            (2, 0),
            hook,
        )?;
        let step_end = pb.events();
        let (mut trace, ops, spans) = pb.finish();
        drop((batches, next, params, state, be));
        trace.events.truncate(step_end);
        trace.marks.retain(|m| mark_at(m) <= step_end);
        let planned = Planned {
            model: parts.model.describe(),
            feed,
            target,
            shapes: (input.clone(), labels),
            phases,
            steps: step_start..step_end,
            loop_start,
            ops,
            spans,
        };
        let plan = planned.assemble(trace);
        let comm = parts.dp.map(crate::DataParallel::report);
        Ok(MemoryPlan { comm, ..plan })
    }

    /// Makes every op of this plan exact on `target` ([`Backend::calibrate`]: on CUDA,
    /// cuDNN's algorithm search for each convolution pass not chosen yet, which allocates
    /// scratch buffers on the device and releases them). Plans made afterwards are exact.
    ///
    /// # Errors
    /// The target's errors (out of memory for the search's buffers).
    pub fn calibrate(&self, target: &Arc<dyn Backend>) -> Result<(), TrainError> {
        for op in &self.ops {
            target.calibrate(op)?;
        }
        Ok(())
    }

    /// The dry run's allocations and frees, from the trainer's set-up to the end of the planned
    /// step (set-up, then placement and step twice), as the fit replays use them: compare a
    /// recorded run against it to find where a run departs from its plan.
    pub fn trace(&self) -> &Trace {
        &self.trace
    }

    /// The batch size planned for.
    pub fn batch(&self) -> usize {
        self.input.dims().first().copied().unwrap_or(0)
    }

    /// Bytes live across the step: parameters, optimizer state, the placed batch (two with
    /// [`Feed::Prefetched`]).
    pub fn persistent_bytes(&self) -> u64 {
        self.timeline.baseline.iter().sum()
    }

    /// Bytes of the parameters and the optimizer's state.
    pub fn state_bytes(&self) -> u64 {
        let b = &self.timeline.baseline;
        b[Category::Parameter.index()] + b[Category::OptimizerState.index()]
    }

    /// Host bytes that loading or saving a checkpoint of this plan's trainer holds at once:
    /// arrays go through host memory one at a time ([`crate::checkpoint`]), so this is the
    /// largest parameter or optimizer-state tensor. On the device, loading allocates exactly
    /// the parameters and the state ([`MemoryPlan::state_bytes`]), in the order a fresh
    /// trainer does, and nothing else.
    pub fn checkpoint_host_bytes(&self) -> u64 {
        self.buffers
            .iter()
            .filter(|b| b.alloc.is_none())
            .filter(|b| matches!(b.category, Category::Parameter | Category::OptimizerState))
            .map(|b| b.bytes)
            .max()
            .unwrap_or(0)
    }

    /// The buffer allocated at step event `event`, if that event is an allocation.
    pub fn allocated_at(&self, event: usize) -> Option<&PlannedBuffer> {
        self.buffers.iter().find(|b| b.alloc == Some(event))
    }

    /// The phase step event `event` falls in.
    pub fn phase_at(&self, event: usize) -> Option<Phase> {
        self.phases
            .iter()
            .take_while(|(_, start)| *start <= event)
            .last()
            .map(|(p, _)| *p)
    }

    /// The largest single buffer (the first of equals).
    pub fn largest(&self) -> Option<&PlannedBuffer> {
        self.buffers
            .iter()
            .reduce(|a, b| if b.bytes > a.bytes { b } else { a })
    }
}

fn mark_at(m: &Mark) -> usize {
    match m {
        Mark::Step { at, .. } | Mark::Role { at, .. } => *at,
    }
}

/// What the dry run knows besides its trace.
struct Planned<'a> {
    model: String,
    feed: Feed,
    target: &'a Arc<dyn Backend>,
    shapes: (Shape, Shape),
    phases: Vec<(Phase, usize)>,
    /// The planned step's events in the trace.
    steps: std::ops::Range<usize>,
    /// The first event after the set-up (the first placement).
    loop_start: usize,
    /// Every op of the dry run.
    ops: Vec<OpDesc>,
    /// The dry run's op calls that allocated workspace, numbered as the trace.
    spans: Vec<OpSpan>,
}

impl Planned<'_> {
    /// Builds the plan from the dry run's trace: buffers, timeline and peak.
    fn assemble(self, trace: Trace) -> MemoryPlan {
        let events = &trace.events;
        let (start, end) = (self.steps.start, self.steps.end);
        let mut roles: HashMap<u64, Vec<String>> = HashMap::new();
        for m in &trace.marks {
            if let Mark::Role { id, name, .. } = m {
                roles.entry(*id).or_default().push(name.clone());
            }
        }
        // Buffers live when the step starts, and the bytes they hold per category.
        let mut live: Vec<u64> = Vec::new();
        let mut baseline = [0u64; 7];
        let mut freed: HashSet<u64> = HashSet::new();
        for e in events[..start].iter().rev() {
            match e.op {
                TraceOp::Free => {
                    freed.insert(e.id);
                }
                TraceOp::Alloc if !freed.contains(&e.id) => {
                    live.push(e.id);
                    baseline[e.category.index()] += e.bytes;
                }
                TraceOp::Alloc => {}
            }
        }
        live.reverse();
        let step = &events[start..end];
        let free_at: HashMap<u64, usize> = step
            .iter()
            .enumerate()
            .filter(|(_, e)| e.op == TraceOp::Free)
            .map(|(i, e)| (e.id, i))
            .collect();
        // each id's first allocation, looked up per buffer (a scan per buffer was quadratic)
        let mut first_alloc = HashMap::new();
        for e in events.iter().filter(|e| e.op == TraceOp::Alloc) {
            first_alloc.entry(e.id).or_insert(e);
        }
        let alloc_event = |id: u64| first_alloc.get(&id).copied();
        let step_allocs = step
            .iter()
            .enumerate()
            .filter(|(_, e)| e.op == TraceOp::Alloc)
            .map(|(i, e)| (e.id, Some(i)));
        let buffers = live
            .iter()
            .map(|&id| (id, None))
            .chain(step_allocs)
            .filter_map(|(id, alloc)| {
                let e = alloc_event(id)?;
                let name = timeline::event_name(e);
                let mut reused: Vec<String> = Vec::new();
                for r in roles.get(&id).into_iter().flatten() {
                    if *r != name && !reused.contains(r) {
                        reused.push(r.clone());
                    }
                }
                Some(PlannedBuffer {
                    reused_as: reused,
                    shape: e.shape.clone().map(Shape::new),
                    dtype: e.dtype.as_deref().and_then(|d| d.parse().ok()),
                    bytes: e.bytes,
                    category: e.category,
                    alloc,
                    free: free_at.get(&id).copied(),
                    name,
                })
            })
            .collect();
        let timeline = Timeline {
            baseline,
            events: step
                .iter()
                .enumerate()
                .map(|(i, e)| TimelineEvent::of(e, i as u64 * 1000))
                .collect(),
        };
        let peak = timeline.peak();
        let mut plan = MemoryPlan {
            peak_by_dtype: DTypeBytes::default(),
            model: self.model,
            feed: self.feed,
            device: self.target.device(),
            input: self.shapes.0,
            labels: self.shapes.1,
            buffers,
            peak,
            phases: self.phases,
            allocator: AllocatorModel::of(self.target.allocator()),
            comm: None,
            exact: self.ops.iter().all(|op| self.target.is_calibrated(op)),
            ops: self.ops,
            timeline,
            trace,
            loop_start: self.loop_start,
            op_spans: self
                .spans
                .into_iter()
                .filter(|(_, s)| s.start >= start && s.end <= end)
                .map(|(op, s)| (op, s.start - start..s.end - start))
                .collect(),
        };
        plan.peak_by_dtype = plan.by_dtype();
        plan
    }
}
