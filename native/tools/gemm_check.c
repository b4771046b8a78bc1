/*
 * gemm_check.c - gyre-cpu-gemm-check: every path of src/cpu/gemm.c (the few-rows kernel; the
 * blocked one with A read in place or packed, B packed plain or transposed; all four
 * transpositions; shapes around MR, NR, MC, KC and NC; ragged leading dimensions; accumulate or
 * not; 1 to 3 threads, so the row blocks and column shares split both ways) against a
 * double-precision reference, with the columns between N and ldc checked untouched.
 * Seeded; prints the failing cases and a last line "N cases, M off"; exit status 1 when a
 * case is off by more than 1e-5 relative to its largest value.
 *
 * With --w16, the cases are gemm_wt's (C = A . W^T, W of BF16 or F16 elements, each case both):
 * its result must have the bits of gemm over the F32 widening of the same W (widened here by
 * this file's own bit arithmetic), and be within 1e-5 of the double-precision reference; and
 * gemm_wt_parts over the same W cut into 1-4 parts held apart must give the same bits.
 */
#include <math.h>
#include <stdint.h>
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

/* The F32 value of a 16-bit element (this file's own arithmetic, not the library's). */
static float widened(uint16_t h, int dt) {
  if (dt == GYRE_BF16) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  float v = e == 0 ? ldexpf((float)m, -24) : ldexpf((float)(m | 0x400), e - 25);
  return h & 0x8000 ? -v : v; /* no infinities or NaNs are drawn */
}

/* gemm_wt_parts over W[N, ldw] split at random rows into 1-4 parts, each copied to its own
 * buffer, from C's values before the product (before) against gemm_wt's result (got): 1 when a
 * bit differs. */
static int parts_case(int M, int N, int K, const float *a, int lda, const uint16_t *w, int dt, int ldw, const float *before,
                      const float *got, int ldc, int accumulate) {
  w_parts wp = {.n = 1 + (int)(next_u() % GEMM_MAX_PARTS), .dtype = dt};
  if (wp.n > N) wp.n = N;
  for (int p = 0, from = 0; p < wp.n; p++) {
    int left = N - from - (wp.n - 1 - p); /* at least one row for each later part */
    wp.rows[p] = p == wp.n - 1 ? N - from : 1 + (int)(next_u() % (unsigned)left);
    uint16_t *part = malloc((size_t)wp.rows[p] * ldw * sizeof(uint16_t));
    if (!part) exit(2);
    memcpy(part, w + (size_t)from * ldw, (size_t)wp.rows[p] * ldw * sizeof(uint16_t));
    wp.w[p] = part;
    from += wp.rows[p];
  }
  float *c = malloc((size_t)M * ldc * sizeof(float));
  if (!c) exit(2);
  memcpy(c, before, (size_t)M * ldc * sizeof(float));
  gemm_wt_parts(M, K, a, lda, &wp, ldw, c, ldc, accumulate);
  int differ = memcmp(c, got, (size_t)M * ldc * sizeof(float)) != 0;
  for (int p = 0; p < wp.n; p++) free((void *)wp.w[p]);
  free(c);
  return differ;
}

/* one random gemm_wt case of dtype dt: 1 when it is off */
static int run_w16_case(int M, int N, int K, int accumulate, int threads, int dt) {
  int lda = K + (int)(next_u() % 3), ldw = K + (int)(next_u() % 3), ldc = N + (int)(next_u() % 3);
  float *a = filled((size_t)M * lda), *wide = malloc((size_t)N * ldw * sizeof(float));
  uint16_t *w = malloc((size_t)N * ldw * sizeof(uint16_t));
  float *c = filled((size_t)M * ldc), *c2 = malloc((size_t)M * ldc * sizeof(float));
  if (!wide || !w || !c2) exit(2);
  for (size_t i = 0; i < (size_t)N * ldw; i++) {
    uint16_t sign = next_u() & 1 ? 0x8000 : 0;
    /* BF16: exponents 2^-8..2^0; F16: 2^-14..2^0 and subnormals */
    w[i] = dt == GYRE_BF16 ? (uint16_t)(sign | (uint16_t)((119 + next_u() % 8) << 7) | (next_u() & 0x7f))
                           : (uint16_t)(sign | (uint16_t)((next_u() % 16) << 10) | (next_u() & 0x3ff));
    wide[i] = widened(w[i], dt);
  }
  memcpy(c2, c, (size_t)M * ldc * sizeof(float));
  double top = 1e-30, worst = 0.0;
  float *want = malloc((size_t)M * ldc * sizeof(float)), *before = malloc((size_t)M * ldc * sizeof(float));
  if (!want || !before) exit(2);
  memcpy(want, c, (size_t)M * ldc * sizeof(float));
  memcpy(before, c, (size_t)M * ldc * sizeof(float));
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double s = accumulate ? want[(size_t)i * ldc + j] : 0.0;
      for (int k = 0; k < K; k++) s += (double)a[(size_t)i * lda + k] * wide[(size_t)j * ldw + k];
      want[(size_t)i * ldc + j] = (float)s;
      top = fabs(s) > top ? fabs(s) : top;
    }
  cpu_use_threads(threads);
  gemm_wt(M, N, K, a, lda, w, dt, ldw, c, ldc, accumulate);
  gemm(M, N, K, a, lda, 0, wide, ldw, 1, c2, ldc, accumulate);
  for (size_t i = 0; i < (size_t)M * ldc; i++) {
    double d = fabs((double)c[i] - want[i]) / top;
    worst = d > worst ? d : worst;
  }
  int differ = memcmp(c, c2, (size_t)M * ldc * sizeof(float)) != 0;
  int parts_differ = parts_case(M, N, K, a, lda, w, dt, ldw, before, c, ldc, accumulate);
  int off = worst > 1e-5 || differ || parts_differ;
  if (off)
    printf("off: %s M %d N %d K %d accumulate %d threads %d: %.3g%s%s\n", dt == GYRE_BF16 ? "BF16" : "F16", M, N, K, accumulate,
           threads, worst, differ ? ", bits differ from the F32 widening" : "", parts_differ ? ", in parts bits differ" : "");
  free(a), free(wide), free(w), free(c), free(c2), free(want), free(before);
  return off;
}

int main(int argc, char **argv) {
  int w16 = argc > 1 && strcmp(argv[argc - 1], "--w16") == 0;
  int cases = argc > 1 + w16 ? atoi(argv[1]) : 400, off = 0;
  if (w16) {
    for (int n = 0; n < cases; n++) {
      int M = pick(), N = pick(), K = pick();
      if ((double)M * N * K > 1e8) {
        n--;
        continue;
      }
      int accumulate = (int)(next_u() % 2), threads = 1 + (int)(next_u() % 3);
      off += run_w16_case(M, N, K, accumulate, threads, GYRE_BF16) | run_w16_case(M, N, K, accumulate, threads, GYRE_F16);
    }
    printf("%d cases, %d off\n", cases, off);
    return off != 0;
  }
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
