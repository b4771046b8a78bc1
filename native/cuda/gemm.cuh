/* gemm.cuh - single-precision matrix multiply on the device (see gemm.cu). */
#ifndef GYRE_CUDA_GEMM_CUH
#define GYRE_CUDA_GEMM_CUH

#include "cuda_common.cuh"

/* C[M,N] = (accumulate ? C : 0) + A[M,K] . B[K,N], row-major with leading dimensions, the
 * same contract as the CPU backend's gemm:
 *   A(m,k) = trans_a ? a[k*lda + m] : a[m*lda + k]
 *   B(k,n) = trans_b ? b[n*ldb + k] : b[k*ldb + n]
 * Queued on ctx's stream; the summation order depends only on the shapes and the device's
 * SM count, so results are bit-identical run to run. */
gyre_status gemm(exec_ctx *ctx, int M, int N, int K, const float *a, int lda, int trans_a, const float *b,
                 int ldb, int trans_b, float *c, int ldc, int accumulate);

#endif
