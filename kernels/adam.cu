// adam.cu: one fused, in-place Adam step (optax.adam: scale_by_adam then
// scale_by_learning_rate; Kingma & Ba 2014, Algorithm 1, eps outside the square root).

// Must match `AdamHyper` in crates/stax-tensor/src/backend.rs (#[repr(C)], eight f32).
struct AdamHyper {
    float lr;
    float b1;
    float b2;
    float eps;
    float eps_root;
    float bias_correction1;
    float bias_correction2;
    float grad_scale;
};

// x / y rounded to nearest (__fdiv_rn's bits) for a zero x too without the division's slow
// path: __fdiv_rn's range check sends a zero dividend there (half the seed's dense rows have a
// zero gradient, moment and step: ReLU's zeros), but for y > 0, ±0 / y is ±0 (IEEE 754).
// The divisions run on 1 instead of 0, so no lane takes the slow path for them.
__device__ __forceinline__ float div_rn(float x, float y) {
    bool zero = x == 0.0f && y > 0.0f;
    float q = __fdiv_rn(zero ? 1.0f : x, y);
    return zero ? x : q;
}

// sqrt(x) rounded to nearest (__fsqrt_rn's bits), ±0 (whose square root is itself) without its
// slow path.
__device__ __forceinline__ float sqrt_rn(float x) {
    float r = __fsqrt_rn(x == 0.0f ? 1.0f : x);
    return x == 0.0f ? x : r;
}

// g *= grad_scale (1, or 1 / loss_scale: jmp's unscale in f32);
// m = (1 - b1) g + b1 m; v = (1 - b2) g^2 + b2 v;
// p += (-lr) * (m / bc1) / (sqrt(v / bc2 + eps_root) + eps).
// Explicitly rounded operations (no FMA contraction), in the CPU backend's order, so both
// backends give the same bits.
__device__ __forceinline__ void adam_one(float &p, float g, float &m, float &v,
                                         const AdamHyper &h) {
    g = __fmul_rn(g, h.grad_scale);
    float mi = __fadd_rn(__fmul_rn(1.0f - h.b1, g), __fmul_rn(h.b1, m));
    float vi = __fadd_rn(__fmul_rn(1.0f - h.b2, __fmul_rn(g, g)), __fmul_rn(h.b2, v));
    m = mi;
    v = vi;
    float mhat = div_rn(mi, h.bias_correction1);
    float vhat = div_rn(vi, h.bias_correction2);
    float denom = __fadd_rn(sqrt_rn(__fadd_rn(vhat, h.eps_root)), h.eps);
    p = __fadd_rn(p, __fmul_rn(-h.lr, div_rn(mhat, denom)));
}

// One element per thread and iteration (any alignment): f32 parameters and second moment,
// the gradient in its own dtype G (read as f32), the first moment in M (optax's mu_dtype:
// read as f32, rounded once when stored): adam_<G> (M = f32), adam_mu_<M>_<G>.
template <typename G, typename M>
__device__ __forceinline__ void adam_t(float *p, const G *g, M *m, float *v, AdamHyper h,
                                       size_t n) {
    GRID_STRIDE(i, n) {
        float pi = p[i], mi = to_f32(m[i]), vi = v[i];
        adam_one(pi, to_f32(g[i]), mi, vi, h);
        m[i] = from_f32<M>(mi);
        v[i] = vi;
        p[i] = pi;
    }
}

#define ADAM(T, s)                                                                             \
    extern "C" __global__ void adam_##s(float *p, const T *g, float *m, float *v, AdamHyper h, \
                                        size_t n) {                                            \
        adam_t<T, float>(p, g, m, v, h, n);                                                    \
    }
FOR_FLOATS(ADAM)

#define ADAM_MU_BF16(T, s)                                                                     \
    extern "C" __global__ void adam_mu_bf16_##s(float *p, const T *g, bf16_t *m, float *v,     \
                                                AdamHyper h, size_t n) {                       \
        adam_t<T, bf16_t>(p, g, m, v, h, n);                                                   \
    }
FOR_FLOATS(ADAM_MU_BF16)

#define ADAM_MU_F16(T, s)                                                                      \
    extern "C" __global__ void adam_mu_f16_##s(float *p, const T *g, f16_t *m, float *v,       \
                                               AdamHyper h, size_t n) {                        \
        adam_t<T, f16_t>(p, g, m, v, h, n);                                                    \
    }
FOR_FLOATS(ADAM_MU_F16)

// nonfinite[0] = 1 when an element of x is NaN or infinite (the loss scale's check, jmp's
// all_finite); every writer writes the same value, so no atomics are needed.
template <typename T>
__device__ __forceinline__ void all_finite_t(const T *x, unsigned int *nonfinite, size_t n) {
    GRID_STRIDE(i, n) {
        // exponent all ones: an infinity or a NaN (widening to f32 keeps both)
        if ((__float_as_uint(to_f32(x[i])) & 0x7f800000u) == 0x7f800000u) {
            *nonfinite = 1u;
        }
    }
}

#define ALL_FINITE(T, s)                                                                       \
    extern "C" __global__ void all_finite_##s(const T *x, unsigned int *nonfinite, size_t n) { \
        all_finite_t<T>(x, nonfinite, n);                                                      \
    }
FOR_FLOATS(ALL_FINITE)

// A chunk of a dense weight updated while its input gradient still needs the weight before the
// step in the compute dtype T (bf16 or f16; ops::dense_adam): as adam_f32 on f32
// p, g, m, v, and besides old[i] = p[i] before the step, rounded to T (from_f32: the cast's
// rounding), so the input gradient's GEMM reads what the unfused layer's cast of the weight holds.
// The step itself is adam_one's, so p, m and v are those bits of adam_f32.

// Four values rounded to T, packed little-endian into 8 bytes (elements 4i .. 4i + 3).
template <typename T> __device__ __forceinline__ uint2 pack4(float4 f) {
    uint2 r;
    r.x = (u32)from_f32<T>(f.x).bits | ((u32)from_f32<T>(f.y).bits << 16);
    r.y = (u32)from_f32<T>(f.z).bits | ((u32)from_f32<T>(f.w).bits << 16);
    return r;
}

// One element per thread and iteration (any alignment).
template <typename T>
__device__ __forceinline__ void adam_old_t(float *p, const float *g, float *m, float *v, T *old,
                                           AdamHyper h, size_t n) {
    GRID_STRIDE(i, n) {
        float pi = p[i], mi = m[i], vi = v[i];
        old[i] = from_f32<T>(pi);
        adam_one(pi, g[i], mi, vi, h);
        m[i] = mi;
        v[i] = vi;
        p[i] = pi;
    }
}

// 16 bytes per f32 array and thread (8 of old): n / 4 float4s, then the last n % 4 elements by
// the first threads of block 0. p, g, m, v 16-byte aligned, old 8-byte aligned or null (then
// nothing but the step: adam_vec_f32).
template <typename T>
__device__ __forceinline__ void adam_old_vec_t(float *__restrict__ p, const float *__restrict__ g,
                                               float *__restrict__ m, float *__restrict__ v,
                                               T *__restrict__ old, AdamHyper h, size_t n) {
    size_t n4 = n / 4;
    float4 *p4 = (float4 *)p, *m4 = (float4 *)m, *v4 = (float4 *)v;
    const float4 *g4 = (const float4 *)g;
    uint2 *old4 = (uint2 *)old;
    GRID_STRIDE(i, n4) {
        float4 gi = g4[i], mi = m4[i], vi = v4[i], pi = p4[i];
        if (old) old4[i] = pack4<T>(pi);
        adam_one(pi.x, gi.x, mi.x, vi.x, h);
        adam_one(pi.y, gi.y, mi.y, vi.y, h);
        adam_one(pi.z, gi.z, mi.z, vi.z, h);
        adam_one(pi.w, gi.w, mi.w, vi.w, h);
        m4[i] = mi;
        v4[i] = vi;
        p4[i] = pi;
    }
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n - 4 * n4) {
        size_t j = 4 * n4 + t;
        float pj = p[j], mj = m[j], vj = v[j];
        if (old) old[j] = from_f32<T>(pj);
        adam_one(pj, g[j], mj, vj, h);
        m[j] = mj;
        v[j] = vj;
        p[j] = pj;
    }
}

// adam_old_<T>, adam_old_vec_<T> for the two 16-bit dtypes.
#define ADAM_OLD(T, s)                                                                         \
    extern "C" __global__ void adam_old_##s(float *p, const float *g, float *m, float *v,      \
                                            T *old, AdamHyper h, size_t n) {                   \
        adam_old_t<T>(p, g, m, v, old, h, n);                                                  \
    }                                                                                          \
    extern "C" __global__ void adam_old_vec_##s(float *p, const float *g, float *m, float *v,  \
                                                T *old, AdamHyper h, size_t n) {               \
        adam_old_vec_t<T>(p, g, m, v, old, h, n);                                              \
    }
ADAM_OLD(bf16_t, bf16)
ADAM_OLD(f16_t, f16)

// adam_f32's step on n floats, 16 bytes per array and thread: n / 4 float4s, then the last n % 4
// elements by the first threads of block 0. All four arrays 16-byte aligned.
extern "C" __global__ void adam_vec_f32(float *__restrict__ p, const float *__restrict__ g,
                                        float *__restrict__ m, float *__restrict__ v,
                                        AdamHyper h, size_t n) {
    adam_old_vec_t<bf16_t>(p, g, m, v, (bf16_t *)0, h, n);
}

