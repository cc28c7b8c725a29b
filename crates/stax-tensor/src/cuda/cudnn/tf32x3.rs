//! Full fp32 convolutions on TF32 tensor cores ("3xTF32": CUTLASS's `OpMultiplyAddFastF32`,
//! JAX's `DotAlgorithmPreset.TF32_TF32_F32_X3`). Each f32 operand `a` is split into its TF32
//! rounding `a_hi = tf32(a)` and the rest `a_lo = a - a_hi`, exact in f32 (`tf32_split` in
//! kernels/elementwise.cu), and a pass sums three TF32 passes with f32 accumulation:
//! `conv(a, b) ≈ conv(a_lo, b_hi) + conv(a_hi, b_lo) + conv(a_hi, b_hi)`, each added to the
//! output by cuDNN's `beta = 1`, the small terms first. Only `conv(a_lo, b_lo)` is left out:
//! each product is exact to about 2^-21 of its size (the low parts are at most 2^-11 of the
//! high ones, and cuDNN rounds them to TF32 once more), where one TF32 pass is exact to 2^-11.
//!
//! The parts live in the pass's workspace, after cuDNN's own (each region 256-byte aligned):
//! the input's and the filter's for the forward pass, the output gradient's and the filter's
//! for backward data, the input's and the output gradient's for backward filter. The input and
//! output parts scale with the batch, so a composite may run over batch chunks (`chunks.rs`):
//! each chunk is split into the same buffers in turn, and the pass's workspace is one block.
//! Composites are candidates of the timed search beside cuDNN's FMA algorithms under
//! [`crate::Precision::Highest`] (see [`Fp32Convs`]).
//!
//! The forward and backward-data passes have a second form, **stacked**: one TF32 pass whose
//! summed channels (the input's forward, the output's backward data) are the three parts side
//! by side, `[a_lo | a_hi | a_hi]` against the filter's `[b_hi | b_lo | b_hi]`, so that cuDNN
//! sums the three products in one reduction three times as deep (`tf32_stack` writes the
//! parts: per pixel in NHWC and per image in NCHW for the summed operand, per output channel's
//! row of input channels for the forward's filter, three whole filters for the backward
//! data's). It writes the output once (no `beta = 1` passes) and gives cuDNN a
//! 192-channel conv where the seed's has 64; its parts take 3 rather than 2 copies of each
//! operand. The filter gradient has no such form: its two operands would need different
//! pairings in one sum.

use super::calls::{
    Algo, Choice, Descriptors, Emulated, Ws, candidates as listed, execute, execute_bias_act,
};
use super::chunks::{Chunking, Stack, chunk_bytes, chunk_counts, chunking, planned};
use super::{CudnnConv, Operands, Plan};
use crate::cuda::kernels::Kernels;
use crate::{ConvPass, TensorError};
use cudarc::cudnn::result::CudnnError;
use cudarc::cudnn::sys;

/// How full fp32 ([`crate::Precision::Highest`]) f32 convolutions may run
/// ([`crate::cuda::CudaBackend::set_fp32_convs`]; `fastest`, `fma`, `3xtf32` or
/// `3xtf32-stacked` as text). The composites are of legacy-API algorithms: under
/// [`super::ConvApis::Graph`] the search takes none, and a deterministic choice neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fp32Convs {
    /// cuDNN's FMA algorithms and the 3xTF32 composites, the fastest as timed (the default).
    #[default]
    Fastest,
    /// cuDNN's FMA algorithms only (`CUDNN_FMA_MATH`), as JAX's `precision=HIGHEST` and
    /// PyTorch's `allow_tf32 = False` run.
    Fma,
    /// The 3xTF32 composites (three passes or stacked), and the FMA algorithms only for a
    /// pass with none usable (an input or output chunk not a multiple of 16 bytes, or no
    /// composite within the workspace limit).
    Tf32x3,
    /// As [`Fp32Convs::Tf32x3`], with only the stacked composites for the forward and
    /// backward-data passes (the filter gradient has none: its three passes). A forward or
    /// backward-data pass whose stacked parts fit no chunk within the limit (they take 1.5x
    /// the three passes' parts) runs cuDNN's FMA algorithms.
    Tf32x3Stacked,
}

impl std::str::FromStr for Fp32Convs {
    type Err = TensorError;

    /// `fastest`, `fma`, `3xtf32` or `3xtf32-stacked`.
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] naming the accepted words.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fastest" => Ok(Fp32Convs::Fastest),
            "fma" => Ok(Fp32Convs::Fma),
            "3xtf32" => Ok(Fp32Convs::Tf32x3),
            "3xtf32-stacked" => Ok(Fp32Convs::Tf32x3Stacked),
            _ => Err(TensorError::InvalidArgument {
                op: "fp32_convs",
                reason: format!("{s:?}: expected fastest, fma, 3xtf32 or 3xtf32-stacked"),
            }),
        }
    }
}

/// Alignment of each part's region in the workspace, in bytes.
const ALIGN: usize = 256;

/// Bytes of one chunk of the two operands `pass` splits, `[a, b]` (see the module docs).
fn operands(pass: ConvPass, ch: &Chunking) -> [u64; 2] {
    match pass {
        ConvPass::Forward => [ch.x_bytes, ch.w_bytes],
        ConvPass::BackwardData => [ch.y_bytes, ch.w_bytes],
        ConvPass::BackwardFilter => [ch.x_bytes, ch.y_bytes],
    }
}

/// Bytes of the workspace region of one part of `bytes` bytes.
fn region(bytes: u64) -> usize {
    (bytes as usize).next_multiple_of(ALIGN)
}

/// Workspace bytes of the parts of one chunk of `a` and `b` in `form`: the high and low parts
/// of each, or their three stacked.
fn parts_bytes(form: Emulated, [a, b]: [u64; 2]) -> usize {
    match form {
        Emulated::Stacked => region(3 * a) + region(3 * b),
        _ => 2 * (region(a) + region(b)),
    }
}

/// The channels the stacked form of `pass` triples (none for the filter gradient, which has
/// no stacked form).
fn stack_of(pass: ConvPass) -> Option<Stack> {
    match pass {
        ConvPass::Forward => Some(Stack::Inputs),
        ConvPass::BackwardData => Some(Stack::Outputs),
        ConvPass::BackwardFilter => None,
    }
}

/// The composite forms `fp32` admits for `pass`, each with the channels it stacks.
fn forms(pass: ConvPass, fp32: Fp32Convs) -> Vec<(Emulated, Stack)> {
    let passes = (Emulated::Passes, Stack::None);
    match (stack_of(pass), fp32) {
        (None, _) => vec![passes],
        (Some(s), Fp32Convs::Tf32x3Stacked) => vec![(Emulated::Stacked, s)],
        (Some(s), _) => vec![passes, (Emulated::Stacked, s)],
    }
}

/// The composites of `pass` of `conv` within `limit` workspace bytes, in the forms `fp32`
/// admits: each TF32 tensor-core algorithm cuDNN's heuristics list (under
/// `CUDNN_DEFAULT_MATH`) for each form, over the whole batch or over the fewest batch chunks
/// (of [`chunk_counts`]) at which its workspace and the parts fit. A stacked form is skipped
/// at a chunk count whose descriptors fail (cuDNN cannot count its tensors in 32 bits:
/// `check_sizes`, or refuses them) or whose listing cuDNN refuses. Host-side queries only;
/// nothing runs.
///
/// # Errors
/// [`TensorError::Cudnn`] from the three-pass form's descriptors or listing.
pub(super) fn candidates(
    handle: sys::cudnnHandle_t,
    plan: &mut Plan,
    (conv, pass, fp32): (&CudnnConv, ConvPass, Fp32Convs),
    limit: usize,
) -> Result<Vec<Choice>, TensorError> {
    let mut out: Vec<Choice> = Vec::new();
    for (form, stack) in forms(pass, fp32) {
        for k in std::iter::once(1).chain(chunk_counts(conv.geometry.n)) {
            let Some(bytes) = chunk_bytes(conv, k) else {
                continue;
            };
            let listing = chunking(plan, conv, (k, stack), bytes).and_then(|ch| {
                let parts = parts_bytes(form, operands(pass, ch));
                Ok((parts, tf32_listed(handle, &ch.desc, pass)?))
            });
            let (parts, algos) = match listing {
                Ok(l) => l,
                Err(_) if form == Emulated::Stacked => continue,
                Err(e) => return Err(e),
            };
            for c in algos {
                let workspace = c.workspace.next_multiple_of(ALIGN) + parts;
                let known = out.iter().any(|o| (o.algo, o.emulated) == (c.algo, form));
                if workspace <= limit && !known {
                    out.push(Choice {
                        chunks: k,
                        emulated: form,
                        workspace,
                        ..c
                    });
                }
            }
        }
    }
    Ok(out)
}

/// The usable algorithms cuDNN lists for `pass` on `desc` under `CUDNN_DEFAULT_MATH` whose
/// math type may use tensor cores (three FMA passes would only be slower than one).
fn tf32_listed(
    handle: sys::cudnnHandle_t,
    desc: &Descriptors,
    pass: ConvPass,
) -> Result<Vec<Choice>, TensorError> {
    desc.set_math(sys::cudnnMathType_t::CUDNN_DEFAULT_MATH)?;
    let mut all = listed(handle, desc, pass)?;
    all.retain(|c| c.ok && c.math != sys::cudnnMathType_t::CUDNN_FMA_MATH);
    Ok(all)
}

/// An internal error of a composite's run.
fn internal(reason: String) -> TensorError {
    TensorError::InvalidArgument {
        op: "conv2d",
        reason: format!("internal: {reason}"),
    }
}

/// The chunking of composite `c` of `pass`, with cuDNN's part `ws` of the workspace given
/// (`c.workspace` bytes: cuDNN's, then the parts) and the address of the parts after it; the
/// math type set.
fn prepare(
    plan: &Plan,
    (pass, c): (ConvPass, Choice),
    ws: Ws,
) -> Result<(&Chunking, Ws, u64), TensorError> {
    let stack = match c.emulated {
        Emulated::Stacked => stack_of(pass)
            .ok_or_else(|| internal(format!("a stacked 3xTF32 {pass:?}, which has none")))?,
        _ => Stack::None,
    };
    let ch = planned(plan, pass, (c.chunks, stack))?;
    let parts = parts_bytes(c.emulated, operands(pass, ch));
    if ws.bytes < c.workspace || c.workspace < parts {
        return Err(internal(format!(
            "3xTF32 {pass:?} given {} workspace bytes, chose {} ({parts} of parts)",
            ws.bytes, c.workspace
        )));
    }
    ch.desc.set_math(c.math)?;
    let own = c.workspace - parts;
    let cudnn_ws = Ws {
        addr: ws.addr,
        bytes: own,
    };
    Ok((ch, cudnn_ws, ws.addr + own as u64))
}

/// Runs the composite `c` of `pass` on `ops` with its workspace `ws` (`c.workspace` bytes:
/// cuDNN's, then the parts), splitting the operands with `kernels`.
///
/// # Errors
/// [`TensorError::Cudnn`], [`TensorError::Driver`]; [`TensorError::InvalidArgument`] when the
/// workspace is short or `plan` lacks the chunking (internal errors).
pub(super) fn run(
    handle: sys::cudnnHandle_t,
    plan: &Plan,
    (pass, c): (ConvPass, Choice),
    ops: Operands,
    ws: Ws,
    kernels: &Kernels,
) -> Result<(), TensorError> {
    let (ch, ws, at) = prepare(plan, (pass, c), ws)?;
    if c.emulated != Emulated::Stacked {
        return three_passes(handle, (ch, pass, c), ops, (ws, at), kernels);
    }
    let run = |o| execute(handle, &ch.desc, c.algo, o, ws, 0.0).map(Ok);
    stacked(kernels, (ch, pass), ops, at, run)?.map_err(|source| TensorError::Cudnn {
        op: "cudnnConvolution (stacked 3xTF32)",
        source,
    })
}

/// The stacked forward composite `c` with cuDNN's fused bias and activation
/// (`cudnnConvolutionBiasActivationForward` a chunk; `epi`: the bias's address and whether a
/// ReLU follows), as [`run`] otherwise: `Ok(Err(status))` when cuDNN refuses the fused call
/// (the output is then to be written again, whole).
///
/// # Errors
/// As [`run`]; [`TensorError::InvalidArgument`] for a choice that is not a stacked forward
/// algorithm (an internal error).
pub(super) fn run_fused(
    handle: sys::cudnnHandle_t,
    plan: &Plan,
    c: Choice,
    ops: Operands,
    (ws, kernels): (Ws, &Kernels),
    (bias, relu): (u64, bool),
) -> Result<Result<(), CudnnError>, TensorError> {
    let (Algo::Fwd(algo), Emulated::Stacked) = (c.algo, c.emulated) else {
        return Err(internal(format!("fused epilogue of {}", c.name())));
    };
    let pass = ConvPass::Forward;
    let (ch, ws, at) = prepare(plan, (pass, c), ws)?;
    let run = |o| Ok(execute_bias_act(handle, &ch.desc, algo, o, bias, relu, ws));
    stacked(kernels, (ch, pass), ops, at, run)
}

/// The three passes of `c` (see the module docs), the parts at `at` in the workspace after
/// cuDNN's own `ws`.
fn three_passes(
    handle: sys::cudnnHandle_t,
    (ch, pass, c): (&Chunking, ConvPass, Choice),
    ops: Operands,
    (ws, at): (Ws, u64),
    kernels: &Kernels,
) -> Result<(), TensorError> {
    let [a, b] = operands(pass, ch);
    let (ra, rb) = (region(a) as u64, region(b) as u64);
    let pa = (at, at + ra);
    let pb = (at + 2 * ra, at + 2 * ra + rb);
    let split = |src: u64, (hi, lo): (u64, u64), bytes: u64| {
        kernels.tf32_split(src, hi, lo, bytes as usize / 4)
    };
    let three = |make: &dyn Fn(u64, u64) -> Operands, beta: f32| {
        execute(handle, &ch.desc, c.algo, make(pa.1, pb.0), ws, beta)?;
        execute(handle, &ch.desc, c.algo, make(pa.0, pb.1), ws, 1.0)?;
        execute(handle, &ch.desc, c.algo, make(pa.0, pb.0), ws, 1.0)
    };
    if pass != ConvPass::BackwardFilter {
        split(ops.w, pb, b)?;
    }
    for i in 0..ch.k as u64 {
        let (x, y) = (ops.x + i * ch.x_bytes, ops.y + i * ch.y_bytes);
        match pass {
            ConvPass::Forward => {
                split(x, pa, a)?;
                three(&|x, w| Operands { x, w, y }, 0.0)?;
            }
            ConvPass::BackwardData => {
                split(y, pa, a)?;
                three(&|y, w| Operands { x, w, y }, 0.0)?;
            }
            ConvPass::BackwardFilter => {
                split(x, pa, a)?;
                split(y, pb, b)?;
                // the filter gradient sums over the chunks
                let beta = if i > 0 { 1.0 } else { 0.0 };
                three(&|x, y| Operands { x, w: ops.w, y }, beta)?;
            }
        }
    }
    Ok(())
}

/// The stacked pass (see the module docs; forward or backward data) of chunking `ch`, the parts
/// at `at` in the workspace: the filter's `[hi | lo | hi]` per row once, then per chunk the
/// summed operand's `[lo | hi | hi]` per row (the rows of [`super::chunks::stack_rows`]) and
/// `call` on the chunk's operands with the stacked ones in place. Stops at the first chunk
/// whose call cuDNN refuses (`Ok(Err(status))`).
fn stacked(
    kernels: &Kernels,
    (ch, pass): (&Chunking, ConvPass),
    ops: Operands,
    at: u64,
    call: impl Fn(Operands) -> Result<Result<(), CudnnError>, TensorError>,
) -> Result<Result<(), CudnnError>, TensorError> {
    let [a, b] = operands(pass, ch);
    let (pa, pb) = (at, at + region(3 * a) as u64);
    let (row, w_row) = ch.stack_rows;
    if row == 0 || w_row == 0 {
        return Err(internal(format!(
            "stacked 3xTF32 {pass:?} on {:?}",
            ch.stack
        )));
    }
    kernels.tf32_stack((ops.w, pb), (b as usize / 4 / w_row, w_row), 1)?;
    for i in 0..ch.k as u64 {
        let (x, y) = (ops.x + i * ch.x_bytes, ops.y + i * ch.y_bytes);
        let (src, o) = match pass {
            ConvPass::Forward => (x, Operands { x: pa, w: pb, y }),
            _ => (y, Operands { x, w: pb, y: pa }),
        };
        kernels.tf32_stack((src, pa), (a as usize / 4 / row, row), 0)?;
        if let Err(status) = call(o)? {
            return Ok(Err(status));
        }
    }
    Ok(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parts_take_aligned_regions() {
        // three passes: the high and low parts of each operand
        assert_eq!(parts_bytes(Emulated::Passes, [256, 512]), 2 * (256 + 512));
        // 1 B and 257 B round up to one and two 256-byte regions
        assert_eq!(parts_bytes(Emulated::Passes, [1, 257]), 2 * (256 + 512));
        assert_eq!(parts_bytes(Emulated::Passes, [0, 0]), 0);
        // stacked: three copies side by side, one region each operand
        assert_eq!(parts_bytes(Emulated::Stacked, [256, 512]), 768 + 1536);
        assert_eq!(parts_bytes(Emulated::Stacked, [100, 1]), 512 + 256);
    }

    #[test]
    fn the_forms_of_each_pass() {
        let (passes, inputs, outputs) = (
            (Emulated::Passes, Stack::None),
            (Emulated::Stacked, Stack::Inputs),
            (Emulated::Stacked, Stack::Outputs),
        );
        let fwd = ConvPass::Forward;
        assert_eq!(forms(fwd, Fp32Convs::Fastest), [passes, inputs]);
        assert_eq!(forms(fwd, Fp32Convs::Tf32x3Stacked), [inputs]);
        let data = ConvPass::BackwardData;
        assert_eq!(forms(data, Fp32Convs::Tf32x3), [passes, outputs]);
        assert_eq!(forms(data, Fp32Convs::Tf32x3Stacked), [outputs]);
        // the filter gradient has no stacked form
        let filter = ConvPass::BackwardFilter;
        assert_eq!(forms(filter, Fp32Convs::Tf32x3Stacked), [passes]);
    }

    #[test]
    fn the_words_name_the_modes() {
        assert_eq!("fastest".parse::<Fp32Convs>().unwrap(), Fp32Convs::Fastest);
        assert_eq!("fma".parse::<Fp32Convs>().unwrap(), Fp32Convs::Fma);
        assert_eq!("3xtf32".parse::<Fp32Convs>().unwrap(), Fp32Convs::Tf32x3);
        let stacked = "3xtf32-stacked".parse::<Fp32Convs>().unwrap();
        assert_eq!(stacked, Fp32Convs::Tf32x3Stacked);
        let e = "tf32".parse::<Fp32Convs>().unwrap_err().to_string();
        assert!(
            e.contains("expected fastest, fma, 3xtf32 or 3xtf32-stacked"),
            "{e}"
        );
    }
}
