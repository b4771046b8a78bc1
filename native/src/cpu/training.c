/* training.c - the CPU trainer: forward and backward over a packed forest, gradients, AdamW.
 *
 * All activations for max_tokens rows are one allocation made at creation (llm.c style):
 * the layout every backend shares (train_acts of activations.h: residual streams, each
 * layer's saved tensors, the final norm and logits, the backward's gradients), then this
 * backend's scratch. The backward mirrors layer_forward step by step.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "gemm.h"
#include "kernels.h"
#include "transformer.h"

struct be_trainer {
  be_model *m;
  int Tm;            /* max_tokens */
  int T;             /* rows of the last forward (0: none) */
  float *grads, *adam_m, *adam_v;
  float *arena;      /* every activation below lives here */
  train_acts acts;   /* the shared layout (activations.h) */
  float *dlogits, *coef, *kt, *vt;
  float *scratch;    /* attention, per thread scratch_floats */
  size_t scratch_floats;
  int scratch_threads;
  int32_t *tiles;    /* attention tiles, 2 * Tm + 2 */
};

/* Lays out (or, with base NULL, measures) the arena: the shared activations, then this
 * backend's logits gradient, loss coefficients and transposed K/V for attention. */
static size_t lay_out(be_trainer *t, float *base) {
  const dims *d = &t->m->d;
  size_t T = (size_t)t->Tm, at = 0;
  train_acts_lay_out(&t->acts, d, T, base, &at);
  t->dlogits = arena_carve(base, &at, T * d->V);
  t->coef = arena_carve(base, &at, T);
  t->kt = arena_carve(base, &at, forest_transposed_floats(d, t->Tm));
  t->vt = arena_carve(base, &at, forest_transposed_floats(d, t->Tm));
  return at;
}

gyre_status be_trainer_create(be_model *m, int32_t max_tokens, be_trainer **out) {
  GYRE_CHECK(be_model_widen(m)); /* training needs F32 master weights */
  be_trainer *t = calloc(1, sizeof *t);
  if (t == NULL) return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "cpu: out of host memory");
  t->m = m;
  t->Tm = max_tokens;
  t->acts.io = calloc((size_t)m->d.L, sizeof(layer_io));
  size_t n = (size_t)m->lay->n_params, arena = t->acts.io ? lay_out(t, NULL) : 0;
  t->grads = aligned_calloc(sizeof(float) * n);
  t->adam_m = aligned_calloc(sizeof(float) * n);
  t->adam_v = aligned_calloc(sizeof(float) * n);
  t->arena = t->acts.io ? aligned_calloc(sizeof(float) * arena) : NULL;
  t->tiles = malloc(sizeof(int32_t) * (2 * (size_t)max_tokens + 2));
  if (t->tiles == NULL || t->acts.io == NULL || t->grads == NULL || t->adam_m == NULL || t->adam_v == NULL || t->arena == NULL) {
    be_trainer_free(t);
    return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "cpu: cannot allocate %zu MB of training activations for %d tokens",
                     arena * sizeof(float) >> 20, max_tokens);
  }
  lay_out(t, t->arena);
  *out = t;
  return GYRE_OK;
}

void be_trainer_free(be_trainer *t) {
  if (t == NULL) return;
  free(t->acts.io);
  free(t->grads);
  free(t->adam_m);
  free(t->adam_v);
  free(t->arena);
  free(t->scratch);
  free(t->tiles);
  free(t);
}

static gyre_status ensure_scratch(be_trainer *t) {
  int threads = cpu_threads();
  if (threads <= t->scratch_threads) return GYRE_OK;
  free(t->scratch);
  t->scratch_floats = attention_grad_scratch_floats(&t->m->d, t->Tm);
  t->scratch = aligned_calloc(sizeof(float) * t->scratch_floats * threads);
  t->scratch_threads = t->scratch ? threads : 0;
  return t->scratch ? GYRE_OK : gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "cpu: out of host memory for attention scratch");
}

typedef struct forest_ctx {
  be_trainer *t;
  const train_batch *b;
} forest_ctx;

static void attend_forest(void *ctx, int layer, const layer_io *io) {
  forest_ctx *fc = ctx;
  (void)layer;
  forest_attention_forward(io->att, io->lse, io->qkv, fc->t->kt, fc->b->forest, fc->b->n, &fc->t->m->d, fc->t->scratch,
                           fc->t->scratch_floats, fc->t->tiles);
}

gyre_status be_train_forward(be_trainer *t, const train_batch *b, float *logp_host, float *entropy_host) {
  const train_acts *acts = &t->acts;
  const be_model *m = t->m;
  const dims *d = &m->d;
  int T = b->n;
  GYRE_CHECK(ensure_scratch(t));
  forest_ctx ctx = {t, b};
  embed_forward(acts->io[0].x_in, b->tokens, m->w + m->lay->embed, T, d->D);
  for (int l = 0; l < d->L; l++) layer_forward(m, l, T, b->positions, &acts->io[l], attend_forest, &ctx);
  rmsnorm_forward(acts->hf, acts->rstdf, acts->x_final, m->w + m->lay->norm_f, T, d->D, d->eps);
  gemm(T, d->V, d->D, acts->hf, d->D, 0, m->w + m->lay->lm_head, d->D, 1, acts->logits, d->V, 0);
  logits_stats(acts->lse_rows, acts->entropy_rows, acts->logits, T, d->V);
  for (int i = 0; i < T; i++) {
    int p = b->parents[i];
    logp_host[i] = p < 0 ? NAN : acts->logits[(size_t)p * d->V + b->tokens[i]] - acts->lse_rows[p];
    entropy_host[i] = p < 0 ? NAN : acts->entropy_rows[p];
  }
  t->T = T;
  return GYRE_OK;
}

gyre_status be_train_backward(be_trainer *t, const train_batch *b, const float *dlogp_host) {
  const train_acts *acts = &t->acts;
  const be_model *m = t->m;
  const dims *d = &m->d;
  const float *w = m->w;
  float *g = t->grads;
  int T = b->n, D = d->D, F = d->F;
  if (t->T != T) return gyre_fail(GYRE_ERR_STATE, "cpu: backward of a batch that was not the last forward");
  logits_backward(t->dlogits, acts->logits, acts->lse_rows, b->tokens, b->parents, dlogp_host, T, d->V, t->coef);
  gemm(d->V, D, T, t->dlogits, d->V, 1, acts->hf, D, 0, g + m->lay->lm_head, D, 1);
  gemm(T, D, d->V, t->dlogits, d->V, 0, w + m->lay->lm_head, D, 0, acts->dh, D, 0);
  memset(acts->dres, 0, sizeof(float) * (size_t)T * D);
  rmsnorm_backward(acts->dres, g + m->lay->norm_f, acts->dh, acts->x_final, w + m->lay->norm_f, acts->rstdf, T, D);
  for (int l = d->L - 1; l >= 0; l--) {
    const layer_io *io = &acts->io[l];
    const layer_offsets *o = &m->lay->layers[l];
    /* x_out = x_mid + act . Wdown^T */
    gemm(D, F, T, acts->dres, D, 1, io->act, F, 0, g + o->wdown, F, 1);
    gemm(T, F, D, acts->dres, D, 0, w + o->wdown, F, 0, acts->dact, F, 0);
    swiglu_backward(acts->dgu, acts->dact, io->gu, T, F);
    gemm(2 * F, D, T, acts->dgu, 2 * F, 1, io->h2, D, 0, g + o->wgu, D, 1);
    gemm(T, D, 2 * F, acts->dgu, 2 * F, 0, w + o->wgu, D, 0, acts->dh, D, 0);
    rmsnorm_backward(acts->dres, g + o->ln_post, acts->dh, io->x_mid, w + o->ln_post, io->rstd2, T, D);
    /* x_mid = x_in + att . Wo^T */
    gemm(D, d->q_dim, T, acts->dres, D, 1, io->att, d->q_dim, 0, g + o->wo, d->q_dim, 1);
    gemm(T, d->q_dim, D, acts->dres, D, 0, w + o->wo, d->q_dim, 0, acts->datt, d->q_dim, 0);
    forest_attention_backward(acts->dqkv, acts->datt, io->qkv, io->att, io->lse, t->kt, t->vt, acts->dsum, b->forest, T, d,
                              t->scratch, t->scratch_floats, t->tiles);
    rope(acts->dqkv, b->positions, m->rope_cos, m->rope_sin, T, d, 1);
    if (o->qnorm >= 0)
      head_rmsnorm_backward(acts->dqkv, g + o->qnorm, g + o->knorm, io->qk_raw, w + o->qnorm, w + o->knorm, io->qk_rstd, T, d);
    if (o->bqkv >= 0) bias_backward(g + o->bqkv, acts->dqkv, T, d->qkv_dim);
    gemm(d->qkv_dim, D, T, acts->dqkv, d->qkv_dim, 1, io->h1, D, 0, g + o->wqkv, D, 1);
    gemm(T, D, d->qkv_dim, acts->dqkv, d->qkv_dim, 0, w + o->wqkv, D, 0, acts->dh, D, 0);
    rmsnorm_backward(acts->dres, g + o->ln_in, acts->dh, io->x_in, w + o->ln_in, io->rstd1, T, D);
  }
  embed_backward(g + m->lay->embed, acts->dres, b->tokens, T, D);
  return GYRE_OK;
}

gyre_status be_grads_zero(be_trainer *t) {
  memset(t->grads, 0, sizeof(float) * (size_t)t->m->lay->n_params);
  return GYRE_OK;
}

gyre_status be_grads_get(const be_trainer *t, float *host) {
  memcpy(host, t->grads, sizeof(float) * (size_t)t->m->lay->n_params);
  return GYRE_OK;
}

gyre_status be_grads_set(be_trainer *t, const float *host) {
  memcpy(t->grads, host, sizeof(float) * (size_t)t->m->lay->n_params);
  return GYRE_OK;
}

gyre_status be_grads_add(be_trainer *t, const float *host, float scale) {
  size_t n = (size_t)t->m->lay->n_params;
  float *g = t->grads;
#pragma omp parallel for num_threads(cpu_threads()) schedule(static)
  for (size_t i = 0; i < n; i++) g[i] += scale * host[i];
  return GYRE_OK;
}

gyre_status be_adamw_step(be_trainer *t, const gyre_adamw *opt, int64_t step, float *grad_norm) {
  size_t n = (size_t)t->m->lay->n_params;
  double norm = sqrt(sum_squares(t->grads, n));
  double coef = opt->max_grad_norm > 0.0f ? opt->max_grad_norm / (norm + 1e-6) : 1.0;
  float scale = coef < 1.0 ? (float)coef : 1.0f;
  adamw(t->m->w, t->grads, t->adam_m, t->adam_v, n, opt, step, scale);
  *grad_norm = (float)norm;
  return GYRE_OK;
}

gyre_status be_moments_get(const be_trainer *t, float *m_host, float *v_host) {
  size_t n = (size_t)t->m->lay->n_params;
  memcpy(m_host, t->adam_m, sizeof(float) * n);
  memcpy(v_host, t->adam_v, sizeof(float) * n);
  return GYRE_OK;
}

gyre_status be_moments_set(be_trainer *t, const float *m_host, const float *v_host) {
  size_t n = (size_t)t->m->lay->n_params;
  memcpy(t->adam_m, m_host, sizeof(float) * n);
  memcpy(t->adam_v, v_host, sizeof(float) * n);
  return GYRE_OK;
}
