/*
 * activations.h - the decoder's activation buffers, shared by every backend: one layer's
 * tensors (layer_io) and the layout of a trainer's activation arena. The pointers address
 * the backend's memory (host for the CPU, device for CUDA); laying them out is host
 * arithmetic on the arena's base address (common/activations.c).
 */
#ifndef GYRE_ACTIVATIONS_H
#define GYRE_ACTIVATIONS_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The activations of one decoder layer over T rows (row-major, T leading). */
typedef struct layer_io {
  float *x_in;   /* [T, D] residual stream in */
  float *h1;     /* [T, D] input_layernorm(x_in) */
  float *rstd1;  /* [T] */
  float *qkv;    /* [T, qkv_dim] q | k | v, q and k rotated */
  float *att;    /* [T, q_dim] attention output */
  float *lse;    /* [T, H] attention log-sum-exp (training) or NULL */
  float *x_mid;  /* [T, D] x_in + o_proj(att); may alias x_in (one residual stream, in place) */
  float *h2;     /* [T, D] post_attention_layernorm(x_mid) */
  float *rstd2;  /* [T] */
  float *gu;     /* [T, 2F] gate | up */
  float *act;    /* [T, F] silu(gate) * up */
  float *x_out;  /* [T, D] x_mid + down_proj(act); may alias x_in */
  float *qk_raw; /* [T, q_dim + kv_dim] q | k before the per-head norm (training with qk_norm) or NULL */
  float *qk_rstd;/* [T, H + KV] the per-head norm's rstd (training with qk_norm) or NULL */
} layer_io;

/* What a trainer keeps for a micro-batch of T rows, forward and backward: L+1 residual
 * streams (io[l].x_in = stream l, io[l].x_out = stream l+1 = x_final for the last), each
 * layer's saved tensors, the final norm and logits, and the backward's running gradients. */
typedef struct train_acts {
  layer_io *io;         /* [L], allocated by the caller */
  float *x_final;       /* [T, D] the last residual stream */
  float *rope_cs;       /* [T, hd] each row's RoPE cos | sin (rope_rows of internal.h) */
  float *hf, *rstdf;    /* [T, D], [T] final norm */
  float *logits;        /* [T, V] */
  float *lse_rows, *entropy_rows; /* [T] each */
  float *dres, *dh;     /* [T, D] gradient of the residual stream; of a norm's output */
  float *dgu, *dact;    /* [T, 2F], [T, F] */
  float *datt, *dqkv;   /* [T, q_dim], [T, qkv_dim] */
  float *dsum;          /* [T, H] attention backward's rowsum(dout * out) */
} train_acts;

/* Carves `floats` floats (rounded up to 64 bytes) from the arena at *cursor and advances it;
 * with base NULL it only counts (returns NULL). */
float *arena_carve(float *base, size_t *cursor, size_t floats);

/* Lays out the train_acts of T rows from *cursor of the arena at base (NULL: measures only),
 * leaving *cursor after them for the backend's own buffers. a->io must hold d->L entries. */
void train_acts_lay_out(train_acts *a, const dims *d, size_t T, float *base, size_t *cursor);

#ifdef __cplusplus
}
#endif

#endif
