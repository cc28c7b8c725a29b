// adam.cu: one fused, in-place Adam step (optax.adam: scale_by_adam then
// scale_by_learning_rate; Kingma & Ba 2014, Algorithm 1, eps outside the square root).

// Must match `AdamHyper` in crates/stax-tensor/src/backend.rs (#[repr(C)], seven f32).
struct AdamHyper {
    float lr;
    float b1;
    float b2;
    float eps;
    float eps_root;
    float bias_correction1;
    float bias_correction2;
};

// m = (1 - b1) g + b1 m; v = (1 - b2) g^2 + b2 v;
// p += (-lr) * (m / bc1) / (sqrt(v / bc2 + eps_root) + eps).
// Explicitly rounded operations (no FMA contraction), in the CPU backend's order, so both
// backends give the same bits.
__device__ __forceinline__ void adam_one(float &p, float g, float &m, float &v,
                                         const AdamHyper &h) {
    float mi = __fadd_rn(__fmul_rn(1.0f - h.b1, g), __fmul_rn(h.b1, m));
    float vi = __fadd_rn(__fmul_rn(1.0f - h.b2, __fmul_rn(g, g)), __fmul_rn(h.b2, v));
    m = mi;
    v = vi;
    float mhat = __fdiv_rn(mi, h.bias_correction1);
    float vhat = __fdiv_rn(vi, h.bias_correction2);
    float denom = __fadd_rn(__fsqrt_rn(__fadd_rn(vhat, h.eps_root)), h.eps);
    p = __fadd_rn(p, __fmul_rn(-h.lr, __fdiv_rn(mhat, denom)));
}

// One element per thread and iteration (any alignment).
extern "C" __global__ void adam_f32(float *p, const float *g, float *m, float *v, AdamHyper h,
                                    size_t n) {
    GRID_STRIDE(i, n) {
        float pi = p[i], mi = m[i], vi = v[i];
        adam_one(pi, g[i], mi, vi, h);
        m[i] = mi;
        v[i] = vi;
        p[i] = pi;
    }
}

// The same on n floats, 16 bytes per array and thread: n / 4 float4s, then the last n % 4
// elements by the first threads of block 0. All four arrays 16-byte aligned.
extern "C" __global__ void adam_vec_f32(float *__restrict__ p, const float *__restrict__ g,
                                        float *__restrict__ m, float *__restrict__ v,
                                        AdamHyper h, size_t n) {
    size_t n4 = n / 4;
    float4 *p4 = (float4 *)p, *m4 = (float4 *)m, *v4 = (float4 *)v;
    const float4 *g4 = (const float4 *)g;
    GRID_STRIDE(i, n4) {
        float4 gi = g4[i], mi = m4[i], vi = v4[i], pi = p4[i];
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
        adam_one(pj, g[j], mj, vj, h);
        m[j] = mj;
        v[j] = vj;
        p[j] = pj;
    }
}

// A dense layer's backward pass with Adam on its weight, for small batches (ops::dense_adam
// when mb * n <= DENSE_DY_MAX, mb <= DENSE_M_MAX and n <= 128): dw never leaves registers.
// x [mb, k], dy [mb, n], w, m, v [k, n], dx [mb, k] (may be x itself, or null to skip), f32.
// A block stages dy in shared memory once and walks groups of DENSE_ROWS weight rows, one row
// per warp, each lane owning columns lane + 32 t (t < 4): dw[row, j] = sum_b x[b, row] dy[b, j]
// and dx[b, row] = sum_j dy[b, j] w[row, j] (a warp sum, from the old weight), then Adam on
// the row. The group's x values are staged in shared memory before any dx of the group is
// written, and no other block reads those columns of x, so dx may overwrite x.
#define DENSE_ROWS 8
#define DENSE_DY_MAX 8192
#define DENSE_M_MAX 256

__device__ __forceinline__ float warp_allsum_f32(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(FULL_MASK, v, offset);
    }
    return v;
}

extern "C" __global__ void __launch_bounds__(256)
    dense_adam_rows_f32(const float *x, const float *__restrict__ dy, float *__restrict__ w,
                        float *__restrict__ m, float *__restrict__ v, float *dx, AdamHyper h,
                        size_t mb, size_t n, size_t k) {
    __shared__ float dys[DENSE_DY_MAX];
    __shared__ float xs[DENSE_ROWS * DENSE_M_MAX];
    for (size_t i = threadIdx.x; i < mb * n; i += blockDim.x) dys[i] = dy[i];
    const size_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t step = (size_t)gridDim.x * DENSE_ROWS;
    for (size_t k0 = (size_t)blockIdx.x * DENSE_ROWS; k0 < k; k0 += step) {
        __syncthreads(); // dy staged; the previous group's xs no longer read
        for (size_t i = threadIdx.x; i < mb * DENSE_ROWS; i += blockDim.x) {
            size_t b = i / DENSE_ROWS, r = i % DENSE_ROWS;
            xs[r * DENSE_M_MAX + b] = k0 + r < k ? x[b * k + k0 + r] : 0.0f;
        }
        __syncthreads();
        const size_t row = k0 + warp;
        if (row >= k) continue; // warp-uniform
        float wr[4], g[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            size_t j = lane + 32 * t;
            wr[t] = j < n ? w[row * n + j] : 0.0f;
        }
        for (size_t b = 0; b < mb; ++b) {
            float xb = xs[warp * DENSE_M_MAX + b], acc = 0.0f;
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                size_t j = lane + 32 * t;
                float d = j < n ? dys[b * n + j] : 0.0f;
                g[t] = fmaf(xb, d, g[t]);
                acc = fmaf(d, wr[t], acc);
            }
            if (dx != 0) {
                acc = warp_allsum_f32(acc);
                if (lane == 0) dx[b * k + row] = acc;
            }
        }
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            size_t j = lane + 32 * t;
            if (j < n) {
                size_t e = row * n + j;
                float pe = wr[t], me = m[e], ve = v[e];
                adam_one(pe, g[t], me, ve, h);
                m[e] = me;
                v[e] = ve;
                w[e] = pe;
            }
        }
    }
}
