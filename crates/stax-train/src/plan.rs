//! The static memory plan: every buffer one training step allocates, with its name, shape,
//! bytes, category and live range, the peak and where in the step it falls, computed before
//! anything runs, from the model, the batch shape, the optimizer and the target backend.
//!
//! The plan is exact by construction: it is a dry run of the real step code
//! (`apply`, `softmax_cross_entropy`, `vjp`, `Adam::update`, the same function
//! [`crate::Trainer::step`] runs) on a planning backend that allocates from an allocator over
//! simulated memory and computes nothing, asking the target backend what workspace each op
//! allocates, block by block ([`stax_tensor::Backend::workspace_schedule`]). So no byte is
//! counted that the step would not allocate, none is missed, and nothing large is allocated:
//! the seed model at batch 100 and 200x200x3 plans in milliseconds on a laptop.
//!
//! Step events are the allocator's allocations and frees during the step (after the batch is
//! placed), numbered from 0; a buffer lives from its allocation event to its free event.
//! Persistent buffers (parameters, Adam's moments, the placed batch) live across the step.
//!
//! ```
//! use stax_train::plan::MemoryPlan;
//! use stax_layers::{serial, Conv, Dense, Flatten, Relu};
//! use stax_tensor::{BackendOptions, Category, Device, Shape};
//! use stax_optim::Adam;
//! let cpu = Device::Cpu.open(&BackendOptions::default())?;
//! let model = serial![Conv::same(8, (3, 3)), Relu, Flatten, Dense(2)];
//! let plan = MemoryPlan::new(&model, &Shape::new([4, 6, 6, 3]), &Adam::new(1e-3), &cpu)?;
//! let conv = plan.buffers.iter().find(|b| b.name == "conv1.output").unwrap();
//! assert_eq!(conv.bytes, 4 * 6 * 6 * 8 * 4);
//! assert_eq!(conv.category, Category::Activation);
//! // parameters + Adam's m and v + the batch live across the step; the peak is above them
//! let params = (3 * 3 * 3 * 8 + 8 + 288 * 2 + 2) * 4;
//! assert_eq!(plan.persistent_bytes(), 3 * params + (4 * 6 * 6 * 3 + 4 * 2) * 4);
//! assert!(plan.peak.bytes > plan.persistent_bytes());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod backend;
mod fit;
mod table;
mod timeline;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde::Serialize;
use stax_alloc::{Category, Trace, TraceOp};
use stax_layers::Layer;
use stax_optim::{Adam, Optimizer};
use stax_tensor::{Backend, DType, Device, Shape, Tensor};

use crate::TrainError;
use crate::trainer::{Phase, check_input_shape, run_step};
use backend::{Label, PlanBackend};
pub(crate) use fit::AllocatorModel;
pub use fit::{MAX_BATCH, default_budget, max_batch_that_fits};
use timeline::Expected;
pub use timeline::{NamedTrace, Peak, Timeline, TimelineEvent};

/// One buffer of the plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlannedBuffer {
    /// Readable name: `conv2.output`, `relu1.mask`, `dense1.dw`, `conv2.workspace`,
    /// `conv1.w.m` (Adam's first moment of `conv1.w`), `input.images`.
    pub name: String,
    /// Later roles of the same buffer (a gradient written over a dead activation, ReLU in
    /// place), in order.
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
}

/// The memory plan of one training step (see the module docs). All sizes are bytes.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryPlan {
    /// The model's name.
    pub model: String,
    /// How batches reach the step.
    pub feed: Feed,
    /// The device planned for.
    #[serde(serialize_with = "device")]
    pub device: Device,
    /// Input batch shape, NHWC.
    #[serde(serialize_with = "shape")]
    pub input: Shape,
    /// One-hot labels shape `[n, classes]`.
    #[serde(serialize_with = "shape")]
    pub labels: Shape,
    /// Persistent buffers (in allocation order), then the step's (in allocation order).
    pub buffers: Vec<PlannedBuffer>,
    /// The step's events, named, with the persistent bytes as baseline.
    pub timeline: Timeline,
    /// The step's peak (requested bytes live, persistent included) and where it falls.
    pub peak: Peak,
    /// First step event of each phase.
    pub phases: Vec<(Phase, usize)>,
    /// The dry run's trace up to the end of the planned step: set-up, then placement and step
    /// twice (the second is the one planned).
    #[serde(skip)]
    pub(crate) trace: Trace,
    #[serde(skip)]
    pub(crate) setup: Vec<Expected>,
    #[serde(skip)]
    pub(crate) cycle: Vec<Expected>,
    #[serde(skip)]
    pub(crate) allocator: AllocatorModel,
}

fn device<S: serde::Serializer>(d: &Device, s: S) -> Result<S::Ok, S::Error> {
    d.to_string().serialize(s)
}

fn shape<S: serde::Serializer>(sh: &Shape, s: S) -> Result<S::Ok, S::Error> {
    sh.dims().serialize(s)
}

/// Event indices of the dry run (into the planning trace).
struct Marks {
    setup_end: usize,
    cycle_start: usize,
    step_start: usize,
    step_end: usize,
}

impl MemoryPlan {
    /// Plans one step of `model` on batches of shape `input` (NHWC, batch first) with `adam`,
    /// for `target` (whose workspace sizes and allocator are used), each batch placed before
    /// its step ([`Feed::Placed`]). Nothing is allocated on `target`.
    ///
    /// # Errors
    /// Shape errors (before anything else); [`stax_tensor::TensorError`]s when the target
    /// cannot size an op's workspace.
    pub fn new<L: Layer + ?Sized>(
        model: &L,
        input: &Shape,
        adam: &Adam,
        target: &Arc<dyn Backend>,
    ) -> Result<MemoryPlan, TrainError> {
        MemoryPlan::with_feed(model, input, adam, target, Feed::Placed)
    }

    /// As [`MemoryPlan::new`], for batches fed as `feed` says.
    ///
    /// # Errors
    /// As [`MemoryPlan::new`].
    pub fn with_feed<L: Layer + ?Sized>(
        model: &L,
        input: &Shape,
        adam: &Adam,
        target: &Arc<dyn Backend>,
        feed: Feed,
    ) -> Result<MemoryPlan, TrainError> {
        check_input_shape(input)?;
        let labels = model.output_shape(input)?;
        let pb = PlanBackend::new(target)?;
        let be: Arc<dyn Backend> = pb.clone();
        let (_, mut params) = model.init_empty(input, &be)?;
        let mut state = adam.init(&params)?;
        let place = || -> Result<(Tensor, Tensor), TrainError> {
            let x = Tensor::empty(&be, input.clone(), DType::F32, Category::Input)?;
            let y = Tensor::empty(&be, labels.clone(), DType::F32, Category::Input)?;
            pb.label(&x, "input.images");
            pb.label(&y, "input.labels");
            Ok((x, y))
        };
        // The loop as the trainer runs it. Placed: [place k, step k] per iteration. Prefetched:
        // place 1 once (part of the set-up), then [place k + 1, step k].
        let mut setup_end = pb.events();
        let (x, y) = place()?;
        let mut next = None;
        if feed == Feed::Prefetched {
            setup_end = pb.events();
            next = Some(place()?);
        }
        pb.begin_step();
        let no_hook = &mut |_: Phase| {};
        run_step(model, &mut params, adam, &mut state, (&x, &y), 1, no_hook)?;
        drop((x, y));
        let cycle_start = pb.events();
        let (x, y) = match next.take() {
            Some(batch) => {
                next = Some(place()?);
                batch
            }
            None => place()?,
        };
        let step_start = pb.events();
        pb.begin_step();
        let mut phases = Vec::new();
        let hook = &mut |p: Phase| phases.push((p, pb.events() - step_start));
        run_step(model, &mut params, adam, &mut state, (&x, &y), 2, hook)?;
        let step_end = pb.events();
        let (mut trace, labels_by_addr) = pb.finish();
        drop((x, y, next, params, state, be));
        trace.events.truncate(step_end);
        let marks = Marks {
            setup_end,
            cycle_start,
            step_start,
            step_end,
        };
        Ok(assemble(
            (model.name(), feed),
            target,
            (input.clone(), labels),
            trace,
            &labels_by_addr,
            &marks,
            phases,
        ))
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

    /// Names the events of a trace recorded from the start of training with this plan's
    /// batch size (trainer set-up, then placement and step per iteration), on any backend:
    /// see [`NamedTrace`].
    pub fn name_trace(&self, trace: &Trace) -> NamedTrace {
        timeline::name_trace(trace, &self.setup, &self.cycle)
    }
}

/// Builds the plan from the dry run's trace and names.
fn assemble(
    (model, feed): (String, Feed),
    target: &Arc<dyn Backend>,
    (input, labels): (Shape, Shape),
    trace: Trace,
    names: &HashMap<u64, Label>,
    marks: &Marks,
    phases: Vec<(Phase, usize)>,
) -> MemoryPlan {
    let events = &trace.events;
    let mut addr_of: HashMap<u64, u64> = HashMap::new();
    for e in events.iter().filter(|e| e.op == TraceOp::Alloc) {
        addr_of.insert(e.id, e.addr);
    }
    let label = |id: u64| addr_of.get(&id).and_then(|a| names.get(a));
    let name = |id: u64, category: Category| match label(id) {
        Some(l) => l.name.clone(),
        None => format!("{category}#{id}"),
    };
    let expected = |range: std::ops::Range<usize>| -> Vec<Expected> {
        events[range]
            .iter()
            .filter(|e| e.op == TraceOp::Alloc)
            .map(|e| Expected {
                category: e.category,
                bytes: e.bytes,
                name: name(e.id, e.category),
            })
            .collect()
    };
    let (start, end) = (marks.step_start, marks.step_end);
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
    let free_at: HashMap<u64, usize> = events[start..end]
        .iter()
        .enumerate()
        .filter(|(_, e)| e.op == TraceOp::Free)
        .map(|(i, e)| (e.id, i))
        .collect();
    let alloc_event = |id: u64| events.iter().find(|e| e.id == id && e.op == TraceOp::Alloc);
    let step_allocs = events[start..end]
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
            let l = label(id);
            Some(PlannedBuffer {
                name: name(id, e.category),
                reused_as: l.map(|l| l.reused_as.clone()).unwrap_or_default(),
                shape: l.and_then(|l| l.shape.clone()),
                dtype: l.and_then(|l| l.dtype),
                bytes: e.bytes,
                category: e.category,
                alloc,
                free: free_at.get(&id).copied(),
            })
        })
        .collect();
    let timeline = Timeline {
        baseline,
        events: events[start..end]
            .iter()
            .enumerate()
            .map(|(i, e)| TimelineEvent {
                op: e.op,
                id: e.id,
                bytes: e.bytes,
                category: e.category,
                name: name(e.id, e.category),
                t_ns: i as u64 * 1000,
            })
            .collect(),
    };
    let peak = timeline.peak();
    MemoryPlan {
        model,
        feed,
        device: target.device(),
        input,
        labels,
        buffers,
        peak,
        phases,
        setup: expected(0..marks.setup_end),
        cycle: expected(marks.cycle_start..end),
        allocator: AllocatorModel::of(target.allocator()),
        timeline,
        trace,
    }
}
