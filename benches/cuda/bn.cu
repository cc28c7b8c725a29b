// Timing harness of kernels/norm.cu's vectorized batch-normalization passes at ResNet-50's
// batch-128 NHWC shapes, f32 (no Rust needed; run on the GPU machine by benches/cuda/bn.sh):
// the forward statistics (channel_moments_vec over x, x), the backward sums (over dy, x with
// the mean as shift and a ReLU mask), the forward apply with its ReLU mask (bn_apply_vec) and
// the backward apply (bn_bwd_apply_vec), each with the launcher's grid, against a device copy
// of the same tensor. L2 is flushed (a 256 MiB memset) before each timed run; median of 15.
// Prints, per shape, each pass's ms and GB/s (least bytes: each input read once, each output
// written once) and an FNV-1a hash of everything the passes wrote from a seeded state: builds
// of the kernels that compute the same bits print the same hashes.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <vector>
#include "src.cu"
#include "harness.cuh"
static void *flush_buf;
static const size_t FLUSH = 256u << 20;

// The median ms of 15 runs of `run` after 3, L2 flushed before each.
template <typename F> static float median_ms(F run) {
    auto t = timed_ms(run, 15, 3, [] { CK(cudaMemsetAsync(flush_buf, 1, FLUSH)); });
    return t[t.size() / 2];
}

int main() {
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaMalloc(&flush_buf, FLUSH));
    // (rows = n h w, c) of ResNet-50 at batch 128, 224x224: the stem, then each stage's
    // bottleneck widths and expanded widths
    const size_t shapes[][2] = {{1605632, 64}, {401408, 64},  {401408, 256},
                                {100352, 128}, {100352, 512}, {25088, 256},
                                {25088, 1024}, {6272, 512},   {6272, 2048}};
    printf("%8s %5s | %-15s | %-15s | %-15s | %-15s | %-15s | hash\n", "rows", "c", "copy",
           "moments x,x", "moments dy,x", "apply+relu", "bwd apply");
    double total[5] = {0, 0, 0, 0, 0};
    for (auto &sh : shapes) {
        const size_t rows = sh[0], c = sh[1], n = rows * c, n8 = n / 8, c8 = c / 8;
        const size_t words = (n + 31) / 32;
        const size_t wave = 4 * (size_t)sms, cap = std::max<size_t>((4u << 20) / (16 * c), 1);
        const size_t splits = std::min(std::max<size_t>((n8 + 255) / 256, 1), std::min(wave, cap));
        size_t blocks = std::min(std::max<size_t>((n8 + 255) / 256, 1), (size_t)sms * 32);
        size_t period = c8 >> std::min(__builtin_ctzll(c8), 8);
        if (period <= 64) blocks = (blocks + period - 1) / period * period;
        float *x, *dy, *dy0, *y, *mean, *scale, *beta, *coef;
        u32 *mask, *ymask;
        double *partial;
        for (float **p : {&x, &dy, &dy0, &y}) CK(cudaMalloc(p, n * 4));
        for (float **p : {&mean, &scale, &beta}) CK(cudaMalloc(p, c * 4));
        CK(cudaMalloc(&coef, 3 * c * 4));
        CK(cudaMalloc(&mask, words * 4));
        CK(cudaMalloc(&ymask, words * 4));
        CK(cudaMalloc(&partial, splits * c * 16));
        fill<<<1024, 256>>>(x, n, 1, -1, 3);
        fill<<<1024, 256>>>(dy0, n, 2, -1, 1);
        fill<<<1024, 256>>>(mean, c, 3, 0, 1);
        fill<<<1024, 256>>>(scale, c, 4, 0.5f, 2);
        fill<<<1024, 256>>>(beta, c, 5, -0.5f, 0.5f);
        fill<<<1024, 256>>>(coef, 3 * c, 6, 0, 1);
        fill<<<1024, 256>>>((float *)mask, words, 7, 0, 1);
        CK(cudaMemcpy(dy, dy0, n * 4, cudaMemcpyDeviceToDevice));
        // the mask: the fill's bits (its float's bit pattern)
        CK(cudaDeviceSynchronize());
        auto copy = [&] { CK(cudaMemcpyAsync(y, x, n * 4, cudaMemcpyDeviceToDevice)); };
        auto fwd = [&] {
            channel_moments_vec_f32<<<splits, 256>>>(x, x, nullptr, nullptr, partial, n8, c);
        };
        auto bwd = [&] {
            channel_moments_vec_f32<<<splits, 256>>>(dy, x, mean, mask, partial, n8, c);
        };
        auto apply = [&] {
            bn_apply_vec_f32<<<blocks, 256>>>(x, y, mean, scale, beta, ymask, n8, c8);
        };
        auto bapply = [&] {
            bn_bwd_apply_vec_f32<<<blocks, 256>>>(x, dy, mean, coef, mask, n8, c8);
        };
        unsigned long long h = 1469598103934665603ull;
        fwd();
        h = fnv(partial, splits * c * 16, h);
        bwd();
        h = fnv(partial, splits * c * 16, h);
        apply();
        h = fnv(ymask, words * 4, fnv(y, n * 4, h));
        bapply();
        h = fnv(dy, n * 4, h);
        CK(cudaGetLastError());
        float t[5] = {median_ms(copy), median_ms(fwd), median_ms(bwd), median_ms(apply),
                      median_ms(bapply)};
        double bytes[5] = {8.0 * n, 4.0 * n, 8.0 * n + n / 8.0, 8.0 * n + n / 8.0,
                           12.0 * n + n / 8.0};
        printf("%8zu %5zu |", rows, c);
        for (int k = 0; k < 5; ++k) {
            printf(" %6.3f %5.0f GB/s |", t[k], bytes[k] / t[k] / 1e6);
            total[k] += t[k];
        }
        printf(" %016llx\n", h);
        for (float *p : {x, dy, dy0, y, mean, scale, beta, coef}) cudaFree(p);
        cudaFree(mask);
        cudaFree(ymask);
        cudaFree(partial);
    }
    printf("sum over the shapes, ms: copy %.3f, moments x,x %.3f, moments dy,x %.3f, apply %.3f, "
           "bwd apply %.3f\n",
           total[0], total[1], total[2], total[3], total[4]);
    return 0;
}
