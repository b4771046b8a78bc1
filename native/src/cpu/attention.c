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

#include "attention.h"
#include "gemm.h"

#include "fastmath.h"

#define KEYS 32 /* keys scored per register block in score_keys */
#define CHUNK 16 /* keys per step of the online softmax */
#define QB 8     /* queries sharing one pass over a key chunk */
#define MASKED (-1e30f)

typedef float v16 __attribute__((vector_size(CHUNK * sizeof(float))));

static inline v16 load16(const float *p) {
  v16 v;
  memcpy(&v, p, sizeof v);
  return v;
}

/* s[j] = scale * sum_d q[d] * kt[d * ldk + j]   for j < n */
static void score_keys(float *restrict s, const float *restrict q, const float *restrict kt, size_t ldk,
                       int n, int hd, float scale) {
  int j = 0;
  for (; j + KEYS <= n; j += KEYS) {
    float acc[KEYS] = {0};
    for (int c = 0; c < hd; c++) {
      const float qc = q[c], *row = kt + (size_t)c * ldk + j;
      for (int u = 0; u < KEYS; u++) acc[u] += qc * row[u];
    }
    for (int u = 0; u < KEYS; u++) s[j + u] = acc[u] * scale;
  }
  if (j < n) {
    int w = n - j;
    float acc[KEYS] = {0};
    for (int c = 0; c < hd; c++) {
      const float qc = q[c], *row = kt + (size_t)c * ldk + j;
      for (int u = 0; u < w; u++) acc[u] += qc * row[u];
    }
    for (int u = 0; u < w; u++) s[j + u] = acc[u] * scale;
  }
}

/* out[0..hd) += sum_j p[j] * rows[j * ld + 0..hd) */
static void sum_rows(float *restrict out, const float *restrict p, const float *restrict rows, size_t ld,
                     int n, int hd) {
  for (int j = 0; j < n; j++) {
    const float pj = p[j], *row = rows + (size_t)j * ld;
    for (int c = 0; c < hd; c++) out[c] += pj * row[c];
  }
}

/* A run of keys: key j < n has K column kt[c * ldk + j], V row v[j * ldv + c], and position
 * pos0 + j, compared with each query's limit (keys past it are masked). */
typedef struct key_run {
  const float *kt;
  size_t ldk;
  const float *v;
  size_t ldv;
  int n, pos0;
} key_run;

/* Online-softmax attention of R queries over runs of keys (flash-attention style, no score
 * matrix): out[r] = softmax(scale q_r . K, keys with position <= limit[r]) V, lse[r] its
 * log-sum-exp (may be NULL). Queries go QB at a time through each 16-key chunk, whose K
 * columns stay in L1 while they are scored. work: QB * (hd + CHUNK) + CHUNK * hd floats. */
static void attend(int R, const float *const *q, const int *limit, const key_run *runs, int n_runs, int hd,
                   float scale, float *const *out, float *lse, float *work) {
  float *o = work, *p = o + QB * hd, *pad = p + QB * CHUNK;
  for (int r0 = 0; r0 < R; r0 += QB) {
    int nq = R - r0 < QB ? R - r0 : QB, top = limit[r0];
    float m[QB], l[QB];
    for (int r = 0; r < nq; r++) {
      m[r] = MASKED;
      l[r] = 0.0f;
      top = limit[r0 + r] > top ? limit[r0 + r] : top;
    }
    memset(o, 0, sizeof(float) * QB * hd);
    for (int k = 0; k < n_runs; k++) {
      const key_run *run = &runs[k];
      for (int j0 = 0; j0 < run->n && run->pos0 + j0 <= top; j0 += CHUNK) {
        int w = run->n - j0 < CHUNK ? run->n - j0 : CHUNK;
        const float *kt = run->kt + j0;
        size_t ldk = run->ldk;
        if (w < CHUNK) { /* a partial chunk: zero-padded copy */
          for (int c = 0; c < hd; c++) {
            memset(pad + c * CHUNK, 0, sizeof(float) * CHUNK);
            memcpy(pad + c * CHUNK, kt + (size_t)c * ldk, sizeof(float) * w);
          }
          kt = pad;
          ldk = CHUNK;
        }
        v16 s[QB];
        for (int r = 0; r < QB; r++) s[r] = (v16){0};
        for (int c = 0; c < hd; c++) {
          v16 kc = load16(kt + (size_t)c * ldk);
          for (int r = 0; r < nq; r++) s[r] += q[r0 + r][c] * kc;
        }
        const float *v = run->v + (size_t)j0 * run->ldv;
        for (int r = 0; r < nq; r++) {
          float sr[CHUNK], *pr = p + r * CHUNK, chunk_max = MASKED;
          memcpy(sr, &s[r], sizeof sr);
          int visible = limit[r0 + r] - (run->pos0 + j0) + 1; /* keys u < visible are not masked */
          if (visible > w) visible = w;
          if (visible <= 0) continue;
          for (int u = 0; u < CHUNK; u++) {
            sr[u] = u < visible ? sr[u] * scale : MASKED;
            chunk_max = sr[u] > chunk_max ? sr[u] : chunk_max;
          }
          float *orow = o + r * hd;
          if (chunk_max > m[r]) {
            float factor = fast_exp(m[r] - chunk_max);
            l[r] *= factor;
            for (int c = 0; c < hd; c++) orow[c] *= factor;
            m[r] = chunk_max;
          }
          float sum = 0.0f;
          for (int u = 0; u < CHUNK; u++) {
            pr[u] = fast_exp(sr[u] - m[r]);
            sum += pr[u];
          }
          l[r] += sum;
          for (int c = 0; c < hd; c += CHUNK) { /* hd is even; CHUNK-wide columns, then the rest */
            int cw = hd - c < CHUNK ? hd - c : CHUNK;
            if (cw == CHUNK) {
              v16 acc = load16(orow + c);
              for (int u = 0; u < visible; u++) acc += pr[u] * load16(v + (size_t)u * run->ldv + c);
              memcpy(orow + c, &acc, sizeof acc);
            } else {
              for (int u = 0; u < visible; u++)
                for (int cc = c; cc < hd; cc++) orow[cc] += pr[u] * v[(size_t)u * run->ldv + cc];
            }
          }
        }
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
static size_t attend_work(int hd) { return (size_t)QB * (hd + CHUNK) + (size_t)CHUNK * hd; }

/* ---- paged (inference) ---- */

void kv_store(float *pool, const dims *d, int B, int layer, const fwd_batch *b, const float *qkv) {
#pragma omp parallel for num_threads(cpu_threads()) schedule(static)
  for (int r = 0; r < b->n_rows; r++) {
    int pos = b->positions[r], slot = pos % B;
    int32_t block = b->blocks[b->block_off[b->row_seq[r]] + pos / B];
    const float *k = qkv + (size_t)r * d->qkv_dim + d->q_dim, *v = k + d->kv_dim;
    for (int g = 0; g < d->KV; g++) {
      float *kt = pool + kv_offset(d, B, block, layer, 0, g);
      for (int c = 0; c < d->hd; c++) kt[(size_t)c * B + slot] = k[g * d->hd + c];
      memcpy(pool + kv_offset(d, B, block, layer, 1, g) + (size_t)slot * d->hd, v + g * d->hd,
             sizeof(float) * d->hd);
    }
  }
}

void kv_transfer(float *pool, const dims *d, int B, const int32_t *blocks, int32_t length, float *payload,
                 int to_payload) {
  for (int l = 0; l < d->L; l++)
    for (int kind = 0; kind < 2; kind++)
      for (int32_t t = 0; t < length; t++)
        for (int g = 0; g < d->KV; g++) {
          float *cached = pool + kv_offset(d, B, blocks[t / B], l, kind, g);
          float *flat = payload + ((((size_t)l * 2 + kind) * length + t) * d->KV + g) * d->hd;
          for (int c = 0; c < d->hd; c++) {
            float *x = kind == 0 ? cached + (size_t)c * B + t % B : cached + (size_t)(t % B) * d->hd + c;
            if (to_payload) flat[c] = *x;
            else *x = flat[c];
          }
        }
}

/* Queries of rows [r0, r1) and the G heads of kv head g, for attend. */
static int gather_queries(const float **q, float **out, int *limit, const float *qkv, float *att, const int32_t *row_limit,
                          int r0, int r1, int g, const dims *d) {
  int G = d->H / d->KV, n = 0;
  for (int r = r0; r < r1; r++)
    for (int h = g * G; h < (g + 1) * G; h++, n++) {
      q[n] = qkv + (size_t)r * d->qkv_dim + (size_t)h * d->hd;
      out[n] = att + (size_t)r * d->q_dim + (size_t)h * d->hd;
      limit[n] = row_limit[r];
    }
  return n;
}

/* Rows per tile: two passes of QB queries over each key chunk. */
static int tile_rows(const dims *d) {
  int rows = 2 * QB / (d->H / d->KV);
  return rows > 0 ? rows : 1;
}

size_t attention_scratch_floats(const dims *d, int max_runs) {
  size_t runs = ((size_t)max_runs * sizeof(key_run) + sizeof(float) - 1) / sizeof(float);
  return (attend_work(d->hd) + runs + 15) / 16 * 16;
}

size_t paged_staging_floats(const dims *d, int B) {
  return B % CHUNK == 0 ? 0 : 2 * (size_t)((d->max_pos + CHUNK - 1) / CHUNK) * CHUNK * d->hd;
}

/* The key runs of one kv head over positions [0, ctx) of a block table, chunk-aligned to
 * absolute positions so the arithmetic does not depend on the block size: a block whose
 * size is a multiple of CHUNK is used in place; otherwise each CHUNK of positions is
 * gathered into staging (K as [hd][CHUNK], V as [CHUNK][hd]). Returns the run count. */
static int paged_runs(key_run *runs, const float *pool, const int32_t *table, int ctx, const dims *d, int B, int layer,
                      int g, float *staging) {
  int hd = d->hd, n = 0;
  if (B % CHUNK == 0) {
    for (int k = 0; k * B < ctx; k++)
      runs[n++] = (key_run){pool + kv_offset(d, B, table[k], layer, 0, g), (size_t)B, pool + kv_offset(d, B, table[k], layer, 1, g),
                            (size_t)hd, ctx - k * B < B ? ctx - k * B : B, k * B};
    return n;
  }
  for (int p0 = 0; p0 < ctx; p0 += CHUNK) {
    int w = ctx - p0 < CHUNK ? ctx - p0 : CHUNK;
    float *kt = staging + (size_t)2 * n * CHUNK * hd, *v = kt + (size_t)CHUNK * hd;
    for (int u = 0; u < w; u++) {
      int pos = p0 + u;
      const float *kb = pool + kv_offset(d, B, table[pos / B], layer, 0, g), *vb = pool + kv_offset(d, B, table[pos / B], layer, 1, g);
      for (int c = 0; c < hd; c++) kt[c * CHUNK + u] = kb[(size_t)c * B + pos % B];
      memcpy(v + (size_t)u * hd, vb + (size_t)(pos % B) * hd, sizeof(float) * hd);
    }
    runs[n++] = (key_run){kt, CHUNK, v, (size_t)hd, w, p0};
  }
  return n;
}

void paged_attention(float *att, const float *qkv, const float *pool, const dims *d, int B, int layer,
                     const fwd_batch *b, float *scratch, size_t scratch_floats, int32_t *tiles) {
  int rows = tile_rows(d);
  float scale = 1.0f / sqrtf((float)d->hd);
  size_t staging = paged_staging_floats(d, B);
  /* tiles: up to `rows` consecutive rows of one sequence; tasks kv-head-major so one head's
   * keys stay hot while consecutive tiles use them */
  int n_tiles = 0;
  for (int r = 0; r < b->n_rows; n_tiles++) {
    tiles[n_tiles] = r;
    int s = b->row_seq[r];
    while (r < b->n_rows && b->row_seq[r] == s && r - tiles[n_tiles] < rows) r++;
  }
  tiles[n_tiles] = b->n_rows;
#pragma omp parallel num_threads(cpu_threads())
  {
    float *work = scratch + (size_t)omp_get_thread_num() * scratch_floats;
    key_run *runs = (key_run *)(work + attend_work(d->hd));
    float *stage = work + scratch_floats - staging;
    const float *q[2 * QB];
    float *out[2 * QB];
    int limit[2 * QB];
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < n_tiles * d->KV; task++) {
      int g = task / n_tiles, tile = task % n_tiles, r0 = tiles[tile], r1 = tiles[tile + 1];
      const int32_t *table = b->blocks + b->block_off[b->row_seq[r0]];
      int n_runs = paged_runs(runs, pool, table, b->positions[r1 - 1] + 1, d, B, layer, g, stage);
      int n = gather_queries(q, out, limit, qkv, att, b->positions, r0, r1, g, d);
      attend(n, q, limit, runs, n_runs, d->hd, scale, out, NULL, work);
    }
  }
}

/* ---- forest (training) ---- */

/* dst[KV][hd][T] = the kv head columns starting at column `from` of rows[T, ld] */
static void transpose_heads(float *dst, const float *rows, size_t ld, int from, int T, const dims *d) {
#pragma omp parallel for num_threads(cpu_threads()) schedule(static)
  for (int gc = 0; gc < d->KV * d->hd; gc++) {
    float *out = dst + (size_t)gc * T;
    const float *src = rows + from + gc;
    for (int t = 0; t < T; t++) out[t] = src[(size_t)t * ld];
  }
}

void forest_attention_forward(float *att, float *lse, const float *qkv, float *kt, const forest *f, int T,
                              const dims *d, float *scratch, size_t scratch_floats, int32_t *tiles) {
  int rows = tile_rows(d), G = d->H / d->KV;
  float scale = 1.0f / sqrtf((float)d->hd);
  transpose_heads(kt, qkv, d->qkv_dim, d->q_dim, T, d);
  /* tiles: runs of rows each the child of the previous one; they share their first row's
   * ancestors, the rest of the tile being the causal part */
  int n_tiles = 0;
  for (int i = 0; i < T; n_tiles++) {
    tiles[n_tiles] = i++;
    while (i < T && i - tiles[n_tiles] < rows && f->ranges[2 * f->range_off[i + 1] - 2] < i) i++; /* parent is i - 1 */
  }
  tiles[n_tiles] = T;
  int32_t *row_limit = tiles + n_tiles + 1; /* a row sees keys up to itself */
  for (int i = 0; i < T; i++) row_limit[i] = i;
#pragma omp parallel num_threads(cpu_threads())
  {
    float *work = scratch + (size_t)omp_get_thread_num() * scratch_floats;
    key_run *runs = (key_run *)(work + attend_work(d->hd));
    const float *q[2 * QB];
    float *out[2 * QB];
    float tile_lse[2 * QB];
    int limit[2 * QB];
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < n_tiles * d->KV; task++) {
      int g = task / n_tiles, tile = task % n_tiles, i0 = tiles[tile], i1 = tiles[tile + 1];
      int first = f->range_off[i0], n_runs = f->range_off[i0 + 1] - first;
      for (int k = 0; k < n_runs; k++) {
        int a = f->ranges[2 * (first + k)], e = k == n_runs - 1 ? i1 - 1 : f->ranges[2 * (first + k) + 1];
        runs[k] = (key_run){kt + (size_t)g * d->hd * T + a, (size_t)T,
                            qkv + (size_t)a * d->qkv_dim + d->q_dim + d->kv_dim + g * d->hd, (size_t)d->qkv_dim, e - a + 1, a};
      }
      int n = gather_queries(q, out, limit, qkv, att, row_limit, i0, i1, g, d);
      attend(n, q, limit, runs, n_runs, d->hd, scale, out, tile_lse, work);
      for (int k = 0; k < n; k++) lse[(size_t)(i0 + k / G) * d->H + g * G + k % G] = tile_lse[k];
    }
  }
}

/* p[j] = softmax probability recomputed from the saved lse, ds[j] = p[j] (dp[j] - dsum),
 * for keys kt/vt columns [a, a + n) of query row q / output gradient dout. */
static void recompute(float *p, float *ds, const float *q, const float *dout, const float *ktg, const float *vtg,
                      int a, int n, int T, int hd, float scale, float lse, float dsum) {
  score_keys(p, q, ktg + a, T, n, hd, scale);
  score_keys(ds, dout, vtg + a, T, n, hd, 1.0f);
  for (int j = 0; j < n; j++) {
    p[j] = fast_exp(p[j] - lse);
    ds[j] = p[j] * (ds[j] - dsum);
  }
}

void forest_attention_backward(float *dqkv, const float *datt, const float *qkv, const float *att,
                               const float *lse, float *kt, float *vt, float *dsum, const forest *f, int T,
                               const dims *d, float *scratch, size_t scratch_floats) {
  int G = d->H / d->KV, hd = d->hd, threads = cpu_threads();
  float scale = 1.0f / sqrtf((float)hd);
  transpose_heads(kt, qkv, d->qkv_dim, d->q_dim, T, d);
  transpose_heads(vt, qkv, d->qkv_dim, d->q_dim + d->kv_dim, T, d);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int i = 0; i < T; i++) {
    memset(dqkv + (size_t)i * d->qkv_dim, 0, sizeof(float) * d->qkv_dim);
    for (int h = 0; h < d->H; h++) {
      const float *o = att + (size_t)i * d->q_dim + (size_t)h * hd, *g = datt + (size_t)i * d->q_dim + (size_t)h * hd;
      float s = 0.0f;
      for (int c = 0; c < hd; c++) s += o[c] * g[c];
      dsum[(size_t)i * d->H + h] = s;
    }
  }
  /* pass A, per query row: dq_i = scale * sum_j ds_ij k_j */
#pragma omp parallel for num_threads(threads) schedule(dynamic, 4)
  for (int task = 0; task < T * d->H; task++) {
    int i = task / d->H, h = task % d->H, g = h / G;
    float *p = scratch + (size_t)omp_get_thread_num() * scratch_floats, *ds = p + f->max_depth;
    const float *q = qkv + (size_t)i * d->qkv_dim + (size_t)h * hd, *dout = datt + (size_t)i * d->q_dim + (size_t)h * hd;
    const float *kg = qkv + d->q_dim + g * hd;
    float *dq = dqkv + (size_t)i * d->qkv_dim + (size_t)h * hd;
    for (int k = f->range_off[i]; k < f->range_off[i + 1]; k++) {
      int a = f->ranges[2 * k], n = f->ranges[2 * k + 1] - a + 1;
      recompute(p, ds, q, dout, kt + (size_t)g * hd * T, vt + (size_t)g * hd * T, a, n, T, hd, scale,
                lse[(size_t)i * d->H + h], dsum[(size_t)i * d->H + h]);
      sum_rows(dq, ds, kg + (size_t)a * d->qkv_dim, d->qkv_dim, n, hd);
    }
    for (int c = 0; c < hd; c++) dq[c] *= scale;
  }
  /* pass B, per chunk of key rows (balanced by how many queries see them):
   * dk_j = scale * sum_i ds_ij q_i, dv_j = sum_i p_ij dout_i, summed over i ascending */
  int chunks = 4 * threads < T ? 4 * threads : T, bounds[4 * 256 + 1];
  if (chunks > 4 * 256) chunks = 4 * 256;
  int64_t total = 0, acc = 0;
  for (int j = 0; j < T; j++) total += f->desc[j];
  int c = 1;
  bounds[0] = 0;
  for (int j = 0; j < T && c < chunks; j++) {
    acc += f->desc[j];
    while (c < chunks && acc * chunks >= total * c) bounds[c++] = j + 1;
  }
  while (c <= chunks) bounds[c++] = T;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int task = 0; task < chunks * d->KV; task++) {
    int c = task / d->KV, g = task % d->KV, lo = bounds[c], hi = bounds[c + 1];
    float *p = scratch + (size_t)omp_get_thread_num() * scratch_floats, *ds = p + f->max_depth;
    for (int i = lo; i < T && lo < hi; i++)
      for (int k = f->range_off[i]; k < f->range_off[i + 1]; k++) {
        int a = f->ranges[2 * k], b = f->ranges[2 * k + 1];
        if (a >= hi) break;
        int from = a > lo ? a : lo, to = b < hi - 1 ? b : hi - 1;
        if (from > to) continue;
        int n = to - from + 1;
        for (int h = g * G; h < (g + 1) * G; h++) {
          const float *q = qkv + (size_t)i * d->qkv_dim + (size_t)h * hd;
          const float *dout = datt + (size_t)i * d->q_dim + (size_t)h * hd;
          recompute(p, ds, q, dout, kt + (size_t)g * hd * T, vt + (size_t)g * hd * T, from, n, T, hd, scale,
                    lse[(size_t)i * d->H + h], dsum[(size_t)i * d->H + h]);
          for (int j = 0; j < n; j++) {
            float *dk = dqkv + (size_t)(from + j) * d->qkv_dim + d->q_dim + g * hd, *dv = dk + d->kv_dim;
            float a_k = scale * ds[j], a_v = p[j];
            for (int cc = 0; cc < hd; cc++) {
              dk[cc] += a_k * q[cc];
              dv[cc] += a_v * dout[cc];
            }
          }
        }
      }
  }
}
