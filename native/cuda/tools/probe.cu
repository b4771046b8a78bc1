/*
 * probe.cu - gyre-cuda-probe: what this GPU measures at, as the yardsticks of the engine's
 * GPU figures. Prints a table and, last, one JSON line:
 *   bandwidth_gbs   the better of a device-to-device copy and a read-only sweep over 1 GiB
 *                   buffers (bytes moved / time)
 *   sgemm_gflops    the engine's own F32 GEMM (cuda/gemm.cu) on 4096^3 and 8192^3, the best
 *   *_peak_*        the data sheet figures derived from the device's clocks, for context
 * Usage: gyre-cuda-probe [--json FILE]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../gemm.cuh"

#define CHECK(call)                                                                  \
  do {                                                                               \
    cudaError_t e_ = (call);                                                         \
    if (e_ != cudaSuccess) {                                                         \
      fprintf(stderr, "gyre-cuda-probe: %s failed: %s\n", #call, cudaGetErrorString(e_)); \
      exit(2);                                                                       \
    }                                                                                \
  } while (0)

__global__ void copy_k(float4 *__restrict__ dst, const float4 *__restrict__ src, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

__global__ void read_k(float *__restrict__ out, const float4 *__restrict__ src, size_t n) {
  float s = 0.0f;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const float4 v = src[i];
    s += v.x + v.y + v.z + v.w;
  }
  if (s == 12345.678f) *out = s; /* keeps the loads */
}

__global__ void fill_k(float *x, size_t n, float scale) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    x[i] = scale * (float)((i * 2654435761u) % 1000) / 1000.0f;
}

/* Milliseconds per run of `fn`, the best of `reps` after one warm-up run. */
template <typename F>
static float time_ms(cudaStream_t stream, int reps, F fn) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  fn();
  float best = 1e30f;
  for (int r = 0; r < reps; r++) {
    CHECK(cudaEventRecord(a, stream));
    fn();
    CHECK(cudaEventRecord(b, stream));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    if (ms < best) best = ms;
  }
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  return best;
}

int main(int argc, char **argv) {
  const char *out = argc == 3 && strcmp(argv[1], "--json") == 0 ? argv[2] : NULL;
  if (argc != 1 && out == NULL) {
    fprintf(stderr, "usage: gyre-cuda-probe [--json FILE]\n");
    return 2;
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    fprintf(stderr, "gyre-cuda-probe: no CUDA device\n");
    return 2;
  }
  exec_ctx ctx;
  if (ctx_open(&ctx, 0) != GYRE_OK) {
    char msg[512];
    gyre_last_error(msg, sizeof msg);
    fprintf(stderr, "gyre-cuda-probe: %s\n", msg);
    return 2;
  }
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  int clock_khz = 0, mem_khz = 0, bus_bits = 0;
  CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  CHECK(cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, 0));
  CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0));
  const double fp32_peak = (double)ctx.num_sms * 128 * 2 * clock_khz * 1e3 / 1e9; /* 128 FP32 lanes per SM */
  const double bw_peak = 2.0 * mem_khz * 1e3 * (bus_bits / 8) / 1e9;

  /* bandwidth */
  const size_t bytes = (size_t)1 << 30, n4 = bytes / sizeof(float4);
  float4 *a, *b;
  float *sink;
  CHECK(cudaMalloc(&a, bytes));
  CHECK(cudaMalloc(&b, bytes));
  CHECK(cudaMalloc(&sink, sizeof(float)));
  const unsigned grid = (unsigned)ctx.num_sms * 8;
  fill_k<<<grid, 256, 0, ctx.stream>>>((float *)a, bytes / sizeof(float), 1.0f);
  const float copy_ms = time_ms(ctx.stream, 10, [&] { copy_k<<<grid, 256, 0, ctx.stream>>>(b, a, n4); });
  const float read_ms = time_ms(ctx.stream, 10, [&] { read_k<<<grid, 256, 0, ctx.stream>>>(sink, a, n4); });
  CHECK(cudaGetLastError());
  const double copy_gbs = 2.0 * bytes / (copy_ms * 1e-3) / 1e9, read_gbs = bytes / (read_ms * 1e-3) / 1e9;
  const double bandwidth = copy_gbs > read_gbs ? copy_gbs : read_gbs;
  CHECK(cudaFree(a));
  CHECK(cudaFree(b));

  /* the engine's SGEMM */
  double sgemm = 0.0;
  const int sizes[2] = {4096, 8192};
  double per_size[2];
  for (int k = 0; k < 2; k++) {
    const int n = sizes[k];
    const size_t elems = (size_t)n * n;
    float *x, *y, *z;
    CHECK(cudaMalloc(&x, elems * sizeof(float)));
    CHECK(cudaMalloc(&y, elems * sizeof(float)));
    CHECK(cudaMalloc(&z, elems * sizeof(float)));
    fill_k<<<grid, 256, 0, ctx.stream>>>(x, elems, 0.01f);
    fill_k<<<grid, 256, 0, ctx.stream>>>(y, elems, 0.01f);
    bool failed = false;
    const float ms = time_ms(ctx.stream, 5, [&] {
      if (gemm(&ctx, n, n, n, x, n, 0, y, n, 1, z, n, 0) != GYRE_OK) failed = true;
    });
    if (failed) {
      char msg[512];
      gyre_last_error(msg, sizeof msg);
      fprintf(stderr, "gyre-cuda-probe: gemm failed: %s\n", msg);
      return 2;
    }
    per_size[k] = 2.0 * n * (double)n * n / (ms * 1e-3) / 1e9;
    if (per_size[k] > sgemm) sgemm = per_size[k];
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
    CHECK(cudaFree(z));
  }
  CHECK(cudaDeviceSynchronize());

  printf("device            %s (%d SMs, %d MHz, memory %d MHz x %d bits)\n", prop.name, ctx.num_sms, clock_khz / 1000,
         mem_khz / 1000, bus_bits);
  printf("copy bandwidth    %.0f GB/s\n", copy_gbs);
  printf("read bandwidth    %.0f GB/s   (data sheet from clocks: %.0f GB/s)\n", read_gbs, bw_peak);
  printf("engine SGEMM      %.0f GFLOP/s at 4096^3, %.0f at 8192^3   (F32 peak from clocks: %.0f)\n", per_size[0],
         per_size[1], fp32_peak);
  char json[1024];
  snprintf(json, sizeof json,
           "{\"device\":\"%s\",\"sms\":%d,\"bandwidth_gbs\":%.1f,\"copy_gbs\":%.1f,\"read_gbs\":%.1f,"
           "\"bandwidth_peak_gbs\":%.1f,\"sgemm_gflops\":%.1f,\"sgemm_4096_gflops\":%.1f,\"sgemm_8192_gflops\":%.1f,"
           "\"fp32_peak_gflops\":%.1f}",
           prop.name, ctx.num_sms, bandwidth, copy_gbs, read_gbs, bw_peak, sgemm, per_size[0], per_size[1], fp32_peak);
  printf("%s\n", json);
  if (out != NULL) {
    FILE *f = fopen(out, "w");
    if (f == NULL) return 2;
    fprintf(f, "%s\n", json);
    fclose(f);
  }
  ctx_close(&ctx);
  return 0;
}
