//! The algorithm search of a conv pass: the candidates of both cuDNN APIs, timed on the
//! pass's scratch buffers within the workspace budget, and the fastest kept (see `cudnn.rs`).

use super::calls::{Algo, Choice, Emulated, Ws, candidates, execute};
use super::tf32x3::{self, Fp32Convs};
use super::{ConvApis, ConvCandidate, CudnnConv, Operands, Plan, chunks, graph, math, search_math};
use crate::cuda::kernels::Kernels;
use crate::{ConvPass, DType, Precision, TensorError};
use cudarc::cudnn::sys;
use cudarc::driver::CudaStream;
use stax_alloc::{Allocation, Allocator, Category};
use std::sync::Arc;

pub(super) fn workspace(
    alloc: &Arc<Allocator>,
    bytes: usize,
) -> Result<Option<Allocation>, TensorError> {
    Ok(if bytes == 0 {
        None
    } else {
        Some(alloc.allocate(bytes, Category::Workspace)?)
    })
}

/// The largest workspace of the usable `candidates` within `limit`.
pub(super) fn budget(
    candidates: &[Choice],
    pass: ConvPass,
    limit: usize,
) -> Result<usize, TensorError> {
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

/// What a search needs besides the plan: the handle, the stream it times on, the pass, and
/// which candidates it takes.
pub(super) struct Search<'a> {
    pub(super) handle: sys::cudnnHandle_t,
    pub(super) stream: &'a Arc<CudaStream>,
    pub(super) key: (ConvPass, Precision, DType),
    pub(super) apis: ConvApis,
    pub(super) fp32: Fp32Convs,
    /// The most scratch the search may allocate to time candidates over its limit (0: none;
    /// [`LOOK_AHEAD_BYTES`] for an explicit calibration).
    pub(super) look_ahead: usize,
}

/// The candidates of `all` that `apis` admits (with [`ConvApis::Graph`], the legacy ones only
/// when no engine is usable).
pub(super) fn select(mut all: Vec<Choice>, apis: ConvApis) -> Vec<Choice> {
    let engine = |c: &Choice| matches!(c.algo, Algo::Engine { .. });
    match apis {
        ConvApis::Both => {}
        ConvApis::Legacy => all.retain(|c| !engine(c)),
        ConvApis::Graph if all.iter().any(|c| engine(c) && c.ok) => all.retain(engine),
        ConvApis::Graph => {}
    }
    all
}

/// Every candidate of the pass of `s` the search may time within `limit`: cuDNN's legacy
/// heuristics and the graph API's engines as `s.apis` admits them (with the descriptors' math
/// type set for the search), the chunked forms of those over `limit` (`chunks.rs`), and for
/// full fp32 the 3xTF32 composites as `s.fp32` admits them (`tf32x3.rs`; not under
/// [`ConvApis::Graph`]: they are legacy algorithms).
///
/// # Errors
/// [`TensorError::Cudnn`] from the listings.
pub(super) fn listed(
    s: &Search<'_>,
    plan: &mut Plan,
    conv: &CudnnConv,
    limit: usize,
) -> Result<Vec<Choice>, TensorError> {
    let (pass, precision, dtype) = s.key;
    let math = search_math(precision, dtype);
    plan.desc.set_math(math)?;
    let mut all = candidates(s.handle, &plan.desc, pass)?;
    all.extend(engine_choices(s.handle, plan, pass, conv, precision));
    let mut all = select(all, s.apis);
    let chunked = chunks::chunked_candidates(s.handle, plan, (conv, pass, math), &all, limit)?;
    all.extend(chunked);
    // composites are of legacy algorithms: not with the graph API's engines alone
    let full_fp32 = (dtype, precision) == (DType::F32, Precision::Highest);
    if !full_fp32 || s.fp32 == Fp32Convs::Fma || s.apis == ConvApis::Graph {
        return Ok(all);
    }
    let emulated = tf32x3::candidates(s.handle, plan, (conv, pass, s.fp32), limit)?;
    let only = matches!(s.fp32, Fp32Convs::Tf32x3 | Fp32Convs::Tf32x3Stacked);
    if only && !emulated.is_empty() {
        return Ok(emulated);
    }
    all.extend(emulated);
    Ok(all)
}

/// Timed runs of each candidate, after one untimed run.
const TIMED_RUNS: usize = 3;

/// A candidate whose first timed run takes over this many times the best mean so far is not
/// run again: it cannot win, and cuDNN's slowest candidates take up to about 0.6 s a run (the
/// seed's conv2 backward-data in bf16, 2026-12-05).
const CUTOFF: f32 = 4.0;

/// The most workspace an explicit calibration's search ([`crate::Backend::calibrate`])
/// allocates to time candidates over its limit, in bytes (8 GiB), where the device has room:
/// they are timed, never chosen, so that the report says what a larger allowance would buy
/// ([`super::ConvPlanInfo::larger_allowance`]). A pass calibrating itself inside a step times
/// only within its limit.
pub const LOOK_AHEAD_BYTES: usize = 8 << 30;

/// The search's scratch workspace: room for every usable candidate up to `look_ahead` bytes
/// when the device has it, else the `budget` within the limit; with its size.
fn scratch(
    alloc: &Arc<Allocator>,
    candidates: &[Choice],
    (budget, look_ahead): (usize, usize),
) -> Result<(Option<Allocation>, usize), TensorError> {
    let roomy = candidates
        .iter()
        .filter(|c| c.ok && c.workspace <= look_ahead)
        .map(|c| c.workspace)
        .max()
        .unwrap_or(0);
    if roomy > budget
        && let Ok(ws) = alloc.allocate(roomy, Category::Workspace)
    {
        return Ok((Some(ws), roomy));
    }
    Ok((workspace(alloc, budget)?, budget))
}

/// Lists the legacy API's heuristic candidates and the graph API's engines, times on `ops`
/// those that fit the search's scratch ([`scratch`]: the largest usable workspace within
/// `limit`, or up to `s.look_ahead` where the device has room), and keeps the fastest
/// within `limit`; returns it with every candidate for the report (`kernels` split the
/// operands of 3xTF32 composites). Our own timing (events around [`TIMED_RUNS`] runs after a
/// first untimed one, a candidate cut off after one timed run over [`CUTOFF`] times the best
/// mean so far) replaces
/// `cudnnFind*AlgorithmEx`, which captures CUDA graphs in global mode and so made other
/// threads' concurrent cuDNN calls fail (`CUDNN_STATUS_EXECUTION_FAILED`, seen in `gpu_ops`).
pub(super) fn choose(
    (s, kernels): (&Search<'_>, &Kernels),
    plan: &mut Plan,
    conv: &CudnnConv,
    ops: Operands,
    (limit, alloc): (usize, &Arc<Allocator>),
) -> Result<(Choice, Vec<ConvCandidate>), TensorError> {
    let pass = s.key.0;
    let all = listed(s, plan, conv, limit)?;
    let budget = budget(&all, pass, limit)?;
    let (ws, room) = scratch(alloc, &all, (budget, s.look_ahead))?;
    let _exclusive = crate::cuda::exclusive();
    let mut timed: Vec<Option<Choice>> = Vec::with_capacity(all.len());
    for c in &all {
        let best = timed.iter().flatten().filter(|t| t.ok).map(|t| t.time_ms);
        let cutoff = best.min_by(f32::total_cmp).map(|ms| CUTOFF * ms);
        let t = if c.ok && c.workspace <= room {
            Some(time_choice(
                (s, kernels),
                plan,
                *c,
                ops,
                (ws.as_ref(), cutoff),
            ))
        } else {
            None
        };
        timed.push(match t.transpose()? {
            Some(Ok(ms)) => Some(Choice { time_ms: ms, ..*c }),
            Some(Err(status)) => Some(Choice {
                ok: false,
                status,
                ..*c
            }),
            None => None,
        });
    }
    let mut report: Vec<_> = all
        .iter()
        .zip(&timed)
        .map(|(h, t)| candidate(h, t.as_ref()))
        .collect();
    match &plan.graphs[pass as usize] {
        Some(Err(why)) => report.push(unusable(why)),
        Some(Ok(engines)) => report.extend(engines.skipped.iter().map(|why| unusable(why))),
        None => {}
    }
    let best = timed
        .into_iter()
        .flatten()
        .filter(|c| c.ok && c.workspace <= limit)
        .min_by(|a, b| a.time_ms.total_cmp(&b.time_ms))
        .ok_or_else(|| TensorError::InvalidArgument {
            op: "conv2d",
            reason: format!("cuDNN ran no {pass:?} algorithm within {budget} workspace bytes"),
        })?;
    Ok((best, report))
}

/// Times `c` on `ops` with the workspace `ws` (see [`mean_ms`] for `cutoff`): `Ok(Ok(ms))`
/// per run, `Ok(Err(status))` when cuDNN refuses to run it, `Err` when the events fail.
fn time_choice(
    (s, kernels): (&Search<'_>, &Kernels),
    plan: &Plan,
    c: Choice,
    ops: Operands,
    (ws, cutoff): (Option<&Allocation>, Option<f32>),
) -> Result<Result<f32, sys::cudnnStatus_t>, TensorError> {
    let run = || run_choice((s.handle, kernels), plan, s.key, c, ops, ws);
    if let Err(e) = run() {
        return match e {
            TensorError::Cudnn { source, .. } => Ok(Err(source.0)),
            e => Err(e),
        };
    }
    mean_ms(s.stream, run, cutoff).map(Ok)
}

/// The mean time of [`TIMED_RUNS`] runs of `run` on `stream` (its work queued there), in ms,
/// from CUDA events around them, after the untimed run the caller made. The host waits for
/// the first timed run's event; when that run alone took longer than `cutoff` ms, its time is
/// returned without the other runs, which are otherwise timed between their own events (the
/// wait is not counted).
///
/// # Errors
/// `run`'s, and the events' as [`TensorError::Driver`].
pub(crate) fn mean_ms(
    stream: &Arc<CudaStream>,
    mut run: impl FnMut() -> Result<(), TensorError>,
    cutoff: Option<f32>,
) -> Result<f32, TensorError> {
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let record = || {
        stream
            .record_event(flags)
            .map_err(crate::cuda::driver("cuEventRecord"))
    };
    let elapsed = |a: &cudarc::driver::CudaEvent, b| {
        a.elapsed_ms(b)
            .map_err(crate::cuda::driver("cuEventElapsedTime"))
    };
    let start = record()?;
    run()?;
    let first = record()?;
    let first_ms = elapsed(&start, &first)?;
    if cutoff.is_some_and(|limit| first_ms > limit) {
        return Ok(first_ms);
    }
    let rest = record()?;
    for _ in 1..TIMED_RUNS {
        run()?;
    }
    let end = record()?;
    Ok((first_ms + elapsed(&rest, &end)?) / TIMED_RUNS as f32)
}

/// Runs `c` (a legacy algorithm with its math type, a graph engine of `plan`, or a 3xTF32
/// composite, whose operands are split with `kernels`).
pub(super) fn run_choice(
    (handle, kernels): (sys::cudnnHandle_t, &Kernels),
    plan: &Plan,
    (pass, precision, dtype): (ConvPass, Precision, DType),
    c: Choice,
    ops: Operands,
    ws: Option<&Allocation>,
) -> Result<(), TensorError> {
    let ws = Ws::of(ws);
    if c.emulated != Emulated::No {
        return tf32x3::run(handle, plan, (pass, c), ops, ws, kernels);
    }
    if let Algo::Engine { index, .. } = c.algo {
        let Some(Ok(engines)) = &plan.graphs[pass as usize] else {
            return Err(TensorError::InvalidArgument {
                op: "conv2d",
                reason: format!("internal: {pass:?} chose a graph engine it does not have"),
            });
        };
        return graph::execute(handle, &engines.engines[index], ops, ws);
    }
    let math = math(precision, dtype, c);
    if c.chunks > 1 {
        return chunks::run(handle, plan, (pass, math), c, ops, ws);
    }
    plan.desc.set_math(math)?;
    execute(handle, &plan.desc, c.algo, ops, ws, 0.0)
}

/// The graph API's usable engines of `pass` as candidates (built on first use; none when the
/// graph cannot be built, the reason kept for the report).
pub(super) fn engine_choices(
    handle: sys::cudnnHandle_t,
    plan: &mut Plan,
    pass: ConvPass,
    conv: &CudnnConv,
    precision: Precision,
) -> Vec<Choice> {
    let built = plan.graphs[pass as usize].get_or_insert_with(|| {
        graph::engines(handle, conv, pass, precision).map_err(|e| e.to_string())
    });
    let Ok(engines) = built else {
        return Vec::new();
    };
    let math = |tc| match tc {
        true => sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
        false => sys::cudnnMathType_t::CUDNN_FMA_MATH,
    };
    engines
        .engines
        .iter()
        .enumerate()
        .map(|(index, e)| Choice {
            algo: Algo::Engine {
                index,
                global: e.global,
            },
            ok: true,
            status: sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS,
            time_ms: f32::NAN,
            workspace: e.workspace,
            math: math(e.tensor_core),
            deterministic: e.deterministic,
            chunks: 1,
            emulated: Emulated::No,
        })
        .collect()
}

/// The report line of a graph that could not be built, or of an engine left out.
fn unusable(why: &str) -> ConvCandidate {
    ConvCandidate {
        algorithm: "cuDNN graph API".into(),
        math: String::new(),
        workspace_bytes: 0,
        time_ms: None,
        status: format!("unusable: {why}"),
    }
}

/// The first of cuDNN's `heuristic` candidates (in its order) that is deterministic, usable
/// and within `limit` (see [`Dnn::set_deterministic`]); returned with every candidate.
pub(super) fn choose_deterministic(
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
        algorithm: h.name(),
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
