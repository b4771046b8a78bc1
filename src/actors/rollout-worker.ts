/**
 * The rollout-worker actor: one per device, serving `RolloutWorkerProtocol`.
 *
 * Each incarnation loads the checkpoint (config.json + model.safetensors) into the engine on
 * its device (`device`, else the number ending its id modulo the engine's device count, so
 * `<node>.cuda0`, `<node>.cuda1`, ... spread over the GPUs; the CPU has one), creates a paged KV cache and runs the continuous-batching loop (`batcher.ts`) in its
 * scope; all three are freed when the incarnation ends. `Generate` handlers only queue work
 * for the loop and wait, so the actor declares a high `concurrency`: every request in flight
 * is a handler, and control requests (Cancel, Status, Drain) never wait behind them.
 *
 * - Streaming: with `stream`, each step's new tokens go out as a `TokenChunk` on the core
 *   NATS subject `gyre.<run>.tokens.<request>` (then one chunk with `done`), before the reply,
 *   on the same connection, so a subscriber has every chunk when the answer arrives.
 * - `LoadWeights {version}` reads object `v<version>` (a model.safetensors) from the run's
 *   object store `GYRE_<run>_weights`, decodes it through the engine, and swaps the flat
 *   weights in between two engine steps; tokens sampled afterwards carry `version`. Cached
 *   K/V computed under older weights is kept (every token records the version that sampled it).
 * - Load (`WorkerLoad`) is reported after every step and published with each heartbeat in
 *   the registry entry, where the gateway reads it to route.
 * - Drain: the host's drain lets running generations finish; `Drain {finish: false}`
 *   cancels them (they answer with their partial output, finishReason "cancelled").
 *
 * `gyre node --load src/actors/rollout-worker.ts --spawn rollout-worker/<node>.cpu0` hosts
 * one configured from the environment (`workerConfigFromEnv`).
 */
import { Objm } from "@nats-io/obj"
import { Effect, Schema } from "effect"
import type { RpcGroup } from "effect/rpc"
import { loadCheckpoint } from "../engine/checkpoint.ts"
import { Engine } from "../engine/engine.ts"
import * as Actor from "../runtime/actor.ts"
import { formatAddress } from "../runtime/names.ts"
import { makeBatcher } from "../serving/batcher.ts"
import { rlLayout } from "../protocols/layout.ts"
import { RolloutWorkerProtocol, TokenChunk, WeightsUnavailable } from "../protocols/rollout.ts"

export interface RolloutWorkerConfig {
  /** Checkpoint directory: config.json and model.safetensors (the initial weights). */
  readonly checkpoint: string
  /** Policy version of the checkpoint's weights (default 0). */
  readonly version?: number
  /** KV-cache block size in tokens (default 16). */
  readonly blockTokens?: number
  /** KV-cache blocks (default 4096: 65,536 tokens). */
  readonly numBlocks?: number
  /** Longest sequence (prompt + output) served; default the model's max_position_embeddings. */
  readonly maxContext?: number
  /** Generations batched at once (default 32). */
  readonly maxBatch?: number
  /** Prompt tokens prefilled per engine step (default 256). */
  readonly prefillChunk?: number
  /** Cached contexts kept per execution (default 16; each call leaves two). */
  readonly contextsPerExecution?: number
  /** Engine device of the model and its KV cache; default `workerDevice(id, device count)`. */
  readonly device?: number
}

/**
 * The device of worker `id` among `deviceCount`: the number ending the id (`serve.cuda3` -> 3)
 * modulo the count, so worker i of a node runs on device i mod count; 0 without a number.
 */
export const workerDevice = (id: string, deviceCount: number): number => {
  const index = /(\d+)$/.exec(id)
  return index === null || deviceCount < 1 ? 0 : Number(index[1]) % deviceCount
}

const intFromEnv = (name: string): number | undefined => {
  const raw = process.env[name]
  if (raw === undefined || raw === "") return undefined
  const n = Number(raw)
  if (!Number.isSafeInteger(n) || n < 0) throw new Error(`${name} must be a non-negative integer, got '${raw}'`)
  return n
}

/**
 * The configuration from the environment: `GYRE_CHECKPOINT` (required when an actor is
 * spawned), `GYRE_POLICY_VERSION`, `GYRE_KV_BLOCK_TOKENS`, `GYRE_KV_BLOCKS`, `GYRE_MAX_CONTEXT`,
 * `GYRE_MAX_BATCH`, `GYRE_PREFILL_CHUNK`, `GYRE_CONTEXTS_PER_EXECUTION`, `GYRE_DEVICE`.
 */
export const workerConfigFromEnv = (): RolloutWorkerConfig => {
  const optional = (key: keyof RolloutWorkerConfig, env: string) => {
    const v = intFromEnv(env)
    return v === undefined ? {} : { [key]: v }
  }
  return {
    checkpoint: process.env.GYRE_CHECKPOINT ?? "",
    ...optional("version", "GYRE_POLICY_VERSION"),
    ...optional("blockTokens", "GYRE_KV_BLOCK_TOKENS"),
    ...optional("numBlocks", "GYRE_KV_BLOCKS"),
    ...optional("maxContext", "GYRE_MAX_CONTEXT"),
    ...optional("maxBatch", "GYRE_MAX_BATCH"),
    ...optional("prefillChunk", "GYRE_PREFILL_CHUNK"),
    ...optional("contextsPerExecution", "GYRE_CONTEXTS_PER_EXECUTION"),
    ...optional("device", "GYRE_DEVICE")
  }
}

const encodeChunk = Schema.encodeSync(TokenChunk)

/** The rollout-worker actor type for a configuration. */
export const rolloutWorker = (config: RolloutWorkerConfig) =>
  Actor.make({
    kind: "rollout-worker",
    protocol: RolloutWorkerProtocol,
    state: { schema: Schema.Struct({}), initial: () => ({}) },
    concurrency: 1024,
    behaviour: (ctx) =>
      Effect.gen(function* () {
        if (config.checkpoint === "") return yield* Effect.die(new Error("rollout-worker: no checkpoint configured (GYRE_CHECKPOINT)"))
        const engine = yield* Engine
        const device = config.device ?? workerDevice(ctx.address.id, engine.devices.length)
        const { model } = yield* loadCheckpoint(config.checkpoint, { device })
        const modelConfig = model.config
        const cache = yield* model.cache({ blockTokens: config.blockTokens ?? 16, numBlocks: config.numBlocks ?? 4096 })
        const worker = formatAddress(ctx.address)
        const batcher = yield* makeBatcher(cache, {
          worker,
          maxContext: config.maxContext ?? modelConfig.max_position_embeddings,
          maxBatch: config.maxBatch ?? 32,
          prefillChunk: config.prefillChunk ?? 256,
          contextsPerExecution: config.contextsPerExecution ?? 16,
          version: config.version ?? 0,
          onLoad: (load) => ctx.reportLoad(load)
        })
        const layout = rlLayout(ctx.system.run)
        const nc = ctx.system.nats.nc
        const objm = new Objm(nc)

        const publish = (request: string, chunk: TokenChunk) => {
          try {
            nc.publish(layout.tokens(request), JSON.stringify(encodeChunk(chunk)))
          } catch {
            // connection closing: the answer still carries every token
          }
        }

        const fetchWeights = (version: number) =>
          Effect.gen(function* () {
            const unavailable = (reason: string) => new WeightsUnavailable({ version, reason })
            const store = yield* Effect.tryPromise({ try: () => objm.open(layout.weightsBucket), catch: (e) => unavailable(String(e)) })
            const name = layout.weightsObject(version)
            const blob = yield* Effect.tryPromise({ try: () => store.getBlob(name), catch: (e) => unavailable(String(e)) })
            if (blob === null) return yield* unavailable(`no object ${name} in ${layout.weightsBucket}`)
            return yield* Effect.scoped(
              engine.loadModel(modelConfig, blob, { device }).pipe(
                Effect.flatMap((m) => m.getWeights()),
                Effect.mapError((e) => unavailable(e.message))
              )
            )
          })

        const handlers: Actor.Handlers<RpcGroup.Rpcs<typeof RolloutWorkerProtocol>> = {
          Generate: (request) =>
            batcher
              .generate({
                execution: request.execution,
                request: request.request,
                base: request.base,
                prompt: request.prompt,
                sampling: request.sampling,
                ...(request.stream
                  ? { onTokens: (step) => publish(request.request, { ...step, done: false }) }
                  : {})
              })
              .pipe(
                Effect.tap(() =>
                  Effect.sync(() => {
                    if (request.stream) publish(request.request, { tokens: new Int32Array(0), logprobs: new Float32Array(0), versions: new Int32Array(0), done: true })
                  })
                )
              ),
          Cancel: ({ request }) => Effect.sync(() => ({ found: batcher.cancel(request) })),
          Release: ({ execution }) => batcher.release(execution).pipe(Effect.orDie, Effect.map((freedBlocks) => ({ freedBlocks }))),
          LoadWeights: ({ version }) =>
            Effect.gen(function* () {
              const weights = yield* fetchWeights(version)
              yield* batcher.swapWeights(model.setWeights(weights), version).pipe(Effect.orDie)
              return { version }
            }),
          Drain: ({ finish }) => batcher.drain(finish).pipe(Effect.map((cancelled) => ({ cancelled }))),
          Status: () => Effect.sync(() => batcher.load())
        }
        return handlers
      }).pipe(Effect.provide(Engine.layer))
  })

/** A rollout worker configured from the environment (for `gyre node --load`). */
export const RolloutWorker = rolloutWorker(workerConfigFromEnv())
