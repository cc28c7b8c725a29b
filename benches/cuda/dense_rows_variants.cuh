// Variants of dense_adam_rows_t, from the kernel's own pieces (load_cols, store_cols,
// prefetch_row, adam_cols, sum_parts): lane l holds columns 4 l .. 4 l + 3 (16-byte accesses),
// dy in registers, L2 asked PF rows ahead. AD: 0 adam_tf32, 1 approximate sqrt and reciprocal,
// 2 adam_one. RED: 0 the butterfly reduce-scatter of 916c275 a row, 1 partials through shared
// memory, summed every 32 / M rows (sum_parts). LA: the next row loaded into registers ahead.
// n % 4 == 0, n <= 128, all arrays 16-byte aligned.

__device__ __forceinline__ float sqrt_approx(float x) {
    float r;
    asm("sqrt.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ float rcp_approx(float x) {
    float r;
    asm("rcp.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

// adam_tf32 with sqrt.approx and rcp.approx (each within 1-2 ulp).
__device__ __forceinline__ void adam_approx(float &p, float g, float &m, float &v,
                                            const AdamHyper &h, float inv_bc1, float inv_bc2) {
    g *= h.grad_scale;
    m = (1.0f - h.b1) * g + h.b1 * m;
    v = (1.0f - h.b2) * (g * g) + h.b2 * v;
    const float denom = sqrt_approx(v * inv_bc2 + h.eps_root) + h.eps;
    p -= h.lr * (m * inv_bc1) * rcp_approx(denom);
}

template <int AD>
__device__ __forceinline__ void adam4(float4 &p, const float4 &g, float4 &m, float4 &v,
                                      const AdamHyper &h, const float (&inv)[2]) {
    if (AD == 1) {
        adam_approx(p.x, g.x, m.x, v.x, h, inv[0], inv[1]);
        adam_approx(p.y, g.y, m.y, v.y, h, inv[0], inv[1]);
        adam_approx(p.z, g.z, m.z, v.z, h, inv[0], inv[1]);
        adam_approx(p.w, g.w, m.w, v.w, h, inv[0], inv[1]);
    } else {
        adam_cols<AD == 0>(p, g, m, v, h, inv);
    }
}

__device__ __forceinline__ float dot4(const float4 &a, const float4 &b) {
    return fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, a.x * b.x)));
}

__device__ __forceinline__ void axpy4(float a, const float4 &x, float4 &y) {
    y.x = fmaf(a, x.x, y.x);
    y.y = fmaf(a, x.y, y.y);
    y.z = fmaf(a, x.z, y.z);
    y.w = fmaf(a, x.w, y.w);
}

template <int M, int PF, int WPB, int AD, int RED, bool LA>
__device__ __forceinline__ void variant_t(const float *x, const float *__restrict__ dy,
                                        float *__restrict__ w, float *__restrict__ mu,
                                        float *__restrict__ nu, float *dx, AdamHyper h, int n,
                                        size_t k) {
    constexpr int P = old::Pow2<M>::value, S = DenseRowsSummed<M>::value;
    __shared__ float xs[WPB][M][32];
    __shared__ float ds[WPB][M][33];
    __shared__ __align__(16) float part[RED ? WPB : 1][RED ? S * M : 1][DENSE_ROWS_PART_STRIDE];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const float inv[2] = {1.0f / h.bias_correction1, 1.0f / h.bias_correction2};
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 d[M];
#pragma unroll
    for (int b = 0; b < M; ++b) d[b] = load_cols(dy, (size_t)b * n, lane, n, true);
    size_t groups = (k + 31) / 32;
    WARP_STRIDE(grp, groups) {
        size_t i0 = grp * 32;
        int rows = (int)min((size_t)32, k - i0);
        for (int r = 0; r < PF && r < rows; ++r)
            prefetch_row(w, mu, nu, (i0 + r) * (size_t)n, lane, n);
#pragma unroll
        for (int b = 0; b < M; ++b) xs[wid][b][lane] = lane < rows ? x[b * k + i0 + lane] : 0.0f;
        __syncwarp();
        float4 nw, nm, nv;
        if (LA) {
            const size_t row = i0 * (size_t)n;
            nw = load_cols(w, row, lane, n, true), nm = load_cols(mu, row, lane, n, true),
            nv = load_cols(nu, row, lane, n, true);
        }
        for (int r = 0, slot = 0; r < rows; ++r, slot = slot + 1 == S ? 0 : slot + 1) {
            const size_t row = (i0 + r) * (size_t)n;
            float4 wv, mv, vv;
            if (LA) {
                wv = nw, mv = nm, vv = nv;
                const int more = r + 1 < rows ? n : 0;
                nw = load_cols(w, row + n, lane, more, true);
                nm = load_cols(mu, row + n, lane, more, true);
                nv = load_cols(nu, row + n, lane, more, true);
            } else {
                wv = load_cols(w, row, lane, n, true), mv = load_cols(mu, row, lane, n, true),
                vv = load_cols(nu, row, lane, n, true);
            }
            if (r + PF < rows) prefetch_row(w, mu, nu, row + PF * (size_t)n, lane, n);
            float s[P];
            float4 g = zero;
#pragma unroll
            for (int b = 0; b < M; ++b) {
                s[b] = dot4(d[b], wv);
                axpy4(xs[wid][b][r], d[b], g);
            }
            if (RED == 0) {
#pragma unroll
                for (int b = M; b < P; ++b) s[b] = 0.0f;
                int idx;
                float total = old::reduce_scatter<P>(s, lane, &idx);
                if (idx < M && (lane & ((32 / P) - 1)) == 0) ds[wid][idx][r] = total;
            } else {
#pragma unroll
                for (int b = 0; b < M; ++b) part[RED ? wid : 0][slot * M + b][lane] = s[b];
                if (slot == S - 1 || r == rows - 1)
                    sum_parts<M>(part[RED ? wid : 0], ds[wid], slot, r, lane);
            }
            adam4<AD>(wv, g, mv, vv, h, inv);
            store_cols(w, row, lane, n, true, wv);
            store_cols(mu, row, lane, n, true, mv);
            store_cols(nu, row, lane, n, true, vv);
        }
        __syncwarp();
        if (dx && lane < rows) {
#pragma unroll
            for (int b = 0; b < M; ++b) dx[b * k + i0 + lane] = ds[wid][b][lane];
        }
        __syncwarp();
    }
}
