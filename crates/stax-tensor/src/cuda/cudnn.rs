//! cuDNN convolutions in NHWC with KRSC (= OHWI) filters: descriptors, algorithm choice once
//! per geometry under a workspace budget, and the three passes.
//!
//! Algorithms are chosen on first use of a (geometry, precision, pass): cuDNN's heuristics
//! (`cudnnGet*Algorithm_v7`) list the candidates and their workspace needs, then
//! `cudnnFind*AlgorithmEx` times those that fit the budget on the call's own buffers, with a
//! workspace from our allocator sized to the largest candidate that fits. The fastest is kept
//! with its workspace size and reported by [`ConvPlanInfo`]. Every later call of that pass
//! allocates exactly that workspace (tagged `Workspace`) and frees it afterwards.
//!
//! [`Precision::Tf32`] lets cuDNN use TF32 tensor cores (`CUDNN_DEFAULT_MATH`, then the math
//! type of the chosen algorithm); [`Precision::Highest`] forces `CUDNN_FMA_MATH`.

use crate::{Conv2dGeometry, ConvPass, Precision, TensorError};
use cudarc::cudnn::{result, sys};
use cudarc::driver::CudaStream;
use stax_alloc::{Allocation, Allocator, Category};
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex};

/// Default bound on one cuDNN call's workspace, in bytes (256 MiB): enough for the fast
/// implicit-GEMM and Winograd kernels of the seed's 3x3 convolutions, small beside its
/// 1 GB activations, and far from the multi-GB autotuning scratch JAX takes.
pub const DEFAULT_WORKSPACE_LIMIT: usize = 256 << 20;

/// The algorithm chosen for one pass of one convolution, as the trainer reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct ConvPlanInfo {
    /// The convolution (shapes, strides, padding).
    pub geometry: Conv2dGeometry,
    /// The precision it was chosen for.
    pub precision: Precision,
    /// Which pass.
    pub pass: ConvPass,
    /// cuDNN's name for the algorithm, e.g. `CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM`.
    pub algorithm: String,
    /// cuDNN's math type for it: `CUDNN_DEFAULT_MATH` or `CUDNN_TENSOR_OP_MATH` may use TF32
    /// tensor cores (only under [`Precision::Tf32`]), `CUDNN_FMA_MATH` never does.
    pub math: String,
    /// cuDNN workspace bytes each call of this pass allocates (tagged `Workspace`).
    pub workspace_bytes: usize,
    /// Further workspace bytes each call allocates for layout changes: the OHWI filter copy,
    /// a padded input or input gradient (asymmetric padding), the bias-gradient partials.
    pub layout_bytes: usize,
    /// Time `cudnnFind*AlgorithmEx` measured for it, in ms.
    pub time_ms: f32,
    /// Every candidate cuDNN's heuristics listed, with its workspace need and, for those that
    /// were timed, the time: what the choice was made from.
    pub candidates: Vec<ConvCandidate>,
}

/// One algorithm cuDNN offered for a pass.
#[derive(Debug, Clone, PartialEq)]
pub struct ConvCandidate {
    /// cuDNN's name for the algorithm.
    pub algorithm: String,
    /// cuDNN's math type for it.
    pub math: String,
    /// Workspace bytes it needs.
    pub workspace_bytes: usize,
    /// Time measured by `cudnnFind*AlgorithmEx`, in ms, or None if it was not timed (over the
    /// workspace budget, or not supported).
    pub time_ms: Option<f32>,
    /// cuDNN's status for it (`CUDNN_STATUS_SUCCESS` when usable).
    pub status: String,
}

fn cudnn(op: &'static str) -> impl FnOnce(result::CudnnError) -> TensorError {
    move |source| TensorError::Cudnn { op, source }
}

/// What cuDNN computes: the geometry with symmetric padding `(pad_h, pad_w)` on an input of
/// `h x w` (possibly already extended with explicit zeros; see `conv.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct CudnnConv {
    /// The caller's geometry (the plan's key and report).
    pub geometry: Conv2dGeometry,
    /// Input height cuDNN sees.
    pub h: usize,
    /// Input width cuDNN sees.
    pub w: usize,
    /// Symmetric padding rows.
    pub pad_h: usize,
    /// Symmetric padding columns.
    pub pad_w: usize,
    /// Further workspace bytes the caller allocates around the cuDNN call (for reports).
    pub layout_bytes: usize,
}

/// Device addresses of one pass: `x` NHWC input (or its gradient), `w` OHWI filter (or its
/// gradient), `y` NHWC output (or its gradient); the pass decides which one is written.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Operands {
    /// Input or input gradient.
    pub x: u64,
    /// Filter or filter gradient (OHWI).
    pub w: u64,
    /// Output or output gradient.
    pub y: u64,
}

/// Tensor, filter and convolution descriptors of one geometry.
#[derive(Debug)]
struct Descriptors {
    x: sys::cudnnTensorDescriptor_t,
    w: sys::cudnnFilterDescriptor_t,
    y: sys::cudnnTensorDescriptor_t,
    conv: sys::cudnnConvolutionDescriptor_t,
}

impl Drop for Descriptors {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created in `Descriptors::new` and is destroyed once.
        unsafe {
            let _ = result::destroy_tensor_descriptor(self.x);
            let _ = result::destroy_filter_descriptor(self.w);
            let _ = result::destroy_tensor_descriptor(self.y);
            let _ = result::destroy_convolution_descriptor(self.conv);
        }
    }
}

fn int(v: usize) -> Result<c_int, TensorError> {
    c_int::try_from(v).map_err(|_| TensorError::InvalidArgument {
        op: "conv2d",
        reason: format!("dimension {v} exceeds cuDNN's 32-bit limit"),
    })
}

impl Descriptors {
    fn new(c: &CudnnConv) -> Result<Descriptors, TensorError> {
        let g = &c.geometry;
        let nhwc = sys::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC;
        let f32t = sys::cudnnDataType_t::CUDNN_DATA_FLOAT;
        let d = Descriptors {
            x: result::create_tensor_descriptor().map_err(cudnn("cudnnCreateTensorDescriptor"))?,
            w: result::create_filter_descriptor().map_err(cudnn("cudnnCreateFilterDescriptor"))?,
            y: result::create_tensor_descriptor().map_err(cudnn("cudnnCreateTensorDescriptor"))?,
            conv: result::create_convolution_descriptor()
                .map_err(cudnn("cudnnCreateConvolutionDescriptor"))?,
        };
        let (n, ci, co) = (int(g.n)?, int(g.c_in)?, int(g.c_out)?);
        // SAFETY: the descriptors were just created and are owned by `d`.
        unsafe {
            result::set_tensor4d_descriptor(d.x, nhwc, f32t, [n, ci, int(c.h)?, int(c.w)?])
                .map_err(cudnn("cudnnSetTensor4dDescriptor(x)"))?;
            result::set_filter4d_descriptor(d.w, f32t, nhwc, [co, ci, int(g.kh)?, int(g.kw)?])
                .map_err(cudnn("cudnnSetFilter4dDescriptor"))?;
            result::set_tensor4d_descriptor(d.y, nhwc, f32t, [n, co, int(g.out_h)?, int(g.out_w)?])
                .map_err(cudnn("cudnnSetTensor4dDescriptor(y)"))?;
            result::set_convolution2d_descriptor(
                d.conv,
                int(c.pad_h)?,
                int(c.pad_w)?,
                int(g.stride_h)?,
                int(g.stride_w)?,
                1,
                1,
                sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                f32t,
            )
            .map_err(cudnn("cudnnSetConvolution2dDescriptor"))?;
        }
        let mut out = [0 as c_int; 4];
        // SAFETY: valid descriptors; four writable ints.
        unsafe {
            let [a, b, h, w] = &mut out;
            sys::cudnnGetConvolution2dForwardOutputDim(d.conv, d.x, d.w, a, b, h, w)
        }
        .result()
        .map_err(cudnn("cudnnGetConvolution2dForwardOutputDim"))?;
        if out != [n, co, int(g.out_h)?, int(g.out_w)?] {
            return Err(TensorError::InvalidArgument {
                op: "conv2d",
                reason: format!("cuDNN computes output NCHW {out:?} for geometry {g:?}"),
            });
        }
        Ok(d)
    }

    fn set_math(&self, math: sys::cudnnMathType_t) -> Result<(), TensorError> {
        // SAFETY: live convolution descriptor.
        unsafe { result::set_convolution_math_type(self.conv, math) }
            .map_err(cudnn("cudnnSetConvolutionMathType"))
    }
}

/// One algorithm candidate of any pass, as cuDNN's perf structs describe it.
#[derive(Debug, Clone, Copy)]
struct Choice {
    algo: Algo,
    ok: bool,
    status: sys::cudnnStatus_t,
    time_ms: f32,
    workspace: usize,
    math: sys::cudnnMathType_t,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Algo {
    Fwd(sys::cudnnConvolutionFwdAlgo_t),
    Data(sys::cudnnConvolutionBwdDataAlgo_t),
    Filter(sys::cudnnConvolutionBwdFilterAlgo_t),
}

impl Algo {
    fn name(self) -> String {
        match self {
            Algo::Fwd(a) => format!("{a:?}"),
            Algo::Data(a) => format!("{a:?}"),
            Algo::Filter(a) => format!("{a:?}"),
        }
    }
}

macro_rules! choices {
    ($perf:expr, $count:expr, $variant:ident) => {
        $perf[..$count.max(0) as usize]
            .iter()
            .map(|p| Choice {
                algo: Algo::$variant(p.algo),
                ok: p.status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS,
                status: p.status,
                time_ms: p.time,
                workspace: p.memory,
                math: p.mathType,
            })
            .collect::<Vec<_>>()
    };
}

/// Plans of one geometry: its descriptors and the choice of each pass made so far.
#[derive(Debug)]
struct Plan {
    desc: Descriptors,
    chosen: [Option<Choice>; 3],
    candidates: [Vec<ConvCandidate>; 3],
    layout_bytes: [usize; 3],
}

#[derive(Debug)]
struct State {
    handle: sys::cudnnHandle_t,
    plans: HashMap<(Conv2dGeometry, Precision), Plan>,
}

// SAFETY: the cuDNN handle and descriptors are used from one thread at a time (the Mutex in
// `Dnn`); cuDNN allows a handle to move between threads.
unsafe impl Send for State {}

impl Drop for State {
    fn drop(&mut self) {
        self.plans.clear();
        // SAFETY: the handle was created in `Dnn::new` and is destroyed once, after its plans.
        let _ = unsafe { result::destroy_handle(self.handle) };
    }
}

/// A cuDNN handle on the compute stream with its plan cache.
#[derive(Debug)]
pub(crate) struct Dnn {
    state: Mutex<State>,
}

const MAX_ALGOS: usize = 16;

impl Dnn {
    /// A handle on `stream`.
    ///
    /// # Errors
    /// [`TensorError::Cudnn`] naming the failed call.
    pub(crate) fn new(stream: &Arc<CudaStream>) -> Result<Dnn, TensorError> {
        let handle = result::create_handle().map_err(cudnn("cudnnCreate"))?;
        let state = State {
            handle,
            plans: HashMap::new(),
        };
        // SAFETY: valid handle and live stream (the backend keeps it alive).
        unsafe { result::set_stream(state.handle, stream.cu_stream() as sys::cudaStream_t) }
            .map_err(cudnn("cudnnSetStream"))?;
        Ok(Dnn {
            state: Mutex::new(state),
        })
    }

    /// Every choice made so far, sorted by geometry and pass order.
    pub(crate) fn plans(&self) -> Vec<ConvPlanInfo> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        for ((geometry, precision), plan) in &state.plans {
            for pass in [
                ConvPass::Forward,
                ConvPass::BackwardData,
                ConvPass::BackwardFilter,
            ] {
                let Some(c) = plan.chosen[pass as usize] else {
                    continue;
                };
                out.push(ConvPlanInfo {
                    geometry: *geometry,
                    precision: *precision,
                    pass,
                    algorithm: c.algo.name(),
                    math: format!("{:?}", c.math),
                    workspace_bytes: c.workspace,
                    layout_bytes: plan.layout_bytes[pass as usize],
                    time_ms: c.time_ms,
                    candidates: plan.candidates[pass as usize].clone(),
                });
            }
        }
        out.sort_by_key(|p| (format!("{:?}", p.geometry), p.pass as u8));
        out
    }

    /// The cuDNN workspace bytes of `pass` for `geometry` and `precision`, if its algorithm
    /// has been chosen.
    pub(crate) fn chosen_workspace(
        &self,
        geometry: &Conv2dGeometry,
        precision: Precision,
        pass: ConvPass,
    ) -> Option<usize> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let plan = state.plans.get(&(*geometry, precision))?;
        plan.chosen[pass as usize].map(|c| c.workspace)
    }

    /// Chooses the algorithm of `pass` (if not chosen yet) by timing the candidates on `ops`,
    /// whose output is overwritten; returns its workspace bytes.
    ///
    /// # Errors
    /// As [`Dnn::run`].
    pub(crate) fn prepare(
        &self,
        pass: ConvPass,
        conv: &CudnnConv,
        precision: Precision,
        ops: Operands,
        limit: usize,
        alloc: &Arc<Allocator>,
    ) -> Result<usize, TensorError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (_, choice) = plan_and_choice(&mut state, pass, conv, precision, ops, limit, alloc)?;
        Ok(choice.workspace)
    }

    /// Runs `pass` of `conv` on `ops` (output overwritten), choosing its algorithm first if
    /// this is the pass's first call for this geometry and precision. Workspaces come from
    /// `alloc` (tagged `Workspace`) and are at most `limit` bytes.
    ///
    /// # Errors
    /// [`TensorError::Cudnn`]; [`TensorError::Alloc`] for the workspace;
    /// [`TensorError::InvalidArgument`] if no algorithm fits the budget.
    pub(crate) fn run(
        &self,
        pass: ConvPass,
        conv: &CudnnConv,
        precision: Precision,
        ops: Operands,
        limit: usize,
        alloc: &Arc<Allocator>,
    ) -> Result<(), TensorError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let handle = state.handle;
        let (plan, choice) = plan_and_choice(&mut state, pass, conv, precision, ops, limit, alloc)?;
        plan.desc.set_math(if precision == Precision::Highest {
            sys::cudnnMathType_t::CUDNN_FMA_MATH
        } else {
            choice.math
        })?;
        let ws = workspace(alloc, choice.workspace)?;
        execute(handle, &plan.desc, choice.algo, ops, ws.as_ref())
    }
}

/// The plan of `conv` (created on first use) and the choice for `pass` (made on first use).
fn plan_and_choice<'s>(
    state: &'s mut State,
    pass: ConvPass,
    conv: &CudnnConv,
    precision: Precision,
    ops: Operands,
    limit: usize,
    alloc: &Arc<Allocator>,
) -> Result<(&'s mut Plan, Choice), TensorError> {
    let handle = state.handle;
    let plan = match state.plans.entry((conv.geometry, precision)) {
        Entry::Occupied(e) => e.into_mut(),
        Entry::Vacant(e) => e.insert(Plan {
            desc: Descriptors::new(conv)?,
            chosen: [None; 3],
            candidates: Default::default(),
            layout_bytes: [0; 3],
        }),
    };
    plan.layout_bytes[pass as usize] = conv.layout_bytes;
    if let Some(c) = plan.chosen[pass as usize] {
        return Ok((plan, c));
    }
    plan.desc.set_math(match precision {
        Precision::Tf32 => sys::cudnnMathType_t::CUDNN_DEFAULT_MATH,
        Precision::Highest => sys::cudnnMathType_t::CUDNN_FMA_MATH,
    })?;
    let (c, all) = choose(handle, &plan.desc, pass, ops, limit, alloc)?;
    plan.chosen[pass as usize] = Some(c);
    plan.candidates[pass as usize] = all;
    Ok((plan, c))
}

fn workspace(alloc: &Arc<Allocator>, bytes: usize) -> Result<Option<Allocation>, TensorError> {
    Ok(if bytes == 0 {
        None
    } else {
        Some(alloc.allocate(bytes, Category::Workspace)?)
    })
}

/// Lists candidates by heuristics, times those within `limit` with FindEx, keeps the fastest;
/// returns it with every candidate for the report.
fn choose(
    handle: sys::cudnnHandle_t,
    d: &Descriptors,
    pass: ConvPass,
    ops: Operands,
    limit: usize,
    alloc: &Arc<Allocator>,
) -> Result<(Choice, Vec<ConvCandidate>), TensorError> {
    let heuristic = candidates(handle, d, pass, None)?;
    let budget = heuristic
        .iter()
        .filter(|c| c.ok && c.workspace <= limit)
        .map(|c| c.workspace)
        .max()
        .ok_or_else(|| TensorError::InvalidArgument {
            op: "conv2d",
            reason: format!(
                "no cuDNN {pass:?} algorithm fits the workspace limit of {limit} bytes"
            ),
        })?;
    let ws = workspace(alloc, budget)?;
    let timed = candidates(handle, d, pass, Some((ops, ws.as_ref(), budget)))?;
    let report = heuristic
        .iter()
        .map(|h| {
            let t = timed
                .iter()
                .find(|t| t.algo == h.algo && t.math == h.math && t.ok);
            ConvCandidate {
                algorithm: h.algo.name(),
                math: format!("{:?}", h.math),
                workspace_bytes: t.map_or(h.workspace, |t| t.workspace),
                time_ms: t.map(|t| t.time_ms),
                status: format!("{:?}", t.map_or(h.status, |t| t.status)),
            }
        })
        .collect();
    let best = timed
        .into_iter()
        .chain(heuristic)
        .find(|c| c.ok && c.workspace <= budget)
        .ok_or_else(|| TensorError::InvalidArgument {
            op: "conv2d",
            reason: format!("cuDNN found no {pass:?} algorithm within {budget} workspace bytes"),
        })?;
    Ok((best, report))
}

/// Heuristic candidates (`find == None`), or candidates timed on `ops` with a workspace.
fn candidates(
    handle: sys::cudnnHandle_t,
    d: &Descriptors,
    pass: ConvPass,
    find: Option<(Operands, Option<&Allocation>, usize)>,
) -> Result<Vec<Choice>, TensorError> {
    let mut count: c_int = 0;
    let req = MAX_ALGOS as c_int;
    // SAFETY (all arms): live handle and descriptors; `perf` has room for `req` results;
    // for FindEx the operands are device buffers of the descriptors' shapes and the workspace
    // holds `bytes` bytes (or is null with 0 bytes).
    let out = match (pass, find) {
        (ConvPass::Forward, None) => unsafe {
            let mut perf = [std::mem::zeroed::<sys::cudnnConvolutionFwdAlgoPerf_t>(); MAX_ALGOS];
            result::get_convolution_forward_algorithm(
                handle,
                d.x,
                d.w,
                d.conv,
                d.y,
                req,
                &mut count,
                perf.as_mut_ptr(),
            )
            .map_err(cudnn("cudnnGetConvolutionForwardAlgorithm_v7"))?;
            choices!(perf, count, Fwd)
        },
        (ConvPass::Forward, Some((o, ws, bytes))) => unsafe {
            let mut perf = [std::mem::zeroed::<sys::cudnnConvolutionFwdAlgoPerf_t>(); MAX_ALGOS];
            sys::cudnnFindConvolutionForwardAlgorithmEx(
                handle,
                d.x,
                ptr(o.x),
                d.w,
                ptr(o.w),
                d.conv,
                d.y,
                ptr(o.y) as *mut c_void,
                req,
                &mut count,
                perf.as_mut_ptr(),
                ws_ptr(ws),
                bytes,
            )
            .result()
            .map_err(cudnn("cudnnFindConvolutionForwardAlgorithmEx"))?;
            choices!(perf, count, Fwd)
        },
        (ConvPass::BackwardData, None) => unsafe {
            let mut perf =
                [std::mem::zeroed::<sys::cudnnConvolutionBwdDataAlgoPerf_t>(); MAX_ALGOS];
            result::get_convolution_backward_data_algorithm(
                handle,
                d.w,
                d.y,
                d.conv,
                d.x,
                req,
                &mut count,
                perf.as_mut_ptr(),
            )
            .map_err(cudnn("cudnnGetConvolutionBackwardDataAlgorithm_v7"))?;
            choices!(perf, count, Data)
        },
        (ConvPass::BackwardData, Some((o, ws, bytes))) => unsafe {
            let mut perf =
                [std::mem::zeroed::<sys::cudnnConvolutionBwdDataAlgoPerf_t>(); MAX_ALGOS];
            sys::cudnnFindConvolutionBackwardDataAlgorithmEx(
                handle,
                d.w,
                ptr(o.w),
                d.y,
                ptr(o.y),
                d.conv,
                d.x,
                ptr(o.x) as *mut c_void,
                req,
                &mut count,
                perf.as_mut_ptr(),
                ws_ptr(ws),
                bytes,
            )
            .result()
            .map_err(cudnn("cudnnFindConvolutionBackwardDataAlgorithmEx"))?;
            choices!(perf, count, Data)
        },
        (ConvPass::BackwardFilter, None) => unsafe {
            let mut perf =
                [std::mem::zeroed::<sys::cudnnConvolutionBwdFilterAlgoPerf_t>(); MAX_ALGOS];
            result::get_convolution_backward_filter_algorithm(
                handle,
                d.x,
                d.y,
                d.conv,
                d.w,
                req,
                &mut count,
                perf.as_mut_ptr(),
            )
            .map_err(cudnn("cudnnGetConvolutionBackwardFilterAlgorithm_v7"))?;
            choices!(perf, count, Filter)
        },
        (ConvPass::BackwardFilter, Some((o, ws, bytes))) => unsafe {
            let mut perf =
                [std::mem::zeroed::<sys::cudnnConvolutionBwdFilterAlgoPerf_t>(); MAX_ALGOS];
            sys::cudnnFindConvolutionBackwardFilterAlgorithmEx(
                handle,
                d.x,
                ptr(o.x),
                d.y,
                ptr(o.y),
                d.conv,
                d.w,
                ptr(o.w) as *mut c_void,
                req,
                &mut count,
                perf.as_mut_ptr(),
                ws_ptr(ws),
                bytes,
            )
            .result()
            .map_err(cudnn("cudnnFindConvolutionBackwardFilterAlgorithmEx"))?;
            choices!(perf, count, Filter)
        },
    };
    Ok(out)
}

fn ptr(addr: u64) -> *const c_void {
    addr as *const c_void
}

fn ws_ptr(ws: Option<&Allocation>) -> *mut c_void {
    ws.map_or(std::ptr::null_mut(), |a| a.addr() as *mut c_void)
}

/// Runs one pass with `algo` (alpha 1, beta 0: the output is overwritten).
fn execute(
    handle: sys::cudnnHandle_t,
    d: &Descriptors,
    algo: Algo,
    o: Operands,
    ws: Option<&Allocation>,
) -> Result<(), TensorError> {
    let (alpha, beta) = (1.0f32, 0.0f32);
    let (a, b) = ((&alpha as *const f32).cast(), (&beta as *const f32).cast());
    let bytes = ws.map_or(0, |w| w.bytes());
    // SAFETY (all arms): live handle and descriptors; x, w, y are device buffers of the
    // descriptors' shapes (checked by the caller), the workspace holds `bytes` bytes, which is
    // what the algorithm was chosen with; alpha and beta are host f32 scalars.
    unsafe {
        match algo {
            Algo::Fwd(al) => result::convolution_forward(
                handle,
                a,
                d.x,
                ptr(o.x),
                d.w,
                ptr(o.w),
                d.conv,
                al,
                ws_ptr(ws),
                bytes,
                b,
                d.y,
                o.y as *mut c_void,
            )
            .map_err(cudnn("cudnnConvolutionForward")),
            Algo::Data(al) => result::convolution_backward_data(
                handle,
                a,
                d.w,
                ptr(o.w),
                d.y,
                ptr(o.y),
                d.conv,
                al,
                ws_ptr(ws),
                bytes,
                b,
                d.x,
                o.x as *mut c_void,
            )
            .map_err(cudnn("cudnnConvolutionBackwardData")),
            Algo::Filter(al) => result::convolution_backward_filter(
                handle,
                a,
                d.x,
                ptr(o.x),
                d.y,
                ptr(o.y),
                d.conv,
                al,
                ws_ptr(ws),
                bytes,
                b,
                d.w,
                o.w as *mut c_void,
            )
            .map_err(cudnn("cudnnConvolutionBackwardFilter")),
        }
    }
}
