// dense_bulk.cu: the dense update in one pass (ops::dense_adam), its weight streamed through
// shared memory by the Hopper bulk-copy engine (cp.async.bulk, sm_90).
//
// x [m, k] and dy [m, n] of T (bf16 or f16: mma m16n8k16, exact products; f32: TF32 m16n8k8,
// operands rounded by cvt.rna), w, mu, nu [k, n] f32, dx [m, k] of T (null: not computed; may
// be x itself). 1 <= m <= 128, n a multiple of 8 from 8 to 128, k a multiple of 16 / sizeof(T),
// every pointer 16-byte aligned. A tile is DB_ROWS weight rows with all n columns; per tile:
//   dw[16, n]  = x[:, tile]^T · dy           (f32 sums, into shared memory);
//   old        = w rounded to T (to TF32 for f32), then adam_one on w, mu, nu (the exact step
//                of adam.cu, f32 master weights) from dw;
//   dx[:, tile] = dy · old^T                 (f32 sums, rounded to T once).
// dw never leaves shared memory. The block's lane 0 of warp 0 asks the bulk-copy engine for
// each tile's w, mu, nu (three copies of 16 n floats: the rows are contiguous) and x's m row
// segments, S - 2 tiles ahead, into S stages completed by mbarriers (transaction counts); the
// updated w, mu, nu leave by three bulk stores from the stage. The warps only compute: eight of
// them a block, one block a multiprocessor, so the copy engine keeps tens of KB in flight per
// multiprocessor without registers or occupancy to hide the latency.
//
// Shared memory (bytes, the launcher's dense_bulk_shared): dy staged [mp][n + 8] (T; u32 TF32
// bits for f32), mp = m rounded up to 16, rows past m zero; then dw [16][n + 8] f32; then old
// [16][n + 8] (T, u32 for f32); then S stages of w, mu, nu [16][n] f32 and x's segments
// [mp][XP] (rows past m zero); then S mbarriers. Pitches are chosen so the fragment reads are
// free of bank conflicts at n = 128.
#define DB_WARPS 8
#define DB_ROWS 16

// The element type's layout: bytes, the x segment pitch in elements, the mma's K step.
template <typename T> struct Db {
    static const int XP = 24;   // 48-byte rows: ldmatrix's eight rows on distinct banks
    static const int KSTEP = 16;
};
template <> struct Db<float> {
    static const int XP = 24;   // 96-byte rows: the A reads (row t, column g) on distinct banks
    static const int KSTEP = 8;
};

// An mbarrier expecting `count` arrivals a phase.
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    u32 done = 0;
    while (!done) {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; "
                     "selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    }
}
// bytes (a multiple of 16) from global src to shared dst, completing on mbarrier bar.
__device__ __forceinline__ void bulk_load(u32 dst, const void *src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
                 "%2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void bulk_store(void *dst, u32 src, u32 bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst),
                 "r"(src), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void ldsm_x4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// Two values as the pair an mma operand register holds: T rounded (round to nearest even),
// or for f32 nothing (the register holds TF32 bits, rounded when staged).
template <typename T> __device__ __forceinline__ u32 pair_bits(float lo, float hi) {
    return (u32)from_f32<T>(lo).bits | ((u32)from_f32<T>(hi).bits << 16);
}

// The dw tile's n8 slice c, K step kb: the A fragment (x^T) and B fragment (dy).
// 16-bit: A[r][b] = xs[b][r] by ldmatrix.trans (matrices: rows b 0-7 / 8-15 of columns r 0-7
// / 8-15), B[b][j] = dys[b][j] by ldmatrix.trans (two K halves, for two slices at once).
template <typename T>
__device__ __forceinline__ void dw_tile(const T *xs, const T *dys, int pitch, int ns, int kb_n,
                                        int warp, int lane, float (&acc)[2][4]) {
    const int q = lane >> 3, j = lane & 7;
    const u32 xa = (u32)__cvta_generic_to_shared(xs + ((q >> 1) * 8 + j) * Db<T>::XP + (q & 1) * 8);
    // B: matrices (K half 0, slice c0), (K half 1, c0), (K half 0, c1), (K half 1, c1)
    const int c0 = 2 * warp;
    const u32 ya = (u32)__cvta_generic_to_shared(dys + ((q & 1) * 8 + j) * pitch +
                                                 8 * (c0 + (q >> 1)));
    if (c0 >= ns) return;
    for (int kb = 0; kb < kb_n; ++kb) {
        u32 a[4], b[4];
        ldsm_x4_t(a, xa + 2 * 16 * kb * Db<T>::XP);
        ldsm_x4_t(b, ya + 2 * 16 * kb * pitch);
        mma_sync<T>(acc[0], a, b[0], b[1]);
        if (c0 + 1 < ns) mma_sync<T>(acc[1], a, b[2], b[3]);
    }
}
// f32: A[r][b] = x[b][r] (a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4)), rounded
// here; B[b][j] = dy's TF32 bits (b0 (t, g), b1 (t + 4, g)).
template <>
__device__ __forceinline__ void dw_tile<float>(const float *xs, const float *dys_f, int pitch,
                                               int ns, int kb_n, int warp, int lane,
                                               float (&acc)[2][4]) {
    const u32 *dys = (const u32 *)dys_f;
    const int g = lane >> 2, t = lane & 3, c0 = 2 * warp;
    for (int kb = 0; kb < kb_n; ++kb) {
        const float *x0 = xs + (8 * kb + t) * Db<float>::XP, *x1 = x0 + 4 * Db<float>::XP;
        const u32 a[4] = {tf32_bits(x0[g]), tf32_bits(x0[g + 8]), tf32_bits(x1[g]),
                          tf32_bits(x1[g + 8])};
        const u32 *y0 = dys + (8 * kb + t) * pitch + g, *y1 = y0 + 4 * pitch;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            if (c0 + i < ns) mma_sync<float>(acc[i], a, y0[8 * (c0 + i)], y1[8 * (c0 + i)]);
        }
    }
}

// dx[mt 16 .. +15, 0 .. 15] of the tile = dy · old^T, K = n. 16-bit: A[b][j] = dys[b][j]
// (ldmatrix), B[j][r] = old[r][j] (ldmatrix: matrices (rows 0-7, K half 0), (0-7, 1), (8-15,
// 0), (8-15, 1)).
template <typename T>
__device__ __forceinline__ void dx_tile(const T *dys, const T *old, int pitch, int n, int mt,
                                        int lane, float (&d)[2][4]) {
    const int q = lane >> 3, j = lane & 7;
    const u32 ya = (u32)__cvta_generic_to_shared(dys + (16 * mt + (q & 1) * 8 + j) * pitch +
                                                 (q >> 1) * 8);
    const u32 oa = (u32)__cvta_generic_to_shared(old + ((q >> 1) * 8 + j) * (n + 8) + (q & 1) * 8);
    // n / 16 rounded up: where n % 16 == 8 the last step reads the zero pad columns
    for (int kk = 0; kk < (n + 15) / 16; ++kk) {
        u32 a[4], b[4];
        ldsm_x4(a, ya + 32 * kk);
        ldsm_x4(b, oa + 32 * kk);
        mma_sync<T>(d[0], a, b[0], b[1]);
        mma_sync<T>(d[1], a, b[2], b[3]);
    }
}
// f32, with K permuted within each 8 columns (logical k t and t + 4 are columns 2t and 2t + 1,
// the same for A and B): a0, a2 = dys[g][8kk + 2t, + 1], b0, b1 = old[r][8kk + 2t, + 1].
template <>
__device__ __forceinline__ void dx_tile<float>(const float *dys_f, const float *old_f, int pitch,
                                               int n, int mt, int lane, float (&d)[2][4]) {
    const u32 *dys = (const u32 *)dys_f, *old = (const u32 *)old_f;
    const int g = lane >> 2, t = lane & 3;
    const u32 *y0 = dys + (16 * mt + g) * pitch + 2 * t, *y1 = y0 + 8 * pitch;
    const u32 *o0 = old + g * (n + 8) + 2 * t, *o1 = o0 + 8 * (n + 8);
    for (int kk = 0; kk < n / 8; ++kk) {
        const uint2 lo = *(const uint2 *)(y0 + 8 * kk), hi = *(const uint2 *)(y1 + 8 * kk);
        const u32 a[4] = {lo.x, hi.x, lo.y, hi.y};
        const uint2 b0 = *(const uint2 *)(o0 + 8 * kk), b1 = *(const uint2 *)(o1 + 8 * kk);
        mma_sync<float>(d[0], a, b0.x, b0.y);
        mma_sync<float>(d[1], a, b1.x, b1.y);
    }
}

// dx's pair (row b, tile columns r, r + 1) rounded to T (f32 as it is).
template <typename T> __device__ __forceinline__ void store_pair(T *p, float a, float b) {
    *(u32 *)p = pair_bits<T>(a, b);
}
template <> __device__ __forceinline__ void store_pair<float>(float *p, float a, float b) {
    *(float2 *)p = make_float2(a, b);
}

// The old weight's four values as product 2's B operand: T, or TF32 bits for f32.
template <typename T> __device__ __forceinline__ void store_old(T *p, float4 w) {
    *(uint2 *)p = make_uint2(pair_bits<T>(w.x, w.y), pair_bits<T>(w.z, w.w));
}
template <> __device__ __forceinline__ void store_old<float>(float *p, float4 w) {
    *(uint4 *)p = make_uint4(tf32_bits(w.x), tf32_bits(w.y), tf32_bits(w.z), tf32_bits(w.w));
}

// dy staged as the mma reads it: T, or TF32 bits for f32 (u32 in a float's place).
template <typename T> __device__ __forceinline__ T stage_dy(T v) { return v; }
template <> __device__ __forceinline__ float stage_dy<float>(float v) {
    return __uint_as_float(tf32_bits(v));
}

template <typename T>
__device__ __forceinline__ void dense_adam_bulk_t(const T *x, const T *__restrict__ dy,
                                                  float *__restrict__ w, float *__restrict__ mu,
                                                  float *__restrict__ nu, T *dx, AdamHyper h,
                                                  int m, int n, size_t k, int stages,
                                                  int x_threads) {
#if __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) unsigned char db_smem[];
    const int mp = (m + 15) & ~15, pitch = n + 8, ns = n / 8, lane = threadIdx.x & 31,
              warp = threadIdx.x >> 5, tid = threadIdx.x;
    T *dys = (T *)db_smem;
    float *dwt = (float *)(dys + mp * pitch);
    T *old = (T *)(dwt + DB_ROWS * pitch);
    unsigned char *stage0 = (unsigned char *)(old + DB_ROWS * pitch);
    const int wbytes = DB_ROWS * n * 4, sbytes = 3 * wbytes + mp * Db<T>::XP * (int)sizeof(T);
    const u32 bars = (u32)__cvta_generic_to_shared(stage0 + stages * sbytes);
    const size_t tiles = (k + DB_ROWS - 1) / DB_ROWS;
    for (int i = tid; i < mp * pitch; i += blockDim.x) {
        const int b = i / pitch, j = i % pitch;
        dys[i] = b < m && j < n ? stage_dy<T>(dy[(size_t)b * n + j]) : from_f32<T>(0.0f);
    }
    // the old weight's pad columns (read by dx's last K step where n % 16 == 8) stay zero
    for (int i = tid; i < DB_ROWS * 8; i += blockDim.x) old[(i / 8) * pitch + n + i % 8] = from_f32<T>(0.0f);
    for (int s = 0; s < stages; ++s) {
        T *xs = (T *)(stage0 + s * sbytes + 3 * wbytes);
        for (int i = m * Db<T>::XP + tid; i < mp * Db<T>::XP; i += blockDim.x) xs[i] = from_f32<T>(0.0f);
    }
    if (tid == 0) {
        for (int s = 0; s < stages; ++s) mbar_init(bars + 8 * s, x_threads ? 1 + blockDim.x : 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    // lane 0 of warp 0 arms the stage, then warp 0's lanes issue its bulk copies; x's segments
    // come by bulk copies too, or (x_threads) by every thread's 16-byte cp.async, each thread
    // then arriving on the stage's mbarrier once its copies land
    auto issue = [&](size_t i) {
        const size_t tile = blockIdx.x + i * gridDim.x;
        if (tile >= tiles) return;
        const int s = (int)(i % stages), rows = (int)min((size_t)DB_ROWS, k - DB_ROWS * tile);
        const u32 dst = (u32)__cvta_generic_to_shared(stage0 + s * sbytes), bar = bars + 8 * s;
        const u32 seg = rows * (u32)sizeof(T), xrow = Db<T>::XP * sizeof(T);
        const T *xt = x + DB_ROWS * tile;
        if (warp == 0) {
            if (lane == 0) mbar_expect(bar, 3 * rows * n * 4 + (x_threads ? 0 : m * seg));
            __syncwarp();
            if (lane < 3) {
                const float *src = lane == 0 ? w : lane == 1 ? mu : nu;
                bulk_load(dst + lane * wbytes, src + DB_ROWS * tile * n, rows * n * 4, bar);
            }
            for (int b = lane; b < m && !x_threads; b += 32)
                bulk_load(dst + 3 * wbytes + b * xrow, xt + (size_t)b * k, seg, bar);
        }
        if (x_threads) {
            const int pieces = seg / 16;
            for (int c = tid; c < m * pieces; c += blockDim.x) {
                const int b = c / pieces, j = c % pieces;
                cp_async16(dst + 3 * wbytes + b * xrow + 16 * j,
                           (const char *)(xt + (size_t)b * k) + 16 * j, true);
            }
            asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar)
                         : "memory");
        }
    };
    for (int i = 0; i + 1 < stages; ++i) issue(i);
    for (size_t i = 0; blockIdx.x + i * gridDim.x < tiles; ++i) {
        const size_t tile = blockIdx.x + i * gridDim.x;
        const int s = (int)(i % stages), rows = (int)min((size_t)DB_ROWS, k - DB_ROWS * tile);
        unsigned char *st = stage0 + s * sbytes;
        float *sw = (float *)st, *smu = sw + DB_ROWS * n, *snu = smu + DB_ROWS * n;
        const T *xs = (const T *)(st + 3 * wbytes);
        mbar_wait(bars + 8 * s, (u32)((i / stages) & 1));
        // dw: warp w takes slices 2w, 2w + 1
        float acc[2][4] = {};
        dw_tile<T>(xs, dys, pitch, ns, mp / Db<T>::KSTEP, warp, lane, acc);
        {
            const int g = lane >> 2, t = lane & 3;
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int col = 8 * (2 * warp + c) + 2 * t;
                if (2 * warp + c < ns) {
                    *(float2 *)(dwt + g * pitch + col) = make_float2(acc[c][0], acc[c][1]);
                    *(float2 *)(dwt + (g + 8) * pitch + col) = make_float2(acc[c][2], acc[c][3]);
                }
            }
        }
        __syncthreads();
        // the old weight for dx, then Adam on the stage's w, mu, nu, four columns a thread
        for (int q = tid; q < DB_ROWS * n / 4; q += blockDim.x) {
            const int r = 4 * q / n, c = 4 * q % n;
            float4 wv = ((float4 *)sw)[q], mv = ((float4 *)smu)[q], vv = ((float4 *)snu)[q];
            const float4 gv = *(const float4 *)(dwt + r * pitch + c);
            store_old<T>(old + r * pitch + c, wv);
            adam_one(wv.x, gv.x, mv.x, vv.x, h);
            adam_one(wv.y, gv.y, mv.y, vv.y, h);
            adam_one(wv.z, gv.z, mv.z, vv.z, h);
            adam_one(wv.w, gv.w, mv.w, vv.w, h);
            ((float4 *)sw)[q] = wv, ((float4 *)smu)[q] = mv, ((float4 *)snu)[q] = vv;
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();
        if (tid == 0) {
            const size_t off = DB_ROWS * tile * n;
            const u32 src = (u32)__cvta_generic_to_shared(st), bytes = rows * n * 4;
            bulk_store(w + off, src, bytes);
            bulk_store(mu + off, src + wbytes, bytes);
            bulk_store(nu + off, src + 2 * wbytes, bytes);
            asm volatile("cp.async.bulk.commit_group;" ::: "memory");
            // the stage of tile i - 1 is read out before the next copy refills it
            asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
        }
        issue(i + stages - 1);
        // dx: warp w takes batch rows 16 w .. 16 w + 15
        if (dx && 16 * warp < m) {
            float d[2][4] = {};
            dx_tile<T>(dys, old, pitch, n, warp, lane, d);
            const int g = lane >> 2, t = lane & 3;
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int r = 8 * c + 2 * t;
                const int b0 = 16 * warp + g, b1 = b0 + 8;
                if (r < rows) {
                    T *p = dx + DB_ROWS * tile + r;
                    if (b0 < m) store_pair<T>(p + (size_t)b0 * k, d[c][0], d[c][1]);
                    if (b1 < m) store_pair<T>(p + (size_t)b1 * k, d[c][2], d[c][3]);
                }
            }
        }
    }
    if (tid == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif // before sm_90 no bulk copies: the launcher never runs it there
}

// dense_adam_bulk_<dtype>: blocks of DB_WARPS warps, at most one a multiprocessor (its shared
// memory), `stages` >= 3 stages; x_threads: x's segments by the threads' cp.async (1) or by
// bulk copies (0).
#define DENSE_ADAM_BULK(T, s)                                                                  \
    extern "C" __global__ void __launch_bounds__(32 * DB_WARPS, 1)                            \
        dense_adam_bulk_##s(const T *x, const T *dy, float *w, float *mu, float *nu, T *dx,    \
                            AdamHyper h, int m, int n, size_t k, int stages, int x_threads) {  \
        dense_adam_bulk_t<T>(x, dy, w, mu, nu, dx, h, m, n, k, stages, x_threads);             \
    }
FOR_FLOATS(DENSE_ADAM_BULK)
