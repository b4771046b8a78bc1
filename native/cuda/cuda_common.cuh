/*
 * cuda_common.cuh - what every file of the CUDA backend shares: CUDA error mapping, the
 * execution context each handle owns (device, stream, SM count, growable scratch), growable
 * device and pinned host buffers, and small launch helpers.
 *
 * Every be_* entry point first makes its handle's device current (koffi runs long calls on
 * worker threads, and the current device is per host thread), queues its work on the
 * handle's stream and synchronises before returning, so a CUDA failure is reported by the
 * call that caused it.
 */
#ifndef GYRE_CUDA_COMMON_CUH
#define GYRE_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "../src/backend.h"

/* Records a failed CUDA call as the last error and returns GYRE_ERR_OUT_OF_MEMORY for an
 * allocation failure, else GYRE_ERR_DEVICE; the message names the caller and the call. */
gyre_status cuda_fail(cudaError_t err, const char *call, const char *where);

#define CU(call)                                                          \
  do {                                                                    \
    cudaError_t cu_err_ = (call);                                         \
    if (cu_err_ != cudaSuccess) return cuda_fail(cu_err_, #call, __func__); \
  } while (0)

/* After a kernel launch: a bad launch configuration is reported at once. */
#define CU_LAUNCHED() CU(cudaGetLastError())

/* The device gyre_set_device selected for handles created from now on. */
int cuda_selected_device(void);

/* A handle's place to run: its device, its own stream and a scratch area that grows on
 * demand (GEMM split-K partial sums, reductions, hand-off staging). */
typedef struct exec_ctx {
  int device;
  int num_sms;
  cudaStream_t stream;
  void *scratch;
  size_t scratch_bytes;
} exec_ctx;

gyre_status ctx_open(exec_ctx *ctx, int device);
void ctx_close(exec_ctx *ctx);
/* Makes the context's device current on the calling thread. */
gyre_status ctx_enter(const exec_ctx *ctx);
/* Waits for the context's stream; reports an asynchronous kernel failure. */
gyre_status ctx_sync(const exec_ctx *ctx);
/* A scratch area of at least `bytes`, valid until the next ctx_scratch call. */
gyre_status ctx_scratch(exec_ctx *ctx, size_t bytes, void **out);

/* Device buffer of at least `bytes` (contents not kept when it grows). */
typedef struct dev_buf {
  void *p;
  size_t bytes;
} dev_buf;
gyre_status dev_buf_fit(dev_buf *b, size_t bytes);
void dev_buf_free(dev_buf *b);

/* Pinned host buffer of at least `bytes` (contents not kept when it grows). */
gyre_status host_buf_fit(dev_buf *b, size_t bytes);
void host_buf_free(dev_buf *b);

/* A device allocation of n elements (not initialised), or GYRE_ERR_OUT_OF_MEMORY. */
gyre_status dev_alloc(void **p, size_t bytes, const char *what);

static inline unsigned cdiv(int64_t a, int64_t b) { return (unsigned)((a + b - 1) / b); }

/* Blocks for a grid-stride loop over n elements with 256 threads, capped so one wave of a
 * large kernel stays a fixed size (and so reductions over it have a fixed order). */
static inline unsigned grid_for(int64_t n) {
  int64_t b = (n + 255) / 256;
  if (b < 1) b = 1;
  return (unsigned)(b < 65536 ? b : 65536);
}

/* Kernel launch and dynamic shared memory, spelled as macros so that the same sources also
 * build against the CPU emulator of cuda/emu (which defines both first). */
#ifndef LAUNCH
#define LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<(grid), (block), (smem), (stream)>>>
#define DYNAMIC_SMEM(name) extern __shared__ __align__(16) float name[]
#endif

struct sum_op {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct max_op {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

/* Reduction over the 32 lanes of a warp, every lane getting the same value (each butterfly
 * step combines the same two partial results on both lanes, and op commutes). */
template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
template <typename T>
__device__ __forceinline__ T warp_sum(T v) { return warp_reduce(v, sum_op()); }
__device__ __forceinline__ float warp_max(float v) { return warp_reduce(v, max_op()); }

/* Reduction over the block (blockDim.x a multiple of 32), returned to every thread in a
 * fixed order; red is shared memory for 32 values. Every thread of the block must call it. */
template <typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v, T *red, Op op) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_reduce(v, op);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  T total = red[0];
  for (int w = 1; w < warps; w++) total = op(total, red[w]);
  __syncthreads(); /* red may be reused at once */
  return total;
}
template <typename T>
__device__ __forceinline__ T block_sum(T v, T *red) { return block_reduce(v, red, sum_op()); }
__device__ __forceinline__ float block_max(float v, float *red) { return block_reduce(v, red, max_op()); }

#endif
