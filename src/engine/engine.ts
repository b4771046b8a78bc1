/**
 * The `Engine` service: the loaded native library (CPU or CUDA) and its models.
 *
 * Models, caches and trainers are handles on native memory: each is acquired into the
 * caller's Scope and freed when that scope closes. A cache or trainer keeps its model alive
 * natively, so scopes may close in any order.
 *
 * Devices: a model is created on a device (`{ device }`, an index below `devices.length`,
 * default 0; the CPU backend has one, the host) and its caches and trainers live on that
 * device too. Each model has its own call queue (`native.ts`), so different models compute at
 * the same time; `{ threads }` (or `Model.setThreads`) gives one its own host thread count, so
 * CPU devices of one process split the cores instead of each taking all of them.
 */
import { Context, Effect, Layer, type Scope } from "effect"
import { headDim, type KvDtype, kvDtypes, type LlamaConfig } from "./config.ts"
import { KvCache } from "./kvcache.ts"
import { type Backend, type CacheHandle, EngineError, type ModelHandle, type NativeCalls, type NativeError, type NativeLibrary, type TrainerHandle, loadNative } from "./native.ts"
import { type Dtype, dtypes } from "./safetensors.ts"
import { Trainer } from "./trainer.ts"

const dtypeNames = Object.fromEntries(Object.entries(dtypes).map(([name, d]) => [d.code, name as Dtype]))

/** A tensor of the flat parameter layout (gyre.h): its HF name, offset and shape. */
export interface ParamTensor {
  readonly name: string
  readonly offset: number
  readonly shape: ReadonlyArray<number>
}

const ropeTypes = { linear: 1, llama3: 2, yarn: 3 } as const

/** The C struct of a config (gyre.h gyre_config; YaRN's absent fields are its defaults, 0). */
export const cConfig = ({ rope_scaling: r, model_type, ...c }: LlamaConfig) => {
  const yarn = r?.rope_type === "yarn" ? r : undefined
  return {
    ...c,
    head_dim: headDim(c),
    tie_word_embeddings: c.tie_word_embeddings ? 1 : 0,
    qkv_bias: model_type === "qwen2" ? 1 : 0,
    qk_norm: model_type === "qwen3" ? 1 : 0,
    rope_type: r === undefined ? 0 : ropeTypes[r.rope_type],
    rope_factor: r?.factor ?? 0,
    rope_low_freq_factor: r?.rope_type === "llama3" ? r.low_freq_factor : 0,
    rope_high_freq_factor: r?.rope_type === "llama3" ? r.high_freq_factor : 0,
    rope_original_max_position_embeddings: r?.rope_type === "llama3" || r?.rope_type === "yarn" ? (r.original_max_position_embeddings ?? 0) : 0,
    rope_truncate: yarn?.truncate === false ? 0 : 1,
    rope_beta_fast: yarn?.beta_fast ?? 0,
    rope_beta_slow: yarn?.beta_slow ?? 0,
    rope_mscale: yarn?.mscale ?? 0,
    rope_mscale_all_dim: yarn?.mscale_all_dim ?? 0,
    rope_attention_factor: yarn?.attention_factor ?? 0
  }
}

/** Where a tensor's stored bytes are: a range of a file, elements of `dtype` (gyre_dtype code). */
export interface TensorSource {
  /** Index in the layout (`Engine.layout`). */
  readonly index: number
  readonly dtype: number
  readonly path: string
  readonly offset: number
  readonly bytes: number
}

/** The checkpoint a model was loaded from, which a save follows (dtype, config fields, tokenizer files). */
export interface ModelOrigin {
  readonly dir: string
  /** The stored dtype ("F32", "F16", "BF16"). */
  readonly dtype: string
  /** The config.json it was read from. */
  readonly configJson: Readonly<Record<string, unknown>>
}

/** A model's weights on one of the engine's devices. */
export class Model {
  constructor(
    /** The model's queue, which its caches and trainers share. */
    readonly lib: NativeCalls,
    readonly ptr: ModelHandle,
    readonly config: LlamaConfig,
    readonly paramCount: number,
    /** Index of the device holding the weights (and the model's caches and trainers). */
    readonly device: number,
    readonly origin?: ModelOrigin
  ) {}

  /** The parameter layout of this model's config. */
  layout(): Effect.Effect<ReadonlyArray<ParamTensor>, NativeError> {
    return paramLayout(this.lib, this.config)
  }

  /** Tensor `index` of the layout as `bytes` bytes of gyre_dtype `dtype` (16-bit: rounded to nearest even). */
  writeTensor(index: number, dtype: number, bytes: number): Effect.Effect<Uint8Array, NativeError> {
    const out = new Uint8Array(bytes)
    return this.lib.run("model_write_tensor", [this.ptr, index, dtype, out, bytes]).pipe(Effect.as(out))
  }

  /** How the model keeps its matrices now: "F32", or "F16" / "BF16" as a checkpoint stored them (CPU; F32 once a trainer widened them). */
  weightDtype(): Effect.Effect<Dtype, NativeError> {
    const out = [0]
    return this.lib.runSync("model_weight_dtype", [this.ptr, out]).pipe(Effect.map(() => dtypeNames[out[0]!]!))
  }

  /** The weights as a safetensors file (HF names, F32). */
  save(): Effect.Effect<Uint8Array, NativeError> {
    return Effect.gen({ self: this }, function* () {
      const len = [0]
      yield* this.lib.runSync("model_save", [this.ptr, null, 0, len])
      const out = new Uint8Array(len[0]!)
      yield* this.lib.run("model_save", [this.ptr, out, out.length, len])
      return out
    })
  }

  /** The flat parameter vector (gyre.h layout). */
  getWeights(): Effect.Effect<Float32Array, NativeError> {
    const out = new Float32Array(this.paramCount)
    return this.lib.run("model_get_weights", [this.ptr, out, this.paramCount]).pipe(Effect.as(out))
  }

  setWeights(weights: Float32Array): Effect.Effect<void, NativeError> {
    return this.lib.run("model_set_weights", [this.ptr, weights, weights.length])
  }

  /** Host threads of this model's compute from its next call (0: the engine's `setThreads` default). */
  setThreads(n: number): Effect.Effect<void, NativeError> {
    return this.lib.runSync("model_set_threads", [this.ptr, n])
  }

  /** The host threads its calls compute with (CUDA: 1). */
  threads(): Effect.Effect<number, NativeError> {
    const out = [0]
    return this.lib.runSync("model_threads", [this.ptr, out]).pipe(Effect.map(() => out[0]!))
  }

  /** A paged KV cache of `numBlocks` blocks of `blockTokens` tokens for this model, storing K and V as `kvDtype` (default F32; F16 halves the bytes). */
  cache(options: { readonly blockTokens: number; readonly numBlocks: number; readonly kvDtype?: KvDtype }): Effect.Effect<KvCache, NativeError, Scope.Scope> {
    const dtype = kvDtypes.indexOf(options.kvDtype ?? "f32")
    return acquire<CacheHandle>(
      (out) => this.lib.run("cache_create", [this.ptr, options.blockTokens, options.numBlocks, dtype, out]),
      (c) => this.lib.value("cache_free", [c])
    ).pipe(
      Effect.map((ptr) => new KvCache(this.lib, ptr, this.config, options.blockTokens))
    )
  }

  /** A trainer whose activations hold chunks of `maxTokens` tokens (batches of any length train chunk by chunk), updating this model's weights. */
  trainer(options: { readonly maxTokens: number }): Effect.Effect<Trainer, NativeError, Scope.Scope> {
    return acquire<TrainerHandle>(
      (out) => this.lib.run("trainer_create", [this.ptr, options.maxTokens, out]),
      (t) => this.lib.value("trainer_free", [t])
    ).pipe(
      Effect.map((ptr) => new Trainer(this.lib, ptr, this.config, this.paramCount, options.maxTokens))
    )
  }
}

/**
 * Creates a native handle with `create(out)` (a create call given its out slot) and frees it
 * with `free` on scope close. A model's create runs with its device selected; caches and
 * trainers follow their model's device natively.
 */
const acquire = <H>(
  create: (out: Array<H | null>) => Effect.Effect<void, NativeError>,
  free: (handle: H) => Effect.Effect<void>
): Effect.Effect<H, NativeError, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.suspend(() => {
      const out: Array<H | null> = [null]
      return create(out).pipe(Effect.map(() => out[0]!))
    }),
    free
  )

/** Options of model creation. */
export interface ModelOptions {
  /** Device index, below `Engine.devices.length` (default 0). */
  readonly device?: number
  /** Host threads of its compute (`Model.setThreads`; default 0: the engine's default). */
  readonly threads?: number
}

export interface EngineShape {
  readonly backend: Backend
  readonly devices: ReadonlyArray<string>
  /** The default host threads of models' compute (0: one per core), for models without their own (`Model.setThreads`). */
  readonly setThreads: (n: number) => Effect.Effect<void>
  readonly threads: Effect.Effect<number>
  /** Parameter count and layout of a config (fails on an unusable config). */
  readonly layout: (config: LlamaConfig) => Effect.Effect<ReadonlyArray<ParamTensor>, NativeError>
  /** A randomly initialised model (HF Llama init: N(0, initStd^2), norms 1) on `device`. */
  readonly createModel: (
    config: LlamaConfig,
    options?: ModelOptions & { readonly seed?: number; readonly initStd?: number }
  ) => Effect.Effect<Model, NativeError, Scope.Scope>
  /** A model from a safetensors file in memory (a checkpoint's model.safetensors) on `device`. */
  readonly loadModel: (config: LlamaConfig, safetensors: Uint8Array, options?: ModelOptions) => Effect.Effect<Model, NativeError, Scope.Scope>
  /**
   * A model read tensor by tensor from stored files; every tensor of the layout must have one
   * source. With `weightDtype` F16 or BF16 (CPU backend), matrices stored in it are memory-mapped
   * and kept as stored (gyre.h gyre_model_create_zero); otherwise each range is memory-mapped,
   * converted to F32 and read once.
   */
  readonly readModel: (
    config: LlamaConfig,
    sources: ReadonlyArray<TensorSource>,
    options?: ModelOptions & { readonly origin?: ModelOrigin; readonly weightDtype?: Dtype }
  ) => Effect.Effect<Model, NativeError, Scope.Scope>
  /** The RoPE inverse frequencies the config rotates by (head_dim / 2 values, after scaling). */
  readonly ropeInvFreq: (config: LlamaConfig) => Effect.Effect<Float32Array, NativeError>
  /** The factor RoPE's cos and sin carry (YaRN's attention factor; 1 for the other types). */
  readonly ropeAttentionScaling: (config: LlamaConfig) => Effect.Effect<number, NativeError>
  /** FNV-1a 64 of the bytes (the hand-off checksum). */
  readonly checksum: (bytes: Uint8Array) => Effect.Effect<bigint>
}

const paramLayout = (lib: NativeCalls, config: LlamaConfig) =>
  Effect.gen(function* () {
    const cfg = cConfig(config)
    const count = [0]
    yield* lib.runSync("param_tensor_count", [cfg, count])
    const tensors: Array<ParamTensor> = []
    for (let i = 0; i < count[0]!; i++) {
      const name = Buffer.alloc(128)
      const offset = [0]
      const rank = [0]
      const shape = new BigInt64Array(2)
      yield* lib.runSync("param_tensor", [cfg, i, name, name.length, offset, rank, shape])
      tensors.push({
        name: name.subarray(0, name.indexOf(0)).toString("utf8"),
        offset: Number(offset[0]),
        shape: rank[0] === 1 ? [Number(shape[0])] : [Number(shape[0]), Number(shape[1])]
      })
    }
    return tensors
  })

const paramCount = (lib: NativeCalls, config: LlamaConfig) => {
  const count = [0]
  return lib.runSync("param_count", [cConfig(config), count]).pipe(Effect.map(() => Number(count[0])))
}

const make = Effect.gen(function* () {
  const lib = yield* loadNative()
  yield* Effect.logInfo(`engine: ${lib.backend} backend (${lib.path}), devices: ${lib.devices.join("; ")}`)
  const model = (
    config: LlamaConfig,
    /** The model's create call on the library (with its device selected), given the config's struct and the out slot. */
    create: (run: NativeLibrary["runOnDevice"], device: number, cfg: ReturnType<typeof cConfig>, out: Array<ModelHandle | null>) => Effect.Effect<void, NativeError>,
    options: ModelOptions & { readonly origin?: ModelOrigin }
  ) =>
    Effect.gen(function* () {
      const device = options.device ?? 0
      if (!Number.isSafeInteger(device)) {
        return yield* new EngineError({ op: "createModel", code: "GYRE_ERR_INVALID_ARGUMENT", message: `device must be an integer index, got ${device}` })
      }
      const count = yield* paramCount(lib, config)
      const calls = lib.queue()
      const ptr = yield* acquire<ModelHandle>((out) => create(lib.runOnDevice, device, cConfig(config), out), (m) => calls.value("model_free", [m]))
      const m = new Model(calls, ptr, config, count, device, options.origin)
      if (options.threads !== undefined) yield* m.setThreads(options.threads)
      return m
    })
  return {
    backend: lib.backend,
    devices: lib.devices,
    setThreads: (n) => lib.value("set_num_threads", [n]),
    threads: lib.value("num_threads", []),
    layout: (config) => paramLayout(lib, config),
    createModel: (config, options = {}) =>
      model(config, (run, device, cfg, out) => run(device, "model_create", [cfg, BigInt(options.seed ?? 0), options.initStd ?? 0.02, out]), options),
    loadModel: (config, safetensors, options = {}) =>
      model(config, (run, device, cfg, out) => run(device, "model_load", [cfg, safetensors, safetensors.length, out]), options),
    readModel: (config, sources, options = {}) =>
      Effect.gen(function* () {
        const dtype = dtypes[options.weightDtype ?? "F32"].code
        const m = yield* model(config, (run, device, cfg, out) => run(device, "model_create_zero", [cfg, dtype, out]), options)
        for (const s of sources) yield* m.lib.run("model_read_tensor", [m.ptr, s.index, s.dtype, s.path, s.offset, s.bytes])
        return m
      }),
    ropeInvFreq: (config) =>
      Effect.suspend(() => {
        const out = new Float32Array(Math.max(1, Math.floor(headDim(config) / 2)))
        return lib.runSync("rope_inv_freq", [cConfig(config), out, out.length]).pipe(Effect.as(out))
      }),
    ropeAttentionScaling: (config) =>
      Effect.suspend(() => {
        const out = new Float32Array(1)
        return lib.runSync("rope_attention_scaling", [cConfig(config), out]).pipe(Effect.map(() => out[0]!))
      }),
    checksum: (bytes) => lib.value("checksum", [bytes, bytes.length]).pipe(Effect.map(BigInt))
  } satisfies EngineShape
})

export class Engine extends Context.Service<Engine, EngineShape>()("gyre/engine/Engine") {
  /** Loads the native library GYRE_BACKEND or the automatic choice names, and logs it. */
  static readonly layer = Layer.effect(Engine, make)
}
