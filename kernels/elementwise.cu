// elementwise.cu: fills, casts between float dtypes, and the vectorized f32 fast paths of the ReLU (forward with a packed
// bit mask, and backward) and of the bias add and gradient. The scalar kernels of every dtype
// (and the tails of these) are in activation.cu. Row-major f32 unless noted.

// p[i] = value for i < n (32-bit words: an f32 bit pattern or a u32).
extern "C" __global__ void fill_u32(u32 *p, u32 value, size_t n) {
    GRID_STRIDE(i, n) { p[i] = value; }
}

// p[i] = value for i < n (16-bit words: a bf16 or f16 bit pattern).
extern "C" __global__ void fill_u16(unsigned short *p, unsigned short value, size_t n) {
    GRID_STRIDE(i, n) { p[i] = value; }
}

// dst[i] = src[i] converted (read as f32, rounded once to nearest even: from_f32), i < n.
template <typename S, typename D> __device__ __forceinline__ void cast_t(const S *src, D *dst,
                                                                         size_t n) {
    GRID_STRIDE(i, n) { dst[i] = from_f32<D>(to_f32(src[i])); }
}

// cast_<from>_<to> for every ordered pair of distinct float dtypes.
#define CAST(S, s, D, d)                                                                       \
    extern "C" __global__ void cast_##s##_##d(const S *src, D *dst, size_t n) {                \
        cast_t<S, D>(src, dst, n);                                                             \
    }
CAST(float, f32, bf16_t, bf16)
CAST(float, f32, f16_t, f16)
CAST(bf16_t, bf16, float, f32)
CAST(f16_t, f16, float, f32)
CAST(bf16_t, bf16, f16_t, f16)
CAST(f16_t, f16, bf16_t, bf16)

// In-place x = max(x, 0) (NaN propagates, as jnp.maximum: the trainer must see it in the loss);
// when mask is not null, bit i%32 of mask[i/32] = x[i] > 0 (bits past n are 0). With apply == 0
// x is only read (the mask of an x that is already ReLU'd: y > 0 iff x > 0). One warp ballot
// per 32 elements; the loop bound is warp-uniform. The tail of the vectorized relu_vec_f32;
// unary_<dtype> in activation.cu is the ReLU of every dtype.
extern "C" __global__ void relu_f32(float *x, u32 *mask, size_t n, int apply) {
    size_t lane = threadIdx.x & 31;
    size_t warp = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    size_t warps = ((size_t)blockDim.x * gridDim.x) >> 5;
    for (size_t base = warp * 32; base < n; base += warps * 32) {
        size_t i = base + lane;
        float v = i < n ? x[i] : 0.0f;
        bool pos = v > 0.0f;
        u32 bits = __ballot_sync(FULL_MASK, pos);
        if (apply && i < n) x[i] = v <= 0.0f ? 0.0f : v;
        if (mask != 0 && lane == 0) mask[base >> 5] = bits;
    }
}

// 4 mask bits (bit k: v.k > 0).
__device__ __forceinline__ u32 positive_bits(float4 v) {
    return (u32)(v.x > 0.0f) | ((u32)(v.y > 0.0f) << 1) | ((u32)(v.z > 0.0f) << 2) |
           ((u32)(v.w > 0.0f) << 3);
}

// As relu_f32 on the first 128 * chunks elements, 16 bytes per thread: chunk k is 32 float4s
// (one per lane) and mask words 4k .. 4k+3; the 8 lanes of a word OR their 4-bit nibbles.
// x and mask 16-byte aligned. The loop bound is warp-uniform.
extern "C" __global__ void relu_vec_f32(float *x, u32 *mask, size_t chunks, int apply) {
    size_t lane = threadIdx.x & 31;
    size_t warp = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    size_t warps = ((size_t)blockDim.x * gridDim.x) >> 5;
    float4 *x4 = (float4 *)x;
    for (size_t ch = warp; ch < chunks; ch += warps) {
        float4 *p = x4 + ch * 32 + lane;
        float4 v = *p;
        u32 word = positive_bits(v) << (4 * (lane & 7));
        if (apply) {
            v.x = v.x <= 0.0f ? 0.0f : v.x;
            v.y = v.y <= 0.0f ? 0.0f : v.y;
            v.z = v.z <= 0.0f ? 0.0f : v.z;
            v.w = v.w <= 0.0f ? 0.0f : v.w;
            *p = v;
        }
        if (mask != 0) {
            word |= __shfl_xor_sync(FULL_MASK, word, 1);
            word |= __shfl_xor_sync(FULL_MASK, word, 2);
            word |= __shfl_xor_sync(FULL_MASK, word, 4);
            if ((lane & 7) == 0) mask[ch * 4 + (lane >> 3)] = word;
        }
    }
}

// dy = 0 where the 4 bits (bit k for component k) are clear.
__device__ __forceinline__ float4 mask4(float4 d, u32 bits) {
    d.x = (bits & 1u) ? d.x : 0.0f;
    d.y = (bits & 2u) ? d.y : 0.0f;
    d.z = (bits & 4u) ? d.z : 0.0f;
    d.w = (bits & 8u) ? d.w : 0.0f;
    return d;
}

// In place dy[i] = 0 where bit i%32 of mask[i/32] is clear, on n4 float4s (n = 4 n4 floats),
// 16 bytes per thread; dy 16-byte aligned (the scalar tail: unary_bwd_f32).
// A float4 whose 4 bits are all clear is written as zeros without being read.
extern "C" __global__ void relu_bwd_vec_f32(float *dy, const u32 *mask, size_t n4) {
    float4 *d4 = (float4 *)dy;
    GRID_STRIDE(i, n4) {
        u32 bits = (mask[i >> 3] >> ((i & 7) * 4)) & 15u;
        float4 d = bits ? d4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        d4[i] = mask4(d, bits);
    }
}

// y[r, j] += b[j] on n4 float4s of rows of c = 4 c4 floats; y and b 16-byte aligned.
extern "C" __global__ void bias_add_vec_f32(float *y, const float *b, size_t n4, size_t c4) {
    float4 *y4 = (float4 *)y;
    const float4 *b4 = (const float4 *)b;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)blockDim.x * gridDim.x;
    size_t col = i % c4, step = stride % c4;
    for (; i < n4; i += stride) {
        float4 v = y4[i];
        float4 bb = b4[col];
        v.x += bb.x;
        v.y += bb.y;
        v.z += bb.z;
        v.w += bb.w;
        y4[i] = v;
        col += step;
        if (col >= c4) col -= c4;
    }
}

__device__ __forceinline__ void add4(double *s, float4 v) {
    s[0] += (double)v.x;
    s[1] += (double)v.y;
    s[2] += (double)v.z;
    s[3] += (double)v.w;
}

// Stage 1 of db[j] = sum_r dy[r, j] for dy [rows, c] seen as n4 float4s, 16 bytes per thread,
// f64 sums: block b writes partial[b, 0..c). When mask is not null, dy is first masked in place
// as unary_bwd_f32 does (the ReLU backward fused with the bias gradient: one pass over dy).
// Needs blockDim.x == 256, c % 4 == 0 and 1024 % c == 0, so that thread t of every block always
// sees the float4 column group t % (c / 4); dy (and mask) 16-byte aligned. Stage 2 is
// bias_grad_finish_f32.
extern "C" __global__ void __launch_bounds__(256)
    bias_grad_vec_f32(float *dy, const u32 *mask, double *partial, size_t n4, size_t c) {
    __shared__ double acc[4][256];
    float4 *d4 = (float4 *)dy;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    double s[4] = {0.0, 0.0, 0.0, 0.0};
    // Four independent 16-byte loads in flight per thread.
    for (; i + 3 * stride < n4; i += 4 * stride) {
        float4 v[4];
        u32 bits[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            size_t j = i + k * stride;
            bits[k] = mask != 0 ? (mask[j >> 3] >> ((j & 7) * 4)) & 15u : 15u;
            v[k] = bits[k] ? d4[j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            if (mask != 0) {
                v[k] = mask4(v[k], bits[k]);
                d4[i + k * stride] = v[k];
            }
            add4(s, v[k]);
        }
    }
    for (; i < n4; i += stride) {
        u32 bits = mask != 0 ? (mask[i >> 3] >> ((i & 7) * 4)) & 15u : 15u;
        float4 v = bits ? d4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (mask != 0) {
            v = mask4(v, bits);
            d4[i] = v;
        }
        add4(s, v);
    }
    unsigned t = threadIdx.x;
#pragma unroll
    for (int k = 0; k < 4; ++k) acc[k][t] = s[k];
    __syncthreads();
    unsigned c4 = (unsigned)(c / 4);
    if (t < c4) {
        double r[4] = {0.0, 0.0, 0.0, 0.0};
        for (unsigned u = t; u < 256; u += c4) {
#pragma unroll
            for (int k = 0; k < 4; ++k) r[k] += acc[k][u];
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) partial[(size_t)blockIdx.x * c + 4 * t + k] = r[k];
    }
}
