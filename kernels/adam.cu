// adam.cu: one fused, in-place Adam step (optax.adam: scale_by_adam then
// scale_by_learning_rate; Kingma & Ba 2014, Algorithm 1, eps outside the square root).

// x / y rounded to nearest (__fdiv_rn's bits) for a zero x too without the division's slow
// path: __fdiv_rn's range check sends a zero dividend there (half the seed's dense rows have a
// zero gradient, moment and step: ReLU's zeros), but for y > 0, ±0 / y is ±0 (IEEE 754).
// The divisions run on 1 instead of 0, so no lane takes the slow path for them.
__device__ __forceinline__ float div_rn(float x, float y) {
    bool zero = x == 0.0f && y > 0.0f;
    float q = __fdiv_rn(zero ? 1.0f : x, y);
    return zero ? x : q;
}

// sqrt(x) rounded to nearest (__fsqrt_rn's bits), ±0 (whose square root is itself) without its
// slow path.
__device__ __forceinline__ float sqrt_rn(float x) {
    float r = __fsqrt_rn(x == 0.0f ? 1.0f : x);
    return x == 0.0f ? x : r;
}

// g *= grad_scale (1, or 1 / loss_scale: jmp's unscale in f32);
// m = (1 - b1) g + b1 m; v = (1 - b2) g^2 + b2 v;
// p += (-lr) * (m / bc1) / (sqrt(v / bc2 + eps_root) + eps).
// Explicitly rounded operations (no FMA contraction), in the CPU backend's order, so both
// backends give the same bits.
__device__ __forceinline__ void adam_one(float &p, float g, float &m, float &v,
                                         const AdamHyper &h) {
    g = __fmul_rn(g, h.grad_scale);
    float mi = __fadd_rn(__fmul_rn(1.0f - h.b1, g), __fmul_rn(h.b1, m));
    float vi = __fadd_rn(__fmul_rn(1.0f - h.b2, __fmul_rn(g, g)), __fmul_rn(h.b2, v));
    m = mi;
    v = vi;
    float mhat = div_rn(mi, h.bias_correction1);
    float vhat = div_rn(vi, h.bias_correction2);
    float denom = __fadd_rn(sqrt_rn(__fadd_rn(vhat, h.eps_root)), h.eps);
    p = __fadd_rn(p, __fmul_rn(-h.lr, div_rn(mhat, denom)));
}

// One element per thread and iteration (any alignment): f32 parameters and second moment,
// the gradient in its own dtype G (read as f32), the first moment in M (optax's mu_dtype:
// read as f32, rounded once when stored): adam_<G> (M = f32), adam_mu_<M>_<G>.
template <typename G, typename M>
__device__ __forceinline__ void adam_t(float *p, const G *g, M *m, float *v, AdamHyper h,
                                       size_t n) {
    GRID_STRIDE(i, n) {
        float pi = p[i], mi = to_f32(m[i]), vi = v[i];
        adam_one(pi, to_f32(g[i]), mi, vi, h);
        m[i] = from_f32<M>(mi);
        v[i] = vi;
        p[i] = pi;
    }
}

#define ADAM(T, s)                                                                             \
    extern "C" __global__ void adam_##s(float *p, const T *g, float *m, float *v, AdamHyper h, \
                                        size_t n) {                                            \
        adam_t<T, float>(p, g, m, v, h, n);                                                    \
    }
FOR_FLOATS(ADAM)

#define ADAM_MU_BF16(T, s)                                                                     \
    extern "C" __global__ void adam_mu_bf16_##s(float *p, const T *g, bf16_t *m, float *v,     \
                                                AdamHyper h, size_t n) {                       \
        adam_t<T, bf16_t>(p, g, m, v, h, n);                                                   \
    }
FOR_FLOATS(ADAM_MU_BF16)

#define ADAM_MU_F16(T, s)                                                                      \
    extern "C" __global__ void adam_mu_f16_##s(float *p, const T *g, f16_t *m, float *v,       \
                                               AdamHyper h, size_t n) {                        \
        adam_t<T, f16_t>(p, g, m, v, h, n);                                                    \
    }
FOR_FLOATS(ADAM_MU_F16)

// nonfinite[0] = 1 when an element of x is NaN or infinite (the loss scale's check, jmp's
// all_finite); every writer writes the same value, so no atomics are needed.
template <typename T>
__device__ __forceinline__ void all_finite_t(const T *x, unsigned int *nonfinite, size_t n) {
    GRID_STRIDE(i, n) {
        // exponent all ones: an infinity or a NaN (widening to f32 keeps both)
        if ((__float_as_uint(to_f32(x[i])) & 0x7f800000u) == 0x7f800000u) {
            *nonfinite = 1u;
        }
    }
}

#define ALL_FINITE(T, s)                                                                       \
    extern "C" __global__ void all_finite_##s(const T *x, unsigned int *nonfinite, size_t n) { \
        all_finite_t<T>(x, nonfinite, n);                                                      \
    }
FOR_FLOATS(ALL_FINITE)

// A chunk of a dense weight updated while its input gradient still needs the weight before the
// step in the compute dtype T (bf16 or f16; ops::dense_adam): the chunk's gradient g is of T
// (the dw GEMM's output rounded once, as the unfused layer's weight gradient in T), read as
// f32; p, m, v are f32, and besides old[i] = p[i] before the step, rounded to T (from_f32: the
// cast's rounding), so the input gradient's GEMM reads what the unfused layer's cast of the
// weight holds. The step itself is adam_one's, so p, m and v are those bits of adam_<T>.

// Four values rounded to T, packed little-endian into 8 bytes (elements 4i .. 4i + 3).
template <typename T> __device__ __forceinline__ uint2 pack4(float4 f) {
    uint2 r;
    r.x = (u32)from_f32<T>(f.x).bits | ((u32)from_f32<T>(f.y).bits << 16);
    r.y = (u32)from_f32<T>(f.z).bits | ((u32)from_f32<T>(f.w).bits << 16);
    return r;
}

// Four consecutive elements of g (element 4i on) as f32: one 16-byte load of f32, one 8-byte
// load of a 16-bit dtype.
__device__ __forceinline__ float4 load4(const float *g, size_t i) {
    return ((const float4 *)g)[i];
}
template <typename T> __device__ __forceinline__ float4 load4(const T *g, size_t i) {
    uint2 q = ((const uint2 *)g)[i];
    T a, b, c, d;
    a.bits = (unsigned short)(q.x & 0xffffu), b.bits = (unsigned short)(q.x >> 16);
    c.bits = (unsigned short)(q.y & 0xffffu), d.bits = (unsigned short)(q.y >> 16);
    return make_float4(to_f32(a), to_f32(b), to_f32(c), to_f32(d));
}

// One element per thread and iteration (any alignment); old null: nothing but the step.
template <typename T>
__device__ __forceinline__ void adam_old_t(float *p, const T *g, float *m, float *v, T *old,
                                           AdamHyper h, size_t n) {
    GRID_STRIDE(i, n) {
        float pi = p[i], mi = m[i], vi = v[i];
        if (old) old[i] = from_f32<T>(pi);
        adam_one(pi, to_f32(g[i]), mi, vi, h);
        m[i] = mi;
        v[i] = vi;
        p[i] = pi;
    }
}

// 16 bytes per f32 array and thread (8 of old, 8 of a 16-bit g): n / 4 float4s, then the last
// n % 4 elements by the first threads of block 0. p, g, m, v 16-byte aligned, old 8-byte
// aligned or null (then nothing but the step: adam_vec_f32, with an f32 g).
template <typename T, typename G>
__device__ __forceinline__ void adam_old_vec_t(float *__restrict__ p, const G *__restrict__ g,
                                               float *__restrict__ m, float *__restrict__ v,
                                               T *__restrict__ old, AdamHyper h, size_t n) {
    size_t n4 = n / 4;
    float4 *p4 = (float4 *)p, *m4 = (float4 *)m, *v4 = (float4 *)v;
    uint2 *old4 = (uint2 *)old;
    GRID_STRIDE(i, n4) {
        float4 gi = load4(g, i), mi = m4[i], vi = v4[i], pi = p4[i];
        if (old) old4[i] = pack4<T>(pi);
        adam_one(pi.x, gi.x, mi.x, vi.x, h);
        adam_one(pi.y, gi.y, mi.y, vi.y, h);
        adam_one(pi.z, gi.z, mi.z, vi.z, h);
        adam_one(pi.w, gi.w, mi.w, vi.w, h);
        m4[i] = mi;
        v4[i] = vi;
        p4[i] = pi;
    }
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n - 4 * n4) {
        size_t j = 4 * n4 + t;
        float pj = p[j], mj = m[j], vj = v[j];
        if (old) old[j] = from_f32<T>(pj);
        adam_one(pj, to_f32(g[j]), mj, vj, h);
        m[j] = mj;
        v[j] = vj;
        p[j] = pj;
    }
}

// adam_old_<T>, adam_old_vec_<T> for the two 16-bit dtypes.
#define ADAM_OLD(T, s)                                                                         \
    extern "C" __global__ void adam_old_##s(float *p, const T *g, float *m, float *v, T *old,  \
                                            AdamHyper h, size_t n) {                           \
        adam_old_t<T>(p, g, m, v, old, h, n);                                                  \
    }                                                                                          \
    extern "C" __global__ void adam_old_vec_##s(float *p, const T *g, float *m, float *v,      \
                                                T *old, AdamHyper h, size_t n) {               \
        adam_old_vec_t<T, T>(p, g, m, v, old, h, n);                                           \
    }
ADAM_OLD(bf16_t, bf16)
ADAM_OLD(f16_t, f16)

// adam_f32's step on n floats, 16 bytes per array and thread: n / 4 float4s, then the last n % 4
// elements by the first threads of block 0. All four arrays 16-byte aligned.
extern "C" __global__ void adam_vec_f32(float *__restrict__ p, const float *__restrict__ g,
                                        float *__restrict__ m, float *__restrict__ v,
                                        AdamHyper h, size_t n) {
    adam_old_vec_t<bf16_t, float>(p, g, m, v, (bf16_t *)0, h, n);
}


// A dense layer's backward pass with Adam on its f32 weight in one pass over the weight, for a
// batch of M <= 16 rows and at most 128 output features (ops::dense_adam's small-batch path):
// x [M, k], dy [M, n], w, mu, nu [k, n], dx [M, k] (null: not computed; may be x itself). Per
// weight row i: dx[b, i] = sum_j dy[b, j] w_old[i, j], dw[i, :] = sum_b x[b, i] dy[b, :] (in
// registers, never stored), then adam_one on w, mu, nu. The weight, its moments, x and dx each
// cross memory once: the whole pass's floor is its 6 k n floats of w, mu, nu (read and write).
//
// A warp takes 32 weight rows at a time: lane l holds columns l + 32 c (c < 4) of dy for every
// b in registers (loaded once); x's 32 columns are staged in shared memory (read before dx is
// written, by the same lane, so an in-place dx is safe) and dx's 32 columns gathered there and
// stored at the end. A row's M dot products with dy are summed over the lanes by a butterfly
// reduce-scatter (P - 1 + 5 - log2 P shuffles for P = M rounded up to a power of two): after it
// the lanes whose low 5 - log2 P bits are 0 hold row sum b = the lane's high log2 P bits.
#define DENSE_ROWS_WARPS 4

template <int M> struct Pow2 {
    static const int value = M <= 1 ? 1 : M <= 2 ? 2 : M <= 4 ? 4 : M <= 8 ? 8 : 16;
};

// s[0..P) summed over the warp's lanes; returns the sum whose index is `*b` (see above).
template <int P> __device__ __forceinline__ float reduce_scatter(float (&s)[P], int lane, int *b) {
    int idx = 0;
#pragma unroll
    for (int o = 16, cnt = P; o >= 1; o >>= 1) {
        if (cnt > 1) {
            int half = cnt / 2;
            bool upper = (lane & o) != 0;
#pragma unroll
            for (int i = 0; i < half; ++i) {
                float send = upper ? s[i] : s[i + half];
                float keep = upper ? s[i + half] : s[i];
                s[i] = keep + __shfl_xor_sync(FULL_MASK, send, o);
            }
            idx = 2 * idx + (upper ? 1 : 0);
            cnt = half;
        } else {
            s[0] += __shfl_xor_sync(FULL_MASK, s[0], o);
        }
    }
    *b = idx;
    return s[0];
}

// Row `row`'s columns lane + 32 c of w, mu, nu (0 past n).
__device__ __forceinline__ void load_row(const float *w, const float *mu, const float *nu,
                                         size_t row, int lane, int n, float (&wv)[4],
                                         float (&mv)[4], float (&vv)[4]) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        int j = lane + 32 * c;
        bool in = j < n;
        wv[c] = in ? w[row + j] : 0.0f;
        mv[c] = in ? mu[row + j] : 0.0f;
        vv[c] = in ? nu[row + j] : 0.0f;
    }
}

// Asks L2 for row `row` of w, mu, nu (n <= 128 floats: at most 5 lines of 128 bytes each, at
// any alignment): lane 5 a + c takes array a's element min(32 c, n - 1). A hint only: no
// registers held, no bits changed.
__device__ __forceinline__ void prefetch_row(const float *w, const float *mu, const float *nu,
                                             size_t row, int lane, int n) {
    if (lane < 15) {
        const float *a = lane < 5 ? w : lane < 10 ? mu : nu;
        const float *p = a + row + min(32 * (lane % 5), n - 1);
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
    }
}

// How many rows ahead of its loads a warp asks L2 for (prefetch_row): 2 measured 2.857 ms
// against 3.024 without at the seed's batch-10 shape, 4 gave 3.022, 8 3.325 (H200, 2026-12-03).
#define DENSE_ROWS_PREFETCH 2

// Row r of the group at i0: dx's M sums into ds (the old row), then its gradient from xs and
// Adam's step on w, mu, nu (the row's values in wv, mv, vv): adam_one's, or with FAST (under
// TF32) adam_tf32's, inv the bias corrections' reciprocals.
template <int M, bool FAST>
__device__ __forceinline__ void dense_row(const float (&d)[M][4], float (&wv)[4], float (&mv)[4],
                                          float (&vv)[4], const float (*xs)[32],
                                          float (*ds)[33], int r, int lane, int n, float *w,
                                          float *mu, float *nu, size_t row, const AdamHyper &h,
                                          const float (&inv)[2]) {
    const int P = Pow2<M>::value;
    float s[P];
#pragma unroll
    for (int b = 0; b < P; ++b) {
        float acc = 0.0f;
        if (b < M) {
#pragma unroll
            for (int c = 0; c < 4; ++c) acc = fmaf(d[b][c], wv[c], acc);
        }
        s[b] = acc;
    }
    int b;
    float total = reduce_scatter<P>(s, lane, &b);
    if (b < M && (lane & ((32 / P) - 1)) == 0) ds[b][r] = total;
    float g[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int b2 = 0; b2 < M; ++b2) {
        float xb = xs[b2][r];
#pragma unroll
        for (int c = 0; c < 4; ++c) g[c] = fmaf(xb, d[b2][c], g[c]);
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        int j = lane + 32 * c;
        if (j < n) {
            if (FAST)
                adam_tf32(wv[c], g[c], mv[c], vv[c], h, inv[0], inv[1]);
            else
                adam_one(wv[c], g[c], mv[c], vv[c], h);
            w[row + j] = wv[c];
            mu[row + j] = mv[c];
            nu[row + j] = vv[c];
        }
    }
}

template <int M, bool FAST>
__device__ __forceinline__ void dense_adam_rows_t(const float *x, const float *__restrict__ dy,
                                                  float *__restrict__ w, float *__restrict__ mu,
                                                  float *__restrict__ nu, float *dx, AdamHyper h,
                                                  int n, size_t k) {
    __shared__ float xs[DENSE_ROWS_WARPS][M][32];
    // dx's sums, [b][r] 33 apart: both the row-wise writes and the column-wise reads are
    // conflict-free
    __shared__ float ds[DENSE_ROWS_WARPS][M][33];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const float inv[2] = {1.0f / h.bias_correction1, 1.0f / h.bias_correction2};
    float d[M][4];
#pragma unroll
    for (int b = 0; b < M; ++b)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            int j = lane + 32 * c;
            d[b][c] = j < n ? dy[(size_t)b * n + j] : 0.0f;
        }
    size_t groups = (k + 31) / 32;
    WARP_STRIDE(grp, groups) {
        size_t i0 = grp * 32;
        int rows = (int)min((size_t)32, k - i0);
        for (int r = 0; r < DENSE_ROWS_PREFETCH && r < rows; ++r)
            prefetch_row(w, mu, nu, (i0 + r) * (size_t)n, lane, n);
#pragma unroll
        for (int b = 0; b < M; ++b) xs[wid][b][lane] = lane < rows ? x[b * k + i0 + lane] : 0.0f;
        __syncwarp();
        // one row at a time: loading the next rows ahead into registers measured slower (their
        // registers cost occupancy); L2 is asked for them instead
        for (int r = 0; r < rows; ++r) {
            size_t row = (i0 + r) * (size_t)n;
            if (r + DENSE_ROWS_PREFETCH < rows)
                prefetch_row(w, mu, nu, row + DENSE_ROWS_PREFETCH * (size_t)n, lane, n);
            float wv[4], mv[4], vv[4];
            load_row(w, mu, nu, row, lane, n, wv, mv, vv);
            dense_row<M, FAST>(d, wv, mv, vv, xs[wid], ds[wid], r, lane, n, w, mu, nu, row, h,
                               inv);
        }
        __syncwarp();
        if (dx && lane < rows) {
#pragma unroll
            for (int b = 0; b < M; ++b) dx[b * k + i0 + lane] = ds[wid][b][lane];
        }
        __syncwarp();
    }
}

// dense_adam_rows_m<M> (adam_one) and dense_adam_rows_tf32_m<M> (adam_tf32) for M = 1 .. 16:
// blocks of DENSE_ROWS_WARPS warps, any grid; at least 5 blocks a multiprocessor (96 registers
// at M = 10: 3.12 ms against 3.41 with 123 registers and 4 blocks at the seed's batch-10 shape,
// H200, 2026-12-03; 6 and 8 blocks were slower).
#define DENSE_ADAM_ROWS(M)                                                                     \
    extern "C" __global__ void __launch_bounds__(32 * DENSE_ROWS_WARPS, 5)                    \
        dense_adam_rows_m##M(const float *x, const float *dy, float *w, float *mu, float *nu, \
                             float *dx, AdamHyper h, int n, size_t k) {                        \
        dense_adam_rows_t<M, false>(x, dy, w, mu, nu, dx, h, n, k);                            \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(32 * DENSE_ROWS_WARPS, 5)                    \
        dense_adam_rows_tf32_m##M(const float *x, const float *dy, float *w, float *mu,       \
                                  float *nu, float *dx, AdamHyper h, int n, size_t k) {        \
        dense_adam_rows_t<M, true>(x, dy, w, mu, nu, dx, h, n, k);                             \
    }
DENSE_ADAM_ROWS(1)
DENSE_ADAM_ROWS(2)
DENSE_ADAM_ROWS(3)
DENSE_ADAM_ROWS(4)
DENSE_ADAM_ROWS(5)
DENSE_ADAM_ROWS(6)
DENSE_ADAM_ROWS(7)
DENSE_ADAM_ROWS(8)
DENSE_ADAM_ROWS(9)
DENSE_ADAM_ROWS(10)
DENSE_ADAM_ROWS(11)
DENSE_ADAM_ROWS(12)
DENSE_ADAM_ROWS(13)
DENSE_ADAM_ROWS(14)
DENSE_ADAM_ROWS(15)
DENSE_ADAM_ROWS(16)
