/* transformer.cuh - the GPU model (weights + RoPE tables in device memory) and the decoder
 * layer's forward pass shared by inference (paged attention) and training (forest
 * attention); the device twin of src/cpu/transformer.h. */
#ifndef GYRE_CUDA_TRANSFORMER_CUH
#define GYRE_CUDA_TRANSFORMER_CUH

#include "cuda_common.cuh"

struct be_model {
  const param_layout *lay; /* owned by the gyre_model */
  dims d;
  exec_ctx ctx;            /* the device holding the weights; its stream moves them */
  float *w;                /* flat parameters */
  float *rope_cos, *rope_sin; /* [max_pos, hd/2] */
};

/* The activations of one decoder layer over T rows (device, row-major, T leading). */
typedef struct layer_io {
  float *x_in;   /* [T, D] residual stream in */
  float *h1;     /* [T, D] input_layernorm(x_in) */
  float *rstd1;  /* [T] */
  float *qkv;    /* [T, qkv_dim] q | k | v, q and k rotated */
  float *att;    /* [T, q_dim] attention output */
  float *lse;    /* [T, H] attention log-sum-exp (training) or NULL */
  float *x_mid;  /* [T, D] x_in + o_proj(att); may alias x_in (inference: one residual stream) */
  float *h2;     /* [T, D] post_attention_layernorm(x_mid) */
  float *rstd2;  /* [T] */
  float *gu;     /* [T, 2F] gate | up */
  float *act;    /* [T, F] silu(gate) * up */
  float *x_out;  /* [T, D] x_mid + down_proj(act); may alias x_in */
} layer_io;

/* Fills io->att (and io->lse) from io->qkv for layer `layer`, on ctx's stream. */
typedef gyre_status (*attend_fn)(void *arg, exec_ctx *ctx, int layer, const layer_io *io);

/* Queues decoder layer `layer` over T rows at `positions` (device) on ctx's stream. */
gyre_status layer_forward(const be_model *m, exec_ctx *ctx, int layer, int T, const int32_t *positions,
                          const layer_io *io, attend_fn attend, void *arg);

#endif
