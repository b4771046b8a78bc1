/* inference.cu - the GPU KV block pool and the batched forward over it.
 *
 * One forward is one upload of the batch's integer arrays (tokens, positions, block tables,
 * the paged-attention plan) from a pinned buffer, the layers queued on the cache's stream,
 * and one download of the wanted logits. Decode-sized batches replay a captured CUDA graph
 * of the layers while the batch's shape stays the same (GYRE_CUDA_GRAPHS=0 turns it off). */
#include <stdlib.h>
#include <string.h>

#include "attention.cuh"
#include "gemm.cuh"
#include "kernels.cuh"
#include "transformer.cuh"

#define GRAPH_MAX_ROWS 16 /* batches up to this many rows run as a CUDA graph */

/* The device pointers and sizes one forward's launches depend on, besides the contents of
 * the uploaded arrays: a captured graph replays while they stay the same. */
typedef struct forward_shape {
  int32_t n_rows, n_seqs, n_out, total_blocks, n_units, n_items;
  const void *meta, *work, *partial;
  size_t rows_cap;
} forward_shape;

struct be_cache {
  be_model *m;
  exec_ctx ctx;
  int B, num_blocks;
  void *pool;        /* num_blocks x kv_block_floats elements */
  int elem;          /* bytes per element: 4 (F32) or 2 (F16) */
  dev_buf work;      /* activations for rows_cap rows */
  size_t rows_cap;
  dev_buf partial;   /* paged attention partial results */
  dev_buf meta;      /* the batch's integer arrays on the device */
  dev_buf staging;   /* ... and their pinned host copy */
  int use_graphs;    /* 0 after GYRE_CUDA_GRAPHS=0 or a failed capture */
  cudaGraphExec_t graph;
  forward_shape graph_shape;
};

extern "C" gyre_status be_cache_create(be_model *m, int32_t block_tokens, int32_t num_blocks, int32_t kv_elem, be_cache **out) {
  be_cache *c = (be_cache *)calloc(1, sizeof *c);
  if (c == NULL) return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "cuda: out of host memory");
  c->m = m;
  c->B = block_tokens;
  c->num_blocks = num_blocks;
  c->elem = kv_elem;
  const char *graphs = getenv("GYRE_CUDA_GRAPHS");
  c->use_graphs = graphs == NULL || strcmp(graphs, "0") != 0;
  const size_t bytes = (size_t)kv_elem * kv_block_floats(&m->d, block_tokens) * (size_t)num_blocks;
  gyre_status st = ctx_open(&c->ctx, m->ctx.device);
  if (st == GYRE_OK) {
    st = dev_alloc((void **)&c->pool, bytes, "the KV pool");
    if (st != GYRE_OK)
      st = gyre_fail(st, "cuda: cannot allocate a KV pool of %zu bytes (%d blocks of %d tokens) on device %d", bytes,
                     num_blocks, block_tokens, c->ctx.device);
  }
  if (st != GYRE_OK) {
    be_cache_free(c);
    return st;
  }
  *out = c;
  return GYRE_OK;
}

extern "C" void be_cache_free(be_cache *c) {
  if (c == NULL) return;
  if (ctx_enter(&c->ctx) == GYRE_OK) {
    if (c->graph != NULL) cudaGraphExecDestroy(c->graph);
    cudaFree(c->pool);
    dev_buf_free(&c->work);
    dev_buf_free(&c->partial);
    dev_buf_free(&c->meta);
    host_buf_free(&c->staging);
  }
  ctx_close(&c->ctx);
  free(c);
}

extern "C" gyre_status be_cache_copy_block(be_cache *c, int32_t dst, int32_t src) {
  const size_t n = (size_t)c->elem * kv_block_floats(&c->m->d, c->B); /* bytes of a block */
  GYRE_CHECK(ctx_enter(&c->ctx));
  CU(cudaMemcpyAsync((char *)c->pool + (size_t)dst * n, (char *)c->pool + (size_t)src * n, n, cudaMemcpyDeviceToDevice,
                     c->ctx.stream));
  return ctx_sync(&c->ctx);
}

/* Moves `length` tokens of a block table between the pool and a host payload. */
static gyre_status cache_transfer(be_cache *c, const int32_t *blocks, int32_t length, void *host, int to_host) {
  const dims *d = &c->m->d;
  const int32_t n_blocks = (length + c->B - 1) / c->B;
  const size_t bytes = (size_t)c->elem * d->L * 2 * length * d->kv_dim;
  GYRE_CHECK(ctx_enter(&c->ctx));
  if (length <= 0) return GYRE_OK;
  GYRE_CHECK(dev_buf_fit(&c->meta, sizeof(int32_t) * n_blocks));
  void *payload;
  GYRE_CHECK(ctx_scratch(&c->ctx, bytes, &payload));
  CU(cudaMemcpyAsync(c->meta.p, blocks, sizeof(int32_t) * n_blocks, cudaMemcpyHostToDevice, c->ctx.stream));
  if (!to_host)
    CU(cudaMemcpyAsync(payload, host, bytes, cudaMemcpyHostToDevice, c->ctx.stream));
  GYRE_CHECK(kv_transfer(&c->ctx, c->pool, c->elem, d, c->B, (const int32_t *)c->meta.p, length, payload, to_host));
  if (to_host) CU(cudaMemcpyAsync(host, payload, bytes, cudaMemcpyDeviceToHost, c->ctx.stream));
  return ctx_sync(&c->ctx);
}

extern "C" gyre_status be_cache_read(const be_cache *c, const int32_t *blocks, int32_t length, void *host) {
  /* reading changes only the cache's scratch and staging, never its contents */
  return cache_transfer((be_cache *)c, blocks, length, host, 1);
}

extern "C" gyre_status be_cache_write(be_cache *c, const int32_t *blocks, int32_t length, const void *host) {
  return cache_transfer(c, blocks, length, (void *)host, 0);
}

/* Floats per row of the forward's activations: x, h, wanted rows, qkv, att, gu, act, rstd,
 * RoPE cos | sin, then logits (last). */
static size_t row_floats(const dims *d) {
  return 3 * (size_t)d->D + d->qkv_dim + d->q_dim + 3 * (size_t)d->F + 1 + d->hd + d->V;
}
static float *logits_of(const be_cache *c) {
  return (float *)c->work.p + c->rows_cap * (row_floats(&c->m->d) - c->m->d.V);
}

typedef struct paged_arg {
  be_cache *c;
  const dev_rows *rows;
  const paged_plan *plan;
} paged_arg;

static gyre_status attend_paged(void *arg, exec_ctx *ctx, int layer, const layer_io *io) {
  const paged_arg *p = (const paged_arg *)arg;
  const dims *d = &p->c->m->d;
  GYRE_CHECK(kv_store(ctx, p->c->pool, p->c->elem, d, p->c->B, layer, p->rows, io->qkv));
  return paged_attention(ctx, io->att, io->qkv, p->c->pool, p->c->elem, d, p->c->B, layer, p->rows, p->plan,
                         (float *)p->c->partial.p);
}

/* Integer arrays of one forward, laid out back to back in the staging and meta buffers. */
typedef struct batch_ints {
  int32_t *tokens, *positions, *row_seq, *block_off, *blocks, *out_rows;
  paged_plan plan;
  size_t count;
} batch_ints;

/* Lays the arrays out from base (NULL: only counts them). */
static void batch_ints_at(batch_ints *a, int32_t *base, const fwd_batch *b, int32_t n_units, int32_t n_items) {
  size_t at = 0;
#define TAKE(field, n)                      \
  a->field = base ? base + at : NULL;       \
  at += (size_t)(n);
  TAKE(tokens, b->n_rows)
  TAKE(positions, b->n_rows)
  TAKE(row_seq, b->n_rows)
  TAKE(block_off, b->n_seqs + 1)
  TAKE(blocks, b->block_off[b->n_seqs])
  TAKE(out_rows, b->n_out)
  TAKE(plan.unit_row0, n_units)
  TAKE(plan.unit_rows, n_units)
  TAKE(plan.unit_item0, n_units)
  TAKE(plan.unit_items, n_units)
  TAKE(plan.item_unit, n_items)
  TAKE(plan.item_chunk, n_items)
  TAKE(plan.row_unit, b->n_rows)
#undef TAKE
  a->plan.n_units = n_units;
  a->plan.n_items = n_items;
  a->count = at;
}

/* Queues the model over the uploaded batch: embedding, layers, the wanted rows' logits
 * (left at logits_of(c)). No allocation and no synchronisation, so it can be captured into
 * a graph. */
static gyre_status run_model(be_model *m, be_cache *c, const fwd_batch *b, const batch_ints *dev) {
  const dims *d = &m->d;
  exec_ctx *ctx = &c->ctx;
  const int T = b->n_rows;
  const size_t cap = c->rows_cap;
  float *x = (float *)c->work.p, *h = x + cap * d->D, *wanted = h + cap * d->D, *qkv = wanted + cap * d->D;
  float *att = qkv + cap * d->qkv_dim, *gu = att + cap * d->q_dim, *act = gu + cap * 2 * d->F;
  float *rstd = act + cap * d->F, *cs = rstd + cap;
  layer_io io = {x, h, rstd, qkv, att, NULL, x, h, rstd, gu, act, x, NULL, NULL}; /* one residual stream x, in place */
  const dev_rows rows = {T, dev->positions, dev->row_seq, dev->block_off, dev->blocks};
  paged_arg arg = {c, &rows, &dev->plan};
  GYRE_CHECK(embed_forward(ctx, x, dev->tokens, m->w + m->lay->embed, T, d->D));
  GYRE_CHECK(rope_cs(ctx, cs, dev->positions, T, m->inv_freq, d->hd, m->rope_scale));
  for (int l = 0; l < d->L; l++) GYRE_CHECK(layer_forward(m, ctx, l, T, cs, &io, attend_paged, &arg));
  if (b->n_out == 0) return GYRE_OK;
  GYRE_CHECK(gather_rows(ctx, wanted, x, dev->out_rows, b->n_out, d->D));
  GYRE_CHECK(rmsnorm_forward(ctx, h, NULL, wanted, m->w + m->lay->norm_f, b->n_out, d->D, d->eps));
  return gemm(ctx, b->n_out, d->V, d->D, h, d->D, 0, m->w + m->lay->lm_head, d->D, 1, logits_of(c), d->V, 0);
}

/* Captures run_model into c->graph for this shape. On failure the cache stops trying. */
static gyre_status capture(be_model *m, be_cache *c, const fwd_batch *b, const batch_ints *dev,
                           const forward_shape *shape) {
  exec_ctx *ctx = &c->ctx;
  if (c->graph != NULL) cudaGraphExecDestroy(c->graph);
  c->graph = NULL;
  CU(cudaStreamBeginCapture(ctx->stream, cudaStreamCaptureModeThreadLocal));
  gyre_status st = run_model(m, c, b, dev);
  cudaGraph_t graph = NULL;
  cudaError_t err = cudaStreamEndCapture(ctx->stream, &graph);
  if (st == GYRE_OK && err == cudaSuccess) err = cudaGraphInstantiate(&c->graph, graph, 0);
  if (graph != NULL) cudaGraphDestroy(graph);
  if (st == GYRE_OK && err != cudaSuccess) st = cuda_fail(err, "graph capture", "be_forward");
  if (st != GYRE_OK) {
    cudaGetLastError();
    c->graph = NULL;
    c->use_graphs = 0;
    return st;
  }
  c->graph_shape = *shape;
  return GYRE_OK;
}

extern "C" gyre_status be_forward(be_model *m, be_cache *c, const fwd_batch *b, float *logits_host) {
  const dims *d = &m->d;
  exec_ctx *ctx = &c->ctx;
  const int T = b->n_rows;
  GYRE_CHECK(ctx_enter(ctx));

  /* the batch's integers: staged on the host, one upload */
  const paged_shape pshape = paged_shape_of(d);
  int32_t n_units, n_items;
  paged_plan_count(&pshape, b, &n_units, &n_items);
  batch_ints host, dev;
  batch_ints_at(&host, NULL, b, n_units, n_items);
  GYRE_CHECK(host_buf_fit(&c->staging, sizeof(int32_t) * host.count));
  GYRE_CHECK(dev_buf_fit(&c->meta, sizeof(int32_t) * host.count));
  batch_ints_at(&host, (int32_t *)c->staging.p, b, n_units, n_items);
  batch_ints_at(&dev, (int32_t *)c->meta.p, b, n_units, n_items);
  memcpy(host.tokens, b->tokens, sizeof(int32_t) * T);
  memcpy(host.positions, b->positions, sizeof(int32_t) * T);
  memcpy(host.row_seq, b->row_seq, sizeof(int32_t) * T);
  memcpy(host.block_off, b->block_off, sizeof(int32_t) * (b->n_seqs + 1));
  memcpy(host.blocks, b->blocks, sizeof(int32_t) * b->block_off[b->n_seqs]);
  memcpy(host.out_rows, b->out_rows, sizeof(int32_t) * b->n_out);
  paged_plan_fill(&pshape, b, &host.plan);

  /* activations and attention partials */
  if ((size_t)T > c->rows_cap) {
    size_t cap = c->rows_cap ? c->rows_cap : 64;
    while (cap < (size_t)T) cap *= 2;
    GYRE_CHECK(dev_buf_fit(&c->work, sizeof(float) * cap * row_floats(d)));
    c->rows_cap = cap;
  }
  GYRE_CHECK(dev_buf_fit(&c->partial, sizeof(float) * paged_partial_floats(d, &pshape, n_items)));
  CU(cudaMemcpyAsync(c->meta.p, c->staging.p, sizeof(int32_t) * host.count, cudaMemcpyHostToDevice, ctx->stream));

  /* Decode-sized batches (every product a skinny GEMM, nothing allocated) run as a CUDA
   * graph: a step is then one launch instead of ~10 per layer. */
  forward_shape shape;
  memset(&shape, 0, sizeof shape); /* compared bytewise */
  shape.n_rows = T, shape.n_seqs = b->n_seqs, shape.n_out = b->n_out, shape.total_blocks = b->block_off[b->n_seqs];
  shape.n_units = n_units, shape.n_items = n_items, shape.rows_cap = c->rows_cap;
  shape.meta = c->meta.p, shape.work = c->work.p, shape.partial = c->partial.p;
  gyre_status st = GYRE_ERR_UNSUPPORTED;
  if (c->use_graphs && T <= GRAPH_MAX_ROWS) {
    const int same = c->graph != NULL && memcmp(&shape, &c->graph_shape, sizeof shape) == 0;
    st = same ? GYRE_OK : capture(m, c, b, &dev, &shape);
    if (st == GYRE_OK) CU(cudaGraphLaunch(c->graph, ctx->stream));
  }
  if (st != GYRE_OK) GYRE_CHECK(run_model(m, c, b, &dev)); /* larger batches, or capture failed */
  if (b->n_out > 0)
    CU(cudaMemcpyAsync(logits_host, logits_of(c), sizeof(float) * b->n_out * d->V, cudaMemcpyDeviceToHost,
                       ctx->stream));
  return ctx_sync(ctx);
}
