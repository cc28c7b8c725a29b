//! What the algorithm choice reports: [`ConvPlanInfo`] per pass and the [`ConvCandidate`]s
//! it was made from, printed one line per pass (and one per candidate with `{:#}`).

use crate::{Conv2dGeometry, ConvPass, DType, Precision};
use std::fmt;

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
    /// cuDNN's name for the algorithm, e.g. `CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM`,
    /// or `CUDNN_GRAPH_ENGINE_<global index> (heuristic config <i>)` for a graph-API engine,
    /// followed by ` in <k> batch chunks` when the pass runs as `k` passes over `n / k` images
    /// each (its workspace is one chunk's; see [`crate::cuda::CudaBackend`]).
    pub algorithm: String,
    /// cuDNN's math type for it: `CUDNN_DEFAULT_MATH` or `CUDNN_TENSOR_OP_MATH` may use TF32
    /// tensor cores (only under [`Precision::Tf32`]), `CUDNN_FMA_MATH` never does.
    pub math: String,
    /// cuDNN workspace bytes each call of this pass allocates (tagged `Workspace`).
    pub workspace_bytes: usize,
    /// Further workspace bytes each call allocates for layout changes: the OHWI filter copy,
    /// a padded input or input gradient (asymmetric padding), the bias-gradient partials.
    pub layout_bytes: usize,
    /// Its time per run as the search measured it (CUDA events), in ms; NaN when chosen without
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
    /// Its time per run as the search measured it, in ms, or None if it was not timed (not
    /// supported, or over the search's scratch: the limit, or more where the device had room
    /// up to [`crate::cuda::LOOK_AHEAD_BYTES`]).
    pub time_ms: Option<f32>,
    /// cuDNN's status for it (`CUDNN_STATUS_SUCCESS` when usable).
    pub status: String,
}

impl ConvPlanInfo {
    /// What a larger workspace allowance would buy: the fastest usable candidate the search
    /// timed that needs more workspace than the chosen algorithm and runs faster (timed but
    /// not chosen: over the pass's limit), if any. None when the choice was made without
    /// timing.
    pub fn larger_allowance(&self) -> Option<&ConvCandidate> {
        self.candidates
            .iter()
            .filter(|c| {
                c.workspace_bytes > self.workspace_bytes
                    && c.status.starts_with("CUDNN_STATUS_SUCCESS")
            })
            .filter(|c| c.time_ms.is_some_and(|t| t < self.time_ms))
            .min_by(|a, b| {
                a.time_ms
                    .unwrap_or(f32::MAX)
                    .total_cmp(&b.time_ms.unwrap_or(f32::MAX))
            })
    }
}

impl fmt::Display for ConvPlanInfo {
    /// `conv NxHxWxC -> K kRxS stride SHxSW dtype precision pass: algorithm math, workspace B,
    /// time`, what a larger allowance would buy ([`ConvPlanInfo::larger_allowance`]), then
    /// with `{:#}` each candidate on its own line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = &self.geometry;
        write!(
            f,
            "conv {}x{}x{}x{} -> {} k{}x{} stride {}x{} {} {:?} {:?}: {} {}, workspace {} B (+{} B layout), {}",
            g.n,
            g.h,
            g.w,
            g.c_in,
            g.c_out,
            g.kh,
            g.kw,
            g.stride_h,
            g.stride_w,
            self.dtype.name(),
            self.precision,
            self.pass,
            self.algorithm,
            self.math,
            self.workspace_bytes,
            self.layout_bytes,
            ms(Some(self.time_ms).filter(|t| !t.is_nan())),
        )?;
        if !self.epilogue.is_empty() {
            write!(f, ", epilogue {}", self.epilogue)?;
        }
        match self.larger_allowance() {
            Some(c) => write!(
                f,
                "; with {} B more workspace: {} {}",
                c.workspace_bytes - self.workspace_bytes,
                c.algorithm,
                ms(c.time_ms)
            )?,
            None if !self.time_ms.is_nan() => {
                write!(f, "; nothing timed faster with more workspace")?
            }
            None => {}
        }
        if f.alternate() {
            for c in &self.candidates {
                write!(f, "\n    {c}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Display for ConvCandidate {
    /// `algorithm math: workspace B, time, status`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, m) = (&self.algorithm, &self.math);
        let t = ms(self.time_ms);
        write!(
            f,
            "{a} {m}: workspace {} B, {t}, {}",
            self.workspace_bytes, self.status
        )
    }
}

/// A measured time as `1.234 ms`, or `untimed`.
fn ms(t: Option<f32>) -> String {
    t.map_or("untimed".into(), |t| format!("{t:.3} ms"))
}
