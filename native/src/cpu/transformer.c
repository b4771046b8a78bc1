/* transformer.c - the CPU decoder layer forward (llm.c style). */
#include <string.h>

#include "gemm.h"
#include "kernels.h"
#include "transformer.h"

void layer_forward(const be_model *m, int layer, int T, const float *rope_cs, const layer_io *io,
                   attend_fn attend, void *ctx) {
  const dims *d = &m->d;
  const layer_offsets *o = &m->lay->layers[layer];
  const float *w = m->w; /* the vectors: norms, biases */
  size_t rows = (size_t)T * d->D;
  rmsnorm_forward(io->h1, io->rstd1, io->x_in, w + o->ln_in, T, d->D, d->eps);
  linear(m, T, o->wqkv, d->qkv_dim, d->D, io->h1, io->qkv, 0);
  if (o->bqkv >= 0) bias_forward(io->qkv, w + o->bqkv, T, d->qkv_dim);
  if (o->qnorm >= 0) head_rmsnorm_forward(io->qkv, io->qk_raw, io->qk_rstd, w + o->qnorm, w + o->knorm, T, d);
  rope(io->qkv, rope_cs, T, d, 0);
  attend(ctx, layer, io);
  memcpy(io->x_mid, io->x_in, sizeof(float) * rows);
  linear(m, T, o->wo, d->D, d->q_dim, io->att, io->x_mid, 1);
  rmsnorm_forward(io->h2, io->rstd2, io->x_mid, w + o->ln_post, T, d->D, d->eps);
  linear(m, T, o->wgu, 2 * d->F, d->D, io->h2, io->gu, 0);
  swiglu_forward(io->act, io->gu, T, d->F);
  if (io->x_out != io->x_mid) memcpy(io->x_out, io->x_mid, sizeof(float) * rows);
  linear(m, T, o->wdown, d->D, d->F, io->act, io->x_out, 1);
}
