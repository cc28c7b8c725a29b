// Checks and times kernels/dense_mma.cu's dense_grads_x3 (full fp32's dense gradients of a
// chunk in 3xTF32, BENCHMARKS.md): g and dx against f64 sums of the f32 operands on six shapes
// (partial strips, batches no multiple of 8, in place), the error relative to the sum of the
// terms' magnitudes; then the seed's update at batch argv[1] (100) by chunks of 131,072 rows:
// cuBLAS's f32 GEMMs (CUBLAS_DEFAULT_MATH, as CudaBackend's chunks ran them) against the kernel,
// each with adam_vec_f32, median of 9 runs. On the GPU machine, from the repo root:
// bash benches/cuda/dense_x3.sh [batch]
#include "../../kernels/common.cuh"
#include "harness.cuh"
#include "../../kernels/adam.cu"
#include "../../kernels/dense_mma.cu"
#include <cmath>
#include <cstring>
#include <cublas_v2.h>
typedef void (*Kern)(const float *, const float *, const float *, float *, float *, int, int,
                     size_t, size_t);
static Kern pick(int mb) {
    static const Kern all[16] = {
        dense_grads_x3_mb1,  dense_grads_x3_mb2,  dense_grads_x3_mb3,  dense_grads_x3_mb4,
        dense_grads_x3_mb5,  dense_grads_x3_mb6,  dense_grads_x3_mb7,  dense_grads_x3_mb8,
        dense_grads_x3_mb9,  dense_grads_x3_mb10, dense_grads_x3_mb11, dense_grads_x3_mb12,
        dense_grads_x3_mb13, dense_grads_x3_mb14, dense_grads_x3_mb15, dense_grads_x3_mb16};
    return all[mb - 1];
}
static int sms;
static void launch(const float *x, const float *dy, const float *w, float *g, float *dx, int m,
                   int n, size_t rows, size_t ldx) {
    int mb = (m + 7) / 8;
    Kern f = pick(mb);
    size_t smem = 2 * 4 * (size_t)mb * 8 * (((n + 31) & ~31) + 8);
    static bool set[17]; // each kernel allowed its most (128 outputs) once
    if (!set[mb]) {
        const int most = 2 * 4 * mb * 8 * (128 + 8);
        CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, most));
        set[mb] = true;
    }
    int per = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, f, 32 * DG_WARPS, smem));
    size_t strips = (rows + 15) / 16;
    size_t blocks = std::min((strips + DG_WARPS - 1) / DG_WARPS, (size_t)sms * per);
    f<<<(unsigned)blocks, 32 * DG_WARPS, smem>>>(x, dy, w, g, dx, m, n, rows, ldx);
    CK(cudaGetLastError());
}
// checks dw and dx of a chunk (cols c0 .. c0 + r of x [m, k]) against f64; inplace: dx = x
static bool check(int m, int n, size_t k, size_t c0, size_t r, bool inplace, unsigned seed) {
    std::vector<float> hx(m * k), hdy(m * n), hw(k * n);
    srand(seed);
    for (auto &v : hx) v = (rand() & 3) == 0 ? 0.0f : rand() / (float)RAND_MAX;
    for (auto &v : hdy) v = 2 * rand() / (float)RAND_MAX - 1;
    for (auto &v : hw) v = 0.2f * rand() / (float)RAND_MAX - 0.1f;
    float *x, *dy, *w, *g, *dx;
    CK(cudaMalloc(&x, m * k * 4)); CK(cudaMalloc(&dy, m * n * 4)); CK(cudaMalloc(&w, k * n * 4));
    CK(cudaMalloc(&g, r * n * 4)); CK(cudaMalloc(&dx, m * k * 4));
    CK(cudaMemcpy(x, hx.data(), m * k * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dy, hdy.data(), m * n * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(w, hw.data(), k * n * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(dx, 0xff, m * k * 4));
    float *dxo = inplace ? x : dx;
    launch(x + c0, dy, w + c0 * n, g, dxo + c0, m, n, r, k);
    CK(cudaDeviceSynchronize());
    std::vector<float> hg(r * n), hdx(m * k);
    CK(cudaMemcpy(hg.data(), g, r * n * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hdx.data(), dxo, m * k * 4, cudaMemcpyDeviceToHost));
    double eg = 0, ed = 0; bool untouched = true;
    for (size_t i = 0; i < r; ++i)
        for (int j = 0; j < n; ++j) {
            double s = 0, a = 0;
            for (int b = 0; b < m; ++b) { double p = (double)hx[b * k + c0 + i] * hdy[b * n + j]; s += p; a += fabs(p); }
            double e = fabs(hg[i * n + j] - s) / (a + 1e-30);
            eg = std::max(eg, e);
        }
    for (int b = 0; b < m; ++b)
        for (size_t i = 0; i < k; ++i) {
            float got = hdx[b * k + i];
            if (i < c0 || i >= c0 + r) {
                unsigned want = 0xffffffffu; // the poison, or x where dx is in place
                if (inplace) memcpy(&want, &hx[b * k + i], 4);
                if (memcmp(&got, &want, 4) != 0) untouched = false;
                continue;
            }
            double s = 0, a = 0;
            for (int j = 0; j < n; ++j) { double p = (double)hdy[b * n + j] * hw[i * n + j]; s += p; a += fabs(p); }
            ed = std::max(ed, fabs(got - s) / (a + 1e-30));
        }
    const bool ok = untouched && eg < 2e-6 && ed < 2e-6;
    printf("check m=%d n=%d k=%zu c0=%zu r=%zu inplace=%d: dw err %.2e dx err %.2e (of sum|terms|), untouched %s -> %s\n",
           m, n, k, c0, r, inplace, eg, ed, untouched ? "ok" : "CHANGED", ok ? "PASS" : "FAIL");
    cudaFree(x); cudaFree(dy); cudaFree(w); cudaFree(g); cudaFree(dx);
    return ok;
}
int main(int argc, char **argv) {
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    bool all = true;
    all &= check(100, 128, 5000, 1000, 3001, false, 1);
    all &= check(100, 128, 5000, 1000, 3001, true, 2);
    all &= check(17, 64, 3000, 16, 2000, true, 3);
    all &= check(3, 8, 1000, 5, 333, false, 4);
    all &= check(128, 128, 4096, 0, 4096, true, 5);
    all &= check(100, 120, 2000, 7, 1993, false, 6);
    printf("checks %s\n", all ? "all passed" : "FAILED");
    // the seed's update at batch m: k = 2,560,000, n = 128, chunks of 131,072 rows
    int m = argc > 1 ? atoi(argv[1]) : 100, n = 128;
    size_t k = 2560000, rows = 131072;
    DenseArrays d(m, n, k);
    d.seed();
    AdamHyper h = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 0.19f, 0.002f, 1.0f};
    cublasHandle_t blas;
    cublasCreate(&blas);
    const float one = 1, zero = 0;
    auto chunks = [&](auto body) { for (size_t r0 = 0; r0 < k; r0 += rows) body(r0, std::min(rows, k - r0)); };
    auto dw_blas = [&](size_t r0, size_t r) { cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, n, (int)r, m, &one, d.dy, n, d.x + r0, (int)k, &zero, d.g + r0 * n, n); };
    auto dx_blas = [&](size_t r0, size_t r) { cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)r, m, n, &one, d.w + r0 * n, n, d.dy, n, &zero, d.dx + r0, (int)k); };
    auto adam = [&](size_t r0, size_t r) { adam_vec_f32<<<sms * 32, 256>>>(d.w + r0 * n, d.g + r0 * n, d.mu + r0 * n, d.nu + r0 * n, h, r * n); };
    auto ours = [&](size_t r0, size_t r) { launch(d.x + r0, d.dy, d.w + r0 * n, d.g + r0 * n, d.dx + r0, m, n, r, k); };
    auto none = [] {};
    auto med = [&](auto f) { auto t = timed_ms(f, 9, 2, none); return t[t.size() / 2]; };
    float t_dwb = med([&] { chunks(dw_blas); });
    float t_dxb = med([&] { chunks(dx_blas); });
    float t_adam = med([&] { chunks(adam); });
    float t_ours = med([&] { chunks(ours); });
    float t_dw = med([&] { chunks([&](size_t r0, size_t r) { launch(d.x + r0, d.dy, d.w + r0 * n, d.g + r0 * n, nullptr, m, n, r, k); }); });
    float t_blas_all = med([&] { chunks([&](size_t a, size_t b) { dw_blas(a, b); dx_blas(a, b); adam(a, b); }); });
    float t_ours_all = med([&] { chunks([&](size_t a, size_t b) { ours(a, b); adam(a, b); }); });
    double gb = (2.0 * m * k + 2.0 * k * n) * 4 / 1e9;
    printf("seed m=%d: cuBLAS dw %.3f dx %.3f | adam_vec %.3f | dense_grads_x3 %.3f ms (%.2f TB/s of x, w read, g, dx written)\n",
           m, t_dwb, t_dxb, t_adam, t_ours, gb / t_ours);
    printf("seed m=%d: dense_grads_x3 without dx (dw alone) %.3f ms\n", m, t_dw);
    printf("seed m=%d: chunks cuBLAS+adam %.3f ms | chunks x3+adam %.3f ms\n", m, t_blas_all, t_ours_all);
    return all ? 0 : 1;
}
