// dense_mma.cu: the dense update in one pass on the tensor cores (ops::dense_adam under TF32
// past adam.cu's one-pass FMA kernel).

// A dense layer's backward pass with Adam on its f32 weight in one pass over the weight on the
// tensor cores, for a batch of 17 to 128 rows and n <= 128 outputs, n % 8 == 0 (ops::dense_adam
// under Precision::Tf32: the seed's Dense(128) at batch 100). The contract of dense_adam_rows:
// x [m, k], dy [m, n], w, mu, nu [k, n] f32, dx [m, k] (null: not computed; may be x itself).
//
// A warp takes 16 weight rows (a strip) at a time, with all n columns:
//   dw[16, n]   = x[:, strip]^T · dy   (mma m16n8k8, A = x^T, K = the batch, 8 rows a step);
//   dx^T[16, m] = w_old[strip] · dy^T  (A = the strip's old weight, K = n, 8 columns a step);
// then Adam (adam_tf32) on w, mu, nu in the accumulators' layout: lane 4g + t holds rows g and
// g + 8 of columns 8c + 2t and 8c + 2t + 1 of each 8-column slice c, of dw's accumulators and
// of the weight and moments it reads. That layout is the second product's A operand too: an
// mma's K may be permuted as long as A and B agree, and slots t, t + 4 of lane (g, t) are taken
// as columns 8c + 2t, 8c + 2t + 1, where B (dy, staged once in shared memory) is read.
// Operands are rounded to TF32 (cvt.rna) and summed in f32: the precision of the TF32 GEMMs the
// chunked path runs. dw never leaves registers.
//
// Memory: the strip's w, mu, nu stream through two warp-private shared-memory stages of 32
// columns (cp.async, 16-byte copies), the next quarter in flight while this one is used; x's
// columns of the next strip are asked of L2 a strip ahead. One block of DM_WARPS warps a
// multiprocessor (its shared memory), up to 255 registers each. The strip's x is loaded before
// its dx is stored (the mmas between need every lane's loads), so an in-place dx is safe.
#define DM_WARPS 8
#define DM_SLICES 16           // 8-column slices: n <= 128
#define DM_PITCH 40            // words a staged row: 32 columns + 8 (conflict-free float2 reads)
#define DM_STAGE (3 * 16 * DM_PITCH) // words of a stage: w, mu, nu's 16 rows of 32 columns

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
        const u32 a[4] = {tf32_bits(b0 < m && lo ? x0[0] : 0.0f),
                          tf32_bits(b0 < m && hi ? x0[8] : 0.0f),
                          tf32_bits(b1 < m && lo ? x1[0] : 0.0f),
                          tf32_bits(b1 < m && hi ? x1[8] : 0.0f)};
        const u32 *d0 = dys + b0 * pitch + g, *d1 = dys + b1 * pitch + g;
#pragma unroll
        for (int c = 0; c < DM_SLICES; ++c) {
            if (c < ns) mma_sync<float>(acc[c], a, d0[8 * c], d1[8 * c]);
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
    const u32 a[4] = {tf32_bits(wl.x), tf32_bits(wh.x), tf32_bits(wl.y), tf32_bits(wh.y)};
    const u32 *d = dys + g * pitch + 8 * c + 2 * t;
#pragma unroll
    for (int b = 0; b < MB; ++b) {
        const uint2 bb = *(const uint2 *)(d + 8 * b * pitch);
        mma_sync<float>(dxa[b], a, bb.x, bb.y);
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
        dys[i] = b < m && j < n ? tf32_bits(dy[(size_t)b * n + j]) : 0u;
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

// Full fp32's dense gradients of a chunk of weight rows in 3xTF32, for the dense update by
// chunks (ops::dense_adam under Precision::Highest, where Adam then runs on the chunk:
// adam_vec_f32). x [m, ldx] holds the chunk's `rows` columns (the caller offsets it), dy [m, n],
// w [rows, n] (the old weight), g [rows, n] (dw, written), dx like x (null: not computed; may be
// x itself). A warp takes 16 weight rows (a strip) at a time:
//   g[16, n]    = x[:, strip]^T · dy   (as dense_adam_mma_t's dw: A = x^T, K = the batch);
//   dx^T[16, m] = w[strip] · dy^T      (A = the strip's weight, K = n, slots t, t + 4 of lane
//                                       (g, t) taken as columns 8c + 2t, 8c + 2t + 1);
// each operand split into its TF32 rounding and rounded rest (tf32_parts), three mma.sync
// m16n8k8 a product (mma_x3), f32 sums: f32's accuracy on the tensor cores. dy's two parts are
// staged once a block, [8 MB][pitch] words each; x's next 4 values and the next slice of w are
// loaded one step ahead. The strip's x is read (dw) before its dx is written, so an in-place dx
// is safe. An infinite operand gives NaN (0 times it, of the parts) where cuBLAS's f32 GEMM
// gives an infinity: non-finite either way. Blocks of DG_WARPS warps, up to 128 registers (two
// a Hopper multiprocessor up to 104 batch rows into 128 outputs), any grid.
#define DG_WARPS 8

// d += a b in 3xTF32 (a = ab + as, b = bb + bs): the rests' products first, then the roundings'.
__device__ __forceinline__ void mma_x3(float (&d)[4], const u32 (&ab)[4], const u32 (&as)[4],
                                       u32 bb0, u32 bb1, u32 bs0, u32 bs1) {
    mma_sync<float>(d, as, bb0, bb1);
    mma_sync<float>(d, ab, bs0, bs1);
    mma_sync<float>(d, ab, bb0, bb1);
}

template <int MB>
__device__ __forceinline__ void dense_grads_x3_t(const float *x, const float *__restrict__ dy,
                                                 const float *__restrict__ w, float *__restrict__ g,
                                                 float *dx, int m, int n, size_t rows, size_t ldx) {
    extern __shared__ __align__(16) u32 dg_smem[];
    const int pitch = ((n + 31) & ~31) + 8, ns = n / 8;
    u32 *big = dg_smem, *small = dg_smem + MB * 8 * pitch;
    for (int i = threadIdx.x; i < MB * 8 * pitch; i += blockDim.x) {
        const int b = i / pitch, j = i % pitch;
        tf32_parts(b < m && j < n ? dy[(size_t)b * n + j] : 0.0f, big[i], small[i]);
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, gr = lane >> 2, t = lane & 3;
    const size_t strips = (rows + 15) / 16;
    WARP_STRIDE(s, strips) {
        const size_t r_lo = 16 * s + gr, r_hi = r_lo + 8;
        const bool lo = r_lo < rows, hi = r_hi < rows;
        {
            float acc[16][4];
#pragma unroll
            for (int c = 0; c < 16; ++c) acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.0f;
            // x's 4 values of step kb (rows b0 = 8 kb + t, b1 = b0 + 4; columns r_lo, r_hi),
            // loaded one step ahead
            auto xload = [&](int kb, float (&v)[4]) {
                const int b0 = 8 * kb + t, b1 = b0 + 4;
                const float *x0 = x + (size_t)b0 * ldx + r_lo, *x1 = x + (size_t)b1 * ldx + r_lo;
                v[0] = b0 < m && lo ? x0[0] : 0.0f;
                v[1] = b0 < m && hi ? x0[8] : 0.0f;
                v[2] = b1 < m && lo ? x1[0] : 0.0f;
                v[3] = b1 < m && hi ? x1[8] : 0.0f;
            };
            float v[4];
            xload(0, v);
#pragma unroll 1
            for (int kb = 0; kb < MB; ++kb) {
                u32 ab[4], as[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) tf32_parts(v[i], ab[i], as[i]);
                if (kb + 1 < MB) xload(kb + 1, v);
                const int o0 = (8 * kb + t) * pitch + gr, o1 = o0 + 4 * pitch;
#pragma unroll
                for (int c = 0; c < 16; ++c) {
                    if (c < ns)
                        mma_x3(acc[c], ab, as, big[o0 + 8 * c], big[o1 + 8 * c],
                               small[o0 + 8 * c], small[o1 + 8 * c]);
                }
            }
#pragma unroll
            for (int c = 0; c < 16; ++c) {
                if (c >= ns) break;
                const size_t p = r_lo * n + 8 * c + 2 * t;
                if (lo) *(float2 *)(g + p) = make_float2(acc[c][0], acc[c][1]);
                if (hi) *(float2 *)(g + p + 8 * (size_t)n) = make_float2(acc[c][2], acc[c][3]);
            }
        }
        if (!dx) continue;
        float dxa[MB][4];
#pragma unroll
        for (int b = 0; b < MB; ++b) dxa[b][0] = dxa[b][1] = dxa[b][2] = dxa[b][3] = 0.0f;
        // the strip's old weight, columns 8 c + 2 t, + 1 of rows r_lo, r_hi: one slice ahead
        auto wload = [&](int c, float2 &wl, float2 &wh) {
            const size_t p = r_lo * n + 8 * c + 2 * t;
            wl = lo ? *(const float2 *)(w + p) : make_float2(0.0f, 0.0f);
            wh = hi ? *(const float2 *)(w + p + 8 * (size_t)n) : make_float2(0.0f, 0.0f);
        };
        float2 wl, wh;
        wload(0, wl, wh);
#pragma unroll 1
        for (int c = 0; c < ns; ++c) {
            u32 ab[4], as[4];
            tf32_parts(wl.x, ab[0], as[0]);
            tf32_parts(wh.x, ab[1], as[1]);
            tf32_parts(wl.y, ab[2], as[2]);
            tf32_parts(wh.y, ab[3], as[3]);
            if (c + 1 < ns) wload(c + 1, wl, wh);
            const int o = gr * pitch + 8 * c + 2 * t;
#pragma unroll
            for (int b = 0; b < MB; ++b) {
                const uint2 bb = *(const uint2 *)(big + o + 8 * b * pitch);
                const uint2 bs = *(const uint2 *)(small + o + 8 * b * pitch);
                mma_x3(dxa[b], ab, as, bb.x, bb.y, bs.x, bs.y);
            }
        }
#pragma unroll
        for (int b = 0; b < MB; ++b) {
            const int b0 = 8 * b + 2 * t, b1 = b0 + 1;
            if (b0 < m && lo) dx[(size_t)b0 * ldx + r_lo] = dxa[b][0];
            if (b1 < m && lo) dx[(size_t)b1 * ldx + r_lo] = dxa[b][1];
            if (b0 < m && hi) dx[(size_t)b0 * ldx + r_hi] = dxa[b][2];
            if (b1 < m && hi) dx[(size_t)b1 * ldx + r_hi] = dxa[b][3];
        }
    }
}

// dense_grads_x3_mb<MB> for MB = 1 .. 16 (a batch of 8 MB - 7 to 8 MB rows), n a multiple of 8
// up to 128: blocks of DG_WARPS warps, any grid; dynamic shared memory 8 * 8 MB (roundup(n, 32)
// + 8) bytes.
#define DENSE_GRADS_X3(MB)                                                                     \
    extern "C" __global__ void __launch_bounds__(32 * DG_WARPS, 2)                            \
        dense_grads_x3_mb##MB(const float *x, const float *dy, const float *w, float *g,       \
                              float *dx, int m, int n, size_t rows, size_t ldx) {              \
        dense_grads_x3_t<MB>(x, dy, w, g, dx, m, n, rows, ldx);                                \
    }
DENSE_GRADS_X3(1)
DENSE_GRADS_X3(2)
DENSE_GRADS_X3(3)
DENSE_GRADS_X3(4)
DENSE_GRADS_X3(5)
DENSE_GRADS_X3(6)
DENSE_GRADS_X3(7)
DENSE_GRADS_X3(8)
DENSE_GRADS_X3(9)
DENSE_GRADS_X3(10)
DENSE_GRADS_X3(11)
DENSE_GRADS_X3(12)
DENSE_GRADS_X3(13)
DENSE_GRADS_X3(14)
DENSE_GRADS_X3(15)
DENSE_GRADS_X3(16)
