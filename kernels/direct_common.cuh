// direct_common.cuh: what the direct convolution kernels share (direct_conv.cu, f32 FMAs;
// direct_mma.cu, the tensor cores), prepended to both by
// crates/stax-tensor/src/cuda/kernels/source.rs: the block shape, the tap tables and the staging
// of a tile's patches.
//
// A block of DC_THREADS threads works on tiles of DC_PIXELS consecutive output positions (in n,
// oy, ox order): it stages their patches (K values each, in HWIO tap order k = (ky * kw + kx) *
// c_in + ci, zeros in the padding and past K up to KP) in shared memory, loading the next
// tile's patches into registers while it computes the current one.

#define DC_THREADS 256
#define DC_PIXELS 64

// Two consecutive elements as f32 (8 bytes of f32, 4 of bf16 or f16): p 8- or 4-byte aligned.
__device__ __forceinline__ void load2(const float *p, float &a, float &b) {
    float2 v = *(const float2 *)p;
    a = v.x, b = v.y;
}
template <typename T> __device__ __forceinline__ void load2(const T *p, float &a, float &b) {
    u32 w = *(const u32 *)p;
    T lo, hi;
    lo.bits = (unsigned short)(w & 0xffffu);
    hi.bits = (unsigned short)(w >> 16);
    a = to_f32(lo), b = to_f32(hi);
}
__device__ __forceinline__ void store2(float *p, float a, float b) {
    *(float2 *)p = make_float2(a, b);
}
template <typename T> __device__ __forceinline__ void store2(T *p, float a, float b) {
    *(u32 *)p = (u32)from_f32<T>(a).bits | ((u32)from_f32<T>(b).bits << 16);
}

// The input offsets of every tap k < K: ky * dh, kx * dw and ci (the block's tables).
struct Taps {
    int dy[32], dx[32], ci[32];
};

__device__ __forceinline__ void taps_init(Taps &t, const WindowGeometry &g, int K) {
    for (int k = threadIdx.x; k < K; k += DC_THREADS) {
        int ci = k % (int)g.c, tap = k / (int)g.c;
        t.dy[k] = (tap / (int)g.kw) * (int)g.dh;
        t.dx[k] = (tap % (int)g.kw) * (int)g.dw;
        t.ci[k] = ci;
    }
}

// Loads this thread's share of the patches of positions p0 .. p0 + DC_PIXELS (of `total`)
// into v, as stored: 4 threads a position (DC_THREADS = 4 DC_PIXELS), thread q taking taps q,
// q + 4, ...; zeros outside the input, past K and past total. The loads of the next tile are in
// flight while the block computes this one: nothing reads v until put_patches converts it.
template <typename T, int KP>
__device__ __forceinline__ void load_patches(const T *x, const WindowGeometry &g, const Taps &t,
                                             int K, size_t p0, size_t total,
                                             T (&v)[KP / 4]) {
    const int p = threadIdx.x >> 2, q = threadIdx.x & 3;
    const size_t pix = p0 + p;
    bool live = pix < total;
    size_t ox = 0, oy = 0, b = 0;
    if (live && total <= 0xffffffffull) {
        // 32-bit divisions where the positions fit (a fraction of the 64-bit ones' work)
        const u32 pi = (u32)pix, ow = (u32)g.out_w, oh = (u32)g.out_h, r = pi / ow;
        ox = pi - r * ow, oy = r % oh, b = r / oh;
    } else if (live) {
        ox = pix % g.out_w;
        size_t r = pix / g.out_w;
        oy = r % g.out_h, b = r / g.out_h;
    }
    const long y0 = (long)(oy * g.sh) - (long)g.pad_top;
    const long x0 = (long)(ox * g.sw) - (long)g.pad_left;
    const T *img = x + b * g.h * g.w * g.c;
#pragma unroll
    for (int i = 0; i < KP / 4; ++i) {
        int k = q + 4 * i;
        v[i] = T{};
        if (live && k < K) {
            long iy = y0 + t.dy[k], ix = x0 + t.dx[k];
            if (iy >= 0 && iy < (long)g.h && ix >= 0 && ix < (long)g.w) {
                v[i] = img[((size_t)iy * g.w + (size_t)ix) * g.c + t.ci[k]];
            }
        }
    }
}

// The block's first tile's loads into v, once its tap tables are written.
template <typename T, int KP>
__device__ __forceinline__ void first_patches(const T *x, const WindowGeometry &g, const Taps &t,
                                              int K, size_t tiles, size_t total,
                                              T (&v)[KP / 4]) {
    __syncthreads();
    if (blockIdx.x < tiles) {
        load_patches<T, KP>(x, g, t, K, blockIdx.x * DC_PIXELS, total, v);
    }
}

// Writes v (load_patches') as f32 to the block's patch rows s (S floats apart, S >= KP).
template <typename T, int KP, int S>
__device__ __forceinline__ void put_patches(const T (&v)[KP / 4], float (*s)[S]) {
    const int p = threadIdx.x >> 2, q = threadIdx.x & 3;
#pragma unroll
    for (int i = 0; i < KP / 4; ++i) s[p][q + 4 * i] = to_f32(v[i]);
}

// Writes v to the patch rows s; the loads of `next` (a tile index, or past `tiles` for none)
// are then issued into v. Between two barriers.
template <typename T, int KP, int S>
__device__ __forceinline__ void stage_patches(const T *x, const WindowGeometry &g, const Taps &t,
                                              int K, size_t next, size_t tiles, size_t total,
                                              T (&v)[KP / 4], float (*s)[S]) {
    __syncthreads();
    put_patches<T, KP, S>(v, s);
    __syncthreads();
    if (next < tiles) load_patches<T, KP>(x, g, t, K, next * DC_PIXELS, total, v);
}
