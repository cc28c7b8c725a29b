//! A conv pass over batch chunks: when algorithms cuDNN lists for the whole batch need more
//! workspace than the limit, the pass may run as `k` equal passes over `n / k` images each,
//! whose workspace (which for those algorithms grows with the batch) fits.
//!
//! The batch is the outermost dimension of the NHWC and NCHW tensors, so chunk `i` of the
//! input (or its gradient) and of the output (or its gradient) are contiguous slices at `i`
//! times a chunk's bytes; the filter is whole. The forward and backward-data passes write
//! disjoint slices; the backward-filter pass sums the chunks' filter gradients in place
//! (cuDNN's `beta = 1` from the second chunk on). One workspace of the chunk pass's size
//! serves every chunk in turn, so the pass's schedule (one block) is exact.
//!
//! Chunked candidates are searched and timed as the others (`search.rs`); full fp32 is where
//! they matter: under `CUDNN_FMA_MATH` the seed's 64-channel conv has only slow algorithms
//! within 256 MiB at batch 100 (its backward data 601.6 ms with `ALGO_0`, against 13.7 ms with
//! `ALGO_1`'s 2 GB; BENCHMARKS.md, "Issue 12 baselines").

use super::calls::{Algo, Choice, Descriptors, Ws, candidates, execute};
use super::{CudnnConv, Operands, Plan};
use crate::{ConvPass, TensorError};
use cudarc::cudnn::sys;

/// Which channels a chunking's descriptors triple: those a stacked 3xTF32 composite sums
/// over (`tf32x3.rs`), or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stack {
    /// The geometry's own channels.
    None,
    /// Three times the input channels (the forward pass's sum).
    Inputs,
    /// Three times the output channels (the backward-data pass's sum).
    Outputs,
}

/// The descriptors of one chunk size of a geometry (its channels tripled by `stack`), with
/// the bytes of one chunk of the caller's input and output tensors and of its filter (never
/// tripled: the stacked copies live in the workspace).
#[derive(Debug)]
pub(super) struct Chunking {
    /// Number of chunks.
    pub(super) k: usize,
    /// The channels the descriptors triple.
    pub(super) stack: Stack,
    pub(super) desc: Descriptors,
    /// Bytes of one chunk of the input (or its gradient).
    pub(super) x_bytes: u64,
    /// Bytes of one chunk of the output (or its gradient).
    pub(super) y_bytes: u64,
    /// Bytes of the filter (or its gradient), whole in every chunk.
    pub(super) w_bytes: u64,
    /// The lengths in elements of the rows `stack` triples (`tf32_stack`), of the summed
    /// operand and of the filter; `(0, 0)` for [`Stack::None`] (see [`stack_rows`]).
    pub(super) stack_rows: (usize, usize),
}

/// The lengths in elements of the rows that `stack` triples in `conv`'s summed operand and in
/// its filter: the input forward (its channels: a pixel's in NHWC, an image's planes in NCHW)
/// and the filter's rows of input channels (an output channel's tap in KRSC, its whole
/// `C x R x S` in KCRS); the output gradient backward data (a pixel's or an image's output
/// channels) and the whole filter (the stacked output channels are its outer dimension).
pub(super) fn stack_rows(conv: &CudnnConv, stack: Stack) -> (usize, usize) {
    let g = &conv.geometry;
    let nchw = g.layout == crate::Layout::Nchw;
    match stack {
        Stack::None => (0, 0),
        Stack::Inputs if nchw => (conv.c * conv.h * conv.w, conv.c * g.kh * g.kw),
        Stack::Inputs => (conv.c, conv.c),
        Stack::Outputs => {
            let filter = g.c_out * g.kh * g.kw * conv.c;
            let image = g.c_out * g.out_h * g.out_w;
            (if nchw { image } else { g.c_out }, filter)
        }
    }
}

/// Chunk counts tried for one pass, smallest first (the divisors of the batch from 2).
const MAX_TRIES: usize = 8;

/// The chunk counts tried for a batch of `n`: its first [`MAX_TRIES`] divisors from 2.
pub(super) fn chunk_counts(n: usize) -> impl Iterator<Item = usize> {
    (2..=n).filter(move |k| n % k == 0).take(MAX_TRIES)
}

/// Bytes of one of `k` chunks of `conv`'s input and output (`(x, y)`), or `None` when `k`
/// does not divide the batch or a chunk is not a multiple of 16 bytes (cuDNN's tensor cores
/// want 16-byte aligned tensors).
pub(super) fn chunk_bytes(conv: &CudnnConv, k: usize) -> Option<(u64, u64)> {
    let g = &conv.geometry;
    if k == 0 || g.n % k != 0 {
        return None;
    }
    let (m, size) = (g.n / k, conv.dtype.size_bytes());
    let x = (m * conv.h * conv.w * conv.c * size) as u64;
    let y = (m * g.out_h * g.out_w * g.c_out * size) as u64;
    (x % 16 == 0 && y % 16 == 0).then_some((x, y))
}

/// `conv` as cuDNN sees one of `k` chunks of it, its channels tripled by `stack`.
pub(super) fn chunk_conv(conv: &CudnnConv, (k, stack): (usize, Stack)) -> CudnnConv {
    let (c, c_out) = match stack {
        Stack::None => (conv.c, conv.geometry.c_out),
        Stack::Inputs => (3 * conv.c, conv.geometry.c_out),
        Stack::Outputs => (conv.c, 3 * conv.geometry.c_out),
    };
    let geometry = crate::Conv2dGeometry {
        n: conv.geometry.n / k,
        c_out,
        ..conv.geometry
    };
    CudnnConv {
        geometry,
        c,
        ..*conv
    }
}

/// The chunking of `plan` into `k` chunks, its channels tripled by `stack` (created on first
/// use; `k = 1` is the whole batch).
pub(super) fn chunking<'p>(
    plan: &'p mut Plan,
    conv: &CudnnConv,
    (k, stack): (usize, Stack),
    (x_bytes, y_bytes): (u64, u64),
) -> Result<&'p Chunking, TensorError> {
    let at = match plan
        .chunkings
        .iter()
        .position(|c| (c.k, c.stack) == (k, stack))
    {
        Some(i) => i,
        None => {
            let desc = Descriptors::new(&chunk_conv(conv, (k, stack)))?;
            let g = &conv.geometry;
            let w_bytes = g.c_out * g.kh * g.kw * conv.c * conv.dtype.size_bytes();
            plan.chunkings.push(Chunking {
                k,
                stack,
                desc,
                x_bytes,
                y_bytes,
                w_bytes: w_bytes as u64,
                stack_rows: stack_rows(conv, stack),
            });
            plan.chunkings.len() - 1
        }
    };
    Ok(&plan.chunkings[at])
}

/// The chunked candidates of `pass`: for the smallest chunk count (of at most [`MAX_TRIES`]
/// divisors of the batch) at which some legacy algorithm of `listed` that is usable but over
/// `limit` at the whole batch fits `limit`, those algorithms as cuDNN's heuristics list them
/// for one chunk (host-side queries; nothing runs). Empty when none is over the limit.
///
/// # Errors
/// [`TensorError::Cudnn`] from the descriptors or the listing.
pub(super) fn chunked_candidates(
    handle: sys::cudnnHandle_t,
    plan: &mut Plan,
    (conv, pass, math): (&CudnnConv, ConvPass, sys::cudnnMathType_t),
    listed: &[Choice],
    limit: usize,
) -> Result<Vec<Choice>, TensorError> {
    let over: Vec<Algo> = listed
        .iter()
        .filter(|c| c.ok && c.workspace > limit && !matches!(c.algo, Algo::Engine { .. }))
        .map(|c| c.algo)
        .collect();
    if over.is_empty() {
        return Ok(Vec::new());
    }
    for k in chunk_counts(conv.geometry.n) {
        let Some(bytes) = chunk_bytes(conv, k) else {
            continue;
        };
        let ch = chunking(plan, conv, (k, Stack::None), bytes)?;
        ch.desc.set_math(math)?;
        let fit: Vec<Choice> = candidates(handle, &ch.desc, pass)?
            .into_iter()
            .filter(|c| c.ok && c.workspace <= limit && over.contains(&c.algo))
            .map(|c| Choice { chunks: k, ..c })
            .collect();
        if !fit.is_empty() {
            return Ok(fit);
        }
    }
    Ok(Vec::new())
}

/// The chunking of `plan` into `k` chunks (channels tripled by `stack`) that `pass` chose.
///
/// # Errors
/// [`TensorError::InvalidArgument`] when `plan` has no such chunking (an internal error).
pub(super) fn planned(
    plan: &Plan,
    pass: ConvPass,
    (k, stack): (usize, Stack),
) -> Result<&Chunking, TensorError> {
    plan.chunkings
        .iter()
        .find(|ch| (ch.k, ch.stack) == (k, stack))
        .ok_or_else(|| TensorError::InvalidArgument {
            op: "conv2d",
            reason: format!("internal: {pass:?} chose {k} chunks ({stack:?}) it has no plan of"),
        })
}

/// Runs `c` (a legacy algorithm over `c.chunks` chunks) of `pass` on `ops` with math type
/// `math` and the chunk pass's workspace `ws`.
///
/// # Errors
/// [`TensorError::Cudnn`]; [`TensorError::InvalidArgument`] as [`planned`].
pub(super) fn run(
    handle: sys::cudnnHandle_t,
    plan: &Plan,
    (pass, math): (ConvPass, sys::cudnnMathType_t),
    c: Choice,
    ops: Operands,
    ws: Ws,
) -> Result<(), TensorError> {
    let ch = planned(plan, pass, (c.chunks, Stack::None))?;
    ch.desc.set_math(math)?;
    for i in 0..ch.k as u64 {
        let o = Operands {
            x: ops.x + i * ch.x_bytes,
            w: ops.w,
            y: ops.y + i * ch.y_bytes,
        };
        // the filter gradient sums over the batch: every chunk after the first adds to it
        let beta = if pass == ConvPass::BackwardFilter && i > 0 {
            1.0
        } else {
            0.0
        };
        execute(handle, &ch.desc, c.algo, o, ws, beta)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Conv2dGeometry, DType, Padding};

    fn conv(n: usize, c: usize, dtype: DType) -> CudnnConv {
        let g = Conv2dGeometry::new(
            &[n, 10, 10, c].into(),
            &[3, 3, c, 6].into(),
            (2, 2),
            Padding::Valid,
        )
        .unwrap();
        CudnnConv {
            geometry: g,
            dtype,
            h: 10,
            w: 10,
            c,
            pad_h: 0,
            pad_w: 0,
            layout_bytes: 0,
        }
    }

    #[test]
    fn chunks_are_whole_images_of_the_input_and_output() {
        // 10x10x4 f32 input images (1600 B), 4x4x6 output images (384 B)
        assert_eq!(chunk_bytes(&conv(12, 4, DType::F32), 3), Some((6400, 1536)));
        assert_eq!(chunk_bytes(&conv(12, 4, DType::F32), 12), Some((1600, 384)));
        // bf16: 800 B and 192 B an image
        assert_eq!(chunk_bytes(&conv(12, 4, DType::BF16), 6), Some((1600, 384)));
    }

    #[test]
    fn chunks_must_divide_the_batch_and_keep_16_byte_alignment() {
        assert_eq!(chunk_bytes(&conv(12, 4, DType::F32), 5), None);
        assert_eq!(chunk_bytes(&conv(12, 4, DType::F32), 0), None);
        // 3 channels: 300 f32 = 1200 B an image (16 | 1200), 100 bf16 x 3 = 600 B (16 ∤ 600)
        assert_eq!(chunk_bytes(&conv(4, 3, DType::F32), 4), Some((1200, 384)));
        assert_eq!(chunk_bytes(&conv(4, 3, DType::BF16), 4), None);
        assert_eq!(chunk_bytes(&conv(4, 3, DType::BF16), 2), Some((1200, 384)));
    }

    #[test]
    fn stacked_rows_are_a_pixel_or_an_image_of_the_summed_channels() {
        // NHWC, 10x10x4 input, 6 outputs of a 3x3 filter (KRSC): forward rows of 4 input
        // channels in both; backward data rows of 6 output channels against the whole filter
        let c = conv(12, 4, DType::F32);
        assert_eq!(stack_rows(&c, Stack::None), (0, 0));
        assert_eq!(stack_rows(&c, Stack::Inputs), (4, 4));
        assert_eq!(stack_rows(&c, Stack::Outputs), (6, 6 * 3 * 3 * 4));
        // NCHW (KCRS): an image's 4 planes of 10x10 against an output channel's 4x3x3; an
        // image's 6 output planes of 4x4
        let mut g = c.geometry;
        g.layout = crate::Layout::Nchw;
        let c = CudnnConv { geometry: g, ..c };
        assert_eq!(stack_rows(&c, Stack::Inputs), (400, 36));
        assert_eq!(stack_rows(&c, Stack::Outputs), (6 * 4 * 4, 216));
        // the stacked descriptors' channels: the input's or the output's tripled, per chunk
        let s = chunk_conv(&c, (3, Stack::Inputs));
        assert_eq!((s.geometry.n, s.c, s.geometry.c_out), (4, 12, 6));
        let s = chunk_conv(&c, (4, Stack::Outputs));
        assert_eq!((s.geometry.n, s.c, s.geometry.c_out), (3, 4, 18));
    }
}
