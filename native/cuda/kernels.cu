/* kernels.cu - embedding, RMSNorm, RoPE, SwiGLU, logits and AdamW kernels for the GPU.
 * Row kernels run one block per row; column sums run over fixed row chunks and then add the
 * chunks in order, so every result is independent of scheduling. */
#include <math.h>

#include "kernels.cuh"

namespace {

constexpr int ROW_THREADS = 256;
constexpr int COL_CHUNK = 128; /* rows per partial column sum */

/* x[t][c] = table[index[t]][c] */
__global__ void gather_rows_k(float *__restrict__ x, const float *__restrict__ table, const int32_t *__restrict__ index,
                              int D) {
  const int t = blockIdx.x;
  const float *src = table + (size_t)index[t] * D;
  for (int c = threadIdx.x; c < D; c += blockDim.x) x[(size_t)t * D + c] = src[c];
}

__global__ void embed_backward_k(float *__restrict__ dembed, const float *__restrict__ dx,
                                 const int32_t *__restrict__ token_ids, const int32_t *__restrict__ row_off,
                                 const int32_t *__restrict__ rows, int D) {
  const int u = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= D) return;
  float *dst = dembed + (size_t)token_ids[u] * D + c;
  float acc = *dst;
  for (int k = row_off[u]; k < row_off[u + 1]; k++) acc += dx[(size_t)rows[k] * D + c];
  *dst = acc;
}

__global__ void __launch_bounds__(ROW_THREADS)
    rmsnorm_forward_k(float *__restrict__ out, float *__restrict__ rstd, const float *__restrict__ x,
                      const float *__restrict__ w, int D, float eps) {
  __shared__ float red[32];
  const size_t t = blockIdx.x;
  const float *xt = x + t * D;
  float ss = 0.0f;
  for (int c = threadIdx.x; c < D; c += blockDim.x) ss += xt[c] * xt[c];
  ss = block_sum(ss, red);
  const float r = 1.0f / sqrtf(ss / D + eps);
  for (int c = threadIdx.x; c < D; c += blockDim.x) out[t * D + c] = xt[c] * r * w[c];
  if (rstd != nullptr && threadIdx.x == 0) rstd[t] = r;
}

/* dx = r (dy w) - r^3 / D * x * sum_c(dy_c w_c x_c) */
__global__ void __launch_bounds__(ROW_THREADS)
    rmsnorm_backward_dx_k(float *__restrict__ dx, const float *__restrict__ dout, const float *__restrict__ x,
                          const float *__restrict__ w, const float *__restrict__ rstd, int D) {
  __shared__ float red[32];
  const size_t t = blockIdx.x;
  const float *xt = x + t * D, *dy = dout + t * D;
  const float r = rstd[t];
  float dot = 0.0f;
  for (int c = threadIdx.x; c < D; c += blockDim.x) dot += dy[c] * w[c] * xt[c];
  dot = block_sum(dot, red);
  const float k = r * r * r * dot / D;
  for (int c = threadIdx.x; c < D; c += blockDim.x) dx[t * D + c] += r * dy[c] * w[c] - k * xt[c];
}

/* partial[chunk][c] = sum over the chunk's rows t of dout[t][c] x[t][c] rstd[t] */
__global__ void rmsnorm_backward_dw_k(float *__restrict__ partial, const float *__restrict__ dout,
                                      const float *__restrict__ x, const float *__restrict__ rstd, int T, int D) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
  if (c >= D) return;
  const int t1 = min(T, (chunk + 1) * COL_CHUNK);
  float s = 0.0f;
  for (int t = chunk * COL_CHUNK; t < t1; t++) s += dout[(size_t)t * D + c] * x[(size_t)t * D + c] * rstd[t];
  partial[(size_t)chunk * D + c] = s;
}

/* y[c] += sum over chunks (ascending) of partial[chunk][c] */
__global__ void add_column_sums_k(float *__restrict__ y, const float *__restrict__ partial, int chunks, int D) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= D) return;
  float s = 0.0f;
  for (int k = 0; k < chunks; k++) s += partial[(size_t)k * D + c];
  y[c] += s;
}

__global__ void bias_forward_k(float *__restrict__ y, const float *__restrict__ b, int64_t total, int N) {
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total;
       idx += (int64_t)gridDim.x * blockDim.x)
    y[idx] += b[idx % N];
}

/* partial[chunk][c] = sum over the chunk's rows t of dy[t][c] */
__global__ void column_sums_k(float *__restrict__ partial, const float *__restrict__ dy, int T, int N) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
  if (c >= N) return;
  const int t1 = min(T, (chunk + 1) * COL_CHUNK);
  float s = 0.0f;
  for (int t = chunk * COL_CHUNK; t < t1; t++) s += dy[(size_t)t * N + c];
  partial[(size_t)chunk * N + c] = s;
}

constexpr int HEAD_THREADS = 64;

/* One block per (row t, head h) = blockIdx.x = t * heads + h: x -> x r w over the head's hd values. */
__global__ void __launch_bounds__(HEAD_THREADS)
    head_rmsnorm_forward_k(float *__restrict__ qkv, float *__restrict__ raw, float *__restrict__ rstd,
                           const float *__restrict__ wq, const float *__restrict__ wk, int H, int heads, int hd,
                           int qkv_dim, float eps) {
  __shared__ float red[32];
  const int t = blockIdx.x / heads, h = blockIdx.x % heads;
  float *x = qkv + (size_t)t * qkv_dim + (size_t)h * hd;
  const float *w = h < H ? wq : wk;
  float ss = 0.0f;
  for (int c = threadIdx.x; c < hd; c += blockDim.x) {
    const float v = x[c];
    ss += v * v;
    if (raw != nullptr) raw[(size_t)blockIdx.x * hd + c] = v;
  }
  ss = block_sum(ss, red);
  const float r = 1.0f / sqrtf(ss / hd + eps);
  for (int c = threadIdx.x; c < hd; c += blockDim.x) x[c] = x[c] * r * w[c];
  if (rstd != nullptr && threadIdx.x == 0) rstd[blockIdx.x] = r;
}

/* In place: dy -> r (dy w) - r^3 / hd * x * sum_c(dy_c w_c x_c), each thread rewriting what it read. */
__global__ void __launch_bounds__(HEAD_THREADS)
    head_rmsnorm_backward_dx_k(float *__restrict__ dqkv, const float *__restrict__ raw, const float *__restrict__ wq,
                               const float *__restrict__ wk, const float *__restrict__ rstd, int H, int heads, int hd,
                               int qkv_dim) {
  __shared__ float red[32];
  const int t = blockIdx.x / heads, h = blockIdx.x % heads;
  float *dy = dqkv + (size_t)t * qkv_dim + (size_t)h * hd;
  const float *x = raw + (size_t)blockIdx.x * hd, *w = h < H ? wq : wk;
  const float r = rstd[blockIdx.x];
  float dot = 0.0f;
  for (int c = threadIdx.x; c < hd; c += blockDim.x) dot += dy[c] * w[c] * x[c];
  dot = block_sum(dot, red);
  const float k = r * r * r * dot / hd;
  for (int c = threadIdx.x; c < hd; c += blockDim.x) dy[c] = r * dy[c] * w[c] - k * x[c];
}

/* partial[chunk][c] = sum over the chunk's rows t and heads h in [h0, h1) of dy x r */
__global__ void head_rmsnorm_dw_k(float *__restrict__ partial, const float *__restrict__ dqkv,
                                  const float *__restrict__ raw, const float *__restrict__ rstd, int T, int h0, int h1,
                                  int heads, int hd, int qkv_dim) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
  if (c >= hd) return;
  const int t1 = min(T, (chunk + 1) * COL_CHUNK);
  float s = 0.0f;
  for (int t = chunk * COL_CHUNK; t < t1; t++)
    for (int h = h0; h < h1; h++) {
      const size_t row = (size_t)t * heads + h;
      s += dqkv[(size_t)t * qkv_dim + (size_t)h * hd + c] * raw[row * hd + c] * rstd[row];
    }
  partial[(size_t)chunk * hd + c] = s;
}

__global__ void rope_cs_k(float *__restrict__ cs, const int32_t *__restrict__ positions, const float *__restrict__ inv_freq,
                          int T, int half, float scale) {
  const int64_t total = (int64_t)T * half;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int j = (int)(idx % half), t = (int)(idx / half);
    const float angle = (float)positions[t] * inv_freq[j];
    cs[(size_t)t * 2 * half + j] = (float)cos((double)angle) * scale;
    cs[(size_t)t * 2 * half + half + j] = (float)sin((double)angle) * scale;
  }
}

__global__ void rope_k(float *__restrict__ qkv, const float *__restrict__ cs, int T, int heads, int half, int hd,
                       int qkv_dim, float sign) {
  const int64_t total = (int64_t)T * heads * half;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int j = (int)(idx % half);
    const int64_t th = idx / half;
    const int h = (int)(th % heads), t = (int)(th / heads);
    float *x = qkv + (size_t)t * qkv_dim + (size_t)h * hd;
    const float c = cs[(size_t)t * hd + j], sn = sign * cs[(size_t)t * hd + half + j];
    const float x1 = x[j], x2 = x[j + half];
    x[j] = x1 * c - x2 * sn;
    x[j + half] = x2 * c + x1 * sn;
  }
}

__device__ __forceinline__ float sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }

__global__ void swiglu_forward_k(float *__restrict__ act, const float *__restrict__ gu, int T, int F) {
  const int64_t total = (int64_t)T * F;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int64_t t = idx / F, c = idx % F;
    const float g = gu[t * 2 * F + c], u = gu[t * 2 * F + F + c];
    act[idx] = g * sigmoid(g) * u;
  }
}

__global__ void swiglu_backward_k(float *__restrict__ dgu, const float *__restrict__ dact,
                                  const float *__restrict__ gu, int T, int F) {
  const int64_t total = (int64_t)T * F;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int64_t t = idx / F, c = idx % F;
    const float g = gu[t * 2 * F + c], u = gu[t * 2 * F + F + c], da = dact[idx];
    const float sg = sigmoid(g), silu = g * sg;
    dgu[t * 2 * F + F + c] = da * silu;
    dgu[t * 2 * F + c] = da * u * sg * (1.0f + g * (1.0f - sg));
  }
}

__global__ void __launch_bounds__(ROW_THREADS)
    logits_stats_k(float *__restrict__ lse, float *__restrict__ entropy, float *__restrict__ logits, int V, float scale) {
  __shared__ float redf[32];
  __shared__ double redd[32];
  const size_t t = blockIdx.x;
  float *z = logits + t * V;
  float max = -INFINITY;
  /* each thread scales the elements it alone reads below */
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    if (scale != 1.0f) z[v] *= scale;
    max = fmaxf(max, z[v]);
  }
  max = block_max(max, redf);
  double sum = 0.0, wsum = 0.0;
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    const double e = exp((double)z[v] - max);
    sum += e;
    wsum += e * ((double)z[v] - max);
  }
  sum = block_sum(sum, redd);
  wsum = block_sum(wsum, redd);
  if (threadIdx.x == 0) {
    const double log_sum = log(sum);
    lse[t] = (float)(max + log_sum);
    entropy[t] = (float)(log_sum - wsum / sum);
  }
}

__global__ void child_logprobs_k(float *__restrict__ logp, float *__restrict__ ent, const float *__restrict__ logits,
                                 const float *__restrict__ lse, const float *__restrict__ entropy,
                                 const int32_t *__restrict__ tokens, const int32_t *__restrict__ parents,
                                 const int32_t *__restrict__ children, int k0, int k1, int s, int V) {
  const int k = k0 + blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= k1) return;
  const int i = children[k], p = parents[i] - s;
  logp[k - k0] = logits[(size_t)p * V + tokens[i]] - lse[p];
  ent[k - k0] = entropy[p];
}

__global__ void __launch_bounds__(ROW_THREADS)
    logits_backward_k(float *__restrict__ logits, const float *__restrict__ lse, const float *__restrict__ coef,
                      const int32_t *__restrict__ child_off, const int32_t *__restrict__ child_token,
                      const float *__restrict__ child_dlogp, int V) {
  const size_t p = blockIdx.x;
  float *dz = logits + p * V;
  const float k = coef[p], l = lse[p];
  for (int v = threadIdx.x; v < V; v += blockDim.x) dz[v] = k == 0.0f ? 0.0f : -k * expf(dz[v] - l);
  __syncthreads();
  if (threadIdx.x == 0)
    for (int c = child_off[p]; c < child_off[p + 1]; c++) dz[child_token[c]] += child_dlogp[c];
}

constexpr int SS_BLOCKS = 1024;

__global__ void __launch_bounds__(256) sum_squares_k(double *__restrict__ partial, const float *__restrict__ x, size_t n) {
  __shared__ double red[32];
  double s = 0.0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    s += (double)x[i] * x[i];
  s = block_sum(s, red);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_in_order_k(double *__restrict__ out, const double *__restrict__ partial, int n) {
  double s = 0.0;
  for (int i = 0; i < n; i++) s += partial[i];
  *out = s;
}

__global__ void adamw_k(float *__restrict__ w, const float *__restrict__ g, float *__restrict__ m,
                        float *__restrict__ v, size_t n, float b1, float b2, float eps, float step_size,
                        float bc2_sqrt, float decay, float grad_scale) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const float gi = g[i] * grad_scale;
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) / bc2_sqrt + eps;
    w[i] = w[i] * decay - step_size * mi / denom;
  }
}

__global__ void axpy_k(float *__restrict__ y, const float *__restrict__ x, size_t n, float scale) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    y[i] += scale * x[i];
}

} // namespace

gyre_status gather_rows(exec_ctx *ctx, float *x, const float *src, const int32_t *rows, int T, int D) {
  if (T <= 0) return GYRE_OK;
  LAUNCH(T, 256, 0, ctx->stream, gather_rows_k)(x, src, rows, D);
  CU_LAUNCHED();
  return GYRE_OK;
}

gyre_status embed_forward(exec_ctx *ctx, float *x, const int32_t *tokens, const float *embed, int T, int D) {
  return gather_rows(ctx, x, embed, tokens, T, D);
}

gyre_status embed_backward(exec_ctx *ctx, float *dembed, const float *dx, const int32_t *token_ids,
                           const int32_t *row_off, const int32_t *rows, int n_ids, int D) {
  if (n_ids <= 0) return GYRE_OK;
  LAUNCH(dim3(n_ids, cdiv(D, 256)), 256, 0, ctx->stream, embed_backward_k)(dembed, dx, token_ids, row_off, rows, D);
  CU_LAUNCHED();
  return GYRE_OK;
}

gyre_status rmsnorm_forward(exec_ctx *ctx, float *out, float *rstd, const float *x, const float *w, int T, int D,
                            float eps) {
  if (T <= 0) return GYRE_OK;
  LAUNCH(T, ROW_THREADS, 0, ctx->stream, rmsnorm_forward_k)(out, rstd, x, w, D, eps);
  CU_LAUNCHED();
  return GYRE_OK;
}

gyre_status rmsnorm_backward(exec_ctx *ctx, float *dx, float *dw, const float *dout, const float *x,
                             const float *w, const float *rstd, int T, int D) {
  if (T <= 0) return GYRE_OK;
  LAUNCH(T, ROW_THREADS, 0, ctx->stream, rmsnorm_backward_dx_k)(dx, dout, x, w, rstd, D);
  CU_LAUNCHED();
  const int chunks = (int)cdiv(T, COL_CHUNK);
  void *scratch;
  GYRE_CHECK(ctx_scratch(ctx, sizeof(float) * (size_t)chunks * D, &scratch));
  float *partial = (float *)scratch;
  LAUNCH(dim3(cdiv(D, 128), chunks), 128, 0, ctx->stream, rmsnorm_backward_dw_k)(partial, dout, x, rstd, T, D);
  CU_LAUNCHED();
  LAUNCH(cdiv(D, 128), 128, 0, ctx->stream, add_column_sums_k)(dw, partial, chunks, D);
  CU_LAUNCHED();
  return GYRE_OK;
}

gyre_status bias_forward(exec_ctx *ctx, float *y, const float *b, int T, int N) {
  if (T <= 0) return GYRE_OK;
  LAUNCH(grid_for((int64_t)T * N), 256, 0, ctx->stream, bias_forward_k)(y, b, (int64_t)T * N, N);
  CU_LAUNCHED();
  return GYRE_OK;
}

gyre_status bias_backward(exec_ctx *ctx, float *db, const float *dy, int T, int N) {
  if (T <= 0) return GYRE_OK;
  const int chunks = (int)cdiv(T, COL_CHUNK);
  void *scratch;
  GYRE_CHECK(ctx_scratch(ctx, sizeof(float) * (size_t)chunks * N, &scratch));
  float *partial = (float *)scratch;
  LAUNCH(dim3(cdiv(N, 128), chunks), 128, 0, ctx->stream, column_sums_k)(partial, dy, T, N);
  CU_LAUNCHED();
  LAUNCH(cdiv(N, 128), 128, 0, ctx->stream, add_column_sums_k)(db, partial, chunks, N);
  CU_LAUNCHED();
  return GYRE_OK;
}

gyre_status head_rmsnorm_forward(exec_ctx *ctx, float *qkv, float *raw, float *rstd, const float *wq, const float *wk,
                                 int T, const dims *d) {
  const int heads = d->H + d->KV;
  if (T <= 0) return GYRE_OK;
  LAUNCH(T * heads, HEAD_THREADS, 0, ctx->stream, head_rmsnorm_forward_k)(qkv, raw, rstd, wq, wk, d->H, heads, d->hd,
                                                                          d->qkv_dim, d->eps);
  CU_LAUNCHED();
  return GYRE_OK;
}

gyre_status head_rmsnorm_backward(exec_ctx *ctx, float *dqkv, float *dwq, float *dwk, const float *raw, const float *wq,
                                  const float *wk, const float *rstd, int T, const dims *d) {
  const int heads = d->H + d->KV, hd = d->hd;
  if (T <= 0) return GYRE_OK;
  /* the weights' gradients first (they read dy), q's then k's, then dx over dy in place */
  const int chunks = (int)cdiv(T, COL_CHUNK);
  void *scratch;
  GYRE_CHECK(ctx_scratch(ctx, sizeof(float) * 2 * (size_t)chunks * hd, &scratch));
  float *partial = (float *)scratch;
  for (int k = 0; k < 2; k++) {
    float *part = partial + (size_t)k * chunks * hd;
    LAUNCH(dim3(cdiv(hd, 64), chunks), 64, 0, ctx->stream, head_rmsnorm_dw_k)(part, dqkv, raw, rstd, T, k == 0 ? 0 : d->H,
                                                                             k == 0 ? d->H : heads, heads, hd, d->qkv_dim);
    CU_LAUNCHED();
    LAUNCH(cdiv(hd, 64), 64, 0, ctx->stream, add_column_sums_k)(k == 0 ? dwq : dwk, part, chunks, hd);
    CU_LAUNCHED();
  }
  LAUNCH(T * heads, HEAD_THREADS, 0, ctx->stream, head_rmsnorm_backward_dx_k)(dqkv, raw, wq, wk, rstd, d->H, heads, hd,
                                                                              d->qkv_dim);
  CU_LAUNCHED();
  return GYRE_OK;
}

gyre_status rope_cs(exec_ctx *ctx, float *cs, const int32_t *positions, int T, const float *inv_freq, int hd,
                    float scale) {
  if (T <= 0) return GYRE_OK;
  LAUNCH(grid_for((int64_t)T * (hd / 2)), 256, 0, ctx->stream, rope_cs_k)(cs, positions, inv_freq, T, hd / 2, scale);
  CU_LAUNCHED();
  return GYRE_OK;
}

gyre_status rope(exec_ctx *ctx, float *qkv, const float *cs, int T, const dims *d, int inverse) {
  const int heads = d->H + d->KV, half = d->hd / 2; /* q heads then k heads, contiguous */
  if (T <= 0) return GYRE_OK;
  LAUNCH(grid_for((int64_t)T * heads * half), 256, 0, ctx->stream, rope_k)(qkv, cs, T, heads, half, d->hd, d->qkv_dim,
                                                                          inverse ? -1.0f : 1.0f);
  CU_LAUNCHED();
  return GYRE_OK;
}

gyre_status swiglu_forward(exec_ctx *ctx, float *act, const float *gu, int T, int F) {
  if (T <= 0) return GYRE_OK;
  LAUNCH(grid_for((int64_t)T * F), 256, 0, ctx->stream, swiglu_forward_k)(act, gu, T, F);
  CU_LAUNCHED();
  return GYRE_OK;
}

gyre_status swiglu_backward(exec_ctx *ctx, float *dgu, const float *dact, const float *gu, int T, int F) {
  if (T <= 0) return GYRE_OK;
  LAUNCH(grid_for((int64_t)T * F), 256, 0, ctx->stream, swiglu_backward_k)(dgu, dact, gu, T, F);
  CU_LAUNCHED();
  return GYRE_OK;
}

gyre_status logits_stats(exec_ctx *ctx, float *lse, float *entropy, float *logits, int T, int V, float scale) {
  if (T <= 0) return GYRE_OK;
  LAUNCH(T, ROW_THREADS, 0, ctx->stream, logits_stats_k)(lse, entropy, logits, V, scale);
  CU_LAUNCHED();
  return GYRE_OK;
}

gyre_status child_logprobs(exec_ctx *ctx, float *logp, float *ent, const float *logits, const float *lse,
                           const float *entropy, const int32_t *tokens, const int32_t *parents, const int32_t *children,
                           int k0, int k1, int s, int V) {
  if (k1 <= k0) return GYRE_OK;
  LAUNCH(cdiv(k1 - k0, 256), 256, 0, ctx->stream, child_logprobs_k)(logp, ent, logits, lse, entropy, tokens, parents,
                                                                    children, k0, k1, s, V);
  CU_LAUNCHED();
  return GYRE_OK;
}

gyre_status logits_backward(exec_ctx *ctx, float *logits, const float *lse, const float *coef,
                            const int32_t *child_off, const int32_t *child_token, const float *child_dlogp, int T,
                            int V) {
  if (T <= 0) return GYRE_OK;
  LAUNCH(T, ROW_THREADS, 0, ctx->stream, logits_backward_k)(logits, lse, coef, child_off, child_token, child_dlogp, V);
  CU_LAUNCHED();
  return GYRE_OK;
}

gyre_status sum_squares(exec_ctx *ctx, const float *x, size_t n, double *out_host) {
  const int blocks = (int)(grid_for((int64_t)n) < SS_BLOCKS ? grid_for((int64_t)n) : SS_BLOCKS);
  void *scratch;
  GYRE_CHECK(ctx_scratch(ctx, sizeof(double) * (blocks + 1), &scratch));
  double *partial = (double *)scratch, *total = partial + blocks;
  LAUNCH(blocks, 256, 0, ctx->stream, sum_squares_k)(partial, x, n);
  CU_LAUNCHED();
  LAUNCH(1, 1, 0, ctx->stream, sum_in_order_k)(total, partial, blocks);
  CU_LAUNCHED();
  CU(cudaMemcpyAsync(out_host, total, sizeof(double), cudaMemcpyDeviceToHost, ctx->stream));
  return ctx_sync(ctx);
}

gyre_status adamw(exec_ctx *ctx, float *w, const float *g, float *m, float *v, size_t n, const gyre_adamw *opt,
                  int64_t step, float grad_scale) {
  /* the CPU backend's scalars, computed the same way */
  const float b1 = opt->beta1, b2 = opt->beta2;
  const double bc1 = 1.0 - pow(b1, (double)step), bc2 = 1.0 - pow(b2, (double)step);
  const float step_size = (float)(opt->lr / bc1), bc2_sqrt = (float)sqrt(bc2);
  const float decay = 1.0f - opt->lr * opt->weight_decay;
  LAUNCH(grid_for((int64_t)n), 256, 0, ctx->stream, adamw_k)(w, g, m, v, n, b1, b2, opt->eps, step_size, bc2_sqrt,
                                                            decay, grad_scale);
  CU_LAUNCHED();
  return GYRE_OK;
}

gyre_status axpy(exec_ctx *ctx, float *y, const float *x, size_t n, float scale) {
  LAUNCH(grid_for((int64_t)n), 256, 0, ctx->stream, axpy_k)(y, x, n, scale);
  CU_LAUNCHED();
  return GYRE_OK;
}
