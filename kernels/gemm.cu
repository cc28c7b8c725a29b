// gemm.cu: the mixed-precision dense product c = a · round(b), a [m, k] bf16 or f16 and c
// [m, n] of a's dtype, b [k, n] f32 rounded to a's dtype as it is read (from shared memory into
// registers, no rounded copy of b), all row-major, m <= 128, k % 8 == 0, n % 4 == 0, 16-byte aligned.
// Products are summed in f32 on the tensor cores (mma.sync m16n8k16, f32 accumulators).
// Its f32 form (GEMM_F32X3: a and c f32 too, k % 4 == 0) is full fp32's dense product in
// 3xTF32: each operand split into its TF32 rounding and the rounded rest (tf32_small) as read,
// three mma.sync m16n8k8 a product, small terms first (f32's accuracy).
//
// The product is computed transposed, c^T = b^T · a^T: b^T is the mma's A operand (16 output
// columns per tile), a^T its B operand (8 rows of a per tile). Split-K: block (x: split of k,
// y: 128 columns of n) sums its k range into an f32 partial part[split][m][n], and
// gemm_wf32_reduce adds the splits in order (deterministic) and rounds once.
//
// Register mapping. Lane = 4 g + t. Each warp owns 32 columns; the two mma tiles' rows g,
// g + 8 of lane g are the columns col + 0..3 (col = 4 g), so one float4 load of b gives a
// lane its four columns of one b row (one 16-byte shared load). Each step covers 32 k; within a step's two k16 mmas,
// the slots 2t, 2t+1 and 2t+8, 2t+9 of lane t are the k values 8t + 4s + {0, 1} and
// 8t + 4s + {2, 3} (s = 0, 1) in both operands: a bijection of the 32 k, so the sum is the
// product's, and a lane reads 8 consecutive k of a row of a as one 16-byte load.

#define GEMM_TILES 8 // 8-row tiles of a per warp: two warps of rows, m <= 128

// The kinds of a: bf16 or f16 (b rounded to it), or f32 (3xTF32).
#define GEMM_BF16 0
#define GEMM_F16 1
#define GEMM_F32X3 2

// Two f32 rounded to one packed pair of the 16-bit dtype, lo in the low half.
template <bool BF16> __device__ __forceinline__ u32 pack2(float lo, float hi) {
    u32 r;
    if (BF16) {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    } else {
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    }
    return r;
}

template <bool BF16>
__device__ __forceinline__ void mma16816(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    if (BF16) {
        mma_sync<bf16_t>(d, a, b0, b1);
    } else {
        mma_sync<f16_t>(d, a, b0, b1);
    }
}

__device__ __forceinline__ float lane_of(const float4 &v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Blocks of 256 threads, two per multiprocessor (8 warps: warp & 3 picks 32 of the block's 128
// columns, warp >> 2 the rows 0..63 or 64..127), grid (splits, ceil(n / 128)); each split sums
// k_per_split (a multiple of 32) values of k into part[split]. Steps of 32 k stream through
// GS_STAGES shared-memory stages by cp.async (zero-filled past k, m and n), so each block has
// two steps in flight while the tensor cores work on a third; the dynamic shared memory is
// GS_STAGES * GemmStage<A>::bytes (76,800 bytes; 107,520 for f32 a).
#define GS_STAGES 3
// Stage layout of b: lane (g, t) reads its k = 8t + i (i < 8) of columns 4g..4g+3 at
// i * 4 * PITCH + t * PITCH + 16 * (column / 4); the pitch of 512 + 32 bytes puts the 8 lanes of
// a 16-byte load phase on distinct banks. Rows of 16-bit a are 64 bytes (conflict-free as they
// are); rows of f32 a 128 + 16, which puts a 16-byte load phase's lanes (two rows, four t) on
// distinct banks.
#define GS_W_PITCH 544
#define GS_W_BYTES (8 * 4 * GS_W_PITCH) // a stage's 32 k x 128 columns of b
template <int A> struct GemmStage {
    static constexpr u32 x_pitch = A == GEMM_F32X3 ? 144 : 64; // bytes a row of a
    static constexpr u32 bytes = GS_W_BYTES + 128 * x_pitch;    // b, then 128 rows x 32 k of a
};

// The four f32 at shared address `at`.
__device__ __forceinline__ float4 ld_shared4(u32 at) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0,%1,%2,%3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(at));
    return v;
}

// The lane's four columns of b at k = 8t + first .. 8t + first + 3 of the stage (wbase: the
// lane's t and columns).
__device__ __forceinline__ void load_b4(u32 wbase, int first, float4 (&w)[4]) {
#pragma unroll
    for (int i = 0; i < 4; i++) w[i] = ld_shared4(wbase + (first + i) * (4 * GS_W_PITCH));
}

// A step of 32 k of the 16-bit kinds: per two k16 mmas, the warp's b^T A fragments rounded to
// a's dtype, then each row tile's a (8 consecutive k a lane, one 16-byte load).
template <bool BF16>
__device__ __forceinline__ void step_16(u32 wbase, u32 xbase, u32 tiles,
                                        float (&acc)[2][GEMM_TILES][4]) {
    u32 af[2][2][4];
#pragma unroll
    for (int s = 0; s < 2; s++) {
        float4 w[4];
        load_b4(wbase, 4 * s, w);
#pragma unroll
        for (int mt = 0; mt < 2; mt++) {
            const int lo = 2 * mt, hi = 2 * mt + 1;
            af[s][mt][0] = pack2<BF16>(lane_of(w[0], lo), lane_of(w[1], lo));
            af[s][mt][1] = pack2<BF16>(lane_of(w[0], hi), lane_of(w[1], hi));
            af[s][mt][2] = pack2<BF16>(lane_of(w[2], lo), lane_of(w[3], lo));
            af[s][mt][3] = pack2<BF16>(lane_of(w[2], hi), lane_of(w[3], hi));
        }
    }
#pragma unroll
    for (int j = 0; j < GEMM_TILES; j++) {
        if (j < tiles) {
            uint4 xv;
            asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
                         : "=r"(xv.x), "=r"(xv.y), "=r"(xv.z), "=r"(xv.w)
                         : "r"(xbase + j * 8 * 64));
            mma16816<BF16>(acc[0][j], af[0][0], xv.x, xv.y);
            mma16816<BF16>(acc[1][j], af[0][1], xv.x, xv.y);
            mma16816<BF16>(acc[0][j], af[1][0], xv.z, xv.w);
            mma16816<BF16>(acc[1][j], af[1][1], xv.z, xv.w);
        }
    }
}

// A step of 32 k in 3xTF32: four k8 mmas, the q-th on slots t, t + 4 = k 8t + 2q, 8t + 2q + 1
// of both operands (a bijection of the 32 k), in two halves of two (within 128 registers). A
// half's A fragments (b^T: rows g, g + 8 of tile mt = columns 4g + 2mt, 4g + 2mt + 1) are split
// once; each row tile's 4 k of a (one 16-byte load) is its B operand. A half's six mmas sum
// into a fresh accumulator, added to the running sum by an f32 add (as CUTLASS's 3xTF32
// mainloop): with one accumulator over the whole split the product was 1.37e-5 off the CPU's
// f32 norm-wise (k = 512,000, H100, 2026-12-07).
__device__ __forceinline__ void step_x3(u32 wbase, u32 xbase, u32 tiles,
                                        float (&acc)[2][GEMM_TILES][4]) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float4 w[4];
        load_b4(wbase, 4 * h, w);
        u32 big[2][2][4], small[2][2][4]; // [q - 2h][mt]
#pragma unroll
        for (int q = 0; q < 2; q++) {
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                const float v[4] = {lane_of(w[2 * q], 2 * mt), lane_of(w[2 * q], 2 * mt + 1),
                                    lane_of(w[2 * q + 1], 2 * mt),
                                    lane_of(w[2 * q + 1], 2 * mt + 1)};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    big[q][mt][e] = tf32_bits(v[e]);
                    small[q][mt][e] = tf32_small(v[e], big[q][mt][e]);
                }
            }
        }
#pragma unroll
        for (int j = 0; j < GEMM_TILES; j++) {
            if (j < tiles) {
                const float4 x =
                    ld_shared4(xbase + j * 8 * GemmStage<GEMM_F32X3>::x_pitch + 16 * h);
                float part[2][4] = {};
#pragma unroll
                for (int q = 0; q < 2; q++) {
                    const float b0 = lane_of(x, 2 * q), b1 = lane_of(x, 2 * q + 1);
                    const u32 h0 = tf32_bits(b0), h1 = tf32_bits(b1);
                    const u32 l0 = tf32_small(b0, h0), l1 = tf32_small(b1, h1);
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        mma_sync<float>(part[mt], small[q][mt], h0, h1);
                        mma_sync<float>(part[mt], big[q][mt], l0, l1);
                        mma_sync<float>(part[mt], big[q][mt], h0, h1);
                    }
                }
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[mt][j][e] += part[mt][e];
                }
            }
        }
    }
}

template <int A>
__device__ void gemm_wf32(const void *a, const float *b, float *part, u32 m, u64 k, u32 n,
                          u64 k_per_split) {
    using Stage = GemmStage<A>;
    extern __shared__ __align__(16) unsigned char smem[];
    const u32 s0 = (u32)__cvta_generic_to_shared(smem);
    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const u32 g = lane >> 2, t = lane & 3;
    const u32 block_col = blockIdx.y * 128;
    const u32 warp_col = block_col + (warp & 3) * 32;
    const u32 row0 = (warp >> 2) * 8 * GEMM_TILES;
    const bool active = warp_col < n && row0 < m; // warp-uniform
    const u32 col = warp_col + 4 * g;
    const bool col_ok = col < n;
    const u32 tiles = row0 < m ? min((m - row0 + 7) / 8, (u32)GEMM_TILES) : 0;
    const u64 k_begin = (u64)blockIdx.x * k_per_split;
    const u64 k_end = min(k, k_begin + k_per_split);
    const u64 steps = k_end > k_begin ? (k_end - k_begin + 31) / 32 : 0;
    auto load = [&](u64 step) {
        const u32 base = s0 + (u32)(step % GS_STAGES) * Stage::bytes;
        const u64 kb = k_begin + 32 * step;
#pragma unroll
        for (int q = 0; q < 4; q++) { // 1024 chunks of 4 f32 of b
            const u32 c = tid + 256 * q, kl = c >> 5, cg = c & 31;
            const u64 kk = kb + kl;
            const u32 cc = block_col + 4 * cg;
            const bool ok = kk < k_end && cc < n;
            const u32 dst = base + (kl & 7) * (4 * GS_W_PITCH) + (kl >> 3) * GS_W_PITCH + cg * 16;
            cp_async16(dst, ok ? (const void *)(b + kk * n + cc) : (const void *)b, ok);
        }
        // a: 16-byte chunks of 8 16-bit elements (4 a row) or 4 f32 (8 a row)
        constexpr u32 per_row = A == GEMM_F32X3 ? 8 : 4, elems = 32 / per_row;
#pragma unroll
        for (int q = 0; q < 128 * per_row / 256; q++) {
            const u32 c = tid + 256 * q, r = c / per_row, tt = c % per_row;
            const u64 kk = kb + elems * tt;
            const bool ok = r < m && kk < k_end;
            const u32 dst = base + GS_W_BYTES + r * Stage::x_pitch + tt * 16;
            const u64 at = ((u64)r * k + kk) * (A == GEMM_F32X3 ? 4 : 2);
            cp_async16(dst, ok ? (const void *)((const char *)a + at) : a, ok);
        }
    };
    float acc[2][GEMM_TILES][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++) {
#pragma unroll
        for (int j = 0; j < GEMM_TILES; j++) {
            acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.0f;
        }
    }
#pragma unroll
    for (int s = 0; s < GS_STAGES - 1; s++) {
        if (s < steps) {
            load(s);
        }
        asm volatile("cp.async.commit_group;");
    }
    for (u64 it = 0; it < steps; it++) {
        asm volatile("cp.async.wait_group %0;" ::"n"(GS_STAGES - 2));
        __syncthreads();
        if (it + GS_STAGES - 1 < steps) {
            load(it + GS_STAGES - 1);
        }
        asm volatile("cp.async.commit_group;");
        if (!active) {
            continue;
        }
        const u32 base = s0 + (u32)(it % GS_STAGES) * Stage::bytes;
        const u32 wbase = base + t * GS_W_PITCH + ((warp & 3) * 8 + g) * 16;
        // lane t's 8 k of row row0 + g (+ 8 j): 16 or 32 bytes at 16 t or 32 t
        const u32 xbase = base + GS_W_BYTES + (row0 + g) * Stage::x_pitch +
                          t * (A == GEMM_F32X3 ? 32 : 16);
        if constexpr (A == GEMM_F32X3) {
            step_x3(wbase, xbase, tiles, acc);
        } else {
            step_16<A == GEMM_BF16>(wbase, xbase, tiles, acc);
        }
    }
    if (!active || !col_ok) {
        return;
    }
    float *out = part + (u64)blockIdx.x * m * n;
#pragma unroll
    for (int j = 0; j < GEMM_TILES; j++) {
        const u32 r = row0 + 8 * j + 2 * t;
        if (j < tiles && r < m) {
            *(float4 *)(out + (u64)r * n + col) =
                make_float4(acc[0][j][0], acc[0][j][2], acc[1][j][0], acc[1][j][2]);
        }
        if (j < tiles && r + 1 < m) {
            *(float4 *)(out + (u64)(r + 1) * n + col) =
                make_float4(acc[0][j][1], acc[0][j][3], acc[1][j][1], acc[1][j][3]);
        }
    }
}

// c[i] = the sum over the splits of part[s][i], rounded once, i < mn. Blocks of 256 threads,
// ceil(mn / 32) of them: lane l of warp q sums the splits q, q + 8, ... of output 32 x + l in
// order, then warp 0 adds the 8 sums in order (deterministic).
template <typename T>
__device__ void gemm_wf32_reduce(const float *part, T *c, size_t mn, size_t splits) {
    __shared__ float sums[8][32];
    const u32 lane = threadIdx.x & 31, q = threadIdx.x >> 5;
    const size_t i = (size_t)blockIdx.x * 32 + lane;
    float sum = 0.0f;
    for (size_t s = q; i < mn && s < splits; s += 8) {
        sum += part[s * mn + i];
    }
    sums[q][lane] = sum;
    __syncthreads();
    if (q == 0 && i < mn) {
        float total = 0.0f;
        for (int r = 0; r < 8; r++) {
            total += sums[r][lane];
        }
        c[i] = from_f32<T>(total);
    }
}

// gemm_wf32_<S>: a of T (f32: the 3xTF32 form, gemm_wf32_f32x3), its partials' reduction
// gemm_wf32_reduce_<S>.
#define GEMM_KERNELS(T, S, KIND, NAME)                                                         \
    extern "C" __global__ void __launch_bounds__(256, 2)                                       \
        gemm_wf32_##NAME(const T *a, const float *b, float *part, u32 m, u64 k, u32 n,        \
                         u64 k_per_split) {                                                    \
        gemm_wf32<KIND>(a, b, part, m, k, n, k_per_split);                                     \
    }                                                                                          \
    extern "C" __global__ void gemm_wf32_reduce_##S(const float *part, T *c, size_t mn,        \
                                                    size_t splits) {                           \
        gemm_wf32_reduce<T>(part, c, mn, splits);                                              \
    }

GEMM_KERNELS(bf16_t, bf16, GEMM_BF16, bf16)
GEMM_KERNELS(f16_t, f16, GEMM_F16, f16)
GEMM_KERNELS(float, f32, GEMM_F32X3, f32x3)
