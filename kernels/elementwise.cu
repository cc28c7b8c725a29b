// elementwise.cu: fills, casts between float dtypes, and the vectorized fast paths (8 elements
// of any float dtype per thread, 16-byte accesses) of the casts, the ReLU (forward with a packed
// bit mask, and backward), the binary ops and the bias add and gradient. The scalar kernels of every dtype (the
// tails of these) are in activation.cu. Row-major.

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

// The same on n8 groups of 8 elements, 16-byte accesses; src and dst 16-byte aligned (the
// scalar tail: cast_<from>_<to>).
template <typename S, typename D>
__device__ __forceinline__ void cast_vec_t(const S *src, D *dst, size_t n8) {
    GRID_STRIDE(i, n8) {
        float f[8];
        load8(src + 8 * i, f);
        store8(dst + 8 * i, f);
    }
}

// cast_<from>_<to> and cast_vec_<from>_<to> for every ordered pair of distinct float dtypes.
#define CAST(S, s, D, d)                                                                       \
    extern "C" __global__ void cast_##s##_##d(const S *src, D *dst, size_t n) {                \
        cast_t<S, D>(src, dst, n);                                                             \
    }                                                                                          \
    extern "C" __global__ void cast_vec_##s##_##d(const S *src, D *dst, size_t n8) {           \
        cast_vec_t<S, D>(src, dst, n8);                                                        \
    }
CAST(float, f32, bf16_t, bf16)
CAST(float, f32, f16_t, f16)
CAST(bf16_t, bf16, float, f32)
CAST(f16_t, f16, float, f32)
CAST(bf16_t, bf16, f16_t, f16)
CAST(f16_t, f16, bf16_t, bf16)

// The TF32 rounding of v (10 mantissa bits; to nearest, ties away from zero, as PTX's
// cvt.rna.tf32.f32; truncated where that rounding would overflow to infinity): 3xTF32's high
// part, whose rest v - hi is exact in f32. Infinities and NaNs are their own high part.
__device__ __forceinline__ float tf32_hi(float v) {
    const u32 EXP = 0x7f800000u, LOW = 0xffffe000u;
    const u32 bits = __float_as_uint(v);
    const u32 up = (bits + 0x1000u) & LOW;
    return (bits & EXP) == EXP ? v : __uint_as_float((up & EXP) == EXP ? bits & LOW : up);
}

// The rest v - hi of v's high part hi (0 where v is not finite).
__device__ __forceinline__ float tf32_lo(float v, float hi) {
    return (__float_as_uint(v) & 0x7f800000u) != 0x7f800000u ? v - hi : 0.0f;
}

// The operands of a full fp32 product on TF32 tensor cores (3xTF32, cudnn/tf32x3.rs): hi[i] =
// tf32_hi(x[i]), lo[i] = x[i] - hi[i]. i < n.
extern "C" __global__ void tf32_split(const float *x, float *hi, float *lo, size_t n) {
    GRID_STRIDE(i, n) {
        const float v = x[i], h = tf32_hi(v);
        hi[i] = h;
        lo[i] = tf32_lo(v, h);
    }
}

// 3xTF32's operand parts stacked along a row (cudnn/tf32x3.rs, the stacked composites): row r
// of c elements of x becomes row r of 3 c of out, three segments of c: segment lo_seg the rests
// x - hi, the other two the high parts hi (tf32_split's). rows * c elements of x.
extern "C" __global__ void tf32_stack(const float *x, float *out, size_t rows, size_t c,
                                      int lo_seg) {
    GRID_STRIDE(i, rows * c) {
        const size_t r = i >> 32 ? i / c : (u32)i / (u32)c, j = i - r * c; // c < 2^32
        const float v = x[i], h = tf32_hi(v);
        float *o = out + 3 * r * c + j;
#pragma unroll
        for (int s = 0; s < 3; ++s) o[s * c] = s == lo_seg ? tf32_lo(v, h) : h;
    }
}

// In-place x = max(x, 0) (NaN propagates, as jnp.maximum: the trainer must see it in the loss);
// when mask is not null, bit i%32 of mask[i/32] = x[i] > 0 (bits past n are 0). With apply == 0
// x is only read (the mask of an x that is already ReLU'd: y > 0 iff x > 0). One warp ballot
// per 32 elements; the loop bound is warp-uniform. The tail of relu_vec; unary_<dtype> in
// activation.cu computes the same ReLU (without the read-only mode).
template <typename T> __device__ void relu_t(T *x, u32 *mask, size_t n, int apply) {
    size_t lane = threadIdx.x & 31;
    size_t warp = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    size_t warps = ((size_t)blockDim.x * gridDim.x) >> 5;
    for (size_t base = warp * 32; base < n; base += warps * 32) {
        size_t i = base + lane;
        float v = i < n ? to_f32(x[i]) : 0.0f;
        u32 bits = __ballot_sync(FULL_MASK, v > 0.0f);
        if (apply && i < n) x[i] = from_f32<T>(v <= 0.0f ? 0.0f : v);
        if (mask != 0 && lane == 0) mask[base >> 5] = bits;
    }
}

// As relu_t on the first 256 * chunks elements, 8 per thread: chunk k is 32 groups of 8 (one
// per lane) and mask words 8k .. 8k+7; the 4 lanes of a word OR their bytes. x 16-byte
// aligned. The loop bound is warp-uniform.
template <typename T> __device__ void relu_vec_t(T *x, u32 *mask, size_t chunks, int apply) {
    size_t lane = threadIdx.x & 31;
    size_t warp = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    size_t warps = ((size_t)blockDim.x * gridDim.x) >> 5;
    for (size_t ch = warp; ch < chunks; ch += warps) {
        T *p = x + (ch * 32 + lane) * 8;
        float f[8];
        load8(p, f);
        u32 byte = 0;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            byte |= (u32)(f[k] > 0.0f) << k;
            f[k] = f[k] <= 0.0f ? 0.0f : f[k];
        }
        if (apply) store8(p, f);
        if (mask != 0) {
            u32 word = quad_or(byte << (8 * (lane & 3)));
            if ((lane & 3) == 0) mask[ch * 8 + (lane >> 2)] = word;
        }
    }
}

// In place dy[i] = 0 where bit i%32 of mask[i/32] is clear, on n8 groups of 8 elements; dy
// 16-byte aligned (the scalar tail: unary_bwd_<dtype>). A group whose 8 bits are all clear is
// written as zeros without being read.
template <typename T> __device__ void relu_bwd_vec_t(T *dy, const u32 *mask, size_t n8) {
    GRID_STRIDE(i, n8) {
        u32 bits = group_bits(mask, i);
        float f[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        if (bits) {
            load8(dy + 8 * i, f);
#pragma unroll
            for (int k = 0; k < 8; ++k) f[k] = (bits >> k) & 1u ? f[k] : 0.0f;
        }
        store8(dy + 8 * i, f);
    }
}

// In place a = a op b (activation.cu's binary op codes: 0 add, 1 multiply) on n8 groups of 8
// elements; a and b 16-byte aligned (the scalar tail: binary_<dtype>). With a mask, then
// relu_vec's ReLU of the rounded result, its byte of group i going to mask word i / 4: n8 must
// then be a multiple of 32 (whole warps' words; the loop bound is warp-uniform).
template <typename T>
__device__ void binary_vec_t(T *a, const T *b, u32 *mask, size_t n8, int op) {
    size_t lane = threadIdx.x & 31;
    GRID_STRIDE(i, n8) {
        float x[8], z[8];
        load8(a + 8 * i, x);
        load8(b + 8 * i, z);
        u32 byte = 0;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            x[k] = op == 1 ? x[k] * z[k] : x[k] + z[k];
            if (mask) {
                float v = to_f32(from_f32<T>(x[k]));
                byte |= (u32)(v > 0.0f) << k;
                x[k] = v <= 0.0f ? 0.0f : v;
            }
        }
        store8(a + 8 * i, x);
        if (mask) {
            u32 word = quad_or(byte << (8 * (lane & 3)));
            if ((lane & 3) == 0) mask[i >> 2] = word;
        }
    }
}

// In place a = a op b, then a[i] = 0 where bit i%32 of mask[i/32] is clear (a ReLU's backward
// pass of the result: FanOut's gradients summed into the gradient of a ReLU before it), on n8
// groups of 8 elements, n8 a multiple of 4 (whole mask words); a and b 16-byte aligned. As
// binary_vec then relu_bwd_vec, bit for bit; a group whose 8 bits are clear is written as zeros
// without reading a or b.
template <typename T>
__device__ void binary_masked_vec_t(T *a, const T *b, const u32 *mask, size_t n8, int op) {
    GRID_STRIDE(i, n8) {
        u32 bits = group_bits(mask, i);
        float x[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        if (bits) {
            float z[8];
            load8(a + 8 * i, x);
            load8(b + 8 * i, z);
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                float v = to_f32(from_f32<T>(op == 1 ? x[k] * z[k] : x[k] + z[k]));
                x[k] = (bits >> k) & 1u ? v : 0.0f;
            }
        }
        store8(a + 8 * i, x);
    }
}

// y[r, j] += b[j] on n8 groups of 8 of rows of c = 8 c8 elements; y and b 16-byte aligned.
template <typename T> __device__ void bias_add_vec_t(T *y, const T *b, size_t n8, size_t c8) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)blockDim.x * gridDim.x;
    size_t col = i % c8, step = stride % c8;
    for (; i < n8; i += stride) {
        float v[8], bb[8];
        load8(y + 8 * i, v);
        load8(b + 8 * col, bb);
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] += bb[k];
        store8(y + 8 * i, v);
        col += step;
        if (col >= c8) col -= c8;
    }
}

// Group j of 8 of dy, loaded as f32, with its 8 mask bits (all set without a mask).
struct Group {
    float f[8];
    u32 bits;
};
template <typename T>
__device__ __forceinline__ void group_load(const T *dy, const u32 *mask, size_t j, Group &g) {
    g.bits = group_bits(mask, j);
    load8(dy + 8 * j, g.f);
}

// A loaded group masked (and stored in place) when mask is not null, then added to s in f64.
template <typename T>
__device__ __forceinline__ void group_sum(T *dy, const u32 *mask, size_t j, Group &g,
                                          double *s) {
    if (mask != 0) {
#pragma unroll
        for (int k = 0; k < 8; ++k) g.f[k] = (g.bits >> k) & 1u ? g.f[k] : 0.0f;
        store8(dy + 8 * j, g.f);
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) s[k] += (double)g.f[k];
}

// Stage 1 of db[j] = sum_r dy[r, j] for dy [rows, c] seen as n8 groups of 8, f64 sums: block
// b writes partial[b, 0..c). When mask is not null, dy is first masked in place as
// unary_bwd_<dtype> does (the ReLU backward fused with the bias gradient: one pass over dy).
// Needs blockDim.x == 256, c % 8 == 0 and 2048 % c == 0, so that thread t of every block
// always sees the column group t % (c / 8); dy 16-byte aligned. Four groups a thread in flight,
// their mask words and data loaded before any is used (a masked-out element is read too, and
// zeroed). Stage 2 is bias_grad_finish_<dtype>.
template <typename T>
__device__ void bias_grad_vec_t(T *dy, const u32 *mask, double *partial, size_t n8, size_t c) {
    __shared__ double acc[8][256];
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    double s[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    Group g[4];
    for (; i + 3 * stride < n8; i += 4 * stride) {
#pragma unroll
        for (int u = 0; u < 4; ++u) group_load(dy, mask, i + u * stride, g[u]);
#pragma unroll
        for (int u = 0; u < 4; ++u) group_sum(dy, mask, i + u * stride, g[u], s);
    }
    for (; i < n8; i += stride) {
        group_load(dy, mask, i, g[0]);
        group_sum(dy, mask, i, g[0], s);
    }
    unsigned t = threadIdx.x;
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[k][t] = s[k];
    __syncthreads();
    unsigned c8 = (unsigned)(c / 8);
    if (t < c8) {
        double r[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
        for (unsigned u = t; u < 256; u += c8) {
#pragma unroll
            for (int k = 0; k < 8; ++k) r[k] += acc[k][u];
        }
#pragma unroll
        for (int k = 0; k < 8; ++k) partial[(size_t)blockIdx.x * c + 8 * t + k] = r[k];
    }
}

#define INSTANTIATE_VEC(T, S)                                                                  \
    extern "C" __global__ void relu_##S(T *x, u32 *mask, size_t n, int apply) {               \
        relu_t<T>(x, mask, n, apply);                                                          \
    }                                                                                          \
    extern "C" __global__ void relu_vec_##S(T *x, u32 *mask, size_t chunks, int apply) {      \
        relu_vec_t<T>(x, mask, chunks, apply);                                                 \
    }                                                                                          \
    extern "C" __global__ void relu_bwd_vec_##S(T *dy, const u32 *mask, size_t n8) {          \
        relu_bwd_vec_t<T>(dy, mask, n8);                                                       \
    }                                                                                          \
    extern "C" __global__ void binary_vec_##S(T *a, const T *b, u32 *mask, size_t n8,         \
                                              int op) {                                        \
        binary_vec_t<T>(a, b, mask, n8, op);                                                   \
    }                                                                                          \
    extern "C" __global__ void binary_masked_vec_##S(T *a, const T *b, const u32 *mask,       \
                                                     size_t n8, int op) {                      \
        binary_masked_vec_t<T>(a, b, mask, n8, op);                                            \
    }                                                                                          \
    extern "C" __global__ void bias_add_vec_##S(T *y, const T *b, size_t n8, size_t c8) {     \
        bias_add_vec_t<T>(y, b, n8, c8);                                                       \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(256)                                          \
        bias_grad_vec_##S(T *dy, const u32 *mask, double *partial, size_t n8, size_t c) {      \
        bias_grad_vec_t<T>(dy, mask, partial, n8, c);                                          \
    }

FOR_FLOATS(INSTANTIATE_VEC)
