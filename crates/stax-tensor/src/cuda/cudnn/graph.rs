//! The conv passes through cuDNN's graph API (its backend descriptors): one operation graph per
//! pass, the engine configurations cuDNN's heuristics list for it (modes A and FALLBACK), each
//! finalized into an execution plan with its workspace size, and execution by variant pack.
//!
//! These are the engines PyTorch and XLA run (through cudnn-frontend); the legacy
//! `cudnnConvolution*` calls reach only some of them. Measured on the H200 on 2026-12-02
//! (`conv_bench.py` in BENCHMARKS.md): ResNet-50's 1x1 convs in bf16 take 0.045-0.077 ms
//! through these engines against 0.28-0.38 ms for the legacy API's best forward algorithm,
//! and its 3x3 filter gradients in TF32 0.16-0.30 ms against about 0.8 ms (FFMA `wgrad_alg0`).
//!
//! Tensors are described as the legacy descriptors are (`[n, c, h, w]` with NHWC or NCHW
//! strides, the filter `[k, c, r, s]` with KRSC or KCRS strides), with unique ids 1 (x or dx),
//! 2 (w or dw) and 3 (y or dy) and a 16-byte alignment (every device allocation is 256-byte
//! aligned; [`execute`] checks). Engines are filtered by their notes: under
//! [`Precision::Highest`] an f32 convolution takes no engine marked `TENSOR_CORE` or
//! `DOWN_CONVERT_INPUTS` (PyTorch's filter without TF32); no engine with
//! `REDUCED_PRECISION_REDUCTION` (accumulation must stay f32) or `RUNTIME_COMPILATION` (a
//! compile per shape at calibration) is taken.

use super::calls::{Ws, cudnn, data_type};
use super::{CudnnConv, Operands};
use crate::{ConvPass, DType, Layout, Precision, TensorError};
use cudarc::cudnn::sys;
use std::ffi::c_void;
use sys::cudnnBackendAttributeName_t as A;
use sys::cudnnBackendAttributeType_t as T;
use sys::cudnnBackendDescriptorType_t as D;
use sys::cudnnBackendNumericalNote_t as Note;

/// Unique ids of the three tensors in every graph and variant pack.
const UIDS: [i64; 3] = [1, 2, 3];

/// The alignment every tensor is described with, in bytes.
const ALIGNMENT: u64 = 16;

/// An owned backend descriptor, destroyed on drop.
#[derive(Debug)]
struct Desc(sys::cudnnBackendDescriptor_t);

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by `Desc::new`, destroyed once.
        let _ = unsafe { sys::cudnnBackendDestroyDescriptor(self.0) };
    }
}

impl Desc {
    fn new(kind: D) -> Result<Desc, TensorError> {
        let mut d = std::ptr::null_mut();
        // SAFETY: `d` is a writable descriptor slot.
        unsafe { sys::cudnnBackendCreateDescriptor(kind, &mut d) }
            .result()
            .map_err(cudnn("cudnnBackendCreateDescriptor"))?;
        Ok(Desc(d))
    }

    /// Sets attribute `name` to `values`.
    ///
    /// # Safety
    /// `V` must be the C type of `ty` (i64 for INT64, f32 for FLOAT, a descriptor or handle
    /// pointer, a `#[repr(u32)]` cuDNN enum for the enum types).
    unsafe fn set<V>(&self, name: A, ty: T, values: &[V]) -> Result<(), TensorError> {
        let n = values.len() as i64;
        // SAFETY: live descriptor; `values` holds `n` elements of `ty`'s C type (caller).
        unsafe { sys::cudnnBackendSetAttribute(self.0, name, ty, n, values.as_ptr().cast()) }
            .result()
            .map_err(cudnn("cudnnBackendSetAttribute"))
    }

    /// Reads attribute `name` into `out`; returns how many elements cuDNN has (at most
    /// `out.len()` are written).
    ///
    /// # Safety
    /// As [`Desc::set`]; for descriptor types `out` holds descriptors created for them.
    unsafe fn get<V>(&self, name: A, ty: T, out: &mut [V]) -> Result<usize, TensorError> {
        let mut n = 0i64;
        let cap = out.len() as i64;
        // an empty `out` asks for the count: cuDNN then wants a null array (given a non-null
        // one, it reports the 0 elements it wrote)
        let array = if out.is_empty() {
            std::ptr::null_mut()
        } else {
            out.as_mut_ptr().cast()
        };
        // SAFETY: live descriptor; `out` has room for `cap` elements of `ty`'s C type.
        unsafe { sys::cudnnBackendGetAttribute(self.0, name, ty, cap, &mut n, array) }
            .result()
            .map_err(cudnn("cudnnBackendGetAttribute"))?;
        Ok(n.max(0) as usize)
    }

    fn finalize(&self) -> Result<(), TensorError> {
        // SAFETY: live descriptor with its required attributes set.
        unsafe { sys::cudnnBackendFinalize(self.0) }
            .result()
            .map_err(cudnn("cudnnBackendFinalize"))
    }
}

/// One usable engine configuration of a pass, finalized into an execution plan.
#[derive(Debug)]
pub(super) struct Engine {
    plan: Desc,
    /// Workspace bytes its execution needs.
    pub(super) workspace: usize,
    /// cuDNN's global index of the engine (several configurations may share one).
    pub(super) global: i64,
    /// Whether it runs on tensor cores (note `TENSOR_CORE`).
    pub(super) tensor_core: bool,
    /// Whether it gives the same bits on every run (no `NONDETERMINISTIC` note).
    pub(super) deterministic: bool,
}

/// The operation graph of one pass and its usable engines, kept alive together.
#[derive(Debug)]
pub(super) struct Engines {
    /// The usable configurations, in cuDNN's heuristic order (mode A first).
    pub(super) engines: Vec<Engine>,
    /// Why each configuration or heuristic mode that gave no usable engine was left out.
    pub(super) skipped: Vec<String>,
    _graph: [Desc; 6],
}

/// `[n, c, h, w]` dims and strides of an `n x c x h x w` tensor stored NHWC or NCHW.
fn tensor(uid: i64, dtype: DType, nchw: [usize; 4], layout: Layout) -> Result<Desc, TensorError> {
    let [n, c, h, w] = nchw.map(|d| d as i64);
    let strides = match layout {
        Layout::Nhwc => [h * w * c, 1, w * c, c],
        Layout::Nchw => [c * h * w, h * w, w, 1],
    };
    let d = Desc::new(D::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
    // SAFETY: each value has its attribute type's C type.
    unsafe {
        d.set(
            A::CUDNN_ATTR_TENSOR_DATA_TYPE,
            T::CUDNN_TYPE_DATA_TYPE,
            &[data_type(dtype)?],
        )?;
        d.set(
            A::CUDNN_ATTR_TENSOR_DIMENSIONS,
            T::CUDNN_TYPE_INT64,
            &[n, c, h, w],
        )?;
        d.set(A::CUDNN_ATTR_TENSOR_STRIDES, T::CUDNN_TYPE_INT64, &strides)?;
        d.set(A::CUDNN_ATTR_TENSOR_UNIQUE_ID, T::CUDNN_TYPE_INT64, &[uid])?;
        d.set(
            A::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT,
            T::CUDNN_TYPE_INT64,
            &[ALIGNMENT as i64],
        )?;
    }
    d.finalize()?;
    Ok(d)
}

/// The convolution descriptor: cross-correlation, f32 compute, symmetric padding.
fn convolution(c: &CudnnConv) -> Result<Desc, TensorError> {
    let g = &c.geometry;
    let two = |a: usize, b: usize| [a as i64, b as i64];
    let d = Desc::new(D::CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)?;
    let f32t = sys::cudnnDataType_t::CUDNN_DATA_FLOAT;
    let mode = sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION;
    let int64 = T::CUDNN_TYPE_INT64;
    // SAFETY: each value has its attribute type's C type.
    unsafe {
        d.set(
            A::CUDNN_ATTR_CONVOLUTION_COMP_TYPE,
            T::CUDNN_TYPE_DATA_TYPE,
            &[f32t],
        )?;
        d.set(
            A::CUDNN_ATTR_CONVOLUTION_CONV_MODE,
            T::CUDNN_TYPE_CONVOLUTION_MODE,
            &[mode],
        )?;
        d.set(A::CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, int64, &[2i64])?;
        let dilations = two(g.dilation_h, g.dilation_w);
        d.set(A::CUDNN_ATTR_CONVOLUTION_DILATIONS, int64, &dilations)?;
        let strides = two(g.stride_h, g.stride_w);
        d.set(A::CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, int64, &strides)?;
        let pad = two(c.pad_h, c.pad_w);
        d.set(A::CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, int64, &pad)?;
        d.set(A::CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, int64, &pad)?;
    }
    d.finalize()?;
    Ok(d)
}

/// The operation of `pass` over tensors `[x, w, y]` (alpha 1, beta 0: the output overwritten).
fn operation(pass: ConvPass, conv: &Desc, t: &[Desc; 3]) -> Result<Desc, TensorError> {
    use A::*;
    let (kind, [a, b, cd, x, w, y]) = match pass {
        ConvPass::Forward => (
            D::CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
            [
                CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
                CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
            ],
        ),
        ConvPass::BackwardData => (
            D::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
            [
                CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
                CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
                CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
                CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
                CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
            ],
        ),
        ConvPass::BackwardFilter => (
            D::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
            [
                CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
                CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
                CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
                CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
                CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
                CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
            ],
        ),
    };
    let op = Desc::new(kind)?;
    let desc = T::CUDNN_TYPE_BACKEND_DESCRIPTOR;
    // SAFETY: f32 scalars for FLOAT, live finalized descriptors for BACKEND_DESCRIPTOR.
    unsafe {
        op.set(a, T::CUDNN_TYPE_FLOAT, &[1.0f32])?;
        op.set(b, T::CUDNN_TYPE_FLOAT, &[0.0f32])?;
        op.set(cd, desc, &[conv.0])?;
        op.set(x, desc, &[t[0].0])?;
        op.set(w, desc, &[t[1].0])?;
        op.set(y, desc, &[t[2].0])?;
    }
    op.finalize()?;
    Ok(op)
}

/// The usable engines of `pass` of `c` under `precision`, in cuDNN's heuristic order.
///
/// # Errors
/// [`TensorError::Cudnn`] when the graph itself cannot be built; engines cuDNN refuses to
/// finalize are left out, not errors.
pub(super) fn engines(
    handle: sys::cudnnHandle_t,
    c: &CudnnConv,
    pass: ConvPass,
    precision: Precision,
) -> Result<Engines, TensorError> {
    let g = &c.geometry;
    let (n, k) = (g.n, g.c_out);
    let tensors = [
        tensor(UIDS[0], c.dtype, [n, c.c, c.h, c.w], g.layout)?,
        tensor(UIDS[1], c.dtype, [k, c.c, g.kh, g.kw], g.layout)?,
        tensor(UIDS[2], c.dtype, [n, k, g.out_h, g.out_w], g.layout)?,
    ];
    let conv = convolution(c)?;
    let op = operation(pass, &conv, &tensors)?;
    let graph = Desc::new(D::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
    // SAFETY: a live handle and a finalized operation descriptor.
    unsafe {
        graph.set(
            A::CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
            T::CUDNN_TYPE_HANDLE,
            &[handle],
        )?;
        let desc = T::CUDNN_TYPE_BACKEND_DESCRIPTOR;
        graph.set(A::CUDNN_ATTR_OPERATIONGRAPH_OPS, desc, &[op.0])?;
    }
    graph.finalize()?;
    let (mut engines, mut skipped) = (Vec::new(), Vec::new());
    for mode in [
        sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A,
        sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_FALLBACK,
    ] {
        // a mode that lists nothing for this graph is no error: it is reported
        let cfgs = configs(&graph, mode).unwrap_or_else(|e| {
            skipped.push(format!("{mode:?}: {e}"));
            Vec::new()
        });
        for cfg in cfgs {
            match engine(handle, &cfg, c.dtype, precision) {
                Ok(e) if engines.iter().any(|o: &Engine| same(o, &e)) => {}
                Ok(e) => engines.push(e),
                Err(why) => skipped.push(format!("{mode:?}: {why}")),
            }
        }
    }
    let [t0, t1, t2] = tensors;
    Ok(Engines {
        engines,
        skipped,
        _graph: [graph, op, conv, t0, t1, t2],
    })
}

/// Two plans of one engine with the same workspace are taken for the same configuration (the
/// FALLBACK list repeats mode A's).
fn same(a: &Engine, b: &Engine) -> bool {
    a.global == b.global && a.workspace == b.workspace
}

/// The engine configurations the heuristics of `mode` list for `graph`.
fn configs(graph: &Desc, mode: sys::cudnnBackendHeurMode_t) -> Result<Vec<Desc>, TensorError> {
    let heur = Desc::new(D::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
    let desc = T::CUDNN_TYPE_BACKEND_DESCRIPTOR;
    // SAFETY: a finalized graph; the mode enum; `cfgs` are created ENGINECFG descriptors.
    unsafe {
        heur.set(A::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, desc, &[graph.0])?;
        heur.set(
            A::CUDNN_ATTR_ENGINEHEUR_MODE,
            T::CUDNN_TYPE_HEUR_MODE,
            &[mode],
        )?;
        heur.finalize()?;
        let mut none: [sys::cudnnBackendDescriptor_t; 0] = [];
        let count = heur.get(A::CUDNN_ATTR_ENGINEHEUR_RESULTS, desc, &mut none)?;
        let cfgs = (0..count)
            .map(|_| Desc::new(D::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR))
            .collect::<Result<Vec<_>, _>>()?;
        let mut raw: Vec<_> = cfgs.iter().map(|c| c.0).collect();
        let got = heur.get(A::CUDNN_ATTR_ENGINEHEUR_RESULTS, desc, &mut raw)?;
        Ok(cfgs.into_iter().take(got).collect())
    }
}

/// `cfg` as a usable [`Engine`], or why not: its notes rule it out (see the module docs), or
/// cuDNN refuses to describe it or to finalize its plan.
fn engine(
    handle: sys::cudnnHandle_t,
    cfg: &Desc,
    dtype: DType,
    precision: Precision,
) -> Result<Engine, String> {
    let eng = Desc::new(D::CUDNN_BACKEND_ENGINE_DESCRIPTOR).map_err(|e| e.to_string())?;
    let mut numerical = [u32::MAX; 16];
    let mut behavior = [u32::MAX; 16];
    let mut global = [-1i64];
    let desc = T::CUDNN_TYPE_BACKEND_DESCRIPTOR;
    // SAFETY: `eng` is a created ENGINE descriptor; the notes are C enums (u32), the index i64.
    let notes = unsafe {
        cfg.get(A::CUDNN_ATTR_ENGINECFG_ENGINE, desc, &mut [eng.0])
            .and_then(|_| {
                eng.get(
                    A::CUDNN_ATTR_ENGINE_GLOBAL_INDEX,
                    T::CUDNN_TYPE_INT64,
                    &mut global,
                )
            })
            .and_then(|_| {
                let n = T::CUDNN_TYPE_NUMERICAL_NOTE;
                eng.get(A::CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, n, &mut numerical)
            })
            .and_then(|nn| {
                let b = T::CUDNN_TYPE_BEHAVIOR_NOTE;
                Ok((
                    nn,
                    eng.get(A::CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, b, &mut behavior)?,
                ))
            })
    };
    let (nn, nb) = notes.map_err(|e| format!("engine {}: {e}", global[0]))?;
    let (numerical, behavior) = (&numerical[..nn.min(16)], &behavior[..nb.min(16)]);
    let has = |note: Note| numerical.contains(&(note as u32));
    let compile = sys::cudnnBackendBehaviorNote_t::CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION;
    let tensor_core = has(Note::CUDNN_NUMERICAL_NOTE_TENSOR_CORE);
    let full_f32 = dtype == DType::F32 && precision == Precision::Highest;
    let converts = tensor_core || has(Note::CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS);
    if behavior.contains(&(compile as u32))
        || has(Note::CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION)
        || (full_f32 && converts)
    {
        let g = global[0];
        return Err(format!(
            "engine {g} left out by its notes (numerical {numerical:?}, behavior {behavior:?})"
        ));
    }
    let planned = || -> Result<Engine, TensorError> {
        let plan = Desc::new(D::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
        let mut workspace = [0i64];
        // SAFETY: a live handle and a finalized engine configuration; the size is an i64.
        unsafe {
            plan.set(
                A::CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
                T::CUDNN_TYPE_HANDLE,
                &[handle],
            )?;
            plan.set(A::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, desc, &[cfg.0])?;
            plan.finalize()?;
            let ws = A::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE;
            plan.get(ws, T::CUDNN_TYPE_INT64, &mut workspace)?;
        }
        Ok(Engine {
            plan,
            workspace: usize::try_from(workspace[0]).unwrap_or(usize::MAX),
            global: global[0],
            tensor_core,
            deterministic: !has(Note::CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC),
        })
    };
    planned().map_err(|e| format!("engine {}: {e}", global[0]))
}

/// Runs `e` on `o` (x, w, y by unique id) with `ws` (at least `e.workspace` bytes).
///
/// # Errors
/// [`TensorError::InvalidArgument`] if an address is not 16-byte aligned (an internal error:
/// every allocation is 256-byte aligned) or the workspace is short; [`TensorError::Cudnn`].
pub(super) fn execute(
    handle: sys::cudnnHandle_t,
    e: &Engine,
    o: Operands,
    ws: Ws,
) -> Result<(), TensorError> {
    let ws_addr = ws.addr;
    let short = ws.bytes < e.workspace;
    if short || [o.x, o.w, o.y, ws_addr].iter().any(|a| a % ALIGNMENT != 0) {
        return Err(TensorError::InvalidArgument {
            op: "conv2d",
            reason: format!(
                "internal: cuDNN engine {} given operands {o:?} and workspace {ws_addr:#x} \
                 ({} B, needs {}); they must be {ALIGNMENT}-byte aligned",
                e.global, ws.bytes, e.workspace
            ),
        });
    }
    let pack = Desc::new(D::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
    let ptrs = [o.x, o.w, o.y].map(|a| a as *mut c_void);
    let workspace = ws_addr as *mut c_void;
    // SAFETY: the ids are i64, the device pointers are buffers of the graph's shapes (checked
    // by the caller) and the workspace holds at least the plan's bytes (checked above).
    unsafe {
        pack.set(
            A::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
            T::CUDNN_TYPE_INT64,
            &UIDS,
        )?;
        pack.set(
            A::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
            T::CUDNN_TYPE_VOID_PTR,
            &ptrs,
        )?;
        pack.set(
            A::CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
            T::CUDNN_TYPE_VOID_PTR,
            &[workspace],
        )?;
        pack.finalize()?;
        sys::cudnnBackendExecute(handle, e.plan.0, pack.0)
            .result()
            .map_err(cudnn("cudnnBackendExecute"))
    }
}
