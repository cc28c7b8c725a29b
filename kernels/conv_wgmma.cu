// conv_wgmma.cu: a 3x3, stride-1, undilated convolution from 64 to 64 channels (NHWC f32 x and
// y, an HWIO kernel) in full fp32 as 3xTF32 on Hopper's warpgroup tensor cores
// (wgmma.mma_async, sm_90a): the forward pass with bias, ReLU and its mask, and, on dy with the
// kernel flipped and transposed (conv_wgmma_pack's flip) and the padding mirrored, the
// backward-data pass. The seed's conv2, ResNet-50's first 3x3 convs.
//
// The GEMM: y[p, co] = sum over k = (tap, ci) of X[p, k] W[k, co], M = a tile's 128 output
// positions (64 a warpgroup, two a block), N = the 64 output channels, K = 9 taps of 64.
// A (X) comes from registers: each thread loads its fragment (PTX ISA, "Register Fragments",
// wgmma .m64nNk8 .tf32: rows 16 w + g and + 8, k-slots t and t + 4 of lane 4 g + t) from the
// staged input with one 16-byte shared load per row and k-pair, and splits it there into its
// TF32 rounding `big` and the rounded rest `small`. B (W) comes from shared memory: each tap's
// two parts, packed once a pass by conv_wgmma_pack in the K-major, unswizzled core-matrix layout
// (8 output channels x 16 bytes; LBO 128 bytes between the two 4-k halves of a k-step, SBO 256
// between 8-channel groups), are copied a tap ahead into a ring of 3 buffers. A k-step's 8
// k-slots are a permutation of 8 of the tap's channels, the same for A and B: slot j of k-step
// 2 c + h is channel 16 c + 4 (j % 4) + 2 h + j / 4, so that lane t's float4 of channels
// 16 c + 4 t .. + 3 feeds both k-steps of k-pair c. d += A_big B_small + A_small B_big +
// A_big B_big, about f32's accuracy (the scheme of CUTLASS's 3xTF32 GEMMs).
//
// Staging: a tile's positions are consecutive in (n, oy, ox) order and may span output rows
// (segments). For each kernel row r the tile's input positions are staged as one strip of
// entries: segment s's positions m take entries m + 2 s .. m + 2 s + 2 (taps kx = 0..2), so
// tap kx of position m is entry e(m) + kx with e(m) = m + 2 s(m), the two halo entries of each
// segment between them. An entry is a position's 64 channels, 256 bytes, its 16-byte chunks
// XOR-swizzled by the entry's parity (chunk c at c ^ 4 (e & 1)) so that the 8 lanes of a
// quarter-warp's loads (two entries, four chunks each) hit distinct banks. Zeros outside the
// input (cp.async zero-fill). Strip r of the next tile is copied once this tile's taps of row r
// have been loaded (at taps 3, 6 and the next tile's 0), six taps before it is read.
//
// Per tap, one barrier: the tap's B copies (issued a tap earlier) and any strip copies have
// landed; the next tap's B goes into the buffer of two taps back, whose products each
// warpgroup waited for (wgmma.wait_group 1 after each k-pair's group of 6 products). A
// k-pair's A is loaded while the previous group runs and split once that group's A registers
// are free (two register sets).
//
// Non-finite inputs: a NaN in x or w gives NaN in y, as in f32; an infinite operand's rest is
// Inf - Inf = NaN, rounded to a signed zero, so an Inf gives Inf where its products are
// finite, but NaN where a product pairs it with a zero part (as Inf * 0 in f32), including a
// zero rest of the other operand: f32 sums may give Inf there.

#define CW_THREADS 256                      // two warpgroups
#define CW_TILE 128                         // output positions a tile, 64 a warpgroup
#define CW_SEGS 10                          // most output rows a tile spans (out_w >= 15)
#define CW_ENTRIES (CW_TILE + 2 * CW_SEGS)  // entries of a strip
#define CW_STRIP (CW_ENTRIES * 256)         // bytes of a strip
#define CW_PART 16384                       // bytes of one part of a tap: 8 k-steps x 64 x 8
#define CW_TAP (2 * CW_PART)                // a tap's B: big, then small
#define CW_BUFS 3
#define CW_SMEM (3 * CW_STRIP + CW_BUFS * CW_TAP)
// The launcher's copy (CONV_WGMMA_SMEM, crates/stax-tensor/src/cuda/kernels/conv_wgmma.rs) and
// Hopper's 232,448 bytes of shared memory a block.
static_assert(CW_SMEM == 211968, "CONV_WGMMA_SMEM");
static_assert(CW_SMEM <= 232448, "shared memory");

// Packs w (HWIO [3][3][64][64]) into the B operand: packed[tap][part][k-step][n/8][k/4][n%8][k%4]
// of TF32 bits, part 0 the rounding, part 1 the rounded rest. flip: the backward-data pass's
// kernel, tap 8 - tap with input and output channels swapped. 9 * 4096 threads' work, any grid.
extern "C" __global__ void conv_wgmma_pack(const float *w, u32 *packed, int flip) {
    GRID_STRIDE(i, (size_t)9 * 4096) {
        const int tap = (int)(i >> 12), o = (int)(i & 4095);
        const int kk = o >> 9, co = 8 * ((o >> 6) & 7) + ((o >> 2) & 7);
        const int ci = 16 * (kk >> 1) + 4 * (o & 3) + 2 * (kk & 1) + ((o >> 5) & 1);
        const float v = flip ? w[((8 - tap) * 64 + co) * 64 + ci] : w[(tap * 64 + ci) * 64 + co];
        u32 big, small;
        tf32_parts(v, big, small);
        packed[(size_t)tap * 8192 + o] = big;
        packed[(size_t)tap * 8192 + 4096 + o] = small;
    }
}

// A tile: positions p0 .. p0 + 127 (of total), starting in output row oy0 of image n0 at column
// ox0, `first` positions in its first segment.
struct CwTile {
    size_t p0, n0;
    int oy0, ox0, first;
};

__device__ __forceinline__ CwTile cw_tile(const WindowGeometry &g, size_t tile) {
    CwTile t;
    t.p0 = tile * CW_TILE;
    const size_t row = t.p0 / g.out_w;
    t.n0 = row / g.out_h;
    t.oy0 = (int)(row - t.n0 * g.out_h);
    t.ox0 = (int)(t.p0 - row * g.out_w);
    t.first = (int)g.out_w - t.ox0;
    return t;
}

// The entry of tap kx = 0 for tile position m: m + 2 (its segment).
__device__ __forceinline__ int cw_entry(const CwTile &t, int m, int ow) {
    return m < t.first ? m : m + 2 + 2 * ((m - t.first) / ow);
}

// Issues this thread's cp.async copies of chunks threadIdx.x + CW_THREADS i, i in [i0, i1), of
// strip r of tile t (input row oy + r - pad_top of each segment) to shared address strip: entry
// chunk / 16, channels 4 (chunk % 16) ..; zeros outside the input and past the last image.
__device__ __forceinline__ void cw_stage_strip(const float *x, const WindowGeometry &g,
                                               const CwTile &t, int r, u32 strip, int i0,
                                               int i1) {
    const int ow = (int)g.out_w, oh = (int)g.out_h;
    const float inv = 1.0f / (float)(ow + 2);
#pragma unroll
    for (int i = i0; i < i1; ++i) {
        const int id = threadIdx.x + CW_THREADS * i;
        if (id >= CW_ENTRIES * 16) break;
        const int e = id >> 4, c = id & 15, v = e - t.first - 2;
        // the segment: v / (ow + 2) by a float reciprocal, corrected (v < 2^8)
        int s = v < 0 ? 0 : (int)((float)v * inv);
        if (v >= 0) s += (s + 1) * (ow + 2) <= v ? 1 : 0, s -= s * (ow + 2) > v ? 1 : 0;
        const int j = v < 0 ? e : v - s * (ow + 2);
        s = v < 0 ? 0 : s + 1;
        size_t n = t.n0;
        int oy = t.oy0 + s;
        while (oy >= oh) oy -= oh, ++n;
        const long iy = (long)oy + r - (long)g.pad_top;
        const long ix = (long)(s == 0 ? t.ox0 : 0) + j - (long)g.pad_left;
        const bool ok = n < g.n && iy >= 0 && iy < (long)g.h && ix >= 0 && ix < (long)g.w;
        const float *src = ok ? x + ((n * g.h + iy) * g.w + ix) * 64 + 4 * c : x;
        cp_async16(strip + e * 256 + ((c ^ ((e & 1) << 2)) << 4), src, ok);
    }
}

// Issues this thread's cp.async copies of tap `tap`'s packed B (both parts) to buffer buf.
__device__ __forceinline__ void cw_stage_tap(const u32 *packed, int tap, u32 buf) {
    const u32 *src = packed + (size_t)tap * 8192;
#pragma unroll
    for (int i = 0; i < CW_TAP / 16 / CW_THREADS; ++i) {
        const int id = threadIdx.x + CW_THREADS * i;
        cp_async16(buf + id * 16, src + 4 * id, true);
    }
}

// The descriptor of a k-step's B at shared address addr: K-major, no swizzle, LBO 128, SBO 256.
__device__ __forceinline__ u64 cw_desc(u32 addr) {
    return (u64)((addr & 0x3ffff) >> 4) | (u64)(128 >> 4) << 16 | (u64)(256 >> 4) << 32;
}

#define CW_F8(i)                                                                               \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
        "+f"(d[i + 6]), "+f"(d[i + 7])

// d += A · B, m64n64k8, A in registers a (a0..a3 of one k-step), B at descriptor b (PTX ISA,
// "wgmma.mma_async"; f32 accumulators: d[4 i + 2 h + v] is row 16 w + g + 8 h, column
// 8 i + 2 t + v).
__device__ __forceinline__ void cw_mma(float (&d)[32], const u32 *a, u64 b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, "
                 "%30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
                 : CW_F8(0), CW_F8(8), CW_F8(16), CW_F8(24)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

// A k-pair's A operand: both k-steps' fragments, big then small.
struct CwA {
    u32 big[8], small[8];
};

// Loads the thread's two rows' chunk of k-pair c of tap (r, kx) (entries ea, eb of tap 0).
__device__ __forceinline__ void cw_load(u32 strips, int r, int kx, int c, int ea, int eb,
                                        float4 &va, float4 &vb) {
    const int t = threadIdx.x & 3, e0 = ea + kx, e1 = eb + kx;
    const u32 base = strips + r * CW_STRIP + ((4 * c + t) << 4);
    const u32 a0 = base + e0 * 256, a1 = base + e1 * 256;
    // the swizzle flips bit 6 of the address (chunk ^ 4) for odd entries
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(va.x), "=f"(va.y), "=f"(va.z), "=f"(va.w)
                 : "r"(a0 ^ ((e0 & 1) << 6)));
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(vb.x), "=f"(vb.y), "=f"(vb.z), "=f"(vb.w)
                 : "r"(a1 ^ ((e1 & 1) << 6)));
}

// Splits the loaded chunks into the k-pair's fragments: k-step h takes channels 2 h, 2 h + 1
// of the chunk as slots t, t + 4 (registers a0 = row g slot t, a1 = row g + 8 slot t, a2 = row
// g slot t + 4, a3 = row g + 8 slot t + 4).
__device__ __forceinline__ void cw_split(const float4 &va, const float4 &vb, CwA &a) {
    const float f[8] = {va.x, vb.x, va.y, vb.y, va.z, vb.z, va.w, vb.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) tf32_parts(f[i], a.big[i], a.small[i]);
}

// Keeps the compiler from moving register accesses across the asynchronous products.
__device__ __forceinline__ void cw_fence_a(CwA &a) {
#pragma unroll
    for (int i = 0; i < 8; ++i) asm volatile("" : "+r"(a.big[i]), "+r"(a.small[i])::"memory");
}

// One k-pair's group: 3 products for each of its two k-steps from B buffer buf.
__device__ __forceinline__ void cw_group(float (&d)[32], CwA &a, u32 buf, int c) {
    cw_fence_a(a);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const u32 at = buf + (2 * c + h) * 2048;
        const u64 big = cw_desc(at), small = cw_desc(at + CW_PART);
        cw_mma(d, a.big + 4 * h, small);
        cw_mma(d, a.small + 4 * h, big);
        cw_mma(d, a.big + 4 * h, big);
    }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

// The tile's outputs: rows m, m + 8 of the thread (positions pa, pa + 8), columns 8 i + 2 t and
// + 1, plus bias; with relu the ReLU (NaN stays) and, when mask, its packed bits (y > 0).
__device__ __forceinline__ void cw_store(const float (&d)[32], const float (&b)[16], float *y,
                                         u32 *mask, int relu, size_t pa, size_t total) {
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const size_t p = pa + 8 * h;
        u32 bits[2] = {0u, 0u};
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            float v0 = d[4 * i + 2 * h] + b[2 * i], v1 = d[4 * i + 2 * h + 1] + b[2 * i + 1];
            bits[i >> 2] |= ((u32)(v0 > 0.0f) | (u32)(v1 > 0.0f) << 1) << (8 * (i & 3) + 2 * t);
            if (relu) v0 = v0 <= 0.0f ? 0.0f : v0, v1 = v1 <= 0.0f ? 0.0f : v1;
            if (p < total) *(float2 *)(y + p * 64 + 8 * i + 2 * t) = make_float2(v0, v1);
        }
        if (mask && relu) {
            const u32 w0 = quad_or(bits[0]), w1 = quad_or(bits[1]);
            if (p < total && t < 2) mask[2 * p + t] = t == 0 ? w0 : w1;
        }
    }
}

// The pass: x [n, h, w, 64] (16-byte aligned), packed (conv_wgmma_pack of the pass's kernel),
// bias null or [64], y [n, out_h, out_w, 64] (8-byte aligned), mask null or y's packed ReLU
// mask; g's kernel 3x3, stride 1, out_w >= 15. Blocks of CW_THREADS threads with CW_SMEM bytes
// of dynamic shared memory, any grid (one a multiprocessor: the shared memory).
extern "C" __global__ void __launch_bounds__(CW_THREADS, 1)
    conv_wgmma_3x3_c64_f32x3(const float *x, const u32 *packed, const float *bias, float *y,
                             u32 *mask, WindowGeometry g, int relu) {
    extern __shared__ __align__(128) unsigned char smem[];
    const u32 strips = (u32)__cvta_generic_to_shared(smem), bufs = strips + 3 * CW_STRIP;
    const size_t total = g.n * g.out_h * g.out_w, tiles = (total + CW_TILE - 1) / CW_TILE;
    if (blockIdx.x >= tiles) return;
    const int ow = (int)g.out_w, lane = threadIdx.x & 31, t = lane & 3;
    const int ma = 16 * (threadIdx.x >> 5) + (lane >> 2); // warpgroup 64 wg + warp 16 w + g
    float b[16];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        b[2 * i] = bias ? bias[8 * i + 2 * t] : 0.0f;
        b[2 * i + 1] = bias ? bias[8 * i + 2 * t + 1] : 0.0f;
    }
    CwTile tl = cw_tile(g, blockIdx.x);
    for (int r = 0; r < 3; ++r) cw_stage_strip(x, g, tl, r, strips + r * CW_STRIP, 0, 10);
    cw_stage_tap(packed, 0, bufs);
    asm volatile("cp.async.commit_group;");
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    int ea = cw_entry(tl, ma, ow), eb = cw_entry(tl, ma + 8, ow);
    CwA a[2];
    {
        float4 va, vb;
        cw_load(strips, 0, 0, 0, ea, eb, va, vb);
        cw_split(va, vb, a[0]);
    }
    u32 j = 0; // the block's taps so far: tap j's B is in buffer j % 3
    for (size_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const bool more = tile + gridDim.x < tiles;
        const CwTile nt = cw_tile(g, more ? tile + gridDim.x : tile);
        const int na = cw_entry(nt, ma, ow), nb = cw_entry(nt, ma + 8, ow);
        float d[32];
#pragma unroll
        for (int i = 0; i < 32; ++i) d[i] = 0.0f;
#pragma unroll 1
        for (int q = 0; q < 9; ++q, ++j) {
            if (j > 0) {
                // the group of the tap's B (the oldest of the last tap's four) has landed;
                // the strip chunks of the last tap's later three may still be in flight
                asm volatile("cp.async.wait_group 3;" ::: "memory");
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                __syncthreads();
            }
            if (q < 8 || more) cw_stage_tap(packed, (q + 1) % 9, bufs + (j + 1) % CW_BUFS * CW_TAP);
            // a strip to copy over this tap, a few chunks after each k-pair's products: at tap
            // 0 this tile's strip 2 (unless the prologue's), at taps 3 and 6 the next tile's 0, 1
            const bool first_tile = tile == blockIdx.x;
            const int sr = q == 0 && !first_tile ? 2 : (q == 3 || q == 6) && more ? q / 3 - 1 : -1;
            const CwTile st = q == 0 ? tl : nt;
            const u32 buf = bufs + j % CW_BUFS * CW_TAP;
            const int r = q / 3, kx = q % 3;
            // the next tap's first k-pair: this tile's tap q + 1, or the next tile's tap 0
            const int r1 = q < 8 ? (q + 1) / 3 : 0, kx1 = q < 8 ? (q + 1) % 3 : 0;
            const int ea1 = q < 8 ? ea : na, eb1 = q < 8 ? eb : nb;
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                cw_group(d, a[c & 1], buf, c);
                if (sr >= 0) {
                    const u32 to = strips + sr * CW_STRIP;
                    cw_stage_strip(x, g, st, sr, to, (c * 5) / 2, ((c + 1) * 5) / 2);
                }
                asm volatile("cp.async.commit_group;"); // four groups a tap, B's first
                float4 va, vb;
                if (c < 3) cw_load(strips, r, kx, c + 1, ea, eb, va, vb);
                else cw_load(strips, r1, kx1, 0, ea1, eb1, va, vb);
                asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
                cw_split(va, vb, a[(c + 1) & 1]);
            }
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
        for (int i = 0; i < 32; ++i) asm volatile("" : "+f"(d[i])::"memory");
        cw_store(d, b, y, mask, relu, tl.p0 + ma, total);
        tl = nt, ea = na, eb = nb;
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
}
