/*
 * gemm_check.cu - gyre-cuda-gemm-check: every path of cuda/gemm.cu (skinny, 128 x 128 tiles,
 * 64 x 64 tiles, split-K; all four transpositions; ragged shapes and leading dimensions;
 * accumulate or not) against a double-precision reference on the host. The SM count that
 * picks the path is set per case, so small shapes reach every path (also in the emulator).
 * Prints one line per case; exit status 1 when one is off by more than 1e-5 relative.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "../gemm.cuh"

typedef struct gemm_case {
  int M, N, K, ta, tb, accumulate, sms;
  int pad; /* 0: packed leading dimensions (float4 loads), 1: ragged ones */
  const char *path;
} gemm_case;

static float *device_copy(const float *host, size_t n) {
  void *p = NULL;
  if (cudaMalloc(&p, n * sizeof(float)) != cudaSuccess ||
      cudaMemcpy(p, host, n * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess) {
    fprintf(stderr, "gyre-cuda-gemm-check: device allocation or copy failed\n");
    exit(2);
  }
  return (float *)p;
}

/* max |got - want| / max |want| for one case */
static double run_case(exec_ctx *ctx, const gemm_case *g) {
  const int lda = (g->ta ? g->M : g->K) + 3 * g->pad, ldb = (g->tb ? g->K : g->N) + g->pad, ldc = g->N + 2 * g->pad;
  const size_t na = (size_t)(g->ta ? g->K : g->M) * lda, nb = (size_t)(g->tb ? g->N : g->K) * ldb,
               nc = (size_t)g->M * ldc;
  float *a = (float *)malloc(na * sizeof(float)), *b = (float *)malloc(nb * sizeof(float));
  float *c = (float *)malloc(nc * sizeof(float)), *got = (float *)malloc(nc * sizeof(float));
  unsigned s = 12345u + (unsigned)g->M * 7u + (unsigned)g->K;
  for (size_t i = 0; i < na; i++) a[i] = (float)((s = s * 1103515245u + 12345u) >> 9) / 8388608.0f - 1.0f;
  for (size_t i = 0; i < nb; i++) b[i] = (float)((s = s * 1103515245u + 12345u) >> 9) / 8388608.0f - 1.0f;
  for (size_t i = 0; i < nc; i++) c[i] = (float)((s = s * 1103515245u + 12345u) >> 9) / 8388608.0f - 1.0f;
  float *da = device_copy(a, na), *db = device_copy(b, nb), *dc = device_copy(c, nc);
  ctx->num_sms = g->sms;
  if (gemm(ctx, g->M, g->N, g->K, da, lda, g->ta, db, ldb, g->tb, dc, ldc, g->accumulate) != GYRE_OK ||
      ctx_sync(ctx) != GYRE_OK || cudaMemcpy(got, dc, nc * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) {
    char msg[512];
    gyre_last_error(msg, sizeof msg);
    fprintf(stderr, "gyre-cuda-gemm-check: %s\n", msg);
    exit(2);
  }
  double err = 0.0, scale = 0.0;
  for (int m = 0; m < g->M; m++)
    for (int n = 0; n < ldc; n++) {
      const size_t at = (size_t)m * ldc + n;
      double want = c[at]; /* columns past N are padding: untouched */
      if (n < g->N) {
        double sum = 0.0;
        for (int k = 0; k < g->K; k++)
          sum += (double)(g->ta ? a[(size_t)k * lda + m] : a[(size_t)m * lda + k]) *
                 (g->tb ? b[(size_t)n * ldb + k] : b[(size_t)k * ldb + n]);
        want = g->accumulate ? want + sum : sum;
      }
      err = fmax(err, fabs(got[at] - want));
      scale = fmax(scale, fabs(want));
    }
  cudaFree(da), cudaFree(db), cudaFree(dc);
  free(a), free(b), free(c), free(got);
  return err / scale;
}

int main(void) {
  exec_ctx ctx;
  if (ctx_open(&ctx, 0) != GYRE_OK) {
    fprintf(stderr, "gyre-cuda-gemm-check: no CUDA device\n");
    return 2;
  }
  /* sms is what gemm() sees as the device's SM count: it picks the path */
  const gemm_case cases[] = {
      {1, 37, 64, 0, 1, 0, 132, 0, "skinny m=1 vec"},       {13, 70, 33, 0, 1, 1, 132, 1, "skinny m=13 scalar acc"},
      {16, 129, 128, 0, 1, 0, 132, 0, "skinny m=16 vec"},   {130, 200, 40, 0, 0, 0, 1, 1, "128x128 NN"},
      {130, 200, 40, 0, 1, 1, 1, 1, "128x128 NT acc"},      {130, 200, 40, 1, 0, 1, 1, 1, "128x128 TN acc"},
      {129, 131, 17, 1, 1, 0, 1, 1, "128x128 TT"},          {70, 65, 21, 0, 0, 0, 132, 1, "64x64 NN"},
      {70, 65, 21, 0, 1, 1, 132, 1, "64x64 NT acc"},        {70, 65, 21, 1, 0, 0, 132, 1, "64x64 TN"},
      {17, 33, 1000, 0, 1, 0, 4, 1, "64x64 NT split-K"},    {64, 100, 700, 1, 0, 1, 4, 1, "64x64 TN split-K acc"},
      {65, 63, 513, 0, 0, 1, 8, 1, "64x64 NN split-K acc"}, {3, 5, 7, 1, 1, 0, 132, 1, "64x64 TT tiny"},
  };

  int failures = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const gemm_case *g = &cases[i];
    const double err = run_case(&ctx, g);
    const int ok = err <= 1e-5;
    failures += !ok;
    printf("%-4s %-24s M=%d N=%d K=%d  rel err %.2e\n", ok ? "ok" : "FAIL", g->path, g->M, g->N, g->K, err);
  }
  ctx_close(&ctx);
  printf("%d passed, %d failed\n", (int)(sizeof cases / sizeof cases[0]) - failures, failures);
  return failures > 0;
}
