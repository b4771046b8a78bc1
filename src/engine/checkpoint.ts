/**
 * Checkpoint directories in the Hugging Face layout, in and out:
 *
 *   config.json                    LlamaConfig (`config.ts`: HF meanings, defaults, refusals)
 *   model.safetensors              the weights (HF Llama tensor names), F32, F16 or BF16, or
 *   model-0000i-of-0000n.safetensors + model.safetensors.index.json   the same in shards
 *   optimizer.safetensors          AdamW moments and step count (F32; saved with a trainer)
 *   tokenizer.json, tokenizer_config.json, generation_config.json, ...   the model's own
 *                                  tokenizer files, copied through (`TOKENIZER_FILES`)
 *
 * Loading reads every shard's header, checks every tensor of the engine's layout against it
 * (a missing, misshapen, unexpected or wrongly typed tensor is an error naming it), then has
 * the engine memory-map each tensor's byte range. On the CPU backend a checkpoint whose
 * matrices are all BF16 (or all F16) is kept so: its matrices stay mapped and the model
 * computes from them (`weights: "f32"` converts instead); otherwise every range is converted
 * to F32. Each byte is read once and the host never holds a second copy of the weights.
 *
 * Saving keeps the dtype of the checkpoint the model was loaded from (or `dtype`), cuts
 * shards at `maxShardBytes` (HF's default 5 GB) with an index when there is more than one,
 * and copies the origin's tokenizer files, so the directory is a complete HF model directory.
 * Files are written to a temporary name and renamed, so a reader never sees half a file;
 * weight files of an earlier save that the new one does not list are removed.
 */
import { copyFile, mkdir, open, readFile, readdir, rename, rm, stat, writeFile } from "node:fs/promises"
import { join } from "node:path"
import { Effect, Schema, type Scope } from "effect"
import { type LlamaConfig, parseConfigJson, toConfigJson } from "./config.ts"
import { Engine, type Model, type ModelOptions, type ParamTensor, type TensorSource } from "./engine.ts"
import { EngineError, type NativeError } from "./native.ts"
import { type Dtype, type TensorEntry, dtypes, encodeHeader, headerLength, isDtype, parseHeader } from "./safetensors.ts"
import { special } from "./tokenizer.ts"
import type { Trainer } from "./trainer.ts"

export const CONFIG_FILE = "config.json"
export const MODEL_FILE = "model.safetensors"
export const INDEX_FILE = "model.safetensors.index.json"
export const OPTIMIZER_FILE = "optimizer.safetensors"
/** Files of a model's tokenizer and generation settings, copied from a checkpoint to its saves. */
export const TOKENIZER_FILES = [
  "tokenizer.json",
  "tokenizer_config.json",
  "special_tokens_map.json",
  "generation_config.json",
  "chat_template.jinja",
  "chat_template.json",
  "tokenizer.model",
  "vocab.json",
  "merges.txt"
] as const
/** HF's default `max_shard_size`. */
export const DEFAULT_MAX_SHARD_BYTES = 5_000_000_000

export class CheckpointError extends Schema.TaggedError<CheckpointError>()("CheckpointError", {
  path: Schema.String,
  message: Schema.String
}) {}

const messageOf = (e: unknown) => (e instanceof Error ? e.message : String(e))
const fail = (path: string) => (e: unknown) => new CheckpointError({ path, message: messageOf(e) })
const io = <A>(path: string, f: () => Promise<A>) => Effect.tryPromise({ try: f, catch: fail(path) })
const isMissing = (e: CheckpointError) => e.message.includes("ENOENT")

/** A JSON file of the checkpoint, or undefined when it does not exist. */
const readJson = (path: string): Effect.Effect<unknown, CheckpointError> =>
  io(path, () => readFile(path, "utf8")).pipe(
    Effect.flatMap((text) => Effect.try({ try: () => JSON.parse(text) as unknown, catch: fail(path) })),
    Effect.catchIf(isMissing, () => Effect.succeed(undefined))
  )

const writeAtomic = (path: string, data: Uint8Array | string) =>
  io(path, async () => {
    await writeFile(`${path}.tmp`, data)
    await rename(`${path}.tmp`, path)
  })

/** The checkpoint's config.json: the engine's config and the JSON object it was read from. */
export const readConfig = (dir: string): Effect.Effect<{ readonly config: LlamaConfig; readonly json: Record<string, unknown> }, CheckpointError> => {
  const path = join(dir, CONFIG_FILE)
  return readJson(path).pipe(
    Effect.flatMap((json) =>
      json === undefined
        ? Effect.fail(new CheckpointError({ path, message: "no such file" }))
        : Effect.try({ try: () => ({ config: parseConfigJson(json), json: json as Record<string, unknown> }), catch: fail(path) })
    )
  )
}

/* ---- loading ---- */

/** The weight files of a directory: the index's shards, else model.safetensors. */
const weightFiles = (dir: string) =>
  Effect.gen(function* () {
    const indexPath = join(dir, INDEX_FILE)
    const index = yield* readJson(indexPath)
    if (index === undefined) return { files: [MODEL_FILE], listed: undefined }
    const map = (index as { weight_map?: unknown }).weight_map
    if (typeof map !== "object" || map === null || Object.values(map).some((f) => typeof f !== "string")) {
      return yield* new CheckpointError({ path: indexPath, message: "weight_map must map tensor names to file names" })
    }
    const listed = new Map(Object.entries(map as Record<string, string>))
    return { files: [...new Set(listed.values())], listed }
  })

/** The tensor entries of one safetensors file (only its header is read). */
const readEntries = (path: string) =>
  io(path, async () => {
    const file = await open(path, "r")
    try {
      const size = (await file.stat()).size
      const first = Buffer.alloc(8)
      if (size < 8 || (await file.read(first, 0, 8, 0)).bytesRead !== 8) throw new Error(`truncated: ${size} bytes`)
      const n = headerLength(first)
      if (8 + n > size) throw new Error(`truncated: header claims ${n} bytes, the file has ${size}`)
      const json = Buffer.alloc(n)
      await file.read(json, 0, n, 8)
      return parseHeader(json, size)
    } finally {
      await file.close()
    }
  }).pipe(Effect.mapError((e) => new CheckpointError({ path, message: `safetensors: ${e.message}` })))

const ignored = (name: string, config: LlamaConfig) => name.endsWith("rotary_emb.inv_freq") || (config.tie_word_embeddings && name === "lm_head.weight")

/** Matches the files' tensors to the layout; each problem is an error naming the tensor. */
const sourcesOf = (dir: string, config: LlamaConfig, layout: ReadonlyArray<ParamTensor>) =>
  Effect.gen(function* () {
    const { files, listed } = yield* weightFiles(dir)
    const found = new Map<string, { readonly path: string; readonly entry: TensorEntry }>()
    for (const file of files) {
      const path = join(dir, file)
      for (const entry of yield* readEntries(path)) {
        const bad = (message: string) => new CheckpointError({ path, message })
        if (found.has(entry.name)) return yield* bad(`tensor '${entry.name}' appears twice`)
        if (listed !== undefined && listed.get(entry.name) !== file) return yield* bad(`tensor '${entry.name}' is not listed for this file in ${INDEX_FILE}`)
        found.set(entry.name, { path, entry })
      }
    }
    const byName = new Map(layout.map((t, index) => [t.name, { ...t, index }]))
    for (const [name, { path }] of found) {
      if (!byName.has(name) && !ignored(name, config)) return yield* new CheckpointError({ path, message: `unexpected tensor '${name}' for this config` })
    }
    const sources: Array<TensorSource & { readonly dtypeName: Dtype }> = []
    for (const t of byName.values()) {
      const hit = found.get(t.name)
      if (hit === undefined) return yield* new CheckpointError({ path: dir, message: `missing tensor '${t.name}'` })
      const { path, entry } = hit
      if (!isDtype(entry.dtype)) return yield* new CheckpointError({ path, message: `tensor '${t.name}' has dtype ${entry.dtype}; expected F32, F16 or BF16` })
      if (entry.shape.length !== t.shape.length || entry.shape.some((n, i) => n !== t.shape[i])) {
        return yield* new CheckpointError({ path, message: `tensor '${t.name}' has shape [${entry.shape.join(", ")}]; expected [${t.shape.join(", ")}]` })
      }
      sources.push({ index: t.index, dtype: dtypes[entry.dtype].code, dtypeName: entry.dtype, path, offset: entry.begin, bytes: entry.end - entry.begin })
    }
    return sources
  })

/** The dtype most of the weights are stored in. */
const mainDtype = (sources: ReadonlyArray<{ readonly dtypeName: Dtype; readonly bytes: number }>): Dtype => {
  const total = new Map<Dtype, number>()
  for (const s of sources) total.set(s.dtypeName, (total.get(s.dtypeName) ?? 0) + s.bytes)
  return [...total].sort((a, b) => b[1] - a[1])[0]?.[0] ?? "F32"
}

/** An engine error of `code` (a bad tensor range; a config the engine refuses, e.g. an odd
 * head_dim) becomes a CheckpointError naming the file; other engine errors pass. */
const asCheckpointError = (path: string, code = "GYRE_ERR_BAD_CHECKPOINT") => (e: NativeError) =>
  e instanceof EngineError && e.code === code ? new CheckpointError({ path, message: e.message }) : e

/** The 16-bit dtype every matrix of a checkpoint is stored in, else undefined (F32 or mixed). */
const matrixDtype = (layout: ReadonlyArray<ParamTensor>, sources: ReadonlyArray<TensorSource & { readonly dtypeName: Dtype }>): Dtype | undefined => {
  const names = new Set(sources.filter((s) => layout[s.index]!.shape.length === 2).map((s) => s.dtypeName))
  const [only] = names
  return names.size === 1 && only !== "F32" ? only : undefined
}

export interface LoadOptions extends ModelOptions {
  /** "stored" (default): on the CPU backend a checkpoint whose matrices are all BF16 (or all F16) keeps them so, memory-mapped; "f32": converted. */
  readonly weights?: "stored" | "f32"
}

/** Loads a checkpoint's model (into the caller's scope, on `options.device`) and its optimizer state bytes, if any. */
export const loadCheckpoint = (
  dir: string,
  options: LoadOptions = {}
): Effect.Effect<{ readonly model: Model; readonly optimizer: Uint8Array | undefined }, CheckpointError | NativeError, Engine | Scope.Scope> =>
  Effect.gen(function* () {
    const engine = yield* Engine
    const { config, json } = yield* readConfig(dir)
    const layout = yield* engine.layout(config).pipe(Effect.mapError(asCheckpointError(join(dir, CONFIG_FILE), "GYRE_ERR_INVALID_ARGUMENT")))
    const sources = yield* sourcesOf(dir, config, layout)
    const origin = { dir, dtype: mainDtype(sources), configJson: json }
    const kept = engine.backend === "cpu" && options.weights !== "f32" ? matrixDtype(layout, sources) : undefined
    const { weights: _, ...modelOptions } = options
    const model = yield* engine
      .readModel(config, sources, { ...modelOptions, origin, ...(kept === undefined ? {} : { weightDtype: kept }) })
      .pipe(Effect.mapError(asCheckpointError(dir)))
    const optimizer = yield* io(join(dir, OPTIMIZER_FILE), () => readFile(join(dir, OPTIMIZER_FILE))).pipe(
      Effect.map((b): Uint8Array | undefined => b),
      Effect.catchIf(isMissing, () => Effect.succeed(undefined))
    )
    return { model, optimizer }
  })

/** Restores a trainer's optimizer state from checkpoint bytes (a bad file names its path). */
export const restoreOptimizer = (dir: string, trainer: Trainer, bytes: Uint8Array): Effect.Effect<void, CheckpointError | NativeError> =>
  trainer.loadOptimizer(bytes).pipe(Effect.mapError(asCheckpointError(join(dir, OPTIMIZER_FILE))))

/* ---- saving ---- */

export interface SaveOptions {
  /** Stored dtype (default: the origin's, else F32). */
  readonly dtype?: Dtype
  /** Largest shard in bytes before the next tensor starts a new one (default 5 GB). */
  readonly maxShardBytes?: number
}

type Planned = ParamTensor & { readonly index: number; readonly bytes: number }

/** Tensors in layout order, cut into shards of at most `max` bytes (a larger tensor alone). */
export const planShards = (layout: ReadonlyArray<ParamTensor>, width: number, max: number): Array<Array<Planned>> => {
  const shards: Array<Array<Planned>> = [[]]
  let size = 0
  layout.forEach((t, index) => {
    const bytes = t.shape.reduce((a, b) => a * b, 1) * width
    if (size > 0 && size + bytes > max) {
      shards.push([])
      size = 0
    }
    shards[shards.length - 1]!.push({ ...t, index, bytes })
    size += bytes
  })
  return shards
}

const shardName = (i: number, n: number) => (n === 1 ? MODEL_FILE : `model-${String(i + 1).padStart(5, "0")}-of-${String(n).padStart(5, "0")}.safetensors`)

/** Writes one shard, tensor by tensor (the host holds one tensor's bytes at a time). */
const writeShard = (path: string, model: Model, tensors: ReadonlyArray<Planned>, dtype: Dtype) =>
  Effect.gen(function* () {
    const file = yield* io(path, () => open(`${path}.tmp`, "w"))
    const written = Effect.gen(function* () {
      yield* io(path, () => file.write(encodeHeader(tensors.map((t) => ({ name: t.name, dtype, shape: t.shape })))))
      for (const t of tensors) {
        const bytes = yield* model.writeTensor(t.index, dtypes[dtype].code, t.bytes)
        yield* io(path, () => file.write(bytes))
      }
    }).pipe(Effect.ensuring(Effect.promise(() => file.close())))
    yield* written
    yield* io(path, () => rename(`${path}.tmp`, path))
  })

/** Removes weight files of an earlier save that `keep` does not name. */
const removeStale = (dir: string, keep: ReadonlyArray<string>) =>
  io(dir, async () => {
    for (const name of await readdir(dir)) {
      const weights = name === MODEL_FILE || name === INDEX_FILE || /^model-\d{5}-of-\d{5}\.safetensors$/.test(name)
      if (weights && !keep.includes(name)) await rm(join(dir, name))
    }
  })

/** Copies the origin's tokenizer files that exist (when saving elsewhere than the origin). */
const copyTokenizerFiles = (from: string, to: string) =>
  io(to, async () => {
    for (const name of TOKENIZER_FILES) {
      const src = join(from, name)
      if (await stat(src).then(() => true, () => false)) await copyFile(src, join(to, name))
    }
  })

/** Writes a complete HF model directory, and optimizer.safetensors when a trainer is given. */
export const saveCheckpoint = (
  dir: string,
  model: Model,
  trainer?: Trainer,
  options: SaveOptions = {}
): Effect.Effect<void, CheckpointError | NativeError> =>
  Effect.gen(function* () {
    const origin = model.origin
    const dtype = options.dtype ?? (origin !== undefined && isDtype(origin.dtype) ? origin.dtype : "F32")
    yield* io(dir, () => mkdir(dir, { recursive: true }))
    const layout = yield* model.layout()
    const shards = planShards(layout, dtypes[dtype].bytes, options.maxShardBytes ?? DEFAULT_MAX_SHARD_BYTES)
    const names = shards.map((_, i) => shardName(i, shards.length))
    for (const [i, tensors] of shards.entries()) yield* writeShard(join(dir, names[i]!), model, tensors, dtype)
    if (shards.length > 1) {
      const weightMap = Object.fromEntries(shards.flatMap((tensors, i) => tensors.map((t) => [t.name, names[i]!])))
      const totalSize = shards.flat().reduce((a, t) => a + t.bytes, 0)
      yield* writeAtomic(join(dir, INDEX_FILE), `${JSON.stringify({ metadata: { total_size: totalSize }, weight_map: weightMap }, null, 2)}\n`)
    }
    yield* removeStale(dir, shards.length > 1 ? [...names, INDEX_FILE] : names)
    const base = origin?.configJson ?? { bos_token_id: special.bos, eos_token_id: special.eos }
    yield* writeAtomic(join(dir, CONFIG_FILE), `${JSON.stringify(toConfigJson(model.config, dtypes[dtype].torch, base), null, 2)}\n`)
    if (origin !== undefined && origin.dir !== dir) yield* copyTokenizerFiles(origin.dir, dir)
    if (trainer !== undefined) yield* writeAtomic(join(dir, OPTIMIZER_FILE), yield* trainer.saveOptimizer())
  })
