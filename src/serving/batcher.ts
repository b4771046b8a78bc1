/**
 * Continuous batching over one KV cache: the rollout worker's engine loop.
 *
 * `generate` resolves a request's prompt against the execution's cached contexts
 * (`kv-contexts.ts`) and queues it; one loop fiber runs engine steps while there is work.
 * Each step is one batched `forward` over every running generation (`step-plan.ts`: a decode
 * token for those that are generating and a chunk of prompt for those still prefilling, at
 * most `prefillChunk` prompt tokens per step). Requests join and leave between steps
 * (`admission.ts`: at most `maxBatch` run at once, the rest wait in arrival order). A step
 * samples for every sequence (the engine's draw depends only on the seed and the position,
 * never on the batch), and a sample counts once a sequence's prompt is in
 * (`generation.ts`). Each token records the policy version of the weights that sampled it;
 * new weights are swapped in between steps. On a paced device (`pacer`, `pace.ts`) a step
 * completes no earlier than a decode step and its prompt tokens take at the pace's rates.
 *
 * Contexts (`kv-pool.ts`): a generation starts from a fork of the execution's cached context
 * whose K/V is the longest prefix of its prompt, and leaves two: its prompt without the last
 * token and, when it ends, its prompt ++ output.
 *
 * Memory (`admission.ts`): when the pool is short, the least recently used cached context of
 * any execution is dropped, then the youngest running generation is preempted (it resumes
 * here later). The effective context limit is the smaller of `maxContext` and the pool's size:
 * a prompt under it is never refused for memory, and its tokens that an evicted context had
 * held count as prefilled again (`reprefillTokens`).
 *
 * KV hand-off hooks (`kv-handoff.ts`): `pinContext`, `exportContext`, `importContext`,
 * `unpinContext` act on an execution's latest context (or a named request's). A device's role
 * switch (`role-switch.ts`) `pause`s every generation at a step boundary, exports their
 * contexts and every execution's latest one, and `resume`s admission when it serves again.
 */
import { Context, Deferred, Effect, Latch, Layer, Semaphore, type Scope } from "effect"
import type { ForwardResult, KvCache, SequenceInput } from "../engine/kvcache.ts"
import type { NativeError } from "../engine/native.ts"
import { CacheMiss, ContextTooLong, WorkerUnavailable, type FinishReason, type GenerateResult, type WorkerLoad } from "../protocols/rollout.ts"
import { makeLanes, type Lanes } from "./admission.ts"
import { acceptSample, newGeneration, type GenerateJob, type Generation } from "./generation.ts"
import { makeKvHandoff, type KvHandoff } from "./kv-handoff.ts"
import { makeKvPool, type KvPool } from "./kv-pool.ts"
import type { Pacer } from "./pace.ts"
import { planStep, type StepInput } from "./step-plan.ts"

export interface BatcherOptions {
  /** `rollout-worker/<id>`, reported in results. */
  readonly worker: string
  readonly maxContext: number
  /** Generations running at once (the rest wait). */
  readonly maxBatch: number
  /** Prompt tokens prefilled per step, across sequences. */
  readonly prefillChunk: number
  readonly contextsPerExecution: number
  /** Policy version of the initial weights. */
  readonly version: number
  /** Called after every step with the load figures. */
  readonly onLoad?: (load: WorkerLoad) => void
  /** The device's pacer (`pace.ts`): each step completes no earlier than its pace allows; its counts join the load. */
  readonly pacer?: Pacer
}

/** What a step does for the pace: a decode step when any sequence samples its next token, and the prompt tokens it prefills. */
const stepAmounts = (inputs: ReadonlyArray<StepInput>) => {
  const decoding = inputs.filter(({ g }) => g.pending.length - g.appended === 1)
  return { decode: decoding.length > 0 ? 1 : 0, prefill: inputs.reduce((s, i) => s + i.take, 0) - decoding.length }
}

export interface BatcherShape extends KvHandoff {
  readonly generate: (job: GenerateJob) => Effect.Effect<GenerateResult, CacheMiss | ContextTooLong | WorkerUnavailable>
  /** Marks a generation cancelled; it answers with what it has at the next step. */
  readonly cancel: (request: string) => boolean
  /** Frees an execution's cached contexts; resolves to the blocks freed. */
  readonly release: (execution: string) => Effect.Effect<number, NativeError>
  /** Stops admitting; `finish` lets running generations end, else cancels them. Resolves once idle. */
  readonly drain: (finish: boolean) => Effect.Effect<number>
  /**
   * Stops admitting and cancels every generation at the next step boundary (each answers with
   * its partial output and leaves its context); resolves once idle with those it paused.
   */
  readonly pause: Effect.Effect<ReadonlyArray<{ readonly execution: string; readonly request: string }>>
  /** Admits again after a drain or pause. */
  readonly resume: () => void
  /** Executions with cached contexts. */
  readonly executions: () => ReadonlyArray<string>
  /** Runs `apply` (which changes the model's weights) between steps; later tokens carry `version`. */
  readonly swapWeights: (apply: Effect.Effect<void, NativeError>, version: number) => Effect.Effect<void, NativeError>
  readonly load: () => WorkerLoad
  /** Engine steps run and tokens sampled since the start. */
  readonly counters: () => { readonly steps: number; readonly tokens: number }
}

/** What the batcher's loop and operations share: its pool, lanes and lock, and the figures of its load. */
interface BatcherState {
  readonly cache: KvCache
  readonly options: BatcherOptions
  /** The smaller of `maxContext` and the pool's size, and which of the two it is. */
  readonly contextLimit: number
  readonly bound: "kv-pool" | "model"
  readonly pool: KvPool
  readonly lanes: Lanes
  /** Held by a step, and by what must run between steps (release, weight swap, hand-off). */
  readonly stepLock: Semaphore.Semaphore
  /** Opened when there is work for an idle loop. */
  readonly wake: Latch.Latch
  /** Completed when the lanes are next idle (`drain`, `pause`). */
  readonly idleWaiters: Array<Deferred.Deferred<void>>
  /** Policy version of the weights in the engine. */
  version: number
  draining: boolean
  generated: number
  processed: number
  steps: number
  readonly answered: { promptTokens: number; cachedTokens: number; reprefillTokens: number }
  rate: { at: number; generated: number; perSecond: number }
  blocks: { free: number; used: number }
}

const load = (s: BatcherState): WorkerLoad => ({
  activeSequences: s.lanes.running.length + s.lanes.waiting.length,
  cachedExecutions: s.pool.contexts.executions,
  freeBlocks: s.blocks.free,
  usedBlocks: s.blocks.used,
  tokensPerSecond: s.rate.perSecond,
  version: s.version,
  draining: s.draining,
  processedTokens: s.processed,
  ...s.answered,
  evictedContexts: s.pool.contexts.evicted,
  preemptions: s.lanes.preemptions,
  ...(s.options.pacer?.pace === undefined ? {} : s.options.pacer.counts())
})

const sequenceInput = ({ g, take }: StepInput): SequenceInput => ({
  seq: g.seq,
  tokens: g.pending.subarray(g.appended, g.appended + take),
  sampling: { temperature: g.job.sampling.temperature, topP: g.job.sampling.topP, seed: g.seed }
})

/**
 * Books a step's forward on its generations: their compute time and appended tokens, and a
 * sample for each whose prompt is in. Fills `anchored` (prompt in but its last token) and `ended`.
 */
const account = (
  s: BatcherState,
  inputs: ReadonlyArray<StepInput>,
  result: ForwardResult,
  ms: number,
  stepVersion: number,
  anchored: Array<Generation>,
  ended: Array<[Generation, FinishReason]>
) => {
  s.steps++
  const total = inputs.reduce((sum, i) => sum + i.take, 0)
  s.processed += total
  inputs.forEach(({ g, take }, i) => {
    g.computeMs += (ms * take) / total
    g.appended += take
    if (g.anchorPrompt && g.appended === g.pending.length - 1) anchored.push(g)
    if (g.appended < g.pending.length) return
    s.generated++
    const reason = acceptSample(g, result.sampled![i]!, result.sampledLogprobs![i]!, stepVersion)
    if (reason !== undefined) ended.push([g, reason])
  })
}

/** One engine step over the running generations (the module comment). Built once per batcher: the hot decode path. */
const step = (s: BatcherState) =>
  Effect.gen(function* () {
    const { lanes, options } = s
    yield* lanes.admit
    for (const g of lanes.running.filter((g) => g.cancelled)) yield* lanes.finish(g, "cancelled")
    if (lanes.running.length === 0) return
    const inputs = planStep(lanes.running, options.prefillChunk)
    const batch = inputs.map(sequenceInput)
    const stepVersion = s.version
    const started = performance.now()
    const forward = s.cache.forward(batch, "none")
    const result = yield* (options.pacer === undefined ? forward : options.pacer.paced(forward, stepAmounts(inputs))).pipe(
      Effect.map((r) => r as typeof r | undefined),
      Effect.catchTag("OutOfKvBlocks", () => lanes.makeRoom.pipe(Effect.as(undefined)))
    )
    if (result === undefined) return
    const ended: Array<[Generation, FinishReason]> = []
    const anchored: Array<Generation> = []
    account(s, inputs, result, performance.now() - started, stepVersion, anchored, ended)
    for (const g of anchored) yield* s.pool.anchor(g)
    for (const [g, reason] of ended) yield* lanes.finish(g, reason)
  })

/** After a step (and before idling): the token rate, the pool's blocks, `onLoad`, and the idle waiters. */
const report = (s: BatcherState) =>
  Effect.gen(function* () {
    const now = performance.now()
    if (now - s.rate.at >= 1000) s.rate = { at: now, generated: s.generated, perSecond: ((s.generated - s.rate.generated) * 1000) / (now - s.rate.at) }
    const stats = yield* s.cache.stats()
    s.blocks = { free: stats.freeBlocks, used: stats.usedBlocks }
    s.options.onLoad?.(load(s))
    if (s.lanes.idle) for (const d of s.idleWaiters.splice(0)) Deferred.doneUnsafe(d, Effect.void)
  })

/** Steps while there is work, else waits for `wake`; a failed step fails its generations. */
const loop = (s: BatcherState) => {
  const once = step(s)
  const reported = report(s)
  return Effect.gen(function* () {
    while (true) {
      if (s.lanes.idle) {
        yield* reported
        s.wake.closeUnsafe()
        if (s.lanes.idle) yield* s.wake.await
      }
      yield* s.stepLock.withPermit(once).pipe(
        Effect.catchCause((cause) =>
          Effect.logError(`${s.options.worker}: engine step failed; failing its generations`, cause).pipe(
            Effect.andThen(s.lanes.failAll(`engine step failed: ${String(cause)}`))
          )
        )
      )
      yield* reported.pipe(Effect.catchCause(() => Effect.void))
    }
  })
}

const generate = (s: BatcherState): BatcherShape["generate"] => (job) =>
  Effect.suspend((): Effect.Effect<GenerateResult, CacheMiss | ContextTooLong | WorkerUnavailable> => {
    if (s.draining) return Effect.fail(new WorkerUnavailable({ worker: s.options.worker, reason: "draining" }))
    const resolved = s.pool.contexts.resolvePrompt(job.execution, job.base, job.prompt)
    if ("miss" in resolved) return Effect.fail(new CacheMiss({ execution: job.execution, reason: resolved.miss }))
    const prompt = resolved.prompt
    if (prompt.length === 0 || prompt.length >= s.contextLimit) {
      return Effect.fail(new ContextTooLong({ tokens: prompt.length, limit: s.contextLimit, bound: s.bound }))
    }
    const g = newGeneration(job, prompt, s.contextLimit, Deferred.makeUnsafe())
    s.lanes.waiting.push(g)
    s.wake.openUnsafe()
    return Deferred.await(g.done).pipe(
      Effect.tap((r) =>
        Effect.sync(() => {
          s.answered.promptTokens += r.promptTokens
          s.answered.cachedTokens += r.cachedTokens
          s.answered.reprefillTokens += r.reprefillTokens
        })
      ),
      Effect.onInterrupt(() =>
        Effect.sync(() => {
          g.cancelled = true
        })
      )
    )
  })

const cancel = (s: BatcherState): BatcherShape["cancel"] => (request) => {
  const g = [...s.lanes.running, ...s.lanes.waiting].find((x) => x.job.request === request)
  if (g === undefined) return false
  g.cancelled = true
  s.wake.openUnsafe()
  return true
}

const release = (s: BatcherState): BatcherShape["release"] =>
  Effect.fn("Batcher.release")(function* (execution) {
    return yield* s.stepLock.withPermit(
      Effect.gen(function* () {
        const before = (yield* s.cache.stats()).freeBlocks
        yield* s.pool.release(execution)
        const after = yield* s.cache.stats()
        s.blocks = { free: after.freeBlocks, used: after.usedBlocks }
        return after.freeBlocks - before
      })
    )
  })

/** Stops admitting, cancels the generations unless `finishRunning`; resolves once idle with those it cancelled. */
const stop = (s: BatcherState, finishRunning: boolean) =>
  Effect.gen(function* () {
    s.draining = true
    const cancelled = finishRunning ? [] : [...s.lanes.running, ...s.lanes.waiting].filter((g) => !g.cancelled)
    for (const g of cancelled) g.cancelled = true
    s.wake.openUnsafe()
    if (!s.lanes.idle) {
      const idle = Deferred.makeUnsafe<void>()
      s.idleWaiters.push(idle)
      yield* Deferred.await(idle)
    }
    s.options.onLoad?.(load(s))
    return cancelled
  })

const swapWeights = (s: BatcherState): BatcherShape["swapWeights"] =>
  Effect.fn("Batcher.swapWeights")(function* (apply, next) {
    yield* s.stepLock.withPermit(
      apply.pipe(
        Effect.tap(() =>
          Effect.sync(() => {
            s.version = next
            s.options.onLoad?.(load(s))
          })
        )
      )
    )
  })

/** The batcher's state over a fresh pool of `cache`. */
const initialState = Effect.fnUntraced(function* (cache: KvCache, options: BatcherOptions) {
  const stats = yield* cache.stats()
  const poolTokens = stats.numBlocks * stats.blockTokens
  const pool = makeKvPool(cache, options.contextsPerExecution)
  const s: BatcherState = {
    cache,
    options,
    contextLimit: Math.min(options.maxContext, poolTokens),
    bound: poolTokens < options.maxContext ? "kv-pool" : "model",
    pool,
    lanes: makeLanes(pool, options),
    stepLock: yield* Semaphore.make(1),
    wake: yield* Latch.make(false),
    idleWaiters: [],
    version: options.version,
    draining: false,
    generated: 0,
    processed: 0,
    steps: 0,
    answered: { promptTokens: 0, cachedTokens: 0, reprefillTokens: 0 },
    rate: { at: performance.now(), generated: 0, perSecond: 0 },
    blocks: { free: stats.freeBlocks, used: stats.usedBlocks }
  }
  return s
})

/** Starts the loop in the current scope; generations still running when it closes are cancelled. */
export const makeBatcher = Effect.fn("Batcher.make")(function* (cache: KvCache, options: BatcherOptions) {
  const s = yield* initialState(cache, options)
  yield* Effect.forkScoped(loop(s))
  yield* Effect.addFinalizer(() => s.lanes.cancelAll)
  return {
    generate: generate(s),
    cancel: cancel(s),
    release: release(s),
    drain: (finishRunning) => stop(s, finishRunning).pipe(Effect.map((cancelled) => cancelled.length)),
    pause: stop(s, false).pipe(Effect.map((paused) => paused.map((g) => ({ execution: g.job.execution, request: g.job.request })))),
    resume: () => {
      s.draining = false
      s.options.onLoad?.(load(s))
    },
    executions: () => s.pool.contexts.ids(),
    swapWeights: swapWeights(s),
    load: () => load(s),
    counters: () => ({ steps: s.steps, tokens: s.generated }),
    ...makeKvHandoff(cache, s.pool, s.stepLock)
  } satisfies BatcherShape
})

/** Continuous batching over one KV cache (the module comment); its loop lives in the scope it is made in. */
export class Batcher extends Context.Service<Batcher, BatcherShape>()("gyre/serving/Batcher") {
  static readonly make: (cache: KvCache, options: BatcherOptions) => Effect.Effect<BatcherShape, NativeError, Scope.Scope> = makeBatcher
  static readonly layer = (cache: KvCache, options: BatcherOptions) => Layer.effect(Batcher, makeBatcher(cache, options))
}
