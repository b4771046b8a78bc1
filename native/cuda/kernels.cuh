/*
 * kernels.cuh - the CUDA layers other than matmul and attention, as forward/backward pairs
 * (the device twins of src/cpu/kernels.h, same arithmetic per element). Shapes: T tokens
 * (rows), D hidden, F intermediate, V vocab. All pointers are device memory unless named
 * *_host; every function queues kernels on ctx's stream. Backward functions ADD into their
 * gradient outputs unless said otherwise.
 */
#ifndef GYRE_CUDA_KERNELS_CUH
#define GYRE_CUDA_KERNELS_CUH

#include "cuda_common.cuh"

/* x[T,D] = embed[tokens[t], :] */
gyre_status embed_forward(exec_ctx *ctx, float *x, const int32_t *tokens, const float *embed, int T, int D);
/* dembed[token_ids[u], :] += sum of dx[rows[k], :] for k in [row_off[u], row_off[u+1]), rows
 * ascending: the rows holding each distinct token id (host-sorted), so the sum is ordered. */
gyre_status embed_backward(exec_ctx *ctx, float *dembed, const float *dx, const int32_t *token_ids,
                           const int32_t *row_off, const int32_t *rows, int n_ids, int D);

/* x[T,D] = src[rows[t], :] */
gyre_status gather_rows(exec_ctx *ctx, float *x, const float *src, const int32_t *rows, int T, int D);

/* out[T,D] = x * rstd * w, rstd[t] = 1 / sqrt(mean(x[t]^2) + eps); rstd may be NULL */
gyre_status rmsnorm_forward(exec_ctx *ctx, float *out, float *rstd, const float *x, const float *w, int T, int D,
                            float eps);
/* dx[T,D] += d/dx, dw[D] += d/dw of rmsnorm given dout[T,D] */
gyre_status rmsnorm_backward(exec_ctx *ctx, float *dx, float *dw, const float *dout, const float *x,
                             const float *w, const float *rstd, int T, int D);

/* y[T,N] += b[N] on every row */
gyre_status bias_forward(exec_ctx *ctx, float *y, const float *b, int T, int N);
/* db[N] += sum over rows of dy[T,N] (fixed row chunks, added in order) */
gyre_status bias_backward(exec_ctx *ctx, float *db, const float *dy, int T, int N);

/* Qwen3's per-head RMSNorm, in place on the q and k heads of qkv[T, qkv_dim] (wq [hd] for q
 * heads, wk [hd] for k heads); raw [T, q_dim + kv_dim] and rstd [T, H + KV] may be NULL. */
gyre_status head_rmsnorm_forward(exec_ctx *ctx, float *qkv, float *raw, float *rstd, const float *wq, const float *wk,
                                 int T, const dims *d);
/* Its backward, in place: the q and k heads of dqkv from d(normed) to d(raw); dwq, dwk [hd] +=. */
gyre_status head_rmsnorm_backward(exec_ctx *ctx, float *dqkv, float *dwq, float *dwk, const float *raw, const float *wq,
                                  const float *wk, const float *rstd, int T, const dims *d);

/* cs[T, hd] = cos | sin of the angles positions[t] * inv_freq[j] (inv_freq [hd/2]) times scale:
 * the product in F32, cos and sin in double rounded to F32, as rope_rows (internal.h) on the host. */
gyre_status rope_cs(exec_ctx *ctx, float *cs, const int32_t *positions, int T, const float *inv_freq, int hd,
                    float scale);
/* Rotate-half RoPE in place on the q and k heads of qkv[T, qkv_dim] by the rows' cs[T, hd]
 * (rope_cs); inverse rotates back (the backward of the rotation). */
gyre_status rope(exec_ctx *ctx, float *qkv, const float *cs, int T, const dims *d, int inverse);

/* act[T,F] = silu(gu[:, :F]) * gu[:, F:]   (gu = gate | up, [T, 2F]) */
gyre_status swiglu_forward(exec_ctx *ctx, float *act, const float *gu, int T, int F);
/* dgu[T,2F] = d/dgu given dact[T,F] (overwrites) */
gyre_status swiglu_backward(exec_ctx *ctx, float *dgu, const float *dact, const float *gu, int T, int F);

/* Per row of logits[T,V]: lse[t] = logsumexp, entropy[t] of the softmax (double sums). */
gyre_status logits_stats(exec_ctx *ctx, float *lse, float *entropy, float *logits, int T, int V, float scale);
/* The log-probs of the children of rows [s, s + T) of logits[T,V]: for the forest's child
 * slots k in [k0, k1) (struct forest's children, grouped by parent), child i = children[k] of
 * row p = parents[i] - s: logp[k - k0] = logits[p, tokens[i]] - lse[p], ent[k - k0] = entropy[p]. */
gyre_status child_logprobs(exec_ctx *ctx, float *logp, float *ent, const float *logits, const float *lse,
                           const float *entropy, const int32_t *tokens, const int32_t *parents, const int32_t *children,
                           int k0, int k1, int s, int V);
/* In place, logits[T,V] -> dlogits: row p = -coef[p] softmax_p (0 when coef[p] == 0), then
 * + dlogp_k at column child_token[k] for k in [child_off[p], child_off[p+1]) in order.
 * coef[p] is the sum of its children's dlogp (host-computed, in index order). */
gyre_status logits_backward(exec_ctx *ctx, float *logits, const float *lse, const float *coef,
                            const int32_t *child_off, const int32_t *child_token, const float *child_dlogp, int T,
                            int V);

/* *out_host = sum of x[n]^2 in double, in a fixed order for a given n and device. */
gyre_status sum_squares(exec_ctx *ctx, const float *x, size_t n, double *out_host);
/* AdamW step (torch.optim.AdamW) on w[n] with gradient g[n] * grad_scale. */
gyre_status adamw(exec_ctx *ctx, float *w, const float *g, float *m, float *v, size_t n, const gyre_adamw *opt,
                  int64_t step, float grad_scale);
/* y[n] += scale * x[n] */
gyre_status axpy(exec_ctx *ctx, float *y, const float *x, size_t n, float scale);

#endif
