/* activations.c - the layout of a trainer's activation arena (activations.h). */
#include "../activations.h"

float *arena_carve(float *base, size_t *cursor, size_t floats) {
  float *p = base ? base + *cursor : NULL;
  *cursor += (floats + 15) / 16 * 16;
  return p;
}

void train_acts_lay_out(train_acts *a, const dims *d, size_t T, float *base, size_t *cursor) {
  float *stream = arena_carve(base, cursor, (d->L + 1) * T * d->D);
  for (int l = 0; l < d->L; l++) {
    layer_io *io = &a->io[l];
    io->x_in = stream ? stream + l * T * d->D : NULL;
    io->x_out = stream ? stream + (l + 1) * T * d->D : NULL;
    io->h1 = arena_carve(base, cursor, T * d->D);
    io->rstd1 = arena_carve(base, cursor, T);
    io->qkv = arena_carve(base, cursor, T * d->qkv_dim);
    io->att = arena_carve(base, cursor, T * d->q_dim);
    io->lse = arena_carve(base, cursor, T * d->H);
    io->x_mid = arena_carve(base, cursor, T * d->D);
    io->h2 = arena_carve(base, cursor, T * d->D);
    io->rstd2 = arena_carve(base, cursor, T);
    io->gu = arena_carve(base, cursor, T * 2 * d->F);
    io->act = arena_carve(base, cursor, T * d->F);
    io->qk_raw = d->qk_norm ? arena_carve(base, cursor, T * (d->q_dim + d->kv_dim)) : NULL;
    io->qk_rstd = d->qk_norm ? arena_carve(base, cursor, T * (d->H + d->KV)) : NULL;
  }
  a->x_final = stream ? stream + d->L * T * d->D : NULL;
  a->rope_cs = arena_carve(base, cursor, T * d->hd);
  a->hf = arena_carve(base, cursor, T * d->D);
  a->rstdf = arena_carve(base, cursor, T);
  a->logits = arena_carve(base, cursor, T * d->V);
  a->lse_rows = arena_carve(base, cursor, T);
  a->entropy_rows = arena_carve(base, cursor, T);
  a->dres = arena_carve(base, cursor, T * d->D);
  a->dh = arena_carve(base, cursor, T * d->D);
  a->dgu = arena_carve(base, cursor, T * 2 * d->F);
  a->dact = arena_carve(base, cursor, T * d->F);
  a->datt = arena_carve(base, cursor, T * d->q_dim);
  a->dqkv = arena_carve(base, cursor, T * d->qkv_dim);
  a->dsum = arena_carve(base, cursor, T * d->H);
}
