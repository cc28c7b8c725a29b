// direct_conv.cu: the forward pass and the filter gradient of a convolution with few taps
// (K = kh * kw * c_in <= 32: a network's first layer on RGB images), computed directly in f32
// FMAs (no tensor cores, no im2col matrix): NHWC input, HWIO kernel, c_out a power of two from
// 32 to 512 (G = c_out / 2 divides the block). Exact fp32 products in every precision; on the
// H200 the seed's conv1 forward (bias, ReLU and mask fused) runs at about 1 TB/s (1.09 ms at
// batch 100), 4x the floor of the 1.1 GB it moves. kernels/direct_common.cuh (prepended)
// stages the patches; direct_mma.cu runs the same passes on the tensor cores.
//
// Thread t takes the output channels co = 2 (t % G), +1 (G = c_out / 2 threads a position) of
// positions t / G, + 256 / G, ... of the tile. Each template is instantiated for KP = 4, 8,
// ..., 32 (K rounded up to a multiple of 4) in every float dtype: direct_conv_fwd_k<KP>_<dtype>,
// direct_conv_wgrad_k<KP>_<dtype>; the launchers are in
// crates/stax-tensor/src/cuda/kernels/direct.rs.

// Positions whose output gradient a filter-gradient thread loads at once.
#define DC_BATCH 8

// y = conv(x, w) (+ b when not null), then with relu != 0 the ReLU of y rounded to T (NaN
// propagates, as relu_vec), its mask bit (y > 0) of element i to bit i % 32 of mask[i / 32]
// when mask is not null. The 16 threads of a mask word OR their bits with shuffles: every lane
// takes the same trips of the position loop (DC_PIXELS is a multiple of 256 / G).
template <typename T, int KP>
__device__ void direct_fwd(const T *x, const T *w, const T *bias, T *y, u32 *mask,
                           WindowGeometry g, int K, int c_out, int relu) {
    __shared__ __align__(16) float s[DC_PIXELS][KP];
    __shared__ Taps t;
    const int G = c_out / 2, R = DC_THREADS / G;
    const int cg = threadIdx.x % G, r = threadIdx.x / G, co = 2 * cg;
    const unsigned lane = threadIdx.x & 31;
    float wr[KP][2];
#pragma unroll
    for (int k = 0; k < KP; ++k) {
        wr[k][0] = k < K ? to_f32(w[k * c_out + co]) : 0.0f;
        wr[k][1] = k < K ? to_f32(w[k * c_out + co + 1]) : 0.0f;
    }
    const float b0 = bias ? to_f32(bias[co]) : 0.0f, b1 = bias ? to_f32(bias[co + 1]) : 0.0f;
    taps_init(t, g, K);
    const size_t total = g.n * g.out_h * g.out_w;
    const size_t tiles = (total + DC_PIXELS - 1) / DC_PIXELS;
    T v[KP / 4];
    first_patches<T, KP>(x, g, t, K, tiles, total, v);
    for (size_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        stage_patches<T, KP, KP>(x, g, t, K, tile + gridDim.x, tiles, total, v, s);
        for (int p = r; p < DC_PIXELS; p += R) {
            float a0 = 0.0f, a1 = 0.0f;
#pragma unroll
            for (int k = 0; k < KP; k += 4) {
                float4 v = *(const float4 *)&s[p][k];
                a0 = fmaf(v.x, wr[k][0], a0), a1 = fmaf(v.x, wr[k][1], a1);
                a0 = fmaf(v.y, wr[k + 1][0], a0), a1 = fmaf(v.y, wr[k + 1][1], a1);
                a0 = fmaf(v.z, wr[k + 2][0], a0), a1 = fmaf(v.z, wr[k + 2][1], a1);
                a0 = fmaf(v.w, wr[k + 3][0], a0), a1 = fmaf(v.w, wr[k + 3][1], a1);
            }
            float y0 = to_f32(from_f32<T>(a0 + b0)), y1 = to_f32(from_f32<T>(a1 + b1));
            u32 bits = 0;
            if (relu) {
                bits = ((u32)(y0 > 0.0f) | ((u32)(y1 > 0.0f) << 1)) << (co & 31);
                y0 = y0 <= 0.0f ? 0.0f : y0;
                y1 = y1 <= 0.0f ? 0.0f : y1;
            }
            const size_t pix = tile * DC_PIXELS + p;
            if (mask) {
#pragma unroll
                for (int o = 1; o < 16; o <<= 1) bits |= __shfl_xor_sync(FULL_MASK, bits, o);
                if ((lane & 15) == 0 && pix < total) mask[(pix * c_out + co) >> 5] = bits;
            }
            if (pix < total) store2(y + pix * c_out + co, y0, y1);
        }
    }
}

// Row `row` of a block's partials: channel pair cg's (a, b) added in f64 over the threads that
// hold it (u = cg, cg + G, ...: a fixed order). Every thread of the block must call it.
__device__ __forceinline__ void block_row(double (*red)[2], float a, float b, int G,
                                          double *row) {
    __syncthreads();
    red[threadIdx.x][0] = a, red[threadIdx.x][1] = b;
    __syncthreads();
    if ((int)threadIdx.x < G) {
        double s0 = 0.0, s1 = 0.0;
        for (int u = threadIdx.x; u < DC_THREADS; u += G) s0 += red[u][0], s1 += red[u][1];
        row[2 * threadIdx.x] = s0;
        row[2 * threadIdx.x + 1] = s1;
    }
}

// Stage 1 of dw = sum over positions of patch * dy and db = sum of dy: block b writes its f32
// sums, added in f64 over its threads, to partial[(b * (K + 1) + k) * c_out + co] (row K: db).
// When mask is not null, dy is first masked as the ReLU backward does (bit i of mask clear:
// dy[i] = 0), written back in place when keep != 0. Each thread sums its own positions in f32
// (at most a grid's share of them: the launcher's grid covers the positions evenly). Stage 2 is
// direct_conv_wgrad_finish.
template <typename T, int KP>
__device__ void direct_wgrad(const T *x, T *dy, const u32 *mask, int keep, double *partial,
                             WindowGeometry g, int K, int c_out) {
    __shared__ __align__(16) float s[DC_PIXELS][KP];
    __shared__ Taps t;
    __shared__ double red[DC_THREADS][2];
    const int G = c_out / 2, R = DC_THREADS / G;
    const int cg = threadIdx.x % G, r = threadIdx.x / G, co = 2 * cg;
    float acc[KP][2], db0 = 0.0f, db1 = 0.0f;
#pragma unroll
    for (int k = 0; k < KP; ++k) acc[k][0] = acc[k][1] = 0.0f;
    taps_init(t, g, K);
    const size_t total = g.n * g.out_h * g.out_w;
    const size_t tiles = (total + DC_PIXELS - 1) / DC_PIXELS;
    T v[KP / 4];
    first_patches<T, KP>(x, g, t, K, tiles, total, v);
    for (size_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        stage_patches<T, KP, KP>(x, g, t, K, tile + gridDim.x, tiles, total, v, s);
        // DC_BATCH positions' dy (masked, written back) loaded together, then their products
        for (int p0 = r; p0 < DC_PIXELS; p0 += DC_BATCH * R) {
            float d0[DC_BATCH], d1[DC_BATCH];
#pragma unroll
            for (int j = 0; j < DC_BATCH; ++j) {
                const int p = p0 + j * R;
                const size_t pix = tile * DC_PIXELS + p;
                d0[j] = d1[j] = 0.0f;
                if (p < DC_PIXELS && pix < total) {
                    T *d = dy + pix * c_out + co;
                    load2(d, d0[j], d1[j]);
                    if (mask) {
                        u32 bits = mask[(pix * c_out + co) >> 5] >> (co & 31);
                        d0[j] = bits & 1u ? d0[j] : 0.0f;
                        d1[j] = bits & 2u ? d1[j] : 0.0f;
                        if (keep) store2(d, d0[j], d1[j]);
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < DC_BATCH; ++j) {
                const int p = p0 + j * R;
                if (p >= DC_PIXELS || tile * DC_PIXELS + p >= total) break;
                db0 += d0[j], db1 += d1[j];
#pragma unroll
                for (int k = 0; k < KP; k += 4) {
                    float4 v = *(const float4 *)&s[p][k];
                    acc[k][0] = fmaf(v.x, d0[j], acc[k][0]);
                    acc[k][1] = fmaf(v.x, d1[j], acc[k][1]);
                    acc[k + 1][0] = fmaf(v.y, d0[j], acc[k + 1][0]);
                    acc[k + 1][1] = fmaf(v.y, d1[j], acc[k + 1][1]);
                    acc[k + 2][0] = fmaf(v.z, d0[j], acc[k + 2][0]);
                    acc[k + 2][1] = fmaf(v.z, d1[j], acc[k + 2][1]);
                    acc[k + 3][0] = fmaf(v.w, d0[j], acc[k + 3][0]);
                    acc[k + 3][1] = fmaf(v.w, d1[j], acc[k + 3][1]);
                }
            }
        }
    }
    // rows k < K, then row K (db)
    double *out = partial + (size_t)blockIdx.x * (K + 1) * c_out;
#pragma unroll
    for (int k = 0; k < KP; ++k) {
        if (k < K) block_row(red, acc[k][0], acc[k][1], G, out + k * c_out);
    }
    block_row(red, db0, db1, G, out + K * c_out);
}

// Stage 2: dw[j] (j < K * c_out, HWIO) and db[j - K * c_out] (when db is not null) = the sum
// over the splits of partial[split, j], rounded once to T (blocks of 32 x 32 threads:
// column_sums).
template <typename T>
__device__ void direct_wgrad_finish(const double *partial, T *dw, T *db, size_t splits,
                                    size_t K, size_t c_out) {
    size_t j;
    double v[1];
    if (!column_sums<1>(partial, splits, (K + 1) * c_out, &j, v)) return;
    if (j < K * c_out) {
        dw[j] = from_f32<T>((float)v[0]);
    } else if (db) {
        db[j - K * c_out] = from_f32<T>((float)v[0]);
    }
}

#define DIRECT_K(T, S, KP)                                                                     \
    extern "C" __global__ void __launch_bounds__(DC_THREADS)                                   \
        direct_conv_fwd_k##KP##_##S(const T *x, const T *w, const T *b, T *y, u32 *mask,      \
                                    WindowGeometry g, int K, int c_out, int relu) {            \
        direct_fwd<T, KP>(x, w, b, y, mask, g, K, c_out, relu);                                \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(DC_THREADS)                                   \
        direct_conv_wgrad_k##KP##_##S(const T *x, T *dy, const u32 *mask, int keep,           \
                                      double *partial, WindowGeometry g, int K, int c_out) {   \
        direct_wgrad<T, KP>(x, dy, mask, keep, partial, g, K, c_out);                          \
    }

#define INSTANTIATE_DIRECT(T, S)                                                               \
    DIRECT_K(T, S, 4)                                                                          \
    DIRECT_K(T, S, 8)                                                                          \
    DIRECT_K(T, S, 12)                                                                         \
    DIRECT_K(T, S, 16)                                                                         \
    DIRECT_K(T, S, 20)                                                                         \
    DIRECT_K(T, S, 24)                                                                         \
    DIRECT_K(T, S, 28)                                                                         \
    DIRECT_K(T, S, 32)                                                                         \
    extern "C" __global__ void direct_conv_wgrad_finish_##S(const double *partial, T *dw,     \
                                                            T *db, size_t splits, size_t K,    \
                                                            size_t c_out) {                    \
        direct_wgrad_finish<T>(partial, dw, db, splits, K, c_out);                             \
    }

FOR_FLOATS(INSTANTIATE_DIRECT)
