/* gemm.h - single-precision matrix multiply for the CPU backend (B in F32, or a 16-bit weight widened as read). */
#ifndef GYRE_CPU_GEMM_H
#define GYRE_CPU_GEMM_H

#include "gyre.h"

/* C[M,N] = (accumulate ? C : 0) + A[M,K] . B[K,N], row-major with leading dimensions:
 *   A(m,k) = trans_a ? a[k*lda + m] : a[m*lda + k]
 *   B(k,n) = trans_b ? b[n*ldb + k] : b[k*ldb + n]
 * Runs on gemm threads (see cpu_threads); call it outside any OpenMP parallel region. */
void gemm(int M, int N, int K, const float *a, int lda, int trans_a, const float *b, int ldb,
          int trans_b, float *c, int ldc, int accumulate);

/* C[M,N] = (accumulate ? C : 0) + A[M,K] . W^T for a row-major weight W [N,K] with leading
 * dimension ldw and elements of gyre_dtype wdtype (GYRE_F32, GYRE_F16, GYRE_BF16): 16-bit
 * elements are widened to F32 exactly as they are read, so the result has the bits of gemm
 * over an F32 W of the same values. */
void gemm_wt(int M, int N, int K, const float *a, int lda, const void *w, int wdtype, int ldw, float *c, int ldc,
             int accumulate);

/* A weight W stacked along N from parts held apart (a 16-bit checkpoint's q, k and v, or gate and
 * up, each mapped where its file has it): W's rows are part 0's rows[0] rows at w[0], then part
 * 1's, and so on, every row ldw elements of gyre_dtype dtype. */
#define GEMM_MAX_PARTS 4
typedef struct w_parts {
  int n; /* 1..GEMM_MAX_PARTS */
  const void *w[GEMM_MAX_PARTS];
  int rows[GEMM_MAX_PARTS];
  int dtype;
} w_parts;

/* gemm_wt with W given in parts: C[M, sum of rows] (+)= A . W^T, the same bits as gemm_wt over
 * the parts copied together, in one parallel region where few rows (decode) make it a stream
 * of W. */
void gemm_wt_parts(int M, int K, const float *a, int lda, const w_parts *wp, int ldw, float *c, int ldc, int accumulate);

/* The thread count every CPU kernel uses: the calling thread's (cpu_use_threads), else the
 * process default (cpu_set_threads; 0 means one per core). */
int cpu_threads(void);
int cpu_default_threads(void);
void cpu_set_threads(int n);
/* Threads for the OpenMP regions the calling thread starts from now on (0: the default). */
void cpu_use_threads(int n);
/* Threads for a loop of about `work` element operations: 1 when too small to pay for a
 * parallel region. */
int cpu_threads_for(double work);

#endif
