/* attention.c - scaled dot-product attention over the paged cache and over forests.
 *
 * Both paths score a query against keys stored transposed ([hd][n]: one dimension of many
 * keys contiguous), so a score loop runs over keys in vector registers, and sum values
 * stored row-wise. Training keeps no attention matrix: the backward recomputes scores from
 * the saved log-sum-exp (as flash attention does), first per query row (dq) and then per
 * key chunk (dk, dv), so memory stays O(T) and every sum runs in a fixed order.
 */
#include <math.h>
#include <omp.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include "attention.h"
#include "gemm.h"

#include "../half.h"
#include "fastmath.h"

#define CHUNK 16 /* keys per step of the online softmax */
#define QB 8     /* queries sharing one pass over a key chunk */
#define MASKED (-1e30f)

typedef float v16 __attribute__((vector_size(CHUNK * sizeof(float))));

/* Half a chunk: one AVX2 register. Without AVX-512 GCC keeps a v16 in memory and copies it
 * with `rep movs` (measured: the score and P.V loops spent most of their time there), so the
 * loops over a chunk run on two halves; the arithmetic per lane is the same. */
typedef float v8 __attribute__((vector_size(CHUNK / 2 * sizeof(float))));
typedef int32_t i8v __attribute__((vector_size(CHUNK / 2 * sizeof(int32_t))));

static inline v8 load8(const float *p) {
  v8 v;
  memcpy(&v, p, sizeof v);
  return v;
}

/* 8 F16 keys' values as F32 lanes (one instruction with F16C). */
static inline v8 load8h(const uint16_t *p) {
#if defined(__F16C__)
  return (v8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#else
  v8 v;
  for (int i = 0; i < CHUNK / 2; i++) v[i] = half_to_float(p[i]);
  return v;
#endif
}

/* One element of K or V as F32, from F32 or F16 storage. */
static inline float elem_f32(const float *p) { return *p; }
static inline float elem_f16(const uint16_t *p) { return half_to_float(*p); }

/* The kernels below are defined once per storage type T (float, uint16_t), suffix S (empty,
 * h) and loaders LOAD16 / LOAD8 / ELEM; every sum runs in F32 in the same order for both.
 *
 * s[r] (+)= sum_c a[r][c] * cols[c * ld + 0..CHUNK) for r < NQ, with a[r] at q[r] and the
 * count a compile-time constant so the NQ accumulators stay in registers (with AVX-512, up to 4
 * queries split the sum over c into 2-4 interleaved partial sums, added in a fixed order, so
 * their FMAs do not wait on each other; without: one half of the chunk at a time, NQ 8-float
 * accumulators; 2 NQ would spill). */
#if defined(__AVX512F__)
static inline v16 load16(const float *p) {
  v16 v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline v16 load16h(const uint16_t *p) { return (v16)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

#define DEFINE_SCORES(NQ, S, T, LOAD16, LOAD8)                                                 \
  static inline void scores##S##_##NQ(v16 *s, const float *const *q, const T *cols, size_t ld, int hd) { \
    enum { P = NQ <= 2 ? 4 : NQ <= 4 ? 2 : 1 };                                                \
    v16 acc[P][NQ];                                                                            \
    for (int k = 0; k < P; k++)                                                                \
      for (int r = 0; r < NQ; r++) acc[k][r] = (v16){0};                                       \
    int c = 0;                                                                                 \
    for (; c + P <= hd; c += P)                                                                \
      for (int k = 0; k < P; k++) {                                                            \
        v16 col = LOAD16(cols + (size_t)(c + k) * ld);                                         \
        for (int r = 0; r < NQ; r++) acc[k][r] += q[r][c + k] * col;                           \
      }                                                                                        \
    for (; c < hd; c++) {                                                                      \
      v16 col = LOAD16(cols + (size_t)c * ld);                                                 \
      for (int r = 0; r < NQ; r++) acc[0][r] += q[r][c] * col;                                 \
    }                                                                                          \
    for (int k = 1; k < P; k++)                                                                \
      for (int r = 0; r < NQ; r++) acc[0][r] += acc[k][r];                                     \
    for (int r = 0; r < NQ; r++) s[r] = acc[0][r];                                             \
  }
#else
/* Up to 4 queries take both halves in one pass over the columns: 2 NQ independent sums in
 * flight instead of NQ (decode's 2 heads per kv head left each FMA waiting on the one before);
 * each lane still sums over c in ascending order, so the scores are the same bits. */
#define DEFINE_SCORES(NQ, S, T, LOAD16, LOAD8)                                                 \
  static inline void scores##S##_##NQ(v16 *s, const float *const *q, const T *cols, size_t ld, int hd) { \
    enum { HALVES = NQ <= 4 ? 2 : 1 };                                                         \
    for (int half = 0; half < CHUNK; half += HALVES * CHUNK / 2) {                             \
      v8 acc[NQ][HALVES];                                                                      \
      for (int r = 0; r < NQ; r++)                                                             \
        for (int h = 0; h < HALVES; h++) acc[r][h] = (v8){0};                                  \
      for (int c = 0; c < hd; c++) {                                                           \
        v8 col[HALVES];                                                                        \
        for (int h = 0; h < HALVES; h++) col[h] = LOAD8(cols + (size_t)c * ld + half + h * CHUNK / 2); \
        for (int r = 0; r < NQ; r++)                                                           \
          for (int h = 0; h < HALVES; h++) acc[r][h] += q[r][c] * col[h];                      \
      }                                                                                        \
      for (int r = 0; r < NQ; r++)                                                             \
        for (int h = 0; h < HALVES; h++) memcpy((float *)&s[r] + half + h * CHUNK / 2, &acc[r][h], sizeof acc[r][h]); \
    }                                                                                          \
  }
#endif

/* scores##S(nq, s, q, cols, ld, hd): s[r] = a[r] . cols for r < nq (nq <= QB). */
#define DEFINE_SCORES_ALL(S, T, LOAD16, LOAD8)                                                  \
  DEFINE_SCORES(1, S, T, LOAD16, LOAD8)                                                        \
  DEFINE_SCORES(2, S, T, LOAD16, LOAD8)                                                        \
  DEFINE_SCORES(3, S, T, LOAD16, LOAD8)                                                        \
  DEFINE_SCORES(4, S, T, LOAD16, LOAD8)                                                        \
  DEFINE_SCORES(5, S, T, LOAD16, LOAD8)                                                        \
  DEFINE_SCORES(6, S, T, LOAD16, LOAD8)                                                        \
  DEFINE_SCORES(7, S, T, LOAD16, LOAD8)                                                        \
  DEFINE_SCORES(8, S, T, LOAD16, LOAD8)                                                        \
  static void scores##S(int nq, v16 *s, const float *const *q, const T *cols, size_t ld, int hd) { \
    switch (nq) {                                                                              \
      case 1: scores##S##_1(s, q, cols, ld, hd); break;                                        \
      case 2: scores##S##_2(s, q, cols, ld, hd); break;                                        \
      case 3: scores##S##_3(s, q, cols, ld, hd); break;                                        \
      case 4: scores##S##_4(s, q, cols, ld, hd); break;                                        \
      case 5: scores##S##_5(s, q, cols, ld, hd); break;                                        \
      case 6: scores##S##_6(s, q, cols, ld, hd); break;                                        \
      case 7: scores##S##_7(s, q, cols, ld, hd); break;                                        \
      default: scores##S##_8(s, q, cols, ld, hd); break;                                       \
    }                                                                                          \
  }
#if defined(__AVX512F__)
DEFINE_SCORES_ALL(, float, load16, load8)
DEFINE_SCORES_ALL(h, uint16_t, load16h, load8h)
#else
DEFINE_SCORES_ALL(, float, , load8)
DEFINE_SCORES_ALL(h, uint16_t, , load8h)
#endif

/* A run of keys: key j < n has K column kt[c * ldk + j], V row v[j * ldv + c], and position
 * pos0 + j, compared with each query's limit (keys past it are masked). A run of an F16 pool
 * has kth and vh (the same layout, F16) instead of kt and v. */
typedef struct key_run {
  const float *kt; /* K columns [hd][ldk] */
  size_t ldk;
  const float *v;  /* V rows */
  size_t ldv;
  const float *vt; /* backward only: V columns [hd][ldvt] and K rows */
  size_t ldvt;
  const float *k;
  size_t ldkr;
  int n, pos0;
  const uint16_t *kth, *vh; /* F16 storage, else NULL */
} key_run;

/* max and (after p = exp(x - max) in place) sum of row[0..n), 16 lanes at a time (two
 * halves), the lanes summed in a fixed order: the halves, then lanes 4, 2, 1 apart. */
static float row_max(const float *row, int n) {
  v8 m0 = (v8){0} + MASKED, m1 = m0;
  int j = 0;
  for (; j + CHUNK <= n; j += CHUNK) {
    v8 x0 = load8(row + j), x1 = load8(row + j + CHUNK / 2);
    m0 = (v8)(((i8v)x0 & (x0 > m0)) | ((i8v)m0 & ~(x0 > m0)));
    m1 = (v8)(((i8v)x1 & (x1 > m1)) | ((i8v)m1 & ~(x1 > m1)));
  }
  float lanes[CHUNK], m = MASKED;
  memcpy(lanes, &m0, sizeof m0);
  memcpy(lanes + CHUNK / 2, &m1, sizeof m1);
  for (int u = 0; u < CHUNK; u++) m = lanes[u] > m ? lanes[u] : m;
  for (; j < n; j++) m = row[j] > m ? row[j] : m;
  return m;
}

static float exp_sum(float *row, int n, float m) {
  v8 acc0 = (v8){0}, acc1 = (v8){0};
  int j = 0;
  for (; j + CHUNK <= n; j += CHUNK) {
    float *p = row + j;
    for (int u = 0; u < CHUNK; u++) p[u] = fast_exp(p[u] - m);
    acc0 += load8(p);
    acc1 += load8(p + CHUNK / 2);
  }
  float x[CHUNK / 2];
  v8 halves = acc0 + acc1;
  memcpy(x, &halves, sizeof x);
  float sum = ((x[0] + x[4]) + (x[2] + x[6])) + ((x[1] + x[5]) + (x[3] + x[7]));
  for (; j < n; j++) sum += row[j] = fast_exp(row[j] - m);
  return sum;
}

#define PREFETCH_RUNS 1 /* runs ahead whose chunk each pass asks the memory for */

/* Asks for the cache lines of rows [0, n) x bytes [0, width) of p (row stride ld bytes): a
 * block table need not be consecutive, so the passes name the next runs' chunks themselves. */
static inline void prefetch_rows(const void *p, size_t ld, int n, int width) {
  for (int i = 0; i < n; i++)
    for (int c = 0; c < width; c += 64) __builtin_prefetch((const char *)p + (size_t)i * ld + c);
}

/* orow[r][c..c+W) += sum over u < n of p[r][u] v[u][c..] for r < NR (1 or 2 queries sharing
 * V's loads), NR x W / 8 accumulators in registers, each summing over u in ascending order:
 * independent chains, so the FMAs' latency overlaps (with two, a 16-key chunk's P.V waited on
 * it). W: 64, 32 or 16. */
#define DEFINE_PV_COLUMNS(W, NR, S, T, LOAD8)                                                    \
  static inline void pv_columns##S##_##W##x##NR(float *const *orow, const float *const *p, const T *v, size_t ldv, int n, \
                                                int c) {                                         \
    v8 acc[NR][W / 8];                                                                           \
    for (int r = 0; r < NR; r++)                                                                 \
      for (int i = 0; i < W / 8; i++) acc[r][i] = load8(orow[r] + c + 8 * i);                    \
    for (int u = 0; u < n; u++)                                                                  \
      for (int i = 0; i < W / 8; i++) {                                                          \
        v8 x = LOAD8(v + (size_t)u * ldv + c + 8 * i);                                           \
        for (int r = 0; r < NR; r++) acc[r][i] += p[r][u] * x;                                   \
      }                                                                                          \
    for (int r = 0; r < NR; r++)                                                                 \
      for (int i = 0; i < W / 8; i++) memcpy(orow[r] + c + 8 * i, &acc[r][i], sizeof acc[r][i]); \
  }

/* Widest block two queries take together: their 2 W / 8 accumulators must fit the registers
 * (32 with AVX-512, 16 without). */
#if defined(__AVX512F__)
#define PV_PAIR_W 64
#else
#define PV_PAIR_W 32
#endif

/* pv_rows##S(nr, orow, p, v, ldv, n, hd): orow[r][0..hd) += sum over u < n of p[r][u] v[u * ldv +
 * 0..hd) for r < nr (1 or 2): 64-, 32- and 16-column blocks (two queries at once up to
 * PV_PAIR_W), then the rest one column at a time; each column sums over u in ascending order,
 * so a query's sums do not depend on whether it had a partner. */
#define PV_BLOCK(W, S)                                                                           \
  if (nr == 2 && W <= PV_PAIR_W) pv_columns##S##_##W##x2(orow, p, v, ldv, n, c);                \
  else                                                                                           \
    for (int r = 0; r < nr; r++) pv_columns##S##_##W##x1(orow + r, p + r, v, ldv, n, c);
#define DEFINE_PV_ROW(S, T, LOAD8, ELEM)                                                         \
  DEFINE_PV_COLUMNS(64, 1, S, T, LOAD8)                                                          \
  DEFINE_PV_COLUMNS(32, 1, S, T, LOAD8)                                                          \
  DEFINE_PV_COLUMNS(16, 1, S, T, LOAD8)                                                          \
  DEFINE_PV_COLUMNS(64, 2, S, T, LOAD8)                                                          \
  DEFINE_PV_COLUMNS(32, 2, S, T, LOAD8)                                                          \
  DEFINE_PV_COLUMNS(16, 2, S, T, LOAD8)                                                          \
  static void pv_rows##S(int nr, float *const *orow, const float *const *p, const T *v, size_t ldv, int n, int hd) { \
    int c = 0;                                                                                   \
    for (; hd - c >= 64; c += 64) { PV_BLOCK(64, S) }                                            \
    if (hd - c >= 32) {                                                                          \
      PV_BLOCK(32, S)                                                                            \
      c += 32;                                                                                   \
    }                                                                                            \
    if (hd - c >= 16) {                                                                          \
      PV_BLOCK(16, S)                                                                            \
      c += 16;                                                                                   \
    }                                                                                            \
    for (int r = 0; r < nr; r++)                                                                 \
      for (int u = 0; u < n; u++)                                                                \
        for (int cc = c; cc < hd; cc++) orow[r][cc] += p[r][u] * ELEM(v + (size_t)u * ldv + cc); \
  }
DEFINE_PV_ROW(, float, load8, elem_f32)
DEFINE_PV_ROW(h, uint16_t, load8h, elem_f16)

/* Bytes per element of a run's K and V, and the addresses of its key j's K column 0 and V row. */
static inline size_t run_elem(const key_run *r) { return r->kth != NULL ? sizeof(uint16_t) : sizeof(float); }
static inline const void *run_k(const key_run *r, int j) {
  return r->kth != NULL ? (const void *)(r->kth + j) : (const void *)(r->kt + j);
}
static inline const void *run_v(const key_run *r, int j) {
  return r->vh != NULL ? (const void *)(r->vh + (size_t)j * r->ldv) : (const void *)(r->v + (size_t)j * r->ldv);
}

/* pad[hd][CHUNK] = the K columns of keys j0..j0+w of a run as F32, zero past w. */
static void pad_chunk(float *pad, const key_run *run, int j0, int w, int hd) {
  for (int c = 0; c < hd; c++) {
    memset(pad + c * CHUNK, 0, sizeof(float) * CHUNK);
    size_t at = (size_t)c * run->ldk + j0;
    for (int u = 0; u < w; u++) pad[c * CHUNK + u] = run->kth != NULL ? half_to_float(run->kth[at + u]) : run->kt[at + u];
  }
}

/* The run PREFETCH_RUNS after run k, if it has a chunk at j0 (else NULL). */
static inline const key_run *run_ahead(const key_run *runs, int n_runs, int k, int j0) {
  return k + PREFETCH_RUNS < n_runs && j0 < runs[k + PREFETCH_RUNS].n ? &runs[k + PREFETCH_RUNS] : NULL;
}

/* Attention of R queries over runs of keys, flash-attention style in two passes per group
 * of QB queries (no score matrix beyond the group's rows): scores of every 16-key chunk
 * for the QB queries at once (the chunk's K columns stay in L1), then per query the
 * softmax over its row, then P.V chunk by chunk. out[r] = softmax(scale q_r . K, keys with
 * position <= limit[r]) V and lse[r] its log-sum-exp (lse may be NULL). work:
 * attend_work(hd, max_keys) floats, max_keys >= the keys of any query. */
static void attend(int R, const float *const *q, const int *limit, const key_run *runs, int n_runs, int hd,
                   float scale, float *const *out, float *lse, float *work, size_t max_keys) {
  float *o = work, *pad = o + QB * hd, *sc = pad + (size_t)CHUNK * hd;
  for (int r0 = 0; r0 < R; r0 += QB) {
    int nq = R - r0 < QB ? R - r0 : QB, top = limit[r0];
    for (int r = 1; r < nq; r++) top = limit[r0 + r] > top ? limit[r0 + r] : top;
    /* pass 1: masked, scaled scores into sc[r][0..n_keys) */
    int n_keys = 0;
    for (int k = 0; k < n_runs; k++) {
      const key_run *run = &runs[k];
      for (int j0 = 0; j0 < run->n && run->pos0 + j0 <= top; j0 += CHUNK) {
        int w = run->n - j0 < CHUNK ? run->n - j0 : CHUNK;
        const key_run *ahead = run_ahead(runs, n_runs, k, j0);
        if (ahead != NULL) prefetch_rows(run_k(ahead, j0), ahead->ldk * run_elem(ahead), hd, CHUNK * (int)run_elem(ahead));
        v16 s[QB];
        if (w < CHUNK) { /* a partial chunk: zero-padded F32 copy */
          pad_chunk(pad, run, j0, w, hd);
          scores(nq, s, q + r0, pad, CHUNK, hd);
        } else if (run->kth != NULL) {
          scoresh(nq, s, q + r0, run->kth + j0, run->ldk, hd);
        } else {
          scores(nq, s, q + r0, run->kt + j0, run->ldk, hd);
        }
        for (int r = 0; r < nq; r++) { /* scaled, keys past the query's limit masked */
          int visible = limit[r0 + r] - (run->pos0 + j0) + 1;
          const float *sr = (const float *)&s[r];
          float *row = sc + r * max_keys + n_keys;
          for (int u = 0; u < w; u++) row[u] = u < visible ? sr[u] * scale : MASKED;
        }
        n_keys += w;
      }
    }
    /* softmax of each query's row */
    float m[QB], l[QB];
    for (int r = 0; r < nq; r++) {
      m[r] = row_max(sc + r * max_keys, n_keys);
      l[r] = exp_sum(sc + r * max_keys, n_keys, m[r]);
    }
    /* pass 2: o[r] = P.V over the same chunks */
    memset(o, 0, sizeof(float) * QB * hd);
    int at = 0;
    for (int k = 0; k < n_runs; k++) {
      const key_run *run = &runs[k];
      for (int j0 = 0; j0 < run->n && run->pos0 + j0 <= top; j0 += CHUNK) {
        int w = run->n - j0 < CHUNK ? run->n - j0 : CHUNK;
        const key_run *ahead = run_ahead(runs, n_runs, k, j0);
        if (ahead != NULL) prefetch_rows(run_v(ahead, j0), ahead->ldv * run_elem(ahead), CHUNK, hd * (int)run_elem(ahead));
        for (int r = 0, nr; r < nq; r += nr) { /* two queries at once where both see the same keys */
          int visible = limit[r0 + r] - (run->pos0 + j0) + 1;
          if (visible > w) visible = w;
          nr = r + 1 < nq && limit[r0 + r + 1] == limit[r0 + r] ? 2 : 1;
          const float *pr[2] = {sc + r * max_keys + at, sc + (r + nr - 1) * max_keys + at};
          float *orow[2] = {o + r * hd, o + (r + nr - 1) * hd};
          if (run->vh != NULL) pv_rowsh(nr, orow, pr, run->vh + (size_t)j0 * run->ldv, run->ldv, visible, hd);
          else pv_rows(nr, orow, pr, run->v + (size_t)j0 * run->ldv, run->ldv, visible, hd);
        }
        at += w;
      }
    }
    for (int r = 0; r < nq; r++) {
      float inv = 1.0f / l[r];
      for (int c = 0; c < hd; c++) out[r0 + r][c] = o[r * hd + c] * inv;
      if (lse != NULL) lse[r0 + r] = m[r] + logf(l[r]);
    }
  }
}

/* Floats of attend's work buffer. */
static size_t attend_work(int hd, size_t max_keys) { return (size_t)QB * hd + (size_t)CHUNK * hd + QB * max_keys; }

/* ---- paged (inference) ---- */

void kv_store(const kv_pool *pool, const dims *d, int layer, const fwd_batch *b, const float *qkv) {
  int B = pool->B, hd = d->hd;
#pragma omp parallel for num_threads(cpu_threads_for(2.0 * b->n_rows * d->kv_dim)) schedule(static)
  for (int r = 0; r < b->n_rows; r++) {
    int pos = b->positions[r], slot = pos % B;
    int32_t block = b->blocks[b->block_off[b->row_seq[r]] + pos / B];
    const float *k = qkv + (size_t)r * d->qkv_dim + d->q_dim, *v = k + d->kv_dim;
    for (int g = 0; g < d->KV; g++) {
      size_t kt = kv_offset(d, pool, block, layer, 0, g) + slot, vr = kv_offset(d, pool, block, layer, 1, g) + (size_t)slot * hd;
      if (pool->elem == sizeof(float)) {
        for (int c = 0; c < hd; c++) *kv_f32(pool, kt + (size_t)c * B) = k[g * hd + c];
        memcpy(kv_f32(pool, vr), v + g * hd, sizeof(float) * hd);
      } else {
        for (int c = 0; c < hd; c++) *kv_f16(pool, kt + (size_t)c * B) = half_from_float(k[g * hd + c]);
        for (int c = 0; c < hd; c++) *kv_f16(pool, vr + c) = half_from_float(v[g * hd + c]);
      }
    }
  }
}

void kv_copy_block(const kv_pool *pool, const dims *d, int32_t dst, int32_t src) {
  size_t bytes = (size_t)pool->elem * pool->B * d->hd;
  for (int l = 0; l < d->L; l++)
    for (int g = 0; g < d->KV; g++)
      for (int kind = 0; kind < 2; kind++)
        memcpy((char *)pool->data + pool->elem * kv_offset(d, pool, dst, l, kind, g),
               (char *)pool->data + pool->elem * kv_offset(d, pool, src, l, kind, g), bytes);
}

void kv_transfer(const kv_pool *pool, const dims *d, const int32_t *blocks, int32_t length, void *payload,
                 int to_payload) {
  int B = pool->B;
  size_t e = (size_t)pool->elem;
  for (int l = 0; l < d->L; l++)
    for (int kind = 0; kind < 2; kind++)
      for (int32_t t = 0; t < length; t++)
        for (int g = 0; g < d->KV; g++) {
          size_t cached = kv_offset(d, pool, blocks[t / B], l, kind, g);
          char *flat = (char *)payload + e * ((((size_t)l * 2 + kind) * length + t) * d->KV + g) * d->hd;
          for (int c = 0; c < d->hd; c++) {
            char *x = (char *)pool->data + e * (kind == 0 ? cached + (size_t)c * B + t % B : cached + (size_t)(t % B) * d->hd + c);
            if (to_payload) memcpy(flat + e * c, x, e);
            else memcpy(x, flat + e * c, e);
          }
        }
}

#define TASK_QUERIES (2 * QB) /* queries of one attention task: two passes of QB over each key chunk */

/* The queries of one attention task: rows [r0, r1) of a tile x query heads [h0, h1), all of
 * kv head g. A kv head's group of G query heads splits into tiles of `rows` consecutive rows
 * x slices of `heads` heads, rows * heads <= TASK_QUERIES: G <= TASK_QUERIES takes whole
 * groups of several rows; a larger group takes one row and G / TASK_QUERIES (rounded up)
 * slices of heads. Tasks are ordered kv head, tile, slice, so one head's keys stay hot while
 * consecutive tasks use them. */
typedef struct task_split {
  int rows, heads, slices;
} task_split;

typedef struct attn_task {
  int g, tile, h0, h1;
} attn_task;

static task_split task_split_of(const dims *d) {
  int G = d->H / d->KV;
  if (G > TASK_QUERIES) return (task_split){1, TASK_QUERIES, (G + TASK_QUERIES - 1) / TASK_QUERIES};
  return (task_split){TASK_QUERIES / G, G, 1};
}

static int task_count(task_split sp, int n_tiles, const dims *d) { return d->KV * n_tiles * sp.slices; }

static attn_task task_at(int task, task_split sp, int n_tiles, const dims *d) {
  int G = d->H / d->KV, slice = task % sp.slices, g = task / sp.slices / n_tiles;
  int h0 = g * G + slice * sp.heads, h1 = h0 + sp.heads < (g + 1) * G ? h0 + sp.heads : (g + 1) * G;
  return (attn_task){g, task / sp.slices % n_tiles, h0, h1};
}

/* Queries of rows [r0, r1) and heads [h0, h1), row-major, for attend: at most TASK_QUERIES. */
static int gather_queries(const float **q, float **out, int *limit, const float *qkv, float *att, const int32_t *row_limit,
                          int r0, int r1, int h0, int h1, const dims *d) {
  int n = 0;
  for (int r = r0; r < r1; r++)
    for (int h = h0; h < h1; h++, n++) {
      q[n] = qkv + (size_t)r * d->qkv_dim + (size_t)h * d->hd;
      out[n] = att + (size_t)r * d->q_dim + (size_t)h * d->hd;
      limit[n] = row_limit[r];
    }
  return n;
}

size_t attention_scratch_floats(const dims *d, int max_runs, int max_keys) {
  size_t runs = ((size_t)max_runs * sizeof(key_run) + sizeof(float) - 1) / sizeof(float);
  return (attend_work(d->hd, (size_t)max_keys) + runs + 15) / 16 * 16;
}

size_t paged_staging_floats(const dims *d, int B) {
  return B % CHUNK == 0 ? 0 : 2 * (size_t)((d->max_pos + CHUNK - 1) / CHUNK) * CHUNK * d->hd;
}

/* The key runs of one kv head over positions [0, ctx) of a block table, chunk-aligned to
 * absolute positions so the arithmetic does not depend on the block size: a block whose
 * size is a multiple of CHUNK is used in place; otherwise each CHUNK of positions is
 * gathered into staging as F32 (K as [hd][CHUNK], V as [CHUNK][hd]). Returns the run count. */
static int paged_runs(key_run *runs, const kv_pool *pool, const int32_t *table, int ctx, const dims *d, int layer, int g,
                      float *staging) {
  int hd = d->hd, n = 0, B = pool->B, half = pool->elem == sizeof(uint16_t);
  if (B % CHUNK == 0) {
    for (int k = 0; k * B < ctx; k++) {
      size_t kt = kv_offset(d, pool, table[k], layer, 0, g), v = kv_offset(d, pool, table[k], layer, 1, g);
      runs[n++] = (key_run){half ? NULL : kv_f32(pool, kt), (size_t)B, half ? NULL : kv_f32(pool, v), (size_t)hd, NULL, 0, NULL, 0,
                            ctx - k * B < B ? ctx - k * B : B, k * B, half ? kv_f16(pool, kt) : NULL, half ? kv_f16(pool, v) : NULL};
    }
    return n;
  }
  for (int p0 = 0; p0 < ctx; p0 += CHUNK) {
    int w = ctx - p0 < CHUNK ? ctx - p0 : CHUNK;
    float *kt = staging + (size_t)2 * n * CHUNK * hd, *v = kt + (size_t)CHUNK * hd;
    for (int u = 0; u < w; u++) {
      int pos = p0 + u;
      size_t kb = kv_offset(d, pool, table[pos / B], layer, 0, g) + pos % B;
      size_t vb = kv_offset(d, pool, table[pos / B], layer, 1, g) + (size_t)(pos % B) * hd;
      for (int c = 0; c < hd; c++) {
        kt[c * CHUNK + u] = half ? half_to_float(*kv_f16(pool, kb + (size_t)c * B)) : *kv_f32(pool, kb + (size_t)c * B);
        v[(size_t)u * hd + c] = half ? half_to_float(*kv_f16(pool, vb + c)) : *kv_f32(pool, vb + c);
      }
    }
    runs[n++] = (key_run){kt, CHUNK, v, (size_t)hd, NULL, 0, NULL, 0, w, p0, NULL, NULL};
  }
  return n;
}

void paged_attention(float *att, const float *qkv, const kv_pool *pool, const dims *d, int layer,
                     const fwd_batch *b, float *scratch, size_t scratch_floats, int32_t *tiles) {
  task_split sp = task_split_of(d);
  float scale = 1.0f / sqrtf((float)d->hd);
  size_t staging = paged_staging_floats(d, pool->B);
  /* tiles: up to sp.rows consecutive rows of one sequence; work: multiply-adds of QK and PV */
  int n_tiles = 0;
  double work = 0.0;
  for (int r = 0; r < b->n_rows; n_tiles++) {
    tiles[n_tiles] = r;
    int s = b->row_seq[r];
    while (r < b->n_rows && b->row_seq[r] == s && r - tiles[n_tiles] < sp.rows) r++;
    work += 2.0 * (r - tiles[n_tiles]) * (b->positions[r - 1] + 1) * d->H * d->hd;
  }
  tiles[n_tiles] = b->n_rows;
  int threads = cpu_threads_for(work / 64), tasks = task_count(sp, n_tiles, d); /* a region's wake-up costs more than a small step */
#pragma omp parallel num_threads(threads < tasks ? threads : tasks)
  {
    float *work = scratch + (size_t)omp_get_thread_num() * scratch_floats;
    key_run *runs = (key_run *)(work + attend_work(d->hd, (size_t)d->max_pos));
    float *stage = work + scratch_floats - staging;
    const float *q[TASK_QUERIES];
    float *out[TASK_QUERIES];
    int limit[TASK_QUERIES];
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < task_count(sp, n_tiles, d); task++) {
      attn_task t = task_at(task, sp, n_tiles, d);
      int r0 = tiles[t.tile], r1 = tiles[t.tile + 1];
      const int32_t *table = b->blocks + b->block_off[b->row_seq[r0]];
      int n_runs = paged_runs(runs, pool, table, b->positions[r1 - 1] + 1, d, layer, t.g, stage);
      int n = gather_queries(q, out, limit, qkv, att, b->positions, r0, r1, t.h0, t.h1, d);
      attend(n, q, limit, runs, n_runs, d->hd, scale, out, NULL, work, (size_t)d->max_pos);
    }
  }
}

/* ---- forest (training) ---- */

/* Columns [0, T) of dst[KV * hd][ld] = the kv head columns starting at column `from` of
 * rows[T, ld_rows]. */
static void transpose_heads(float *dst, size_t ld, const float *rows, size_t ld_rows, int from, int T, const dims *d) {
#pragma omp parallel for num_threads(cpu_threads_for(4.0 * T * d->kv_dim)) schedule(static)
  for (int gc = 0; gc < d->kv_dim; gc++) {
    float *out = dst + (size_t)gc * ld;
    const float *src = rows + from + gc;
    for (int t = 0; t < T; t++) out[t] = src[(size_t)t * ld_rows];
  }
}

void forest_kv_put(const forest_kv *kv, const float *qkv, int s, int e, const dims *d) {
  int T = e - s;
  size_t width = 2 * (size_t)d->kv_dim;
#pragma omp parallel for num_threads(cpu_threads_for(2.0 * T * width)) schedule(static)
  for (int t = 0; t < T; t++) memcpy(kv->kv + (size_t)(s + t) * width, qkv + (size_t)t * d->qkv_dim + d->q_dim, sizeof(float) * width);
  transpose_heads(kv->kt + s, kv->ld, qkv, d->qkv_dim, d->q_dim, T, d);
  transpose_heads(kv->vt + s, kv->ld, qkv, d->qkv_dim, d->q_dim + d->kv_dim, T, d);
}

/* Tiles of the chunk [s, e): runs of at most `rows` rows, each the child of the previous one
 * (they share their first row's ancestors, the rest of the tile being the causal part);
 * tiles[0..n] are the boundaries (token indices), then row_limit[i - s] = i. Returns n. */
static int forest_tiles(const forest *f, int s, int e, int rows, int32_t *tiles) {
  int n = 0;
  for (int i = s; i < e; n++) {
    tiles[n] = i++;
    while (i < e && i - tiles[n] < rows && f->ranges[2 * f->range_off[i + 1] - 2] < i) i++; /* parent is i - 1 */
  }
  tiles[n] = e;
  for (int i = s; i < e; i++) tiles[n + 1 + i - s] = i;
  return n;
}

/* The key runs of the tile [i0, i1) for kv head g, from the store: the ancestor ranges of
 * i0, the last one extended over the tile (with_vt: the V columns too). Returns the count. */
static int forest_runs(key_run *runs, const forest *f, int i0, int i1, int g, const forest_kv *kv, int with_vt,
                       const dims *d) {
  int first = f->range_off[i0], n = f->range_off[i0 + 1] - first;
  size_t col = (size_t)g * d->hd * kv->ld, ldr = 2 * (size_t)d->kv_dim;
  const float *kg = kv->kv + (size_t)g * d->hd;
  for (int k = 0; k < n; k++) {
    int a = f->ranges[2 * (first + k)], e = k == n - 1 ? i1 - 1 : f->ranges[2 * (first + k) + 1];
    runs[k] = (key_run){kv->kt + col + a, kv->ld, kg + d->kv_dim + (size_t)a * ldr, ldr, with_vt ? kv->vt + col + a : NULL,
                        kv->ld, kg + (size_t)a * ldr, ldr, e - a + 1, a, NULL, NULL};
  }
  return n;
}

void forest_attention_forward(float *att, float *lse, const float *qkv, const forest_kv *kv, const forest *f, int s,
                              int e, const dims *d, float *scratch, size_t scratch_floats, int32_t *tiles) {
  task_split sp = task_split_of(d);
  float scale = 1.0f / sqrtf((float)d->hd);
  size_t max_keys = (size_t)f->max_depth;
  int n_tiles = forest_tiles(f, s, e, sp.rows, tiles);
  const int32_t *row_limit = tiles + n_tiles + 1;
#pragma omp parallel num_threads(cpu_threads())
  {
    float *work = scratch + (size_t)omp_get_thread_num() * scratch_floats;
    key_run *runs = (key_run *)(work + attend_work(d->hd, max_keys));
    const float *q[TASK_QUERIES];
    float *out[TASK_QUERIES];
    float tile_lse[TASK_QUERIES];
    int limit[TASK_QUERIES];
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < task_count(sp, n_tiles, d); task++) {
      attn_task t = task_at(task, sp, n_tiles, d);
      int i0 = tiles[t.tile], i1 = tiles[t.tile + 1], nh = t.h1 - t.h0;
      int n_runs = forest_runs(runs, f, i0, i1, t.g, kv, 0, d);
      int n = gather_queries(q, out, limit, qkv, att, row_limit, i0 - s, i1 - s, t.h0, t.h1, d);
      attend(n, q, limit, runs, n_runs, d->hd, scale, out, tile_lse, work, max_keys);
      for (int k = 0; k < n; k++) lse[(size_t)(i0 - s + k / nh) * d->H + t.h0 + k % nh] = tile_lse[k];
    }
  }
}

/* ds[u] = p_u (dp_u - dsum) with p_u = exp(scale s_u - lse) for the chunk's keys u < visible,
 * 0 past them: a loop of its own, which GCC vectorises (inside attend_grad_queries it did not). */
static void grad_scores(float *ds, const float *s, const float *dp, int visible, float scale, float lse, float dsum) {
  for (int u = 0; u < CHUNK; u++) {
    float e = fast_exp(s[u] * scale - lse) * (dp[u] - dsum);
    ds[u] = u < visible ? e : 0.0f;
  }
}

/* Pass A of the backward, per query (flash-attention style): with P recomputed from the
 * saved lse and dP = dout . V, dS = P (dP - dsum) and dq = scale dS . K, over the same
 * runs and chunks as the forward. work: 2 CHUNK hd + QB hd floats. */
static void attend_grad_queries(int R, const float *const *q, const float *const *dout, const float *lse, const float *dsum,
                                const int *limit, const key_run *runs, int n_runs, int hd, float scale, float *const *dq,
                                float *work) {
  float *acc = work, *pad_k = acc + QB * hd, *pad_v = pad_k + (size_t)CHUNK * hd;
  for (int r0 = 0; r0 < R; r0 += QB) {
    int nq = R - r0 < QB ? R - r0 : QB, top = limit[r0];
    for (int r = 1; r < nq; r++) top = limit[r0 + r] > top ? limit[r0 + r] : top;
    memset(acc, 0, sizeof(float) * QB * hd);
    for (int k = 0; k < n_runs; k++) {
      const key_run *run = &runs[k];
      for (int j0 = 0; j0 < run->n && run->pos0 + j0 <= top; j0 += CHUNK) {
        int w = run->n - j0 < CHUNK ? run->n - j0 : CHUNK;
        const float *kt = run->kt + j0, *vt = run->vt + j0;
        size_t ldk = run->ldk, ldvt = run->ldvt;
        if (w < CHUNK) {
          for (int c = 0; c < hd; c++) {
            memset(pad_k + c * CHUNK, 0, sizeof(float) * CHUNK);
            memset(pad_v + c * CHUNK, 0, sizeof(float) * CHUNK);
            memcpy(pad_k + c * CHUNK, kt + (size_t)c * ldk, sizeof(float) * w);
            memcpy(pad_v + c * CHUNK, vt + (size_t)c * ldvt, sizeof(float) * w);
          }
          kt = pad_k;
          vt = pad_v;
          ldk = ldvt = CHUNK;
        }
        v16 s[QB], dp[QB];
        scores(nq, s, q + r0, kt, ldk, hd);
        scores(nq, dp, dout + r0, vt, ldvt, hd);
        const float *krows = run->k + (size_t)j0 * run->ldkr;
        for (int r = 0; r < nq; r++) {
          int visible = limit[r0 + r] - (run->pos0 + j0) + 1;
          if (visible > w) visible = w;
          if (visible <= 0) continue;
          float ds[CHUNK];
          grad_scores(ds, (const float *)&s[r], (const float *)&dp[r], visible, scale, lse[r0 + r], dsum[r0 + r]);
          float *ar = acc + r * hd;
          int c = 0;
          for (; c + CHUNK / 2 <= hd; c += CHUNK / 2) { /* 8 columns of dq in a register over the keys */
            v8 a = load8(ar + c);
            for (int u = 0; u < visible; u++) a += ds[u] * load8(krows + (size_t)u * run->ldkr + c);
            memcpy(ar + c, &a, sizeof a);
          }
          for (; c < hd; c++)
            for (int u = 0; u < visible; u++) ar[c] += ds[u] * krows[(size_t)u * run->ldkr + c];
        }
      }
    }
    for (int r = 0; r < nq; r++)
      for (int c = 0; c < hd; c++) dq[r0 + r][c] = acc[r * hd + c] * scale;
  }
}

#define RB 4 /* (row, head) pairs of pass B sharing the loads of the chunk's K and V columns */

/* One (row, head) pair of pass B: its query, output gradient, mask over the chunk's keys,
 * log-sum-exp and dsum. */
typedef struct grad_pair {
  const float *q, *dout, *vis;
  float lse, dsum;
} grad_pair;

/* p_u = vis_u exp(scale s_u - lse) and ds_u = scale p_u (dp_u - dsum) over a chunk. */
static void grad_probs(float *p, float *ds, const float *s, const float *dp, const grad_pair *pair, float scale) {
  for (int u = 0; u < CHUNK; u++) {
    float e = fast_exp(s[u] * scale - pair->lse);
    p[u] = pair->vis[u] != 0.0f ? e : 0.0f; /* a select: keys past the batch may hold anything */
    ds[u] = scale * p[u] * (dp[u] - pair->dsum);
  }
}

/* acc[c] += a_r[c] w_r for r = 0..RB-1 in turn (the sums one pair at a time would make), one
 * load and store of each accumulator column serving all of them. */
static inline void pair_update(float *acc, const float *const a[RB], const v16 w[RB], int hd) {
  for (int c = 0; c < hd; c++) {
    float *col = acc + c * CHUNK;
    v8 x0 = load8(col), x1 = load8(col + CHUNK / 2);
    for (int r = 0; r < RB; r++) {
      x0 += a[r][c] * load8((const float *)&w[r]);
      x1 += a[r][c] * load8((const float *)&w[r] + CHUNK / 2);
    }
    memcpy(col, &x0, sizeof x0);
    memcpy(col + CHUNK / 2, &x1, sizeof x1);
  }
}

/* dkt += scale ds q and dvt += p dout for RB pairs, dkt and dvt [hd][CHUNK]. */
static void grad_pairs(const grad_pair *pairs, const float *ktg, const float *vtg, size_t ld, int hd, float scale,
                       float *dkt, float *dvt) {
  const float *q[RB], *dout[RB];
  v16 s[RB], dp[RB], p[RB], ds[RB];
  for (int r = 0; r < RB; r++) {
    q[r] = pairs[r].q;
    dout[r] = pairs[r].dout;
  }
  scores(RB, s, q, ktg, ld, hd);
  scores(RB, dp, dout, vtg, ld, hd);
  for (int r = 0; r < RB; r++) grad_probs((float *)&p[r], (float *)&ds[r], (const float *)&s[r], (const float *)&dp[r], &pairs[r], scale);
  pair_update(dkt, q, ds, hd);
  pair_update(dvt, dout, p, hd);
}

#define SEGMENT_ROWS 256 /* rows of a chain segment the key-owner pass tests for a key chunk at once */

/* base[u] = 1 for the keys j0 + u < j1 among the ancestor ranges of token i (binary search
 * for the first range reaching j0); returns whether any. */
static int seen_ranges(float *base, const forest *f, int i, int j0, int j1) {
  int lo = f->range_off[i], hi = f->range_off[i + 1], any = 0;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (f->ranges[2 * mid + 1] < j0) lo = mid + 1;
    else hi = mid;
  }
  for (int k = lo; k < f->range_off[i + 1] && f->ranges[2 * k] < j1; k++) {
    int a = f->ranges[2 * k] > j0 ? f->ranges[2 * k] : j0, b = f->ranges[2 * k + 1] < j1 - 1 ? f->ranges[2 * k + 1] : j1 - 1;
    for (int j = a; j <= b; j++, any = 1) base[j - j0] = 1.0f;
  }
  return any;
}

/* Pass B of the backward, per chunk of CHUNK keys [j0, j1) of kv head g (any tokens before
 * the chunk's end e): for every query row i of the chunk [s, e) that sees one of them and
 * each head of the group,
 *   dk_j += scale ds_ij q_i,  dv_j += p_ij dout_i,
 * accumulated transposed ([hd][CHUNK]: one vector per dimension) and summed over i in
 * ascending order, RB (row, head) pairs at a time (a last short batch is filled with pairs
 * that see no key: they add zeros). The rows come by chain segments (segs: boundaries),
 * a segment's first row's ancestor ranges telling which keys its rows see. Keys of the chunk
 * [s, e) get their gradient in dqkv (plus what later chunks left in kv->dkv); earlier keys
 * add theirs into kv->dkv. */
static void attend_grad_keys(int j0, int g, const int32_t *segs, int n_segs, int s, const float *qkv, const float *datt,
                             const float *lse, const float *dsum, const forest_kv *kv, const forest *f, const dims *d,
                             float scale, float *dqkv, float *work) {
  static const float unseen[CHUNK];
  int hd = d->hd, G = d->H / d->KV, n = 0, e = segs[n_segs], j1 = j0 + CHUNK < e ? j0 + CHUNK : e;
  float *dkt = work, *dvt = dkt + (size_t)hd * CHUNK, vis[RB][CHUNK];
  memset(dkt, 0, sizeof(float) * 2 * hd * CHUNK);
  const float *ktg = kv->kt + (size_t)g * hd * kv->ld + j0, *vtg = kv->vt + (size_t)g * hd * kv->ld + j0;
  grad_pair pairs[RB];
  for (int k = 0; k < n_segs; k++) {
    int i0 = segs[k], i1 = segs[k + 1], causal = i0 + 1 > j0 ? i0 + 1 : j0; /* the segment's own keys from here */
    if (i1 <= j0) continue;
    float base[CHUNK] = {0};
    int any = seen_ranges(base, f, i0, j0, j1);
    if (!any && causal >= j1) continue;
    for (int i = any ? i0 : causal; i < i1; i++) {
      float row_vis[CHUNK];
      memcpy(row_vis, base, sizeof row_vis);
      for (int j = causal; j <= i && j < j1; j++) row_vis[j - j0] = 1.0f;
      for (int h = g * G; h < (g + 1) * G; h++) {
        size_t r = (size_t)(i - s);
        memcpy(vis[n], row_vis, sizeof row_vis);
        pairs[n] = (grad_pair){qkv + r * d->qkv_dim + (size_t)h * hd, datt + r * d->q_dim + (size_t)h * hd, vis[n],
                               lse[r * d->H + h], dsum[r * d->H + h]};
        if (++n == RB) {
          grad_pairs(pairs, ktg, vtg, kv->ld, hd, scale, dkt, dvt);
          n = 0;
        }
      }
    }
  }
  if (n > 0) {
    for (int r = n; r < RB; r++) pairs[r] = (grad_pair){pairs[0].q, pairs[0].dout, unseen, 0.0f, 0.0f};
    grad_pairs(pairs, ktg, vtg, kv->ld, hd, scale, dkt, dvt);
  }
  for (int j = j0; j < j1; j++) {
    float *carried = kv->dkv != NULL ? kv->dkv + (size_t)j * 2 * d->kv_dim + (size_t)g * hd : NULL;
    if (j < s) { /* an earlier chunk's token: carried back */
      for (int c = 0; c < hd; c++) {
        carried[c] += dkt[c * CHUNK + j - j0];
        carried[d->kv_dim + c] += dvt[c * CHUNK + j - j0];
      }
      continue;
    }
    float *dk = dqkv + (size_t)(j - s) * d->qkv_dim + d->q_dim + g * hd, *dv = dk + d->kv_dim;
    for (int c = 0; c < hd; c++) {
      dk[c] = dkt[c * CHUNK + j - j0] + (carried != NULL ? carried[c] : 0.0f);
      dv[c] = dvt[c * CHUNK + j - j0] + (carried != NULL ? carried[d->kv_dim + c] : 0.0f);
    }
  }
}

/* The key chunks (CHUNK keys from index 0) any row of the segments sees, ascending, into kc
 * (first used as marks: (e - 1) / CHUNK + 1 ints). Returns their count. */
static int key_chunks(const forest *f, const int32_t *segs, int n_segs, int32_t *kc) {
  int n_kc = (segs[n_segs] - 1) / CHUNK + 1, count = 0;
  memset(kc, 0, sizeof(int32_t) * (size_t)n_kc);
  for (int k = 0; k < n_segs; k++) {
    int i0 = segs[k], first = f->range_off[i0], last = f->range_off[i0 + 1] - 1;
    for (int r = first; r <= last; r++) {
      int b = r == last ? segs[k + 1] - 1 : f->ranges[2 * r + 1];
      for (int c = f->ranges[2 * r] / CHUNK; c <= b / CHUNK; c++) kc[c] = 1;
    }
  }
  for (int c = 0; c < n_kc; c++)
    if (kc[c]) kc[count++] = c;
  return count;
}

size_t forest_scratch_floats(const dims *d, const forest *f) {
  return attention_scratch_floats(d, f->max_ranges, f->max_depth) + 2 * (size_t)CHUNK * d->hd;
}

void forest_attention_backward(float *dqkv, const float *datt, const float *qkv, const float *att, const float *lse,
                               const forest_kv *kv, float *dsum, const forest *f, int s, int e, const dims *d,
                               float *scratch, size_t scratch_floats, int32_t *tiles, int32_t *kchunks) {
  int hd = d->hd, T = e - s, threads = cpu_threads();
  float scale = 1.0f / sqrtf((float)hd);
  size_t max_keys = (size_t)f->max_depth;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int i = 0; i < T; i++)
    for (int h = 0; h < d->H; h++) {
      const float *o = att + (size_t)i * d->q_dim + (size_t)h * hd, *g = datt + (size_t)i * d->q_dim + (size_t)h * hd;
      float sum = 0.0f;
      for (int c = 0; c < hd; c++) sum += o[c] * g[c];
      dsum[(size_t)i * d->H + h] = sum;
    }
  task_split sp = task_split_of(d);
  int n_tiles = forest_tiles(f, s, e, sp.rows, tiles);
  const int32_t *row_limit = tiles + n_tiles + 1;
  int32_t *segs = tiles + 2 * (size_t)T + 2;
  int n_segs = forest_tiles(f, s, e, SEGMENT_ROWS, segs), n_kc = key_chunks(f, segs, n_segs, kchunks);
#pragma omp parallel num_threads(threads)
  {
    float *work = scratch + (size_t)omp_get_thread_num() * scratch_floats;
    key_run *runs = (key_run *)(work + attend_work(hd, max_keys) + 2 * (size_t)CHUNK * hd);
    const float *q[TASK_QUERIES], *dout[TASK_QUERIES];
    float *dq[TASK_QUERIES], tile_lse[TASK_QUERIES], tile_dsum[TASK_QUERIES];
    int limit[TASK_QUERIES];
#pragma omp for schedule(dynamic, 1) nowait
    for (int task = 0; task < task_count(sp, n_tiles, d); task++) {
      attn_task t = task_at(task, sp, n_tiles, d);
      int i0 = tiles[t.tile], i1 = tiles[t.tile + 1], nh = t.h1 - t.h0;
      int n_runs = forest_runs(runs, f, i0, i1, t.g, kv, 1, d);
      int n = gather_queries(q, dq, limit, qkv, dqkv, row_limit, i0 - s, i1 - s, t.h0, t.h1, d);
      for (int k = 0; k < n; k++) { /* dq lives in dqkv's q part, dout in datt, both by head */
        size_t i = (size_t)(i0 - s + k / nh);
        int h = t.h0 + k % nh;
        dq[k] = dqkv + i * d->qkv_dim + (size_t)h * hd;
        dout[k] = datt + i * d->q_dim + (size_t)h * hd;
        tile_lse[k] = lse[i * d->H + h];
        tile_dsum[k] = dsum[i * d->H + h];
      }
      attend_grad_queries(n, q, dout, tile_lse, tile_dsum, limit, runs, n_runs, hd, scale, dq, work);
    }
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < n_kc * d->KV; task++)
      attend_grad_keys(kchunks[task / d->KV] * CHUNK, task % d->KV, segs, n_segs, s, qkv, datt, lse, dsum, kv, f, d, scale,
                       dqkv, work);
  }
}
