/* inference.c - the CPU KV block pool and the batched forward over it. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "gemm.h"
#include "kernels.h"
#include "transformer.h"

struct be_cache {
  be_model *m;
  kv_pool pool;
  float *work;       /* activations for rows_cap rows, grown on demand */
  size_t rows_cap;
  float *scratch;    /* attention, per thread scratch_floats */
  size_t scratch_floats;
  int scratch_threads;
  int32_t *tiles;    /* attention tiles, rows_cap + 1 */
};

gyre_status be_cache_create(be_model *m, int32_t block_tokens, int32_t num_blocks, int32_t kv_elem, be_cache **out) {
  be_cache *c = calloc(1, sizeof *c);
  if (c == NULL) return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "cpu: out of host memory");
  size_t bytes = (size_t)kv_elem * kv_pool_elements(&m->d, block_tokens, num_blocks);
  c->pool = (kv_pool){aligned_calloc(bytes), block_tokens, num_blocks, kv_elem};
  if (c->pool.data == NULL) {
    free(c);
    return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "cpu: cannot allocate a KV pool of %zu bytes (%d blocks of %d tokens)",
                     bytes, num_blocks, block_tokens);
  }
  c->m = m;
  *out = c;
  return GYRE_OK;
}

void be_cache_free(be_cache *c) {
  if (c == NULL) return;
  free(c->pool.data);
  free(c->work);
  free(c->scratch);
  free(c->tiles);
  free(c);
}

gyre_status be_cache_copy_block(be_cache *c, int32_t dst, int32_t src) {
  kv_copy_block(&c->pool, &c->m->d, dst, src);
  return GYRE_OK;
}

gyre_status be_cache_read(const be_cache *c, const int32_t *blocks, int32_t length, void *host) {
  kv_transfer(&c->pool, &c->m->d, blocks, length, host, 1);
  return GYRE_OK;
}

gyre_status be_cache_write(be_cache *c, const int32_t *blocks, int32_t length, const void *host) {
  kv_transfer(&c->pool, &c->m->d, blocks, length, (void *)host, 0);
  return GYRE_OK;
}

/* Floats per row of the forward's activations: x, h, x_mid, qkv, att, gu, act, rstd, RoPE cos | sin. */
static size_t row_floats(const dims *d) {
  return 3 * (size_t)d->D + d->qkv_dim + d->q_dim + 3 * (size_t)d->F + 1 + d->hd;
}

static gyre_status ensure_work(be_cache *c, int rows, int threads) {
  const dims *d = &c->m->d;
  if ((size_t)rows > c->rows_cap) {
    size_t cap = c->rows_cap ? c->rows_cap : 64;
    while (cap < (size_t)rows) cap *= 2;
    free(c->work);
    free(c->tiles);
    c->work = aligned_calloc(sizeof(float) * cap * row_floats(d));
    c->tiles = malloc(sizeof(int32_t) * (cap + 1));
    c->rows_cap = c->work && c->tiles ? cap : 0;
    if (c->rows_cap == 0) return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "cpu: out of host memory for %d rows", rows);
  }
  if (threads > c->scratch_threads) {
    free(c->scratch);
    int max_runs = (d->max_pos + 15) / 16 + (d->max_pos + c->pool.B - 1) / c->pool.B;
    c->scratch_floats = attention_scratch_floats(d, max_runs, d->max_pos) + paged_staging_floats(d, c->pool.B);
    c->scratch = aligned_calloc(sizeof(float) * (size_t)threads * c->scratch_floats);
    c->scratch_threads = c->scratch ? threads : 0;
    if (c->scratch == NULL) return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "cpu: out of host memory for attention");
  }
  return GYRE_OK;
}

typedef struct paged_ctx {
  be_cache *c;
  const fwd_batch *b;
} paged_ctx;

static void attend_paged(void *ctx, int layer, const layer_io *io) {
  paged_ctx *p = ctx;
  const dims *d = &p->c->m->d;
  kv_store(&p->c->pool, d, layer, p->b, io->qkv);
  paged_attention(io->att, io->qkv, &p->c->pool, d, layer, p->b, p->c->scratch, p->c->scratch_floats, p->c->tiles);
}

gyre_status be_forward(be_model *m, be_cache *c, const fwd_batch *b, float *logits_host) {
  const dims *d = &m->d;
  int T = b->n_rows;
  GYRE_CHECK(ensure_work(c, T, cpu_threads()));
  size_t cap = c->rows_cap;
  float *x = c->work, *h = x + cap * d->D, *x_mid = h + cap * d->D, *qkv = x_mid + cap * d->D;
  float *att = qkv + cap * d->qkv_dim, *gu = att + cap * d->q_dim, *act = gu + cap * 2 * d->F;
  float *rstd = act + cap * d->F, *cs = rstd + cap;
  layer_io io = {x, h, rstd, qkv, att, NULL, x_mid, h, rstd, gu, act, x, NULL, NULL};
  paged_ctx ctx = {c, b};
  embed_forward(x, b->tokens, m->w + m->lay->embed, T, d->D);
  rope_cs(cs, b->positions, T, m->inv_freq, d->hd, m->rope_scale);
  for (int l = 0; l < d->L; l++) layer_forward(m, l, T, cs, &io, attend_paged, &ctx);
  if (b->n_out == 0) return GYRE_OK;
  for (int k = 0; k < b->n_out; k++) /* the wanted rows, normed into h */
    memcpy(x_mid + (size_t)k * d->D, x + (size_t)b->out_rows[k] * d->D, sizeof(float) * d->D);
  rmsnorm_forward(h, NULL, x_mid, m->w + m->lay->norm_f, b->n_out, d->D, d->eps);
  gemm(b->n_out, d->V, d->D, h, d->D, 0, m->w + m->lay->lm_head, d->D, 1, logits_host, d->V, 0);
  return GYRE_OK;
}
