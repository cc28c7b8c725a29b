// pool.cu: 2-D max, sum and average pooling, NHWC, forward and backward, in every float dtype:
// templates instantiated per dtype as <op>_<dtype> by FOR_FLOATS, elements read as f32, sums
// accumulated in f32 (f64 for the forward sums), each output rounded to its dtype once. See
// crates/stax-tensor/src/cpu/pool.rs for the semantics: max pooling's padding reads -inf, NaN
// propagates, the gradient of a window goes to its first maximum in window order; sum pooling's
// padding reads 0; average pooling divides by the window's positions inside the image.

#define NO_MAX 0xffffffffu

// The window offset (ky * kw + kx) of the first maximum of window (oy, ox) in channel c of
// image x, or NO_MAX when the window lies wholly in the padding; its value in *best.
template <typename T>
__device__ unsigned window_argmax(const WindowGeometry &g, const T *x, size_t oy, size_t ox,
                                  size_t c, float *best) {
    unsigned arg = NO_MAX;
    float b = __int_as_float(0xff800000); // -inf
    for (size_t ky = 0; ky < g.kh; ++ky) {
        long long iy = (long long)(oy * g.sh + ky) - (long long)g.pad_top;
        if (iy < 0 || iy >= (long long)g.h) continue;
        for (size_t kx = 0; kx < g.kw; ++kx) {
            long long ix = (long long)(ox * g.sw + kx) - (long long)g.pad_left;
            if (ix < 0 || ix >= (long long)g.w) continue;
            float v = to_f32(x[((size_t)iy * g.w + (size_t)ix) * g.c + c]);
            if (arg == NO_MAX || v > b || (isnan(v) && !isnan(b))) {
                arg = (unsigned)(ky * g.kw + kx);
                b = v;
            }
        }
    }
    *best = b;
    return arg;
}

// y[n, oy, ox, c] = max over the window (one thread an output element).
template <typename T> __device__ void max_pool_impl(const T *x, T *y, WindowGeometry g) {
    size_t total = g.n * g.out_h * g.out_w * g.c;
    size_t image = g.h * g.w * g.c;
    GRID_STRIDE(o, total) {
        size_t c = o % g.c, r = o / g.c;
        size_t ox = r % g.out_w, r2 = r / g.out_w;
        size_t oy = r2 % g.out_h, n = r2 / g.out_h;
        float best;
        window_argmax<T>(g, x + n * image, oy, ox, c, &best);
        y[o] = from_f32<T>(best);
    }
}

// arg[n, oy, ox, c] = the window offset of the window's first maximum (one thread an output
// element): the first half of the backward pass, which then reads one word per window.
template <typename T>
__device__ void max_pool_argmax_impl(const T *x, unsigned *arg, WindowGeometry g) {
    size_t total = g.n * g.out_h * g.out_w * g.c;
    size_t image = g.h * g.w * g.c;
    GRID_STRIDE(o, total) {
        size_t c = o % g.c, r = o / g.c;
        size_t ox = r % g.out_w, r2 = r / g.out_w;
        size_t oy = r2 % g.out_h, n = r2 / g.out_h;
        float best;
        arg[o] = window_argmax<T>(g, x + n * image, oy, ox, c, &best);
    }
}

// dx[i] = sum of dy over the windows whose first maximum is i, from the windows' argmax
// offsets (one thread an input element, gathering over the windows that cover it:
// deterministic, no atomics).
template <typename T>
__device__ void max_pool_bwd_impl(const unsigned *arg, const T *dy, T *dx, WindowGeometry g) {
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
            size_t ky = (size_t)(py - oy * (long long)g.sh);
            for (long long ox = ox0; ox <= px / (long long)g.sw && ox < (long long)g.out_w;
                 ++ox) {
                size_t kx = (size_t)(px - ox * (long long)g.sw);
                size_t o = ((n * g.out_h + (size_t)oy) * g.out_w + (size_t)ox) * g.c + c;
                if (arg[o] == (unsigned)(ky * g.kw + kx)) acc += to_f32(dy[o]);
            }
        }
        dx[t] = from_f32<T>(acc);
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
    extern "C" __global__ void max_pool_##S(const T *x, T *y, WindowGeometry g) {                \
        max_pool_impl<T>(x, y, g);                                                             \
    }                                                                                          \
    extern "C" __global__ void max_pool_argmax_##S(const T *x, unsigned *arg, WindowGeometry g) { \
        max_pool_argmax_impl<T>(x, arg, g);                                                    \
    }                                                                                          \
    extern "C" __global__ void max_pool_bwd_##S(const unsigned *arg, const T *dy, T *dx,       \
                                                WindowGeometry g) {                              \
        max_pool_bwd_impl<T>(arg, dy, dx, g);                                                  \
    }                                                                                          \
    extern "C" __global__ void sum_pool_##S(const T *x, T *y, WindowGeometry g, int avg) {       \
        sum_pool_impl<T>(x, y, g, avg);                                                        \
    }                                                                                          \
    extern "C" __global__ void sum_pool_bwd_##S(const T *dy, T *dx, WindowGeometry g, int avg) { \
        sum_pool_bwd_impl<T>(dy, dx, g, avg);                                                  \
    }
FOR_FLOATS(POOL_KERNELS)
