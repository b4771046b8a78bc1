/* attention.h - attention on the CPU: over the paged KV cache (inference) and over the
 * ancestors of a packed forest (training, forward and backward). */
#ifndef GYRE_CPU_ATTENTION_H
#define GYRE_CPU_ATTENTION_H

#include "../backend.h"

/* The KV block pool, ordered [layer][kv head][K | V][block][B * hd], so that what each of
 * an attention's two passes reads (the scores pass K, the P.V pass V) over the blocks of one
 * (layer, head) is one run of memory (block ids of a sequence are mostly consecutive), which
 * the hardware prefetchers stream. Elements are F32 or F16 (`elem` bytes, half.h):
 *   K of block b at element kv_offset(b, l, 0, g) as [hd][B]  (transposed: keys contiguous)
 *   V of block b at element kv_offset(b, l, 1, g) as [B][hd]                                */
typedef struct kv_pool {
  void *data;
  int B;          /* tokens per block */
  int num_blocks;
  int elem;       /* bytes per element: 4 (F32) or 2 (F16) */
} kv_pool;

static inline size_t kv_offset(const dims *d, const kv_pool *p, int32_t block, int layer, int kind, int g) {
  return ((((size_t)layer * d->KV + g) * 2 + kind) * p->num_blocks + block) * (size_t)p->B * d->hd;
}
static inline size_t kv_pool_elements(const dims *d, int B, int num_blocks) {
  return (size_t)d->L * d->KV * num_blocks * 2 * B * d->hd;
}
/* The F32 or F16 elements of a pool starting at element `at`. */
static inline float *kv_f32(const kv_pool *p, size_t at) { return (float *)p->data + at; }
static inline uint16_t *kv_f16(const kv_pool *p, size_t at) { return (uint16_t *)p->data + at; }

/* Writes the K (after RoPE) and V of every batch row of qkv[rows, qkv_dim] into the pool. */
void kv_store(const kv_pool *pool, const dims *d, int layer, const fwd_batch *b, const float *qkv);
/* Copies `length` tokens of a block table between the pool and the hand-off payload layout
 * ([layer][K|V][length][KV][hd], elements of the pool's size); to_payload selects the direction. */
void kv_transfer(const kv_pool *pool, const dims *d, const int32_t *blocks, int32_t length,
                 void *payload, int to_payload);
/* Copies every layer and head of block src into block dst. */
void kv_copy_block(const kv_pool *pool, const dims *d, int32_t dst, int32_t src);

/* Per-thread scratch (floats) of the attention forward over at most max_runs key runs
 * (paged: blocks of the longest context; forest: ranges of a row) and max_keys keys per
 * query (paged: max_position_embeddings; forest: the batch's tokens). */
size_t attention_scratch_floats(const dims *d, int max_runs, int max_keys);
/* Extra per-thread floats paged attention needs when B is not a multiple of 16. */
size_t paged_staging_floats(const dims *d, int B);

/* att[rows, q_dim] = attention of each row's queries over its sequence's cached keys
 * 0..position. scratch: per thread scratch_floats; tiles: rows + 1 ints. */
void paged_attention(float *att, const float *qkv, const kv_pool *pool, const dims *d, int layer,
                     const fwd_batch *b, float *scratch, size_t scratch_floats, int32_t *tiles);

/* Training keeps, per layer, the K (after RoPE) and V of every token of the batch (index j):
 * as rows, kv[j][K | V][kv_dim] (the scores' right-hand sides in P.V and dq), and transposed
 * per kv head, kt and vt [KV][hd][ld] (one dimension of many keys contiguous, for the
 * scores): ld = forest_ld(n), a row stride of an odd number of 64-byte lines, so the hd rows a
 * 16-key chunk reads fall in different cache sets (with a stride of 1024 floats, 4 KiB, they
 * all fell in one set of the L1), with 16 floats of padding past the end. dkv[j][K | V]
 * (NULL when the batch is one chunk) accumulates the gradient later chunks' queries send
 * back to token j's K and V. */
typedef struct forest_kv {
  float *kv, *kt, *vt, *dkv;
  size_t ld;
} forest_kv;

static inline size_t forest_ld(int n) {
  size_t ld = ((size_t)n + 15) / 16 * 16;
  return ld / 16 % 2 == 0 ? ld + 16 : ld;
}
/* Floats of one layer's kt or vt for n tokens (with the padding). */
static inline size_t forest_transposed_floats(const dims *d, int n) { return (size_t)d->kv_dim * forest_ld(n) + 16; }

/* Per-thread scratch (floats) of the forest attention's forward and backward for a batch
 * with forest f; tiles: forest_tile_ints(rows of a chunk) ints; kchunks: n / 16 + 1 ints. */
size_t forest_scratch_floats(const dims *d, const forest *f);
static inline size_t forest_tile_ints(int rows) { return 4 * (size_t)rows + 4; }

/* Writes the K and V of rows [s, e) (qkv rows 0 .. e - s) into the layer's store. */
void forest_kv_put(const forest_kv *kv, const float *qkv, int s, int e, const dims *d);

/* Training: att[e - s, q_dim] and lse[e - s, H] of the chunk's rows [s, e) (qkv rows 0 ..
 * e - s, their K and V already in the store) attending to their ancestors, any of [0, e). */
void forest_attention_forward(float *att, float *lse, const float *qkv, const forest_kv *kv, const forest *f, int s,
                              int e, const dims *d, float *scratch, size_t scratch_floats, int32_t *tiles);
/* dqkv[e - s, qkv_dim] (overwritten) from datt[e - s, q_dim]: dq of the chunk's rows, dk and
 * dv of its tokens (with what later chunks added into kv->dkv); the gradients of earlier
 * tokens' K and V are added into kv->dkv. dsum: scratch [e - s, H]. */
void forest_attention_backward(float *dqkv, const float *datt, const float *qkv, const float *att,
                               const float *lse, const forest_kv *kv, float *dsum, const forest *f, int s,
                               int e, const dims *d, float *scratch, size_t scratch_floats, int32_t *tiles,
                               int32_t *kchunks);

#endif
