/*
 * backend.h - what a backend (src/cpu, cuda/) implements for the shared code in src/common.
 *
 * The shared code validates arguments, owns the KV block bookkeeping (tables, reference
 * counts, pins), the formats and the loss terms, and calls these functions for everything
 * that touches device memory or does arithmetic at scale. All pointers typed `host` are
 * host memory; the other buffers live on the backend's device. Functions return GYRE_OK
 * or the status of gyre_fail(...).
 */
#ifndef GYRE_BACKEND_H
#define GYRE_BACKEND_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct be_model be_model;
typedef struct be_cache be_cache;
typedef struct be_trainer be_trainer;

/* ---- device (the shared code checks device < be_device_count() first) ---- */
const char *be_name(void);
int32_t be_device_count(void);
gyre_status be_device_name(int32_t device, char *buf, size_t cap);
gyre_status be_set_device(int32_t device);
void be_set_num_threads(int32_t n);
int32_t be_num_threads(void); /* the process default */
/* Host threads for the compute the calling thread issues from now on: its model's count
 * (gyre_model_set_threads; 0: the process default). The shared code calls it before every
 * compute call, so calls on different models from different threads each use their own. */
void be_use_threads(int32_t n);
/* The host threads a model with count n (0: the process default) computes with. */
int32_t be_threads_for(int32_t n);

/* ---- model weights (flat layout of internal.h) ---- */
/* Weights start zeroed. */
gyre_status be_model_create(const param_layout *layout, be_model **out);
gyre_status be_model_set_weights(be_model *m, const float *host);
gyre_status be_model_get_weights(const be_model *m, float *host);
/* The weights' host memory when the backend keeps them there (CPU), else NULL (CUDA). */
float *be_model_host_weights(be_model *m);
/* Writes / reads n floats of the flat vector starting at `offset`. */
gyre_status be_model_set_range(be_model *m, int64_t offset, int64_t n, const float *host);
gyre_status be_model_get_range(const be_model *m, int64_t offset, int64_t n, float *host);
void be_model_free(be_model *m);

/* ---- KV block pool ---- */
/* kv_elem: bytes per stored K/V element, 4 (F32) or 2 (F16). */
gyre_status be_cache_create(be_model *m, int32_t block_tokens, int32_t num_blocks, int32_t kv_elem, be_cache **out);
void be_cache_free(be_cache *c);
/* Copies all of block src (every layer, K and V) into block dst. */
gyre_status be_cache_copy_block(be_cache *c, int32_t dst, int32_t src);
/* Reads / writes the first `length` tokens held by the block table `blocks` in the export
 * payload layout of gyre.h: for each layer, K then V, each [length][KV][hd], elements of the
 * pool's own size (kv_elem). */
gyre_status be_cache_read(const be_cache *c, const int32_t *blocks, int32_t length, void *host);
gyre_status be_cache_write(be_cache *c, const int32_t *blocks, int32_t length, const void *host);

/* A ragged inference batch, all arrays on the host. Row r is token tokens[r] of sequence
 * row_seq[r] at position positions[r]; sequence s has seq_len[s] tokens after the append
 * and its block table is blocks[block_off[s] .. block_off[s+1]). The rows of one sequence
 * are consecutive and in position order; all their K/V are written before attention. */
typedef struct fwd_batch {
  int32_t n_rows;
  const int32_t *tokens;
  const int32_t *positions;
  const int32_t *row_seq;
  int32_t n_seqs;
  const int32_t *seq_len;
  const int32_t *block_off;
  const int32_t *blocks;
  int32_t n_out;          /* rows whose logits are wanted ... */
  const int32_t *out_rows;/* ... their indices, ascending */
} fwd_batch;

/* Runs the model over the batch, writing K/V into the cache; logits_host: n_out x V. */
gyre_status be_forward(be_model *m, be_cache *c, const fwd_batch *b, float *logits_host);

/* ---- training ---- */

/* A packed batch of n tokens (global arrays) and its forest, trained in chunks: rows [s, e)
 * in index order, e - s <= the trainer's max_tokens. A chunk's queries attend to ancestors
 * in earlier chunks through the batch's K/V store (each layer's K after RoPE and V of every
 * token, kept from the chunk's forward), so every chunk but the last is computed twice: in
 * the forward of all chunks (log-probs) and again before its backward (checkpointing). */
typedef struct train_batch {
  int32_t n;
  const int32_t *tokens;
  const int32_t *parents;
  const int32_t *positions;
  const struct forest *forest;
  float inv_temperature; /* the loss's 1 / temperature: the logits are scaled by it */
} train_batch;

gyre_status be_trainer_create(be_model *m, int32_t max_tokens, be_trainer **out);
void be_trainer_free(be_trainer *t);
/* Allocates the batch's K/V store (and, when n > max_tokens, room for the gradients later
 * chunks send back to earlier tokens' K and V); be_train_end releases what exceeds a batch of
 * max_tokens. */
gyre_status be_train_begin(be_trainer *t, const train_batch *b);
void be_train_end(be_trainer *t);
/* Forward of the chunk [s, e), chunks in ascending order: stores its K/V, and for every child
 * i of a row p in [s, e): logp_host[i] = log p(tokens[i] | output at p) and entropy_host[i]
 * = entropy of that distribution, p = softmax(logits * inv_temperature). Keeps the chunk's
 * activations. */
gyre_status be_train_forward(be_trainer *t, const train_batch *b, int32_t s, int32_t e, float *logp_host,
                             float *entropy_host);
/* Backward of the chunk [s, e), chunks in descending order after all forwards, of
 * sum_i L_i(logp_i) given dlogp_host[i] = dL_i/dlogp_i (0 for roots and terms not trained;
 * the logits' gradient is taken with respect to the scaled logits: the caller folds
 * inv_temperature into dlogp_host):
 * recomputes the chunk's forward unless it is the one whose activations are kept, adds into
 * the gradient buffer, and adds the gradients of the K/V of tokens before s into the store
 * (those of the chunk's own tokens take what later chunks added). */
gyre_status be_train_backward(be_trainer *t, const train_batch *b, int32_t s, int32_t e, const float *dlogp_host);
/* Bytes: allocated by be_trainer_create (activations of max_tokens rows, gradients, moments,
 * a store of max_tokens tokens), the store per token of a chunked batch, and the store the
 * last batch allocated beyond the fixed one (0 when it fit). */
void be_trainer_memory(const be_trainer *t, int64_t *fixed, int64_t *kv_per_token, int64_t *last_batch);
gyre_status be_grads_zero(be_trainer *t);
gyre_status be_grads_get(const be_trainer *t, float *host);
gyre_status be_grads_set(be_trainer *t, const float *host);
gyre_status be_grads_add(be_trainer *t, const float *host, float scale);
/* AdamW step number `step` (1-based) on the model's weights; grad_norm before clipping. */
gyre_status be_adamw_step(be_trainer *t, const gyre_adamw *opt, int64_t step, float *grad_norm);
gyre_status be_moments_get(const be_trainer *t, float *m_host, float *v_host);
gyre_status be_moments_set(be_trainer *t, const float *m_host, const float *v_host);

#ifdef __cplusplus
}
#endif

#endif
