/*
 * cuda_runtime.h (emulator) - just enough of CUDA to run the backend's own .cu sources on
 * the CPU, so their indexing, synchronisation and host logic are tested where no GPU is.
 *
 * Built with g++ as C++ (see cuda.mk: `make cuda-emu`), this header stands in for the real
 * one: a kernel launch runs every block in turn, each of its threads as a fiber; a fiber
 * runs until __syncthreads / __syncwarp / a shuffle, where it waits for the others of its
 * block / warp (a barrier nobody else can reach aborts with a message: divergent
 * barriers). Shared memory is the kernel's function-static storage (blocks run one at a
 * time), dynamic shared memory a fresh buffer per launch of exactly the requested size, so
 * AddressSanitizer sees overruns of both. The runtime calls map to host memory. Not a
 * performance model, and not CUDA's memory model: it cannot see a missing barrier whose
 * race the fiber order happens to hide (GYRE_EMU_SHUFFLE=1 varies that order).
 */
#ifndef GYRE_CUDA_EMU_RUNTIME_H
#define GYRE_CUDA_EMU_RUNTIME_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>

#define GYRE_CUDA_EMU 1

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
  unsigned x, y, z;
};
struct __attribute__((aligned(16))) float4 {
  float x, y, z, w;
};
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

/* ---- runtime API ---- */

typedef enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorLaunchFailure = 719
} cudaError_t;
typedef enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
} cudaMemcpyKind;
typedef enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 } cudaDeviceAttr;
typedef enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 } cudaFuncAttribute;
typedef struct emu_stream *cudaStream_t;
typedef struct emu_graph *cudaGraph_t;
typedef struct emu_graph *cudaGraphExec_t;
typedef enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2
} cudaStreamCaptureMode;
#define cudaStreamNonBlocking 0x01
struct cudaDeviceProp {
  char name[256];
};

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device);
cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t err);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t cudaMemset(void *p, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t stream);
cudaError_t cudaMemset2DAsync(void *p, size_t pitch, int value, size_t width, size_t height, cudaStream_t stream);
/* Stream capture records the launches, copies and sets queued on the stream; a launch of
 * the graph replays them. Anything that would synchronise or allocate while capturing
 * aborts the emulator (on a GPU it invalidates the capture). */
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t emu_func_set_attribute(const void *func, cudaFuncAttribute attr, int value);
template <typename F>
cudaError_t cudaFuncSetAttribute(F *func, cudaFuncAttribute attr, int value) {
  return emu_func_set_attribute((const void *)func, attr, value);
}

/* ---- device side ---- */

namespace emu {

struct thread_state {
  uint3 idx;
};
extern thread_state *current;
extern uint3 block_idx;
extern dim3 block_dim, grid_dim;
extern void *dynamic_smem;

void syncthreads();
/* While a stream is being captured: appends the operation to the graph instead of running it. */
bool capturing();
void record(std::function<void()> op);
void syncwarp();
uint64_t exchange(uint64_t bits, int src_lane); /* every lane of the warp posts, reads lane src */
int lane();

template <typename T>
T shfl(T v, int src) {
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof v);
  bits = exchange(bits, src);
  T r;
  memcpy(&r, &bits, sizeof r);
  return r;
}

struct launch {
  dim3 grid, block;
  size_t smem;
  const void *func;
  const char *name;
  void run(void (*body)(void *), void *arg) const;
};

template <typename... P>
struct launcher {
  void (*kernel)(P...);
  launch config;
  template <typename... A>
  void operator()(A... args) const {
    auto run = [k = kernel, config = config, args...]() {
      auto body = [&]() { k(args...); };
      config.run([](void *b) { (*static_cast<decltype(body) *>(b))(); }, &body);
    };
    if (capturing()) record(run);
    else run();
  }
};

template <typename... P>
launcher<P...> launch_of(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, const char *name) {
  return launcher<P...>{kernel, launch{grid, block, smem, (const void *)kernel, name}};
}

} // namespace emu

#define threadIdx (emu::current->idx)
#define blockIdx (emu::block_idx)
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)

#define LAUNCH(grid, block, smem, stream, ...) \
  emu::launch_of(__VA_ARGS__, dim3(grid), dim3(block), (size_t)(smem), #__VA_ARGS__)
#define DYNAMIC_SMEM(name) float *name = static_cast<float *>(emu::dynamic_smem)

static inline void __syncthreads() { emu::syncthreads(); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
  (void)mask;
  emu::syncwarp();
}
template <typename T>
T __shfl_sync(unsigned mask, T v, int src) {
  (void)mask;
  return emu::shfl(v, src);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  (void)mask;
  return emu::shfl(v, emu::lane() ^ lane_mask);
}
template <typename T>
T __ldg(const T *p) {
  return *p;
}
static inline uint32_t atomicOr(uint32_t *p, uint32_t v) {
  uint32_t old = *p; /* fibers of a launch never run at the same time */
  *p = old | v;
  return old;
}
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }

#endif
