/* kernels.h - the CPU layers other than matmul and attention, as forward/backward pairs.
 * Shapes: T tokens (rows), D hidden, F intermediate, V vocab. Backward functions ADD into
 * their gradient outputs (dx +=, dw +=) unless said otherwise. */
#ifndef GYRE_CPU_KERNELS_H
#define GYRE_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "../internal.h"

/* x[T,D] = embed[tokens[t], :] */
void embed_forward(float *x, const int32_t *tokens, const float *embed, int T, int D);
/* dembed[tokens[t], :] += dx[t, :] (in token order: deterministic) */
void embed_backward(float *dembed, const float *dx, const int32_t *tokens, int T, int D);

/* out[T,D] = x * rstd * w, rstd[t] = 1 / sqrt(mean(x[t]^2) + eps); rstd may be NULL */
void rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int T, int D, float eps);
/* dx[T,D] += d/dx, dw[D] += d/dw of rmsnorm given dout[T,D] */
void rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                      const float *rstd, int T, int D);

/* y[T,N] += b[N] on every row */
void bias_forward(float *y, const float *b, int T, int N);
/* db[N] += sum over rows of dy[T,N] (rows in order) */
void bias_backward(float *db, const float *dy, int T, int N);

/* Qwen3's per-head RMSNorm, in place on the q and k heads of qkv[T, qkv_dim]: each head's hd
 * values x -> x r w, r = (mean(x^2) + eps)^-1/2, w = wq [hd] for q heads, wk [hd] for k heads.
 * raw (may be NULL) keeps the values before, [T, q_dim + kv_dim]; rstd (may be NULL) r, [T, H + KV]. */
void head_rmsnorm_forward(float *qkv, float *raw, float *rstd, const float *wq, const float *wk, int T,
                          const dims *d);
/* Its backward, in place: the q and k heads of dqkv from d(normed) to d(raw); dwq, dwk [hd] +=. */
void head_rmsnorm_backward(float *dqkv, float *dwq, float *dwk, const float *raw, const float *wq, const float *wk,
                           const float *rstd, int T, const dims *d);

/* cs[T, hd] = cos | sin of each row's angles times scale (rope_rows of internal.h), rows in
 * parallel. */
void rope_cs(float *cs, const int32_t *positions, int T, const float *inv_freq, int hd, float scale);
/* Rotate-half RoPE in place on the q and k parts of qkv[T, qkv_dim] by the rows' cos | sin
 * cs[T, hd]; inverse rotates back (the backward of the rotation). */
void rope(float *qkv, const float *cs, int T, const dims *d, int inverse);

/* act[T,F] = silu(gu[:, :F]) * gu[:, F:]   (gu = gate | up, [T, 2F]) */
void swiglu_forward(float *act, const float *gu, int T, int F);
/* dgu[T,2F] = d/dgu given dact[T,F] (overwrites) */
void swiglu_backward(float *dgu, const float *dact, const float *gu, int T, int F);

/* Per row of logits[T,V]: lse[t] = logsumexp, entropy[t] of the softmax. */
void logits_stats(float *lse, float *entropy, float *logits, int T, int V, float scale);
/* dlogits[T,V] (overwrites) of the rows s .. s + T - 1 of a batch, for a loss L = sum_i
 * L_i(logp_i), logp_i = log softmax(logits[parent of i])[tokens[i]], given dlogp[i] =
 * dL_i/dlogp_i (0 where untrained) and the children of each row (child_off, children: the
 * batch's forest). coef: scratch [T]. */
void logits_backward(float *dlogits, const float *logits, const float *lse, int T, int s, const int32_t *child_off,
                     const int32_t *children, const int32_t *tokens, const float *dlogp, int V, float *coef);

/* Sum of squares of x[n] in double, in fixed chunks (same result for any thread count). */
double sum_squares(const float *x, size_t n);
/* AdamW step (torch.optim.AdamW) on w[n] with gradient g[n] * grad_scale. */
void adamw(float *w, const float *g, float *m, float *v, size_t n, const gyre_adamw *opt,
           int64_t step, float grad_scale);

#endif
