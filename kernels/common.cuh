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

// Eight consecutive elements as f32 (16 bytes of bf16 or f16, 32 of f32), loaded and stored
// with 16-byte accesses: p must be 16-byte aligned. The vectorized kernels move every
// dtype 8 elements per thread; a 16-bit element widens exactly and rounds back to itself.
__device__ __forceinline__ void load8(const float *p, float (&f)[8]) {
    float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w;
    f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}
template <typename T> __device__ __forceinline__ void load8(const T *p, float (&f)[8]) {
    uint4 q = *(const uint4 *)p;
    u32 w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        T lo, hi;
        lo.bits = (unsigned short)(w[k] & 0xffffu);
        hi.bits = (unsigned short)(w[k] >> 16);
        f[2 * k] = to_f32(lo);
        f[2 * k + 1] = to_f32(hi);
    }
}
__device__ __forceinline__ void store8(float *p, const float (&f)[8]) {
    ((float4 *)p)[0] = make_float4(f[0], f[1], f[2], f[3]);
    ((float4 *)p)[1] = make_float4(f[4], f[5], f[6], f[7]);
}
template <typename T> __device__ __forceinline__ void store8(T *p, const float (&f)[8]) {
    u32 w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        w[k] = (u32)from_f32<T>(f[2 * k]).bits | ((u32)from_f32<T>(f[2 * k + 1]).bits << 16);
    }
    *(uint4 *)p = make_uint4(w[0], w[1], w[2], w[3]);
}

// The second stage of a deterministic two-stage reduction: the sums over the splits of a
// [splits, c, W] array of f64 partials, by a block of 32 x 32 threads for channels
// blockIdx.x * 32 .. + 31: thread (x, y) adds splits y, y + 32, ... of its channel, then
// thread (x, 0) adds the 32 in order (a fixed order whatever the launch). Every thread of the
// block must call it; returns whether this thread holds channel *j's sums in out.
template <int W>
__device__ bool column_sums(const double *partial, size_t splits, size_t c, size_t *j,
                            double (&out)[W]) {
    __shared__ double acc[W][32][33];
    *j = (size_t)blockIdx.x * 32 + threadIdx.x;
#pragma unroll
    for (int w = 0; w < W; ++w) out[w] = 0.0;
    if (*j < c) {
        for (size_t k = threadIdx.y; k < splits; k += 32) {
#pragma unroll
            for (int w = 0; w < W; ++w) out[w] += partial[(k * c + *j) * W + w];
        }
    }
#pragma unroll
    for (int w = 0; w < W; ++w) acc[w][threadIdx.y][threadIdx.x] = out[w];
    __syncthreads();
    if (threadIdx.y != 0 || *j >= c) return false;
    for (int y = 1; y < 32; ++y) {
#pragma unroll
        for (int w = 0; w < W; ++w) out[w] += acc[w][y][threadIdx.x];
    }
    return true;
}

// Instantiates M(type, suffix) for every float dtype: f32, bf16, f16.
#define FOR_FLOATS(M) M(float, f32) M(bf16_t, bf16) M(f16_t, f16)

// A sliding window over an NHWC image (a pooling's or a convolution's im2col): must match
// `WindowGeometry` in crates/stax-tensor/src/cuda/kernels/spatial.rs (#[repr(C)], size_t each).
struct WindowGeometry {
    size_t n, h, w, c, kh, kw, sh, sw, pad_top, pad_left, out_h, out_w, dh, dw;
};

// The 8 mask bits of group i (elements 8i..8i+7) of a packed ReLU mask, 4 groups a u32 word
// (all set with no mask).
__device__ __forceinline__ u32 group_bits(const u32 *mask, size_t i) {
    return mask ? (mask[i >> 2] >> ((i & 3) * 8)) & 255u : 255u;
}

// An asynchronous 16-byte copy from global to shared memory (shared address dst), zeros when
// !valid (src is then not read); completes with the cp.async group it is committed in.
__device__ __forceinline__ void cp_async16(u32 dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0));
}

// v ORed over the 4 lanes of the caller's quad (lanes 4 g .. 4 g + 3: an mma fragment's row,
// or the 4 lanes whose mask bytes make one mask word).
__device__ __forceinline__ u32 quad_or(u32 v) {
    v |= __shfl_xor_sync(FULL_MASK, v, 1);
    return v | __shfl_xor_sync(FULL_MASK, v, 2);
}

// An asynchronous 4-byte copy from global to shared memory (shared address dst), zero when
// !valid (src is then not read).
__device__ __forceinline__ void cp_async4(u32 dst, const void *src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src),
                 "r"(valid ? 4 : 0));
}

// Adam's hyper-parameters of one step (adam.cu, dense_mma.cu).
// Must match `AdamHyper` in crates/stax-tensor/src/backend.rs (#[repr(C)], eight f32).
struct AdamHyper {
    float lr;
    float b1;
    float b2;
    float eps;
    float eps_root;
    float bias_correction1;
    float bias_correction2;
    float grad_scale;
};

// adam_one's step with the bias corrections' reciprocals (inv_bc1, inv_bc2) as factors, f32
// contractions allowed and a fast division (__fdividef, 2 ulp): within a few ulp of adam_one's
// IEEE-rounded step, at a fifth of its instructions. Under TF32 only (dense_mma.cu's pass, whose
// gradient is itself a TF32 product, and adam.cu's rows kernel): the exact divisions made the
// tensor-core pass 1.4x slower (5.15 ms against 3.78 at the seed's batch 100, H200,
// 2026-12-03).
__device__ __forceinline__ void adam_tf32(float &p, float g, float &m, float &v,
                                          const AdamHyper &h, float inv_bc1, float inv_bc2) {
    g *= h.grad_scale;
    m = (1.0f - h.b1) * g + h.b1 * m;
    v = (1.0f - h.b2) * (g * g) + h.b2 * v;
    const float denom = sqrtf(v * inv_bc2 + h.eps_root) + h.eps;
    p -= h.lr * __fdividef(m * inv_bc1, denom);
}

// v rounded to TF32 (cvt.rna, as cuDNN's and cuBLAS's TF32 paths round), as an mma operand.
__device__ __forceinline__ u32 tf32_bits(float v) {
    u32 r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return r;
}

// The rest of v past its TF32 rounding big (tf32_bits(v)), itself rounded to TF32: 3xTF32's
// small part: v = big + small within 2^-22 |v| (wgrad_wgmma.cu, gemm.cu). big's low 13 bits are
// cleared before it is read as an f32: PTX leaves them unspecified in a .tf32 value.
__device__ __forceinline__ u32 tf32_small(float v, u32 big) {
    return tf32_bits(v - __uint_as_float(big & 0xffffe000u));
}

// tf32_round: the f32 bits u rounded to TF32 (the 10-bit mantissa, ties away from zero, as
// cvt.rna for finite values and infinities) by integer operations: half of the dropped range
// added, then dropped. cvt.rna.tf32.f32 compiles to several more instructions on sm_90: at the
// seed's conv2 this took conv_wgmma.cu's passes from 4.83 / 4.73 ms to 4.43 / 4.31 with the
// same outputs (H100, 2026-12-07, before the NaN select; 4.47 / 4.42 with it, 2026-12-08,
// BENCHMARKS.md). tf32_parts: v's TF32 rounding big and the
// rest's, small: v = big + small within 2^-22 |v| (3xTF32's operands: conv_wgmma.cu,
// dense_mma.cu's dense_grads_x3). A NaN's big is the NaN itself (the addition would carry the
// GPU's NaN 0x7fffffff into the sign bit, a signed zero); an infinity's rest, the GPU's NaN,
// rounds to -0.
__device__ __forceinline__ u32 tf32_round(u32 u) { return (u + 0x1000u) & 0xffffe000u; }
__device__ __forceinline__ void tf32_parts(float v, u32 &big, u32 &small) {
    big = v != v ? __float_as_uint(v) : tf32_round(__float_as_uint(v));
    small = tf32_round(__float_as_uint(v - __uint_as_float(big)));
}

// d += a · b on the tensor cores with f32 accumulators (gemm.cu, direct_mma.cu, dense_mma.cu):
// m16n8k16 for the 16-bit types, m16n8k8 TF32 for f32 (PTX ISA, "Matrix fragments for
// mma.m16n8k16 / m16n8k8": lane 4 g + t).
template <typename T>
__device__ __forceinline__ void mma_sync(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1);
template <>
__device__ __forceinline__ void mma_sync<bf16_t>(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma_sync<f16_t>(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma_sync<float>(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
