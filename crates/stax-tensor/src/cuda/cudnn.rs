//! cuDNN convolutions in NHWC with KRSC (= OHWI) filters: descriptors, algorithm choice once
//! per geometry under a workspace budget, and the three passes.
//!
//! Algorithms are chosen once per (geometry, dtype, precision, pass), by calibration
//! ([`crate::Backend::calibrate`], or the pass's first run): cuDNN's heuristics
//! (`cudnnGet*Algorithm_v7`) list the candidates and their workspace needs, then
//! `cudnnFind*AlgorithmEx` times those that fit the budget on scratch buffers of the pass's
//! shapes, with a workspace from our allocator sized to the largest candidate that fits. The
//! fastest is kept with its workspace size and reported by [`ConvPlanInfo`]. Every later call
//! of that pass runs with exactly that workspace, allocated by the caller from the pass's
//! schedule. Before the choice, the largest of those candidates' workspaces is the bound a
//! memory plan uses ([`Dnn::bound`]: a host-side query, nothing allocated).
//!
//! [`Precision::Tf32`] lets cuDNN use TF32 tensor cores (`CUDNN_DEFAULT_MATH`, then the math
//! type of the chosen algorithm); [`Precision::Highest`] forces `CUDNN_FMA_MATH`. Both apply to
//! f32 convolutions: a bf16 or f16 one runs in cuDNN's `PSEUDO_BFLOAT16_CONFIG` /
//! `PSEUDO_HALF_CONFIG` (tensors and filter in the dtype, compute type FLOAT: f32 accumulation)
//! and may always use tensor cores (`CUDNN_TENSOR_OP_MATH`, then the chosen algorithm's math
//! type; products of bf16 or f16 values are exact in f32, so no precision is given up).

mod calls;

use crate::{Conv2dGeometry, ConvPass, DType, Precision, TensorError};
use calls::{Algo, Choice, Descriptors, candidates, cudnn, execute, execute_bias_act};
use cudarc::cudnn::{result, sys};
use cudarc::driver::CudaStream;
use stax_alloc::{Allocation, Allocator, Category};
use std::collections::HashMap;
use std::collections::hash_map::Entry;
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
    /// The element type of its input, filter and output (computed in f32).
    pub dtype: DType,
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
    /// Time `cudnnFind*AlgorithmEx` measured for it, in ms; NaN when it was chosen without
    /// timing ([`crate::cuda::CudaBackend::set_deterministic`]).
    pub time_ms: f32,
    /// Every candidate cuDNN's heuristics listed, with its workspace need and, for those that
    /// were timed, the time: what the choice was made from.
    pub candidates: Vec<ConvCandidate>,
    /// For the forward pass: how the bias (and a following ReLU) ran last, `fused` (in
    /// cuDNN's epilogue), `separate` (our own passes), or why cuDNN refused to fuse them.
    pub epilogue: String,
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
        };
        // SAFETY: valid handle and live stream (the backend keeps it alive).
        unsafe { result::set_stream(state.handle, stream.cu_stream() as sys::cudaStream_t) }
            .map_err(cudnn("cudnnSetStream"))?;
        Ok(Dnn {
            state: Mutex::new(state),
        })
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
                    algorithm: c.algo.name(),
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

    /// The cuDNN workspace bytes of `pass` for `geometry` in `dtype` under `precision`, if
    /// its algorithm has been chosen.
    pub(crate) fn chosen_workspace(
        &self,
        (geometry, dtype): (&Conv2dGeometry, DType),
        precision: Precision,
        pass: ConvPass,
    ) -> Option<usize> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let plan = state.plans.get(&(*geometry, dtype, precision))?;
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

    /// The largest workspace, at most `limit` bytes, of the candidates cuDNN's heuristics
    /// list for `pass` of `conv`: the most a search within `limit` can choose. Allocates
    /// nothing on the device.
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
        let handle = state.handle;
        let plan = plan_of(&mut state, conv, precision)?;
        plan.desc.set_math(search_math(precision, conv.dtype))?;
        let heuristic = candidates(handle, &plan.desc, pass, None)?;
        budget(&heuristic, pass, limit)
    }

    /// Runs `pass` of `conv` on `ops` (output overwritten) with its chosen algorithm and
    /// `workspace` (the chosen algorithm's bytes, from the pass's schedule).
    ///
    /// # Errors
    /// [`TensorError::Cudnn`]; [`TensorError::InvalidArgument`] if the pass is not calibrated.
    pub(crate) fn run(
        &self,
        pass: ConvPass,
        conv: &CudnnConv,
        precision: Precision,
        ops: Operands,
        workspace: Option<&Allocation>,
    ) -> Result<(), TensorError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let handle = state.handle;
        let (plan, choice) = chosen(&mut state, pass, conv, precision)?;
        plan.desc.set_math(math(precision, conv.dtype, choice))?;
        execute(handle, &plan.desc, choice.algo, ops, workspace)
    }
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

/// cuDNN's math type for running `choice` of a convolution in `dtype` under `precision`.
fn math(precision: Precision, dtype: DType, choice: Choice) -> sys::cudnnMathType_t {
    if dtype == DType::F32 && precision == Precision::Highest {
        sys::cudnnMathType_t::CUDNN_FMA_MATH
    } else {
        choice.math
    }
}

impl Dnn {
    /// The forward pass of `conv` with `epi` fused by cuDNN where it can be
    /// (`cudnnConvolutionBiasActivationForward` with the chosen algorithm when that is
    /// `IMPLICIT_PRECOMP_GEMM`, the only one cuDNN fuses the identity with): returns whether
    /// the epilogue was applied. When it returns false the output holds the plain convolution
    /// (the caller adds the epilogue). Workspace as [`Dnn::run`]: the same bytes.
    ///
    ///
    /// # Errors
    /// As [`Dnn::run`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run_forward(
        &self,
        conv: &CudnnConv,
        precision: Precision,
        ops: Operands,
        epi: Epilogue,
        workspace: Option<&Allocation>,
    ) -> Result<bool, TensorError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let handle = state.handle;
        let pass = ConvPass::Forward;
        let (plan, choice) = chosen(&mut state, pass, conv, precision)?;
        plan.desc.set_math(math(precision, conv.dtype, choice))?;
        let ws = workspace;
        let precomp =
            sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
        if let Algo::Fwd(algo) = choice.algo
            && algo == precomp
            && plan.no_fused_epilogue.is_none()
        {
            // Any refusal (the output is then untouched) falls back to the separate epilogue,
            // for good: the status is kept for the plan report.
            let (bias, relu) = (epi.bias, epi.relu);
            match execute_bias_act(handle, &plan.desc, algo, ops, bias, relu, ws) {
                Ok(()) => {
                    plan.fused_last = true;
                    return Ok(true);
                }
                Err(e) => plan.no_fused_epilogue = Some(format!("{:?}", e.0)),
            }
        }
        plan.fused_last = false;
        execute(handle, &plan.desc, choice.algo, ops, ws)?;
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
    let (handle, deterministic) = (state.handle, state.deterministic);
    let plan = plan_of(state, conv, precision)?;
    plan.layout_bytes[pass as usize] = conv.layout_bytes;
    if let Some(c) = plan.chosen[pass as usize] {
        return Ok((plan, c));
    }
    plan.desc.set_math(search_math(precision, conv.dtype))?;
    let (c, all) = if deterministic {
        choose_deterministic(candidates(handle, &plan.desc, pass, None)?, pass, limit)?
    } else {
        choose(handle, &plan.desc, pass, ops, limit, alloc)?
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

fn workspace(alloc: &Arc<Allocator>, bytes: usize) -> Result<Option<Allocation>, TensorError> {
    Ok(if bytes == 0 {
        None
    } else {
        Some(alloc.allocate(bytes, Category::Workspace)?)
    })
}

/// The largest workspace of the usable `candidates` within `limit`.
fn budget(candidates: &[Choice], pass: ConvPass, limit: usize) -> Result<usize, TensorError> {
    candidates
        .iter()
        .filter(|c| c.ok && c.workspace <= limit)
        .map(|c| c.workspace)
        .max()
        .ok_or_else(|| TensorError::InvalidArgument {
            op: "conv2d",
            reason: format!(
                "no cuDNN {pass:?} algorithm fits the workspace limit of {limit} bytes"
            ),
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
    let budget = budget(&heuristic, pass, limit)?;
    let ws = workspace(alloc, budget)?;
    let timed = {
        // The search may capture CUDA graphs; keep other threads' unsafe calls out meanwhile.
        let _exclusive = super::exclusive();
        candidates(handle, d, pass, Some((ops, ws.as_ref(), budget)))?
    };
    let report = heuristic
        .iter()
        .map(|h| {
            let t = timed
                .iter()
                .find(|t| t.algo == h.algo && t.math == h.math && t.ok);
            candidate(h, t)
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

/// The first of cuDNN's `heuristic` candidates (in its order) that is deterministic, usable
/// and within `limit` (see [`Dnn::set_deterministic`]); returned with every candidate.
fn choose_deterministic(
    heuristic: Vec<Choice>,
    pass: ConvPass,
    limit: usize,
) -> Result<(Choice, Vec<ConvCandidate>), TensorError> {
    let report = heuristic.iter().map(|h| candidate(h, None)).collect();
    let mut best = heuristic
        .into_iter()
        .find(|c| c.ok && c.deterministic && c.workspace <= limit)
        .ok_or_else(|| TensorError::InvalidArgument {
            op: "conv2d",
            reason: format!(
                "cuDNN lists no deterministic {pass:?} algorithm within {limit} workspace bytes"
            ),
        })?;
    best.time_ms = f32::NAN;
    Ok((best, report))
}

/// A heuristic candidate `h` as reported, with its timing `t` when it was timed.
fn candidate(h: &Choice, t: Option<&Choice>) -> ConvCandidate {
    let status = format!("{:?}", t.map_or(h.status, |t| t.status));
    ConvCandidate {
        algorithm: h.algo.name(),
        math: format!("{:?}", h.math),
        workspace_bytes: t.map_or(h.workspace, |t| t.workspace),
        time_ms: t.map(|t| t.time_ms),
        status: if h.deterministic {
            status
        } else {
            status + " (non-deterministic)"
        },
    }
}
