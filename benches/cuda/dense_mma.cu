// Timing harness of kernels/dense_mma.cu (no Rust needed, run on the GPU machine by
// benches/cuda/dense_mma.sh): dense_adam_mma_t<MB> at the seed's dense shape (k = 2,560,000
// weight rows, n = 128 outputs, batch m from argv[1], default 100) against adam_vec_f32 over a
// weight of the same size, on seeded random data; prints the median of argv[2] (15) runs and
// the bytes moved per ms (w, mu, nu read and written, x read, dx written). Timing only: the
// kernel's results are checked against the CPU by tests/fused_dense.rs.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#include "src.cu"
#define KK(MB) extern "C" __global__ void __launch_bounds__(32 * DM_WARPS, DM_BLOCKS) k##MB(const float *x, const float *dy, float *w, float *mu, float *nu, float *dx, AdamHyper h, int m, int n, size_t k) { dense_adam_mma_t<MB>(x, dy, w, mu, nu, dx, h, m, n, k); }
KK(3) KK(8) KK(13) KK(16)
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)
__global__ void fill(float *p, size_t n, unsigned seed, float lo, float hi) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)(i * 2654435761u) ^ seed; h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    p[i] = lo + (hi - lo) * (h & 0xffffff) / 16777216.0f;
  }
}
int main(int argc, char **argv) {
  int m = argc > 1 ? atoi(argv[1]) : 100; size_t k = 2560000; int n = 128; int reps = argc > 2 ? atoi(argv[2]) : 15;
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  float *x, *dy, *w, *mu, *nu, *g, *dx;
  CK(cudaMalloc(&x, m * k * 4)); CK(cudaMalloc(&dx, m * k * 4)); CK(cudaMalloc(&dy, m * n * 4));
  CK(cudaMalloc(&w, k * n * 4)); CK(cudaMalloc(&mu, k * n * 4)); CK(cudaMalloc(&nu, k * n * 4)); CK(cudaMalloc(&g, k * n * 4));
  fill<<<1024, 256>>>(x, m * k, 1, 0, 1); fill<<<1024, 256>>>(dy, m * n, 2, -1, 1);
  fill<<<1024, 256>>>(w, k * n, 3, -0.1f, 0.1f); fill<<<1024, 256>>>(mu, k * n, 4, -0.01f, 0.01f);
  fill<<<1024, 256>>>(nu, k * n, 5, 0, 0.01f); fill<<<1024, 256>>>(g, k * n, 6, -1, 1);
  CK(cudaDeviceSynchronize());
  AdamHyper h = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 0.19f, 0.002f, 1.0f};
  int mb = (m + 7) / 8; size_t smem = 4 * (DM_WARPS * 2 * DM_STAGE + 8 * mb * (((n + 31) & ~31) + 8));
  auto f = mb == 13 ? k13 : mb == 16 ? k16 : mb == 8 ? k8 : k3; if (mb != 13 && mb != 16 && mb != 8 && mb != 3) { printf("no kernel for mb %d\n", mb); return 1; }
  CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  int per_sm = 0; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, f, 32 * DM_WARPS, smem));
  size_t strips = (k + 15) / 16; int blocks = (int)std::min((strips + DM_WARPS - 1) / DM_WARPS, (size_t)sms * per_sm);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  auto time = [&](auto run) { std::vector<float> t; for (int r = 0; r < reps; r++) { cudaEventRecord(a); run(); cudaEventRecord(b); CK(cudaEventSynchronize(b)); float ms; cudaEventElapsedTime(&ms, a, b); t.push_back(ms);} CK(cudaGetLastError()); std::sort(t.begin(), t.end()); return t; };
  auto tk = time([&] { f<<<blocks, 32 * DM_WARPS, smem>>>(x, dy, w, mu, nu, dx, h, m, n, k); });
  auto ta = time([&] { adam_vec_f32<<<sms * 32, 256>>>(w, g, mu, nu, h, k * n); });
  double bytes = 6.0 * k * n * 4 + 2.0 * m * k * 4;
  printf("m=%d blocks=%d (%d/SM) smem=%zu: kernel min %.3f med %.3f ms (%.2f TB/s) | adam_vec_f32 med %.3f ms\n",
    m, blocks, per_sm, smem, tk[0], tk[reps/2], bytes / tk[reps/2] / 1e9, ta[reps/2]);
  return 0;
}
