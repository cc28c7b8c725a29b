// wgrad_wgmma.cu: the filter and bias gradients of a 3x3, stride-1, undilated convolution from
// 64 to 64 channels (NHWC x and dy, HWIO dw) in f32 under TF32, on Hopper's warpgroup tensor
// cores (wgmma.mma_async, sm_90a): the seed's conv2, ResNet-50's first 3x3 convs. Same
// operands, partials and semantics as direct_mma_wgrad (direct_mma.cu): with a mask, dy is
// first masked by the ReLU backward and, with keep, written back masked in place; the partials
// [blocks, 577, 64] of f64 are finished by direct_conv_wgrad_finish (direct_conv.cu).
//
// The GEMM per kernel row r (one warpgroup each, 3 a block): D_r[co, (kx, ci)] (64 x 192) +=
// dy^T[co, p] · X_r[p, (kx, ci)] over a tile's output positions p, one output row segment of at
// most 4 Q (<= 40) positions. A (dy^T) and B (x), both rounded to TF32 (cvt.rna) as they are
// staged, come from shared memory through descriptors (PTX ISA, "Asynchronous Warpgroup Level
// Matrix Shared Memory Layout": K-major, no swizzle, core matrices of 8 rows of 16 bytes; LBO
// the K direction's stride, SBO the M/N one's). The three kx taps are one m64n192k8
// instruction: position p = G + e Q of the tile is k-slot 4 G + e (group G, element e), and
// x's halo columns are staged in the same groups (group G holds columns G + e Q, e = 0..3, as
// the 16-byte rows of its core matrices), so tap kx reads groups G + kx: a shift of kx whole
// core matrices (LBO = 8 SBO bytes), never a misaligned start. SBO = 144 (not 128) makes the
// staging's 16-byte stores of 8 consecutive threads conflict-free.
//
// A block (one a multiprocessor: 161 KB of shared memory) walks consecutive rows of one column
// strip: a tile's new input row (ring of 5 slots) and its dy (ring of 3) are copied by
// cp.async two tiles ahead (each thread copying what it will itself convert, so no barrier
// orders the copy), converted into their slots while the tile before runs its products, and
// each tile's products stay in flight across the barrier that ends it (the slots rewritten
// were last read two tiles back). Threads 0 .. WG_XITEMS - 1 stage x, the next WG_DITEMS stage
// dy. Measured on the H100 at the seed's conv2 (batch 100): 1.38 ms with the ReLU backward and
// its write-back (1.47 ms when every thread staged some of both, in tiles up to 48 wide), the
// products alone 0.70 ms (420 TFLOP/s); tile indices were first recomputed by 64-bit divisions
// each tile, which took 2.2 ms.
//
// k-slots past the tile carry dy = 0 against real x columns, so an infinite x there makes NaN
// (0 * Inf) in dw where the true sum pairs that column with no dy: non-finite activations
// give NaN rather than Inf or a finite value at the image's right edge.
//
// Under 3xTF32 (wgmma_wgrad_3x3_c64_f32x3, full fp32) an infinite operand's rest is Inf - Inf =
// NaN, as is that of a finite one past TF32's largest value (rounded to Inf), so such operands
// give NaN in dw where f32 sums give Inf or a finite value.

#define WG_THREADS 384
#define WG_SBO 144                      // bytes between 8-channel core matrices (N)
#define WG_LBO (8 * WG_SBO)             // bytes between column groups (K): 8 core matrices
#define WG_RAW (WG_THREADS * 4 * 20)    // a raw stage: 4 16-byte chunks, 4 mask words a thread
#define WG_XSLOTS 5 // input row slots: a tile's 3, the next tile's new one, one still read
#define WG_DSLOTS 3 // dy slots: this tile's, the next one's, one still read

// The sizes of the kernel of one arithmetic: X3 = 0 for TF32 (each operand rounded once), 1 for
// 3xTF32 (each operand staged as its TF32 rounding `big` and the rounding of the rest `small`,
// d += A_big B_big + A_big B_small + A_small B_big: about f32's accuracy, the scheme of CUTLASS's
// "3xTF32" fast-accurate GEMMs). 3xTF32's two copies of every operand fit 227 KB of shared
// memory with tiles of at most 4 k-steps (32 positions) instead of 5.
template <int X3> struct WgSizes {
    static constexpr int ksteps = X3 ? 4 : 5;          // most 8-position k-steps a tile
    static constexpr int groups = 2 * ksteps + 2;      // x column groups staged a row
    static constexpr int xitems = 16 * groups;         // threads staging x, (group, 4 channels)
    static constexpr int ditems = 32 * ksteps;         // the threads after them, staging dy
    static constexpr u32 xpart = groups * WG_LBO;      // bytes of one copy of an input row
    static constexpr u32 dpart = 2 * ksteps * WG_LBO;  // bytes of one copy of a dy tile (A)
    static constexpr u32 xslot = (1 + X3) * xpart;     // a slot: big, then small (3xTF32)
    static constexpr u32 dslot = (1 + X3) * dpart;
    static constexpr u32 smem = WG_XSLOTS * xslot + WG_DSLOTS * dslot + 2 * WG_RAW;
};
// The launcher's copies (WGMMA_WGRADS, crates/stax-tensor/src/cuda/kernels/direct.rs), the
// staging threads within the block, and Hopper's 232,448 bytes of shared memory a block.
static_assert(WgSizes<0>::smem == 165120 && WgSizes<0>::ksteps == 5, "WGMMA_WGRADS[0]");
static_assert(WgSizes<1>::smem == 231936 && WgSizes<1>::ksteps == 4, "WGMMA_WGRADS[1]");
static_assert(WgSizes<0>::xitems + WgSizes<0>::ditems <= WG_THREADS, "staging threads");
static_assert(WgSizes<1>::xitems + WgSizes<1>::ditems <= WG_THREADS, "staging threads");
static_assert(WgSizes<1>::smem <= 232448, "shared memory");

// One tile: image n, output row oy of column strip `strip`, columns ox0 .. ox0 + tw - 1 (pos0
// the position index of the first); q = ceil(tw / 4) positions a group, ks = ceil(q / 2)
// k-steps.
struct WgTile {
    size_t n, pos0;
    int oy, strip, ox0, tw, q, ks;
};

// t's columns, groups and first position from its (n, strip, oy), for tiles `tw` wide.
__device__ __forceinline__ void wg_shape(const WindowGeometry &g, int tw, WgTile &t) {
    t.ox0 = t.strip * tw;
    t.tw = min(tw, (int)g.out_w - t.ox0);
    t.q = (t.tw + 3) >> 2;
    t.ks = (t.q + 1) >> 1;
    t.pos0 = (t.n * g.out_h + t.oy) * g.out_w + t.ox0;
}

// Tile u of a launch: units in (n, strip, oy) order, oy fastest, so a block's consecutive
// tiles are consecutive rows of a strip.
__device__ __forceinline__ WgTile wg_tile(const WindowGeometry &g, int tw, int strips,
                                          size_t u) {
    WgTile t;
    t.oy = (int)(u % g.out_h);
    t.strip = (int)(u / g.out_h % strips);
    t.n = u / g.out_h / strips;
    wg_shape(g, tw, t);
    return t;
}

// The tile after t (no divisions: the loop's tiles are stepped, not recomputed).
__device__ __forceinline__ WgTile wg_step(const WindowGeometry &g, int tw, int strips,
                                          WgTile t) {
    if (++t.oy == (int)g.out_h) {
        t.oy = 0;
        if (++t.strip == strips) t.strip = 0, ++t.n;
    }
    wg_shape(g, tw, t);
    return t;
}

// This thread's staging item: 0 for x (threads 0 .. xitems - 1), 1 for dy (the ditems after
// them), -1 for none; its group G and channels 4 c .. 4 c + 3, the four positions (or input
// columns) G + e Q, e = 0..3, of the group.
template <int X3> __device__ __forceinline__ int wg_item(int &G, int &c) {
    using S = WgSizes<X3>;
    const int tid = threadIdx.x;
    c = tid & 15;
    G = (tid < S::xitems ? tid : tid - S::xitems) >> 4;
    return tid < S::xitems ? 0 : tid < S::xitems + S::ditems ? 1 : -1;
}

// Issues this thread's item of tile t as cp.async copies into the raw stage at shared address
// raw (chunk e at (e WG_THREADS + threadIdx.x) 16, its mask word after the chunks): for x,
// input row oy + r - pad_top; for dy (when with_dy), the tile's positions and their mask
// words. Zeros outside the image and past the tile. Each thread converts what it copied
// (wg_convert), so its own cp.async.wait_group orders the two, no barrier.
template <int X3>
__device__ __forceinline__ void wg_fetch(const float *x, const float *dy, const u32 *mask,
                                         const WindowGeometry &g, const WgTile &t, int r,
                                         bool with_dy, u32 raw) {
    int G, c;
    const int kind = wg_item<X3>(G, c);
    const u32 chunk = raw + threadIdx.x * 16, word = raw + WG_THREADS * 64 + threadIdx.x * 4;
    if (kind == 0) {
        const long iy = (long)t.oy + r - (long)g.pad_top, ix0 = (long)t.ox0 + G - (long)g.pad_left;
        const bool row = G < 2 * t.ks + 2 && iy >= 0 && iy < (long)g.h;
        const float *base = x + (t.n * g.h + (row ? iy : 0)) * g.w * 64 + 4 * c;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const long ix = ix0 + e * t.q;
            const bool ok = row && ix >= 0 && ix < (long)g.w;
            cp_async16(chunk + e * WG_THREADS * 16, ok ? base + ix * 64 : x, ok);
        }
    } else if (kind == 1 && with_dy) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int j = G + e * t.q;
            const bool ok = G < t.q && j < t.tw;
            const size_t at = (t.pos0 + j) * 64 + 4 * c;
            cp_async16(chunk + e * WG_THREADS * 16, ok ? dy + at : dy, ok);
            cp_async4(word + e * WG_THREADS * 4, ok && mask ? mask + (at >> 5) : mask,
                         ok && mask);
        }
    }
}

// Stores the four words v at shared address at.
__device__ __forceinline__ void wg_store4(u32 at, const u32 (&v)[4]) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(at), "r"(v[0]), "r"(v[1]),
                 "r"(v[2]), "r"(v[3]));
}

// Converts this thread's item of tile t from the raw stage at raw into its slot, rounded to
// TF32 (under 3xTF32 also the rest, rounded, into the slot's second copy): x into the input row
// slot xslot, dy (when with_dy) into the dy slot dslot, first masked
// by the ReLU backward (with keep written back in place) and added to the bias-gradient sums
// db (channels 4 (threadIdx.x % 16) ..). Channel ci of group G is the 16-byte row ci % 8 of core
// matrix ci / 8 (SBO apart: conflict-free for 8 consecutive threads), its elements e = 0..3.
// Every group the tile's products read is written (zeros past the tile).
template <int X3>
__device__ __forceinline__ void wg_convert(float *dy, const u32 *mask, int keep,
                                           const WgTile &t, u32 raw, u32 xslot, u32 dslot,
                                           bool with_dy, float (&db)[4]) {
    int G, c;
    const int kind = wg_item<X3>(G, c);
    const bool x_item = kind == 0 && G < 2 * t.ks + 2;
    if (!x_item && !(kind == 1 && with_dy && G < 2 * t.ks)) return;
    const u32 chunk = raw + threadIdx.x * 16, word = raw + WG_THREADS * 64 + threadIdx.x * 4;
    float4 v[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                     : "=f"(v[e].x), "=f"(v[e].y), "=f"(v[e].z), "=f"(v[e].w)
                     : "r"(chunk + e * WG_THREADS * 16));
    }
    if (!x_item) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int j = G + e * t.q;
            if (mask && G < t.q && j < t.tw) {
                u32 m;
                asm volatile("ld.shared.b32 %0, [%1];" : "=r"(m) : "r"(word + e * WG_THREADS * 4));
                const u32 b = m >> ((4 * c) & 31);
                v[e].x = b & 1u ? v[e].x : 0.0f, v[e].y = b & 2u ? v[e].y : 0.0f;
                v[e].z = b & 4u ? v[e].z : 0.0f, v[e].w = b & 8u ? v[e].w : 0.0f;
                if (keep) *(float4 *)(dy + (t.pos0 + j) * 64 + 4 * c) = v[e];
            }
            db[0] += v[e].x, db[1] += v[e].y, db[2] += v[e].z, db[3] += v[e].w;
        }
    }
    const u32 slot = (x_item ? xslot : dslot) + G * WG_LBO;
    const u32 part = x_item ? WgSizes<X3>::xpart : WgSizes<X3>::dpart;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int ci = 4 * c + j;
        const u32 at = slot + (ci >> 3) * WG_SBO + (ci & 7) * 16;
        const float f[4] = {(&v[0].x)[j], (&v[1].x)[j], (&v[2].x)[j], (&v[3].x)[j]};
        u32 big[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) big[e] = tf32_bits(f[e]);
        wg_store4(at, big);
        if (X3) {
#pragma unroll
            for (int e = 0; e < 4; ++e) big[e] = tf32_small(f[e], big[e]);
            wg_store4(at + part, big);
        }
    }
}

// Makes this thread's shared-memory writes visible to the tensor cores' (async proxy) reads.
__device__ __forceinline__ void wg_fence_async() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// The descriptor of B at shared address addr: K-major, no swizzle, LBO and SBO as above.
__device__ __forceinline__ u64 wg_desc(u32 addr) {
    return (u64)((addr & 0x3ffff) >> 4) | (u64)(WG_LBO >> 4) << 16 | (u64)(WG_SBO >> 4) << 32;
}

#define WG_F8(i)                                                                               \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
        "+f"(d[i + 6]), "+f"(d[i + 7])

// d += A · B, m64n192k8, A and B at descriptors a and b (PTX ISA, "wgmma.mma_async"; f32
// accumulators: warp w of the warpgroup holds rows 16 w + lane / 4 and + 8).
__device__ __forceinline__ void wg_mma(float (&d)[96], u64 a, u64 b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n192k8.f32.tf32.tf32 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, "
                 "%30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "
                 "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, "
                 "%58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, "
                 "%72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, "
                 "%86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, "
                 "%96, %97, p, 1, 1;\n}\n"
                 : WG_F8(0), WG_F8(8), WG_F8(16), WG_F8(24), WG_F8(32), WG_F8(40), WG_F8(48),
                   WG_F8(56), WG_F8(64), WG_F8(72), WG_F8(80), WG_F8(88)
                 : "l"(a), "l"(b), "r"(1));
}

// The tile's products for this warpgroup (kernel row r): its k-steps issued and committed as
// one group, A at the dy slot, B at the input row slot of r; under 3xTF32 each k-step's
// big-small and small-big products first, then big-big.
template <int X3>
__device__ __forceinline__ void wg_products(float (&d)[96], u32 dslot, u32 xslot, int ks) {
    using S = WgSizes<X3>;
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int i = 0; i < S::ksteps; ++i) {
        if (i >= ks) break;
        const u64 a = wg_desc(dslot + 2 * i * WG_LBO), b = wg_desc(xslot + 2 * i * WG_LBO);
        if (X3) {
            wg_mma(d, a, wg_desc(xslot + S::xpart + 2 * i * WG_LBO));
            wg_mma(d, wg_desc(dslot + S::dpart + 2 * i * WG_LBO), b);
        }
        wg_mma(d, a, b);
    }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

// Waits for all but the last committed group (the accumulators stay in flight, untouched).
__device__ __forceinline__ void wg_wait_prev() {
    asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
}

__device__ __forceinline__ void wg_wait_all(float (&d)[96]) {
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
    for (int i = 0; i < 96; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Stages tile t whole (its three input rows and dy) into the slots of its rows, through the
// raw stage at raw.
template <int X3>
__device__ __forceinline__ void wg_stage_tile(const float *x, float *dy, const u32 *mask,
                                              int keep, const WindowGeometry &g,
                                              const WgTile &t, u32 xs, u32 ds, u32 raw,
                                              float (&db)[4]) {
    for (int r = 0; r < 3; ++r) {
        wg_fetch<X3>(x, dy, mask, g, t, r, r == 2, raw);
        asm volatile("cp.async.commit_group;");
        asm volatile("cp.async.wait_group 0;" ::: "memory");
        const u32 xslot = xs + (t.oy + r) % WG_XSLOTS * WgSizes<X3>::xslot;
        const u32 dslot = ds + t.oy % WG_DSLOTS * WgSizes<X3>::dslot;
        wg_convert<X3>(dy, mask, keep, t, raw, xslot, dslot, r == 2, db);
    }
    wg_fence_async();
}

// The block's partials: D_r's (co, (kx, ci)) at k = (3 r + kx) 64 + ci of the HWIO filter, a
// warpgroup at a time through shared memory (as f32, then widened by the whole block in
// coalesced stores: widening in registers would need twice the accumulators' registers), then
// db (its threads' f32 sums over the 24 threads of each channel chunk in f64, a fixed order).
__device__ void wg_partials(const float (&d)[96], const float (&db)[4], double *out,
                            unsigned char *smem) {
    const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3, gq = lane >> 2, t = lane & 3;
    float *f = (float *)smem + (2 * t) * 64 + 16 * w + gq;
    for (int r = 0; r < 3; ++r) {
        __syncthreads();
        if (threadIdx.x >> 7 == r) {
#pragma unroll
            for (int i = 0; i < 96; ++i) {
                f[((i / 32) * 64 + 8 * (i / 4 % 8) + (i & 1)) * 64 + 8 * (i >> 1 & 1)] = d[i];
            }
        }
        __syncthreads();
        for (int j = threadIdx.x; j < 192 * 64; j += WG_THREADS) {
            out[3 * r * 64 * 64 + j] = ((const float *)smem)[j];
        }
    }
    double *red = (double *)smem;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 4; ++j) red[threadIdx.x * 4 + j] = db[j];
    __syncthreads();
    if (threadIdx.x < 64) {
        const int c = threadIdx.x >> 2, j = threadIdx.x & 3;
        double s = 0.0;
        for (int u = c; u < WG_THREADS; u += 16) s += red[u * 4 + j];
        out[576 * 64 + threadIdx.x] = s;
    }
}

// The kernel of arithmetic X3 (WgSizes): x [n, h, w, 64] and dy [n, out_h, out_w, 64]
// (16-byte aligned), mask null or dy's packed ReLU mask, partial [gridDim.x, 577, 64] doubles;
// tiles tw (<= 8 WgSizes<X3>::ksteps) positions wide; dynamic shared memory WgSizes<X3>::smem
// bytes.
template <int X3>
__device__ __forceinline__ void wg_wgrad(const float *x, float *dy, const u32 *mask, int keep,
                                         double *partial, const WindowGeometry &g, int tw) {
    using S = WgSizes<X3>;
    extern __shared__ __align__(128) unsigned char smem[];
    const u32 xs = (u32)__cvta_generic_to_shared(smem), ds = xs + WG_XSLOTS * S::xslot;
    const int r = threadIdx.x >> 7, strips = ((int)g.out_w + tw - 1) / tw;
    const size_t units = g.n * g.out_h * strips;
    const size_t u0 = units * blockIdx.x / gridDim.x, u1 = units * (blockIdx.x + 1) / gridDim.x;
    float d[96], db[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 96; ++i) d[i] = 0.0f;
    // tile u + 2 is fetched (its new input row and dy, by cp.async) into raw stage u % 2 while
    // tile u's products run, when it continues the strip of u + 1 and u + 1 that of u (else
    // when u + 1 is staged whole); one commit group a tile, empty or not, so that wait_group 1
    // always means "the next tile's copies have landed"
    const u32 raw = ds + WG_DSLOTS * S::dslot;
    WgTile t = wg_tile(g, tw, strips, u0), t1 = wg_step(g, tw, strips, t);
    WgTile t2 = wg_step(g, tw, strips, t1);
    for (size_t u = u0; u < u1; ++u, t = t1, t1 = t2, t2 = wg_step(g, tw, strips, t2)) {
        const bool c1 = u + 1 < u1 && t1.oy != 0, c2 = c1 && u + 2 < u1 && t2.oy != 0;
        if (u == u0 || t.oy == 0) {
            wg_wait_all(d); // the last strip's products read the slots staged here
            __syncthreads();
            wg_stage_tile<X3>(x, dy, mask, keep, g, t, xs, ds, raw + (u & 1) * WG_RAW, db);
            __syncthreads();
            if (c1) wg_fetch<X3>(x, dy, mask, g, t1, 2, true, raw + ((u + 1) & 1) * WG_RAW);
            asm volatile("cp.async.commit_group;");
        }
        if (c2) wg_fetch<X3>(x, dy, mask, g, t2, 2, true, raw + (u & 1) * WG_RAW);
        asm volatile("cp.async.commit_group;");
        wg_products<X3>(d, ds + t.oy % WG_DSLOTS * S::dslot,
                        xs + (t.oy + r) % WG_XSLOTS * S::xslot, t.ks);
        if (c1) {
            // the slots written here were last read by tile u - 2, whose products every
            // warpgroup waited for before the last barrier
            asm volatile("cp.async.wait_group 1;" ::: "memory");
            const u32 xslot = xs + (t1.oy + 2) % WG_XSLOTS * S::xslot;
            wg_convert<X3>(dy, mask, keep, t1, raw + ((u + 1) & 1) * WG_RAW, xslot,
                           ds + t1.oy % WG_DSLOTS * S::dslot, true, db);
            wg_fence_async();
        }
        wg_wait_prev(); // tile u - 1's products: tile u's stay in flight across the barrier
        __syncthreads();
    }
    wg_wait_all(d);
    asm volatile("cp.async.wait_all;" ::: "memory");
    wg_partials(d, db, partial + (size_t)blockIdx.x * 577 * 64, smem);
}

// TF32: tiles of at most 40 positions, 165,120 bytes of shared memory.
extern "C" __global__ void __launch_bounds__(WG_THREADS, 1)
    wgmma_wgrad_3x3_c64_f32(const float *x, float *dy, const u32 *mask, int keep,
                            double *partial, WindowGeometry g, int tw) {
    wg_wgrad<0>(x, dy, mask, keep, partial, g, tw);
}

// 3xTF32 (full fp32): tiles of at most 32 positions, 231,936 bytes of shared memory.
extern "C" __global__ void __launch_bounds__(WG_THREADS, 1)
    wgmma_wgrad_3x3_c64_f32x3(const float *x, float *dy, const u32 *mask, int keep,
                              double *partial, WindowGeometry g, int tw) {
    wg_wgrad<1>(x, dy, mask, keep, partial, g, tw);
}
