/* transformer.cu - the GPU model's weights and the decoder layer forward (llm.c style). */
#include <stdlib.h>
#include <string.h>

#include "attention.cuh"
#include "gemm.cuh"
#include "kernels.cuh"
#include "transformer.cuh"

extern "C" gyre_status be_model_create(const param_layout *lay, be_model **out) {
  if (lay->d.hd > ATTENTION_MAX_HEAD_DIM)
    return gyre_fail(GYRE_ERR_UNSUPPORTED, "cuda: head_dim %d is above this build's limit of %d", lay->d.hd,
                     ATTENTION_MAX_HEAD_DIM);
  be_model *m = (be_model *)calloc(1, sizeof *m);
  if (m == NULL) return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "cuda: out of host memory");
  m->lay = lay;
  m->d = lay->d;
  const int half = m->d.hd / 2;
  float host[ATTENTION_MAX_HEAD_DIM / 2];
  rope_inv_freq(host, &m->d);
  m->rope_scale = rope_attention_scaling(&m->d);
  gyre_status st = ctx_open(&m->ctx, cuda_selected_device());
  if (st == GYRE_OK) st = dev_alloc((void **)&m->w, sizeof(float) * (size_t)lay->n_params, "model weights");
  if (st == GYRE_OK) {
    cudaError_t err = cudaMemsetAsync(m->w, 0, sizeof(float) * (size_t)lay->n_params, m->ctx.stream);
    if (err != cudaSuccess) st = cuda_fail(err, "cudaMemsetAsync", "be_model_create");
  }
  if (st == GYRE_OK) st = dev_alloc((void **)&m->inv_freq, sizeof(float) * (size_t)half, "RoPE frequencies");
  if (st == GYRE_OK) {
    cudaError_t err = cudaMemcpyAsync(m->inv_freq, host, sizeof(float) * half, cudaMemcpyHostToDevice, m->ctx.stream);
    if (err == cudaSuccess) err = cudaStreamSynchronize(m->ctx.stream);
    if (err != cudaSuccess) st = cuda_fail(err, "cudaMemcpyAsync", "be_model_create");
  }
  if (st != GYRE_OK) {
    be_model_free(m);
    return st;
  }
  *out = m;
  return GYRE_OK;
}

extern "C" gyre_status be_model_set_weights(be_model *m, const float *host) {
  GYRE_CHECK(ctx_enter(&m->ctx));
  CU(cudaMemcpyAsync(m->w, host, sizeof(float) * (size_t)m->lay->n_params, cudaMemcpyHostToDevice, m->ctx.stream));
  return ctx_sync(&m->ctx);
}

extern "C" gyre_status be_model_get_weights(const be_model *m, float *host) {
  GYRE_CHECK(ctx_enter(&m->ctx));
  CU(cudaMemcpyAsync(host, m->w, sizeof(float) * (size_t)m->lay->n_params, cudaMemcpyDeviceToHost, m->ctx.stream));
  return ctx_sync(&m->ctx);
}

extern "C" float *be_model_host_weights(be_model *m) {
  (void)m;
  return NULL; /* device memory: tensors go through be_model_set_range */
}

extern "C" gyre_status be_model_set_range(be_model *m, int64_t offset, int64_t n, const float *host) {
  GYRE_CHECK(ctx_enter(&m->ctx));
  CU(cudaMemcpyAsync(m->w + offset, host, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice, m->ctx.stream));
  return ctx_sync(&m->ctx);
}

extern "C" gyre_status be_model_get_range(const be_model *m, int64_t offset, int64_t n, float *host) {
  GYRE_CHECK(ctx_enter(&m->ctx));
  CU(cudaMemcpyAsync(host, m->w + offset, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost, m->ctx.stream));
  return ctx_sync(&m->ctx);
}

extern "C" void be_model_free(be_model *m) {
  if (m == NULL) return;
  if (ctx_enter(&m->ctx) == GYRE_OK) {
    cudaFree(m->w);
    cudaFree(m->inv_freq);
  }
  ctx_close(&m->ctx);
  free(m);
}

gyre_status layer_forward(const be_model *m, exec_ctx *ctx, int layer, int T, const float *rope_cs,
                          const layer_io *io, attend_fn attend, void *arg) {
  const dims *d = &m->d;
  const layer_offsets *o = &m->lay->layers[layer];
  const float *w = m->w;
  const size_t rows = (size_t)T * d->D;
  GYRE_CHECK(rmsnorm_forward(ctx, io->h1, io->rstd1, io->x_in, w + o->ln_in, T, d->D, d->eps));
  GYRE_CHECK(gemm(ctx, T, d->qkv_dim, d->D, io->h1, d->D, 0, w + o->wqkv, d->D, 1, io->qkv, d->qkv_dim, 0));
  if (o->bqkv >= 0) GYRE_CHECK(bias_forward(ctx, io->qkv, w + o->bqkv, T, d->qkv_dim));
  if (o->qnorm >= 0)
    GYRE_CHECK(head_rmsnorm_forward(ctx, io->qkv, io->qk_raw, io->qk_rstd, w + o->qnorm, w + o->knorm, T, d));
  GYRE_CHECK(rope(ctx, io->qkv, rope_cs, T, d, 0));
  GYRE_CHECK(attend(arg, ctx, layer, io));
  if (io->x_mid != io->x_in)
    CU(cudaMemcpyAsync(io->x_mid, io->x_in, sizeof(float) * rows, cudaMemcpyDeviceToDevice, ctx->stream));
  GYRE_CHECK(gemm(ctx, T, d->D, d->q_dim, io->att, d->q_dim, 0, w + o->wo, d->q_dim, 1, io->x_mid, d->D, 1));
  GYRE_CHECK(rmsnorm_forward(ctx, io->h2, io->rstd2, io->x_mid, w + o->ln_post, T, d->D, d->eps));
  GYRE_CHECK(gemm(ctx, T, 2 * d->F, d->D, io->h2, d->D, 0, w + o->wgu, d->D, 1, io->gu, 2 * d->F, 0));
  GYRE_CHECK(swiglu_forward(ctx, io->act, io->gu, T, d->F));
  if (io->x_out != io->x_mid)
    CU(cudaMemcpyAsync(io->x_out, io->x_mid, sizeof(float) * rows, cudaMemcpyDeviceToDevice, ctx->stream));
  return gemm(ctx, T, d->D, d->F, io->act, d->F, 0, w + o->wdown, d->F, 1, io->x_out, d->D, 1);
}
