//! The raw legacy cuDNN calls of the conv passes: descriptors, algorithm listing (heuristics)
//! and execution, each a `match` over the three passes (the graph API's are in `graph.rs`).

use super::{CudnnConv, Operands};
use crate::{ConvPass, DType, TensorError};
use cudarc::cudnn::{result, sys};
use stax_alloc::Allocation;
use std::ffi::{c_int, c_void};

/// Maps a cuDNN error of call `op` to [`TensorError::Cudnn`].
pub(super) fn cudnn(op: &'static str) -> impl FnOnce(result::CudnnError) -> TensorError {
    move |source| TensorError::Cudnn { op, source }
}

/// Tensor, filter and convolution descriptors of one geometry (its layout: NHWC tensors with a
/// KRSC filter, or NCHW with KCRS; its strides, padding and dilation) in its dtype (tensors,
/// filter and bias in the dtype, compute type FLOAT: cuDNN's `FLOAT_CONFIG`,
/// `PSEUDO_BFLOAT16_CONFIG` and `PSEUDO_HALF_CONFIG`), with the bias (`[1, c_out, 1, 1]` in
/// the tensors' format) and the two activations (identity, ReLU propagating NaN) of the fused
/// forward.
#[derive(Debug)]
pub(super) struct Descriptors {
    x: sys::cudnnTensorDescriptor_t,
    w: sys::cudnnFilterDescriptor_t,
    y: sys::cudnnTensorDescriptor_t,
    conv: sys::cudnnConvolutionDescriptor_t,
    bias: sys::cudnnTensorDescriptor_t,
    identity: sys::cudnnActivationDescriptor_t,
    relu: sys::cudnnActivationDescriptor_t,
}

impl Drop for Descriptors {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created in `Descriptors::new` and is destroyed once.
        unsafe {
            let _ = result::destroy_tensor_descriptor(self.x);
            let _ = result::destroy_filter_descriptor(self.w);
            let _ = result::destroy_tensor_descriptor(self.y);
            let _ = result::destroy_convolution_descriptor(self.conv);
            let _ = result::destroy_tensor_descriptor(self.bias);
            let _ = sys::cudnnDestroyActivationDescriptor(self.identity);
            let _ = sys::cudnnDestroyActivationDescriptor(self.relu);
        }
    }
}

pub(super) fn int(v: usize) -> Result<c_int, TensorError> {
    c_int::try_from(v).map_err(|_| TensorError::InvalidArgument {
        op: "conv2d",
        reason: format!("dimension {v} exceeds cuDNN's 32-bit limit"),
    })
}

/// cuDNN counts a tensor's elements in 32 bits: each of `conv`'s input (as cuDNN sees it),
/// filter and output must hold at most `i32::MAX` elements.
///
/// # Errors
/// [`TensorError::InvalidArgument`] naming the tensor, its `(n, h, w, c)` dims and its element
/// count.
pub(super) fn check_sizes(c: &CudnnConv) -> Result<(), TensorError> {
    let g = &c.geometry;
    let tensors = [
        ("input", [g.n, c.h, c.w, c.c]),
        ("filter", [g.c_out, g.kh, g.kw, c.c]),
        ("output", [g.n, g.out_h, g.out_w, g.c_out]),
    ];
    for (what, dims) in tensors {
        let count = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if count.is_none_or(|n| n > c_int::MAX as usize) {
            return Err(TensorError::InvalidArgument {
                op: "conv2d",
                reason: format!(
                    "cuDNN counts elements in 32 bits: the {what} {dims:?} (NHWC) has {} \
                     elements, over 2^31 - 1; use a smaller batch or image",
                    count.map_or("more than 2^64".into(), |n| n.to_string())
                ),
            });
        }
    }
    Ok(())
}

/// cuDNN's data type of the tensors of a convolution in `dtype`.
///
/// # Errors
/// [`TensorError::UnsupportedDType`] for a dtype cuDNN does not convolve (U32).
pub(super) fn data_type(dtype: DType) -> Result<sys::cudnnDataType_t, TensorError> {
    match dtype {
        DType::F32 => Ok(sys::cudnnDataType_t::CUDNN_DATA_FLOAT),
        DType::BF16 => Ok(sys::cudnnDataType_t::CUDNN_DATA_BFLOAT16),
        DType::F16 => Ok(sys::cudnnDataType_t::CUDNN_DATA_HALF),
        DType::U32 => Err(TensorError::UnsupportedDType {
            op: "conv2d",
            dtype,
            supported: "f32, bf16, f16",
        }),
    }
}

impl Descriptors {
    pub(super) fn new(c: &CudnnConv) -> Result<Descriptors, TensorError> {
        check_sizes(c)?;
        let g = &c.geometry;
        // the tensors' format, and the filter's (KRSC beside NHWC, KCRS beside NCHW)
        let format = match g.layout {
            crate::Layout::Nhwc => sys::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC,
            crate::Layout::Nchw => sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
        };
        let f32t = sys::cudnnDataType_t::CUDNN_DATA_FLOAT;
        let data = data_type(c.dtype)?;
        let d = Descriptors {
            x: result::create_tensor_descriptor().map_err(cudnn("cudnnCreateTensorDescriptor"))?,
            w: result::create_filter_descriptor().map_err(cudnn("cudnnCreateFilterDescriptor"))?,
            y: result::create_tensor_descriptor().map_err(cudnn("cudnnCreateTensorDescriptor"))?,
            conv: result::create_convolution_descriptor()
                .map_err(cudnn("cudnnCreateConvolutionDescriptor"))?,
            bias: result::create_tensor_descriptor()
                .map_err(cudnn("cudnnCreateTensorDescriptor"))?,
            identity: result::create_activation_descriptor()
                .map_err(cudnn("cudnnCreateActivationDescriptor"))?,
            relu: result::create_activation_descriptor()
                .map_err(cudnn("cudnnCreateActivationDescriptor"))?,
        };
        let (n, ci, co) = (int(g.n)?, int(c.c)?, int(g.c_out)?);
        // SAFETY: the descriptors were just created and are owned by `d`.
        unsafe {
            result::set_tensor4d_descriptor(d.x, format, data, [n, ci, int(c.h)?, int(c.w)?])
                .map_err(cudnn("cudnnSetTensor4dDescriptor(x)"))?;
            result::set_filter4d_descriptor(d.w, data, format, [co, ci, int(g.kh)?, int(g.kw)?])
                .map_err(cudnn("cudnnSetFilter4dDescriptor"))?;
            result::set_tensor4d_descriptor(
                d.y,
                format,
                data,
                [n, co, int(g.out_h)?, int(g.out_w)?],
            )
            .map_err(cudnn("cudnnSetTensor4dDescriptor(y)"))?;
            result::set_convolution2d_descriptor(
                d.conv,
                int(c.pad_h)?,
                int(c.pad_w)?,
                int(g.stride_h)?,
                int(g.stride_w)?,
                int(g.dilation_h)?,
                int(g.dilation_w)?,
                sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                f32t,
            )
            .map_err(cudnn("cudnnSetConvolution2dDescriptor"))?;
            result::set_tensor4d_descriptor(d.bias, format, data, [1, co, 1, 1])
                .map_err(cudnn("cudnnSetTensor4dDescriptor(bias)"))?;
            let nan = sys::cudnnNanPropagation_t::CUDNN_PROPAGATE_NAN;
            result::set_activation_descriptor(
                d.identity,
                sys::cudnnActivationMode_t::CUDNN_ACTIVATION_IDENTITY,
                nan,
                0.0,
            )
            .map_err(cudnn("cudnnSetActivationDescriptor(identity)"))?;
            result::set_activation_descriptor(
                d.relu,
                sys::cudnnActivationMode_t::CUDNN_ACTIVATION_RELU,
                nan,
                0.0,
            )
            .map_err(cudnn("cudnnSetActivationDescriptor(relu)"))?;
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

    pub(super) fn set_math(&self, math: sys::cudnnMathType_t) -> Result<(), TensorError> {
        // SAFETY: live convolution descriptor.
        unsafe { result::set_convolution_math_type(self.conv, math) }
            .map_err(cudnn("cudnnSetConvolutionMathType"))
    }
}

/// One algorithm candidate of any pass, as cuDNN's perf structs describe it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Choice {
    pub(super) algo: Algo,
    pub(super) ok: bool,
    pub(super) status: sys::cudnnStatus_t,
    pub(super) time_ms: f32,
    pub(super) workspace: usize,
    pub(super) math: sys::cudnnMathType_t,
    /// Whether cuDNN says the algorithm gives the same bits on every run.
    pub(super) deterministic: bool,
    /// Batch chunks the pass runs in (1: the whole batch at once; see `chunks.rs`); the
    /// workspace is one chunk's.
    pub(super) chunks: usize,
    /// Whether the pass is full fp32 emulated by TF32 passes of this algorithm on the
    /// operands' high and low TF32 parts, and how (`tf32x3.rs`); the workspace then holds the
    /// parts too.
    pub(super) emulated: Emulated,
}

/// How a candidate computes full fp32 ([`Choice::emulated`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Emulated {
    /// Not emulated: cuDNN's algorithm in its own math type.
    No,
    /// Three TF32 passes, one a product of parts, summed by cuDNN's `beta = 1`.
    Passes,
    /// One TF32 pass over the parts stacked along the summed channels, three times as many.
    Stacked,
}

impl Choice {
    /// The algorithm's name, with its batch chunks when there are several and `3xTF32 ` (or
    /// `3xTF32 stacked `) before it when it is emulated full fp32.
    pub(super) fn name(&self) -> String {
        let name = match self.chunks {
            1 => self.algo.name(),
            k => format!("{} in {k} batch chunks", self.algo.name()),
        };
        match self.emulated {
            Emulated::No => name,
            Emulated::Passes => format!("3xTF32 {name}"),
            Emulated::Stacked => format!("3xTF32 stacked {name}"),
        }
    }
}

/// A range of device memory given to cuDNN as a call's workspace: its address and bytes (none:
/// 0 and 0).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Ws {
    pub(super) addr: u64,
    pub(super) bytes: usize,
}

impl Ws {
    /// The whole of `a`, or none.
    pub(super) fn of(a: Option<&Allocation>) -> Ws {
        a.map_or(Ws::default(), |a| Ws {
            addr: a.addr(),
            bytes: a.bytes(),
        })
    }

    fn ptr(self) -> *mut c_void {
        self.addr as *mut c_void
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Algo {
    Fwd(sys::cudnnConvolutionFwdAlgo_t),
    Data(sys::cudnnConvolutionBwdDataAlgo_t),
    Filter(sys::cudnnConvolutionBwdFilterAlgo_t),
    /// A configuration of cuDNN's graph API: `index` into the pass's usable engines
    /// (`graph::Engines`), `global` cuDNN's index of the engine.
    Engine {
        index: usize,
        global: i64,
    },
}

impl Algo {
    pub(super) fn name(self) -> String {
        match self {
            Algo::Fwd(a) => format!("{a:?}"),
            Algo::Data(a) => format!("{a:?}"),
            Algo::Filter(a) => format!("{a:?}"),
            Algo::Engine { index, global } => {
                format!("CUDNN_GRAPH_ENGINE_{global} (heuristic config {index})")
            }
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
                deterministic: p.determinism == sys::cudnnDeterminism_t::CUDNN_DETERMINISTIC,
                chunks: 1,
                emulated: Emulated::No,
            })
            .collect::<Vec<_>>()
    };
}

pub(super) const MAX_ALGOS: usize = 16;

/// The candidates cuDNN's heuristics list for `pass` (`cudnnGet*Algorithm_v7`), with their
/// workspace needs: nothing runs on the device.
pub(super) fn candidates(
    handle: sys::cudnnHandle_t,
    d: &Descriptors,
    pass: ConvPass,
) -> Result<Vec<Choice>, TensorError> {
    let mut count: c_int = 0;
    let req = MAX_ALGOS as c_int;
    // SAFETY (all arms): live handle and descriptors; `perf` has room for `req` results.
    let out = match pass {
        ConvPass::Forward => unsafe {
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
        ConvPass::BackwardData => unsafe {
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
        ConvPass::BackwardFilter => unsafe {
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
    };
    Ok(out)
}

fn ptr(addr: u64) -> *const c_void {
    addr as *const c_void
}

/// Runs one pass with `algo`: the output is `1 · result + beta · output` (cuDNN's blending;
/// `beta` 0 overwrites it, 1 adds to it).
pub(super) fn execute(
    handle: sys::cudnnHandle_t,
    d: &Descriptors,
    algo: Algo,
    o: Operands,
    ws: Ws,
    beta: f32,
) -> Result<(), TensorError> {
    let alpha = 1.0f32;
    let (a, b) = ((&alpha as *const f32).cast(), (&beta as *const f32).cast());
    let bytes = ws.bytes;
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
                ws.ptr(),
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
                ws.ptr(),
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
                ws.ptr(),
                bytes,
                b,
                d.w,
                o.w as *mut c_void,
            )
            .map_err(cudnn("cudnnConvolutionBackwardFilter")),
            Algo::Engine { global, .. } => Err(TensorError::InvalidArgument {
                op: "conv2d",
                reason: format!("internal: graph engine {global} run as a legacy algorithm"),
            }),
        }
    }
}

/// The forward pass with its epilogue fused by cuDNN: `y = act(conv(x, w) + bias)`, `act` the
/// identity or a ReLU (`relu`), with `algo` (cuDNN supports the identity only with
/// `IMPLICIT_PRECOMP_GEMM`). `z` is `y` with weight 0: cuDNN reads no side input.
pub(super) fn execute_bias_act(
    handle: sys::cudnnHandle_t,
    d: &Descriptors,
    algo: sys::cudnnConvolutionFwdAlgo_t,
    o: Operands,
    bias: u64,
    relu: bool,
    ws: Ws,
) -> Result<(), result::CudnnError> {
    let (alpha1, alpha2) = (1.0f32, 0.0f32);
    let bytes = ws.bytes;
    let act = if relu { d.relu } else { d.identity };
    // SAFETY: live handle and descriptors; x, w, y are device buffers of the descriptors'
    // shapes (checked by the caller), bias holds c_out floats, the workspace holds `bytes`
    // bytes, which is what `algo` was chosen with; alpha1 and alpha2 are host f32 scalars.
    unsafe {
        result::convolution_bias_activation_forward(
            handle,
            (&alpha1 as *const f32).cast(),
            d.x,
            ptr(o.x),
            d.w,
            ptr(o.w),
            d.conv,
            algo,
            ws.ptr(),
            bytes,
            (&alpha2 as *const f32).cast(),
            d.y,
            ptr(o.y),
            d.bias,
            ptr(bias),
            act,
            d.y,
            o.y as *mut c_void,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Conv2dGeometry, Padding};

    fn conv(n: usize, hw: usize, c: usize) -> CudnnConv {
        let g = Conv2dGeometry::new(
            &[n, hw, hw, 3].into(),
            &[3, 3, 3, c].into(),
            (1, 1),
            Padding::Same,
        )
        .unwrap();
        CudnnConv {
            geometry: g,
            dtype: DType::F32,
            h: hw,
            w: hw,
            c: 3,
            pad_h: 1,
            pad_w: 1,
            layout_bytes: 0,
        }
    }

    #[test]
    fn tensors_over_32_bit_element_counts_are_refused_by_name() {
        assert!(check_sizes(&conv(100, 200, 64)).is_ok()); // the seed: 256 M elements
        let e = check_sizes(&conv(100, 1000, 64)).unwrap_err(); // 6.4 G output elements
        let msg = e.to_string();
        assert!(msg.contains("the output [100, 1000, 1000, 64]"), "{msg}");
        assert!(msg.contains("6400000000 elements"), "{msg}");
    }
}
