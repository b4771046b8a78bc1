/*
 * attention.cuh - attention on the GPU: over the paged KV cache (inference) and over the
 * ancestors of a packed forest (training, forward and backward). Device pointers unless
 * named *_host; head_dim <= ATTENTION_MAX_HEAD_DIM.
 */
#ifndef GYRE_CUDA_ATTENTION_CUH
#define GYRE_CUDA_ATTENTION_CUH

#include "cuda_common.cuh"

#define ATTENTION_MAX_HEAD_DIM 128

/* KV block pool layout: block b, layer l, kind (0 = K after RoPE, 1 = V), kv head g is a
 * [B][hd] row-major slab at element kv_offset(...) of the pool (the CPU's pool has the same
 * block size and keeps K transposed; only the hand-off payload layout is shared). Elements
 * are F32 (elem 4) or F16 (elem 2, kept as its bits: rounded to nearest even, saturating, as
 * src/half.h does on the host). */
static inline size_t kv_offset(const dims *d, int B, int32_t block, int layer, int kind, int g) {
  return ((((size_t)block * d->L + layer) * 2 + kind) * d->KV + g) * (size_t)B * d->hd;
}
static inline size_t kv_block_floats(const dims *d, int B) { return (size_t)d->L * 2 * d->KV * B * d->hd; }

/* The ragged batch of gyre_forward on the device (arrays as in fwd_batch). */
typedef struct dev_rows {
  int32_t n_rows;
  const int32_t *positions, *row_seq, *block_off, *blocks;
} dev_rows;

/* Writes the K (after RoPE) and V of every row of qkv[rows, qkv_dim] into the pool. */
gyre_status kv_store(exec_ctx *ctx, void *pool, int elem, const dims *d, int B, int layer, const dev_rows *rows,
                     const float *qkv);
/* Copies `length` tokens of a block table (device array) between the pool and a device
 * payload in the hand-off layout ([layer][K|V][length][KV][hd], the pool's elements);
 * to_payload picks the way. */
gyre_status kv_transfer(exec_ctx *ctx, void *pool, int elem, const dims *d, int B, const int32_t *blocks, int32_t length,
                        void *payload, int to_payload);

/* Paged attention works on units (up to rows_per_unit consecutive rows of one sequence,
 * times heads_per_slice query heads of one kv head) split into items of PAGED_CHUNK keys;
 * partial results of a unit's items are merged in order. */
#define PAGED_CHUNK 256
typedef struct paged_shape {
  int heads_per_slice; /* query heads of one kv head handled together */
  int slices;          /* (H / KV) / heads_per_slice */
  int rows_per_unit;
} paged_shape;
paged_shape paged_shape_of(const dims *d);

/* Host-side plan: unit u covers rows [unit_row0[u], + unit_rows[u]) and items
 * [unit_item0[u], + unit_items[u]); item k is key chunk item_chunk[k] of unit item_unit[k];
 * row r belongs to unit row_unit[r]. */
typedef struct paged_plan {
  int32_t n_units, n_items;
  int32_t *unit_row0, *unit_rows, *unit_item0, *unit_items, *item_unit, *item_chunk, *row_unit;
} paged_plan;
/* Number of units and items of a batch (to size the plan's arrays). */
void paged_plan_count(const paged_shape *s, const fwd_batch *b, int32_t *n_units, int32_t *n_items);
/* Fills the plan's arrays (allocated by the caller from the counts). */
void paged_plan_fill(const paged_shape *s, const fwd_batch *b, paged_plan *p);
/* Floats of partial results the plan needs. */
size_t paged_partial_floats(const dims *d, const paged_shape *s, int32_t n_items);

/* att[rows, q_dim] = attention of each row's queries over its sequence's cached keys
 * 0..position. plan: the plan's arrays on the device; partial: scratch of
 * paged_partial_floats. */
gyre_status paged_attention(exec_ctx *ctx, float *att, const float *qkv, const void *pool, int elem, const dims *d, int B,
                            int layer, const dev_rows *rows, const paged_plan *plan, float *partial);

/* The keys of a chunk's forest attention and the ancestry of its queries. The queries are
 * the chunk's rows [s, e) of the batch (row r: token s + r); the keys are any tokens of
 * [0, e): token j's K (after RoPE) at k + j * ld and V at v + j * ld (kv head g from column
 * g * hd on). dkv [j][K | V][kv_dim] (NULL when the batch is one chunk) holds the gradients
 * later chunks send back to tokens' K and V. Token i's ancestors (itself included) are the
 * ascending, disjoint ranges [ranges[2k], ranges[2k+1]] for k in [range_off[i],
 * range_off[i+1]) (struct forest's, on the device): O(T) memory, no ancestor matrix. */
typedef struct forest_keys {
  const float *k, *v;
  int ld;
  float *dkv;
  const int32_t *range_off, *ranges;
  int s, e;
} forest_keys;

/* Copies the K and V of the chunk's rows (qkv[e - s, qkv_dim]) into rows [s, e) of a store
 * [n][K | V][kv_dim]. */
gyre_status forest_keys_put(exec_ctx *ctx, float *store, const float *qkv, int s, int e, const dims *d);

/* Training: att[e - s, q_dim] and lse[e - s, H] of the chunk's rows attending to their ancestors. */
gyre_status forest_attention_forward(exec_ctx *ctx, float *att, float *lse, const float *qkv, const forest_keys *keys,
                                     const dims *d);
/* dqkv[e - s, qkv_dim] (overwritten) from datt[e - s, q_dim]: dq of the chunk's rows, dk and
 * dv of its tokens (plus what later chunks left in keys->dkv); the gradients of earlier
 * tokens' K and V are added into keys->dkv. dsum: scratch [e - s, H]. */
gyre_status forest_attention_backward(exec_ctx *ctx, float *dqkv, const float *datt, const float *qkv,
                                      const float *att, const float *lse, float *dsum, const forest_keys *keys,
                                      const dims *d);

#endif
