/* transformer.cuh - the GPU model (weights + RoPE frequencies in device memory) and the decoder
 * layer's forward pass shared by inference (paged attention) and training (forest
 * attention); the device twin of src/cpu/transformer.h. */
#ifndef GYRE_CUDA_TRANSFORMER_CUH
#define GYRE_CUDA_TRANSFORMER_CUH

#include "../src/activations.h"
#include "cuda_common.cuh"

struct be_model {
  const param_layout *lay; /* owned by the gyre_model */
  dims d;
  exec_ctx ctx;            /* the device holding the weights; its stream moves them */
  float *w;                /* flat parameters */
  float *inv_freq;         /* [hd/2] RoPE inverse frequencies (rope_inv_freq) */
  float rope_scale;        /* the factor cos and sin carry (rope_attention_scaling) */
};

/* Fills io->att (and io->lse) from io->qkv for layer `layer`, on ctx's stream. */
typedef gyre_status (*attend_fn)(void *arg, exec_ctx *ctx, int layer, const layer_io *io);

/* Queues decoder layer `layer` over T rows whose RoPE cos | sin are rope_cs[T, hd] (device,
 * rope_cs of kernels.cuh) on ctx's stream. */
gyre_status layer_forward(const be_model *m, exec_ctx *ctx, int layer, int T, const float *rope_cs,
                          const layer_io *io, attend_fn attend, void *arg);

#endif
