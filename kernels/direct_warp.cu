// direct_warp.cu: direct_mma.cu's forward pass and filter gradient for f32 under TF32 with 32
// or 64 output channels, a warp a tile and no barrier in the loop (compiled in the DirectMma
// module, after direct_mma.cu). Same operands, semantics and partials.
//
// The shapes these take are memory-bound (the seed's conv1, 27 taps to 64 channels, writes
// 1 GB a forward pass at batch 100), and direct_mma.cu spent their time in its tiles' three
// barriers and shared-memory round trips. Here every warp streams its own tiles: the patches
// are gathered straight into mma fragments (each input element is read by up to kh * kw
// positions, so these loads mostly hit L1 and L2), the forward kernel's weights stay in
// registers as B fragments, and the next tile's loads are in flight while the current tile's
// products and stores run.
//
// An mma's 8 columns may be any 8 channels as long as B and the accumulators agree, so each
// kernel orders them to give every lane 4 adjacent channels (one 16-byte access): the forward
// pass maps n-tile j, column n to channel 16 (j / 2) + 4 (n / 2) + 2 (j % 2) + n % 2 (lane t's
// accumulators of tiles 2p and 2p + 1 are channels 16 p + 4 t .. + 3), the filter gradient
// maps it to 32 (j / 4) + 4 n + j % 4 (lane g's B values of tiles 4q .. 4q + 3 are dy's
// channels 32 q + 4 g .. + 3).
// direct_warp_fwd_k<KP>_c<C>_f32, direct_warp_wgrad_k<KP>_c<C>_f32 (KP = 16 or 32).

#define DW_WARPS 4
#define DW_THREADS (32 * DW_WARPS)

// A lane's N taps k_i = first + stride * i: their input row and column offsets and channel
// (dead, ci < 0, past K).
template <int N> struct LaneTaps {
    int dy[N], dx[N], ci[N];
};

template <int N>
__device__ __forceinline__ void lane_taps(LaneTaps<N> &t, const WindowGeometry &g, int K,
                                          int first, int stride) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const int k = first + stride * i, tap = k / (int)g.c;
        t.dy[i] = (tap / (int)g.kw) * (int)g.dh;
        t.dx[i] = (tap % (int)g.kw) * (int)g.dw;
        t.ci[i] = k < K ? k % (int)g.c : -1;
    }
}

// The values of taps t at output position pix (zeros outside the input, for dead taps and
// past total) into v.
template <int N>
__device__ __forceinline__ void gather_patch(const float *x, const WindowGeometry &g,
                                             const LaneTaps<N> &t, size_t pix, size_t total,
                                             float (&v)[N]) {
    size_t ox = 0, oy = 0, b = 0;
    if (total <= 0xffffffffull) {
        const u32 pi = (u32)pix, ow = (u32)g.out_w, oh = (u32)g.out_h, r = pi / ow;
        ox = pi - r * ow, oy = r % oh, b = r / oh;
    } else {
        ox = pix % g.out_w;
        const size_t r = pix / g.out_w;
        oy = r % g.out_h, b = r / g.out_h;
    }
    const int y0 = (int)(oy * g.sh) - (int)g.pad_top, x0 = (int)(ox * g.sw) - (int)g.pad_left;
    const float *img = x + b * g.h * g.w * g.c;
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const int iy = y0 + t.dy[i], ix = x0 + t.dx[i];
        const bool in = pix < total && t.ci[i] >= 0 && (unsigned)iy < (unsigned)g.h &&
                        (unsigned)ix < (unsigned)g.w;
        v[i] = in ? __ldg(img + ((size_t)iy * g.w + (size_t)ix) * g.c + t.ci[i]) : 0.0f;
    }
}

// The forward pass: a warp's tile is 16 consecutive positions (rows g and g + 8 of the mma),
// lane t holding taps t, t + 4, t + 8, ... of both.
template <int KP, int C>
__device__ void warp_fwd(const float *x, const float *w, const float *bias, float *y, u32 *mask,
                         WindowGeometry g, int K, int relu) {
    constexpr int KS = KP / 8, NT = C / 8, NI = KP / 4, WP = C / 32;
    const int lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
    u32 b[NT][KS][2];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const int c = 16 * (j / 2) + 4 * (gq / 2) + 2 * (j % 2) + gq % 2;
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
            const int k0 = 8 * ks + tq, k1 = k0 + 4;
            b[j][ks][0] = tf32_bits(k0 < K ? w[k0 * C + c] : 0.0f);
            b[j][ks][1] = tf32_bits(k1 < K ? w[k1 * C + c] : 0.0f);
        }
    }
    LaneTaps<NI> t;
    lane_taps(t, g, K, tq, 4);
    const size_t total = g.n * g.out_h * g.out_w, tiles = (total + 15) / 16;
    const size_t step = (size_t)gridDim.x * DW_WARPS;
    size_t tile = (size_t)blockIdx.x * DW_WARPS + (threadIdx.x >> 5);
    float v[2][NI], nv[2][NI];
#pragma unroll
    for (int h = 0; h < 2; ++h) gather_patch(x, g, t, tile * 16 + gq + 8 * h, total, v[h]);
    for (; tile < tiles; tile += step) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            gather_patch(x, g, t, (tile + step) * 16 + gq + 8 * h, total, nv[h]);
        }
        float acc[NT][4];
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
            const u32 a[4] = {tf32_bits(v[0][2 * ks]), tf32_bits(v[1][2 * ks]),
                              tf32_bits(v[0][2 * ks + 1]), tf32_bits(v[1][2 * ks + 1])};
#pragma unroll
            for (int j = 0; j < NT; ++j) mma_sync<float>(acc[j], a, b[j][ks][0], b[j][ks][1]);
        }
        u32 bits[2][WP];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const size_t pix = tile * 16 + gq + 8 * h;
#pragma unroll
            for (int i = 0; i < WP; ++i) bits[h][i] = 0;
#pragma unroll
            for (int p = 0; p < NT / 2; ++p) {
                const int c = 16 * p + 4 * tq;
                float o[4] = {acc[2 * p][2 * h], acc[2 * p][2 * h + 1], acc[2 * p + 1][2 * h],
                              acc[2 * p + 1][2 * h + 1]};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    o[e] += bias ? __ldg(bias + c + e) : 0.0f;
                    bits[h][p / 2] |= (u32)(o[e] > 0.0f) << ((c + e) & 31);
                    if (relu) o[e] = o[e] <= 0.0f ? 0.0f : o[e];
                }
                if (pix < total) *(float4 *)(y + pix * C + c) = make_float4(o[0], o[1], o[2], o[3]);
            }
        }
        if (mask && relu) {
            // a position's words are spread over the 4 lanes of a quad: OR them, then lane t
            // writes word t % WP of row t / WP
            u32 word = 0;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
#pragma unroll
                for (int i = 0; i < WP; ++i) {
                    u32 m = bits[h][i];
                    m |= __shfl_xor_sync(FULL_MASK, m, 1);
                    m |= __shfl_xor_sync(FULL_MASK, m, 2);
                    if (h * WP + i == tq) word = m;
                }
            }
            const size_t pix = tile * 16 + gq + 8 * (tq / WP);
            if (tq < 2 * WP && pix < total) mask[pix * WP + tq % WP] = word;
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int i = 0; i < NI; ++i) v[h][i] = nv[h][i];
        }
    }
}

// The filter gradient's ring: each warp streams dy and its mask words through DW_STAGES
// stages of one 8-position k-step (dy's rows, then the step's mask words) by cp.async, so that
// DW_STAGES - 1 steps are in flight without holding registers. A row's 16-byte chunk c lies at
// c ^ 2 (p % 4) (p the position in the step): the lanes of a quarter warp reading chunks g
// (two values of g) of positions t = 0..3 then hit 8 distinct bank groups.
#define DW_STAGES 4

template <int C> struct WarpStage {
    float4 d[8][C / 4];
    u32 m[8 * C / 32];
};

// Issues the copies of step `step` (positions 8 step ..) into stage st (zeros past total), and
// commits them as one group (an empty group past the steps, so that every lane counts alike).
template <int C>
__device__ __forceinline__ void issue_step(const float *dy, const u32 *mask, size_t step,
                                           size_t total, WarpStage<C> &st) {
    const int lane = threadIdx.x & 31;
    constexpr int CHUNKS = 8 * C / 4, MASK_CHUNKS = 8 * C / 32 / 4;
#pragma unroll
    for (int i = lane; i < CHUNKS; i += 32) {
        const int p = i / (C / 4), c = i % (C / 4);
        const size_t pix = step * 8 + p;
        const u32 dst = (u32)__cvta_generic_to_shared(&st.d[p][c ^ (2 * (p & 3))]);
        cp_async16(dst, pix < total ? dy + pix * C + 4 * c : dy, pix < total);
    }
    if (mask && lane < MASK_CHUNKS) {
        // 4 words a chunk, of 4 / (C / 32) positions: those past total are zero-filled
        const size_t word = step * 8 * (C / 32) + 4 * lane, words = total * (C / 32);
        const u32 bytes = word < words ? 4 * (u32)min(words - word, (size_t)4) : 0;
        const u32 dst = (u32)__cvta_generic_to_shared(&st.m[4 * lane]);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst),
                     "l"(bytes ? mask + word : mask), "r"(bytes));
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}

// The filter gradient: a warp takes 8-position k-steps (lane t: positions t and t + 4, its
// taps g, g + 8, ...; dy's channels 32 q + 4 g .. + 3 from the ring). dy is masked by the ReLU
// backward as it is read (and written back with keep), its f32 sums per lane are the bias
// gradient (exact f32 adds, not on the tensor cores: TF32 would round dy); the warps' f32 sums
// go to the block's partials in f64 (a fixed order), as direct_mma.cu's.
template <int KP, int C>
__device__ void warp_wgrad(const float *x, float *dy, const u32 *mask, int keep, double *partial,
                           WindowGeometry g, int K) {
    constexpr int MT = KP / 16, NT = C / 8, NI = KP / 8, NQ = C / 32;
    __shared__ __align__(16) WarpStage<C> ring[DW_WARPS][DW_STAGES];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
    float acc[MT][NT][4], db[NQ][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[m][j][0] = acc[m][j][1] = acc[m][j][2] = acc[m][j][3] = 0.0f;
    }
#pragma unroll
    for (int q = 0; q < NQ; ++q) db[q][0] = db[q][1] = db[q][2] = db[q][3] = 0.0f;
    LaneTaps<NI> t;
    lane_taps(t, g, K, gq, 8);
    const size_t total = g.n * g.out_h * g.out_w, steps = (total + 7) / 8;
    const size_t stride = (size_t)gridDim.x * DW_WARPS, s0 = (size_t)blockIdx.x * DW_WARPS + warp;
    WarpStage<C>(&st)[DW_STAGES] = ring[warp];
#pragma unroll
    for (int i = 0; i < DW_STAGES - 1; ++i) issue_step(dy, mask, s0 + i * stride, total, st[i]);
    float xv[2][NI], nx[2][NI];
#pragma unroll
    for (int r = 0; r < 2; ++r) gather_patch(x, g, t, s0 * 8 + tq + 4 * r, total, xv[r]);
    int slot = 0;
    for (size_t s = s0; s < steps; s += stride) {
        const int ahead = (slot + DW_STAGES - 1) % DW_STAGES;
        issue_step(dy, mask, s + (DW_STAGES - 1) * stride, total, st[ahead]);
#pragma unroll
        for (int r = 0; r < 2; ++r) gather_patch(x, g, t, (s + stride) * 8 + tq + 4 * r, total, nx[r]);
        asm volatile("cp.async.wait_group %0;" ::"n"(DW_STAGES - 1) : "memory");
        __syncwarp();
        float4 d[2][NQ];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int p = tq + 4 * r;
            const size_t pix = s * 8 + p;
#pragma unroll
            for (int q = 0; q < NQ; ++q) {
                d[r][q] = st[slot].d[p][(8 * q + gq) ^ (2 * tq)];
                const u32 m = mask ? st[slot].m[p * NQ + q] >> (4 * gq) : 0xfu;
                float4 &v = d[r][q];
                v.x = m & 1u ? v.x : 0.0f, v.y = m & 2u ? v.y : 0.0f;
                v.z = m & 4u ? v.z : 0.0f, v.w = m & 8u ? v.w : 0.0f;
                if (mask && keep && pix < total) *(float4 *)(dy + pix * C + 32 * q + 4 * gq) = v;
                db[q][0] += v.x, db[q][1] += v.y, db[q][2] += v.z, db[q][3] += v.w;
            }
        }
        __syncwarp(); // every lane has read the slot before it is refilled
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            const u32 a[4] = {tf32_bits(xv[0][2 * m]), tf32_bits(xv[0][2 * m + 1]),
                              tf32_bits(xv[1][2 * m]), tf32_bits(xv[1][2 * m + 1])};
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const float4 &d0 = d[0][j / 4], &d1 = d[1][j / 4];
                const int e = j % 4;
                const float b0 = e == 0 ? d0.x : e == 1 ? d0.y : e == 2 ? d0.z : d0.w;
                const float b1 = e == 0 ? d1.x : e == 1 ? d1.y : e == 2 ? d1.z : d1.w;
                mma_sync<float>(acc[m][j], a, tf32_bits(b0), tf32_bits(b1));
            }
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
#pragma unroll
            for (int i = 0; i < NI; ++i) xv[r][i] = nx[r][i];
        }
        slot = (slot + 1) % DW_STAGES;
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    // rows: taps 16 m + g (+ 8); columns 2t, 2t + 1 of tile j: channels 32 (j / 4) + 8 t + j % 4
    // (+ 4)
    double *out = partial + (size_t)blockIdx.x * (K + 1) * C;
    for (int r = 0; r < DW_WARPS; ++r) {
        if (warp == r) {
#pragma unroll
            for (int m = 0; m < MT; ++m) {
#pragma unroll
                for (int j = 0; j < NT; ++j) {
#pragma unroll
                    for (int u = 0; u < 4; ++u) {
                        const int k = 16 * m + gq + 8 * (u / 2);
                        const int n = 32 * (j / 4) + 8 * tq + 4 * (u % 2) + j % 4;
                        if (k >= K) continue;
                        double *o = out + k * C + n;
                        *o = (r ? *o : 0.0) + acc[m][j][u];
                    }
                }
            }
        }
        __syncthreads(); // also orders the block's global writes for the next warp
    }
    // db: over the quad's lanes (same channels), then over the warps in order
#pragma unroll
    for (int q = 0; q < NQ; ++q) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            double v = db[q][e];
            v += __shfl_xor_sync(FULL_MASK, v, 1);
            v += __shfl_xor_sync(FULL_MASK, v, 2);
            for (int r = 0; r < DW_WARPS; ++r) {
                if (warp == r && tq == 0) {
                    double *o = out + K * C + 32 * q + 4 * gq + e;
                    *o = (r ? *o : 0.0) + v;
                }
                __syncthreads();
            }
        }
    }
}

#define DIRECT_WARP(KP, C)                                                                     \
    extern "C" __global__ void __launch_bounds__(DW_THREADS, 3)                                \
        direct_warp_fwd_k##KP##_c##C##_f32(const float *x, const float *w, const float *b,     \
                                           float *y, u32 *mask, WindowGeometry g, int K,       \
                                           int relu) {                                         \
        warp_fwd<KP, C>(x, w, b, y, mask, g, K, relu);                                         \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(DW_THREADS, 3)                                \
        direct_warp_wgrad_k##KP##_c##C##_f32(const float *x, float *dy, const u32 *mask,       \
                                             int keep, double *partial, WindowGeometry g,      \
                                             int K) {                                          \
        warp_wgrad<KP, C>(x, dy, mask, keep, partial, g, K);                                   \
    }

DIRECT_WARP(16, 32)
DIRECT_WARP(16, 64)
DIRECT_WARP(32, 32)
DIRECT_WARP(32, 64)
