/* device.cu - devices, CUDA errors, execution contexts and buffers of the CUDA backend. */
#include <stdio.h>
#include <string.h>

#include "cuda_common.cuh"

static int selected_device = 0;

gyre_status cuda_fail(cudaError_t err, const char *call, const char *where) {
  gyre_status status = err == cudaErrorMemoryAllocation ? GYRE_ERR_OUT_OF_MEMORY : GYRE_ERR_DEVICE;
  return gyre_fail(status, "%s (cuda): %s failed: %s", where, call, cudaGetErrorString(err));
}

int cuda_selected_device(void) { return selected_device; }

extern "C" const char *be_name(void) { return "cuda"; }

extern "C" int32_t be_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError(); /* no driver or no device: clear the error, report none */
    return 0;
  }
  return n;
}

extern "C" gyre_status be_device_name(int32_t device, char *buf, size_t cap) {
  cudaDeviceProp prop;
  CU(cudaGetDeviceProperties(&prop, device));
  snprintf(buf, cap, "%s", prop.name);
  return GYRE_OK;
}

extern "C" gyre_status be_set_device(int32_t device) {
  selected_device = device;
  return GYRE_OK;
}

/* Compute runs on the device; the calling thread only queues it. */
extern "C" void be_set_num_threads(int32_t n) { (void)n; }
extern "C" int32_t be_num_threads(void) { return 1; }
extern "C" void be_use_threads(int32_t n) { (void)n; }
extern "C" int32_t be_threads_for(int32_t n) { return (void)n, 1; }

gyre_status ctx_open(exec_ctx *ctx, int device) {
  memset(ctx, 0, sizeof *ctx);
  ctx->device = device;
  CU(cudaSetDevice(device));
  CU(cudaDeviceGetAttribute(&ctx->num_sms, cudaDevAttrMultiProcessorCount, device));
  CU(cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking));
  return GYRE_OK;
}

void ctx_close(exec_ctx *ctx) {
  if (cudaSetDevice(ctx->device) != cudaSuccess) return;
  if (ctx->stream != NULL) cudaStreamDestroy(ctx->stream);
  cudaFree(ctx->scratch);
  memset(ctx, 0, sizeof *ctx);
}

gyre_status ctx_enter(const exec_ctx *ctx) {
  CU(cudaSetDevice(ctx->device));
  return GYRE_OK;
}

gyre_status ctx_sync(const exec_ctx *ctx) {
  CU(cudaStreamSynchronize(ctx->stream));
  return GYRE_OK;
}

gyre_status ctx_scratch(exec_ctx *ctx, size_t bytes, void **out) {
  if (bytes > ctx->scratch_bytes) {
    /* the old area may still be read by queued kernels */
    CU(cudaStreamSynchronize(ctx->stream));
    cudaFree(ctx->scratch);
    ctx->scratch = NULL;
    ctx->scratch_bytes = 0;
    size_t grown = bytes + bytes / 4;
    GYRE_CHECK(dev_alloc(&ctx->scratch, grown, "scratch"));
    ctx->scratch_bytes = grown;
  }
  *out = ctx->scratch;
  return GYRE_OK;
}

gyre_status dev_alloc(void **p, size_t bytes, const char *what) {
  *p = NULL;
  cudaError_t err = cudaMalloc(p, bytes > 0 ? bytes : 16);
  if (err != cudaSuccess) {
    *p = NULL;
    cudaGetLastError();
    if (err == cudaErrorMemoryAllocation)
      return gyre_fail(GYRE_ERR_OUT_OF_MEMORY, "cuda: out of device memory allocating %zu bytes for %s", bytes,
                       what);
    return cuda_fail(err, "cudaMalloc", what);
  }
  return GYRE_OK;
}

/* Grows b to at least `bytes` of device (pinned == 0) or pinned host memory. */
static gyre_status buf_fit(dev_buf *b, size_t bytes, int pinned) {
  if (bytes <= b->bytes && b->p != NULL) return GYRE_OK;
  CU(cudaDeviceSynchronize()); /* queued work may still use the old buffer */
  if (pinned) cudaFreeHost(b->p);
  else cudaFree(b->p);
  b->p = NULL;
  b->bytes = 0;
  const size_t grown = bytes + bytes / 4 + 64;
  if (pinned) CU(cudaMallocHost(&b->p, grown));
  else GYRE_CHECK(dev_alloc(&b->p, grown, "workspace"));
  b->bytes = grown;
  return GYRE_OK;
}

gyre_status dev_buf_fit(dev_buf *b, size_t bytes) { return buf_fit(b, bytes, 0); }
gyre_status host_buf_fit(dev_buf *b, size_t bytes) { return buf_fit(b, bytes, 1); }

void dev_buf_free(dev_buf *b) {
  cudaFree(b->p);
  b->p = NULL;
  b->bytes = 0;
}

void host_buf_free(dev_buf *b) {
  cudaFreeHost(b->p);
  b->p = NULL;
  b->bytes = 0;
}
