// Timing harness of kernels/dense_bulk.cu (no Rust needed, run on the GPU machine by
// benches/cuda/dense_bulk.sh): dense_adam_bulk_<dtype> at the seed's dense shape (k =
// 2,560,000 weight rows, n = 128 outputs) for argv: dtype (f32 | bf16), batch m (100), stages
// (0: as many as fit, as the launcher picks), x_threads (1: x by the threads' cp.async, 0: by
// bulk copies), runs (15), "check" (the two x modes' outputs compared bit for bit first);
// against adam_vec_f32 over a weight of the same size. Prints the median and the bytes moved per second (w, mu, nu read and
// written, x read, dx written). Timing only: the kernel's results are checked against the CPU
// by tests/fused_dense.rs.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>
#include <vector>
#include "src.cu"
#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e = (x);                                                                   \
        if (e != cudaSuccess) {                                                                \
            printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e));                   \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)
// Seeded uniform values in [lo, hi) as f32 (bf16: rounded, two bytes an element).
__global__ void fill(void *p, size_t n, int bf16, unsigned seed, float lo, float hi) {
    GRID_STRIDE(i, n) {
        unsigned h = (unsigned)(i * 2654435761u) ^ seed;
        h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
        const float v = lo + (hi - lo) * (h & 0xffffff) / 16777216.0f;
        if (bf16) ((bf16_t *)p)[i] = from_f32<bf16_t>(v);
        else ((float *)p)[i] = v;
    }
}
int main(int argc, char **argv) {
    const int bf16 = argc > 1 && !strcmp(argv[1], "bf16"), es = bf16 ? 2 : 4;
    const int m = argc > 2 ? atoi(argv[2]) : 100, want = argc > 3 ? atoi(argv[3]) : 0;
    const int xt = argc > 4 ? atoi(argv[4]) : 1, reps = argc > 5 ? atoi(argv[5]) : 15, n = 128;
    const size_t k = 2560000;
    int sms, optin;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    void *x, *dy, *dx;
    float *w, *mu, *nu, *g;
    CK(cudaMalloc(&x, m * k * es)), CK(cudaMalloc(&dx, m * k * es)), CK(cudaMalloc(&dy, m * n * es));
    CK(cudaMalloc(&w, k * n * 4)), CK(cudaMalloc(&mu, k * n * 4)), CK(cudaMalloc(&nu, k * n * 4));
    CK(cudaMalloc(&g, k * n * 4));
    auto refill = [&] {
        fill<<<1024, 256>>>(x, m * k, bf16, 1, 0, 1), fill<<<1024, 256>>>(dy, m * n, bf16, 2, -1, 1);
        fill<<<1024, 256>>>(w, k * n, 0, 3, -0.1f, 0.1f);
        fill<<<1024, 256>>>(mu, k * n, 0, 4, -0.01f, 0.01f);
        fill<<<1024, 256>>>(nu, k * n, 0, 5, 0, 0.01f), fill<<<1024, 256>>>(g, k * n, 0, 6, -1, 1);
        CK(cudaDeviceSynchronize());
    };
    refill();
    AdamHyper h = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 0.19f, 0.002f, 1.0f};
    // the launcher's layout (crates/stax-tensor/src/cuda/kernels/dense.rs, bulk_shared_bytes)
    const int mp = (m + 15) & ~15;
    const size_t fixed = (size_t)(mp + 16) * (n + 8) * es + 16 * (n + 8) * 4;
    const size_t stage = 3 * 16 * n * 4 + mp * 24 * es + 8;
    int stages = std::min<int>(8, (int)((optin - fixed) / stage));
    if (want) stages = want;
    const size_t smem = fixed + stages * stage;
    auto kb = dense_adam_bulk_bf16;
    auto kf = dense_adam_bulk_f32;
    CK(cudaFuncSetAttribute(kb, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CK(cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const int blocks = (int)std::min<size_t>((k + 15) / 16, sms);
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    auto time = [&](auto run) {
        std::vector<float> t;
        for (int r = 0; r < reps; r++) {
            cudaEventRecord(a);
            run();
            cudaEventRecord(b);
            CK(cudaEventSynchronize(b));
            float ms;
            cudaEventElapsedTime(&ms, a, b);
            t.push_back(ms);
        }
        CK(cudaGetLastError());
        std::sort(t.begin(), t.end());
        return t;
    };
    auto launch = [&](int mode) {
        if (bf16)
            kb<<<blocks, 256, smem>>>((bf16_t *)x, (bf16_t *)dy, w, mu, nu, (bf16_t *)dx, h, m, n, k, stages, mode);
        else
            kf<<<blocks, 256, smem>>>((float *)x, (float *)dy, w, mu, nu, (float *)dx, h, m, n, k, stages, mode);
    };
    // both ways of loading x give the same bits (the tests check x_threads = 1 against the CPU)
    std::vector<char> first[4];
    void *outs[4] = {w, mu, nu, dx};
    const size_t sizes[4] = {k * n * 4, k * n * 4, k * n * 4, m * k * es};
    for (int mode = 0; mode < 2 && argc > 6 && !strcmp(argv[6], "check"); ++mode) {
        refill();
        launch(mode);
        CK(cudaDeviceSynchronize());
        for (int i = 0; i < 4; ++i) {
            std::vector<char> host(sizes[i]);
            CK(cudaMemcpy(host.data(), outs[i], sizes[i], cudaMemcpyDeviceToHost));
            if (mode == 0) first[i] = host;
            else if (host != first[i]) printf("x_threads 0 and 1 differ in output %d\n", i);
        }
    }
    auto tk = time([&] { launch(xt); });
    auto ta = time([&] { adam_vec_f32<<<sms * 32, 256>>>(w, g, mu, nu, h, k * n); });
    const double bytes = 6.0 * k * n * 4 + 2.0 * m * k * es;
    printf("%s m=%d stages=%d x_threads=%d smem=%zu: kernel min %.3f med %.3f ms (%.2f TB/s) | adam_vec_f32 "
           "med %.3f ms (%.2f TB/s)\n",
           bf16 ? "bf16" : "f32", m, stages, xt, smem, tk[0], tk[reps / 2], bytes / tk[reps / 2] / 1e9,
           ta[reps / 2], 28.0 * k * n / ta[reps / 2] / 1e9);
    return 0;
}
