/**
 * The rollout role: what a rollout worker and a device in the `rollout` role both run.
 *
 * `startRollout` loads the checkpoint (config.json + model.safetensors) into the engine on the
 * chosen device (`device`, else the number ending the actor's id modulo the engine's device
 * count, so `<node>.cuda0`, `<node>.cuda1`, ... spread over the GPUs; the CPU has one), creates
 * a paged KV cache and starts the continuous-batching loop (`batcher.ts`) in the caller's
 * scope, and returns the `RolloutWorkerProtocol` handlers over them. `Generate` handlers only
 * queue work for the loop and wait, so the hosting actor declares a high `concurrency`.
 *
 * - Streaming: with `stream`, each step's new tokens go out as a `TokenChunk` on the core NATS
 *   subject `gyre.<run>.tokens.<request>` (then one chunk with `done`), before the reply, on the
 *   same connection, so a subscriber has every chunk when the answer arrives.
 * - `LoadWeights {version}` reads object `v<version>` (a model.safetensors) from the run's
 *   object store `GYRE_<run>_weights`, decodes it through the engine, and swaps the flat weights
 *   in between two engine steps; tokens sampled afterwards carry `version`. Cached K/V computed
 *   under older weights is kept (every token records the version that sampled it).
 * - Drain: `Drain {finish: false}` cancels running generations (they answer with their partial
 *   output, finishReason "cancelled"); `finish: true` lets them end.
 * - Bounded messages: a prompt the gateway sent as an object of the run's transfer store
 *   (`promptObject`) is read from there; an answer of more than `inlineTokens` output tokens
 *   goes back the same way (`outputObject`, deleted by the gateway once read).
 *
 * The configuration comes from the caller or from the `ConfigProvider` (`RolloutSettings`).
 */
import { Config, Effect, Option, Schema } from "effect"
import type { RpcGroup } from "effect/rpc"
import { loadCheckpoint } from "../engine/checkpoint.ts"
import { type KvDtype, kvDtypes } from "../engine/config.ts"
import { Engine, type EngineShape, type Model } from "../engine/engine.ts"
import type * as Actor from "../runtime/actor.ts"
import type { ActorSystemShape } from "../runtime/system.ts"
import { formatAddress } from "../runtime/names.ts"
import { rlLayout, type RlLayout } from "../protocols/layout.ts"
import { fetchWeights } from "../protocols/weights.ts"
import { RolloutWorkerProtocol, TokenChunk, WeightsUnavailable, WorkerUnavailable, type GenerateRequest, type GenerateResult, type WorkerLoad } from "../protocols/rollout.ts"
import { INLINE_TOKENS, getArrays, openTransferStore, putArrays } from "../protocols/transfer.ts"
import { parsePace, type Pace } from "../protocols/pace.ts"
import { makeBatcher, type BatcherShape } from "./batcher.ts"
import { makePacer } from "./pace.ts"

/** Tokens per KV-cache block of every device and worker. */
export const KV_BLOCK_TOKENS = 16
/** KV-cache blocks of a device or worker unless configured: 65,536 tokens. */
export const DEFAULT_KV_BLOCKS = 4096

export interface RolloutConfig {
  /** Checkpoint directory: config.json and model.safetensors (the initial weights). */
  readonly checkpoint: string
  /** Policy version of the checkpoint's weights (default 0). */
  readonly version?: number
  /** KV-cache block size in tokens (default 16). */
  readonly blockTokens?: number
  /** KV-cache blocks (default 4096: 65,536 tokens). */
  readonly numBlocks?: number
  /** How the KV cache stores K and V (default f32; f16: half the bytes). */
  readonly kvDtype?: KvDtype
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
  /** Output tokens an answer carries inline at most; more go through the run's transfer store (default `INLINE_TOKENS`). */
  readonly inlineTokens?: number
  /** The device's fixed rates (`pace.ts`); none: as fast as it computes. */
  readonly pace?: Pace
}

/**
 * The device of worker `id` among `deviceCount`: the number ending the id (`serve.cuda3` -> 3)
 * modulo the count, so worker i of a node runs on device i mod count; 0 without a number.
 */
export const workerDevice = (id: string, deviceCount: number): number => {
  const index = /(\d+)$/.exec(id)
  return index === null || deviceCount < 1 ? 0 : Number(index[1]) % deviceCount
}

const optionalInt = (name: string) =>
  Config.schema(Schema.Int.pipe(Schema.check(Schema.isGreaterThanOrEqualTo(0))), name).pipe(Config.option, Config.map(Option.getOrUndefined))

/**
 * The configuration from the `ConfigProvider` (the environment by default), read when an
 * incarnation starts: `GYRE_CHECKPOINT` (required when an actor is spawned),
 * `GYRE_POLICY_VERSION`, `GYRE_KV_BLOCK_TOKENS`, `GYRE_KV_BLOCKS`, `GYRE_MAX_CONTEXT`,
 * `GYRE_MAX_BATCH`, `GYRE_PREFILL_CHUNK`, `GYRE_CONTEXTS_PER_EXECUTION`, `GYRE_DEVICE` (integers
 * >= 0), `GYRE_KV_DTYPE` (f32 | f16), `GYRE_PACE` (`decode=T1,prefill=T2,train=T3`). A bad value
 * fails the start with a `ConfigError` naming it (a bad `GYRE_PACE`: an error naming it).
 */
export const RolloutSettings: Config.Config<RolloutConfig> = Config.all({
  checkpoint: Config.String("GYRE_CHECKPOINT").pipe(Config.withDefault("")),
  version: optionalInt("GYRE_POLICY_VERSION"),
  blockTokens: optionalInt("GYRE_KV_BLOCK_TOKENS"),
  numBlocks: optionalInt("GYRE_KV_BLOCKS"),
  maxContext: optionalInt("GYRE_MAX_CONTEXT"),
  maxBatch: optionalInt("GYRE_MAX_BATCH"),
  prefillChunk: optionalInt("GYRE_PREFILL_CHUNK"),
  contextsPerExecution: optionalInt("GYRE_CONTEXTS_PER_EXECUTION"),
  device: optionalInt("GYRE_DEVICE"),
  kvDtype: Config.Literals(kvDtypes, "GYRE_KV_DTYPE").pipe(Config.option, Config.map(Option.getOrUndefined)),
  pace: Config.String("GYRE_PACE").pipe(
    Config.withDefault(""),
    Config.map((text): Pace | undefined => {
      const parsed = parsePace(text)
      if (parsed !== undefined && "error" in parsed) throw new Error(`GYRE_PACE: ${parsed.error}`)
      return parsed
    })
  )
}).pipe(Config.map((c) => Object.fromEntries(Object.entries(c).filter(([, v]) => v !== undefined)) as unknown as RolloutConfig))

export type RolloutHandlers = Actor.Handlers<RpcGroup.Rpcs<typeof RolloutWorkerProtocol>>

const encodeChunk = Schema.encodeSync(TokenChunk)

/** Version `version`'s published weights, decoded by `engine` to the flat parameters of `model` (its config, on its device). */
export const fetchFlatWeights = (system: ActorSystemShape, engine: EngineShape, model: Model, version: number) =>
  fetchWeights(system, version).pipe(
    Effect.flatMap((blob) => Effect.scoped(engine.loadModel(model.config, blob, { device: model.device }).pipe(Effect.flatMap((m) => m.getWeights())))),
    Effect.mapError((e) => (e._tag === "WeightsUnavailable" ? e : new WeightsUnavailable({ version, reason: e.message })))
  )

/** What the rollout handlers work with: the loaded model, its batcher, and the run's transfer store and token subjects. */
interface Serving {
  readonly system: ActorSystemShape
  /** `kind/id` of the hosting actor, named in `WorkerUnavailable`. */
  readonly worker: string
  readonly config: RolloutConfig
  readonly engine: EngineShape
  readonly model: Model
  readonly batcher: BatcherShape
  readonly store: Effect.Success<ReturnType<typeof openTransferStore>>
  readonly layout: RlLayout
}

const unavailable = (s: Serving, what: string) => (e: { readonly message: string }) => new WorkerUnavailable({ worker: s.worker, reason: `${what}: ${e.message}` })

/** The request's prompt tokens after its base: inline, or read from the transfer store. */
const promptOf = (s: Serving, request: GenerateRequest) =>
  request.promptObject === undefined
    ? Effect.succeed(request.prompt)
    : getArrays(s.system, s.store, request.promptObject, ["int32"] as const).pipe(
        Effect.map(([prompt]) => prompt),
        Effect.mapError(unavailable(s, "the prompt object could not be read"))
      )

/** The answer as sent: its output moved to the transfer store when it is too long for one message. */
const bounded = (s: Serving) => (result: GenerateResult) =>
  result.output.length <= (s.config.inlineTokens ?? INLINE_TOKENS)
    ? Effect.succeed(result)
    : putArrays(s.store, "o", [result.output, result.logprobs, result.versions]).pipe(
        Effect.map((ref): GenerateResult => ({ ...result, output: new Int32Array(0), logprobs: new Float32Array(0), versions: new Int32Array(0), outputObject: ref })),
        Effect.mapError(unavailable(s, "the answer could not be stored"))
      )

/** Publishes a token chunk on the request's core NATS subject. */
const publishChunk = (s: Serving, request: string, chunk: TokenChunk) => {
  try {
    s.system.nats.nc.publish(s.layout.tokens(request), JSON.stringify(encodeChunk(chunk)))
  } catch {
    // connection closing: the answer still carries every token
  }
}

/**
 * Reads version `version`'s weights and swaps them in between two engine steps; nothing to do
 * when the model holds them already (a step's core made them itself: every weight change goes
 * through `swapWeights` with its version, so the batcher's version is the model's).
 */
const loadWeights = (s: Serving) => (version: number) =>
  Effect.suspend(() =>
    s.batcher.load().version === version
      ? Effect.succeed({ version })
      : fetchFlatWeights(s.system, s.engine, s.model, version).pipe(
          Effect.flatMap((weights) => s.batcher.swapWeights(s.model.setWeights(weights), version).pipe(Effect.orDie)),
          Effect.as({ version })
        )
  )

/** A generation with its prompt read, its tokens streamed when asked (then one `done` chunk), and its answer bounded. */
const generate = (s: Serving): RolloutHandlers["Generate"] => (request) =>
  promptOf(s, request).pipe(
    Effect.flatMap((prompt) =>
      s.batcher.generate({
        execution: request.execution,
        request: request.request,
        base: request.base,
        prompt,
        sampling: request.sampling,
        ...(request.stream ? { onTokens: (step) => publishChunk(s, request.request, { ...step, done: false }) } : {})
      })
    ),
    Effect.tap(() =>
      Effect.sync(() => {
        if (request.stream) publishChunk(s, request.request, { tokens: new Int32Array(0), logprobs: new Float32Array(0), versions: new Int32Array(0), done: true })
      })
    ),
    Effect.flatMap(bounded(s))
  )

const handlersOf = (s: Serving, load: ReturnType<typeof loadWeights>): RolloutHandlers => ({
  Generate: generate(s),
  Cancel: ({ request }) => Effect.sync(() => ({ found: s.batcher.cancel(request) })),
  Release: ({ execution }) => s.batcher.release(execution).pipe(Effect.orDie, Effect.map((freedBlocks) => ({ freedBlocks }))),
  LoadWeights: ({ version }) => load(version),
  Drain: ({ finish }) => s.batcher.drain(finish).pipe(Effect.map((cancelled) => ({ cancelled }))),
  Status: () => Effect.sync(() => s.batcher.load())
})

/** Loads the model, its KV cache and the batcher in the current scope; the rollout handlers over them. */
export const startRollout = Effect.fn("startRollout")(function* (
  ctx: Pick<Actor.ActorContext<unknown>, "address" | "system">,
  config: RolloutConfig,
  onLoad: (load: WorkerLoad) => void
) {
  if (config.checkpoint === "") return yield* Effect.die(new Error(`${ctx.address.kind}: no checkpoint configured (GYRE_CHECKPOINT)`))
  const engine = yield* Engine
  const device = config.device ?? workerDevice(ctx.address.id, engine.devices.length)
  const { model } = yield* loadCheckpoint(config.checkpoint, { device })
  const worker = formatAddress(ctx.address)
  const pacer = makePacer(config.pace, worker)
  const cache = yield* model.cache({ blockTokens: config.blockTokens ?? KV_BLOCK_TOKENS, numBlocks: config.numBlocks ?? DEFAULT_KV_BLOCKS, kvDtype: config.kvDtype ?? "f32" })
  const batcher = yield* makeBatcher(cache, {
    worker,
    maxContext: config.maxContext ?? model.config.max_position_embeddings,
    maxBatch: config.maxBatch ?? 32,
    prefillChunk: config.prefillChunk ?? 256,
    contextsPerExecution: config.contextsPerExecution ?? 64,
    version: config.version ?? 0,
    onLoad,
    pacer
  })
  const store = yield* openTransferStore(ctx.system)
  const s: Serving = { system: ctx.system, worker, config, engine, model, batcher, store, layout: rlLayout(ctx.system.run) }
  const load = loadWeights(s)
  return { engine, model, device, batcher, handlers: handlersOf(s, load), loadWeights: load, store, pacer }
})

export type RolloutRole = Effect.Success<ReturnType<typeof startRollout>>
