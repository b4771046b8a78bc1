/**
 * Checkpoint directories, in the Hugging Face layout so a Gyre policy loads in the standard
 * ecosystem:
 *
 *   config.json             LlamaConfig (model_type "llama", F32)
 *   model.safetensors       weights, F32, HF Llama tensor names
 *   optimizer.safetensors   AdamW moments and step count (present when saved with a trainer)
 *
 * Files are written to a temporary name and renamed, so a reader never sees half a file.
 * A missing, malformed or truncated file fails with a CheckpointError naming the file.
 */
import { mkdir, readFile, rename, writeFile } from "node:fs/promises"
import { join } from "node:path"
import { Effect, Schema, type Scope } from "effect"
import { type LlamaConfig, parseConfigJson, toConfigJson } from "./config.ts"
import { Engine, type Model, type ModelOptions } from "./engine.ts"
import { EngineError, type NativeError } from "./native.ts"
import { special } from "./tokenizer.ts"
import type { Trainer } from "./trainer.ts"

export const CONFIG_FILE = "config.json"
export const MODEL_FILE = "model.safetensors"
export const OPTIMIZER_FILE = "optimizer.safetensors"

export class CheckpointError extends Schema.TaggedError<CheckpointError>()("CheckpointError", {
  path: Schema.String,
  message: Schema.String
}) {}

const messageOf = (e: unknown) => (e instanceof Error ? e.message : String(e))

const read = (path: string) =>
  Effect.tryPromise({ try: () => readFile(path), catch: (e) => new CheckpointError({ path, message: messageOf(e) }) })

const write = (path: string, data: Uint8Array | string) =>
  Effect.tryPromise({
    try: async () => {
      await writeFile(`${path}.tmp`, data)
      await rename(`${path}.tmp`, path)
    },
    catch: (e) => new CheckpointError({ path, message: messageOf(e) })
  })

/** The checkpoint's config.json. */
export const readConfig = (dir: string): Effect.Effect<LlamaConfig, CheckpointError> => {
  const path = join(dir, CONFIG_FILE)
  return read(path).pipe(
    Effect.flatMap((bytes) =>
      Effect.try({ try: () => parseConfigJson(JSON.parse(bytes.toString("utf8"))), catch: (e) => new CheckpointError({ path, message: messageOf(e) }) })
    )
  )
}

/** Writes config.json and model.safetensors, and optimizer.safetensors when a trainer is given. */
export const saveCheckpoint = (
  dir: string,
  model: Model,
  trainer?: Trainer
): Effect.Effect<void, CheckpointError | NativeError> =>
  Effect.gen(function* () {
    yield* Effect.tryPromise({ try: () => mkdir(dir, { recursive: true }), catch: (e) => new CheckpointError({ path: dir, message: messageOf(e) }) })
    const config = toConfigJson(model.config, { bos_token_id: special.bos, eos_token_id: special.eos })
    yield* write(join(dir, CONFIG_FILE), `${JSON.stringify(config, null, 2)}\n`)
    yield* write(join(dir, MODEL_FILE), yield* model.save())
    if (trainer !== undefined) yield* write(join(dir, OPTIMIZER_FILE), yield* trainer.saveOptimizer())
  })

/** A bad safetensors file becomes a CheckpointError naming it; other engine errors pass. */
const asCheckpointError = (path: string) => (e: NativeError) =>
  e instanceof EngineError && e.code === "GYRE_ERR_BAD_CHECKPOINT" ? new CheckpointError({ path, message: e.message }) : e

/** Loads a checkpoint's model (into the caller's scope, on `options.device`) and its optimizer state bytes, if any. */
export const loadCheckpoint = (
  dir: string,
  options: ModelOptions = {}
): Effect.Effect<{ readonly model: Model; readonly optimizer: Uint8Array | undefined }, CheckpointError | NativeError, Engine | Scope.Scope> =>
  Effect.gen(function* () {
    const engine = yield* Engine
    const config = yield* readConfig(dir)
    const modelPath = join(dir, MODEL_FILE)
    const model = yield* engine.loadModel(config, yield* read(modelPath), options).pipe(Effect.mapError(asCheckpointError(modelPath)))
    const optimizer = yield* read(join(dir, OPTIMIZER_FILE)).pipe(
      Effect.map((b): Uint8Array | undefined => b),
      Effect.catchIf((e) => e.message.includes("ENOENT"), () => Effect.succeed(undefined))
    )
    return { model, optimizer }
  })

/** Restores a trainer's optimizer state from checkpoint bytes (a bad file names its path). */
export const restoreOptimizer = (dir: string, trainer: Trainer, bytes: Uint8Array): Effect.Effect<void, CheckpointError | NativeError> =>
  trainer.loadOptimizer(bytes).pipe(Effect.mapError(asCheckpointError(join(dir, OPTIMIZER_FILE))))
