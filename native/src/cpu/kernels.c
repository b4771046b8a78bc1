/* kernels.c - embedding, RMSNorm, RoPE, SwiGLU, logits and AdamW kernels for the CPU. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "fastmath.h"
#include "gemm.h"
#include "kernels.h"

/* Parallel loops below split rows (or columns) statically, so each element's arithmetic
 * never depends on the thread count. */

void embed_forward(float *x, const int32_t *tokens, const float *embed, int T, int D) {
#pragma omp parallel for num_threads(cpu_threads_for((double)T * D)) schedule(static)
  for (int t = 0; t < T; t++) memcpy(x + (size_t)t * D, embed + (size_t)tokens[t] * D, sizeof(float) * D);
}

void embed_backward(float *dembed, const float *dx, const int32_t *tokens, int T, int D) {
  /* columns in parallel, rows in order */
#pragma omp parallel num_threads(cpu_threads_for((double)T * D))
  {
    int nt = omp_get_num_threads(), tid = omp_get_thread_num();
    int c0 = D * tid / nt, c1 = D * (tid + 1) / nt;
    for (int t = 0; t < T; t++) {
      float *dst = dembed + (size_t)tokens[t] * D;
      const float *src = dx + (size_t)t * D;
      for (int c = c0; c < c1; c++) dst[c] += src[c];
    }
  }
}

void rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int T, int D, float eps) {
#pragma omp parallel for num_threads(cpu_threads_for(3.0 * T * D)) schedule(static)
  for (int t = 0; t < T; t++) {
    const float *xt = x + (size_t)t * D;
    float *ot = out + (size_t)t * D;
    float ss = 0.0f;
    for (int c = 0; c < D; c++) ss += xt[c] * xt[c];
    float r = 1.0f / sqrtf(ss / D + eps);
    for (int c = 0; c < D; c++) ot[c] = xt[c] * r * w[c];
    if (rstd) rstd[t] = r;
  }
}

void rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                      const float *rstd, int T, int D) {
  /* y = x r w with r = (mean(x^2) + eps)^-1/2:
   * dx = r (dy w) - r^3 / D * x * sum_c(dy_c w_c x_c);  dw = sum_t dy x r */
#pragma omp parallel num_threads(cpu_threads_for(6.0 * T * D))
  {
#pragma omp for schedule(static)
    for (int t = 0; t < T; t++) {
      const float *xt = x + (size_t)t * D, *dy = dout + (size_t)t * D;
      float *dxt = dx + (size_t)t * D;
      float r = rstd[t], dot = 0.0f;
      for (int c = 0; c < D; c++) dot += dy[c] * w[c] * xt[c];
      float k = r * r * r * dot / D;
      for (int c = 0; c < D; c++) dxt[c] += r * dy[c] * w[c] - k * xt[c];
    }
    int nt = omp_get_num_threads(), tid = omp_get_thread_num();
    int c0 = D * tid / nt, c1 = D * (tid + 1) / nt;
    for (int t = 0; t < T; t++) {
      const float *xt = x + (size_t)t * D, *dy = dout + (size_t)t * D;
      float r = rstd[t];
      for (int c = c0; c < c1; c++) dw[c] += dy[c] * xt[c] * r;
    }
  }
}

void bias_forward(float *y, const float *b, int T, int N) {
#pragma omp parallel for num_threads(cpu_threads_for((double)T * N)) schedule(static)
  for (int t = 0; t < T; t++) {
    float *yt = y + (size_t)t * N;
    for (int c = 0; c < N; c++) yt[c] += b[c];
  }
}

void bias_backward(float *db, const float *dy, int T, int N) {
  /* columns in parallel, rows in order */
#pragma omp parallel num_threads(cpu_threads_for((double)T * N))
  {
    int nt = omp_get_num_threads(), tid = omp_get_thread_num();
    int c0 = N * tid / nt, c1 = N * (tid + 1) / nt;
    for (int t = 0; t < T; t++) {
      const float *src = dy + (size_t)t * N;
      for (int c = c0; c < c1; c++) db[c] += src[c];
    }
  }
}

void head_rmsnorm_forward(float *qkv, float *raw, float *rstd, const float *wq, const float *wk, int T,
                          const dims *d) {
  const int heads = d->H + d->KV, hd = d->hd; /* q heads then k heads, contiguous */
#pragma omp parallel for num_threads(cpu_threads_for(4.0 * T * heads * hd)) schedule(static)
  for (int t = 0; t < T; t++) {
    for (int h = 0; h < heads; h++) {
      float *x = qkv + (size_t)t * d->qkv_dim + (size_t)h * hd;
      const float *w = h < d->H ? wq : wk;
      if (raw != NULL) memcpy(raw + ((size_t)t * heads + h) * hd, x, sizeof(float) * hd);
      float ss = 0.0f;
      for (int c = 0; c < hd; c++) ss += x[c] * x[c];
      float r = 1.0f / sqrtf(ss / hd + d->eps);
      for (int c = 0; c < hd; c++) x[c] = x[c] * r * w[c];
      if (rstd != NULL) rstd[(size_t)t * heads + h] = r;
    }
  }
}

void head_rmsnorm_backward(float *dqkv, float *dwq, float *dwk, const float *raw, const float *wq, const float *wk,
                           const float *rstd, int T, const dims *d) {
  /* as rmsnorm_backward per head: dw first (it reads dy), then dx over dy in place */
  const int heads = d->H + d->KV, hd = d->hd;
#pragma omp parallel num_threads(cpu_threads_for(6.0 * T * heads * hd))
  {
    int nt = omp_get_num_threads(), tid = omp_get_thread_num();
    for (int k = 0; k < 2; k++) { /* q's columns, then k's, split among the threads */
      int c0 = hd * tid / nt, c1 = hd * (tid + 1) / nt, h0 = k == 0 ? 0 : d->H, h1 = k == 0 ? d->H : heads;
      float *dw = k == 0 ? dwq : dwk;
      for (int t = 0; t < T; t++)
        for (int h = h0; h < h1; h++) {
          const float *dy = dqkv + (size_t)t * d->qkv_dim + (size_t)h * hd, *x = raw + ((size_t)t * heads + h) * hd;
          float r = rstd[(size_t)t * heads + h];
          for (int c = c0; c < c1; c++) dw[c] += dy[c] * x[c] * r;
        }
    }
#pragma omp barrier
#pragma omp for schedule(static)
    for (int t = 0; t < T; t++)
      for (int h = 0; h < heads; h++) {
        float *dy = dqkv + (size_t)t * d->qkv_dim + (size_t)h * hd;
        const float *x = raw + ((size_t)t * heads + h) * hd, *w = h < d->H ? wq : wk;
        float r = rstd[(size_t)t * heads + h], dot = 0.0f;
        for (int c = 0; c < hd; c++) dot += dy[c] * w[c] * x[c];
        float k = r * r * r * dot / hd;
        for (int c = 0; c < hd; c++) dy[c] = r * dy[c] * w[c] - k * x[c];
      }
  }
}

void rope_cs(float *cs, const int32_t *positions, int T, const float *inv_freq, int hd, float scale) {
#pragma omp parallel for num_threads(cpu_threads_for(40.0 * T * hd)) schedule(static)
  for (int t = 0; t < T; t++) rope_rows(cs + (size_t)t * hd, positions + t, 1, inv_freq, hd, scale);
}

void rope(float *qkv, const float *cs, int T, const dims *d, int inverse) {
  int half = d->hd / 2, heads = d->H + d->KV; /* q heads then k heads, contiguous */
  float sign = inverse ? -1.0f : 1.0f;
#pragma omp parallel for num_threads(cpu_threads_for(3.0 * T * heads * d->hd)) schedule(static)
  for (int t = 0; t < T; t++) {
    const float *c = cs + (size_t)t * d->hd, *s = c + half;
    for (int h = 0; h < heads; h++) {
      float *x = qkv + (size_t)t * d->qkv_dim + (size_t)h * d->hd;
      for (int j = 0; j < half; j++) {
        float x1 = x[j], x2 = x[j + half], sn = sign * s[j];
        x[j] = x1 * c[j] - x2 * sn;
        x[j + half] = x2 * c[j] + x1 * sn;
      }
    }
  }
}

void swiglu_forward(float *act, const float *gu, int T, int F) {
#pragma omp parallel for num_threads(cpu_threads_for(2.0 * T * F)) schedule(static)
  for (int t = 0; t < T; t++) {
    const float *g = gu + (size_t)t * 2 * F, *u = g + F;
    float *a = act + (size_t)t * F;
    for (int c = 0; c < F; c++) a[c] = g[c] * fast_sigmoid(g[c]) * u[c];
  }
}

void swiglu_backward(float *dgu, const float *dact, const float *gu, int T, int F) {
#pragma omp parallel for num_threads(cpu_threads_for(25.0 * T * F)) schedule(static)
  for (int t = 0; t < T; t++) {
    const float *g = gu + (size_t)t * 2 * F, *u = g + F, *da = dact + (size_t)t * F;
    float *dg = dgu + (size_t)t * 2 * F, *du = dg + F;
    for (int c = 0; c < F; c++) {
      float sg = fast_sigmoid(g[c]), silu = g[c] * sg;
      du[c] = da[c] * silu;
      dg[c] = da[c] * u[c] * sg * (1.0f + g[c] * (1.0f - sg));
    }
  }
}

void logits_stats(float *lse, float *entropy, float *logits, int T, int V, float scale) {
#pragma omp parallel for num_threads(cpu_threads_for(30.0 * T * V)) schedule(static)
  for (int t = 0; t < T; t++) {
    float *z = logits + (size_t)t * V;
    if (scale != 1.0f)
      for (int v = 0; v < V; v++) z[v] *= scale;
    float max = z[0];
    for (int v = 1; v < V; v++) max = z[v] > max ? z[v] : max;
    double sum = 0.0, wsum = 0.0;
    for (int v = 0; v < V; v++) {
      double e = exp((double)z[v] - max);
      sum += e;
      wsum += e * ((double)z[v] - max);
    }
    double log_sum = log(sum);
    lse[t] = (float)(max + log_sum);
    entropy[t] = (float)(log_sum - wsum / sum); /* H = log Z - E[z - max] */
  }
}

void logits_backward(float *dlogits, const float *logits, const float *lse, int T, int s, const int32_t *child_off,
                     const int32_t *children, const int32_t *tokens, const float *dlogp, int V, float *coef) {
  /* dL/dlogits[p] = sum over children c of p: dlogp_c (onehot(tokens[c]) - softmax_p) */
  for (int t = 0; t < T; t++) {
    float c = 0.0f;
    for (int k = child_off[s + t]; k < child_off[s + t + 1]; k++) c += dlogp[children[k]];
    coef[t] = c;
  }
#pragma omp parallel for num_threads(cpu_threads()) schedule(static)
  for (int t = 0; t < T; t++) {
    float *dz = dlogits + (size_t)t * V;
    const float *z = logits + (size_t)t * V;
    if (coef[t] == 0.0f) {
      memset(dz, 0, sizeof(float) * V);
      continue;
    }
    for (int v = 0; v < V; v++) dz[v] = -coef[t] * expf(z[v] - lse[t]);
  }
  for (int t = 0; t < T; t++)
    for (int k = child_off[s + t]; k < child_off[s + t + 1]; k++) {
      int i = children[k];
      if (dlogp[i] != 0.0f) dlogits[(size_t)t * V + tokens[i]] += dlogp[i];
    }
}

#define CHUNK 65536

double sum_squares(const float *x, size_t n) {
  size_t chunks = (n + CHUNK - 1) / CHUNK;
  double total = 0.0;
  double partial[256];
  for (size_t base = 0; base < chunks; base += 256) {
    size_t count = chunks - base < 256 ? chunks - base : 256;
#pragma omp parallel for num_threads(cpu_threads()) schedule(static)
    for (size_t k = 0; k < count; k++) {
      size_t lo = (base + k) * CHUNK, hi = lo + CHUNK < n ? lo + CHUNK : n;
      double s = 0.0;
      for (size_t i = lo; i < hi; i++) s += (double)x[i] * x[i];
      partial[k] = s;
    }
    for (size_t k = 0; k < count; k++) total += partial[k];
  }
  return total;
}

void adamw(float *w, const float *g, float *m, float *v, size_t n, const gyre_adamw *opt, int64_t step,
           float grad_scale) {
  float b1 = opt->beta1, b2 = opt->beta2;
  double bc1 = 1.0 - pow(b1, (double)step), bc2 = 1.0 - pow(b2, (double)step);
  float step_size = (float)(opt->lr / bc1), bc2_sqrt = (float)sqrt(bc2);
  float decay = 1.0f - opt->lr * opt->weight_decay, eps = opt->eps; /* a local: stores to w, m, v may alias *opt */
#pragma omp parallel for num_threads(cpu_threads()) schedule(static)
  for (size_t i = 0; i < n; i++) {
    float gi = g[i] * grad_scale;
    m[i] = b1 * m[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    float denom = sqrtf(v[i]) / bc2_sqrt + eps;
    w[i] = w[i] * decay - step_size * m[i] / denom;
  }
}
