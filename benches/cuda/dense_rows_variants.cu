// Variants of the rows kernel at the seed's batch-10 shape (dense_rows_variants.cuh) beside the
// committed one and an older one (benches/cuda/dense_rows_variants.sh): median of REPS runs,
// TB/s, the hash of w, mu, nu and dx's largest difference from the committed kernel's.
#include <cmath>
#include "src.cu"
#include "harness.cuh"
#include "old.cuh"
#include "dense_rows_variants.cuh"
typedef void (*Kernel)(const float *, const float *, float *, float *, float *, float *,
                       AdamHyper, int, size_t);
#define V(NAME, M, PF, WPB, MINB, AD, RED, LA)                                                \
    extern "C" __global__ void __launch_bounds__(32 * WPB, MINB)                               \
        NAME(const float *x, const float *dy, float *w, float *mu, float *nu, float *dx,      \
             AdamHyper h, int n, size_t k) {                                                   \
        variant_t<M, PF, WPB, AD, RED, LA>(x, dy, w, mu, nu, dx, h, n, k);                      \
    }
extern "C" __global__ void __launch_bounds__(32 * DENSE_ROWS_WARPS, 5)
    old_tf32(const float *x, const float *dy, float *w, float *mu, float *nu, float *dx,
         AdamHyper h, int n, size_t k) {
    old::dense_adam_rows_t<10, true>(x, dy, w, mu, nu, dx, h, n, k);
}
extern "C" __global__ void DENSE_ROWS_BOUNDS
    base(const float *x, const float *dy, float *w, float *mu, float *nu, float *dx,
         AdamHyper h, int n, size_t k) {
    dense_adam_rows_t<10, true>(x, dy, w, mu, nu, dx, h, n, k);
}
extern "C" __global__ void DENSE_ROWS_BOUNDS
    base_exact(const float *x, const float *dy, float *w, float *mu, float *nu, float *dx,
               AdamHyper h, int n, size_t k) {
    dense_adam_rows_t<10, false>(x, dy, w, mu, nu, dx, h, n, k);
}
// Names: h four adjacent columns a lane (with dx's sums by shuffles unless t: through shared
// memory), f the approximate Adam step, d the next row loaded ahead, pfN L2 asked N rows ahead,
// bN at least N blocks a multiprocessor (else 4), x_ adam_one's exact step (else adam_tf32's).
V(h_w4_b4, 10, 2, 4, 4, 0, 0, false)
V(ht_pf0, 10, 0, 4, 4, 0, 1, false)
V(ht_pf1, 10, 1, 4, 4, 0, 1, false)
V(ht_pf2, 10, 2, 4, 4, 0, 1, false)
V(ht_pf3, 10, 3, 4, 4, 0, 1, false)
V(ht_pf4, 10, 4, 4, 4, 0, 1, false)
V(ht_pf1_b3, 10, 1, 4, 3, 0, 1, false)
V(ht_pf2_b5, 10, 2, 4, 5, 0, 1, false)
V(htd_pf1_b3, 10, 1, 4, 3, 0, 1, true)
V(htd_pf2_b3, 10, 2, 4, 3, 0, 1, true)
V(htd_pf3_b3, 10, 3, 4, 3, 0, 1, true)
V(hft_pf1, 10, 1, 4, 4, 1, 1, false)
V(x_ht_exact, 10, 1, 4, 4, 2, 1, false)
struct Var {
    const char *name;
    Kernel f;
    int wpb;
};
int main() {
    const int m = 10, n = 128, reps = std::max(1, getenv("REPS") ? atoi(getenv("REPS")) : 15);
    const int passes = getenv("PASSES") ? atoi(getenv("PASSES")) : 2;
    const size_t k = 2560000;
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    DenseArrays a(m, n, k);
    AdamHyper h = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 0.19f, 0.002f, 1.0f};
    const Var vs[] = {
        {"base", base, DENSE_ROWS_WARPS},
        {"old_tf32", old_tf32, DENSE_ROWS_WARPS},
        {"base_exact", base_exact, DENSE_ROWS_WARPS},
        {"h_w4_b4", h_w4_b4, 4},
        {"ht_pf0", ht_pf0, 4},
        {"ht_pf1", ht_pf1, 4},
        {"ht_pf2", ht_pf2, 4},
        {"ht_pf3", ht_pf3, 4},
        {"ht_pf4", ht_pf4, 4},
        {"ht_pf1_b3", ht_pf1_b3, 4},
        {"ht_pf2_b5", ht_pf2_b5, 4},
        {"htd_pf1_b3", htd_pf1_b3, 4},
        {"htd_pf2_b3", htd_pf2_b3, 4},
        {"htd_pf3_b3", htd_pf3_b3, 4},
        {"hft_pf1", hft_pf1, 4},
        {"x_ht_exact", x_ht_exact, 4},
    };
    const size_t groups = (k + 31) / 32;
    const double bytes = 6.0 * k * n * 4 + 2.0 * m * k * 4;
    std::vector<float> dx0(m * k), dxv(m * k);
    for (int pass = 0; pass < passes; ++pass)
        for (const Var &v : vs) {
            a.seed();
            const int blocks = (int)std::min((groups + v.wpb - 1) / v.wpb, (size_t)sms * 32);
            auto run = [&] {
                v.f<<<blocks, 32 * v.wpb>>>(a.x, a.dy, a.w, a.mu, a.nu, a.dx, h, n, k);
            };
            run();
            CK(cudaDeviceSynchronize());
            const unsigned long long hash = a.hash_wmv();
            CK(cudaMemcpy(dxv.data(), a.dx, m * k * 4, cudaMemcpyDeviceToHost));
            if (&v == vs) dx0 = dxv;
            double dmax = 0, scale = 0;
            for (size_t i = 0; i < m * k; ++i) {
                dmax = std::max(dmax, (double)fabsf(dxv[i] - dx0[i]));
                scale = std::max(scale, (double)fabsf(dx0[i]));
            }
            auto tk = timed_ms(run, reps, 0, [] {});
            printf("pass %d %-18s grid=%d: min %.3f med %.3f ms (%.2f TB/s) | wmv %016llx | "
                   "dx rel %.2e\n",
                   pass, v.name, blocks, tk[0], tk[reps / 2], bytes / tk[reps / 2] / 1e9, hash,
                   dmax / scale);
        }
    auto ta = timed_ms([&] { adam_vec_f32<<<sms * 32, 256>>>(a.w, a.g, a.mu, a.nu, h, k * n); },
                       reps, 0, [] {});
    printf("adam_vec_f32 med %.3f ms (%.2f TB/s of 7 arrays)\n", ta[reps / 2],
           7.0 * k * n * 4 / ta[reps / 2] / 1e9);
    return 0;
}
