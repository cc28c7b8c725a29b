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
// A warp takes 32 weight rows at a time: lane l holds columns 4 l .. 4 l + 3 of dy for every b
// in registers (loaded once) and of each row of w, mu, nu (one 16-byte access an array where n %
// 4 == 0 and w, mu, nu, dy are 16-byte aligned, else four 4-byte ones); x's 32 columns are
// staged in shared memory (read before dx is written, by the same lane, so an in-place dx is
// safe) and dx's 32 columns gathered there and stored at the end. A row's M dot products with
// dy are summed over the lanes through shared memory: each lane writes its M partial sums, and
// after every S = 32 / M rows lane q M + b adds up the 32 partials of sum b of the S rows' q-th
// (with a butterfly of shuffles a row instead, the kernel issued 1.72 G instructions at the
// seed's batch-10 shape, this way 0.75 G; the kernel before, lane-strided columns, 2.37 G: ncu,
// H100, 2026-12-07).
#define DENSE_ROWS_WARPS 4

// Rows whose partial sums a warp holds at once (S above), and the stride of one sum's 32
// partials: 36 words keep the 16-byte reads of a quarter-warp on distinct banks.
template <int M> struct DenseRowsSummed {
    static constexpr int value = 32 / M;
};
#define DENSE_ROWS_PART_STRIDE 36

// Columns 4 lane .. 4 lane + 3 of the row at offset `row` (in floats) of a, 0 past n: one
// 16-byte load where vec, else four.
__device__ __forceinline__ float4 load_cols(const float *a, size_t row, int lane, int n,
                                            bool vec) {
    const int j = 4 * lane;
    if (vec) return j < n ? *(const float4 *)(a + row + j) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    return make_float4(j < n ? a[row + j] : 0.0f, j + 1 < n ? a[row + j + 1] : 0.0f,
                       j + 2 < n ? a[row + j + 2] : 0.0f, j + 3 < n ? a[row + j + 3] : 0.0f);
}

// load_cols' inverse: the columns below n stored.
__device__ __forceinline__ void store_cols(float *a, size_t row, int lane, int n, bool vec,
                                           const float4 &v) {
    const int j = 4 * lane;
    if (vec) {
        if (j < n) *(float4 *)(a + row + j) = v;
        return;
    }
    if (j < n) a[row + j] = v.x;
    if (j + 1 < n) a[row + j + 1] = v.y;
    if (j + 2 < n) a[row + j + 2] = v.z;
    if (j + 3 < n) a[row + j + 3] = v.w;
}

// Asks L2 for row `row` of w, mu, nu (n <= 128 floats: at most 5 lines of 128 bytes each, at
// any alignment; nothing for n = 0): lane 5 a + c takes array a's element min(32 c, n - 1). A
// hint only: no registers held, no bits changed.
__device__ __forceinline__ void prefetch_row(const float *w, const float *mu, const float *nu,
                                             size_t row, int lane, int n) {
    if (lane < 15 && n > 0) {
        const float *a = lane < 5 ? w : lane < 10 ? mu : nu;
        const float *p = a + row + min(32 * (lane % 5), n - 1);
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
    }
}

// How many rows ahead of its loads a warp asks L2 for (prefetch_row), at the seed's batch-10
// shape: for the variant hft, 1 measured 2.862 ms against 2.957 at 2 and 3.204 at 3 (H100,
// 2026-12-07); for the kernel before (a butterfly a row), 2 rows 2.857 against 3.024 without
// (H200, 2026-12-03).
#define DENSE_ROWS_PREFETCH 1

// adam_one's step, or with FAST (under TF32) adam_tf32's (inv: the bias corrections'
// reciprocals), on four elements.
template <bool FAST>
__device__ __forceinline__ void adam_cols(float4 &p, const float4 &g, float4 &m, float4 &v,
                                          const AdamHyper &h, const float (&inv)[2]) {
    if (FAST) {
        adam_tf32(p.x, g.x, m.x, v.x, h, inv[0], inv[1]);
        adam_tf32(p.y, g.y, m.y, v.y, h, inv[0], inv[1]);
        adam_tf32(p.z, g.z, m.z, v.z, h, inv[0], inv[1]);
        adam_tf32(p.w, g.w, m.w, v.w, h, inv[0], inv[1]);
    } else {
        adam_one(p.x, g.x, m.x, v.x, h);
        adam_one(p.y, g.y, m.y, v.y, h);
        adam_one(p.z, g.z, m.z, v.z, h);
        adam_one(p.w, g.w, m.w, v.w, h);
    }
}

// Row r of the group: its M dot products' partial sums into part (rows of its slot), then its
// gradient from xs (each column's sum over b in order, one fmaf a term) and Adam's step on the
// row's values wv, mv, vv.
template <int M, bool FAST>
__device__ __forceinline__ void dense_row(const float4 (&d)[M], float4 &wv, float4 &mv,
                                          float4 &vv, const float (*xs)[32],
                                          float (*part)[DENSE_ROWS_PART_STRIDE], int slot, int r,
                                          int lane, const AdamHyper &h, const float (&inv)[2]) {
    float4 g = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int b = 0; b < M; ++b) {
        part[slot * M + b][lane] =
            fmaf(d[b].w, wv.w, fmaf(d[b].z, wv.z, fmaf(d[b].y, wv.y, d[b].x * wv.x)));
        const float xb = xs[b][r];
        g.x = fmaf(xb, d[b].x, g.x);
        g.y = fmaf(xb, d[b].y, g.y);
        g.z = fmaf(xb, d[b].z, g.z);
        g.w = fmaf(xb, d[b].w, g.w);
    }
    adam_cols<FAST>(wv, g, mv, vv, h, inv);
}

// dx's sums of rows r - slot .. r from their partials: lane q M + b (q <= slot) adds up sum b of
// row r - slot + q into ds.
template <int M>
__device__ __forceinline__ void sum_parts(const float (*part)[DENSE_ROWS_PART_STRIDE],
                                          float (*ds)[33], int slot, int r, int lane) {
    __syncwarp();
    if (lane < (slot + 1) * M) {
        const float4 *p = (const float4 *)part[lane];
        float4 a = p[0];
#pragma unroll
        for (int j = 1; j < 8; ++j) {
            const float4 t = p[j];
            a.x += t.x, a.y += t.y, a.z += t.z, a.w += t.w;
        }
        ds[lane % M][r - slot + lane / M] = (a.x + a.y) + (a.z + a.w);
    }
    __syncwarp();
}

template <int M, bool FAST>
__device__ __forceinline__ void dense_adam_rows_t(const float *x, const float *__restrict__ dy,
                                                  float *__restrict__ w, float *__restrict__ mu,
                                                  float *__restrict__ nu, float *dx, AdamHyper h,
                                                  int n, size_t k) {
    __shared__ float xs[DENSE_ROWS_WARPS][M][32];
    // dx's sums, [b][r] 33 apart: the column-wise reads at the group's end are conflict-free
    // (sum_parts' writes, once every S rows, meet on a bank at most min(M, S) ways)
    __shared__ float ds[DENSE_ROWS_WARPS][M][33];
    constexpr int S = DenseRowsSummed<M>::value;
    __shared__ __align__(16) float part[DENSE_ROWS_WARPS][S * M][DENSE_ROWS_PART_STRIDE];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const float inv[2] = {1.0f / h.bias_correction1, 1.0f / h.bias_correction2};
    const bool vec = n % 4 == 0 && (((size_t)w | (size_t)mu | (size_t)nu | (size_t)dy) & 15) == 0;
    float4 d[M];
#pragma unroll
    for (int b = 0; b < M; ++b) d[b] = load_cols(dy, (size_t)b * n, lane, n, vec);
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
        for (int r = 0, slot = 0; r < rows; ++r, slot = slot + 1 == S ? 0 : slot + 1) {
            size_t row = (i0 + r) * (size_t)n;
            if (r + DENSE_ROWS_PREFETCH < rows)
                prefetch_row(w, mu, nu, row + DENSE_ROWS_PREFETCH * (size_t)n, lane, n);
            float4 wv = load_cols(w, row, lane, n, vec), mv = load_cols(mu, row, lane, n, vec),
                   vv = load_cols(nu, row, lane, n, vec);
            dense_row<M, FAST>(d, wv, mv, vv, xs[wid], part[wid], slot, r, lane, h, inv);
            if (slot == S - 1 || r == rows - 1) sum_parts<M>(part[wid], ds[wid], slot, r, lane);
            store_cols(w, row, lane, n, vec, wv);
            store_cols(mu, row, lane, n, vec, mv);
            store_cols(nu, row, lane, n, vec, vv);
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
// blocks of DENSE_ROWS_WARPS warps, any grid; at least DENSE_ROWS_MIN_BLOCKS blocks a
// multiprocessor: 128 registers at M = 10 under TF32 (NVRTC 12.9, sm_90), no spills below M = 15.
// At the seed's batch-10 shape (H100, 2026-12-07, benches/cuda/dense_rows_variants.sh as run
// then, BENCHMARKS.md): the variant hft (this kernel with an approximate Adam step) 2.957 ms with
// at least 4 blocks, 3.118-3.122 with 5; the kernel before (lane-strided columns) 3.113.
#define DENSE_ROWS_MIN_BLOCKS 4
#define DENSE_ROWS_BOUNDS __launch_bounds__(32 * DENSE_ROWS_WARPS, DENSE_ROWS_MIN_BLOCKS)
#define DENSE_ADAM_ROWS(M)                                                                     \
    extern "C" __global__ void DENSE_ROWS_BOUNDS dense_adam_rows_m##M(                        \
        const float *x, const float *dy, float *w, float *mu, float *nu, float *dx,           \
        AdamHyper h, int n, size_t k) {                                                        \
        dense_adam_rows_t<M, false>(x, dy, w, mu, nu, dx, h, n, k);                            \
    }                                                                                          \
    extern "C" __global__ void DENSE_ROWS_BOUNDS dense_adam_rows_tf32_m##M(                   \
        const float *x, const float *dy, float *w, float *mu, float *nu, float *dx,           \
        AdamHyper h, int n, size_t k) {                                                        \
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
