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

use super::calls::{Choice, Descriptors, Ws, candidates as listed, execute};
use super::chunks::{Chunking, chunk_bytes, chunk_counts, chunking, planned};
use super::{CudnnConv, Operands, Plan};
use crate::cuda::kernels::Kernels;
use crate::{ConvPass, TensorError};
use cudarc::cudnn::sys;

/// How full fp32 ([`crate::Precision::Highest`]) f32 convolutions may run
/// ([`crate::cuda::CudaBackend::set_fp32_convs`]; `fastest`, `fma` or `3xtf32` as text). The
/// composites are of legacy-API algorithms: under [`super::ConvApis::Graph`] the search takes
/// none, and a deterministic choice neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fp32Convs {
    /// cuDNN's FMA algorithms and the 3xTF32 composites, the fastest as timed (the default).
    #[default]
    Fastest,
    /// cuDNN's FMA algorithms only (`CUDNN_FMA_MATH`), as JAX's `precision=HIGHEST` and
    /// PyTorch's `allow_tf32 = False` run.
    Fma,
    /// The 3xTF32 composites, and the FMA algorithms only for a pass with none usable (an
    /// input or output chunk not a multiple of 16 bytes, or no composite within the workspace
    /// limit).
    Tf32x3,
}

impl std::str::FromStr for Fp32Convs {
    type Err = TensorError;

    /// `fastest`, `fma` or `3xtf32`.
    ///
    /// # Errors
    /// [`TensorError::InvalidArgument`] naming the accepted words.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fastest" => Ok(Fp32Convs::Fastest),
            "fma" => Ok(Fp32Convs::Fma),
            "3xtf32" => Ok(Fp32Convs::Tf32x3),
            _ => Err(TensorError::InvalidArgument {
                op: "fp32_convs",
                reason: format!("{s:?}: expected fastest, fma or 3xtf32"),
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

/// Workspace bytes of the four parts (`a` and `b`, high and low) of one chunk.
fn parts_bytes([a, b]: [u64; 2]) -> usize {
    2 * (region(a) + region(b))
}

/// The composites of `pass` of `conv` within `limit` workspace bytes: each TF32 tensor-core
/// algorithm cuDNN's heuristics list (under `CUDNN_DEFAULT_MATH`), over the whole batch or
/// over the fewest batch chunks (of [`chunk_counts`]) at which its workspace and the parts fit.
/// Host-side queries only; nothing runs.
///
/// # Errors
/// [`TensorError::Cudnn`] from the descriptors or the listing.
pub(super) fn candidates(
    handle: sys::cudnnHandle_t,
    plan: &mut Plan,
    (conv, pass): (&CudnnConv, ConvPass),
    limit: usize,
) -> Result<Vec<Choice>, TensorError> {
    let mut out: Vec<Choice> = Vec::new();
    for k in std::iter::once(1).chain(chunk_counts(conv.geometry.n)) {
        let Some(bytes) = chunk_bytes(conv, k) else {
            continue;
        };
        let ch = chunking(plan, conv, k, bytes)?;
        let parts = parts_bytes(operands(pass, ch));
        for c in tf32_listed(handle, &ch.desc, pass)? {
            let workspace = c.workspace.next_multiple_of(ALIGN) + parts;
            if workspace <= limit && !out.iter().any(|o| o.algo == c.algo) {
                out.push(Choice {
                    chunks: k,
                    tf32x3: true,
                    workspace,
                    ..c
                });
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
    let ch = planned(plan, pass, c.chunks)?;
    let [a, b] = operands(pass, ch);
    let parts = parts_bytes([a, b]);
    if ws.bytes < c.workspace || c.workspace < parts {
        return Err(TensorError::InvalidArgument {
            op: "conv2d",
            reason: format!(
                "internal: 3xTF32 {pass:?} given {} workspace bytes, chose {} ({parts} of parts)",
                ws.bytes, c.workspace
            ),
        });
    }
    ch.desc.set_math(c.math)?;
    let own = c.workspace - parts;
    let at = |offset: usize| ws.addr + offset as u64;
    let (ra, rb) = (region(a), region(b));
    let pa = (at(own), at(own + ra));
    let pb = (at(own + 2 * ra), at(own + 2 * ra + rb));
    let algo_ws = Ws {
        addr: ws.addr,
        bytes: own,
    };
    let split = |src: u64, (hi, lo): (u64, u64), bytes: u64| {
        kernels.tf32_split(src, hi, lo, bytes as usize / 4)
    };
    let three = |make: &dyn Fn(u64, u64) -> Operands, beta: f32| {
        execute(handle, &ch.desc, c.algo, make(pa.1, pb.0), algo_ws, beta)?;
        execute(handle, &ch.desc, c.algo, make(pa.0, pb.1), algo_ws, 1.0)?;
        execute(handle, &ch.desc, c.algo, make(pa.0, pb.0), algo_ws, 1.0)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_four_parts_take_aligned_regions() {
        assert_eq!(parts_bytes([256, 512]), 2 * (256 + 512));
        // 1 B and 257 B round up to one and two 256-byte regions
        assert_eq!(parts_bytes([1, 257]), 2 * (256 + 512));
        assert_eq!(parts_bytes([0, 0]), 0);
    }

    #[test]
    fn the_words_name_the_modes() {
        assert_eq!("fastest".parse::<Fp32Convs>().unwrap(), Fp32Convs::Fastest);
        assert_eq!("fma".parse::<Fp32Convs>().unwrap(), Fp32Convs::Fma);
        assert_eq!("3xtf32".parse::<Fp32Convs>().unwrap(), Fp32Convs::Tf32x3);
        let e = "tf32".parse::<Fp32Convs>().unwrap_err().to_string();
        assert!(e.contains("expected fastest, fma or 3xtf32"), "{e}");
    }
}
