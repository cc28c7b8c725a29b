//! The planning backend: runs the real step code without computing anything.
//!
//! [`PlanBackend`] implements [`Backend`] over an [`Allocator`] on a [`SimMemory`] of practically
//! unlimited capacity (virtual addresses, never dereferenced), `platform` strategy, with a trace
//! recording from the start. Ops check their outputs as the real backends do (shape, sole
//! ownership), allocate around themselves exactly the workspace blocks the *target* backend
//! says it would, in its order ([`Backend::workspace_schedule`]), and compute nothing: `softmax_xent` returns a loss of 0,
//! downloads give zeros. So a dry run of `apply`, the loss, `vjp` and `Adam::update` on it
//! allocates and frees, in the same order, exactly what the real step on the target does.
//!
//! It also names buffers from the roles tensors play in ops: the weight of a conv names a layer
//! `conv1`, `conv2`, ... (dense layers likewise), masks name ReLU layers in the order of the
//! step, and outputs get `{layer}.output`, `{layer}.mask`, `{layer}.dw`, `{layer}.dx`,
//! `{layer}.workspace`, `loss.dlogits`, `{param}.m` / `.v` for Adam's moments. A buffer written
//! later in another role (a gradient over a dead activation, ReLU in place) keeps its first name
//! and records the others. `platform` over `SimMemory` never reuses an address, so a name keyed
//! by address names exactly one allocation of the trace.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Arc, Mutex, MutexGuard};

use stax_alloc::{Allocator, Category, SimMemory, Strategy, Trace};
use stax_tensor::{
    AdamHyper, Backend, BackendId, Conv2dGeometry, ConvPass, DType, Device, Precision, Shape,
    Tensor, TensorError, WorkspaceOp, WorkspaceStep,
};

/// What the plan knows of one buffer beyond its trace events.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Label {
    /// The name of its first role.
    pub name: String,
    /// Its shape in that role (None for workspace).
    pub shape: Option<Shape>,
    /// Its element type (None for workspace).
    pub dtype: Option<DType>,
    /// Later roles, in order (e.g. `conv2.dx` written over `conv1.output`).
    pub reused_as: Vec<String>,
}

/// Layer and buffer names, assigned as ops are called.
#[derive(Default)]
struct Namer {
    labels: HashMap<u64, Label>,
    /// Layer of each weight tensor (by address).
    weights: HashMap<u64, String>,
    /// Layer that took each input (by address and layer kind), for the backward passes that
    /// see the input but not the weight.
    inputs: HashMap<(u64, &'static str), String>,
    /// ReLU layer of each mask (by address).
    masks: HashMap<u64, String>,
    /// Layers seen per kind (conv and dense: over the whole run; relu: in this step).
    counts: HashMap<&'static str, usize>,
    /// The layer of the op running now.
    current: String,
}

impl Namer {
    fn new_layer(&mut self, kind: &'static str) -> String {
        let n = self.counts.entry(kind).or_default();
        *n += 1;
        format!("{kind}{n}")
    }

    /// The layer owning weight `w`, naming a new one of `kind` on first sight.
    fn weight_layer(&mut self, w: &Tensor, kind: &'static str) -> String {
        if let Some(l) = self.weights.get(&w.addr()) {
            return l.clone();
        }
        let layer = self.new_layer(kind);
        self.weights.insert(w.addr(), layer.clone());
        self.name(w, format!("{layer}.w"));
        layer
    }

    fn name(&mut self, t: &Tensor, name: String) {
        let (shape, dtype) = (Some(t.shape().clone()), Some(t.dtype()));
        self.name_addr(t.addr(), name, shape, dtype);
    }

    fn name_addr(&mut self, addr: u64, name: String, shape: Option<Shape>, dtype: Option<DType>) {
        match self.labels.entry(addr) {
            Entry::Occupied(mut e) => {
                let l = e.get_mut();
                if l.name != name && !l.reused_as.contains(&name) {
                    l.reused_as.push(name);
                }
            }
            Entry::Vacant(e) => {
                e.insert(Label {
                    name,
                    shape,
                    dtype,
                    reused_as: Vec::new(),
                });
            }
        }
    }

    fn name_of(&self, t: &Tensor) -> Option<&str> {
        self.labels.get(&t.addr()).map(|l| l.name.as_str())
    }

    fn enter(&mut self, layer: &str) -> String {
        self.current = layer.to_string();
        self.current.clone()
    }
}

/// The planning backend (see the module docs).
#[derive(Debug)]
pub(crate) struct PlanBackend {
    id: BackendId,
    target: Arc<dyn Backend>,
    allocator: Arc<Allocator>,
    namer: Mutex<Namer>,
}

impl std::fmt::Debug for Namer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Namer")
            .field("labels", &self.labels.len())
            .finish_non_exhaustive()
    }
}

impl PlanBackend {
    /// A planning backend for `target`, recording from its first allocation.
    pub(crate) fn new(target: &Arc<dyn Backend>) -> Result<Arc<PlanBackend>, TensorError> {
        let sim = SimMemory::new(u64::MAX / 4, 256);
        let allocator = Allocator::new(Arc::new(sim), Strategy::Platform)?;
        allocator.start_trace();
        Ok(Arc::new(PlanBackend {
            id: BackendId::fresh(),
            target: target.clone(),
            allocator,
            namer: Mutex::new(Namer::default()),
        }))
    }

    fn namer(&self) -> MutexGuard<'_, Namer> {
        self.namer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Number of trace events (allocations and frees) so far.
    pub(crate) fn events(&self) -> usize {
        let s = self.allocator.stats();
        (s.allocs + s.frees) as usize
    }

    /// Names `t`'s buffer (its first name wins).
    pub(crate) fn label(&self, t: &Tensor, name: &str) {
        self.namer().name(t, name.to_string());
    }

    /// Starts naming a new step: ReLU layers are counted again from 1.
    pub(crate) fn begin_step(&self) {
        self.namer().counts.remove("relu");
    }

    /// Stops recording: the trace and the name of every buffer, by address.
    pub(crate) fn finish(&self) -> (Trace, HashMap<u64, Label>) {
        let trace = self.allocator.stop_trace();
        (trace, std::mem::take(&mut self.namer().labels))
    }

    /// Allocates and frees the workspace the target uses for `op`, in the target's order
    /// ([`Backend::workspace_schedule`]), each buffer named `{layer}.workspace`.
    fn workspace(&self, op: WorkspaceOp, layer: &str) -> Result<(), TensorError> {
        let mut held = Vec::new();
        for step in self.target.workspace_schedule(&op)? {
            match step {
                WorkspaceStep::Alloc(bytes) => {
                    let a = self.allocator.allocate(bytes, Category::Workspace)?;
                    let name = format!("{layer}.workspace");
                    self.namer().name_addr(a.addr(), name, None, None);
                    held.push(Some(a));
                }
                WorkspaceStep::Free(i) => drop(held.get_mut(i).and_then(Option::take)),
            }
        }
        Ok(())
    }
}

fn output(op: &'static str, t: &Tensor, shape: &Shape) -> Result<(), TensorError> {
    t.expect_shape(op, shape)?;
    t.expect_unique(op)
}

impl Backend for PlanBackend {
    fn id(&self) -> BackendId {
        self.id
    }

    fn device(&self) -> Device {
        self.target.device()
    }

    fn allocator(&self) -> &Arc<Allocator> {
        &self.allocator
    }

    fn precision(&self) -> Precision {
        self.target.precision()
    }

    fn upload(&self, _src: &[u8], dst: &mut Tensor) -> Result<(), TensorError> {
        dst.expect_unique("upload")
    }

    fn download(&self, _src: &Tensor, dst: &mut [u8]) -> Result<(), TensorError> {
        dst.fill(0);
        Ok(())
    }

    fn copy(&self, src: &Tensor, dst: &mut Tensor) -> Result<(), TensorError> {
        output("copy", dst, src.shape())?;
        let mut n = self.namer();
        let name = format!("{}.copy", n.name_of(src).unwrap_or("tensor"));
        n.name(dst, name);
        Ok(())
    }

    fn fill(&self, t: &mut Tensor, _value: f32) -> Result<(), TensorError> {
        t.expect_unique("fill")
    }

    fn conv2d(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        g: &Conv2dGeometry,
        y: &mut Tensor,
    ) -> Result<(), TensorError> {
        const OP: &str = "conv2d";
        x.expect_shape(OP, &g.input_shape())?;
        w.expect_shape(OP, &g.filter_shape())?;
        output(OP, y, &g.output_shape())?;
        let layer = {
            let mut n = self.namer();
            let layer = n.weight_layer(w, "conv");
            n.name(b, format!("{layer}.b"));
            n.name(y, format!("{layer}.output"));
            n.inputs.insert((x.addr(), "conv"), layer.clone());
            n.enter(&layer)
        };
        let pass = ConvPass::Forward;
        self.workspace(WorkspaceOp::Conv { geometry: *g, pass }, &layer)
    }

    fn conv2d_bwd_data(
        &self,
        dy: &Tensor,
        w: &Tensor,
        g: &Conv2dGeometry,
        dx: &mut Tensor,
    ) -> Result<(), TensorError> {
        const OP: &str = "conv2d_bwd_data";
        dy.expect_shape(OP, &g.output_shape())?;
        output(OP, dx, &g.input_shape())?;
        let layer = {
            let mut n = self.namer();
            let layer = n.weight_layer(w, "conv");
            n.name(dx, format!("{layer}.dx"));
            n.enter(&layer)
        };
        let pass = ConvPass::BackwardData;
        self.workspace(WorkspaceOp::Conv { geometry: *g, pass }, &layer)
    }

    fn conv2d_bwd_filter(
        &self,
        x: &Tensor,
        dy: &Tensor,
        g: &Conv2dGeometry,
        dw: &mut Tensor,
        db: &mut Tensor,
    ) -> Result<(), TensorError> {
        const OP: &str = "conv2d_bwd_filter";
        x.expect_shape(OP, &g.input_shape())?;
        dy.expect_shape(OP, &g.output_shape())?;
        output(OP, dw, &g.filter_shape())?;
        output(OP, db, &Shape::new([g.c_out]))?;
        let layer = {
            let mut n = self.namer();
            let layer = match n.inputs.get(&(x.addr(), "conv")) {
                Some(l) => l.clone(),
                None => n.current.clone(),
            };
            n.name(dw, format!("{layer}.dw"));
            n.name(db, format!("{layer}.db"));
            n.enter(&layer)
        };
        let pass = ConvPass::BackwardFilter;
        self.workspace(WorkspaceOp::Conv { geometry: *g, pass }, &layer)
    }

    fn matmul(
        &self,
        a: &Tensor,
        b: &Tensor,
        transpose_a: bool,
        transpose_b: bool,
        c: &mut Tensor,
    ) -> Result<(), TensorError> {
        const OP: &str = "matmul";
        let (m, n_cols, k) =
            stax_tensor::matmul_dims(OP, a.shape(), b.shape(), transpose_a, transpose_b)?;
        output(OP, c, &Shape::new([m, n_cols]))?;
        let layer = {
            let mut n = self.namer();
            let (layer, role) = match (transpose_a, transpose_b) {
                (false, false) => {
                    let layer = n.weight_layer(b, "dense");
                    n.inputs.insert((a.addr(), "dense"), layer.clone());
                    (layer, "output")
                }
                (true, false) => match n.inputs.get(&(a.addr(), "dense")) {
                    Some(l) => (l.clone(), "dw"),
                    None => (n.current.clone(), "dw"),
                },
                (false, true) => (n.weight_layer(b, "dense"), "dx"),
                (true, true) => (n.current.clone(), "matmul"),
            };
            n.name(c, format!("{layer}.{role}"));
            n.enter(&layer)
        };
        let op = WorkspaceOp::Matmul { m, n: n_cols, k };
        self.workspace(op, &layer)
    }

    fn bias_add(&self, y: &mut Tensor, b: &Tensor) -> Result<(), TensorError> {
        y.expect_unique("bias_add")?;
        let mut n = self.namer();
        let layer = match n.name_of(y) {
            Some(name) => super::timeline::layer_of(name).to_string(),
            None => n.current.clone(),
        };
        n.name(b, format!("{layer}.b"));
        Ok(())
    }

    fn bias_grad(&self, dy: &Tensor, db: &mut Tensor) -> Result<(), TensorError> {
        let cols = dy.shape().last();
        output("bias_grad", db, &Shape::new([cols]))?;
        let layer = {
            let mut n = self.namer();
            let layer = n.current.clone();
            n.name(db, format!("{layer}.db"));
            layer
        };
        let rows = dy.numel().checked_div(cols).unwrap_or(0);
        self.workspace(WorkspaceOp::BiasGrad { rows, cols }, &layer)
    }

    fn relu(&self, x: &mut Tensor, mask: Option<&mut Tensor>) -> Result<(), TensorError> {
        x.expect_unique("relu")?;
        if let Some(mask) = mask {
            output("relu", mask, &Shape::new([x.numel().div_ceil(32)]))?;
            let mut n = self.namer();
            let layer = n.new_layer("relu");
            n.name(mask, format!("{layer}.mask"));
            n.masks.insert(mask.addr(), layer.clone());
            n.name(x, format!("{layer}.output"));
            n.enter(&layer);
        }
        Ok(())
    }

    fn relu_bwd(&self, dy: &mut Tensor, mask: &Tensor) -> Result<(), TensorError> {
        dy.expect_unique("relu_bwd")?;
        let mut n = self.namer();
        let layer = match n.masks.get(&mask.addr()) {
            Some(l) => l.clone(),
            None => n.current.clone(),
        };
        n.name(dy, format!("{layer}.dx"));
        n.enter(&layer);
        Ok(())
    }

    fn softmax_xent(
        &self,
        logits: &Tensor,
        labels: &Tensor,
        dlogits: &mut Tensor,
    ) -> Result<f32, TensorError> {
        const OP: &str = "softmax_xent";
        let (rows, classes) = stax_tensor::backend::softmax_xent_dims(logits.shape())?;
        labels.expect_shape(OP, logits.shape())?;
        output(OP, dlogits, logits.shape())?;
        {
            let mut n = self.namer();
            n.name(dlogits, "loss.dlogits".into());
            n.enter("loss");
        }
        self.workspace(WorkspaceOp::SoftmaxXent { rows, classes }, "loss")?;
        Ok(0.0)
    }

    fn adam_update(
        &self,
        p: &mut Tensor,
        g: &Tensor,
        m: &mut Tensor,
        v: &mut Tensor,
        _h: &AdamHyper,
    ) -> Result<(), TensorError> {
        const OP: &str = "adam_update";
        let shape = p.shape().clone();
        output(OP, p, &shape)?;
        g.expect_shape(OP, &shape)?;
        output(OP, m, &shape)?;
        output(OP, v, &shape)?;
        let mut n = self.namer();
        let param = n.name_of(p).unwrap_or("param").to_string();
        n.name(m, format!("{param}.m"));
        n.name(v, format!("{param}.v"));
        n.enter("adam");
        Ok(())
    }

    fn synchronize(&self) -> Result<(), TensorError> {
        Ok(())
    }

    fn driver_memory(&self) -> Result<Option<(u64, u64)>, TensorError> {
        Ok(None)
    }

    fn workspace_schedule(&self, op: &WorkspaceOp) -> Result<Vec<WorkspaceStep>, TensorError> {
        self.target.workspace_schedule(op)
    }
}
