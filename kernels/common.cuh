// common.cuh: prepended (as text, not #include) to every kernel source by
// crates/stax-tensor/src/cuda/kernels.rs before NVRTC compiles it.
//
// Conventions: element counts and indices are size_t (tensors exceed 2^31 elements); every
// kernel walks its index space with a grid-stride loop, so any grid size is correct and the
// launcher only picks one for occupancy. Symbols are extern "C" and named <op>_<dtype>.

typedef unsigned int u32;
typedef unsigned long long u64;

#define FULL_MASK 0xffffffffu

// Grid-stride loop over [0, n).
#define GRID_STRIDE(i, n)                                                                      \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                   \
         i += (size_t)blockDim.x * gridDim.x)

// Warp-stride loop over [0, n): one warp per item, every lane of a warp taking the same trips
// (as warp shuffles need); blocks must be whole warps.
#define WARP_STRIDE(i, n)                                                                      \
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; i < (n);            \
         i += ((size_t)blockDim.x * gridDim.x) >> 5)

__device__ __forceinline__ double warp_sum_f64(double v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_down_sync(FULL_MASK, v, offset);
    }
    return v;
}

__device__ __forceinline__ float warp_max_f32(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, offset));
    }
    return v;
}

__device__ __forceinline__ double warp_allsum_f64(double v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(FULL_MASK, v, offset);
    }
    return v;
}

// Half-precision storage types, bit patterns only (no header needed under NVRTC): every
// kernel reads an element as f32 (to_f32), computes in f32 and rounds back once (from_f32,
// round to nearest even: the conversions of the `half` crate the CPU backend uses).
struct bf16_t {
    unsigned short bits;
};
struct f16_t {
    unsigned short bits;
};

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(bf16_t v) { return __uint_as_float(((u32)v.bits) << 16); }
__device__ __forceinline__ float to_f32(f16_t v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
    return f;
}

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16_t from_f32<bf16_t>(float v) {
    u32 u = __float_as_uint(v);
    bf16_t r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        r.bits = (unsigned short)((u >> 16) | 0x40u); // quiet NaN, sign kept
    } else {
        r.bits = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    return r;
}
template <> __device__ __forceinline__ f16_t from_f32<f16_t>(float v) {
    f16_t r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(v));
    return r;
}

// Instantiates M(type, suffix) for every float dtype: f32, bf16, f16.
#define FOR_FLOATS(M) M(float, f32) M(bf16_t, bf16) M(f16_t, f16)

// A sliding window over an NHWC image (a pooling's or a convolution's im2col): must match
// `WindowGeometry` in crates/stax-tensor/src/cuda/kernels/spatial.rs (#[repr(C)], size_t each).
struct WindowGeometry {
    size_t n, h, w, c, kh, kw, sh, sw, pad_top, pad_left, out_h, out_w, dh, dw;
};
