//! cuDNN convolutions in NHWC with KRSC (= OHWI) filters: descriptors, algorithm choice once
//! per geometry under a workspace budget, and the three passes.
//!
//! Algorithms are chosen once per (geometry, dtype, precision, pass), by calibration
//! ([`crate::Backend::calibrate`], or the pass's first run). The candidates are the legacy
//! API's (`cudnnGet*Algorithm_v7`, `calls.rs`) and the graph API's engine configurations
//! (heuristic modes A and FALLBACK, `graph.rs`), each with its workspace need. Those that fit
//! the budget (the largest usable workspace within the limit) are timed on scratch buffers of
//! the pass's shapes with one workspace from our allocator: one untimed run, then CUDA events
//! around three runs (not `cudnnFind*AlgorithmEx`, which captures CUDA graphs in global mode
//! and made concurrent calls of other threads fail). Where legacy algorithms need more than
//! the limit at the whole batch, their forms over batch chunks whose workspace fits are
//! candidates too (`chunks.rs`: full fp32's fast algorithms within 256 MiB). The fastest is
//! kept with its workspace size and reported by [`ConvPlanInfo`]. Every later call of that
//! pass runs with exactly that workspace, allocated by the caller from the pass's schedule.
//! Before the choice, the largest of those candidates' workspaces is the bound a memory plan
//! uses (`Dnn::bound`: host-side queries, nothing allocated on the device).
//!
//! [`Precision::Tf32`] lets cuDNN use TF32 tensor cores (`CUDNN_DEFAULT_MATH`, then the math
//! type of the chosen algorithm); [`Precision::Highest`] forces `CUDNN_FMA_MATH`. Both apply to
//! f32 convolutions: a bf16 or f16 one runs in cuDNN's `PSEUDO_BFLOAT16_CONFIG` /
//! `PSEUDO_HALF_CONFIG` (tensors and filter in the dtype, compute type FLOAT: f32 accumulation)
//! and may always use tensor cores (`CUDNN_TENSOR_OP_MATH`, then the chosen algorithm's math
//! type; products of bf16 or f16 values are exact in f32, so no precision is given up).

mod calls;
mod chunks;
mod graph;
mod report;
mod search;
mod tf32x3;

pub use report::{ConvCandidate, ConvPlanInfo};
pub use search::LOOK_AHEAD_BYTES;
pub(crate) use search::mean_ms;
pub use tf32x3::Fp32Convs;

use super::kernels::Kernels;
use crate::{Conv2dGeometry, ConvPass, DType, Precision, TensorError};
use calls::{Algo, Choice, Descriptors, Emulated, Ws, candidates, cudnn, execute_bias_act};
use cudarc::cudnn::{result, sys};
use cudarc::driver::CudaStream;
use search::{Search, budget, choose, choose_deterministic, listed, run_choice};
use stax_alloc::{Allocation, Allocator};
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Arc, Mutex};

/// Default bound on one cuDNN call's workspace, in bytes (256 MiB): enough for the fast
/// implicit-GEMM and Winograd kernels of the seed's 3x3 convolutions, small beside its
/// 1 GB activations, and far from the multi-GB autotuning scratch JAX takes.
pub const DEFAULT_WORKSPACE_LIMIT: usize = 256 << 20;

/// Which of cuDNN's APIs the algorithm search of a conv pass takes candidates from
/// ([`crate::cuda::CudaBackend::set_conv_apis`]; `legacy`, `graph` or `both` as text).
///
/// The default is the legacy API. Measured on the H200 on 2026-12-02 (BENCHMARKS.md): the
/// graph API's engines win most passes timed alone (ResNet-50's bf16 1x1 convs 4-6x), yet
/// whole steps did not get faster with them (ResNet-50 at batch 128: TF32 59.2 ms against
/// 56.6 ms, bf16 46.5 against 44-46 ms; the seed: TF32 13.5 against 13.1-13.3 ms, bf16
/// unchanged), so they are offered for A/B runs until a step gains from them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConvApis {
    /// The legacy `cudnnConvolution*` algorithms only (the default).
    #[default]
    Legacy,
    /// The legacy algorithms and the graph API's engines, the fastest of all as timed.
    Both,
    /// The graph API's engines, and the legacy algorithms only for a pass that has no usable
    /// engine.
    Graph,
}

impl std::str::FromStr for ConvApis {
    type Err = TensorError;

    /// `legacy`, `graph` or `both`.
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] naming the accepted words.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "legacy" => Ok(ConvApis::Legacy),
            "graph" => Ok(ConvApis::Graph),
            "both" => Ok(ConvApis::Both),
            _ => Err(TensorError::InvalidArgument {
                op: "conv_apis",
                reason: format!("{s:?}: expected legacy, graph or both"),
            }),
        }
    }
}

/// What cuDNN computes: the geometry with symmetric padding `(pad_h, pad_w)` on an input of
/// `h x w` (possibly already extended with explicit zeros; see `conv.rs`), in `dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct CudnnConv {
    /// The caller's geometry (the plan's key and report).
    pub geometry: Conv2dGeometry,
    /// The element type of input, filter and output (with the geometry, the plan's key).
    pub dtype: DType,
    /// Input height cuDNN sees.
    pub h: usize,
    /// Input width cuDNN sees.
    pub w: usize,
    /// Input channels cuDNN sees (the geometry's, or more when padded for its tensor cores).
    pub c: usize,
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

/// Plans of one geometry: its descriptors and the choice of each pass made so far.
#[derive(Debug)]
struct Plan {
    desc: Descriptors,
    /// Each pass's graph-API engines, built on first use (or why they could not be).
    graphs: [Option<Result<graph::Engines, String>>; 3],
    /// The descriptors of the batch chunk sizes the search looked at (`chunks.rs`).
    chunkings: Vec<chunks::Chunking>,
    chosen: [Option<Choice>; 3],
    candidates: [Vec<ConvCandidate>; 3],
    layout_bytes: [usize; 3],
    /// Set once cuDNN refused the fused bias + activation forward for this geometry (its
    /// status), which then runs as the plain forward and our own epilogue kernels.
    no_fused_epilogue: Option<String>,
    /// Whether the last forward pass ran its epilogue fused.
    fused_last: bool,
}

/// What the fused forward adds after the convolution: the bias, then optionally a ReLU.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Epilogue {
    /// Device address of the `[c_out]` bias, of the convolution's dtype.
    pub bias: u64,
    /// Whether a ReLU follows the bias.
    pub relu: bool,
}

#[derive(Debug)]
struct State {
    handle: sys::cudnnHandle_t,
    plans: HashMap<(Conv2dGeometry, DType, Precision), Plan>,
    /// Choose deterministic algorithms by cuDNN's heuristics, without timing (see
    /// [`Dnn::set_deterministic`]).
    deterministic: bool,
    /// Which API's candidates the search takes (see [`ConvApis`]).
    apis: ConvApis,
    /// How full fp32 convolutions may run (see [`Fp32Convs`]).
    fp32: Fp32Convs,
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
    /// The handle's stream, on which the search times the candidates.
    stream: Arc<CudaStream>,
}

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
            deterministic: false,
            apis: ConvApis::Legacy,
            fp32: Fp32Convs::Fastest,
        };
        // SAFETY: valid handle and live stream (the backend keeps it alive).
        unsafe { result::set_stream(state.handle, stream.cu_stream() as sys::cudaStream_t) }
            .map_err(cudnn("cudnnSetStream"))?;
        Ok(Dnn {
            state: Mutex::new(state),
            stream: stream.clone(),
        })
    }

    /// From now on, takes the candidates of the searches not made yet from `apis` (see
    /// [`ConvApis`]; a deterministic choice takes the legacy API's alone). Choices made
    /// before stay.
    pub(crate) fn set_apis(&self, apis: ConvApis) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.apis = apis;
    }

    /// From now on, takes the full fp32 candidates of the searches not made yet as `fp32`
    /// admits them (see [`Fp32Convs`]). Choices made before stay.
    pub(crate) fn set_fp32(&self, fp32: Fp32Convs) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.fp32 = fp32;
    }

    /// How full fp32 convolutions may run ([`Self::set_fp32`]).
    pub(crate) fn fp32(&self) -> Fp32Convs {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).fp32
    }

    /// From now on, chooses for each pass the first algorithm in cuDNN's heuristic order
    /// (`cudnnGet*Algorithm_v7`) that cuDNN marks `CUDNN_DETERMINISTIC`, succeeds and fits the
    /// workspace limit, without timing anything (PyTorch's `cudnn.deterministic = True,
    /// benchmark = False`): the same bits on every run, and the same choice in every process
    /// on the same GPU and cuDNN. Choices made before stay.
    pub(crate) fn set_deterministic(&self, on: bool) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.deterministic = on;
    }

    /// Every choice made so far, sorted by geometry and pass order.
    pub(crate) fn plans(&self) -> Vec<ConvPlanInfo> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        for ((geometry, dtype, precision), plan) in &state.plans {
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
                    dtype: *dtype,
                    precision: *precision,
                    pass,
                    algorithm: c.name(),
                    math: format!("{:?}", c.math),
                    workspace_bytes: c.workspace,
                    layout_bytes: plan.layout_bytes[pass as usize],
                    time_ms: c.time_ms,
                    candidates: plan.candidates[pass as usize].clone(),
                    epilogue: match (pass, &plan.no_fused_epilogue, plan.fused_last) {
                        (ConvPass::Forward, Some(why), _) => format!("separate ({why})"),
                        (ConvPass::Forward, None, true) => "fused".into(),
                        (ConvPass::Forward, None, false) => "separate".into(),
                        _ => String::new(),
                    },
                });
            }
        }
        out.sort_by_key(|p| (format!("{:?}", p.geometry), p.dtype.name(), p.pass as u8));
        out
    }

    /// The chosen algorithm of `pass` for `geometry` in `dtype` under `precision`, if chosen:
    /// its cuDNN workspace bytes and the search's time of it in ms per run (NaN when chosen
    /// without timing).
    pub(crate) fn chosen(
        &self,
        (geometry, dtype): (&Conv2dGeometry, DType),
        precision: Precision,
        pass: ConvPass,
    ) -> Option<(usize, f32)> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let plan = state.plans.get(&(*geometry, dtype, precision))?;
        plan.chosen[pass as usize].map(|c| (c.workspace, c.time_ms))
    }

    /// Drops the choice of `pass` for `geometry` in `dtype` under `precision`, so that the next
    /// [`Dnn::prepare`] searches again (within another workspace limit); returns it.
    pub(crate) fn forget(
        &self,
        (geometry, dtype): (&Conv2dGeometry, DType),
        precision: Precision,
        pass: ConvPass,
    ) -> Option<(usize, f32)> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let plan = state.plans.get_mut(&(*geometry, dtype, precision))?;
        plan.candidates[pass as usize].clear();
        if pass == ConvPass::Forward {
            // the next choice may fuse where this one was refused
            plan.no_fused_epilogue = None;
        }
        plan.chosen[pass as usize]
            .take()
            .map(|c| (c.workspace, c.time_ms))
    }

    /// Whether algorithms are chosen without timing ([`Dnn::set_deterministic`]).
    pub(crate) fn is_deterministic(&self) -> bool {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .deterministic
    }

    /// Chooses the algorithm of `pass` (if not chosen yet) by timing the candidates on `ops`,
    /// whose output is overwritten (`kernels` split the operands of 3xTF32 composites);
    /// returns its workspace bytes.
    ///
    /// # Errors
    /// As [`Dnn::run`].
    pub(crate) fn prepare(
        &self,
        (pass, conv, precision): (ConvPass, &CudnnConv, Precision),
        ops: Operands,
        (limit, alloc, look_ahead): (usize, &Arc<Allocator>, usize),
        kernels: &Kernels,
    ) -> Result<usize, TensorError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (_, choice) = plan_and_choice(
            &mut state,
            (&self.stream, kernels),
            (pass, conv, precision),
            ops,
            (limit, alloc, look_ahead),
        )?;
        Ok(choice.workspace)
    }

    /// The largest workspace, at most `limit` bytes, of the candidates cuDNN's heuristics
    /// list for `pass` of `conv` (over the whole batch or over batch chunks): the most a
    /// search within `limit` can choose. Allocates nothing on the device.
    ///
    /// # Errors
    /// [`TensorError::Cudnn`]; [`TensorError::InvalidArgument`] if no candidate fits `limit`.
    pub(crate) fn bound(
        &self,
        pass: ConvPass,
        conv: &CudnnConv,
        precision: Precision,
        limit: usize,
    ) -> Result<usize, TensorError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let search = Search {
            handle: state.handle,
            stream: &self.stream,
            key: (pass, precision, conv.dtype),
            apis: state.apis,
            fp32: state.fp32,
            look_ahead: 0,
        };
        let plan = plan_of(&mut state, conv, precision)?;
        budget(&listed(&search, plan, conv, limit)?, pass, limit)
    }

    /// Runs `pass` of `conv` on `ops` (output overwritten) with its chosen algorithm and
    /// `workspace` (the chosen algorithm's bytes, from the pass's schedule); `kernels` split
    /// the operands of a 3xTF32 composite.
    ///
    /// # Errors
    /// [`TensorError::Cudnn`]; [`TensorError::InvalidArgument`] if the pass is not calibrated.
    pub(crate) fn run(
        &self,
        (pass, conv, precision): (ConvPass, &CudnnConv, Precision),
        ops: Operands,
        workspace: Option<&Allocation>,
        kernels: &Kernels,
    ) -> Result<(), TensorError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let handle = state.handle;
        let (plan, choice) = chosen(&mut state, pass, conv, precision)?;
        run_choice(
            (handle, kernels),
            plan,
            (pass, precision, conv.dtype),
            choice,
            ops,
            workspace,
        )
    }
}

/// The forward pass `choice` of `plan` with `epi` fused by cuDNN
/// (`cudnnConvolutionBiasActivationForward`), where it can be: `IMPLICIT_PRECOMP_GEMM` over the
/// whole batch, or a stacked 3xTF32 composite of it (one fused call a chunk). Returns whether
/// it ran; false leaves the output to be written whole by the plain pass. A refusal is kept in
/// the plan (its status, for the report) and not tried again until the pass is searched again.
///
/// # Errors
/// cuDNN's, the driver's and the composite's errors but for the fused call's refusal.
fn fused_forward(
    handle: sys::cudnnHandle_t,
    plan: &mut Plan,
    (precision, dtype): (Precision, DType),
    choice: Choice,
    ops: Operands,
    (ws, kernels): (Option<&Allocation>, &Kernels),
    epi: Epilogue,
) -> Result<bool, TensorError> {
    let precomp = sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
    let whole = choice.chunks == 1 && choice.emulated == Emulated::No;
    if choice.algo != Algo::Fwd(precomp)
        || !(whole || choice.emulated == Emulated::Stacked)
        || plan.no_fused_epilogue.is_some()
    {
        return Ok(false);
    }
    let (bias, relu) = (epi.bias, epi.relu);
    let done = if whole {
        plan.desc.set_math(math(precision, dtype, choice))?;
        execute_bias_act(handle, &plan.desc, precomp, ops, bias, relu, Ws::of(ws))
    } else {
        tf32x3::run_fused(
            handle,
            plan,
            choice,
            ops,
            (Ws::of(ws), kernels),
            (bias, relu),
        )?
    };
    if let Err(e) = done {
        plan.no_fused_epilogue = Some(format!("{:?}", e.0));
    }
    Ok(plan.no_fused_epilogue.is_none())
}

/// cuDNN's math type for listing and timing the candidates of a convolution in `dtype` under
/// `precision`: f32 follows the precision, bf16 and f16 may use tensor cores.
fn search_math(precision: Precision, dtype: DType) -> sys::cudnnMathType_t {
    match (dtype, precision) {
        (DType::F32, Precision::Tf32) => sys::cudnnMathType_t::CUDNN_DEFAULT_MATH,
        (DType::F32, Precision::Highest) => sys::cudnnMathType_t::CUDNN_FMA_MATH,
        _ => sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
    }
}

/// cuDNN's math type for running `choice` of a convolution in `dtype` under `precision` (a
/// 3xTF32 composite runs its passes in its TF32 algorithm's).
fn math(precision: Precision, dtype: DType, choice: Choice) -> sys::cudnnMathType_t {
    if dtype == DType::F32 && precision == Precision::Highest && choice.emulated == Emulated::No {
        sys::cudnnMathType_t::CUDNN_FMA_MATH
    } else {
        choice.math
    }
}

impl Dnn {
    /// The forward pass of `conv` with `epi` fused by cuDNN where it can be
    /// (`cudnnConvolutionBiasActivationForward` with the chosen algorithm when that is
    /// `IMPLICIT_PRECOMP_GEMM`, the only one cuDNN fuses the identity with, over the whole
    /// batch or as a stacked 3xTF32 composite's one pass a chunk): returns whether the
    /// epilogue was applied. When it returns false the output holds the plain convolution
    /// (the caller adds the epilogue). Workspace and `kernels` as [`Dnn::run`].
    ///
    /// # Errors
    /// As [`Dnn::run`].
    pub(crate) fn run_forward(
        &self,
        (conv, precision): (&CudnnConv, Precision),
        ops: Operands,
        epi: Epilogue,
        workspace: Option<&Allocation>,
        kernels: &Kernels,
    ) -> Result<bool, TensorError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let handle = state.handle;
        let pass = ConvPass::Forward;
        let (plan, choice) = chosen(&mut state, pass, conv, precision)?;
        let ws = workspace;
        if fused_forward(
            handle,
            plan,
            (precision, conv.dtype),
            choice,
            ops,
            (ws, kernels),
            epi,
        )? {
            plan.fused_last = true;
            return Ok(true);
        }
        plan.fused_last = false;
        let key = (pass, precision, conv.dtype);
        run_choice((handle, kernels), plan, key, choice, ops, ws)?;
        Ok(false)
    }
}

/// The plan of `conv` (its descriptors), created on first use.
fn plan_of<'s>(
    state: &'s mut State,
    conv: &CudnnConv,
    precision: Precision,
) -> Result<&'s mut Plan, TensorError> {
    Ok(
        match state.plans.entry((conv.geometry, conv.dtype, precision)) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(Plan {
                desc: Descriptors::new(conv)?,
                graphs: Default::default(),
                chunkings: Vec::new(),
                chosen: [None; 3],
                candidates: Default::default(),
                layout_bytes: [0; 3],
                no_fused_epilogue: None,
                fused_last: false,
            }),
        },
    )
}

/// The plan of `conv` and the algorithm chosen for `pass`.
///
/// # Errors
/// [`TensorError::InvalidArgument`] when `pass` has not been calibrated.
fn chosen<'s>(
    state: &'s mut State,
    pass: ConvPass,
    conv: &CudnnConv,
    precision: Precision,
) -> Result<(&'s mut Plan, Choice), TensorError> {
    let plan = plan_of(state, conv, precision)?;
    plan.layout_bytes[pass as usize] = conv.layout_bytes;
    match plan.chosen[pass as usize] {
        Some(c) => Ok((plan, c)),
        None => Err(TensorError::InvalidArgument {
            op: "conv2d",
            reason: format!(
                "internal: {pass:?} of {:?} runs uncalibrated",
                conv.geometry
            ),
        }),
    }
}

/// The plan of `conv` (created on first use) and the choice for `pass` (made on first use,
/// timed on `stream` within `limit` workspace bytes from `alloc`, with `kernels`).
fn plan_and_choice<'s>(
    state: &'s mut State,
    (stream, kernels): (&Arc<CudaStream>, &Kernels),
    (pass, conv, precision): (ConvPass, &CudnnConv, Precision),
    ops: Operands,
    (limit, alloc, look_ahead): (usize, &Arc<Allocator>, usize),
) -> Result<(&'s mut Plan, Choice), TensorError> {
    let (handle, deterministic, apis, fp32) =
        (state.handle, state.deterministic, state.apis, state.fp32);
    let plan = plan_of(state, conv, precision)?;
    plan.layout_bytes[pass as usize] = conv.layout_bytes;
    if let Some(c) = plan.chosen[pass as usize] {
        return Ok((plan, c));
    }
    // deterministic: cuDNN's heuristic order over the whole batch, no chunks
    let (c, all) = if deterministic {
        plan.desc.set_math(search_math(precision, conv.dtype))?;
        choose_deterministic(candidates(handle, &plan.desc, pass)?, pass, limit)?
    } else {
        let search = Search {
            handle,
            stream,
            key: (pass, precision, conv.dtype),
            apis,
            fp32,
            look_ahead,
        };
        choose((&search, kernels), plan, conv, ops, (limit, alloc))?
    };
    // The search's workspaces are freed; return what they left cached (see `release_search`).
    release_search(alloc)?;
    plan.chosen[pass as usize] = Some(c);
    plan.candidates[pass as usize] = all;
    Ok((plan, c))
}

/// Returns the memory an algorithm search leaves cached to the device (`caching`), or
/// coalesces it (`bfc`): a one-off search must not shape the steady state's memory, so that
/// the allocator afterwards holds what the live buffers need and places later allocations as a
/// memory plan's replay does.
///
/// # Errors
/// [`TensorError::Alloc`] when the driver refuses a release.
pub(crate) fn release_search(alloc: &Allocator) -> Result<(), TensorError> {
    Ok(alloc.empty_cache()?)
}
