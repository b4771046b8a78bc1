/* transformer.c - the CPU model's weights and the decoder layer forward (llm.c style). */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, madvise */
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "gemm.h"
#include "kernels.h"
#include "transformer.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older kernels refuse it and the pages fault in on first write */
#endif

/* Maps in the pages of [p, p + bytes) ahead of their first write, the threads each taking one
 * part: in the kernel's batched path, not one fault per 4 KiB page as the writes go (a loaded
 * 2 GB model: 0.9 s instead of 1.0-1.3 s on 2 cores, bench:load). */
static void populate(void *p, size_t bytes) {
  const size_t page = 4096, pages = (bytes + page - 1) / page;
#pragma omp parallel num_threads(cpu_threads_for((double)bytes))
  {
    size_t T = (size_t)omp_get_num_threads(), part = (pages + T - 1) / T * page, from = (size_t)omp_get_thread_num() * part;
    if (from < bytes) madvise((char *)p + from, from + part > bytes ? bytes - from : part, MADV_POPULATE_WRITE);
  }
}

gyre_status be_model_create(const param_layout *lay, be_model **out) {
  be_model *m = calloc(1, sizeof *m);
  if (m == NULL) return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "cpu: out of host memory");
  m->lay = lay;
  m->d = lay->d;
  /* Mapped, not memset: pages are zero until first written (a loaded model writes each once);
   * populated at once, in parallel. */
  m->w_bytes = sizeof(float) * (size_t)(lay->n_params > 0 ? lay->n_params : 1);
  void *w = mmap(NULL, m->w_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  m->w = w == MAP_FAILED ? NULL : (float *)w;
  if (m->w != NULL) populate(w, m->w_bytes);

  m->inv_freq = aligned_calloc(sizeof(float) * (size_t)(m->d.hd / 2 > 0 ? m->d.hd / 2 : 1));
  if (m->w == NULL || m->inv_freq == NULL) {
    be_model_free(m);
    return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "cpu: out of host memory for %lld parameters", (long long)lay->n_params);
  }
  rope_inv_freq(m->inv_freq, &m->d);
  m->rope_scale = rope_attention_scaling(&m->d);
  *out = m;
  return GYRE_OK;
}

gyre_status be_model_set_weights(be_model *m, const float *host) {
  memcpy(m->w, host, sizeof(float) * (size_t)m->lay->n_params);
  return GYRE_OK;
}

gyre_status be_model_get_weights(const be_model *m, float *host) {
  memcpy(host, m->w, sizeof(float) * (size_t)m->lay->n_params);
  return GYRE_OK;
}

float *be_model_host_weights(be_model *m) { return m->w; }

gyre_status be_model_set_range(be_model *m, int64_t offset, int64_t n, const float *host) {
  memcpy(m->w + offset, host, sizeof(float) * (size_t)n);
  return GYRE_OK;
}

gyre_status be_model_get_range(const be_model *m, int64_t offset, int64_t n, float *host) {
  memcpy(host, m->w + offset, sizeof(float) * (size_t)n);
  return GYRE_OK;
}

void be_model_free(be_model *m) {
  if (m == NULL) return;
  if (m->w != NULL) munmap(m->w, m->w_bytes);
  free(m->inv_freq);
  free(m);
}

void layer_forward(const be_model *m, int layer, int T, const float *rope_cs, const layer_io *io,
                   attend_fn attend, void *ctx) {
  const dims *d = &m->d;
  const layer_offsets *o = &m->lay->layers[layer];
  const float *w = m->w;
  size_t rows = (size_t)T * d->D;
  rmsnorm_forward(io->h1, io->rstd1, io->x_in, w + o->ln_in, T, d->D, d->eps);
  gemm(T, d->qkv_dim, d->D, io->h1, d->D, 0, w + o->wqkv, d->D, 1, io->qkv, d->qkv_dim, 0);
  if (o->bqkv >= 0) bias_forward(io->qkv, w + o->bqkv, T, d->qkv_dim);
  if (o->qnorm >= 0) head_rmsnorm_forward(io->qkv, io->qk_raw, io->qk_rstd, w + o->qnorm, w + o->knorm, T, d);
  rope(io->qkv, rope_cs, T, d, 0);
  attend(ctx, layer, io);
  memcpy(io->x_mid, io->x_in, sizeof(float) * rows);
  gemm(T, d->D, d->q_dim, io->att, d->q_dim, 0, w + o->wo, d->q_dim, 1, io->x_mid, d->D, 1);
  rmsnorm_forward(io->h2, io->rstd2, io->x_mid, w + o->ln_post, T, d->D, d->eps);
  gemm(T, 2 * d->F, d->D, io->h2, d->D, 0, w + o->wgu, d->D, 1, io->gu, 2 * d->F, 0);
  swiglu_forward(io->act, io->gu, T, d->F);
  if (io->x_out != io->x_mid) memcpy(io->x_out, io->x_mid, sizeof(float) * rows);
  gemm(T, d->D, d->F, io->act, d->F, 0, w + o->wdown, d->F, 1, io->x_out, d->D, 1);
}
