/* emu.cpp - the CPU emulator's runtime: host-memory CUDA calls and the fiber scheduler that
 * runs a kernel's threads (see cuda_runtime.h in this folder). */
#include <stdio.h>
#include <stdlib.h>

#include <map>
#include <vector>

#include "cuda_runtime.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
#endif

/* ---- runtime API on host memory ---- */

static cudaError_t last_error = cudaSuccess;
struct emu_graph {
  std::vector<std::function<void()>> ops;
};
static emu_graph *capture_graph; /* the graph being captured, or NULL */

/* GYRE_EMU_TRACE=1: one line on stderr per kernel run, graph capture and graph launch. */
static bool tracing() {
  static int on = -1;
  if (on < 0) on = getenv("GYRE_EMU_TRACE") != NULL;
  return on != 0;
}

/* Calls that synchronise or allocate are not allowed while a stream is captured. */
static void not_while_capturing(const char *call) {
  if (capture_graph == NULL) return;
  fprintf(stderr, "cuda emulator: %s during stream capture\n", call);
  abort();
}
static std::map<const void *, int> max_dynamic_smem;
static const int EMU_SMS = 132; /* an H100 / H200's SM count, so launch shapes match a real run */
static const size_t DEFAULT_SMEM = 48 * 1024, MAX_SMEM = 227 * 1024;
struct emu_stream {
  int unused;
};

cudaError_t cudaGetDeviceCount(int *count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  snprintf(prop->name, sizeof prop->name, "CUDA emulator on the CPU");
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device) {
  if (device != 0 || attr != cudaDevAttrMultiProcessorCount) return cudaErrorInvalidValue;
  *value = EMU_SMS;
  return cudaSuccess;
}
cudaError_t cudaGetLastError(void) {
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}
const char *cudaGetErrorString(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    default: return "unspecified launch failure";
  }
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags) {
  (void)flags;
  *stream = new emu_stream();
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  (void)stream;
  not_while_capturing("cudaStreamSynchronize");
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
  not_while_capturing("cudaDeviceSynchronize");
  return cudaSuccess;
}
cudaError_t cudaMalloc(void **p, size_t bytes) {
  not_while_capturing("cudaMalloc");
  *p = malloc(bytes);
  if (*p == NULL) return last_error = cudaErrorMemoryAllocation;
  memset(*p, 0xA5, bytes); /* device memory starts as garbage, never as zeros */
  return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
  not_while_capturing("cudaFree");
  free(p);
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t bytes) { return cudaMalloc(p, bytes); }
cudaError_t cudaFreeHost(void *p) { return cudaFree(p); }
/* Runs op now, or records it while a stream is captured. */
static cudaError_t queue(std::function<void()> op) {
  if (emu::capturing()) emu::record(op);
  else op();
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
  (void)kind;
  not_while_capturing("cudaMemcpy");
  if (bytes > 0) memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  (void)stream, (void)kind;
  return queue([=] {
    if (bytes > 0) memmove(dst, src, bytes);
  });
}
cudaError_t cudaMemset(void *p, int value, size_t bytes) {
  not_while_capturing("cudaMemset");
  if (bytes > 0) memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t stream) {
  (void)stream;
  return queue([=] {
    if (bytes > 0) memset(p, value, bytes);
  });
}
cudaError_t cudaMemset2DAsync(void *p, size_t pitch, int value, size_t width, size_t height, cudaStream_t stream) {
  (void)stream;
  return queue([=] {
    for (size_t r = 0; r < height; r++) memset((char *)p + r * pitch, value, width);
  });
}
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  (void)stream, (void)mode;
  if (capture_graph != NULL) return last_error = cudaErrorInvalidValue;
  capture_graph = new emu_graph();
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph) {
  (void)stream;
  if (capture_graph == NULL) return last_error = cudaErrorInvalidValue;
  *graph = capture_graph;
  capture_graph = NULL;
  if (tracing()) fprintf(stderr, "emu: captured a graph of %zu operations\n", (*graph)->ops.size());
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags) {
  (void)flags;
  *exec = new emu_graph(*graph);
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  (void)stream;
  not_while_capturing("cudaGraphLaunch");
  if (tracing()) fprintf(stderr, "emu: graph launch (%zu operations)\n", exec->ops.size());
  for (auto &op : exec->ops) op();
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}
cudaError_t emu_func_set_attribute(const void *func, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || (size_t)value > MAX_SMEM)
    return last_error = cudaErrorInvalidValue;
  max_dynamic_smem[func] = value;
  return cudaSuccess;
}

/* ---- fibers ---- */

/* A context switch that saves only what the ABI says a call preserves (no signal mask
 * system call, unlike swapcontext): pushes the callee-saved registers, stores the stack
 * pointer in *save, loads `to` and pops the other side's. x86-64 System V only. */
#if !defined(__x86_64__)
#error "the CUDA emulator's context switch is written for x86-64"
#endif
extern "C" void emu_switch(void **save, void *to);
asm(".text\n"
    ".globl emu_switch\n"
    ".type emu_switch,@function\n"
    "emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size emu_switch,.-emu_switch\n");

namespace emu {

thread_state *current;
uint3 block_idx;
dim3 block_dim, grid_dim;
void *dynamic_smem;

namespace {

enum state { RUNNABLE, AT_BLOCK_BARRIER, AT_WARP_BARRIER, DONE };
const size_t STACK = 256 * 1024;

struct fiber {
  thread_state ts;
  void *sp; /* saved stack pointer while switched out */
  state st;
  int id;
  char *stack;
  void *asan_fake; /* AddressSanitizer's fake stack of the fiber while switched out */
};

void *scheduler_sp;
std::vector<fiber> fibers;
std::vector<char *> stacks;
std::vector<uint64_t> posted; /* shuffle slots, one per thread */
fiber *running;
void (*body_fn)(void *);
void *body_arg;
const char *kernel_name;
uint64_t shuffle_state;
void *scheduler_fake;                 /* ... and of the scheduler */
const void *main_bottom;              /* the scheduler's (thread's) stack, for the switches back */
size_t main_size;

void die(const char *what) {
  fprintf(stderr, "cuda emulator: kernel %s, block (%u,%u,%u), thread %d: %s\n", kernel_name, block_idx.x, block_idx.y,
          block_idx.z, running ? running->id : -1, what);
  abort();
}

/* Scheduler -> fiber f, until f waits or ends. */
void resume(fiber *f) {
#if EMU_ASAN
  __sanitizer_start_switch_fiber(&scheduler_fake, f->stack, STACK);
#endif
  emu_switch(&scheduler_sp, f->sp);
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(scheduler_fake, NULL, NULL);
#endif
}

/* The running fiber waits in `why` until the scheduler releases it. */
void wait(state why) {
  fiber *f = running;
  f->st = why;
#if EMU_ASAN
  __sanitizer_start_switch_fiber(&f->asan_fake, main_bottom, main_size);
#endif
  emu_switch(&f->sp, scheduler_sp);
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(f->asan_fake, &main_bottom, &main_size);
#endif
}

void entry() {
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(NULL, &main_bottom, &main_size);
#endif
  body_fn(body_arg);
  running->st = DONE;
#if EMU_ASAN
  __sanitizer_start_switch_fiber(NULL, main_bottom, main_size); /* this fiber's stack is done */
#endif
  void *dead;
  emu_switch(&dead, scheduler_sp); /* never resumed */
}

/* Runs one block to completion. */
void run_block(int threads) {
  for (int t = 0; t < threads; t++) {
    fiber &f = fibers[t];
    f.id = t;
    f.ts.idx = uint3{(unsigned)(t % block_dim.x), (unsigned)(t / block_dim.x % block_dim.y),
                     (unsigned)(t / (block_dim.x * block_dim.y))};
    f.st = RUNNABLE;
    f.stack = stacks[t];
    /* a fresh stack as emu_switch leaves one: six saved registers, then the return into
     * entry, which starts as if called (its return address slot 16-byte aligned + 8) */
#if EMU_ASAN
    __asan_unpoison_memory_region(f.stack, STACK); /* frames of the fiber that last ran here */
#endif
    uintptr_t top = ((uintptr_t)f.stack + STACK) & ~(uintptr_t)15;
    void **sp = (void **)(top - 16);
    sp[1] = NULL; /* entry's own return address: it never returns */
    sp[0] = (void *)entry;
    sp -= 6;
    for (int r = 0; r < 6; r++) sp[r] = NULL;
    f.sp = sp;
  }
  std::vector<int> order(threads);
  for (int t = 0; t < threads; t++) order[t] = t;
  for (;;) {
    if (shuffle_state != 0)
      for (int t = threads - 1; t > 0; t--) {
        shuffle_state ^= shuffle_state << 13, shuffle_state ^= shuffle_state >> 7, shuffle_state ^= shuffle_state << 17;
        int k = (int)(shuffle_state % (uint64_t)(t + 1)), tmp = order[t];
        order[t] = order[k], order[k] = tmp;
      }
    bool ran = false;
    for (int k = 0; k < threads; k++) {
      fiber &f = fibers[order[k]];
      if (f.st != RUNNABLE) continue;
      running = &f;
      current = &f.ts;
      resume(&f);
      running = NULL;
      ran = true;
    }
    if (ran) continue;
    int alive = 0, at_block = 0;
    for (int t = 0; t < threads; t++) {
      alive += fibers[t].st != DONE;
      at_block += fibers[t].st == AT_BLOCK_BARRIER;
    }
    if (alive == 0) return;
    bool released = false;
    if (at_block == alive) {
      for (int t = 0; t < threads; t++)
        if (fibers[t].st == AT_BLOCK_BARRIER) fibers[t].st = RUNNABLE;
      released = true;
    } else {
      for (int w = 0; w * 32 < threads; w++) {
        int lanes_alive = 0, lanes_waiting = 0;
        for (int t = w * 32; t < threads && t < w * 32 + 32; t++) {
          lanes_alive += fibers[t].st != DONE;
          lanes_waiting += fibers[t].st == AT_WARP_BARRIER;
        }
        if (lanes_waiting > 0 && lanes_waiting == lanes_alive) {
          for (int t = w * 32; t < threads && t < w * 32 + 32; t++)
            if (fibers[t].st == AT_WARP_BARRIER) fibers[t].st = RUNNABLE;
          released = true;
        }
      }
    }
    if (!released) {
      running = NULL;
      die("deadlock: threads wait at barriers the others never reach (divergent __syncthreads or warp op)");
    }
  }
}

} // namespace

bool capturing() { return capture_graph != NULL; }
void record(std::function<void()> op) { capture_graph->ops.push_back(std::move(op)); }

void syncthreads() { wait(AT_BLOCK_BARRIER); }
void syncwarp() { wait(AT_WARP_BARRIER); }
int lane() { return running->id % 32; }

uint64_t exchange(uint64_t bits, int src_lane) {
  const int id = running->id, base = id - id % 32;
  posted[id] = bits;
  wait(AT_WARP_BARRIER);
  const int src = base + (src_lane & 31);
  if (src >= (int)fibers.size() || src >= (int)(block_dim.x * block_dim.y * block_dim.z))
    die("shuffle from a lane outside the block");
  const uint64_t got = posted[src];
  wait(AT_WARP_BARRIER); /* nobody overwrites its slot before every lane read */
  return got;
}

void launch::run(void (*body)(void *), void *arg) const {
  const unsigned threads = block.x * block.y * block.z;
  kernel_name = name;
  if (tracing())
    fprintf(stderr, "emu: %s grid (%u,%u,%u) block (%u,%u,%u) smem %zu\n", name, grid.x, grid.y, grid.z, block.x, block.y,
            block.z, smem);
  if (threads == 0 || threads > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 ||
      grid.z > 65535 || grid.x > 2147483647u) {
    fprintf(stderr, "cuda emulator: kernel %s: bad launch grid (%u,%u,%u) block (%u,%u,%u)\n", name, grid.x, grid.y,
            grid.z, block.x, block.y, block.z);
    last_error = cudaErrorInvalidConfiguration;
    return;
  }
  if (smem > DEFAULT_SMEM) {
    auto it = max_dynamic_smem.find(func);
    if (it == max_dynamic_smem.end() || (size_t)it->second < smem || smem > MAX_SMEM) {
      fprintf(stderr, "cuda emulator: kernel %s: %zu bytes of dynamic shared memory without the attribute\n", name,
              smem);
      last_error = cudaErrorInvalidValue;
      return;
    }
  }
  if (shuffle_state == 0 && getenv("GYRE_EMU_SHUFFLE") != NULL) shuffle_state = 0x9e3779b97f4a7c15ull;
  while (stacks.size() < threads) stacks.push_back((char *)malloc(STACK));
  fibers.resize(threads > fibers.size() ? threads : fibers.size());
  posted.assign(threads, 0);
  body_fn = body;
  body_arg = arg;
  block_dim = block;
  grid_dim = grid;
  dynamic_smem = smem > 0 ? malloc(smem) : NULL;
  if (dynamic_smem != NULL) memset(dynamic_smem, 0x5A, smem); /* shared memory starts as garbage */
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        block_idx = uint3{x, y, z};
        run_block((int)threads);
      }
  free(dynamic_smem);
  dynamic_smem = NULL;
}

} // namespace emu
