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

// m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr * (m / bc1) / (sqrt(v / bc2 + eps_root) + eps).
extern "C" __global__ void adam_f32(float *p, const float *g, float *m, float *v, AdamHyper h,
                                    size_t n) {
    GRID_STRIDE(i, n) {
        float gi = g[i];
        float mi = h.b1 * m[i] + (1.0f - h.b1) * gi;
        float vi = h.b2 * v[i] + (1.0f - h.b2) * (gi * gi);
        m[i] = mi;
        v[i] = vi;
        float mhat = mi / h.bias_correction1;
        float vhat = vi / h.bias_correction2;
        p[i] -= h.lr * (mhat / (sqrtf(vhat + h.eps_root) + h.eps));
    }
}
