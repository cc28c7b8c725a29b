// direct_mma.cu: the passes of direct_conv.cu on the tensor cores (bf16 and f16 always, f32
// under TF32), same operands, semantics and partials; kernels/direct_common.cuh (prepended)
// stages the patches.
//
// Where the FMA kernels spend their time on shared-memory reads (each thread reads the
// whole patch for 2 channels), a warp here runs mma.sync on 16 positions at a time: the patch
// tile is staged as above, the products run as bf16/f16 m16n8k16 (exact products, f32 sums) or
// TF32 m16n8k8 (operands rounded by cvt.rna, as cuDNN's TF32 algorithms do), and the tile's
// outputs (forward) or output gradients (filter gradient) cross global memory in 16-byte
// accesses through shared memory. c_out is 32, 64 or 128 (template C; f32 only 128: fewer run
// direct_warp.cu); KP = 16 or 32.
// direct_mma_fwd_k<KP>_c<C>_<dtype>, direct_mma_wgrad_k<KP>_c<C>_<dtype>; the filter gradient
// writes the same partials as direct_wgrad, finished by direct_conv_wgrad_finish.

// One warp's mma of a 16 x 8 f32 tile. A (16 x KSTEP, row-major) and B (KSTEP x 8) come from
// accessors at(row, col) and bt(k, n) returning f32 values (PTX ISA, "Matrix fragments for
// mma.m16n8k16" and "mma.m16n8k8": lane = 4 g + t).
template <typename T> struct Mma {
    static const int KSTEP = 16;
    static __device__ __forceinline__ u32 pack(float lo, float hi);
    template <class F>
    static __device__ __forceinline__ void a(u32 (&r)[4], F at, int g, int t) {
        r[0] = pack(at(g, 2 * t), at(g, 2 * t + 1));
        r[1] = pack(at(g + 8, 2 * t), at(g + 8, 2 * t + 1));
        r[2] = pack(at(g, 2 * t + 8), at(g, 2 * t + 9));
        r[3] = pack(at(g + 8, 2 * t + 8), at(g + 8, 2 * t + 9));
    }
    template <class F>
    static __device__ __forceinline__ void b(u32 (&r)[2], F bt, int g, int t) {
        r[0] = pack(bt(2 * t, g), bt(2 * t + 1, g));
        r[1] = pack(bt(2 * t + 8, g), bt(2 * t + 9, g));
    }
    static __device__ __forceinline__ void mma(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]);
};

template <> __device__ __forceinline__ u32 Mma<bf16_t>::pack(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
template <> __device__ __forceinline__ u32 Mma<f16_t>::pack(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
template <>
__device__ __forceinline__ void Mma<bf16_t>::mma(float (&d)[4], const u32 (&a)[4],
                                                 const u32 (&b)[2]) {
    mma_sync<bf16_t>(d, a, b[0], b[1]);
}
template <>
__device__ __forceinline__ void Mma<f16_t>::mma(float (&d)[4], const u32 (&a)[4],
                                                const u32 (&b)[2]) {
    mma_sync<f16_t>(d, a, b[0], b[1]);
}

template <> struct Mma<float> {
    static const int KSTEP = 8;
    template <class F>
    static __device__ __forceinline__ void a(u32 (&r)[4], F at, int g, int t) {
        r[0] = tf32_bits(at(g, t)), r[1] = tf32_bits(at(g + 8, t));
        r[2] = tf32_bits(at(g, t + 4)), r[3] = tf32_bits(at(g + 8, t + 4));
    }
    template <class F>
    static __device__ __forceinline__ void b(u32 (&r)[2], F bt, int g, int t) {
        r[0] = tf32_bits(bt(t, g)), r[1] = tf32_bits(bt(t + 4, g));
    }
    static __device__ __forceinline__ void mma(float (&d)[4], const u32 (&a)[4],
                                               const u32 (&b)[2]) {
        mma_sync<float>(d, a, b[0], b[1]);
    }
};

// v0, v1 rounded to T (round to nearest even), then with relu their ReLU (NaN stays), stored
// at o (2 elements); returns their bits "rounded value > 0" (bit 0: v0). bf16 and f16 round a
// pair with one cvt (a NaN becomes the canonical NaN).
template <typename T>
__device__ __forceinline__ u32 out_pair(T *o, float v0, float v1, int relu) {
    const u32 p = Mma<T>::pack(v0, v1);
    T lo, hi;
    lo.bits = (unsigned short)(p & 0xffffu), hi.bits = (unsigned short)(p >> 16);
    const float y0 = to_f32(lo), y1 = to_f32(hi);
    u32 keep = 0xffffffffu;
    if (relu) {
        keep = (y0 <= 0.0f ? 0u : 0xffffu) | (y1 <= 0.0f ? 0u : 0xffff0000u);
    }
    *(u32 *)o = p & keep;
    return (u32)(y0 > 0.0f) | (u32)(y1 > 0.0f) << 1;
}
template <> __device__ __forceinline__ u32 out_pair(float *o, float y0, float y1, int relu) {
    const u32 bits = (u32)(y0 > 0.0f) | (u32)(y1 > 0.0f) << 1;
    if (relu) {
        y0 = y0 <= 0.0f ? 0.0f : y0;
        y1 = y1 <= 0.0f ? 0.0f : y1;
    }
    store2(o, y0, y1);
    return bits;
}

// The forward pass of direct_fwd on the tensor cores (same operands and semantics). Warp w
// takes positions 16 (w % 4) .. + 15 of the tile and channels (C / 2)(w / 4) .. + C / 2 - 1,
// with its share of w as B fragments in registers; the rounded, activated tile is staged in
// shared memory (rows padded by 8 elements: conflict-free), then stored in 16-byte chunks (the
// tile's outputs are contiguous), and with a mask one thread a mask word reads it back.
template <typename T, int KP, int C>
__device__ void mma_fwd(const T *x, const T *w, const T *bias, T *y, u32 *mask,
                        WindowGeometry g, int K, int relu) {
    const int KSTEP = Mma<T>::KSTEP, KS = KP / KSTEP, NT = C / 16, S = KP + 8, OS = C + 8;
    __shared__ __align__(16) float s[DC_PIXELS][S];
    __shared__ __align__(16) T o[DC_PIXELS][OS];
    __shared__ u32 mw[DC_PIXELS][C / 32];
    __shared__ Taps t;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
    const int m0 = 16 * (warp & 3), n0 = (C / 2) * (warp >> 2);
    u32 b[NT][KS][2];
    float bb[NT][2];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const int n = n0 + 8 * j;
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
            auto bt = [&](int k, int c) {
                int kk = ks * KSTEP + k;
                return kk < K ? to_f32(w[kk * C + n + c]) : 0.0f;
            };
            Mma<T>::b(b[j][ks], bt, gq, tq);
        }
        bb[j][0] = bias ? to_f32(bias[n + 2 * tq]) : 0.0f;
        bb[j][1] = bias ? to_f32(bias[n + 2 * tq + 1]) : 0.0f;
    }
    taps_init(t, g, K);
    for (int u = threadIdx.x; u < DC_PIXELS * C / 32; u += DC_THREADS) {
        mw[u / (C / 32)][u % (C / 32)] = 0;
    }
    const size_t total = g.n * g.out_h * g.out_w;
    const size_t tiles = (total + DC_PIXELS - 1) / DC_PIXELS;
    T v[KP / 4];
    first_patches<T, KP>(x, g, t, K, tiles, total, v);
    for (size_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        stage_patches<T, KP, S>(x, g, t, K, tile + gridDim.x, tiles, total, v, s);
        float acc[NT][4];
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
            u32 a[4];
            Mma<T>::a(a, [&](int r, int c) { return s[m0 + r][ks * KSTEP + c]; }, gq, tq);
#pragma unroll
            for (int j = 0; j < NT; ++j) Mma<T>::mma(acc[j], a, b[j][ks]);
        }
        // the lane's mask bits per row half h: word n0 / 32 + j / 4 of n-tile j (one word from
        // two warps' halves when C = 32)
        const int WL = C / 64 > 0 ? C / 64 : 1;
        u32 bits[2][WL];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int i = 0; i < WL; ++i) bits[h][i] = 0;
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const int c = n0 + 8 * j + 2 * tq, wi = C >= 64 ? j / 4 : 0;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float v0 = acc[j][2 * h] + bb[j][0], v1 = acc[j][2 * h + 1] + bb[j][1];
                const u32 pos = out_pair(&o[m0 + gq + 8 * h][c], v0, v1, relu);
                bits[h][wi] |= pos << (c & 31);
            }
        }
        if (mask && relu) {
            // a row's bits are spread over the 4 lanes of a quad; its first lane ORs the word
#pragma unroll
            for (int h = 0; h < 2; ++h) {
#pragma unroll
                for (int i = 0; i < WL; ++i) {
                    const u32 w = quad_or(bits[h][i]);
                    if (tq == 0) atomicOr(&mw[m0 + gq + 8 * h][n0 / 32 + i], w);
                }
            }
        }
        __syncthreads();
        // the tile's outputs are contiguous: 16-byte chunks, CR a row
        const size_t p0 = tile * DC_PIXELS;
        const int CR = C * (int)sizeof(T) / 16;
        for (int c = threadIdx.x; c < DC_PIXELS * CR; c += DC_THREADS) {
            const int row = c / CR, off = c % CR;
            if (p0 + row < total) {
                ((uint4 *)(y + (p0 + row) * C))[off] = ((const uint4 *)&o[row][0])[off];
            }
        }
        if (mask && relu) {
            for (int u = threadIdx.x; u < DC_PIXELS * C / 32; u += DC_THREADS) {
                const int row = u / (C / 32), wd = u % (C / 32);
                if (p0 + row < total) mask[(p0 + row) * (C / 32) + wd] = mw[row][wd];
                mw[row][wd] = 0;
            }
        }
    }
}

// Eight consecutive elements of T in their storage bits: 16 bytes (bf16, f16) or 32 (f32).
template <typename T> struct Raw8 {
    u32 w[2 * sizeof(T)];
};

// The 8 elements at p (16-byte aligned) as stored.
template <typename T> __device__ __forceinline__ Raw8<T> load_raw8(const T *p) {
    Raw8<T> r;
#pragma unroll
    for (int i = 0; i < (int)sizeof(T) / 2; ++i) {
        uint4 q = ((const uint4 *)p)[i];
        r.w[4 * i] = q.x, r.w[4 * i + 1] = q.y, r.w[4 * i + 2] = q.z, r.w[4 * i + 3] = q.w;
    }
    return r;
}

template <typename T> __device__ __forceinline__ void store_raw8(T *p, const Raw8<T> &r) {
#pragma unroll
    for (int i = 0; i < (int)sizeof(T) / 2; ++i) {
        ((uint4 *)p)[i] = make_uint4(r.w[4 * i], r.w[4 * i + 1], r.w[4 * i + 2], r.w[4 * i + 3]);
    }
}

// Element j of r zeroed (+0) where bit j of bits is clear.
template <typename T> __device__ __forceinline__ void mask_raw8(Raw8<T> &r, u32 bits) {
    const int per = 4 / (int)sizeof(T); // elements a word
#pragma unroll
    for (int i = 0; i < 2 * (int)sizeof(T); ++i) {
        u32 keep = bits >> (per * i) & 1u ? (per == 1 ? 0xffffffffu : 0xffffu) : 0u;
        if (per == 2 && (bits >> (2 * i + 1) & 1u)) keep |= 0xffff0000u;
        r.w[i] &= keep;
    }
}

// r's elements as f32 (exact).
template <typename T> __device__ __forceinline__ void unpack8(const Raw8<T> &r, float (&f)[8]) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        if constexpr (sizeof(T) == 4) {
            f[j] = __uint_as_float(r.w[j]);
        } else {
            T h;
            h.bits = (unsigned short)(r.w[j / 2] >> (16 * (j % 2)));
            f[j] = to_f32(h);
        }
    }
}

// A thread's share of dy's tile in flight: chunk i = threadIdx.x + i DC_THREADS of 8 elements
// (position c / (C / 8) of the tile, channels 8 (c % (C / 8)) .., the same for every i), as
// stored (zeros past total), and with a mask the word holding the chunk's bits.
template <typename T, int CH> struct DyChunks {
    Raw8<T> r[CH];
    u32 bits[CH];
};

// The chunk's position in dy and its first channel.
template <int C>
__device__ __forceinline__ void dy_chunk(size_t tile, int i, size_t &pix, int &col) {
    const int c = threadIdx.x + i * DC_THREADS;
    pix = tile * DC_PIXELS + c / (C / 8), col = 8 * (c % (C / 8));
}

// Issues the loads of dy's tile `tile` into q (16-byte accesses, dy 16-byte aligned); nothing
// reads them until finish_dy, so they are in flight across the block's other work.
template <typename T, int C, int CH>
__device__ __forceinline__ void load_dy(const T *dy, const u32 *mask, size_t tile, size_t total,
                                        DyChunks<T, CH> &q) {
#pragma unroll
    for (int i = 0; i < CH; ++i) {
        size_t pix;
        int col;
        dy_chunk<C>(tile, i, pix, col);
        q.bits[i] = 0;
        if (pix >= total) {
            q.r[i] = Raw8<T>{};
            continue;
        }
        q.r[i] = load_raw8(dy + pix * C + col);
        if (mask) q.bits[i] = mask[(pix * C + col) >> 5];
    }
}

// q (tile `tile`) as f32 in e, added to the thread's bias-gradient sums db (its 8 channels, exact
// f32 adds); with a mask, masked by it first and with keep written back masked (the ReLU
// backward in place, as direct_wgrad).
template <typename T, int C, int CH>
__device__ __forceinline__ void finish_dy(T *dy, const u32 *mask, int keep, size_t tile,
                                          size_t total, DyChunks<T, CH> &q, float (&e)[CH][8],
                                          float (&db)[8]) {
#pragma unroll
    for (int i = 0; i < CH; ++i) {
        size_t pix;
        int col;
        dy_chunk<C>(tile, i, pix, col);
        if (mask && pix < total) {
            mask_raw8(q.r[i], q.bits[i] >> (col & 31));
            if (keep) store_raw8(dy + pix * C + col, q.r[i]);
        }
        unpack8(q.r[i], e[i]);
#pragma unroll
        for (int j = 0; j < 8; ++j) db[j] += e[i][j];
    }
}

// The filter gradient of direct_wgrad on the tensor cores (same operands, partials and
// semantics): dw^T = patches^T · dy over the tile's positions. Patches and dy (masked, and with
// keep written back masked, in place) are staged in shared memory as f32; dy's loads are issued
// two barriers and a tile's products ahead of their use, the patches' a tile's products ahead.
// Warp w takes the 16 positions 16 (w % 4) .. of each tile (one bf16/f16 k-step, two TF32 ones)
// for channels (C / 2)(w / 4) .. + C / 2 - 1 and every tap, so each A fragment is built by two
// warps (one a channel half; eight when warps split the channels); the four position quarters'
// f32 sums over the block's tiles are added into the partials in f64, in a fixed order. db is
// summed in exact f32 adds per thread (its chunks' channels), not on the tensor cores (TF32 would
// round dy), then over lanes and warps in f64 (a fixed order). Shared-memory rows are padded so
// that the fragment reads are conflict-free: 4 floats for the pair reads of k16 (2 S = 8 mod
// 32), 8 for the single reads of TF32's k8 (S = +-8 mod 32), at the cost of 2-way conflicts in
// put_patches' f32 stores under TF32 (once a tile, against the fragment reads' every k-step).
template <typename T, int KP, int C>
__device__ void mma_wgrad(const T *x, T *dy, const u32 *mask, int keep, double *partial,
                          WindowGeometry g, int K) {
    const int KSTEP = Mma<T>::KSTEP, MT = KP / 16, NT = C / 16, PAD = KSTEP == 8 ? 8 : 4;
    const int S = KP + PAD, DS = C + PAD, CH = DC_PIXELS * C / 8 / DC_THREADS;
    __shared__ __align__(16) float s[DC_PIXELS][S];
    __shared__ __align__(16) float d[DC_PIXELS][DS];
    __shared__ Taps t;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
    const int p0 = 16 * (warp & 3), n0 = (C / 2) * (warp >> 2);
    float acc[NT][MT][4], db[8];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int m = 0; m < MT; ++m) {
#pragma unroll
            for (int u = 0; u < 4; ++u) acc[j][m][u] = 0.0f;
        }
#pragma unroll
    for (int j = 0; j < 8; ++j) db[j] = 0.0f;
    taps_init(t, g, K);
    const size_t total = g.n * g.out_h * g.out_w;
    const size_t tiles = (total + DC_PIXELS - 1) / DC_PIXELS;
    T v[KP / 4];
    float e[CH][8];
    DyChunks<T, CH> q;
    first_patches<T, KP>(x, g, t, K, tiles, total, v);
    if (blockIdx.x < tiles) {
        load_dy<T, C, CH>(dy, mask, blockIdx.x, total, q);
        finish_dy<T, C, CH>(dy, mask, keep, blockIdx.x, total, q, e, db);
        load_dy<T, C, CH>(dy, mask, blockIdx.x + gridDim.x, total, q);
    }
    for (size_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        __syncthreads();
        put_patches<T, KP, S>(v, s);
#pragma unroll
        for (int i = 0; i < CH; ++i) {
            const int c = threadIdx.x + i * DC_THREADS;
            store8(&d[c / (C / 8)][8 * (c % (C / 8))], e[i]);
        }
        __syncthreads();
        const size_t next = tile + gridDim.x;
        if (next < tiles) load_patches<T, KP>(x, g, t, K, next * DC_PIXELS, total, v);
#pragma unroll
        for (int ks = 0; ks < 16 / KSTEP; ++ks) {
            const int p = p0 + ks * KSTEP;
            u32 a[MT][4];
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                Mma<T>::a(a[m], [&](int r, int c) { return s[p + c][16 * m + r]; }, gq, tq);
            }
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                u32 b[2];
                Mma<T>::b(b, [&](int k, int c) { return d[p + k][n0 + 8 * j + c]; }, gq, tq);
#pragma unroll
                for (int m = 0; m < MT; ++m) Mma<T>::mma(acc[j][m], a[m], b);
            }
        }
        if (next < tiles) {
            finish_dy<T, C, CH>(dy, mask, keep, next, total, q, e, db);
            load_dy<T, C, CH>(dy, mask, next + gridDim.x, total, q);
        }
    }
    double *out = partial + (size_t)blockIdx.x * (K + 1) * C;
    for (int r = 0; r < 4; ++r) {
        if ((warp & 3) == r) {
#pragma unroll
            for (int j = 0; j < NT; ++j) {
#pragma unroll
                for (int m = 0; m < MT; ++m) {
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int k = 16 * m + gq + 8 * h, n = n0 + 8 * j + 2 * tq;
                        if (k >= K) continue;
                        double *o = out + k * C + n;
                        o[0] = (r ? o[0] : 0.0) + acc[j][m][2 * h];
                        o[1] = (r ? o[1] : 0.0) + acc[j][m][2 * h + 1];
                    }
                }
            }
        }
        __syncthreads(); // also orders the block's global writes for the next quarter
    }
    // db: over the lanes holding the same channels (lane % (C / 8)), then over the warps, in
    // d's space (free after the barriers above)
    double sum[8], *ws = (double *)&d[0][0];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        sum[j] = db[j];
        for (int o = C / 8; o < 32; o <<= 1) sum[j] += __shfl_xor_sync(FULL_MASK, sum[j], o);
    }
    if (lane < C / 8) {
#pragma unroll
        for (int j = 0; j < 8; ++j) ws[warp * C + 8 * lane + j] = sum[j];
    }
    __syncthreads();
    if ((int)threadIdx.x < C) {
        double total_db = 0.0;
        for (int w = 0; w < DC_THREADS / 32; ++w) total_db += ws[w * C + threadIdx.x];
        out[K * C + threadIdx.x] = total_db;
    }
}

#define DIRECT_MMA(T, S, KP, C)                                                                \
    extern "C" __global__ void __launch_bounds__(DC_THREADS)                                   \
        direct_mma_fwd_k##KP##_c##C##_##S(const T *x, const T *w, const T *b, T *y, u32 *mask, \
                                          WindowGeometry g, int K, int relu) {                 \
        mma_fwd<T, KP, C>(x, w, b, y, mask, g, K, relu);                                       \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(DC_THREADS)                                   \
        direct_mma_wgrad_k##KP##_c##C##_##S(const T *x, T *dy, const u32 *mask, int keep,     \
                                            double *partial, WindowGeometry g, int K) {        \
        mma_wgrad<T, KP, C>(x, dy, mask, keep, partial, g, K);                                 \
    }

#define INSTANTIATE_MMA(T, S)                                                                  \
    DIRECT_MMA(T, S, 16, 32)                                                                   \
    DIRECT_MMA(T, S, 16, 64)                                                                   \
    DIRECT_MMA(T, S, 16, 128)                                                                  \
    DIRECT_MMA(T, S, 32, 32)                                                                   \
    DIRECT_MMA(T, S, 32, 64)                                                                   \
    DIRECT_MMA(T, S, 32, 128)

INSTANTIATE_MMA(bf16_t, bf16)
INSTANTIATE_MMA(f16_t, f16)
// f32 with 32 or 64 outputs: direct_warp.cu
DIRECT_MMA(float, f32, 16, 128)
DIRECT_MMA(float, f32, 32, 128)
