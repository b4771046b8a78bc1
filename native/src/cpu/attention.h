/* attention.h - attention on the CPU: over the paged KV cache (inference) and over the
 * ancestors of a packed forest (training, forward and backward). */
#ifndef GYRE_CPU_ATTENTION_H
#define GYRE_CPU_ATTENTION_H

#include "../backend.h"

/* KV block pool layout: block b, layer l, kv head g:
 *   K at pool + kv_offset(b, l, 0, g) as [hd][B]  (transposed: keys contiguous per dim)
 *   V at pool + kv_offset(b, l, 1, g) as [B][hd]                                       */
static inline size_t kv_offset(const dims *d, int B, int32_t block, int layer, int kind, int g) {
  return ((((size_t)block * d->L + layer) * 2 + kind) * d->KV + g) * (size_t)B * d->hd;
}
static inline size_t kv_block_floats(const dims *d, int B) { return (size_t)d->L * 2 * d->KV * B * d->hd; }

/* Writes the K (after RoPE) and V of every batch row of qkv[rows, qkv_dim] into the pool. */
void kv_store(float *pool, const dims *d, int B, int layer, const fwd_batch *b, const float *qkv);
/* Copies `length` tokens of a block table between the pool and the hand-off payload layout
 * ([layer][K|V][length][KV][hd]); to_payload selects the direction. */
void kv_transfer(float *pool, const dims *d, int B, const int32_t *blocks, int32_t length,
                 float *payload, int to_payload);

/* att[rows, q_dim] = attention of each row's queries over its sequence's cached keys
 * 0..position. scratch: per thread, G * max_pos floats. */
void paged_attention(float *att, const float *qkv, const float *pool, const dims *d, int B, int layer,
                     const fwd_batch *b, float *scratch);

/* Training: att[T, q_dim] and lse[T, H] for token rows attending to their ancestors.
 * kt: scratch [KV][hd][T] (filled here from qkv); scratch: per thread max_depth floats. */
void forest_attention_forward(float *att, float *lse, const float *qkv, float *kt, const forest *f,
                              int T, const dims *d, float *scratch);
/* dqkv[T, qkv_dim] (overwritten) from datt[T, q_dim]; kt, vt scratch [KV][hd][T];
 * dsum scratch [T, H]; scratch per thread 2 * max_depth floats. */
void forest_attention_backward(float *dqkv, const float *datt, const float *qkv, const float *att,
                               const float *lse, float *kt, float *vt, float *dsum, const forest *f,
                               int T, const dims *d, float *scratch);

#endif
