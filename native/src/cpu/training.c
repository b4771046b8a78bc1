/* training.c - the CPU trainer: forward and backward over a packed forest in chunks,
 * gradients, AdamW.
 *
 * The activations of max_tokens rows are one allocation made at creation (llm.c style): the
 * layout every backend shares (train_acts of activations.h: residual streams, each layer's
 * saved tensors, the final norm and logits, the backward's gradients), then this backend's
 * logits gradient and loss coefficients. A batch's K/V store (forest_kv of attention.h:
 * every layer's K and V of every token) exists for max_tokens tokens from creation; a
 * longer batch gets its own for its length, with the gradients carried back to earlier
 * chunks' tokens and every layer's attention output and log-sum-exp of every token (so the
 * backward's recomputed forward of a chunk reuses them instead of attending again: each
 * chunk's attention forward runs once, as in an unchunked pass), released when the batch is
 * done. The backward mirrors layer_forward step by step, chunk by chunk from the last
 * (backend.h).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "gemm.h"
#include "kernels.h"
#include "transformer.h"

/* A K/V store for up to cap tokens: L layers of forest_kv in one allocation, and the key
 * chunk list of the attention backward. */
typedef struct batch_kv {
  int cap;
  size_t bytes;
  float *base;
  forest_kv *layers;
  float **saved;    /* per layer: [cap][q_dim] attention outputs, then [cap][H] their lse (carried only) */
  int32_t *kchunks; /* cap / 16 + 1 */
} batch_kv;

struct be_trainer {
  be_model *m;
  int Tm;            /* max_tokens */
  int live_s, live_e;/* the chunk whose activations the arena holds (live_e == 0: none) */
  float *grads, *adam_m, *adam_v;
  float *arena;      /* every activation below lives here */
  size_t arena_floats;
  train_acts acts;   /* the shared layout (activations.h) */
  float *dlogits, *coef;
  float *scratch;    /* attention, per thread scratch_floats */
  size_t scratch_floats;
  int scratch_threads;
  int32_t *tiles;    /* forest_tile_ints(Tm) */
  batch_kv fixed;    /* max_tokens tokens, no carried gradients */
  batch_kv batch;    /* a longer batch's, while it trains */
  batch_kv *store;   /* the current batch's: fixed or batch */
};

/* Floats of one layer's store for cap tokens: K | V rows, K and V columns, and with
 * `carried` the gradients sent back and the attention outputs saved. */
static size_t store_layer_floats(const dims *d, int cap, int carried) {
  size_t rows = (size_t)cap * 2 * d->kv_dim;
  return rows + 2 * forest_transposed_floats(d, cap) + (carried ? rows + (size_t)cap * (d->q_dim + d->H) : 0);
}

static void store_free(batch_kv *st) {
  free(st->base);
  free(st->layers);
  free(st->saved);
  free(st->kchunks);
  memset(st, 0, sizeof *st);
}

static gyre_status store_alloc(batch_kv *st, const dims *d, int cap, int carried) {
  size_t per_layer = store_layer_floats(d, cap, carried), rows = (size_t)cap * 2 * d->kv_dim;
  size_t cols = forest_transposed_floats(d, cap);
  st->cap = cap;
  st->bytes = sizeof(float) * per_layer * d->L + sizeof(int32_t) * ((size_t)cap / 16 + 1);
  st->base = aligned_calloc(sizeof(float) * per_layer * d->L);
  st->layers = calloc((size_t)d->L, sizeof(forest_kv));
  st->saved = calloc((size_t)d->L, sizeof(float *));
  st->kchunks = malloc(sizeof(int32_t) * ((size_t)cap / 16 + 1));
  if (st->base == NULL || st->layers == NULL || st->saved == NULL || st->kchunks == NULL) {
    store_free(st);
    return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "cpu: cannot allocate %zu MB of K/V store for %d tokens",
                     sizeof(float) * per_layer * d->L >> 20, cap);
  }
  for (int l = 0; l < d->L; l++) {
    float *at = st->base + (size_t)l * per_layer;
    st->layers[l] = (forest_kv){at, at + rows, at + rows + cols, carried ? at + rows + 2 * cols : NULL, forest_ld(cap)};
    st->saved[l] = carried ? at + 2 * rows + 2 * cols : NULL;
  }
  return GYRE_OK;
}

/* Lays out (or, with base NULL, measures) the arena: the shared activations, then this
 * backend's logits gradient and loss coefficients. */
static size_t lay_out(be_trainer *t, float *base) {
  const dims *d = &t->m->d;
  size_t T = (size_t)t->Tm, at = 0;
  train_acts_lay_out(&t->acts, d, T, base, &at);
  t->dlogits = arena_carve(base, &at, T * d->V);
  t->coef = arena_carve(base, &at, T);
  return at;
}

gyre_status be_trainer_create(be_model *m, int32_t max_tokens, be_trainer **out) {
  GYRE_CHECK(be_model_widen(m)); /* training needs F32 master weights */
  be_trainer *t = calloc(1, sizeof *t);
  if (t == NULL) return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "cpu: out of host memory");
  t->m = m;
  t->Tm = max_tokens;
  t->acts.io = calloc((size_t)m->d.L, sizeof(layer_io));
  size_t n = (size_t)m->lay->n_params;
  t->arena_floats = t->acts.io ? lay_out(t, NULL) : 0;
  t->grads = aligned_calloc(sizeof(float) * n);
  t->adam_m = aligned_calloc(sizeof(float) * n);
  t->adam_v = aligned_calloc(sizeof(float) * n);
  t->arena = t->acts.io ? aligned_calloc(sizeof(float) * t->arena_floats) : NULL;
  t->tiles = malloc(sizeof(int32_t) * forest_tile_ints(max_tokens));
  if (t->tiles == NULL || t->acts.io == NULL || t->grads == NULL || t->adam_m == NULL || t->adam_v == NULL || t->arena == NULL) {
    be_trainer_free(t);
    return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "cpu: cannot allocate %zu MB of training activations for %d tokens",
                     t->arena_floats * sizeof(float) >> 20, max_tokens);
  }
  gyre_status st = store_alloc(&t->fixed, &m->d, max_tokens, 0);
  if (st != GYRE_OK) {
    be_trainer_free(t);
    return st;
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
  store_free(&t->fixed);
  store_free(&t->batch);
  free(t);
}

void be_trainer_memory(const be_trainer *t, int64_t *fixed, int64_t *kv_per_token, int64_t *last_batch) {
  const dims *d = &t->m->d;
  *fixed = (int64_t)(sizeof(float) * (t->arena_floats + 3 * (size_t)t->m->lay->n_params) +
                     sizeof(int32_t) * forest_tile_ints(t->Tm) + t->fixed.bytes);
  *kv_per_token = (int64_t)(sizeof(float) * (6 * (size_t)d->kv_dim + d->q_dim + d->H) * d->L);
  *last_batch = (int64_t)t->batch.bytes;
}

/* Per-thread attention scratch for the batch's forest (grown, never shrunk). */
static gyre_status ensure_scratch(be_trainer *t, const forest *f) {
  int threads = cpu_threads();
  size_t need = forest_scratch_floats(&t->m->d, f);
  if (threads <= t->scratch_threads && need <= t->scratch_floats) return GYRE_OK;
  free(t->scratch);
  t->scratch_floats = need > t->scratch_floats ? need : t->scratch_floats;
  t->scratch_threads = threads > t->scratch_threads ? threads : t->scratch_threads;
  t->scratch = aligned_calloc(sizeof(float) * t->scratch_floats * t->scratch_threads);
  if (t->scratch == NULL) t->scratch_threads = 0, t->scratch_floats = 0;
  return t->scratch ? GYRE_OK : gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "cpu: out of host memory for attention scratch");
}

gyre_status be_train_begin(be_trainer *t, const train_batch *b) {
  t->live_e = 0;
  store_free(&t->batch);
  t->store = &t->fixed;
  if (b->n > t->Tm) {
    GYRE_CHECK(store_alloc(&t->batch, &t->m->d, b->n, 1));
    t->store = &t->batch;
  }
  return ensure_scratch(t, b->forest);
}

void be_train_end(be_trainer *t) {
  if (t->store == &t->batch) {
    size_t bytes = t->batch.bytes;
    store_free(&t->batch);
    t->batch.bytes = bytes; /* reported by be_trainer_memory */
  }
  t->store = &t->fixed;
}

typedef struct chunk_ctx {
  be_trainer *t;
  const train_batch *b;
  int s, e;
  int again; /* the backward's recomputed forward: the chunk's K/V and attention outputs are stored */
} chunk_ctx;

static void attend_forest(void *ctx, int layer, const layer_io *io) {
  chunk_ctx *c = ctx;
  const dims *d = &c->t->m->d;
  const batch_kv *st = c->t->store;
  const forest_kv *kv = &st->layers[layer];
  float *att = st->saved[layer], *lse = att != NULL ? att + (size_t)st->cap * d->q_dim : NULL;
  size_t T = (size_t)(c->e - c->s);
  if (c->again && att != NULL) {
    memcpy(io->att, att + (size_t)c->s * d->q_dim, sizeof(float) * T * d->q_dim);
    memcpy(io->lse, lse + (size_t)c->s * d->H, sizeof(float) * T * d->H);
    return;
  }
  forest_kv_put(kv, io->qkv, c->s, c->e, d);
  forest_attention_forward(io->att, io->lse, io->qkv, kv, c->b->forest, c->s, c->e, d, c->t->scratch, c->t->scratch_floats,
                           c->t->tiles);
  if (att == NULL) return;
  memcpy(att + (size_t)c->s * d->q_dim, io->att, sizeof(float) * T * d->q_dim);
  memcpy(lse + (size_t)c->s * d->H, io->lse, sizeof(float) * T * d->H);
}

/* The forward of the chunk [s, e) (again: the backward's recomputation, see chunk_ctx). */
static void chunk_forward(be_trainer *t, const train_batch *b, int32_t s, int32_t e, int again, float *logp_host,
                          float *entropy_host) {
  const train_acts *acts = &t->acts;
  const be_model *m = t->m;
  const dims *d = &m->d;
  const forest *f = b->forest;
  int T = e - s;
  chunk_ctx ctx = {t, b, s, e, again};
  embed_forward(acts->io[0].x_in, b->tokens + s, m->w + m->lay->embed, T, d->D);
  rope_cs(acts->rope_cs, b->positions + s, T, m->inv_freq, d->hd, m->rope_scale);
  for (int l = 0; l < d->L; l++) layer_forward(m, l, T, acts->rope_cs, &acts->io[l], attend_forest, &ctx);
  rmsnorm_forward(acts->hf, acts->rstdf, acts->x_final, m->w + m->lay->norm_f, T, d->D, d->eps);
  gemm(T, d->V, d->D, acts->hf, d->D, 0, m->w + m->lay->lm_head, d->D, 1, acts->logits, d->V, 0);
  logits_stats(acts->lse_rows, acts->entropy_rows, acts->logits, T, d->V, b->inv_temperature);
  for (int p = s; logp_host != NULL && p < e; p++)
    for (int k = f->child_off[p]; k < f->child_off[p + 1]; k++) {
      int i = f->children[k];
      logp_host[i] = acts->logits[(size_t)(p - s) * d->V + b->tokens[i]] - acts->lse_rows[p - s];
      entropy_host[i] = acts->entropy_rows[p - s];
    }
  t->live_s = s;
  t->live_e = e;
}

gyre_status be_train_forward(be_trainer *t, const train_batch *b, int32_t s, int32_t e, float *logp_host,
                             float *entropy_host) {
  chunk_forward(t, b, s, e, 0, logp_host, entropy_host);
  return GYRE_OK;
}

gyre_status be_train_backward(be_trainer *t, const train_batch *b, int32_t s, int32_t e, const float *dlogp_host) {
  const train_acts *acts = &t->acts;
  const be_model *m = t->m;
  const dims *d = &m->d;
  const forest *f = b->forest;
  const float *w = m->w;
  float *g = t->grads;
  int T = e - s, D = d->D, F = d->F;
  if (t->live_s != s || t->live_e != e) chunk_forward(t, b, s, e, 1, NULL, NULL); /* recompute */
  logits_backward(t->dlogits, acts->logits, acts->lse_rows, T, s, f->child_off, f->children, b->tokens, dlogp_host, d->V,
                  t->coef);
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
    forest_attention_backward(acts->dqkv, acts->datt, io->qkv, io->att, io->lse, &t->store->layers[l], acts->dsum, f, s, e, d,
                              t->scratch, t->scratch_floats, t->tiles, t->store->kchunks);
    rope(acts->dqkv, acts->rope_cs, T, d, 1);
    if (o->qnorm >= 0)
      head_rmsnorm_backward(acts->dqkv, g + o->qnorm, g + o->knorm, io->qk_raw, w + o->qnorm, w + o->knorm, io->qk_rstd, T, d);
    if (o->bqkv >= 0) bias_backward(g + o->bqkv, acts->dqkv, T, d->qkv_dim);
    gemm(d->qkv_dim, D, T, acts->dqkv, d->qkv_dim, 1, io->h1, D, 0, g + o->wqkv, D, 1);
    gemm(T, D, d->qkv_dim, acts->dqkv, d->qkv_dim, 0, w + o->wqkv, D, 0, acts->dh, D, 0);
    rmsnorm_backward(acts->dres, g + o->ln_in, acts->dh, io->x_in, w + o->ln_in, io->rstd1, T, D);
  }
  embed_backward(g + m->lay->embed, acts->dres, b->tokens + s, T, D);
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
