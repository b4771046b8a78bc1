/* transformer.h - the CPU model (weights, weights.c, and RoPE frequencies) and the decoder layer's
 * forward pass shared by inference (paged attention) and training (forest attention). */
#ifndef GYRE_CPU_TRANSFORMER_H
#define GYRE_CPU_TRANSFORMER_H

#include "../activations.h"
#include "../backend.h"

/* A range of a checkpoint file mapped for one tensor. */
typedef struct file_map {
  void *addr;
  size_t bytes;
} file_map;

/* The weights (weights.c): vectors F32 in w; matrices F32 in w, or (wdtype F16 / BF16) in w16 or
 * a file mapping; tensor[i] is where tensor i's values are. */
struct be_model {
  const param_layout *lay; /* owned by the gyre_model */
  dims d;
  int32_t wdtype;          /* the matrices' element type: GYRE_F32, GYRE_F16, GYRE_BF16 */
  float *w;                /* flat parameters in F32 (an anonymous mapping: zero until written) */
  size_t w_bytes;          /* its length */
  uint16_t *w16;           /* 16-bit: the flat layout in 16 bits (anonymous mapping), else NULL */
  size_t w16_bytes;
  const void **tensor;     /* [n_tensors] */
  file_map *maps;          /* [n_tensors] the file range mapped for a tensor, or {NULL, 0} */
  float *inv_freq;         /* [hd/2] RoPE inverse frequencies (rope_inv_freq) */
  float rope_scale;        /* the factor cos and sin carry (rope_attention_scaling) */
};

/* out[T, N] (+)= x[T, K] . W^T, W the N rows of the matrices of the layout from flat `offset` on
 * (one matrix, or the stacked q|k|v and gate|up), each [rows, K]: a run of them adjacent in
 * memory is one part, and the parts one product (gemm_wt_parts). 16-bit matrices are widened as
 * they are read. */
void linear(const be_model *m, int T, int64_t offset, int N, int K, const float *x, float *out, int accumulate);
/* x[T, D] = the embedding rows of tokens (widened from 16 bits where stored so). */
void embed_rows(const be_model *m, const int32_t *tokens, int T, float *x);

/* Fills io->att (and io->lse) from io->qkv for layer `layer`. */
typedef void (*attend_fn)(void *ctx, int layer, const layer_io *io);

/* Runs decoder layer `layer` over T rows whose RoPE cos | sin are rope_cs[T, hd] (rope_cs). */
void layer_forward(const be_model *m, int layer, int T, const float *rope_cs, const layer_io *io,
                   attend_fn attend, void *ctx);

#endif
