/* transformer.h - the CPU model (weights + RoPE frequencies) and the decoder layer's forward pass
 * shared by inference (paged attention) and training (forest attention). */
#ifndef GYRE_CPU_TRANSFORMER_H
#define GYRE_CPU_TRANSFORMER_H

#include "../activations.h"
#include "../backend.h"

struct be_model {
  const param_layout *lay; /* owned by the gyre_model */
  dims d;
  float *w;                /* flat parameters (an anonymous mapping: zero until written) */
  size_t w_bytes;          /* its length */
  float *inv_freq;         /* [hd/2] RoPE inverse frequencies (rope_inv_freq) */
  float rope_scale;        /* the factor cos and sin carry (rope_attention_scaling) */
};

/* Fills io->att (and io->lse) from io->qkv for layer `layer`. */
typedef void (*attend_fn)(void *ctx, int layer, const layer_io *io);

/* Runs decoder layer `layer` over T rows whose RoPE cos | sin are rope_cs[T, hd] (rope_cs). */
void layer_forward(const be_model *m, int layer, int T, const float *rope_cs, const layer_io *io,
                   attend_fn attend, void *ctx);

#endif
