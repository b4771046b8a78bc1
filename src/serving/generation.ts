/**
 * One generation inside the batcher, as bookkeeping free of the engine: where it stands in
 * its prompt, the samples it drew (each with the policy version of the weights that drew it),
 * the compute it was charged, and when it ends: a stop sequence that includes at least one
 * output token, or its token limit (`maxTokens`, capped by the context left).
 *
 * `pending` holds the tokens still to append before the next real sample and `appended` how
 * many of them are in: the prompt after its cached prefix at first, then each sampled token.
 * A generation preempted for memory goes back to waiting and, admitted again, appends its
 * prompt ++ output after the longest prefix still cached: the engine's draw depends only on
 * the seed and the position, so it samples what it would have.
 */
import type { Deferred } from "effect"
import type { BaseRef } from "./kv-contexts.ts"
import type { FinishReason, GenerateResult, SamplingParams, StepTokens, WorkerUnavailable } from "../protocols/rollout.ts"

export interface GenerateJob {
  readonly execution: string
  readonly request: string
  readonly base: BaseRef | null
  /** Prompt tokens after `base` (all of them without a base). */
  readonly prompt: Int32Array
  readonly sampling: SamplingParams
  /** Called with each step's new tokens (streaming). */
  readonly onTokens?: (step: StepTokens) => void
}

export interface Generation {
  readonly job: GenerateJob
  readonly prompt: Int32Array
  readonly limit: number
  readonly seed: bigint
  readonly done: Deferred.Deferred<GenerateResult, WorkerUnavailable>
  cancelled: boolean
  /** Set on admission (-1 while waiting). */
  seq: number
  /** Prompt tokens found in the cache at its first admission. */
  cachedTokens: number
  /** Tokens the worker had held as K/V once (an evicted context, or this generation's before a preemption) and prefilled again. */
  reprefillTokens: number
  /** Preempted for memory: the K/V length it had, to resume from its kept context (or prefill again). */
  preemptedAt: number | undefined
  pending: Int32Array
  appended: number
  /** The prompt's K/V up to its last token is still to be kept as a context of its own. */
  anchorPrompt: boolean
  readonly output: Array<number>
  readonly logprobs: Array<number>
  readonly versions: Array<number>
  computeMs: number
  /** performance.now() when the worker took the job. */
  readonly receivedAt: number
}

const randomSeed = (): bigint => BigInt(Math.floor(Math.random() * 2 ** 53))

/** A generation of the resolved `prompt`, not yet admitted; `contextLimit` caps prompt + output. */
export const newGeneration = (
  job: GenerateJob,
  prompt: Int32Array,
  contextLimit: number,
  done: Deferred.Deferred<GenerateResult, WorkerUnavailable>
): Generation => ({
  job,
  prompt,
  limit: Math.min(job.sampling.maxTokens, contextLimit - prompt.length),
  seed: job.sampling.seed === null ? randomSeed() : BigInt.asUintN(64, BigInt(job.sampling.seed)),
  done,
  cancelled: false,
  seq: -1,
  cachedTokens: 0,
  reprefillTokens: 0,
  preemptedAt: undefined,
  pending: prompt,
  appended: 0,
  anchorPrompt: false,
  output: [],
  logprobs: [],
  versions: [],
  computeMs: 0,
  receivedAt: performance.now()
})

/** Whether prompt ++ output ends with `stop` at a position that includes at least one output token. */
export const endsWith = (prompt: Int32Array, output: ReadonlyArray<number>, stop: Int32Array): boolean => {
  const n = stop.length
  if (n === 0 || output.length === 0 || n > prompt.length + output.length) return false
  for (let k = 0; k < n; k++) {
    const i = output.length - n + k
    const token = i >= 0 ? output[i] : prompt[prompt.length + i]
    if (token !== stop[k]) return false
  }
  return true
}

/** Records a sampled token (streamed to `onTokens`); the finish reason if it ends the generation. */
export const acceptSample = (g: Generation, token: number, logprob: number, version: number): FinishReason | undefined => {
  g.output.push(token)
  g.logprobs.push(logprob)
  g.versions.push(version)
  g.pending = Int32Array.of(token)
  g.appended = 0
  g.job.onTokens?.({ tokens: Int32Array.of(token), logprobs: Float32Array.of(logprob), versions: Int32Array.of(version) })
  if (g.job.sampling.stop.some((s) => endsWith(g.prompt, g.output, s))) return "stop"
  return g.output.length >= g.limit ? "length" : undefined
}

/** The answer of a generation that ended (or was cancelled) with `finishReason`. */
export const resultOf = (g: Generation, finishReason: FinishReason, worker: string): GenerateResult => ({
  output: Int32Array.from(g.output),
  logprobs: Float32Array.from(g.logprobs),
  versions: Int32Array.from(g.versions),
  finishReason,
  promptTokens: g.prompt.length,
  cachedTokens: g.cachedTokens,
  reprefillTokens: g.reprefillTokens,
  computeMs: g.computeMs,
  workerMs: performance.now() - g.receivedAt,
  worker
})
