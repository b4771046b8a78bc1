/* training.cu - the GPU trainer: forward and backward over a packed forest, gradients, AdamW.
 *
 * All activations for max_tokens rows are one device allocation made at creation (llm.c
 * style), in the layout every backend shares (train_acts of activations.h: residual streams,
 * each layer's saved tensors, the final norm and logits, the backward's gradients), then
 * this backend's per-token outputs and the forest's ancestor mask. The host prepares the integer side of each batch (ancestor ranges, children of each
 * row with their dlogp, rows of each token id) so every device sum has a fixed order. The
 * backward mirrors layer_forward step by step, as on the CPU.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.cuh"
#include "gemm.cuh"
#include "kernels.cuh"
#include "transformer.cuh"

struct be_trainer {
  be_model *m;
  exec_ctx ctx;
  int Tm;            /* max_tokens */
  int T;             /* rows of the last forward (0: none, or its logits already consumed) */
  float *grads, *adam_m, *adam_v;
  float *arena;      /* every activation below lives here */
  size_t arena_floats;
  train_acts acts;   /* the shared layout (activations.h); io a host array of device pointers */
  float *token_out;
  uint32_t *mask;    /* [Tm][ceil(Tm / 32)] ancestor bits */
  uint8_t *tiles;    /* [ceil(Tm / 32)]^2 */
  dev_buf fwd_ints;  /* tokens, parents, positions, forest ranges of the last forward */
  dev_buf bwd_ints;  /* the backward's children and token rows */
  dev_buf staging;   /* pinned host copy of either */
  const int32_t *dev_tokens, *dev_parents, *dev_positions;
};

/* Lays out (or, with base NULL, measures) the arena: the shared activations, then this
 * backend's per-token outputs, the forest's ancestor mask and its tile summary. */
static size_t lay_out(be_trainer *t, float *base) {
  const dims *d = &t->m->d;
  const size_t T = (size_t)t->Tm, words = (T + 31) / 32;
  size_t at = 0;
  train_acts_lay_out(&t->acts, d, T, base, &at);
  t->token_out = arena_carve(base, &at, 2 * T);
  t->mask = (uint32_t *)arena_carve(base, &at, T * words);
  t->tiles = (uint8_t *)arena_carve(base, &at, (words * words + 3) / 4);
  return at;
}

extern "C" gyre_status be_trainer_create(be_model *m, int32_t max_tokens, be_trainer **out) {
  be_trainer *t = (be_trainer *)calloc(1, sizeof *t);
  if (t == NULL) return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "cuda: out of host memory");
  t->m = m;
  t->Tm = max_tokens;
  t->acts.io = (layer_io *)calloc((size_t)m->d.L, sizeof(layer_io));
  const size_t n = (size_t)m->lay->n_params, arena = t->acts.io ? lay_out(t, NULL) : 0;
  t->arena_floats = arena;
  gyre_status st = t->acts.io == NULL ? gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "cuda: out of host memory") : GYRE_OK;
  if (st == GYRE_OK) st = ctx_open(&t->ctx, m->ctx.device);
  if (st == GYRE_OK) st = dev_alloc((void **)&t->grads, sizeof(float) * 3 * n, "gradients and AdamW moments");
  if (st == GYRE_OK) {
    st = dev_alloc((void **)&t->arena, sizeof(float) * arena, "training activations");
    if (st != GYRE_OK)
      st = gyre_fail(st, "cuda: cannot allocate %zu MB of training activations for %d tokens on device %d",
                     arena * sizeof(float) >> 20, max_tokens, t->ctx.device);
  }
  if (st == GYRE_OK) {
    t->adam_m = t->grads + n;
    t->adam_v = t->adam_m + n;
    lay_out(t, t->arena);
    cudaError_t err = cudaMemset(t->grads, 0, sizeof(float) * 3 * n);
    if (err == cudaSuccess) err = cudaDeviceSynchronize();
    if (err != cudaSuccess) st = cuda_fail(err, "cudaMemset", "be_trainer_create");
  }
  if (st != GYRE_OK) {
    be_trainer_free(t);
    return st;
  }
  *out = t;
  return GYRE_OK;
}

extern "C" void be_trainer_free(be_trainer *t) {
  if (t == NULL) return;
  if (ctx_enter(&t->ctx) == GYRE_OK) {
    cudaFree(t->grads);
    cudaFree(t->arena);
    dev_buf_free(&t->fwd_ints);
    dev_buf_free(&t->bwd_ints);
    host_buf_free(&t->staging);
  }
  ctx_close(&t->ctx);
  free(t->acts.io);
  free(t);
}

/* Uploads `count` 4-byte words prepared in the staging buffer into dst. */
static gyre_status upload_words(be_trainer *t, dev_buf *dst, size_t count) {
  GYRE_CHECK(dev_buf_fit(dst, 4 * count));
  CU(cudaMemcpyAsync(dst->p, t->staging.p, 4 * count, cudaMemcpyHostToDevice, t->ctx.stream));
  return GYRE_OK;
}

typedef struct forest_arg {
  be_trainer *t;
  int T;
} forest_arg;

static gyre_status attend_forest(void *arg, exec_ctx *ctx, int layer, const layer_io *io) {
  const forest_arg *fa = (const forest_arg *)arg;
  (void)layer;
  return forest_attention_forward(ctx, io->att, io->lse, io->qkv, fa->t->mask, fa->t->tiles, fa->T, &fa->t->m->d);
}

/* Batches of up to max_tokens tokens: one chunk (longer ones are refused for now). */
extern "C" gyre_status be_train_begin(be_trainer *t, const train_batch *b) {
  if (b->n > t->Tm)
    return gyre_fail(GYRE_ERR_UNSUPPORTED, "cuda: a batch of %d tokens is longer than max_tokens %d (not chunked on this backend yet)",
                     b->n, t->Tm);
  return GYRE_OK;
}

extern "C" void be_train_end(be_trainer *t) { (void)t; }

extern "C" void be_trainer_memory(const be_trainer *t, int64_t *fixed, int64_t *kv_per_token, int64_t *last_batch) {
  const size_t n = (size_t)t->m->lay->n_params;
  *fixed = (int64_t)(sizeof(float) * (3 * n + t->arena_floats));
  *kv_per_token = 0;
  *last_batch = 0;
}

extern "C" gyre_status be_train_forward(be_trainer *t, const train_batch *b, int32_t s, int32_t e, float *logp_host,
                                        float *entropy_host) {
  (void)s, (void)e; /* the whole batch (be_train_begin) */
  const train_acts *acts = &t->acts;
  const be_model *m = t->m;
  const dims *d = &m->d;
  const forest *f = b->forest;
  const int T = b->n;
  exec_ctx *ctx = &t->ctx;
  GYRE_CHECK(ctx_enter(ctx));
  t->T = 0;

  /* tokens | parents | positions | range_off | ranges */
  const size_t n_ranges = (size_t)f->range_off[T], words = 3 * (size_t)T + T + 1 + 2 * n_ranges;
  GYRE_CHECK(host_buf_fit(&t->staging, 4 * words));
  int32_t *h = (int32_t *)t->staging.p;
  memcpy(h, b->tokens, sizeof(int32_t) * T);
  memcpy(h + T, b->parents, sizeof(int32_t) * T);
  memcpy(h + 2 * T, b->positions, sizeof(int32_t) * T);
  memcpy(h + 3 * T, f->range_off, sizeof(int32_t) * (T + 1));
  memcpy(h + 4 * T + 1, f->ranges, sizeof(int32_t) * 2 * n_ranges);
  GYRE_CHECK(upload_words(t, &t->fwd_ints, words));
  const int32_t *di = (const int32_t *)t->fwd_ints.p;
  t->dev_tokens = di;
  t->dev_parents = di + T;
  t->dev_positions = di + 2 * T;
  GYRE_CHECK(forest_mask(ctx, t->mask, t->tiles, di + 3 * T, di + 4 * T + 1, T));

  forest_arg arg = {t, T};
  GYRE_CHECK(embed_forward(ctx, acts->io[0].x_in, t->dev_tokens, m->w + m->lay->embed, T, d->D));
  GYRE_CHECK(rope_cs(ctx, acts->rope_cs, t->dev_positions, T, m->inv_freq, d->hd, m->rope_scale));
  for (int l = 0; l < d->L; l++) GYRE_CHECK(layer_forward(m, ctx, l, T, acts->rope_cs, &acts->io[l], attend_forest, &arg));
  GYRE_CHECK(rmsnorm_forward(ctx, acts->hf, acts->rstdf, acts->x_final, m->w + m->lay->norm_f, T, d->D, d->eps));
  GYRE_CHECK(gemm(ctx, T, d->V, d->D, acts->hf, d->D, 0, m->w + m->lay->lm_head, d->D, 1, acts->logits, d->V, 0));
  GYRE_CHECK(logits_stats(ctx, acts->lse_rows, acts->entropy_rows, acts->logits, T, d->V, b->inv_temperature));
  GYRE_CHECK(token_logprobs(ctx, t->token_out, t->token_out + T, acts->logits, acts->lse_rows, acts->entropy_rows,
                            t->dev_tokens, t->dev_parents, T, d->V));
  CU(cudaMemcpyAsync(logp_host, t->token_out, sizeof(float) * T, cudaMemcpyDeviceToHost, ctx->stream));
  CU(cudaMemcpyAsync(entropy_host, t->token_out + T, sizeof(float) * T, cudaMemcpyDeviceToHost, ctx->stream));
  GYRE_CHECK(ctx_sync(ctx));
  t->T = T;
  return GYRE_OK;
}

/* The backward's host-side words, in the staging buffer:
 *   coef[T] (float)  child_off[T+1]  child_token[C]  child_dlogp[C] (float)
 *   id_off[U+1]  ids[U]  id_rows[T]
 * coef[p] sums dlogp over p's children in index order (as the CPU backend); the children
 * with dlogp != 0 and the rows of each token id are listed in ascending index order. */
typedef struct bwd_words {
  size_t coef, child_off, child_token, child_dlogp, id_off, ids, id_rows, count;
  int32_t n_ids;
} bwd_words;

static gyre_status prepare_backward(be_trainer *t, const train_batch *b, const float *dlogp, bwd_words *w) {
  const int T = b->n, V = t->m->d.V;
  int32_t children = 0;
  for (int i = 0; i < T; i++) children += b->parents[i] >= 0 && dlogp[i] != 0.0f;
  int32_t *per_id = (int32_t *)calloc((size_t)V, sizeof(int32_t));
  if (per_id == NULL) return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "cuda: out of host memory");
  for (int i = 0; i < T; i++) per_id[b->tokens[i]]++;
  w->n_ids = 0;
  for (int v = 0; v < V; v++) w->n_ids += per_id[v] > 0;
  w->coef = 0;
  w->child_off = w->coef + T;
  w->child_token = w->child_off + T + 1;
  w->child_dlogp = w->child_token + children;
  w->id_off = w->child_dlogp + children;
  w->ids = w->id_off + w->n_ids + 1;
  w->id_rows = w->ids + w->n_ids;
  w->count = w->id_rows + T;
  gyre_status st = host_buf_fit(&t->staging, 4 * w->count);
  if (st != GYRE_OK) {
    free(per_id);
    return st;
  }
  int32_t *words = (int32_t *)t->staging.p;
  float *coef = (float *)(words + w->coef), *child_dlogp = (float *)(words + w->child_dlogp);
  int32_t *child_off = words + w->child_off, *child_token = words + w->child_token;
  memset(coef, 0, sizeof(float) * T);
  memset(child_off, 0, sizeof(int32_t) * (T + 1));
  for (int i = 0; i < T; i++)
    if (b->parents[i] >= 0) {
      coef[b->parents[i]] += dlogp[i];
      child_off[b->parents[i] + 1] += dlogp[i] != 0.0f;
    }
  for (int p = 0; p < T; p++) child_off[p + 1] += child_off[p];
  /* children in index order */
  int32_t *cursor = (int32_t *)malloc(sizeof(int32_t) * (T > 0 ? T : 1));
  if (cursor == NULL) {
    free(per_id);
    return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "cuda: out of host memory");
  }
  memcpy(cursor, child_off, sizeof(int32_t) * T);
  for (int i = 0; i < T; i++)
    if (b->parents[i] >= 0 && dlogp[i] != 0.0f) {
      const int32_t k = cursor[b->parents[i]]++;
      child_token[k] = b->tokens[i];
      child_dlogp[k] = dlogp[i];
    }
  free(cursor);
  /* rows grouped by token id: counting sort, ids ascending, rows ascending within an id */
  int32_t *id_off = words + w->id_off, *ids = words + w->ids, *id_rows = words + w->id_rows;
  int32_t u = 0;
  id_off[0] = 0;
  for (int v = 0; v < V; v++) {
    if (per_id[v] == 0) continue;
    ids[u] = v;
    id_off[u + 1] = id_off[u] + per_id[v];
    per_id[v] = id_off[u]; /* now: next free slot of token v */
    u++;
  }
  for (int i = 0; i < T; i++) id_rows[per_id[b->tokens[i]]++] = i;
  free(per_id);
  return GYRE_OK;
}

extern "C" gyre_status be_train_backward(be_trainer *t, const train_batch *b, int32_t s, int32_t e, const float *dlogp_host) {
  (void)s, (void)e; /* the whole batch (be_train_begin) */
  const train_acts *acts = &t->acts;
  const be_model *m = t->m;
  const dims *d = &m->d;
  const float *w = m->w;
  float *g = t->grads;
  const int T = b->n, D = d->D, F = d->F;
  exec_ctx *ctx = &t->ctx;
  if (t->T != T) return gyre_fail(GYRE_ERR_STATE, "cuda: backward of a batch that was not the last forward");
  GYRE_CHECK(ctx_enter(ctx));
  bwd_words bw = {};
  GYRE_CHECK(prepare_backward(t, b, dlogp_host, &bw));
  GYRE_CHECK(upload_words(t, &t->bwd_ints, bw.count));
  const int32_t *wi = (const int32_t *)t->bwd_ints.p;
  const float *wf = (const float *)t->bwd_ints.p;
  t->T = 0; /* the logits become dlogits in place */

  GYRE_CHECK(logits_backward(ctx, acts->logits, acts->lse_rows, wf + bw.coef, wi + bw.child_off, wi + bw.child_token,
                             wf + bw.child_dlogp, T, d->V));
  const float *dlogits = acts->logits;
  GYRE_CHECK(gemm(ctx, d->V, D, T, dlogits, d->V, 1, acts->hf, D, 0, g + m->lay->lm_head, D, 1));
  GYRE_CHECK(gemm(ctx, T, D, d->V, dlogits, d->V, 0, w + m->lay->lm_head, D, 0, acts->dh, D, 0));
  CU(cudaMemsetAsync(acts->dres, 0, sizeof(float) * (size_t)T * D, ctx->stream));
  GYRE_CHECK(rmsnorm_backward(ctx, acts->dres, g + m->lay->norm_f, acts->dh, acts->x_final, w + m->lay->norm_f, acts->rstdf, T, D));
  for (int l = d->L - 1; l >= 0; l--) {
    const layer_io *io = &acts->io[l];
    const layer_offsets *o = &m->lay->layers[l];
    /* x_out = x_mid + act . Wdown^T */
    GYRE_CHECK(gemm(ctx, D, F, T, acts->dres, D, 1, io->act, F, 0, g + o->wdown, F, 1));
    GYRE_CHECK(gemm(ctx, T, F, D, acts->dres, D, 0, w + o->wdown, F, 0, acts->dact, F, 0));
    GYRE_CHECK(swiglu_backward(ctx, acts->dgu, acts->dact, io->gu, T, F));
    GYRE_CHECK(gemm(ctx, 2 * F, D, T, acts->dgu, 2 * F, 1, io->h2, D, 0, g + o->wgu, D, 1));
    GYRE_CHECK(gemm(ctx, T, D, 2 * F, acts->dgu, 2 * F, 0, w + o->wgu, D, 0, acts->dh, D, 0));
    GYRE_CHECK(rmsnorm_backward(ctx, acts->dres, g + o->ln_post, acts->dh, io->x_mid, w + o->ln_post, io->rstd2, T, D));
    /* x_mid = x_in + att . Wo^T */
    GYRE_CHECK(gemm(ctx, D, d->q_dim, T, acts->dres, D, 1, io->att, d->q_dim, 0, g + o->wo, d->q_dim, 1));
    GYRE_CHECK(gemm(ctx, T, d->q_dim, D, acts->dres, D, 0, w + o->wo, d->q_dim, 0, acts->datt, d->q_dim, 0));
    GYRE_CHECK(forest_attention_backward(ctx, acts->dqkv, acts->datt, io->qkv, io->att, io->lse, acts->dsum, t->mask, t->tiles,
                                         T, d));
    GYRE_CHECK(rope(ctx, acts->dqkv, acts->rope_cs, T, d, 1));
    if (o->qnorm >= 0)
      GYRE_CHECK(head_rmsnorm_backward(ctx, acts->dqkv, g + o->qnorm, g + o->knorm, io->qk_raw, w + o->qnorm, w + o->knorm,
                                       io->qk_rstd, T, d));
    if (o->bqkv >= 0) GYRE_CHECK(bias_backward(ctx, g + o->bqkv, acts->dqkv, T, d->qkv_dim));
    GYRE_CHECK(gemm(ctx, d->qkv_dim, D, T, acts->dqkv, d->qkv_dim, 1, io->h1, D, 0, g + o->wqkv, D, 1));
    GYRE_CHECK(gemm(ctx, T, D, d->qkv_dim, acts->dqkv, d->qkv_dim, 0, w + o->wqkv, D, 0, acts->dh, D, 0));
    GYRE_CHECK(rmsnorm_backward(ctx, acts->dres, g + o->ln_in, acts->dh, io->x_in, w + o->ln_in, io->rstd1, T, D));
  }
  GYRE_CHECK(embed_backward(ctx, g + m->lay->embed, acts->dres, wi + bw.ids, wi + bw.id_off, wi + bw.id_rows, bw.n_ids, D));
  return ctx_sync(ctx);
}

static gyre_status copy_flat(const be_trainer *t, float *dst, const float *src, cudaMemcpyKind kind) {
  GYRE_CHECK(ctx_enter(&t->ctx));
  CU(cudaMemcpyAsync(dst, src, sizeof(float) * (size_t)t->m->lay->n_params, kind, t->ctx.stream));
  return ctx_sync(&t->ctx);
}

extern "C" gyre_status be_grads_zero(be_trainer *t) {
  GYRE_CHECK(ctx_enter(&t->ctx));
  CU(cudaMemsetAsync(t->grads, 0, sizeof(float) * (size_t)t->m->lay->n_params, t->ctx.stream));
  return ctx_sync(&t->ctx);
}

extern "C" gyre_status be_grads_get(const be_trainer *t, float *host) {
  return copy_flat(t, host, t->grads, cudaMemcpyDeviceToHost);
}

extern "C" gyre_status be_grads_set(be_trainer *t, const float *host) {
  return copy_flat(t, t->grads, host, cudaMemcpyHostToDevice);
}

extern "C" gyre_status be_grads_add(be_trainer *t, const float *host, float scale) {
  const size_t n = (size_t)t->m->lay->n_params;
  GYRE_CHECK(ctx_enter(&t->ctx));
  void *staged;
  GYRE_CHECK(ctx_scratch(&t->ctx, sizeof(float) * n, &staged));
  CU(cudaMemcpyAsync(staged, host, sizeof(float) * n, cudaMemcpyHostToDevice, t->ctx.stream));
  GYRE_CHECK(axpy(&t->ctx, t->grads, (const float *)staged, n, scale));
  return ctx_sync(&t->ctx);
}

extern "C" gyre_status be_adamw_step(be_trainer *t, const gyre_adamw *opt, int64_t step, float *grad_norm) {
  const size_t n = (size_t)t->m->lay->n_params;
  GYRE_CHECK(ctx_enter(&t->ctx));
  double sum = 0.0;
  GYRE_CHECK(sum_squares(&t->ctx, t->grads, n, &sum));
  const double norm = sqrt(sum);
  const double coef = opt->max_grad_norm > 0.0f ? opt->max_grad_norm / (norm + 1e-6) : 1.0;
  const float scale = coef < 1.0 ? (float)coef : 1.0f;
  GYRE_CHECK(adamw(&t->ctx, t->m->w, t->grads, t->adam_m, t->adam_v, n, opt, step, scale));
  *grad_norm = (float)norm;
  return ctx_sync(&t->ctx);
}

extern "C" gyre_status be_moments_get(const be_trainer *t, float *m_host, float *v_host) {
  GYRE_CHECK(copy_flat(t, m_host, t->adam_m, cudaMemcpyDeviceToHost));
  return copy_flat(t, v_host, t->adam_v, cudaMemcpyDeviceToHost);
}

extern "C" gyre_status be_moments_set(be_trainer *t, const float *m_host, const float *v_host) {
  GYRE_CHECK(copy_flat(t, t->adam_m, m_host, cudaMemcpyHostToDevice));
  return copy_flat(t, t->adam_v, v_host, cudaMemcpyHostToDevice);
}
