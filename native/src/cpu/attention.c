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

#define KEYS 32 /* keys scored per register block */

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

/* s[0..n) <- softmax(s); returns log-sum-exp */
static float softmax(float *s, int n) {
  float max = s[0];
  for (int j = 1; j < n; j++) max = s[j] > max ? s[j] : max;
  float sum = 0.0f;
  for (int j = 0; j < n; j++) {
    s[j] = expf(s[j] - max);
    sum += s[j];
  }
  float inv = 1.0f / sum;
  for (int j = 0; j < n; j++) s[j] *= inv;
  return max + logf(sum);
}

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

void paged_attention(float *att, const float *qkv, const float *pool, const dims *d, int B, int layer,
                     const fwd_batch *b, float *scratch) {
  int G = d->H / d->KV, hd = d->hd;
  float scale = 1.0f / sqrtf((float)hd);
  int tasks = d->KV * b->n_rows;
  /* kv-head-major order keeps one head's keys hot while consecutive rows use them */
#pragma omp parallel for num_threads(cpu_threads()) schedule(dynamic, 1)
  for (int task = 0; task < tasks; task++) {
    int g = task / b->n_rows, r = task % b->n_rows;
    float *sc = scratch + (size_t)omp_get_thread_num() * G * d->max_pos;
    int ctx = b->positions[r] + 1, nb = (ctx + B - 1) / B;
    const int32_t *table = b->blocks + b->block_off[b->row_seq[r]];
    const float *q = qkv + (size_t)r * d->qkv_dim + (size_t)g * G * hd;
    for (int bi = 0; bi < nb; bi++) {
      int n = ctx - bi * B < B ? ctx - bi * B : B;
      const float *kt = pool + kv_offset(d, B, table[bi], layer, 0, g);
      for (int h = 0; h < G; h++) score_keys(sc + (size_t)h * d->max_pos + bi * B, q + h * hd, kt, B, n, hd, scale);
    }
    float *out = att + (size_t)r * d->q_dim + (size_t)g * G * hd;
    memset(out, 0, sizeof(float) * G * hd);
    for (int h = 0; h < G; h++) softmax(sc + (size_t)h * d->max_pos, ctx);
    for (int bi = 0; bi < nb; bi++) {
      int n = ctx - bi * B < B ? ctx - bi * B : B;
      const float *v = pool + kv_offset(d, B, table[bi], layer, 1, g);
      for (int h = 0; h < G; h++) sum_rows(out + h * hd, sc + (size_t)h * d->max_pos + bi * B, v, hd, n, hd);
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
                              const dims *d, float *scratch) {
  int G = d->H / d->KV, hd = d->hd;
  float scale = 1.0f / sqrtf((float)hd);
  transpose_heads(kt, qkv, d->qkv_dim, d->q_dim, T, d);
#pragma omp parallel for num_threads(cpu_threads()) schedule(dynamic, 4)
  for (int task = 0; task < T * d->H; task++) {
    int i = task / d->H, h = task % d->H, g = h / G;
    float *sc = scratch + (size_t)omp_get_thread_num() * f->max_depth;
    const float *q = qkv + (size_t)i * d->qkv_dim + (size_t)h * hd, *ktg = kt + (size_t)g * hd * T;
    const float *vg = qkv + d->q_dim + d->kv_dim + g * hd;
    int idx = 0;
    for (int k = f->range_off[i]; k < f->range_off[i + 1]; k++) {
      int a = f->ranges[2 * k], n = f->ranges[2 * k + 1] - a + 1;
      score_keys(sc + idx, q, ktg + a, T, n, hd, scale);
      idx += n;
    }
    lse[(size_t)i * d->H + h] = softmax(sc, idx);
    float *out = att + (size_t)i * d->q_dim + (size_t)h * hd;
    memset(out, 0, sizeof(float) * hd);
    idx = 0;
    for (int k = f->range_off[i]; k < f->range_off[i + 1]; k++) {
      int a = f->ranges[2 * k], n = f->ranges[2 * k + 1] - a + 1;
      sum_rows(out, sc + idx, vg + (size_t)a * d->qkv_dim, d->qkv_dim, n, hd);
      idx += n;
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
    p[j] = expf(p[j] - lse);
    ds[j] = p[j] * (ds[j] - dsum);
  }
}

void forest_attention_backward(float *dqkv, const float *datt, const float *qkv, const float *att,
                               const float *lse, float *kt, float *vt, float *dsum, const forest *f, int T,
                               const dims *d, float *scratch) {
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
    float *p = scratch + (size_t)omp_get_thread_num() * 2 * f->max_depth, *ds = p + f->max_depth;
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
    float *p = scratch + (size_t)omp_get_thread_num() * 2 * f->max_depth, *ds = p + f->max_depth;
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
