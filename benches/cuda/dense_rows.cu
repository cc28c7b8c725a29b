// Timing harness of kernels/adam.cu's one-pass dense update for small batches (no Rust needed,
// run on the GPU machine by benches/cuda/dense_rows.sh): dense_adam_rows_t<M> at the seed's
// dense shape (k = 2,560,000 weight rows, n = 128 outputs, batch M = argv[1]: 1, 10 or 16),
// with adam_one's exact step and with adam_tf32's (the TF32 kernels), against adam_vec_f32
// over a weight of the same size, on seeded random data, with the launcher's grid (k / 128
// blocks, at most 32 a multiprocessor). Prints the median of 15 runs, the bytes moved per ms
// (w, mu, nu read and written, x read, dx written) and an FNV-1a hash of w, mu, nu and dx
// after one step from the seeded state: builds of the kernel that compute the same bits print
// the same hash.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <vector>
#include "src.cu"
#include "harness.cuh"
#define KR(M)                                                                                  \
    extern "C" __global__ void DENSE_ROWS_BOUNDS                                         \
        r##M(const float *x, const float *dy, float *w, float *mu, float *nu, float *dx,      \
             AdamHyper h, int n, size_t k) {                                                   \
        dense_adam_rows_t<M, false>(x, dy, w, mu, nu, dx, h, n, k);                            \
    }                                                                                          \
    extern "C" __global__ void DENSE_ROWS_BOUNDS                                         \
        f##M(const float *x, const float *dy, float *w, float *mu, float *nu, float *dx,      \
             AdamHyper h, int n, size_t k) {                                                   \
        dense_adam_rows_t<M, true>(x, dy, w, mu, nu, dx, h, n, k);                             \
    }
KR(1) KR(10) KR(16)
typedef void (*Kernel)(const float *, const float *, float *, float *, float *, float *,
                       AdamHyper, int, size_t);
int main(int argc, char **argv) {
    const int m = argc > 1 ? atoi(argv[1]) : 10;
    const size_t k = 2560000;
    const int n = 128, reps = 15;
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    DenseArrays a(m, n, k);
    AdamHyper h = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 0.19f, 0.002f, 1.0f};
    if (m != 1 && m != 10 && m != 16) return printf("no kernel for m %d\n", m), 1;
    const std::pair<const char *, Kernel> ks[] = {
        {"adam_one", m == 1 ? r1 : m == 16 ? r16 : r10},
        {"adam_tf32", m == 1 ? f1 : m == 16 ? f16 : f10},
    };
    const size_t groups = (k + 31) / 32, warps = DENSE_ROWS_WARPS;
    const int blocks = (int)std::min((groups + warps - 1) / warps, (size_t)sms * 32);
    auto time = [&](auto launch) { return timed_ms(launch, reps, 0, [] {}); };
    const double bytes = 6.0 * k * n * 4 + 2.0 * m * k * 4;
    for (auto [name, f] : ks) {
        a.seed();
        auto run = [&] {
            f<<<blocks, 32 * DENSE_ROWS_WARPS>>>(a.x, a.dy, a.w, a.mu, a.nu, a.dx, h, n, k);
        };
        run();
        CK(cudaDeviceSynchronize());
        unsigned long long hash = fnv(a.dx, (m * k) * 4, a.hash_wmv());
        auto tk = time(run);
        printf("m=%d %-9s grid=%d: min %.3f med %.3f ms (%.2f TB/s) | hash %016llx\n", m, name,
               blocks, tk[0], tk[reps / 2], bytes / tk[reps / 2] / 1e9, hash);
    }
    auto ta = time([&] { adam_vec_f32<<<sms * 32, 256>>>(a.w, a.g, a.mu, a.nu, h, k * n); });
    printf("m=%d adam_vec_f32 med %.3f ms\n", m, ta[reps / 2]);
    return 0;
}
