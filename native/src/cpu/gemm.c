/* gemm.c - cache-blocked SGEMM with packed panels, a register-blocked micro-kernel and OpenMP.
 *
 * The BLIS loop nest: for each NC-wide column panel and KC-deep slice of B, B is packed
 * once (all threads together) into NR-wide slivers; then tasks (a block of at most MC rows of
 * A, blocks of equal rows, times a range of B slivers) are spread over the threads, each
 * running the MR x NR micro-kernel over its block's MR-row slivers: read in place from a
 * row-major A, packed from a transposed one. Packing performs the transposes, so one kernel
 * serves X.W^T (forward), dY.W (input gradient) and dY^T.X (weight gradient). The micro-kernel is written with GCC vector extensions: AVX-512 gives
 * 16-float vectors (MR x NR = 8 x 32), AVX2 8-float vectors (6 x 16), anything else 4-float
 * vectors the compiler lowers as it can.
 *
 * B may also be a row-major weight W [N, K] of 16-bit elements (gemm_wt: BF16 or F16): each
 * element is widened to F32 as it is read (BF16 by a shift, F16 by vcvtph2ps under AVX-512 or
 * F16C, else half.h's bit arithmetic), exactly, so products and sums are the F32 kernel's on
 * the widened values: a 16-bit W gives the bits an F32 W holding the same values gives.
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../half.h"
#include "gemm.h"

#if defined(__AVX512F__) || defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__)
#define VL 16
#define MR 8
#elif defined(__AVX2__) || defined(__AVX__)
#define VL 8
#define MR 6
#else
#define VL 4
#define MR 4
#endif
#define NV 2            /* vectors per micro-tile row */
#define NR (VL * NV)
#define KC 256
#define MC (MR * 16)
#define NC 2048

typedef float vf __attribute__((vector_size(VL * sizeof(float))));

/* The process default (gyre_set_num_threads; 0: one per core) and the calling thread's count
 * for the call it is running (its model's, set by cpu_use_threads; 0: the default), so calls
 * on different models from different threads each run their own OpenMP team of their size. */
static int default_threads = 0;
static _Thread_local int call_threads = 0;

int cpu_default_threads(void) {
  int n = __atomic_load_n(&default_threads, __ATOMIC_RELAXED);
  return n > 0 ? n : omp_get_num_procs();
}

int cpu_threads(void) { return call_threads > 0 ? call_threads : cpu_default_threads(); }

void cpu_set_threads(int n) { __atomic_store_n(&default_threads, n > 0 ? n : 0, __ATOMIC_RELAXED); }

void cpu_use_threads(int n) { call_threads = n > 0 ? n : 0; }

int cpu_threads_for(double work) { return work < 32768.0 ? 1 : cpu_threads(); }

static inline vf load_v(const float *p) {
  vf v;
  memcpy(&v, p, sizeof v);
  return v;
}

static inline void store_v(float *p, vf v) { memcpy(p, &v, sizeof v); }

/* Bytes of a weight element of gyre_dtype dt (F32, F16, BF16). */
static inline size_t w_size(int dt) { return dt == GYRE_F32 ? 4 : 2; }

/* Element i of a weight row of dtype dt, widened to F32 (exact). */
static inline __attribute__((always_inline)) float w_elem(const char *p, size_t i, int dt) {
  if (dt == GYRE_F32) {
    float f;
    memcpy(&f, p + 4 * i, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, p + 2 * i, 2);
  if (dt == GYRE_F16) return half_to_float(h);
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

typedef uint16_t vh __attribute__((vector_size(VL * sizeof(uint16_t))));
typedef uint32_t vu __attribute__((vector_size(VL * sizeof(uint32_t))));

/* VL weight elements of dtype dt from element i on, widened to F32 (exact): BF16 by zero-extending
 * each element to 32 bits and shifting it into the high half (with AVX-512 or AVX2 one widening
 * load and one shift: GCC's own lowering of the vector conversion, 256-bit halves extracted and
 * re-inserted, took 7 instructions a vector). */
static inline __attribute__((always_inline)) vf load_w(const char *p, size_t i, int dt) {
  if (dt == GYRE_F32) return load_v((const float *)(p + 4 * i));
  if (dt == GYRE_BF16) {
#if VL == 16 && defined(__AVX512F__)
    return (vf)_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p + 2 * i))), 16);
#elif VL == 8 && defined(__AVX2__)
    return (vf)_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + 2 * i))), 16);
#else
    vh h;
    memcpy(&h, p + 2 * i, sizeof h);
    vu u = __builtin_convertvector(h, vu) << 16;
    vf f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
  }
#if VL == 16 && defined(__AVX512F__)
  return (vf)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 2 * i)));
#elif VL == 8 && defined(__F16C__)
  return (vf)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 2 * i)));
#else
  float lanes[VL];
  for (int l = 0; l < VL; l++) lanes[l] = w_elem(p, i + (size_t)l, GYRE_F16);
  return load_v(lanes);
#endif
}

/* c[MR x NR] (ldc) = (accumulate ? c : 0) + A . bp[kc x NR], A(i, k) = a[i * ars + k * acs] for
 * i < MR, k < kc: a packed sliver (ars 1, acs MR) or MR rows of a row-major A read in place
 * (ars lda, acs 1). Inlined, so each caller's strides are constants where they are. */
static inline __attribute__((always_inline)) void micro_kernel(int kc, const float *restrict a, size_t ars, size_t acs,
                                                               const float *restrict bp, float *restrict c, int ldc,
                                                               int accumulate) {
  vf acc[MR][NV];
  for (int i = 0; i < MR; i++)
    for (int v = 0; v < NV; v++) acc[i][v] = (vf){0};
  for (int k = 0; k < kc; k++) {
    vf b[NV];
    for (int v = 0; v < NV; v++) b[v] = load_v(bp + v * VL);
    for (int i = 0; i < MR; i++)
      for (int v = 0; v < NV; v++) acc[i][v] += a[i * ars] * b[v];
    a += acs;
    bp += NR;
  }
  for (int i = 0; i < MR; i++)
    for (int v = 0; v < NV; v++) {
      float *dst = c + (size_t)i * ldc + v * VL;
      store_v(dst, accumulate ? load_v(dst) + acc[i][v] : acc[i][v]);
    }
}

/* A block (rows m0.., mc x kc at k0) into MR-row slivers, k-major, zero padded. */
static void pack_a(int mc, int kc, const float *a, int lda, int trans_a, int m0, int k0, int M, float *ap) {
  int rows = M - m0 < mc ? M - m0 : mc, slivers = (mc + MR - 1) / MR;
  if (trans_a) { /* source rows are k: read each once, contiguously, spreading it over the slivers */
    for (int k = 0; k < kc; k++) {
      const float *src = a + (size_t)(k0 + k) * lda + m0;
      for (int s = 0; s < slivers; s++) {
        float *dst = ap + (size_t)s * MR * kc + (size_t)k * MR;
        int n = rows - s * MR;
        if (n >= MR) memcpy(dst, src + s * MR, sizeof(float) * MR);
        else
          for (int i = 0; i < MR; i++) dst[i] = i < n ? src[s * MR + i] : 0.0f;
      }
    }
    return;
  }
  /* source rows are m: walk the sliver's MR rows together (MR streams for the prefetchers),
   * writing each k's MR values contiguously */
  for (int s = 0; s < slivers; s++, ap += (size_t)MR * kc) {
    int n = rows - s * MR;
    const float *src[MR];
    for (int i = 0; i < MR; i++) src[i] = a + (size_t)(m0 + s * MR + (i < n ? i : 0)) * lda + k0;
    if (n >= MR) {
      for (int k = 0; k < kc; k++)
        for (int i = 0; i < MR; i++) ap[k * MR + i] = src[i][k];
    } else {
      for (int k = 0; k < kc; k++)
        for (int i = 0; i < MR; i++) ap[k * MR + i] = i < n ? src[i][k] : 0.0f;
    }
  }
}

/* The transposed sliver of pack_b_sliver from B's rows (W's rows) of dtype dt, widened. */
static inline __attribute__((always_inline)) void pack_bt_sliver(int kc, const char *b, size_t ldb, int k0, int n, int cols,
                                                                 float *bp, int dt) {
  /* rows of b are columns of B; read 8 of them at a time */
  size_t es = w_size(dt);
  int j = 0;
  for (; j + 8 <= cols; j += 8) {
    const char *r[8];
    for (int t = 0; t < 8; t++) r[t] = b + ((size_t)(n + j + t) * ldb + k0) * es;
    for (int k = 0; k < kc; k++) {
      float *dst = bp + (size_t)k * NR + j;
      for (int t = 0; t < 8; t++) dst[t] = w_elem(r[t], k, dt);
    }
  }
  for (; j < cols; j++) {
    const char *src = b + ((size_t)(n + j) * ldb + k0) * es;
    for (int k = 0; k < kc; k++) bp[(size_t)k * NR + j] = w_elem(src, k, dt);
  }
  for (; j < NR; j++)
    for (int k = 0; k < kc; k++) bp[(size_t)k * NR + j] = 0.0f;
}

/* One NR-column sliver of B (columns n.., kc deep at k0), k-major, zero padded; a transposed
 * B (trans_b) may have 16-bit elements (bdt), widened as they are packed. */
static void pack_b_sliver(int kc, const void *bv, int ldb, int trans_b, int bdt, int k0, int n, int N, float *bp) {
  int cols = N - n < NR ? N - n : NR;
  if (trans_b) {
    switch (bdt) {
      case GYRE_BF16: pack_bt_sliver(kc, bv, (size_t)ldb, k0, n, cols, bp, GYRE_BF16); return;
      case GYRE_F16: pack_bt_sliver(kc, bv, (size_t)ldb, k0, n, cols, bp, GYRE_F16); return;
      default: pack_bt_sliver(kc, bv, (size_t)ldb, k0, n, cols, bp, GYRE_F32); return;
    }
  }
  const float *b = bv;
  for (int k = 0; k < kc; k++) {
    const float *src = b + (size_t)(k0 + k) * ldb + n;
    float *dst = bp + (size_t)k * NR;
    if (cols == NR) memcpy(dst, src, sizeof(float) * NR);
    else {
      int j = 0;
      for (; j < cols; j++) dst[j] = src[j];
      for (; j < NR; j++) dst[j] = 0.0f;
    }
  }
}

/* Packing buffers of the calling thread (its B panel and one A block per team thread),
 * grown on demand and kept, so calls from different threads never share them. */
static _Thread_local float *b_buf;
static _Thread_local size_t b_cap;
static _Thread_local float **a_bufs;
static _Thread_local int a_count;

static int ensure_buffers(int threads) {
  size_t b_need = (size_t)KC * NC;
  if (b_cap < b_need) {
    free(b_buf);
    b_buf = aligned_alloc(64, b_need * sizeof(float));
    b_cap = b_buf ? b_need : 0;
    if (!b_buf) return 0;
  }
  if (a_count < threads) {
    float **grown = realloc(a_bufs, sizeof(float *) * (size_t)threads);
    if (!grown) return 0;
    a_bufs = grown;
    for (int t = a_count; t < threads; t++) {
      a_bufs[t] = aligned_alloc(64, sizeof(float) * (size_t)MC * KC);
      if (!a_bufs[t]) return 0;
      a_count = t + 1;
    }
  }
  return 1;
}

/* The A of one task: an MC-tall block at (m0, k0), packed into MR-row slivers, or (a row-major A,
 * not transposed) read in place, only a last sliver of fewer than MR rows packed. */
typedef struct a_block {
  const float *a; /* its first row at k0 (in place) or the packed slivers */
  size_t lda;     /* in place: A's row stride; packed: 0 */
  const float *tail; /* in place: the packed last sliver when rows do not fill it (else NULL) */
} a_block;

/* Runs the MR x NR tiles of one A block against B slivers [j0, j1). */
static void macro_kernel(int mc, int kc, a_block ab, const float *bp, int j0, int j1, int n0, int N, float *c, int ldc,
                         int m0, int M, int accumulate) {
  float edge[MR * NR];
  for (int js = j0; js < j1; js++) {
    int n = n0 + js * NR;
    int cols = N - n < NR ? N - n : NR;
    const float *bs = bp + (size_t)js * NR * kc;
    for (int s = 0; s < mc; s += MR) {
      int rows = M - (m0 + s) < MR ? M - (m0 + s) : MR;
      float *dst = c + (size_t)(m0 + s) * ldc + n;
      int full = rows == MR && cols == NR;
      float *out = full ? dst : edge;
      int ld = full ? ldc : NR, acc = full && accumulate;
      if (ab.lda == 0) micro_kernel(kc, ab.a + (size_t)s * kc, 1, MR, bs, out, ld, acc);
      else if (rows < MR) micro_kernel(kc, ab.tail, 1, MR, bs, out, ld, acc);
      else micro_kernel(kc, ab.a + (size_t)s * ab.lda, ab.lda, 1, bs, out, ld, acc);
      if (full) continue;
      for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++)
          dst[(size_t)i * ldc + j] = (accumulate ? dst[(size_t)i * ldc + j] : 0.0f) + edge[i * NR + j];
    }
  }
}

/* Packs what the task's A block needs (all of it when transposed, else a short last sliver). */
static a_block a_block_of(int mc, int kc, const float *a, int lda, int trans_a, int m0, int k0, int M, float *ap) {
  if (trans_a) {
    pack_a(mc, kc, a, lda, trans_a, m0, k0, M, ap);
    return (a_block){ap, 0, NULL};
  }
  int rows = M - m0 < mc ? M - m0 : mc, last = rows / MR * MR;
  if (last < rows) pack_a(rows - last, kc, a, lda, 0, m0 + last, k0, M, ap);
  return (a_block){a + (size_t)m0 * lda + k0, (size_t)lda, last < rows ? ap : NULL};
}

/* Few rows times a row-major weight (C = A . W^T, W [N, K]): each output is a dot product
 * of an A row with a W row, computed 4 x 4 at a time in vector registers. W is streamed
 * once, unpacked: for decode (a handful of rows) packing would cost more than the math. */
#define FEW_ROWS 16
#define FEW_BLOCK 4

#if VL == 16 && FEW_BLOCK == 4
/* Lane 4i + j of the result = the sum of acc[i][j]'s 16 lanes: a transposing tree (pairs of
 * vectors interleaved and added four times: 15 adds and 30 shuffles for the 16 sums, where lane
 * by lane takes 240 dependent scalar adds, more than the dot products of a 128-deep block). */
static inline vf tree2(vf x, vf y, int g) {
  switch (g) { /* lanes in groups of g: x's, then y's; added to the next group of each */
  case 1: return __builtin_shufflevector(x, y, 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30) +
                 __builtin_shufflevector(x, y, 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
  case 2: return __builtin_shufflevector(x, y, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) +
                 __builtin_shufflevector(x, y, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
  case 4: return __builtin_shufflevector(x, y, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27) +
                 __builtin_shufflevector(x, y, 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
  default: return __builtin_shufflevector(x, y, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
                  __builtin_shufflevector(x, y, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  }
}

static inline vf tree_sums(const vf acc[FEW_BLOCK][FEW_BLOCK]) {
  const vf *v = &acc[0][0];
  vf p[8], q[4], r[2];
  for (int i = 0; i < 8; i++) p[i] = tree2(v[2 * i], v[2 * i + 1], 1);
  for (int i = 0; i < 4; i++) q[i] = tree2(p[2 * i], p[2 * i + 1], 2);
  for (int i = 0; i < 2; i++) r[i] = tree2(q[2 * i], q[2 * i + 1], 4);
  return tree2(r[0], r[1], 8);
}
#else
/* out[j] = the sum of acc[j]'s lanes. With 8-lane vectors a transposing tree (pairs within
 * each 128-bit half, twice, then the two halves: 7 vector ops for the 4 sums, where adding
 * lane by lane takes 28 dependent scalar adds), else lane by lane. */
static inline void lane_sums(const vf acc[FEW_BLOCK], float out[FEW_BLOCK]) {
#if VL == 8 && FEW_BLOCK == 4
  vf ab = __builtin_shufflevector(acc[0], acc[1], 0, 2, 8, 10, 4, 6, 12, 14) +
          __builtin_shufflevector(acc[0], acc[1], 1, 3, 9, 11, 5, 7, 13, 15);
  vf cd = __builtin_shufflevector(acc[2], acc[3], 0, 2, 8, 10, 4, 6, 12, 14) +
          __builtin_shufflevector(acc[2], acc[3], 1, 3, 9, 11, 5, 7, 13, 15);
  vf sums = __builtin_shufflevector(ab, cd, 0, 2, 8, 10, 4, 6, 12, 14) + __builtin_shufflevector(ab, cd, 1, 3, 9, 11, 5, 7, 13, 15);
  float lanes[VL]; /* lane j: acc[j]'s lanes 0-3, lane j + 4: its lanes 4-7 */
  memcpy(lanes, &sums, sizeof lanes);
  for (int j = 0; j < FEW_BLOCK; j++) out[j] = lanes[j] + lanes[j + 4];
#else
  for (int j = 0; j < FEW_BLOCK; j++) {
    float lanes[VL];
    memcpy(lanes, &acc[j], sizeof lanes);
    out[j] = 0.0f;
    for (int l = 0; l < VL; l++) out[j] += lanes[l];
  }
#endif
}
#endif

/* out[FEW_BLOCK * i + j] = the sum of acc[i][j]'s lanes, for i < MB. */
static inline void block_sums(int MB, const vf acc[FEW_BLOCK][FEW_BLOCK], float out[FEW_BLOCK * FEW_BLOCK]) {
#if VL == 16 && FEW_BLOCK == 4
  (void)MB;
  vf sums = tree_sums(acc);
  memcpy(out, &sums, sizeof sums);
#else
  for (int i = 0; i < MB; i++) lane_sums(acc[i], out + FEW_BLOCK * i);
#endif
}

/* Keeps a loaded vector in a register: GCC otherwise folds the load into every FMA that uses it
 * (4 W vectors x 4 rows: 16 loads a step instead of 4, measured 20-30% slower for decode). */
#if defined(__x86_64__)
#define IN_REGISTER(v) __asm__("" : "+v"(v))
#else
#define IN_REGISTER(v) ((void)0)
#endif

/* Bytes ahead of where a W row is being read that its lines are asked for (prefetch): W streams
 * from memory once a call, and a row is a new page or two that the hardware's prefetcher meets
 * cold. Near a row's end the lines asked for are the next block's row in the same slot. */
#ifndef FEW_AHEAD
#define FEW_AHEAD 1024
#endif

/* acc[i][j] += ar[i][k..k+VL) * wr[j][k..k+VL) lane by lane, for i < MB, j < FEW_BLOCK. */
static inline __attribute__((always_inline)) void few_step(int MB, const float *const *ar, const char *const *wr, int k,
                                                           int dt, vf acc[FEW_BLOCK][FEW_BLOCK]) {
  vf wv[FEW_BLOCK];
  for (int j = 0; j < FEW_BLOCK; j++) {
    wv[j] = load_w(wr[j], k, dt);
    IN_REGISTER(wv[j]);
  }
  for (int i = 0; i < MB; i++) {
    vf av = load_v(ar[i] + k);
    IN_REGISTER(av);
    for (int j = 0; j < FEW_BLOCK; j++) acc[i][j] += av * wv[j];
  }
}

/* few_step over k in [k0, k1) (multiples of VL), two at a time; with pf, each pair asks for the
 * lines from byte k es + ahead of pf[j] on (k es + ahead >= 0, inside pf[j]'s row). */
static inline __attribute__((always_inline)) void few_span(int MB, const float *const *ar, const char *const *wr, int k0,
                                                           int k1, const char *const *pf, ptrdiff_t ahead, int dt,
                                                           vf acc[FEW_BLOCK][FEW_BLOCK]) {
  const ptrdiff_t es = (ptrdiff_t)w_size(dt);
  int k = k0;
  for (; k + 2 * VL <= k1; k += 2 * VL) {
    if (pf != NULL)
      for (int j = 0; j < FEW_BLOCK; j++)
        for (ptrdiff_t b = 0; b < 2 * VL * es; b += 64) __builtin_prefetch(pf[j] + (k * es + ahead + b));
    few_step(MB, ar, wr, k, dt, acc);
    few_step(MB, ar, wr, k + VL, dt, acc);
  }
  if (k < k1) few_step(MB, ar, wr, k, dt, acc);
}

/* c[i][j] (+)= ar[i] . wr[j] over K for i < MB, j < nn: one block of gemm_few_rows, W's rows of
 * dtype dt (widened as read). MB (1-4) and dt are constants where inlined, so a block of fewer
 * rows does only its rows' arithmetic. Where `stream` is set (the first pass over these W rows),
 * lines FEW_AHEAD bytes ahead of each row are asked for as it is read, then, past its end, those
 * of the next block's rows nx (when there is one). Each lane sums its products in order of k,
 * whatever the pairs and prefetches: the bits are those of one FMA chain per lane. */
static inline __attribute__((always_inline)) void few_block(int MB, int nn, int K, const float *const *ar,
                                                            const char *const *wr, int stream, const char *const *nx,
                                                            float *c, int ldc, int accumulate, int dt) {
  const ptrdiff_t es = (ptrdiff_t)w_size(dt), row = (ptrdiff_t)K * es;
  int kv = K / VL * VL;
  /* own rows' lines FEW_AHEAD ahead while they last (k < ks, a multiple of 2 VL), then the next
   * block's from their start; rows too short for that ask for none */
  if (row < FEW_AHEAD + 2 * VL * es) stream = 0;
  int ks = stream ? (int)((row - FEW_AHEAD) / es) / (2 * VL) * (2 * VL) : kv;
  vf acc[FEW_BLOCK][FEW_BLOCK];
  for (int i = 0; i < FEW_BLOCK; i++)
    for (int j = 0; j < FEW_BLOCK; j++) acc[i][j] = (vf){0};
  few_span(MB, ar, wr, 0, ks, stream ? wr : NULL, FEW_AHEAD, dt, acc);
  few_span(MB, ar, wr, ks, kv, stream ? nx : NULL, -ks * es, dt, acc);
  float sums[FEW_BLOCK * FEW_BLOCK];
  block_sums(MB, acc, sums);
  for (int i = 0; i < MB; i++) {
    for (int j = 0; j < nn; j++) {
      float sum = sums[FEW_BLOCK * i + j];
      for (int k = kv; k < K; k++) sum = __builtin_fmaf(ar[i][k], w_elem(wr[j], k, dt), sum); /* fused for every dt alike */
      float *dst = c + (size_t)i * ldc + j;
      *dst = accumulate ? *dst + sum : sum;
    }
  }
}

/* Output columns [n0, n0 + FEW_BLOCK) of gemm_few_rows, every row, W of dtype dt; the rows of the
 * block read next (nnext of them from nw, ldw apart; nw NULL: none) are asked for ahead. */
static inline __attribute__((always_inline)) void few_columns(int nb, int M, int N, int K, const float *a, int lda,
                                                              const char *w, int ldw, float *c, int ldc, int accumulate,
                                                              const char *nw, int nnext, int dt) {
  int n0 = nb * FEW_BLOCK, nn = N - n0 < FEW_BLOCK ? N - n0 : FEW_BLOCK;
  size_t es = w_size(dt);
  const char *wr[FEW_BLOCK], *nx[FEW_BLOCK];
  for (int j = 0; j < FEW_BLOCK; j++) {
    wr[j] = w + (size_t)(n0 + (j < nn ? j : 0)) * ldw * es;
    nx[j] = nw != NULL ? nw + (size_t)(j < nnext ? j : 0) * ldw * es : NULL;
  }
  for (int m0 = 0; m0 < M; m0 += FEW_BLOCK) {
    int mm = M - m0 < FEW_BLOCK ? M - m0 : FEW_BLOCK;
    const float *ar[FEW_BLOCK];
    for (int i = 0; i < FEW_BLOCK; i++) ar[i] = a + (size_t)(m0 + (i < mm ? i : 0)) * lda;
    float *cb = c + (size_t)m0 * ldc + n0;
    const char *const *ahead = nw != NULL ? nx : NULL;
    int stream = m0 == 0; /* later rows find W in cache */
    switch (mm) {
      case 1: few_block(1, nn, K, ar, wr, stream, ahead, cb, ldc, accumulate, dt); break;
      case 2: few_block(2, nn, K, ar, wr, stream, ahead, cb, ldc, accumulate, dt); break;
      case 3: few_block(3, nn, K, ar, wr, stream, ahead, cb, ldc, accumulate, dt); break;
      default: few_block(FEW_BLOCK, nn, K, ar, wr, stream, ahead, cb, ldc, accumulate, dt); break;
    }
  }
}

/* few_columns for each weight dtype (the dtype a constant in each). */
typedef void (*few_columns_fn)(int, int, int, int, const float *, int, const char *, int, float *, int, int, const char *,
                               int);
#define FEW_COLUMNS_OF(name, dt)                                                                                   \
  static void name(int nb, int M, int N, int K, const float *a, int lda, const char *w, int ldw, float *c, int ldc, \
                   int accumulate, const char *nw, int nnext) {                                                    \
    few_columns(nb, M, N, K, a, lda, w, ldw, c, ldc, accumulate, nw, nnext, dt);                                   \
  }
FEW_COLUMNS_OF(few_columns_f32, GYRE_F32)
FEW_COLUMNS_OF(few_columns_bf16, GYRE_BF16)
FEW_COLUMNS_OF(few_columns_f16, GYRE_F16)
#undef FEW_COLUMNS_OF

/* The blocks of gemm_few_rows over W's parts: part p holds blocks [first[p], first[p + 1]) and
 * C's columns from off[p]. */
typedef struct few_plan {
  few_columns_fn run;
  const w_parts *wp;
  int first[GEMM_MAX_PARTS + 1], off[GEMM_MAX_PARTS];
  int M, K, lda, ldw, ldc, accumulate;
  const float *a;
  float *c;
} few_plan;

static inline int part_of(const few_plan *f, int g) {
  int p = 0;
  while (g >= f->first[p + 1]) p++;
  return p;
}

/* Block g, asking ahead for block `next` (-1: none), which may be in another part. */
static void few_part_block(const few_plan *f, int g, int next) {
  int p = part_of(f, g), nrows = 0;
  const char *nw = NULL;
  if (next >= 0) {
    int q = part_of(f, next), r0 = (next - f->first[q]) * FEW_BLOCK;
    nw = (const char *)f->wp->w[q] + (size_t)r0 * f->ldw * w_size(f->wp->dtype);
    nrows = f->wp->rows[q] - r0;
  }
  f->run(g - f->first[p], f->M, f->wp->rows[p], f->K, f->a, f->lda, f->wp->w[p], f->ldw, f->c + f->off[p], f->ldc,
         f->accumulate, nw, nrows);
}

/* Blocks a thread takes at a time, in turn: a thread that starts late (a passive OpenMP thread's
 * wake-up) or is preempted on a shared machine leaves its chunks to the others, where an even split
 * had one wait for the other's half. A thread takes its next chunk as it starts one, so the last
 * block of each asks ahead for the next one's first. */
#define FEW_CHUNK 8

/* C[M, sum of rows] (+)= A . W^T, W stacked from wp's parts. One thread runs the blocks in place:
 * entering an OpenMP region costs more than a tiny model's matmul of a few rows. */
static void gemm_few_rows(int M, int K, const float *a, int lda, const w_parts *wp, int ldw, float *c, int ldc,
                          int accumulate, int threads) {
  few_plan f = {.wp = wp, .M = M, .K = K, .lda = lda, .ldw = ldw, .ldc = ldc, .accumulate = accumulate, .a = a, .c = c};
  f.run = wp->dtype == GYRE_BF16 ? few_columns_bf16 : wp->dtype == GYRE_F16 ? few_columns_f16 : few_columns_f32;
  f.first[0] = f.off[0] = 0;
  for (int p = 0; p < wp->n; p++) {
    f.first[p + 1] = f.first[p] + (wp->rows[p] + FEW_BLOCK - 1) / FEW_BLOCK;
    if (p + 1 < wp->n) f.off[p + 1] = f.off[p] + wp->rows[p];
  }
  const int blocks = f.first[wp->n], chunks = (blocks + FEW_CHUNK - 1) / FEW_CHUNK;
  if (threads == 1) {
    for (int g = 0; g < blocks; g++) few_part_block(&f, g, g + 1 < blocks ? g + 1 : -1);
    return;
  }
  int taken = 0; /* chunks handed out */
#pragma omp parallel num_threads(threads)
  {
    int mine = __atomic_fetch_add(&taken, 1, __ATOMIC_RELAXED);
    while (mine < chunks) {
      int after = __atomic_fetch_add(&taken, 1, __ATOMIC_RELAXED), end = (mine + 1) * FEW_CHUNK;
      if (end > blocks) end = blocks;
      for (int g = mine * FEW_CHUNK; g < end; g++) few_part_block(&f, g, g + 1 < end ? g + 1 : after < chunks ? after * FEW_CHUNK : -1);
      mine = after;
    }
  }
}

/* How many A blocks an M-row product is cut into: enough that each fits the packing buffer (MC
 * rows) and, when there are at least as many as threads, a multiple of the threads, so that each
 * thread gets as many rows (two blocks of 96 and 32 rows had one thread do three times the other's work). */
static int a_block_count(int M, int nt) {
  int slivers = (M + MR - 1) / MR, blocks = (slivers + MC / MR - 1) / (MC / MR);
  if (blocks >= nt) blocks = (blocks + nt - 1) / nt * nt;
  return blocks < slivers ? blocks : slivers;
}

/* gemm with B of element type bdt (16-bit only when transposed: a row-major weight). */
static void gemm_typed(int M, int N, int K, const float *a, int lda, int trans_a, const void *b, int bdt, int ldb,
                       int trans_b, float *c, int ldc, int accumulate) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    if (!accumulate)
      for (int i = 0; i < M; i++) memset(c + (size_t)i * ldc, 0, sizeof(float) * (size_t)N);
    return;
  }
  int threads = cpu_threads_for((double)M * N * K / 64);
  if (M <= FEW_ROWS && trans_b && !trans_a) {
    w_parts one = {1, {b}, {N}, bdt};
    gemm_few_rows(M, K, a, lda, &one, ldb, c, ldc, accumulate, threads);
    return;
  }
  if (!ensure_buffers(threads)) abort(); /* a few MB; failing here means the host is out of memory */
  float *bpanel = b_buf, **ablocks = a_bufs;
#pragma omp parallel num_threads(threads)
  {
    int tid = omp_get_thread_num(), nt = omp_get_num_threads();
    int n_ic = a_block_count(M, nt), m_slivers = (M + MR - 1) / MR;
    float *ap = ablocks[tid];
    for (int n0 = 0; n0 < N; n0 += NC) {
      int nc = N - n0 < NC ? N - n0 : NC;
      int n_slivers = (nc + NR - 1) / NR;
      for (int k0 = 0; k0 < K; k0 += KC) {
        int kc = K - k0 < KC ? K - k0 : KC;
        int acc = accumulate || k0 > 0;
#pragma omp for schedule(static)
        for (int js = 0; js < n_slivers; js++)
          pack_b_sliver(kc, b, ldb, trans_b, bdt, k0, n0 + js * NR, N, bpanel + (size_t)js * NR * kc);
        /* tasks: (A block, share of the slivers); enough shares to give every thread work */
        int shares = nt <= n_ic ? 1 : (nt + n_ic - 1) / n_ic;
        if (shares > n_slivers) shares = n_slivers;
        int tasks = n_ic * shares;
        for (int task = tid; task < tasks; task += nt) {
          int ic = task / shares, share = task % shares;
          int m0 = MR * (m_slivers * ic / n_ic), m1 = MR * (m_slivers * (ic + 1) / n_ic);
          int mc = (m1 < M ? m1 : M) - m0;
          int j0 = n_slivers * share / shares, j1 = n_slivers * (share + 1) / shares;
          a_block ab = a_block_of(mc, kc, a, lda, trans_a, m0, k0, M, ap);
          macro_kernel(mc, kc, ab, bpanel, j0, j1, n0, N, c, ldc, m0, M, acc);
        }
        /* the next slice's packing overwrites the panel; after the last, the region's end waits */
        if (k0 + KC < K || n0 + NC < N) {
#pragma omp barrier
        }
      }
    }
  }
}

void gemm(int M, int N, int K, const float *a, int lda, int trans_a, const float *b, int ldb, int trans_b, float *c, int ldc,
          int accumulate) {
  gemm_typed(M, N, K, a, lda, trans_a, b, GYRE_F32, ldb, trans_b, c, ldc, accumulate);
}

void gemm_wt(int M, int N, int K, const float *a, int lda, const void *w, int wdtype, int ldw, float *c, int ldc,
             int accumulate) {
  gemm_typed(M, N, K, a, lda, 0, w, wdtype, ldw, 1, c, ldc, accumulate);
}

void gemm_wt_parts(int M, int K, const float *a, int lda, const w_parts *wp, int ldw, float *c, int ldc, int accumulate) {
  int N = 0;
  for (int p = 0; p < wp->n; p++) N += wp->rows[p];
  if (M > 0 && M <= FEW_ROWS && N > 0 && K > 0) {
    gemm_few_rows(M, K, a, lda, wp, ldw, c, ldc, accumulate, cpu_threads_for((double)M * N * K / 64));
    return;
  }
  for (int p = 0, off = 0; p < wp->n; off += wp->rows[p++])
    gemm_typed(M, wp->rows[p], K, a, lda, 0, wp->w[p], wp->dtype, ldw, 1, c + off, ldc, accumulate);
}
