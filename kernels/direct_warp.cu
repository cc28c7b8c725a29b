// direct_warp.cu: direct_mma.cu's forward pass and filter gradient for f32 under TF32 with 32
// or 64 output channels, a warp a tile and no barrier in the loop. Same operands, semantics and
// partials.
//
// The shapes these take are memory-bound (the seed's conv1, 27 taps to 64 channels, writes
// 1 GB a forward pass at batch 100), and direct_mma.cu spent their time in its tiles' three
// barriers and shared-memory round trips. Here every warp streams its own tiles, each a segment
// of consecutive positions of one output row (so one row decode a tile, and each lane's tap
// walks along one input row): lane k < K copies tap k of the segment's positions into the
// warp's patch rows by 4-byte cp.async (zero-filled in the padding), the products read their
// fragments from there, and the next tile's copies are in flight while the current tile's
// products and stores run. The forward pass holds the kernel as B fragments in registers.
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

// A tile: up to L consecutive positions ox0 .. of output row `row` (= b * out_h + oy).
struct Segment {
    size_t row, b, oy;
    int ox0;
};

// Tile u of segments L wide (ceil(out_w / L) a row).
__device__ __forceinline__ Segment segment(const WindowGeometry &g, size_t u, int L) {
    const size_t per = (g.out_w + L - 1) / L;
    Segment s;
    size_t part;
    if (u <= 0xffffffffull && g.n * g.out_h <= 0xffffffffull) {
        // 32-bit divisions where the tiles fit
        const u32 r = (u32)u / (u32)per, oh = (u32)g.out_h;
        s.row = r, part = (u32)u - r * (u32)per, s.b = r / oh, s.oy = r - (r / oh) * oh;
    } else {
        s.row = u / per, part = u % per, s.b = s.row / g.out_h, s.oy = s.row % g.out_h;
    }
    s.ox0 = (int)(part * L);
    return s;
}

// Lane k's tap: its input row and column offsets and channel (ci < 0: past K, no copies).
struct LaneTap {
    int dy, dx, ci;
};

__device__ __forceinline__ LaneTap lane_tap(const WindowGeometry &g, int K) {
    const int k = threadIdx.x & 31, tap = k / (int)g.c;
    return {(tap / (int)g.kw) * (int)g.dh, (tap % (int)g.kw) * (int)g.dw,
            k < K ? k - tap * (int)g.c : -1};
}

// Lane k < K copies tap t (its own) of the segment's L positions into column k of the patch
// rows at shared address P (`PS` floats apart), zeros outside the input and past the row's
// end; columns K .. stay as they are (zero).
template <int L, int PS>
__device__ __forceinline__ void stage_patches(const float *x, const WindowGeometry &g,
                                              const LaneTap &t, const Segment &s, u32 P) {
    if (t.ci < 0) return;
    const int iy = (int)(s.oy * g.sh) - (int)g.pad_top + t.dy;
    int ix = s.ox0 * (int)g.sw - (int)g.pad_left + t.dx;
    const bool row_in = (unsigned)iy < (unsigned)g.h;
    const float *src = x + ((s.b * g.h + (row_in ? iy : 0)) * g.w) * g.c + t.ci;
    P += 4 * (threadIdx.x & 31);
#pragma unroll
    for (int p = 0; p < L; ++p, ix += (int)g.sw) {
        const bool in = row_in && s.ox0 + p < (int)g.out_w && (unsigned)ix < (unsigned)g.w;
        cp_async4(P + 4 * p * PS, in ? src + (size_t)ix * g.c : x, in);
    }
}

// Zeros n floats at p (the warp's lanes).
__device__ __forceinline__ void warp_zero(float *p, int n) {
    for (int i = threadIdx.x & 31; i < n; i += 32) p[i] = 0.0f;
    __syncwarp();
}

// The forward pass: a tile is 16 positions (rows g and g + 8 of the mma), the patch rows 4
// floats past KP apart (fragment reads conflict-free), two buffers a warp.
template <int KP, int C>
__device__ void warp_fwd(const float *x, const float *w, const float *bias, float *y, u32 *mask,
                         WindowGeometry g, int K, int relu) {
    constexpr int KS = KP / 8, NT = C / 8, WP = C / 32, PS = KP + 4;
    __shared__ __align__(16) float patches[DW_WARPS][2][16][PS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
    float(*P)[16][PS] = patches[warp];
    warp_zero(&P[0][0][0], 2 * 16 * PS);
    u32 b[NT][KS][2];
    float bb[NT / 2][4];
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
#pragma unroll
    for (int p = 0; p < NT / 2; ++p) {
#pragma unroll
        for (int e = 0; e < 4; ++e) bb[p][e] = bias ? bias[16 * p + 4 * tq + e] : 0.0f;
    }
    const size_t tiles = g.n * g.out_h * ((g.out_w + 15) / 16);
    const size_t step = (size_t)gridDim.x * DW_WARPS;
    const u32 P0 = (u32)__cvta_generic_to_shared(&P[0][0][0]), BUF = 16 * PS * 4;
    const LaneTap t = lane_tap(g, K);
    size_t u = (size_t)blockIdx.x * DW_WARPS + warp;
    if (u < tiles) stage_patches<16, PS>(x, g, t, segment(g, u, 16), P0);
    asm volatile("cp.async.commit_group;" ::: "memory");
    for (int buf = 0; u < tiles; u += step, buf ^= 1) {
        if (u + step < tiles) {
            stage_patches<16, PS>(x, g, t, segment(g, u + step, 16), P0 + (buf ^ 1) * BUF);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
        asm volatile("cp.async.wait_group 1;" ::: "memory");
        __syncwarp();
        float acc[NT][4];
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
            const float(*A)[PS] = P[buf];
            const int k = 8 * ks + tq;
            const u32 a[4] = {tf32_bits(A[gq][k]), tf32_bits(A[gq + 8][k]),
                              tf32_bits(A[gq][k + 4]), tf32_bits(A[gq + 8][k + 4])};
#pragma unroll
            for (int j = 0; j < NT; ++j) mma_sync<float>(acc[j], a, b[j][ks][0], b[j][ks][1]);
        }
        __syncwarp(); // every lane has read the buffer before it is staged again
        const Segment s = segment(g, u, 16);
        u32 bits[2][WP];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int ox = s.ox0 + gq + 8 * h;
            const size_t pix = s.row * g.out_w + ox;
#pragma unroll
            for (int i = 0; i < WP; ++i) bits[h][i] = 0;
#pragma unroll
            for (int p = 0; p < NT / 2; ++p) {
                const int c = 16 * p + 4 * tq;
                float o[4] = {acc[2 * p][2 * h], acc[2 * p][2 * h + 1], acc[2 * p + 1][2 * h],
                              acc[2 * p + 1][2 * h + 1]};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    o[e] += bb[p][e];
                    bits[h][p / 2] |= (u32)(o[e] > 0.0f) << ((c + e) & 31);
                    if (relu) o[e] = o[e] <= 0.0f ? 0.0f : o[e];
                }
                if (ox < (int)g.out_w) {
                    *(float4 *)(y + pix * C + c) = make_float4(o[0], o[1], o[2], o[3]);
                }
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
                    const u32 m = quad_or(bits[h][i]);
                    if (h * WP + i == tq) word = m;
                }
            }
            const int ox = s.ox0 + gq + 8 * (tq / WP);
            if (tq < 2 * WP && ox < (int)g.out_w) {
                mask[(s.row * g.out_w + ox) * WP + tq % WP] = word;
            }
        }
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
}

// The filter gradient's ring: each warp streams one 8-position k-step a stage through
// DW_STAGES stages by cp.async (dy's rows, their mask words, the patch rows 8 floats past KP
// apart), so that DW_STAGES - 1 steps are in flight without holding registers. A dy row's
// 16-byte chunk c lies at c ^ 2 (p % 4) (p the position in the step): the lanes of a quarter
// warp reading chunks g (two values of g) of positions t = 0..3 then hit 8 distinct bank groups.
#define DW_STAGES 3

template <int KP, int C> struct WarpStage {
    float4 d[8][C / 4];
    u32 m[8 * C / 32];
    float P[8][KP + 8];
};

// Issues the copies of step u into stage st (zeros past the row's end) and commits them as one
// group (an empty group past the steps, so that every lane counts alike).
template <int KP, int C>
__device__ __forceinline__ void issue_step(const float *x, const float *dy, const u32 *mask,
                                           const WindowGeometry &g, const LaneTap &t, size_t u,
                                           size_t steps, WarpStage<KP, C> &st) {
    const int lane = threadIdx.x & 31;
    if (u < steps) {
        const Segment s = segment(g, u, 8);
        const size_t pix0 = s.row * g.out_w + s.ox0;
#pragma unroll
        for (int i = lane; i < 8 * C / 4; i += 32) {
            const int p = i / (C / 4), c = i % (C / 4);
            const bool in = s.ox0 + p < (int)g.out_w;
            const u32 dst = (u32)__cvta_generic_to_shared(&st.d[p][c ^ (2 * (p & 3))]);
            cp_async16(dst, in ? dy + (pix0 + p) * C + 4 * c : dy, in);
        }
        if (mask && lane < 8 * C / 32) {
            const int p = lane / (C / 32);
            const bool in = s.ox0 + p < (int)g.out_w;
            const u32 dst = (u32)__cvta_generic_to_shared(&st.m[lane]);
            cp_async4(dst, in ? mask + pix0 * (C / 32) + lane : mask, in);
        }
        stage_patches<8, KP + 8>(x, g, t, s, (u32)__cvta_generic_to_shared(&st.P[0][0]));
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}

// The filter gradient: a warp takes 8-position k-steps (lane t: positions t and t + 4, its
// taps g, g + 8, ...; dy's channels 32 q + 4 g .. + 3). dy is masked by the ReLU backward as it
// is read (and written back with keep), its f32 sums per lane are the bias gradient (exact f32
// adds, not on the tensor cores: TF32 would round dy); the warps' f32 sums go to the block's
// partials in f64 (a fixed order), as direct_mma.cu's.
template <int KP, int C>
__device__ void warp_wgrad(const float *x, float *dy, const u32 *mask, int keep, double *partial,
                           WindowGeometry g, int K) {
    constexpr int MT = KP / 16, NT = C / 8, NQ = C / 32;
    __shared__ __align__(16) WarpStage<KP, C> ring[DW_WARPS][DW_STAGES];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
    WarpStage<KP, C>(&st)[DW_STAGES] = ring[warp];
    warp_zero((float *)&st[0], DW_STAGES * (int)sizeof(WarpStage<KP, C>) / 4);
    float acc[MT][NT][4], db[NQ][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            acc[m][j][0] = acc[m][j][1] = acc[m][j][2] = acc[m][j][3] = 0.0f;
        }
    }
#pragma unroll
    for (int q = 0; q < NQ; ++q) db[q][0] = db[q][1] = db[q][2] = db[q][3] = 0.0f;
    const size_t steps = g.n * g.out_h * ((g.out_w + 7) / 8);
    const size_t stride = (size_t)gridDim.x * DW_WARPS, s0 = (size_t)blockIdx.x * DW_WARPS + warp;
    const LaneTap t = lane_tap(g, K);
#pragma unroll
    for (int i = 0; i < DW_STAGES - 1; ++i) {
        issue_step(x, dy, mask, g, t, s0 + i * stride, steps, st[i]);
    }
    int slot = 0;
    for (size_t u = s0; u < steps; u += stride) {
        const int ahead = (slot + DW_STAGES - 1) % DW_STAGES;
        issue_step(x, dy, mask, g, t, u + (DW_STAGES - 1) * stride, steps, st[ahead]);
        asm volatile("cp.async.wait_group %0;" ::"n"(DW_STAGES - 1) : "memory");
        __syncwarp();
        const WarpStage<KP, C> &cs = st[slot];
        float4 d[2][NQ];
        u32 a[MT][4];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
#pragma unroll
            for (int q = 0; q < NQ; ++q) {
                const int p = tq + 4 * r;
                d[r][q] = cs.d[p][(8 * q + gq) ^ (2 * tq)];
                const u32 m = mask ? cs.m[p * NQ + q] >> (4 * gq) : 0xfu;
                float4 &v = d[r][q];
                v.x = m & 1u ? v.x : 0.0f, v.y = m & 2u ? v.y : 0.0f;
                v.z = m & 4u ? v.z : 0.0f, v.w = m & 8u ? v.w : 0.0f;
            }
        }
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            const int k = 16 * m + gq;
            a[m][0] = tf32_bits(cs.P[tq][k]), a[m][1] = tf32_bits(cs.P[tq][k + 8]);
            a[m][2] = tf32_bits(cs.P[tq + 4][k]), a[m][3] = tf32_bits(cs.P[tq + 4][k + 8]);
        }
        __syncwarp(); // every lane has read the slot before it is refilled
        if (mask && keep) {
            const Segment s = segment(g, u, 8);
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int ox = s.ox0 + tq + 4 * r;
                float *row = dy + (s.row * g.out_w + ox) * C + 4 * gq;
#pragma unroll
                for (int q = 0; q < NQ; ++q) {
                    if (ox < (int)g.out_w) *(float4 *)(row + 32 * q) = d[r][q];
                }
            }
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
#pragma unroll
            for (int q = 0; q < NQ; ++q) {
                const float4 &v = d[r][q];
                db[q][0] += v.x, db[q][1] += v.y, db[q][2] += v.z, db[q][3] += v.w;
            }
        }
#pragma unroll
        for (int m = 0; m < MT; ++m) {
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const float4 &d0 = d[0][j / 4], &d1 = d[1][j / 4];
                const int e = j % 4;
                const float b0 = e == 0 ? d0.x : e == 1 ? d0.y : e == 2 ? d0.z : d0.w;
                const float b1 = e == 0 ? d1.x : e == 1 ? d1.y : e == 2 ? d1.z : d1.w;
                mma_sync<float>(acc[m][j], a[m], tf32_bits(b0), tf32_bits(b1));
            }
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
