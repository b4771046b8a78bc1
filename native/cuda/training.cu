/* training.cu - the GPU trainer: forward and backward over a packed forest in chunks,
 * gradients, AdamW.
 *
 * The activations of max_tokens rows are one device allocation made at creation (llm.c
 * style), in the layout every backend shares (train_acts of activations.h: residual streams,
 * each layer's saved tensors, the final norm and logits, the backward's gradients). A batch's
 * integer side (tokens, parents, positions, the forest's ancestor ranges and children: O(n))
 * goes to the device once, at be_train_begin. A batch of one chunk attends through each
 * layer's saved qkv; a longer one gets a store on the device for its length (every layer's K
 * and V of every token, the gradients later chunks send back to them, and the attention
 * outputs the backward's recomputed forwards reuse), released when the batch is done. The
 * host prepares each chunk's children with their dlogp and rows of each token id, so every
 * device sum has a fixed order. The backward mirrors layer_forward step by step, chunk by
 * chunk from the last, as on the CPU (backend.h).
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
  int Tm;             /* max_tokens */
  int n;              /* tokens of the batch being trained */
  int live_s, live_e; /* the chunk whose activations (logits included) the arena holds (live_e == 0: none) */
  float *grads, *adam_m, *adam_v;
  float *arena;       /* every activation below lives here */
  size_t arena_floats;
  train_acts acts;    /* the shared layout (activations.h); io a host array of device pointers */
  dev_buf batch_ints; /* tokens | parents | positions | range_off | ranges | children of the batch */
  const int32_t *dev_tokens, *dev_parents, *dev_positions, *dev_range_off, *dev_ranges, *dev_children;
  dev_buf child_out;  /* log-probs | entropies of a chunk's children */
  dev_buf bwd_ints;   /* the backward's children and token rows of a chunk */
  dev_buf staging;    /* pinned host copy of any of them */
  float *store;       /* a chunked batch's store, per layer: [n][K | V][kv_dim], dK/dV alike, att [n][q_dim], lse [n][H] */
  size_t store_bytes; /* the last chunked batch's (be_trainer_memory) */
};

/* Lays out (or, with base NULL, measures) the arena: the shared activations. */
static size_t lay_out(be_trainer *t, float *base) {
  size_t at = 0;
  train_acts_lay_out(&t->acts, &t->m->d, (size_t)t->Tm, base, &at);
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
    cudaFree(t->store);
    dev_buf_free(&t->batch_ints);
    dev_buf_free(&t->child_out);
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

/* Floats of one layer's K/V store for n tokens: K | V rows, their gradients, the attention
 * outputs [n][q_dim] and their lse [n][H] (the backward's recomputed forward reuses them). */
static size_t store_layer_floats(const dims *d, int n) { return (size_t)n * (4 * d->kv_dim + d->q_dim + d->H); }

/* Layer l's part of the store. */
static float *store_layer(const be_trainer *t, int l) { return t->store + store_layer_floats(&t->m->d, t->n) * l; }

/* The batch's integer side on the device; a K/V store (zeroed gradients) when it is longer than a chunk. */
extern "C" gyre_status be_train_begin(be_trainer *t, const train_batch *b) {
  const forest *f = b->forest;
  const int n = b->n;
  const size_t n_ranges = (size_t)f->range_off[n], n_children = (size_t)f->child_off[n];
  const size_t words = 3 * (size_t)n + n + 1 + 2 * n_ranges + n_children;
  t->live_e = 0;
  t->n = n;
  GYRE_CHECK(ctx_enter(&t->ctx));
  GYRE_CHECK(host_buf_fit(&t->staging, 4 * words));
  int32_t *h = (int32_t *)t->staging.p;
  memcpy(h, b->tokens, sizeof(int32_t) * n);
  memcpy(h + n, b->parents, sizeof(int32_t) * n);
  memcpy(h + 2 * n, b->positions, sizeof(int32_t) * n);
  memcpy(h + 3 * n, f->range_off, sizeof(int32_t) * (n + 1));
  memcpy(h + 4 * n + 1, f->ranges, sizeof(int32_t) * 2 * n_ranges);
  memcpy(h + 4 * n + 1 + 2 * n_ranges, f->children, sizeof(int32_t) * n_children);
  GYRE_CHECK(upload_words(t, &t->batch_ints, words));
  const int32_t *di = (const int32_t *)t->batch_ints.p;
  t->dev_tokens = di;
  t->dev_parents = di + n;
  t->dev_positions = di + 2 * n;
  t->dev_range_off = di + 3 * n;
  t->dev_ranges = di + 4 * n + 1;
  t->dev_children = di + 4 * n + 1 + 2 * n_ranges;
  GYRE_CHECK(dev_buf_fit(&t->child_out, sizeof(float) * 2 * (n_children > 0 ? n_children : 1)));
  t->store_bytes = 0;
  if (n > t->Tm) {
    const dims *d = &t->m->d;
    const size_t bytes = sizeof(float) * store_layer_floats(d, n) * d->L;
    GYRE_CHECK(dev_alloc((void **)&t->store, bytes, "the K/V store of a chunked batch"));
    t->store_bytes = bytes;
    CU(cudaMemsetAsync(t->store, 0, bytes, t->ctx.stream));
  }
  return ctx_sync(&t->ctx); /* the staging buffer is free again */
}

/* Releases a chunked batch's store and its integer side (kept, grown, for batches of one chunk). */
extern "C" void be_train_end(be_trainer *t) {
  if (t->store != NULL && ctx_enter(&t->ctx) == GYRE_OK) {
    cudaFree(t->store);
    dev_buf_free(&t->batch_ints);
    dev_buf_free(&t->child_out);
  }
  t->store = NULL;
  t->live_e = 0;
}

extern "C" void be_trainer_memory(const be_trainer *t, int64_t *fixed, int64_t *kv_per_token, int64_t *last_batch) {
  const size_t n = (size_t)t->m->lay->n_params;
  *fixed = (int64_t)(sizeof(float) * (3 * n + t->arena_floats));
  *kv_per_token = (int64_t)(sizeof(float) * store_layer_floats(&t->m->d, 1) * t->m->d.L);
  *last_batch = (int64_t)t->store_bytes;
}

/* The keys of the chunk [s, e) for layer `layer`: the store's when the batch is chunked, else
 * the layer's own qkv (the batch is the chunk). */
static forest_keys keys_of(const be_trainer *t, int layer, const layer_io *io, int s, int e) {
  const dims *d = &t->m->d;
  forest_keys k;
  if (t->store != NULL) {
    float *kv = store_layer(t, layer);
    k.k = kv;
    k.ld = 2 * d->kv_dim;
    k.dkv = kv + (size_t)t->n * 2 * d->kv_dim;
  } else {
    k.k = io->qkv + d->q_dim;
    k.ld = d->qkv_dim;
    k.dkv = NULL;
  }
  k.v = k.k + d->kv_dim;
  k.range_off = t->dev_range_off;
  k.ranges = t->dev_ranges;
  k.s = s;
  k.e = e;
  return k;
}

typedef struct chunk_arg {
  be_trainer *t;
  int s, e;
  int again; /* the backward's recomputed forward: K/V and attention outputs are in the store */
} chunk_arg;

/* Copies rows [s, e) of the store's saved attention outputs and lse to or from io's. */
static gyre_status saved_attention(const be_trainer *t, exec_ctx *ctx, int layer, const layer_io *io, int s, int e, int to_io) {
  const dims *d = &t->m->d;
  float *att = store_layer(t, layer) + (size_t)t->n * 4 * d->kv_dim, *lse = att + (size_t)t->n * d->q_dim;
  const size_t T = (size_t)(e - s);
  const cudaMemcpyKind kind = cudaMemcpyDeviceToDevice;
  if (to_io) {
    CU(cudaMemcpyAsync(io->att, att + (size_t)s * d->q_dim, sizeof(float) * T * d->q_dim, kind, ctx->stream));
    CU(cudaMemcpyAsync(io->lse, lse + (size_t)s * d->H, sizeof(float) * T * d->H, kind, ctx->stream));
  } else {
    CU(cudaMemcpyAsync(att + (size_t)s * d->q_dim, io->att, sizeof(float) * T * d->q_dim, kind, ctx->stream));
    CU(cudaMemcpyAsync(lse + (size_t)s * d->H, io->lse, sizeof(float) * T * d->H, kind, ctx->stream));
  }
  return GYRE_OK;
}

static gyre_status attend_forest(void *arg, exec_ctx *ctx, int layer, const layer_io *io) {
  const chunk_arg *c = (const chunk_arg *)arg;
  const forest_keys keys = keys_of(c->t, layer, io, c->s, c->e);
  if (c->t->store == NULL) return forest_attention_forward(ctx, io->att, io->lse, io->qkv, &keys, &c->t->m->d);
  if (c->again) return saved_attention(c->t, ctx, layer, io, c->s, c->e, 1);
  GYRE_CHECK(forest_keys_put(ctx, (float *)keys.k, io->qkv, c->s, c->e, &c->t->m->d));
  GYRE_CHECK(forest_attention_forward(ctx, io->att, io->lse, io->qkv, &keys, &c->t->m->d));
  return saved_attention(c->t, ctx, layer, io, c->s, c->e, 0);
}

/* The chunk's forward, its activations kept in the arena (again: see chunk_arg). */
static gyre_status chunk_forward(be_trainer *t, const train_batch *b, int s, int e, int again) {
  const train_acts *acts = &t->acts;
  const be_model *m = t->m;
  const dims *d = &m->d;
  const int T = e - s;
  exec_ctx *ctx = &t->ctx;
  chunk_arg arg = {t, s, e, again};
  t->live_e = 0;
  GYRE_CHECK(embed_forward(ctx, acts->io[0].x_in, t->dev_tokens + s, m->w + m->lay->embed, T, d->D));
  GYRE_CHECK(rope_cs(ctx, acts->rope_cs, t->dev_positions + s, T, m->inv_freq, d->hd, m->rope_scale));
  for (int l = 0; l < d->L; l++) GYRE_CHECK(layer_forward(m, ctx, l, T, acts->rope_cs, &acts->io[l], attend_forest, &arg));
  GYRE_CHECK(rmsnorm_forward(ctx, acts->hf, acts->rstdf, acts->x_final, m->w + m->lay->norm_f, T, d->D, d->eps));
  GYRE_CHECK(gemm(ctx, T, d->V, d->D, acts->hf, d->D, 0, m->w + m->lay->lm_head, d->D, 1, acts->logits, d->V, 0));
  GYRE_CHECK(logits_stats(ctx, acts->lse_rows, acts->entropy_rows, acts->logits, T, d->V, b->inv_temperature));
  t->live_s = s;
  t->live_e = e;
  return GYRE_OK;
}

extern "C" gyre_status be_train_forward(be_trainer *t, const train_batch *b, int32_t s, int32_t e, float *logp_host,
                                        float *entropy_host) {
  const forest *f = b->forest;
  const int k0 = f->child_off[s], k1 = f->child_off[e], C = k1 - k0;
  exec_ctx *ctx = &t->ctx;
  GYRE_CHECK(ctx_enter(ctx));
  GYRE_CHECK(chunk_forward(t, b, s, e, 0));
  float *out = (float *)t->child_out.p;
  GYRE_CHECK(child_logprobs(ctx, out, out + C, t->acts.logits, t->acts.lse_rows, t->acts.entropy_rows, t->dev_tokens,
                            t->dev_parents, t->dev_children, k0, k1, s, t->m->d.V));
  GYRE_CHECK(host_buf_fit(&t->staging, sizeof(float) * 2 * (C > 0 ? C : 1)));
  if (C > 0) CU(cudaMemcpyAsync(t->staging.p, out, sizeof(float) * 2 * C, cudaMemcpyDeviceToHost, ctx->stream));
  GYRE_CHECK(ctx_sync(ctx));
  const float *h = (const float *)t->staging.p;
  for (int k = 0; k < C; k++) {
    logp_host[f->children[k0 + k]] = h[k];
    entropy_host[f->children[k0 + k]] = h[C + k];
  }
  return GYRE_OK;
}

/* The backward's host-side words of the chunk [s, e) (T rows), in the staging buffer:
 *   coef[T] (float)  child_off[T+1]  child_token[C]  child_dlogp[C] (float)
 *   id_off[U+1]  ids[U]  id_rows[T]
 * coef[p] sums dlogp over row p's children in index order (as the CPU backend); the children
 * with dlogp != 0 and the rows of each token id are listed in ascending index order. */
typedef struct bwd_words {
  size_t coef, child_off, child_token, child_dlogp, id_off, ids, id_rows, count;
  int32_t n_ids;
} bwd_words;

/* coef, child_off, child_token and child_dlogp of the chunk's rows (words laid out in w). */
static void prepare_children(int32_t *words, const bwd_words *w, const train_batch *b, int s, int e, const float *dlogp) {
  const forest *f = b->forest;
  float *coef = (float *)(words + w->coef), *child_dlogp = (float *)(words + w->child_dlogp);
  int32_t *child_off = words + w->child_off, *child_token = words + w->child_token, c = 0;
  for (int p = s; p < e; p++) {
    float sum = 0.0f;
    child_off[p - s] = c;
    for (int k = f->child_off[p]; k < f->child_off[p + 1]; k++) {
      const int i = f->children[k];
      sum += dlogp[i];
      if (dlogp[i] == 0.0f) continue;
      child_token[c] = b->tokens[i];
      child_dlogp[c++] = dlogp[i];
    }
    coef[p - s] = sum;
  }
  child_off[e - s] = c;
}

static gyre_status prepare_backward(be_trainer *t, const train_batch *b, int s, int e, const float *dlogp, bwd_words *w) {
  const forest *f = b->forest;
  const int T = e - s, V = t->m->d.V;
  int32_t children = 0;
  for (int k = f->child_off[s]; k < f->child_off[e]; k++) children += dlogp[f->children[k]] != 0.0f;
  int32_t *per_id = (int32_t *)calloc((size_t)V, sizeof(int32_t));
  if (per_id == NULL) return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "cuda: out of host memory");
  for (int i = s; i < e; i++) per_id[b->tokens[i]]++;
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
  prepare_children(words, w, b, s, e, dlogp);
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
  for (int i = s; i < e; i++) id_rows[per_id[b->tokens[i]]++] = i - s;
  free(per_id);
  return GYRE_OK;
}

extern "C" gyre_status be_train_backward(be_trainer *t, const train_batch *b, int32_t s, int32_t e, const float *dlogp_host) {
  const train_acts *acts = &t->acts;
  const be_model *m = t->m;
  const dims *d = &m->d;
  const float *w = m->w;
  float *g = t->grads;
  const int T = e - s, D = d->D, F = d->F;
  exec_ctx *ctx = &t->ctx;
  GYRE_CHECK(ctx_enter(ctx));
  if (t->live_s != s || t->live_e != e) GYRE_CHECK(chunk_forward(t, b, s, e, 1)); /* recompute */
  bwd_words bw = {};
  GYRE_CHECK(prepare_backward(t, b, s, e, dlogp_host, &bw));
  GYRE_CHECK(upload_words(t, &t->bwd_ints, bw.count));
  const int32_t *wi = (const int32_t *)t->bwd_ints.p;
  const float *wf = (const float *)t->bwd_ints.p;
  t->live_e = 0; /* the logits become dlogits in place */

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
    const forest_keys keys = keys_of(t, l, io, s, e);
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
    GYRE_CHECK(forest_attention_backward(ctx, acts->dqkv, acts->datt, io->qkv, io->att, io->lse, acts->dsum, &keys, d));
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
