// adam.cu: one fused, in-place Adam step (optax.adam: scale_by_adam then
// scale_by_learning_rate; Kingma & Ba 2014, Algorithm 1, eps outside the square root).

// Must match `AdamHyper` in crates/stax-tensor/src/backend.rs (#[repr(C)], seven f32).
struct AdamHyper {
    float lr;
    float b1;
    float b2;
    float eps;
    float eps_root;
    float bias_correction1;
    float bias_correction2;
};

// m = (1 - b1) g + b1 m; v = (1 - b2) g^2 + b2 v;
// p += (-lr) * (m / bc1) / (sqrt(v / bc2 + eps_root) + eps).
// Explicitly rounded operations (no FMA contraction), in the CPU backend's order, so both
// backends give the same bits.
extern "C" __global__ void adam_f32(float *p, const float *g, float *m, float *v, AdamHyper h,
                                    size_t n) {
    float step = -h.lr;
    GRID_STRIDE(i, n) {
        float gi = g[i];
        float mi = __fadd_rn(__fmul_rn(1.0f - h.b1, gi), __fmul_rn(h.b1, m[i]));
        float vi = __fadd_rn(__fmul_rn(1.0f - h.b2, __fmul_rn(gi, gi)), __fmul_rn(h.b2, v[i]));
        m[i] = mi;
        v[i] = vi;
        float mhat = __fdiv_rn(mi, h.bias_correction1);
        float vhat = __fdiv_rn(vi, h.bias_correction2);
        float denom = __fadd_rn(__fsqrt_rn(__fadd_rn(vhat, h.eps_root)), h.eps);
        p[i] = __fadd_rn(p[i], __fmul_rn(step, __fdiv_rn(mhat, denom)));
    }
}
