/*
 * gemm_check.c - gyre-cpu-gemm-check: every path of src/cpu/gemm.c (the few-rows kernel; the
 * blocked one with A read in place or packed, B packed plain or transposed; all four
 * transpositions; shapes around MR, NR, MC, KC and NC; ragged leading dimensions; accumulate or
 * not; 1 to 3 threads, so the row blocks and column shares split both ways) against a
 * double-precision reference, with the columns between N and ldc checked untouched.
 * Seeded; prints the failing cases and a last line "N cases, M off"; exit status 1 when a
 * case is off by more than 1e-5 relative to its largest value.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/cpu/gemm.h"

/* sizes that sit on and beside the kernel's block edges (MR 4/6/8, NR 16/32, MC, KC 256, NC 2048) */
static const int sizes[] = {1, 2, 5, 6, 7, 13, 16, 17, 31, 33, 95, 96, 97, 128, 191, 257, 300, 577, 2049};
#define N_SIZES (int)(sizeof sizes / sizeof sizes[0])

static unsigned long long rng = 88172645463325252ULL;

static unsigned next_u(void) { /* xorshift64 */
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (unsigned)(rng >> 32);
}

static float next_f(void) { return (float)(next_u() % 2001) / 1000.0f - 1.0f; }

static int pick(void) { return sizes[next_u() % N_SIZES]; }

static float *filled(size_t n) {
  float *p = malloc(n * sizeof(float));
  if (!p) exit(2);
  for (size_t i = 0; i < n; i++) p[i] = next_f();
  return p;
}

/* one random case: 1 when it is off */
static int run_case(int M, int N, int K, int ta, int tb, int accumulate, int threads) {
  int lda = (ta ? M : K) + (int)(next_u() % 3), ldb = (tb ? K : N) + (int)(next_u() % 3), ldc = N + (int)(next_u() % 3);
  float *a = filled((size_t)(ta ? K : M) * lda), *b = filled((size_t)(tb ? N : K) * ldb);
  float *c = filled((size_t)M * ldc), *want = malloc((size_t)M * ldc * sizeof(float));
  if (!want) exit(2);
  memcpy(want, c, (size_t)M * ldc * sizeof(float));
  double top = 1e-30;
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double s = accumulate ? want[(size_t)i * ldc + j] : 0.0;
      for (int k = 0; k < K; k++)
        s += (double)(ta ? a[(size_t)k * lda + i] : a[(size_t)i * lda + k]) * (tb ? b[(size_t)j * ldb + k] : b[(size_t)k * ldb + j]);
      want[(size_t)i * ldc + j] = (float)s;
      top = fabs(s) > top ? fabs(s) : top;
    }
  cpu_use_threads(threads);
  gemm(M, N, K, a, lda, ta, b, ldb, tb, c, ldc, accumulate);
  double worst = 0.0;
  for (size_t i = 0; i < (size_t)M * ldc; i++) {
    double d = fabs((double)c[i] - want[i]) / top;
    worst = d > worst ? d : worst;
  }
  int off = worst > 1e-5;
  if (off) printf("off: M %d N %d K %d ta %d tb %d accumulate %d threads %d: %.3g\n", M, N, K, ta, tb, accumulate, threads, worst);
  free(a);
  free(b);
  free(c);
  free(want);
  return off;
}

int main(int argc, char **argv) {
  int cases = argc > 1 ? atoi(argv[1]) : 400, off = 0;
  for (int n = 0; n < cases; n++) {
    int M = pick(), N = pick(), K = pick();
    if ((double)M * N * K > 2e8) { /* keep the reference quick: shrink the largest */
      n--;
      continue;
    }
    off += run_case(M, N, K, (int)(next_u() % 2), (int)(next_u() % 2), (int)(next_u() % 2), 1 + (int)(next_u() % 3));
  }
  printf("%d cases, %d off\n", cases, off);
  return off != 0;
}
