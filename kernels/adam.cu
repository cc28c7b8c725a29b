// adam.cu: one fused, in-place Adam step (optax.adam: scale_by_adam then
// scale_by_learning_rate; Kingma & Ba 2014, Algorithm 1, eps outside the square root).

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
// step in the compute dtype T (bf16 or f16; ops::dense_adam): as adam_f32 on f32
// p, g, m, v, and besides old[i] = p[i] before the step, rounded to T (from_f32: the cast's
// rounding), so the input gradient's GEMM reads what the unfused layer's cast of the weight holds.
// The step itself is adam_one's, so p, m and v are those bits of adam_f32.

// Four values rounded to T, packed little-endian into 8 bytes (elements 4i .. 4i + 3).
template <typename T> __device__ __forceinline__ uint2 pack4(float4 f) {
    uint2 r;
    r.x = (u32)from_f32<T>(f.x).bits | ((u32)from_f32<T>(f.y).bits << 16);
    r.y = (u32)from_f32<T>(f.z).bits | ((u32)from_f32<T>(f.w).bits << 16);
    return r;
}

// One element per thread and iteration (any alignment).
template <typename T>
__device__ __forceinline__ void adam_old_t(float *p, const float *g, float *m, float *v, T *old,
                                           AdamHyper h, size_t n) {
    GRID_STRIDE(i, n) {
        float pi = p[i], mi = m[i], vi = v[i];
        old[i] = from_f32<T>(pi);
        adam_one(pi, g[i], mi, vi, h);
        m[i] = mi;
        v[i] = vi;
        p[i] = pi;
    }
}

// 16 bytes per f32 array and thread (8 of old): n / 4 float4s, then the last n % 4 elements by
// the first threads of block 0. p, g, m, v 16-byte aligned, old 8-byte aligned or null (then
// nothing but the step: adam_vec_f32).
template <typename T>
__device__ __forceinline__ void adam_old_vec_t(float *__restrict__ p, const float *__restrict__ g,
                                               float *__restrict__ m, float *__restrict__ v,
                                               T *__restrict__ old, AdamHyper h, size_t n) {
    size_t n4 = n / 4;
    float4 *p4 = (float4 *)p, *m4 = (float4 *)m, *v4 = (float4 *)v;
    const float4 *g4 = (const float4 *)g;
    uint2 *old4 = (uint2 *)old;
    GRID_STRIDE(i, n4) {
        float4 gi = g4[i], mi = m4[i], vi = v4[i], pi = p4[i];
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
        adam_one(pj, g[j], mj, vj, h);
        m[j] = mj;
        v[j] = vj;
        p[j] = pj;
    }
}

// adam_old_<T>, adam_old_vec_<T> for the two 16-bit dtypes.
#define ADAM_OLD(T, s)                                                                         \
    extern "C" __global__ void adam_old_##s(float *p, const float *g, float *m, float *v,      \
                                            T *old, AdamHyper h, size_t n) {                   \
        adam_old_t<T>(p, g, m, v, old, h, n);                                                  \
    }                                                                                          \
    extern "C" __global__ void adam_old_vec_##s(float *p, const float *g, float *m, float *v,  \
                                                T *old, AdamHyper h, size_t n) {               \
        adam_old_vec_t<T>(p, g, m, v, old, h, n);                                              \
    }
ADAM_OLD(bf16_t, bf16)
ADAM_OLD(f16_t, f16)

// adam_f32's step on n floats, 16 bytes per array and thread: n / 4 float4s, then the last n % 4
// elements by the first threads of block 0. All four arrays 16-byte aligned.
extern "C" __global__ void adam_vec_f32(float *__restrict__ p, const float *__restrict__ g,
                                        float *__restrict__ m, float *__restrict__ v,
                                        AdamHyper h, size_t n) {
    adam_old_vec_t<bf16_t>(p, g, m, v, (bf16_t *)0, h, n);
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
// adam_one on w, mu, nu (the row's values in wv, mv, vv).
template <int M>
__device__ __forceinline__ void dense_row(const float (&d)[M][4], float (&wv)[4], float (&mv)[4],
                                          float (&vv)[4], const float (*xs)[32],
                                          float (*ds)[33], int r, int lane, int n, float *w,
                                          float *mu, float *nu, size_t row, const AdamHyper &h) {
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
            adam_one(wv[c], g[c], mv[c], vv[c], h);
            w[row + j] = wv[c];
            mu[row + j] = mv[c];
            nu[row + j] = vv[c];
        }
    }
}

template <int M>
__device__ __forceinline__ void dense_adam_rows_t(const float *x, const float *__restrict__ dy,
                                                  float *__restrict__ w, float *__restrict__ mu,
                                                  float *__restrict__ nu, float *dx, AdamHyper h,
                                                  int n, size_t k) {
    __shared__ float xs[DENSE_ROWS_WARPS][M][32];
    // dx's sums, [b][r] 33 apart: both the row-wise writes and the column-wise reads are
    // conflict-free
    __shared__ float ds[DENSE_ROWS_WARPS][M][33];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
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
            dense_row<M>(d, wv, mv, vv, xs[wid], ds[wid], r, lane, n, w, mu, nu, row, h);
        }
        __syncwarp();
        if (dx && lane < rows) {
#pragma unroll
            for (int b = 0; b < M; ++b) dx[b * k + i0 + lane] = ds[wid][b][lane];
        }
        __syncwarp();
    }
}

// dense_adam_rows_m<M> for M = 1 .. 16: blocks of DENSE_ROWS_WARPS warps, any grid; at least 5
// blocks a multiprocessor (96 registers at M = 10: 3.12 ms against 3.41 with 123 registers and
// 4 blocks at the seed's batch-10 shape, H200, 2026-12-03; 6 and 8 blocks were slower).
#define DENSE_ADAM_ROWS(M)                                                                     \
    extern "C" __global__ void __launch_bounds__(32 * DENSE_ROWS_WARPS, 5)                    \
        dense_adam_rows_m##M(const float *x, const float *dy, float *w, float *mu, float *nu, \
                             float *dx, AdamHyper h, int n, size_t k) {                        \
        dense_adam_rows_t<M>(x, dy, w, mu, nu, dx, h, n, k);                                   \
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

// A dense layer's backward pass with Adam on its f32 weight in one pass over the weight on the
// tensor cores, for a batch of 17 to 128 rows and n <= 128 outputs, n % 8 == 0 (ops::dense_adam
// under Precision::Tf32: the seed's Dense(128) at batch 100). The contract of dense_adam_rows:
// x [m, k], dy [m, n], w, mu, nu [k, n] f32, dx [m, k] (null: not computed; may be x itself).
//
// A warp takes 16 weight rows (a strip) at a time, with all n columns:
//   dw[16, n]   = x[:, strip]^T · dy   (mma m16n8k8, A = x^T, K = the batch, 8 rows a step);
//   dx^T[16, m] = w_old[strip] · dy^T  (A = the strip's old weight, K = n, 8 columns a step);
// then Adam (adam_tf32) on w, mu, nu in the accumulators' layout: lane 4g + t holds rows g and g + 8 of
// columns 8c + 2t and 8c + 2t + 1 of each 8-column slice c, of dw's accumulators and of the
// weight and moments it reads. That layout is the second product's A operand too: an mma's K
// may be permuted as long as A and B agree, and slots t, t + 4 of lane (g, t) are taken as
// columns 8c + 2t, 8c + 2t + 1, where B (dy, staged once in shared memory) is read. Operands
// are rounded to TF32 (cvt.rna) and summed in f32: the precision of the TF32 GEMMs the chunked
// path runs. dw never leaves registers.
//
// Memory: the strip's w, mu, nu stream through two warp-private shared-memory stages of 32
// columns (cp.async, 16-byte copies), the next quarter in flight while this one is used; x's
// columns of the next strip are asked of L2 a strip ahead. The strip's x is loaded before its
// dx is stored (the mmas between need every lane's loads), so an in-place dx is safe.
#define DM_WARPS 8
#define DM_SLICES 16           // 8-column slices: n <= 128
#define DM_PITCH 40            // words a staged row: 32 columns + 8 (conflict-free float2 reads)
#define DM_STAGE (3 * 16 * DM_PITCH) // words of a stage: w, mu, nu's 16 rows of 32 columns

__device__ __forceinline__ u32 to_tf32(float f) {
    u32 r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(f));
    return r;
}

__device__ __forceinline__ void mma1688(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                        u32 b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// adam_one's step with the bias corrections' reciprocals (inv_bc1, inv_bc2) as factors, f32
// contractions allowed and a fast division (__fdividef, 2 ulp): within a few ulp of adam_one's
// IEEE-rounded step, at a fifth of its instructions. For the TF32 pass only, whose gradient is
// itself a TF32 product; the exact divisions there made the pass 1.4x slower (5.15 ms against
// 3.78 at the seed's batch 100, H200, 2026-12-03).
__device__ __forceinline__ void adam_tf32(float &p, float g, float &m, float &v,
                                          const AdamHyper &h, float inv_bc1, float inv_bc2) {
    g *= h.grad_scale;
    m = (1.0f - h.b1) * g + h.b1 * m;
    v = (1.0f - h.b2) * (g * g) + h.b2 * v;
    const float denom = sqrtf(v * inv_bc2 + h.eps_root) + h.eps;
    p -= h.lr * __fdividef(m * inv_bc1, denom);
}

// Copies quarter q (columns 32 q .. 32 q + 31) of strip s's rows of w, mu, nu into the stage at
// shared address `dst` (384 chunks of 16 bytes, 12 a lane; zeros past k and n) as one group.
__device__ __forceinline__ void stage_quarter(const float *w, const float *mu, const float *nu,
                                              u32 dst, size_t s, int q, size_t k, int n,
                                              int lane) {
#pragma unroll
    for (int i = 0; i < 12; ++i) {
        const int c = lane + 32 * i, a = c / 128, r = (c / 8) % 16, j = c % 8;
        const size_t row = 16 * s + r;
        const int col = 32 * q + 4 * j;
        const bool ok = row < k && col < n;
        const float *base = a == 0 ? w : a == 1 ? mu : nu;
        cp_async16(dst + 4 * ((a * 16 + r) * DM_PITCH + 4 * j), ok ? base + row * n + col : base,
                   ok);
    }
    asm volatile("cp.async.commit_group;");
}

// The strip's weight gradient: acc[c] = x[:, rows]^T · dy[:, slice c], in the layout above.
template <int MB>
__device__ __forceinline__ void strip_dw(const float *x, const u32 *dys, int pitch, int m,
                                         int ns, size_t k, size_t r_lo, int g, int t,
                                         float (&acc)[DM_SLICES][4]) {
    const bool lo = r_lo < k, hi = r_lo + 8 < k;
#pragma unroll
    for (int c = 0; c < DM_SLICES; ++c) acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.0f;
#pragma unroll
    for (int kb = 0; kb < MB; ++kb) {
        const int b0 = 8 * kb + t, b1 = b0 + 4;
        const float *x0 = x + (size_t)b0 * k + r_lo, *x1 = x + (size_t)b1 * k + r_lo;
        const u32 a0 = to_tf32(b0 < m && lo ? x0[0] : 0.0f);
        const u32 a1 = to_tf32(b0 < m && hi ? x0[8] : 0.0f);
        const u32 a2 = to_tf32(b1 < m && lo ? x1[0] : 0.0f);
        const u32 a3 = to_tf32(b1 < m && hi ? x1[8] : 0.0f);
        const u32 *d0 = dys + b0 * pitch + g, *d1 = dys + b1 * pitch + g;
#pragma unroll
        for (int c = 0; c < DM_SLICES; ++c) {
            if (c < ns) mma1688(acc[c], a0, a1, a2, a3, d0[8 * c], d1[8 * c]);
        }
    }
}

// Slice c of the strip from its staged quarter (`st`, the slice's columns at word 8 (c % 4)):
// dx^T's sums from the old weight into dxa, then Adam (adam_tf32) on the slice's w, mu, nu,
// stored at rows r_lo, r_lo + 8 (those below k).
template <int MB>
__device__ __forceinline__ void strip_slice(float *w, float *mu, float *nu, const float *st,
                                            const u32 *dys, int pitch, int n, int c, size_t k,
                                            size_t r_lo, int lane, const float (&dw)[4],
                                            float (&dxa)[MB][4], const AdamHyper &h,
                                            float inv_bc1, float inv_bc2) {
    const int g = lane >> 2, t = lane & 3, col = 8 * (c % 4) + 2 * t;
    const float2 *lo_row = (const float2 *)(st + g * DM_PITCH + col);
    const float2 *hi_row = (const float2 *)(st + (g + 8) * DM_PITCH + col);
    const int array = 16 * DM_PITCH / 2; // float2s between w's, mu's and nu's rows
    float2 wl = lo_row[0], ml = lo_row[array], vl = lo_row[2 * array];
    float2 wh = hi_row[0], mh = hi_row[array], vh = hi_row[2 * array];
    const u32 a0 = to_tf32(wl.x), a1 = to_tf32(wh.x), a2 = to_tf32(wl.y), a3 = to_tf32(wh.y);
    const u32 *d = dys + g * pitch + 8 * c + 2 * t;
#pragma unroll
    for (int b = 0; b < MB; ++b) {
        const uint2 bb = *(const uint2 *)(d + 8 * b * pitch);
        mma1688(dxa[b], a0, a1, a2, a3, bb.x, bb.y);
    }
    adam_tf32(wl.x, dw[0], ml.x, vl.x, h, inv_bc1, inv_bc2);
    adam_tf32(wl.y, dw[1], ml.y, vl.y, h, inv_bc1, inv_bc2);
    adam_tf32(wh.x, dw[2], mh.x, vh.x, h, inv_bc1, inv_bc2);
    adam_tf32(wh.y, dw[3], mh.y, vh.y, h, inv_bc1, inv_bc2);
    const size_t p = r_lo * n + 8 * c + 2 * t, p8 = p + 8 * (size_t)n;
    if (r_lo < k) {
        *(float2 *)(w + p) = wl;
        *(float2 *)(mu + p) = ml;
        *(float2 *)(nu + p) = vl;
    }
    if (r_lo + 8 < k) {
        *(float2 *)(w + p8) = wh;
        *(float2 *)(mu + p8) = mh;
        *(float2 *)(nu + p8) = vh;
    }
}

// Asks L2 for strip s's columns of x (16 floats of each of the m rows: the first and the last).
__device__ __forceinline__ void prefetch_x(const float *x, size_t s, int m, size_t k, int lane) {
    if (16 * s >= k) return;
    const size_t last = min(k, 16 * s + 16) - 1;
    for (int i = lane; i < 2 * m; i += 32) {
        const float *p = x + (size_t)(i / 2) * k + ((i & 1) ? last : 16 * s);
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
    }
}

template <int MB>
__device__ __forceinline__ void dense_adam_mma_t(const float *x, const float *__restrict__ dy,
                                                 float *__restrict__ w, float *__restrict__ mu,
                                                 float *__restrict__ nu, float *dx, AdamHyper h,
                                                 int m, int n, size_t k) {
    // [DM_WARPS][2] stages, then dy rounded to TF32, [MB * 8][pitch], zero past m and n; pitch
    // = 8 mod 32 puts both products' B reads on distinct banks
    extern __shared__ __align__(16) float dm_smem[];
    u32 *dys = (u32 *)(dm_smem + DM_WARPS * 2 * DM_STAGE);
    const int pitch = ((n + 31) & ~31) + 8, ns = n / 8, quarters = (n + 31) / 32;
    for (int i = threadIdx.x; i < MB * 8 * pitch; i += blockDim.x) {
        const int b = i / pitch, j = i % pitch;
        dys[i] = b < m && j < n ? to_tf32(dy[(size_t)b * n + j]) : 0u;
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const float *stages = dm_smem + (threadIdx.x >> 5) * 2 * DM_STAGE;
    const u32 stage0 = (u32)__cvta_generic_to_shared(stages);
    const size_t strips = (k + 15) / 16, warps = ((size_t)gridDim.x * blockDim.x) >> 5;
    const size_t first = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (first < strips) stage_quarter(w, mu, nu, stage0, first, 0, k, n, lane);
    const float inv_bc1 = 1.0f / h.bias_correction1, inv_bc2 = 1.0f / h.bias_correction2;
    int cur = 0;
    WARP_STRIDE(s, strips) {
        prefetch_x(x, s + warps, m, k, lane);
        const size_t r_lo = 16 * s + g;
        float dxa[MB][4];
#pragma unroll
        for (int b = 0; b < MB; ++b) dxa[b][0] = dxa[b][1] = dxa[b][2] = dxa[b][3] = 0.0f;
        float acc[DM_SLICES][4];
        strip_dw<MB>(x, dys, pitch, m, ns, k, r_lo, g, t, acc);
#pragma unroll
        for (int q = 0; q < DM_SLICES / 4; ++q) {
            if (q >= quarters) break;
            // the next quarter, or the next strip's first, into the other stage
            const bool last = q + 1 == quarters;
            const size_t next = last ? s + warps : s;
            const u32 other = stage0 + 4 * (cur ^ 1) * DM_STAGE;
            if (next < strips) {
                stage_quarter(w, mu, nu, other, next, last ? 0 : q + 1, k, n, lane);
            } else {
                asm volatile("cp.async.commit_group;");
            }
            asm volatile("cp.async.wait_group 1;");
            __syncwarp();
#pragma unroll
            for (int c4 = 0; c4 < 4; ++c4) {
                const int c = 4 * q + c4;
                if (c < ns)
                    strip_slice<MB>(w, mu, nu, stages + cur * DM_STAGE, dys, pitch, n, c, k, r_lo,
                                    lane, acc[c], dxa, h, inv_bc1, inv_bc2);
            }
            __syncwarp();
            cur ^= 1;
        }
        if (dx) {
            // dxa[b]: rows g, g + 8 of the strip for batch rows 8b + 2t, 8b + 2t + 1
            const size_t r_hi = r_lo + 8;
#pragma unroll
            for (int b = 0; b < MB; ++b) {
                const int b0 = 8 * b + 2 * t, b1 = b0 + 1;
                if (b0 < m && r_lo < k) dx[(size_t)b0 * k + r_lo] = dxa[b][0];
                if (b1 < m && r_lo < k) dx[(size_t)b1 * k + r_lo] = dxa[b][1];
                if (b0 < m && r_hi < k) dx[(size_t)b0 * k + r_hi] = dxa[b][2];
                if (b1 < m && r_hi < k) dx[(size_t)b1 * k + r_hi] = dxa[b][3];
            }
        }
    }
    asm volatile("cp.async.wait_all;");
}

// dense_adam_mma_mb<MB> for MB = 3 .. 16 (a batch of 8 MB - 7 to 8 MB rows): blocks of
// DM_WARPS warps, any grid; dynamic shared memory 4 (DM_WARPS 2 DM_STAGE + 8 MB (roundup(n, 32)
// + 8)) bytes.
#define DENSE_ADAM_MMA(MB)                                                                     \
    extern "C" __global__ void __launch_bounds__(32 * DM_WARPS, 1)                            \
        dense_adam_mma_mb##MB(const float *x, const float *dy, float *w, float *mu, float *nu, \
                              float *dx, AdamHyper h, int m, int n, size_t k) {                \
        dense_adam_mma_t<MB>(x, dy, w, mu, nu, dx, h, m, n, k);                                \
    }
DENSE_ADAM_MMA(3)
DENSE_ADAM_MMA(4)
DENSE_ADAM_MMA(5)
DENSE_ADAM_MMA(6)
DENSE_ADAM_MMA(7)
DENSE_ADAM_MMA(8)
DENSE_ADAM_MMA(9)
DENSE_ADAM_MMA(10)
DENSE_ADAM_MMA(11)
DENSE_ADAM_MMA(12)
DENSE_ADAM_MMA(13)
DENSE_ADAM_MMA(14)
DENSE_ADAM_MMA(15)
DENSE_ADAM_MMA(16)
