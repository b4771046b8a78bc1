/**
 * The native engine library (`native/include/gyre.h`) loaded through koffi: which backend,
 * the C function table, and the queues native calls go through.
 *
 * Backend choice: `GYRE_BACKEND=cpu|cuda` forces one; otherwise the CUDA library is used when
 * `native/build/libgyre_cuda.so` loads and the CUDA driver (`libcuda.so.1`, asked through
 * koffi) reports a device, else the CPU library. Paths resolve from this module's location.
 *
 * Queues: each model has its own (`queue()`), which its caches and trainers share, so the
 * calls on one model never overlap (its C handles are not thread-safe) while calls on
 * different models run at the same time on different threads, each with its model's thread
 * count (gyre.h). Functions of no handle (configs, layouts, checksums) take no queue; a
 * model's creation takes the library's device lock, so no other creation changes the device
 * selection in between. Long calls run as koffi async calls on the libuv pool, so the event
 * loop keeps turning (heartbeats, NATS) while the engine computes; their argument buffers are
 * held until the call returns and are copied off the V8 heap first when small (V8 may move
 * small on-heap typed arrays). A failure's message is the failed call's own: a sync call reads
 * its thread's (gyre_last_error), an async one the failure koffi's carried-back errno numbers
 * (gyre_error_message), so two models failing at once never swap messages.
 */
import koffi, { type LibraryHandle } from "koffi"
import { existsSync } from "node:fs"
import { fileURLToPath } from "node:url"
import { Effect, Schema, Semaphore } from "effect"

export type Backend = "cpu" | "cuda"

/** A native call failed; `code` is the gyre_status name, `message` the library's message. */
export class EngineError extends Schema.TaggedError<EngineError>()("EngineError", {
  op: Schema.String,
  code: Schema.String,
  message: Schema.String
}) {}

/** The KV cache has too few free blocks for the request; nothing was changed (preempt or hand off). */
export class OutOfKvBlocks extends Schema.TaggedError<OutOfKvBlocks>()("OutOfKvBlocks", {
  op: Schema.String,
  message: Schema.String
}) {}

export type NativeError = EngineError | OutOfKvBlocks

/* ---- C types ---- */

/* OpenMP threads sleep between parallel regions instead of spinning: on a machine shared
 * with other processes (nats-server, harnesses, other workers) spinning threads starve the
 * one that holds the work, which measured 3x slower under load. libgomp reads this when the
 * library is loaded; set OMP_WAIT_POLICY=active to spin. */
process.env.OMP_WAIT_POLICY ??= "passive"

/* Async calls run on koffi's own stack; give OpenMP's master thread room (a no-op when
 * another module already fixed koffi's settings by loading a library). */
try {
  koffi.config({ ...koffi.config(), async_stack_size: 1 << 20 })
} catch {
  /* keep koffi's defaults */
}

/* C types, registered by name for the prototypes below. */
koffi.opaque("gyre_model")
koffi.opaque("gyre_cache")
koffi.opaque("gyre_trainer")
koffi.struct("gyre_config", {
  vocab_size: "int32_t",
  hidden_size: "int32_t",
  intermediate_size: "int32_t",
  num_hidden_layers: "int32_t",
  num_attention_heads: "int32_t",
  num_key_value_heads: "int32_t",
  max_position_embeddings: "int32_t",
  tie_word_embeddings: "int32_t",
  rms_norm_eps: "double",
  rope_theta: "double",
  rope_type: "int32_t",
  rope_original_max_position_embeddings: "int32_t",
  rope_factor: "double",
  rope_low_freq_factor: "double",
  rope_high_freq_factor: "double",
  head_dim: "int32_t",
  qkv_bias: "int32_t",
  qk_norm: "int32_t",
  rope_truncate: "int32_t",
  rope_beta_fast: "double",
  rope_beta_slow: "double",
  rope_mscale: "double",
  rope_mscale_all_dim: "double",
  rope_attention_factor: "double"
})
koffi.struct("gyre_cache_stats", {
  block_tokens: "int32_t",
  num_blocks: "int32_t",
  used_blocks: "int32_t",
  free_blocks: "int32_t",
  pinned_blocks: "int32_t",
  num_sequences: "int32_t",
  kv_dtype: "int32_t",
  bytes_per_token: "int64_t",
  bytes_total: "int64_t"
})
koffi.struct("gyre_sampling", { temperature: "float", top_p: "float", seed: "uint64_t" })
koffi.struct("gyre_loss_config", {
  kind: "int32_t",
  clip_eps_low: "float",
  clip_eps_high: "float",
  is_cap: "float",
  current_version: "int32_t",
  max_staleness: "int32_t",
  proximal_current: "int32_t",
  temperature: "float"
})
koffi.struct("gyre_train_stats", {
  loss: "double",
  weight_sum: "double",
  entropy: "double",
  mean_logprob: "double",
  mean_ratio: "double",
  clip_fraction: "double",
  mean_is_weight: "double",
  truncated_fraction: "double",
  trained_tokens: "int32_t",
  stale_tokens: "int32_t"
})
koffi.struct("gyre_trainer_memory_info", { fixed_bytes: "int64_t", kv_bytes_per_token: "int64_t", last_batch_bytes: "int64_t" })
koffi.struct("gyre_adamw", { lr: "float", beta1: "float", beta2: "float", eps: "float", weight_decay: "float", max_grad_norm: "float" })

/** GYRE_ABI_VERSION of native/include/gyre.h that these prototypes and structs match. */
const ABI_VERSION = 9

/** A native handle koffi hands back (an opaque pointer), branded by the C type it points to. */
declare const handleOf: unique symbol
export type Handle<T extends string> = { readonly [handleOf]: T }
export type ModelHandle = Handle<"gyre_model">
export type CacheHandle = Handle<"gyre_cache">
export type TrainerHandle = Handle<"gyre_trainer">

/** An `_Out_` scalar: koffi writes the value into element 0. */
type Out<A = number> = Array<A>
/** A C struct passed by value's fields (`gyre_config`, `gyre_adamw`, ...: koffi checks them against the struct). */
type CStruct = { readonly [field: string]: unknown }
/** A C struct filled by the call: a `structBuffer` (read with `readStruct`), or an object koffi fills (`_Out_`). */
type StructOut = Buffer | Record<string, number>
/** A `uint64_t` argument (koffi takes a number or a bigint). */
type U64 = number | bigint

/** Each native function's JavaScript arguments and result, as `prototypes` declares it in C. */
export interface Signatures {
  last_error: (buf: Uint8Array, cap: number) => number
  error_message: (code: number, buf: Uint8Array, cap: number) => number
  status_name: (status: number) => string
  abi_version: () => number
  backend: () => string
  device_count: () => number
  device_name: (device: number, buf: Uint8Array, cap: number) => number
  set_device: (device: number) => number
  set_num_threads: (n: number) => void
  num_threads: () => number
  config_check: (cfg: CStruct) => number
  param_count: (cfg: CStruct, count: Out) => number
  param_tensor_count: (cfg: CStruct, count: Out) => number
  param_tensor: (cfg: CStruct, index: number, name: Uint8Array, cap: number, offset: Out, rank: Out, shape: BigInt64Array) => number
  model_create: (cfg: CStruct, seed: U64, std: number, out: Out<ModelHandle | null>) => number
  model_load: (cfg: CStruct, buf: Uint8Array, len: number, out: Out<ModelHandle | null>) => number
  model_create_zero: (cfg: CStruct, weightDtype: number, out: Out<ModelHandle | null>) => number
  model_weight_dtype: (m: ModelHandle, dtype: Out) => number
  model_read_tensor: (m: ModelHandle, index: number, dtype: number, path: string, offset: number, nbytes: number) => number
  model_write_tensor: (m: ModelHandle, index: number, dtype: number, out: Uint8Array, cap: number) => number
  rope_inv_freq: (cfg: CStruct, out: Float32Array, n: number) => number
  rope_attention_scaling: (cfg: CStruct, out: Float32Array) => number
  model_save: (m: ModelHandle, out: Uint8Array | null, cap: number, len: Out) => number
  model_get_weights: (m: ModelHandle, out: Float32Array, n: number) => number
  model_set_weights: (m: ModelHandle, w: Float32Array, n: number) => number
  model_free: (m: ModelHandle) => void
  model_set_threads: (m: ModelHandle, n: number) => number
  model_threads: (m: ModelHandle, n: Out) => number
  cache_create: (m: ModelHandle, blockTokens: number, numBlocks: number, kvDtype: number, out: Out<CacheHandle | null>) => number
  cache_stats: (c: CacheHandle, out: StructOut) => number
  cache_free: (c: CacheHandle) => void
  seq_create: (c: CacheHandle, seq: Out) => number
  seq_fork: (c: CacheHandle, parent: number, child: Out) => number
  seq_fork_prefix: (c: CacheHandle, parent: number, length: number, child: Out) => number
  seq_free: (c: CacheHandle, seq: number) => number
  seq_length: (c: CacheHandle, seq: number, len: Out) => number
  seq_blocks: (c: CacheHandle, seq: number, blocks: Out) => number
  seq_pin: (c: CacheHandle, seq: number) => number
  seq_unpin: (c: CacheHandle, seq: number) => number
  seq_export: (c: CacheHandle, seq: number, out: Uint8Array | null, cap: number, len: Out) => number
  seq_import: (c: CacheHandle, buf: Uint8Array, len: number, seq: Out) => number
  checksum: (data: Uint8Array, len: number) => U64
  sample: (vocab: number, logits: Float32Array, params: CStruct, counter: U64, token: Out, logprob: Out) => number
  forward: (
    c: CacheHandle,
    nSeqs: number,
    seqIds: Int32Array,
    nNew: Int32Array,
    tokens: Int32Array,
    logitsMode: number,
    logits: Float32Array | null,
    sampling: ReadonlyArray<CStruct> | null,
    sampled: Int32Array | null,
    sampledLogprobs: Float32Array | null
  ) => number
  trainer_create: (m: ModelHandle, maxTokens: number, out: Out<TrainerHandle | null>) => number
  trainer_free: (t: TrainerHandle) => void
  train_batch: (
    t: TrainerHandle,
    n: number,
    tokens: Int32Array,
    parents: Int32Array,
    positions: Int32Array,
    weights: Float32Array,
    advantages: Float32Array,
    behaviour: Float32Array,
    proximal: Float32Array,
    versions: Int32Array,
    loss: CStruct,
    backward: number,
    tokenLogprobs: Float32Array,
    stats: StructOut
  ) => number
  trainer_memory: (t: TrainerHandle, out: StructOut) => number
  zero_grads: (t: TrainerHandle) => number
  get_grads: (t: TrainerHandle, out: Float32Array, n: number) => number
  set_grads: (t: TrainerHandle, g: Float32Array, n: number) => number
  add_grads: (t: TrainerHandle, g: Float32Array, n: number, scale: number) => number
  trainer_step: (t: TrainerHandle, opt: CStruct, gradNorm: Out) => number
  step_count: (t: TrainerHandle, steps: Out<number | bigint>) => number
  save_optimizer: (t: TrainerHandle, out: Uint8Array | null, cap: number, len: Out) => number
  load_optimizer: (t: TrainerHandle, buf: Uint8Array, len: number) => number
}

const prototypes: { readonly [F in keyof Signatures]: string } = {
  last_error: "size_t gyre_last_error(_Out_ uint8_t *buf, size_t cap)",
  error_message: "size_t gyre_error_message(int32_t code, _Out_ uint8_t *buf, size_t cap)",
  status_name: "const char *gyre_status_name(int32_t status)",
  abi_version: "int32_t gyre_abi_version(void)",
  backend: "const char *gyre_backend(void)",
  device_count: "int32_t gyre_device_count(void)",
  device_name: "int32_t gyre_device_name(int32_t device, _Out_ uint8_t *buf, size_t cap)",
  set_device: "int32_t gyre_set_device(int32_t device)",
  set_num_threads: "void gyre_set_num_threads(int32_t n)",
  num_threads: "int32_t gyre_num_threads(void)",
  config_check: "int32_t gyre_config_check(const gyre_config *cfg)",
  param_count: "int32_t gyre_param_count(const gyre_config *cfg, _Out_ int64_t *count)",
  param_tensor_count: "int32_t gyre_param_tensor_count(const gyre_config *cfg, _Out_ int32_t *count)",
  param_tensor:
    "int32_t gyre_param_tensor(const gyre_config *cfg, int32_t index, _Out_ uint8_t *name, size_t cap, _Out_ int64_t *offset, _Out_ int32_t *rank, int64_t *shape)",
  model_create: "int32_t gyre_model_create(const gyre_config *cfg, uint64_t seed, float std, _Out_ gyre_model **out)",
  model_load: "int32_t gyre_model_load(const gyre_config *cfg, const uint8_t *buf, size_t len, _Out_ gyre_model **out)",
  model_create_zero: "int32_t gyre_model_create_zero(const gyre_config *cfg, int32_t weight_dtype, _Out_ gyre_model **out)",
  model_weight_dtype: "int32_t gyre_model_weight_dtype(const gyre_model *m, _Out_ int32_t *dtype)",
  model_read_tensor:
    "int32_t gyre_model_read_tensor(gyre_model *m, int32_t index, int32_t dtype, const char *path, int64_t offset, int64_t nbytes)",
  model_write_tensor: "int32_t gyre_model_write_tensor(const gyre_model *m, int32_t index, int32_t dtype, uint8_t *out, size_t cap)",
  rope_inv_freq: "int32_t gyre_rope_inv_freq(const gyre_config *cfg, float *out, int32_t n)",
  rope_attention_scaling: "int32_t gyre_rope_attention_scaling(const gyre_config *cfg, float *out)",
  model_save: "int32_t gyre_model_save(const gyre_model *m, uint8_t *out, size_t cap, _Out_ size_t *len)",
  model_get_weights: "int32_t gyre_model_get_weights(const gyre_model *m, float *out, int64_t n)",
  model_set_weights: "int32_t gyre_model_set_weights(gyre_model *m, const float *w, int64_t n)",
  model_free: "void gyre_model_free(gyre_model *m)",
  model_set_threads: "int32_t gyre_model_set_threads(gyre_model *m, int32_t n)",
  model_threads: "int32_t gyre_model_threads(const gyre_model *m, _Out_ int32_t *n)",
  cache_create: "int32_t gyre_cache_create(gyre_model *m, int32_t block_tokens, int32_t num_blocks, int32_t kv_dtype, _Out_ gyre_cache **out)",
  cache_stats: "int32_t gyre_cache_stats_get(const gyre_cache *c, _Out_ gyre_cache_stats *out)",
  cache_free: "void gyre_cache_free(gyre_cache *c)",
  seq_create: "int32_t gyre_seq_create(gyre_cache *c, _Out_ int32_t *seq)",
  seq_fork: "int32_t gyre_seq_fork(gyre_cache *c, int32_t parent, _Out_ int32_t *child)",
  seq_fork_prefix: "int32_t gyre_seq_fork_prefix(gyre_cache *c, int32_t parent, int32_t length, _Out_ int32_t *child)",
  seq_free: "int32_t gyre_seq_free(gyre_cache *c, int32_t seq)",
  seq_length: "int32_t gyre_seq_length(const gyre_cache *c, int32_t seq, _Out_ int32_t *len)",
  seq_blocks: "int32_t gyre_seq_blocks(const gyre_cache *c, int32_t seq, _Out_ int32_t *blocks)",
  seq_pin: "int32_t gyre_seq_pin(gyre_cache *c, int32_t seq)",
  seq_unpin: "int32_t gyre_seq_unpin(gyre_cache *c, int32_t seq)",
  seq_export: "int32_t gyre_seq_export(const gyre_cache *c, int32_t seq, uint8_t *out, size_t cap, _Out_ size_t *len)",
  seq_import: "int32_t gyre_seq_import(gyre_cache *c, const uint8_t *buf, size_t len, _Out_ int32_t *seq)",
  checksum: "uint64_t gyre_checksum(const uint8_t *data, size_t len)",
  sample:
    "int32_t gyre_sample(int32_t vocab, const float *logits, const gyre_sampling *params, uint64_t counter, _Out_ int32_t *token, _Out_ float *logprob)",
  forward:
    "int32_t gyre_forward(gyre_cache *c, int32_t n_seqs, const int32_t *seq_ids, const int32_t *n_new, const int32_t *tokens, int32_t logits_mode, float *logits, const gyre_sampling *sampling, int32_t *sampled, float *sampled_logprobs)",
  trainer_create: "int32_t gyre_trainer_create(gyre_model *m, int32_t max_tokens, _Out_ gyre_trainer **out)",
  trainer_free: "void gyre_trainer_free(gyre_trainer *t)",
  train_batch:
    "int32_t gyre_train_batch(gyre_trainer *t, int32_t n, const int32_t *tokens, const int32_t *parents, const int32_t *positions, const float *weights, const float *advantages, const float *behaviour, const float *proximal, const int32_t *versions, const gyre_loss_config *loss, int32_t backward, float *token_logprobs, gyre_train_stats *stats)",
  trainer_memory: "int32_t gyre_trainer_memory(const gyre_trainer *t, _Out_ gyre_trainer_memory_info *out)",
  zero_grads: "int32_t gyre_trainer_zero_grads(gyre_trainer *t)",
  get_grads: "int32_t gyre_trainer_get_grads(const gyre_trainer *t, float *out, int64_t n)",
  set_grads: "int32_t gyre_trainer_set_grads(gyre_trainer *t, const float *g, int64_t n)",
  add_grads: "int32_t gyre_trainer_add_grads(gyre_trainer *t, const float *g, int64_t n, float scale)",
  trainer_step: "int32_t gyre_trainer_step(gyre_trainer *t, const gyre_adamw *opt, _Out_ float *grad_norm)",
  step_count: "int32_t gyre_trainer_step_count(const gyre_trainer *t, _Out_ int64_t *steps)",
  save_optimizer: "int32_t gyre_trainer_save_optimizer(const gyre_trainer *t, uint8_t *out, size_t cap, _Out_ size_t *len)",
  load_optimizer: "int32_t gyre_trainer_load_optimizer(gyre_trainer *t, const uint8_t *buf, size_t len)"
}

export type FunctionName = keyof Signatures
/** The arguments of native function `F`. */
export type ArgsOf<F extends FunctionName> = Parameters<Signatures[F]>
type NativeFunction = ReturnType<LibraryHandle["func"]>

/** Native calls, through a queue (one model's: they never overlap) or none (functions of no handle). */
export interface NativeCalls {
  /** Runs `fn` on the libuv pool (for long calls); fails on a non-zero status. */
  readonly run: <F extends FunctionName>(fn: F, args: ArgsOf<F>) => Effect.Effect<void, NativeError>
  /** Runs `fn` on the calling thread (for quick calls); fails on a non-zero status. */
  readonly runSync: <F extends FunctionName>(fn: F, args: ArgsOf<F>) => Effect.Effect<void, NativeError>
  /** Calls a function that cannot fail (void or a plain value). */
  readonly value: <F extends FunctionName>(fn: F, args: ArgsOf<F>) => Effect.Effect<ReturnType<Signatures[F]>>
}

/** A loaded library: its backend, its devices' names and its functions (the unqueued calls). */
export interface NativeLibrary extends NativeCalls {
  readonly backend: Backend
  readonly path: string
  readonly devices: ReadonlyArray<string>
  /** A new queue, for one model and its caches and trainers. */
  readonly queue: () => NativeCalls
  /**
   * Selects `device` (gyre_set_device) and runs `fn` (a model's create) as `run` does, both
   * under the device lock, so no other creation changes the selection in between; an unknown
   * device fails with gyre_set_device's message.
   */
  readonly runOnDevice: <F extends FunctionName>(device: number, fn: F, args: ArgsOf<F>) => Effect.Effect<void, NativeError>
}

/** A zeroed buffer for a C struct written by an async call; read it with `readStruct`. */
export const structBuffer = (type: string): Buffer => Buffer.alloc(koffi.sizeof(type))
export const readStruct = (buf: Buffer, type: string): Record<string, number> => koffi.decode(buf, type) as Record<string, number>

/* ---- off-heap buffers ---- */

/** A fresh Int32Array backed by its own ArrayBuffer (off the V8 heap). */
export const int32s = (xs: ArrayLike<number>): Int32Array => {
  const a = new Int32Array(new ArrayBuffer(Math.max(4, xs.length * 4)), 0, xs.length)
  a.set(xs)
  return a
}

/** The array itself when V8 keeps it off-heap (over 64 bytes), else an off-heap copy. */
const offHeap = (value: unknown): unknown => {
  if (ArrayBuffer.isView(value) && value.byteLength <= 64) {
    const copy = new Uint8Array(new ArrayBuffer(Math.max(8, value.byteLength)))
    copy.set(new Uint8Array(value.buffer, value.byteOffset, value.byteLength))
    const Ctor = value.constructor as new (b: ArrayBuffer, o: number, n: number) => ArrayBufferView
    const width = "BYTES_PER_ELEMENT" in value ? (value as unknown as { BYTES_PER_ELEMENT: number }).BYTES_PER_ELEMENT : 1
    return new Ctor(copy.buffer, 0, value.byteLength / width)
  }
  return value
}

/** Copies an off-heap copy's contents back into the caller's array after an async call. */
const copyBack = (original: unknown, passed: unknown): void => {
  if (original !== passed && ArrayBuffer.isView(original) && ArrayBuffer.isView(passed)) {
    new Uint8Array(original.buffer, original.byteOffset, original.byteLength).set(
      new Uint8Array(passed.buffer, passed.byteOffset, passed.byteLength)
    )
  }
}

/** Arguments of calls in flight, kept reachable until the native side is done with them. */
const inFlight = new Set<ReadonlyArray<unknown>>()

/* ---- loading ---- */

const libraryPath = (backend: Backend): string =>
  fileURLToPath(new URL(`../../native/build/libgyre_${backend}.so`, import.meta.url))

const readString = (fill: (buf: Buffer) => unknown): string => {
  const buf = Buffer.alloc(1024)
  fill(buf)
  const end = buf.indexOf(0)
  return buf.subarray(0, end < 0 ? buf.length : end).toString("utf8")
}

/** Names of the devices the CUDA driver sees, or none when there is no driver or device. */
export const cudaDriverDevices = (): ReadonlyArray<string> => {
  let driver: LibraryHandle
  try {
    driver = koffi.load("libcuda.so.1")
  } catch {
    return []
  }
  try {
    const cuInit = driver.func("int cuInit(unsigned int flags)")
    const cuDeviceGetCount = driver.func("int cuDeviceGetCount(_Out_ int *count)")
    const cuDeviceGet = driver.func("int cuDeviceGet(_Out_ int *device, int ordinal)")
    const cuDeviceGetName = driver.func("int cuDeviceGetName(_Out_ uint8_t *name, int len, int device)")
    if (cuInit(0) !== 0) return []
    const count = [0]
    if (cuDeviceGetCount(count) !== 0) return []
    return Array.from({ length: count[0]! }, (_, i) => {
      const dev = [0]
      cuDeviceGet(dev, i)
      return readString((buf) => cuDeviceGetName(buf, buf.length, dev[0]!))
    })
  } catch {
    return []
  }
}

const loaded = new Map<Backend, NativeLibrary>()

const open = (backend: Backend): NativeLibrary => {
  const cached = loaded.get(backend)
  if (cached !== undefined) return cached
  const path = libraryPath(backend)
  const handle = koffi.load(path)
  const fns = Object.fromEntries(
    Object.entries(prototypes).map(([name, proto]) => [name, handle.func(proto)])
  ) as Record<FunctionName, NativeFunction>
  const abi = fns.abi_version() as number
  if (abi !== ABI_VERSION) throw new Error(`${path} has ABI version ${abi}, this binding needs ${ABI_VERSION}: rebuild it (make -C native)`)
  const statusName = (rc: number): string => fns.status_name(rc) as string
  const fail = (fn: FunctionName, rc: number, message: string): Effect.Effect<never, NativeError> =>
    Effect.fail(
      rc === 3 ? new OutOfKvBlocks({ op: `gyre_${fn}`, message }) : new EngineError({ op: `gyre_${fn}`, code: statusName(rc), message })
    )
  /* the failure an async call's errno numbers (read in its completion, where koffi restores it) */
  const asyncMessage = (code: number) =>
    readString((buf) => fns.error_message(code, buf, buf.length)) || `(no message: errno ${code} no longer numbers a recent failure)`
  const callSync = <F extends FunctionName>(fn: F, args: ArgsOf<F>) =>
    Effect.suspend(() => {
      const rc = fns[fn](...args) as number
      return rc === 0 ? Effect.void : fail(fn, rc, readString((buf) => fns.last_error(buf, buf.length)))
    })
  const callAsync = <F extends FunctionName>(fn: F, args: ArgsOf<F>) =>
    Effect.uninterruptible(
      Effect.callback<void, NativeError>((resume) => {
        const passed = args.map(offHeap)
        inFlight.add(passed)
        fns[fn].async(...passed, (err: unknown, rc: number) => {
          const code = koffi.errno()
          inFlight.delete(passed)
          args.forEach((a, i) => copyBack(a, passed[i]))
          resume(err ? Effect.die(err) : rc === 0 ? Effect.void : fail(fn, rc, asyncMessage(code)))
        })
      })
    )
  const value = <F extends FunctionName>(fn: F, args: ArgsOf<F>) => Effect.sync(() => fns[fn](...args) as ReturnType<Signatures[F]>)
  const queue = (): NativeCalls => {
    const lock = Semaphore.makeUnsafe(1)
    return {
      run: (fn, args) => lock.withPermit(callAsync(fn, args)),
      runSync: (fn, args) => lock.withPermit(callSync(fn, args)),
      value: (fn, args) => lock.withPermit(value(fn, args))
    }
  }
  const deviceLock = Semaphore.makeUnsafe(1)
  const runOnDevice = <F extends FunctionName>(device: number, fn: F, args: ArgsOf<F>) =>
    deviceLock.withPermit(callSync("set_device", [device]).pipe(Effect.andThen(callAsync(fn, args))))
  const count = fns.device_count() as number
  const devices = Array.from({ length: count }, (_, i) => readString((buf) => fns.device_name(i, buf, buf.length)))
  const lib: NativeLibrary = { backend, path, devices, run: callAsync, runSync: callSync, value, queue, runOnDevice }
  loaded.set(backend, lib)
  return lib
}

const unavailable = (message: string) => new EngineError({ op: "load", code: "GYRE_ERR_UNSUPPORTED", message })

/** Loads the library `GYRE_BACKEND` (or the automatic choice) names. */
export const loadNative = (requested: string | undefined = process.env.GYRE_BACKEND): Effect.Effect<NativeLibrary, EngineError> =>
  Effect.gen(function* () {
    const choice = requested === undefined || requested === "" ? "auto" : requested
    if (choice !== "auto" && choice !== "cpu" && choice !== "cuda") {
      return yield* unavailable(`GYRE_BACKEND must be cpu or cuda, got '${choice}'`)
    }
    if (choice !== "cpu") {
      const cudaPath = libraryPath("cuda")
      const driverDevices = existsSync(cudaPath) ? cudaDriverDevices() : []
      if (driverDevices.length > 0) {
        const lib = yield* Effect.try({
          try: () => open("cuda"),
          catch: (e) => unavailable(`cannot load ${cudaPath}: ${e instanceof Error ? e.message : String(e)}`)
        }).pipe(Effect.catch((e) => (choice === "cuda" ? Effect.fail(e) : Effect.succeed(undefined))))
        if (lib !== undefined) return lib
      } else if (choice === "cuda") {
        return yield* unavailable(
          existsSync(cudaPath) ? "GYRE_BACKEND=cuda but the CUDA driver reports no device" : `GYRE_BACKEND=cuda but ${cudaPath} is not built`
        )
      }
    }
    const cpuPath = libraryPath("cpu")
    if (!existsSync(cpuPath)) return yield* unavailable(`${cpuPath} is not built (run make -C native)`)
    return yield* Effect.try({
      try: () => open("cpu"),
      catch: (e) => unavailable(`cannot load ${cpuPath}: ${e instanceof Error ? e.message : String(e)}`)
    })
  })
