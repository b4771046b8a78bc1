/**
 * The rollout worker's protocol, shared by the gateway (sender) and the worker (receiver).
 *
 * `Generate` continues an execution's context. The worker keeps each execution's tokens
 * (prompt + output of its calls) in its paged KV cache between calls, so the gateway sends
 * only what the worker does not have: `base` says how many tokens of the worker's cached
 * sequence for this execution the prompt starts with (and their digest), `prompt` holds the
 * rest. A worker that does not hold that prefix (another worker served the execution, the
 * cache was evicted, the worker restarted) answers `CacheMiss`, and the gateway resends the
 * whole prompt with `base: null`. The worker prefills only the tokens it does not have.
 *
 * No message grows with the context: a prompt of more than `INLINE_TOKENS` tokens after its base
 * goes as an object of the run's transfer store (`promptObject`, `transfer.ts`), and so does an
 * answer with more output tokens (`outputObject`).
 *
 * With `stream`, the worker publishes each step's new tokens as a `TokenChunk` on the core
 * NATS subject `gyre.<run>.tokens.<request>` before the final answer.
 */
import { Schema } from "effect"
import { Rpc, RpcGroup } from "effect/rpc"
import { Float32ArrayFromBase64, Int32ArrayFromBase64 } from "../tree/wire.ts"
import { ExecutionId } from "./layout.ts"
import { TokensRef } from "./transfer.ts"

const NonNegativeInt = Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))
const PositiveInt = Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))

export const SamplingParams = Schema.Struct({
  maxTokens: PositiveInt,
  temperature: Schema.Number.check(Schema.isGreaterThanOrEqualTo(0)),
  topP: Schema.Number.check(Schema.isBetween({ minimum: 0, maximum: 1, exclusiveMinimum: true })),
  seed: Schema.NullOr(Schema.Int),
  /** Generation stops after any of these token sequences (the stop sequence is kept in the output). */
  stop: Schema.Array(Int32ArrayFromBase64)
})
export type SamplingParams = typeof SamplingParams.Type

export const PromptBase = Schema.Struct({
  /** Tokens of the worker's cached sequence for the execution that the prompt starts with. */
  length: PositiveInt,
  /** `digestOf` (src/tree/hash.ts) of those tokens. */
  digest: Schema.String,
  /**
   * The earlier request of the execution whose sequence (prompt ++ output) the prompt
   * starts with; absent: the execution's most recent one on this worker.
   */
  request: Schema.optional(ExecutionId)
})

export const GenerateRequest = Schema.Struct({
  execution: ExecutionId,
  /** Unique per call: names the token stream and cancellation. */
  request: ExecutionId,
  base: Schema.NullOr(PromptBase),
  /** The prompt tokens after `base` (all of them when `base` is null); empty when `promptObject` holds them. */
  prompt: Int32ArrayFromBase64,
  /** The prompt tokens after `base`, as an object of the transfer store (one int32 array). */
  promptObject: Schema.optional(TokensRef),
  sampling: SamplingParams,
  stream: Schema.Boolean
})
export type GenerateRequest = typeof GenerateRequest.Type

export const FinishReason = Schema.Literals(["stop", "length", "cancelled"])
export type FinishReason = typeof FinishReason.Type

export const GenerateResult = Schema.Struct({
  output: Int32ArrayFromBase64,
  /** Behaviour log-probability of each output token under the sampling distribution. */
  logprobs: Float32ArrayFromBase64,
  /** Policy version of each output token. */
  versions: Int32ArrayFromBase64,
  /** `output`, `logprobs` and `versions` as an object of the transfer store (the three arrays empty here); the reader deletes it. */
  outputObject: Schema.optional(TokensRef),
  finishReason: FinishReason,
  /** Prompt tokens in all; of them, found in the cache (not prefilled again). */
  promptTokens: NonNegativeInt,
  cachedTokens: NonNegativeInt,
  /**
   * Tokens this worker had held as K/V and prefilled again: prompt tokens of a context it evicted
   * (its KV pool was full), and the generation's own after a preemption for memory.
   */
  reprefillTokens: NonNegativeInt,
  /** Milliseconds of engine compute spent on this request (its share of batched steps). */
  computeMs: Schema.Number,
  /** Milliseconds from the worker taking the request to its answer (queueing and batching included). */
  workerMs: Schema.Number,
  /** The worker that served it (`rollout-worker/<id>` or `device/<id>`). */
  worker: Schema.String,
  /**
   * The generation was paused by a role switch and its context (prompt ++ output) handed to
   * this device (`device/<id>`) under the same request id: continue there with `base` = that
   * sequence, the same seed and the remaining tokens (nothing is prefilled again).
   */
  movedTo: Schema.optional(Schema.String)
})
export type GenerateResult = typeof GenerateResult.Type

/** One streamed step of a generation. */
export const TokenChunk = Schema.Struct({
  tokens: Int32ArrayFromBase64,
  logprobs: Float32ArrayFromBase64,
  /** Policy version of each token (absent from senders that predate it). */
  versions: Schema.optional(Int32ArrayFromBase64),
  done: Schema.Boolean
})
export type TokenChunk = typeof TokenChunk.Type

/** One step's new tokens of a generation, in process: what the batcher hands to a stream, and the gateway reads from a `TokenChunk`. */
export interface StepTokens {
  readonly tokens: Int32Array
  readonly logprobs: Float32Array
  readonly versions: Int32Array
}

export class CacheMiss extends Schema.TaggedError<CacheMiss>()("CacheMiss", {
  execution: Schema.String,
  reason: Schema.String
}) {}

/**
 * The prompt does not fit: `limit` is the worker's context limit, the smaller of the model's
 * (`bound: "model"`: max_position_embeddings or the configured maximum) and its whole KV pool
 * (`bound: "kv-pool"`: `--kv-blocks` x 16 tokens; a prompt that fits is never refused for
 * memory, other contexts are evicted for it).
 */
export class ContextTooLong extends Schema.TaggedError<ContextTooLong>()("ContextTooLong", {
  tokens: Schema.Number,
  limit: Schema.Number,
  bound: Schema.optional(Schema.Literals(["model", "kv-pool"]))
}) {}

/** The worker is draining or out of cache memory: retry on another worker. */
export class WorkerUnavailable extends Schema.TaggedError<WorkerUnavailable>()("WorkerUnavailable", {
  worker: Schema.String,
  reason: Schema.String
}) {}

/** The weights of a policy version could not be read from the run's object store. */
export class WeightsUnavailable extends Schema.TaggedError<WeightsUnavailable>()("WeightsUnavailable", {
  version: Schema.Number,
  reason: Schema.String
}) {}

export const WorkerLoad = Schema.Struct({
  activeSequences: NonNegativeInt,
  cachedExecutions: NonNegativeInt,
  freeBlocks: NonNegativeInt,
  usedBlocks: NonNegativeInt,
  tokensPerSecond: Schema.Number,
  version: Schema.Int,
  draining: Schema.Boolean,
  /** Tokens run through the model since the start (prompt chunks and decode tokens). */
  processedTokens: NonNegativeInt,
  /** Since the start: prompt tokens of the requests answered, of them found in the cache, and tokens prefilled again (`GenerateResult`). */
  promptTokens: NonNegativeInt,
  cachedTokens: NonNegativeInt,
  reprefillTokens: NonNegativeInt,
  /** Since the start: cached contexts evicted for room, and generations preempted for memory (resumed later here). */
  evictedContexts: NonNegativeInt,
  preemptions: NonNegativeInt,
  /** On a paced device (`--pace`), since the start: work items paced (engine steps, micro-batches) and of them overruns (real compute longer than the paced time). */
  pacedWork: Schema.optional(NonNegativeInt),
  paceOverruns: Schema.optional(NonNegativeInt)
})
export type WorkerLoad = typeof WorkerLoad.Type

export const RolloutWorkerProtocol = RpcGroup.make(
  Rpc.make("Generate", {
    payload: GenerateRequest,
    success: GenerateResult,
    error: Schema.Union([CacheMiss, ContextTooLong, WorkerUnavailable])
  }),
  /** Cancels a running generation; it answers with what it has, finishReason "cancelled". */
  Rpc.make("Cancel", { payload: { request: ExecutionId }, success: Schema.Struct({ found: Schema.Boolean }) }),
  /** Frees an execution's cached context (its harness finished). */
  Rpc.make("Release", { payload: { execution: ExecutionId }, success: Schema.Struct({ freedBlocks: NonNegativeInt }) }),
  /** Loads a policy version's weights from the run's object store; later tokens carry it. */
  Rpc.make("LoadWeights", {
    payload: { version: NonNegativeInt },
    success: Schema.Struct({ version: Schema.Int }),
    error: WeightsUnavailable
  }),
  /** Stops admitting new executions; `finish` lets running generations end, else they are cancelled. */
  Rpc.make("Drain", { payload: { finish: Schema.Boolean }, success: Schema.Struct({ cancelled: NonNegativeInt }) }),
  Rpc.make("Status", { success: WorkerLoad })
)
