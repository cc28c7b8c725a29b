// pool.cu: 2-D max, sum and average pooling, NHWC, forward and backward, in every float dtype:
// templates instantiated per dtype as <op>_<dtype> by FOR_FLOATS, elements read as f32, sums
// accumulated in f32 (f64 for the forward sums), each output rounded to its dtype once. See
// crates/stax-tensor/src/cpu/pool.rs for the semantics: max pooling's padding reads -inf, NaN
// propagates, the gradient of a window goes to its first maximum in window order; sum pooling's
// padding reads 0; average pooling divides by the window's positions inside the image.

#define NO_MAX 0xffffffffu

// G consecutive elements as f32: one (any alignment) or eight (load8: 16-byte aligned).
template <typename T> __device__ __forceinline__ void load_g(const T *p, float (&f)[1]) {
    f[0] = to_f32(p[0]);
}
template <typename T> __device__ __forceinline__ void load_g(const T *p, float (&f)[8]) {
    load8(p, f);
}
template <typename T> __device__ __forceinline__ void store_g(T *p, const float (&f)[1]) {
    p[0] = from_f32<T>(f[0]);
}
template <typename T> __device__ __forceinline__ void store_g(T *p, const float (&f)[8]) {
    store8(p, f);
}

// The NHWC position (n, y, x) of group o of G channels of a [n, hh, ww, c] tensor, and its
// first channel.
struct Pixel {
    size_t n, y, x, c;
};
__device__ __forceinline__ Pixel pixel_of(size_t o, size_t hh, size_t ww, size_t c, int G) {
    size_t groups = c / G;
    size_t cg = o % groups, r = o / groups;
    size_t x = r % ww, r2 = r / ww;
    return Pixel{r2 / hh, r2 % hh, x, cg * G};
}

// Max pooling forward for G channels a thread (G = 1, or 8 with c % 8 == 0 and every tensor
// 16-byte aligned): each window's maximum into y and the window offset (ky * kw + kx) of its
// first maximum into arg (NO_MAX for a window wholly in the padding), each when not null. A
// later maximum replaces the first only when greater, or when NaN over a number (NaN
// propagates).
template <int G, typename T>
__device__ void max_pool_impl(const T *x, T *y, unsigned *arg, WindowGeometry g) {
    size_t total = g.n * g.out_h * g.out_w * g.c / G;
    GRID_STRIDE(o, total) {
        Pixel p = pixel_of(o, g.out_h, g.out_w, g.c, G);
        const T *img = x + p.n * g.h * g.w * g.c + p.c;
        unsigned a[G];
        float b[G];
#pragma unroll
        for (int k = 0; k < G; ++k) {
            a[k] = NO_MAX;
            b[k] = __int_as_float(0xff800000); // -inf
        }
        for (size_t ky = 0; ky < g.kh; ++ky) {
            long long iy = (long long)(p.y * g.sh + ky) - (long long)g.pad_top;
            if (iy < 0 || iy >= (long long)g.h) continue;
            for (size_t kx = 0; kx < g.kw; ++kx) {
                long long ix = (long long)(p.x * g.sw + kx) - (long long)g.pad_left;
                if (ix < 0 || ix >= (long long)g.w) continue;
                float v[G];
                load_g(img + ((size_t)iy * g.w + (size_t)ix) * g.c, v);
#pragma unroll
                for (int k = 0; k < G; ++k) {
                    if (a[k] == NO_MAX || v[k] > b[k] || (isnan(v[k]) && !isnan(b[k]))) {
                        a[k] = (unsigned)(ky * g.kw + kx);
                        b[k] = v[k];
                    }
                }
            }
        }
        if (y) store_g(y + o * G, b);
        if (arg) {
#pragma unroll
            for (int k = 0; k < G; ++k) arg[o * G + k] = a[k];
        }
    }
}

// dx[i] = sum of dy over the windows whose first maximum is i, from the windows' argmax
// offsets, G channels a thread as in max_pool_impl (each input gathers over the windows that
// cover it, in window order: deterministic, no atomics; dy read only where a window's
// maximum is one of the G inputs).
template <int G, typename T>
__device__ void max_pool_bwd_impl(const unsigned *arg, const T *dy, T *dx, WindowGeometry g) {
    size_t total = g.n * g.h * g.w * g.c / G;
    GRID_STRIDE(t, total) {
        Pixel p = pixel_of(t, g.h, g.w, g.c, G);
        // windows oy with oy*sh <= iy + pad_top < oy*sh + kh
        long long py = (long long)(p.y + g.pad_top), px = (long long)(p.x + g.pad_left);
        long long oy0 = py >= (long long)g.kh ? (py - (long long)g.kh) / (long long)g.sh + 1 : 0;
        long long ox0 = px >= (long long)g.kw ? (px - (long long)g.kw) / (long long)g.sw + 1 : 0;
        float acc[G];
#pragma unroll
        for (int k = 0; k < G; ++k) acc[k] = 0.0f;
        for (long long oy = oy0; oy <= py / (long long)g.sh && oy < (long long)g.out_h; ++oy) {
            size_t ky = (size_t)(py - oy * (long long)g.sh);
            for (long long ox = ox0; ox <= px / (long long)g.sw && ox < (long long)g.out_w;
                 ++ox) {
                unsigned off = (unsigned)(ky * g.kw + (size_t)(px - ox * (long long)g.sw));
                size_t o = ((p.n * g.out_h + (size_t)oy) * g.out_w + (size_t)ox) * g.c + p.c;
                bool any = false, hit[G];
#pragma unroll
                for (int k = 0; k < G; ++k) {
                    hit[k] = arg[o + k] == off;
                    any |= hit[k];
                }
                if (!any) continue;
                float d[G];
                load_g(dy + o, d);
#pragma unroll
                for (int k = 0; k < G; ++k) acc[k] += hit[k] ? d[k] : 0.0f;
            }
        }
        store_g(dx + t * G, acc);
    }
}

// The window positions [*lo, *hi) along one axis inside [0, len) for output index o.
__device__ void inside(size_t o, size_t s, size_t pad, size_t len, size_t k, size_t *lo,
                       size_t *hi) {
    long long base = (long long)(o * s) - (long long)pad;
    long long a = base < 0 ? -base : 0;
    long long b = (long long)len - base;
    if (b > (long long)k) b = (long long)k;
    if (b < a) b = a;
    *lo = (size_t)a;
    *hi = (size_t)b;
}

// y[n, oy, ox, c] = the window's sum (avg != 0: divided by its positions inside the image).
template <typename T> __device__ void sum_pool_impl(const T *x, T *y, WindowGeometry g, int avg) {
    size_t total = g.n * g.out_h * g.out_w * g.c;
    GRID_STRIDE(o, total) {
        size_t c = o % g.c, r = o / g.c;
        size_t ox = r % g.out_w, r2 = r / g.out_w;
        size_t oy = r2 % g.out_h, n = r2 / g.out_h;
        size_t y0, y1, x0, x1;
        inside(oy, g.sh, g.pad_top, g.h, g.kh, &y0, &y1);
        inside(ox, g.sw, g.pad_left, g.w, g.kw, &x0, &x1);
        double acc = 0.0;
        for (size_t ky = y0; ky < y1; ++ky) {
            size_t iy = oy * g.sh + ky - g.pad_top;
            for (size_t kx = x0; kx < x1; ++kx) {
                size_t ix = ox * g.sw + kx - g.pad_left;
                acc += (double)to_f32(x[((n * g.h + iy) * g.w + ix) * g.c + c]);
            }
        }
        float count = (float)((y1 - y0) * (x1 - x0));
        y[o] = from_f32<T>(avg ? (float)acc / count : (float)acc);
    }
}

// dx[i] = sum of dy over the windows covering i (each divided by its count when avg != 0);
// one thread an input element, gathering: deterministic, no atomics.
template <typename T>
__device__ void sum_pool_bwd_impl(const T *dy, T *dx, WindowGeometry g, int avg) {
    size_t total = g.n * g.h * g.w * g.c;
    GRID_STRIDE(t, total) {
        size_t c = t % g.c, r = t / g.c;
        size_t ix = r % g.w, r2 = r / g.w;
        size_t iy = r2 % g.h, n = r2 / g.h;
        // windows oy with oy*sh <= iy + pad_top < oy*sh + kh
        long long py = (long long)(iy + g.pad_top), px = (long long)(ix + g.pad_left);
        long long oy0 = py >= (long long)g.kh ? (py - (long long)g.kh) / (long long)g.sh + 1 : 0;
        long long ox0 = px >= (long long)g.kw ? (px - (long long)g.kw) / (long long)g.sw + 1 : 0;
        float acc = 0.0f;
        for (long long oy = oy0; oy <= py / (long long)g.sh && oy < (long long)g.out_h; ++oy) {
            size_t y0, y1;
            inside((size_t)oy, g.sh, g.pad_top, g.h, g.kh, &y0, &y1);
            for (long long ox = ox0; ox <= px / (long long)g.sw && ox < (long long)g.out_w;
                 ++ox) {
                size_t x0, x1;
                inside((size_t)ox, g.sw, g.pad_left, g.w, g.kw, &x0, &x1);
                size_t o = ((n * g.out_h + (size_t)oy) * g.out_w + (size_t)ox) * g.c + c;
                float d = to_f32(dy[o]);
                acc += avg ? d / (float)((y1 - y0) * (x1 - x0)) : d;
            }
        }
        dx[t] = from_f32<T>(acc);
    }
}

#define POOL_KERNELS(T, S)                                                                     \
    extern "C" __global__ void max_pool_##S(const T *x, T *y, unsigned *arg, WindowGeometry g) { \
        max_pool_impl<1, T>(x, y, arg, g);                                                     \
    }                                                                                          \
    extern "C" __global__ void max_pool_vec_##S(const T *x, T *y, unsigned *arg,               \
                                                WindowGeometry g) {                            \
        max_pool_impl<8, T>(x, y, arg, g);                                                     \
    }                                                                                          \
    extern "C" __global__ void max_pool_bwd_##S(const unsigned *arg, const T *dy, T *dx,       \
                                                WindowGeometry g) {                              \
        max_pool_bwd_impl<1, T>(arg, dy, dx, g);                                               \
    }                                                                                          \
    extern "C" __global__ void max_pool_bwd_vec_##S(const unsigned *arg, const T *dy, T *dx,   \
                                                    WindowGeometry g) {                        \
        max_pool_bwd_impl<8, T>(arg, dy, dx, g);                                               \
    }                                                                                          \
    extern "C" __global__ void sum_pool_##S(const T *x, T *y, WindowGeometry g, int avg) {       \
        sum_pool_impl<T>(x, y, g, avg);                                                        \
    }                                                                                          \
    extern "C" __global__ void sum_pool_bwd_##S(const T *dy, T *dx, WindowGeometry g, int avg) { \
        sum_pool_bwd_impl<T>(dy, dx, g, avg);                                                  \
    }
FOR_FLOATS(POOL_KERNELS)
