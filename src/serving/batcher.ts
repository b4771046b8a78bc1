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
import { Deferred, Effect, Latch, Semaphore } from "effect"
import type { KvCache, SequenceInput } from "../engine/kvcache.ts"
import type { NativeError } from "../engine/native.ts"
import { CacheMiss, ContextTooLong, WorkerUnavailable, type FinishReason, type GenerateResult, type WorkerLoad } from "../protocols/rollout.ts"
import { makeLanes } from "./admission.ts"
import { acceptSample, newGeneration, type GenerateJob, type Generation } from "./generation.ts"
import { makeKvHandoff, type KvHandoff } from "./kv-handoff.ts"
import { makeKvPool } from "./kv-pool.ts"
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

export interface Batcher extends KvHandoff {
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

/** Starts the loop in the current scope; generations still running when it closes are cancelled. */
export const makeBatcher = (cache: KvCache, options: BatcherOptions) =>
  Effect.gen(function* () {
    const stats = yield* cache.stats()
    const poolTokens = stats.numBlocks * stats.blockTokens
    const contextLimit = Math.min(options.maxContext, poolTokens)
    const bound = poolTokens < options.maxContext ? "kv-pool" : "model"
    const pool = makeKvPool(cache, options.contextsPerExecution)
    const lanes = makeLanes(pool, options)
    const { waiting, running } = lanes
    const stepLock = yield* Semaphore.make(1)
    const wake = yield* Latch.make(false)
    let version = options.version
    let draining = false
    let idleWaiters: Array<Deferred.Deferred<void>> = []
    let generated = 0
    let processed = 0
    const answered = { promptTokens: 0, cachedTokens: 0, reprefillTokens: 0 }
    let steps = 0
    let rate = { at: performance.now(), generated: 0, perSecond: 0 }
    let blocks = { free: stats.freeBlocks, used: stats.usedBlocks }

    const load = (): WorkerLoad => ({
      activeSequences: running.length + waiting.length,
      cachedExecutions: pool.contexts.executions,
      freeBlocks: blocks.free,
      usedBlocks: blocks.used,
      tokensPerSecond: rate.perSecond,
      version,
      draining,
      processedTokens: processed,
      ...answered,
      evictedContexts: pool.contexts.evicted,
      preemptions: lanes.preemptions,
      ...(options.pacer?.pace === undefined ? {} : options.pacer.counts())
    })

    const step = Effect.gen(function* () {
      yield* lanes.admit
      for (const g of running.filter((g) => g.cancelled)) yield* lanes.finish(g, "cancelled")
      if (running.length === 0) return
      const inputs = planStep(running, options.prefillChunk)
      const batch: Array<SequenceInput> = inputs.map(({ g, take }) => ({
        seq: g.seq,
        tokens: g.pending.subarray(g.appended, g.appended + take),
        sampling: { temperature: g.job.sampling.temperature, topP: g.job.sampling.topP, seed: g.seed }
      }))
      const stepVersion = version
      const started = performance.now()
      const forward = cache.forward(batch, "none")
      const result = yield* (options.pacer === undefined ? forward : options.pacer.paced(forward, stepAmounts(inputs))).pipe(
        Effect.map((r) => r as typeof r | undefined),
        Effect.catchTag("OutOfKvBlocks", () => lanes.makeRoom.pipe(Effect.as(undefined)))
      )
      if (result === undefined) return
      const ms = performance.now() - started
      steps++
      const total = inputs.reduce((s, i) => s + i.take, 0)
      processed += total
      const ended: Array<[Generation, FinishReason]> = []
      const anchored: Array<Generation> = []
      inputs.forEach(({ g, take }, i) => {
        g.computeMs += (ms * take) / total
        g.appended += take
        if (g.anchorPrompt && g.appended === g.pending.length - 1) anchored.push(g)
        if (g.appended < g.pending.length) return
        generated++
        const reason = acceptSample(g, result.sampled![i]!, result.sampledLogprobs![i]!, stepVersion)
        if (reason !== undefined) ended.push([g, reason])
      })
      for (const g of anchored) yield* pool.anchor(g)
      for (const [g, reason] of ended) yield* lanes.finish(g, reason)
    })

    const report = Effect.gen(function* () {
      const now = performance.now()
      if (now - rate.at >= 1000) rate = { at: now, generated, perSecond: ((generated - rate.generated) * 1000) / (now - rate.at) }
      const s = yield* cache.stats()
      blocks = { free: s.freeBlocks, used: s.usedBlocks }
      options.onLoad?.(load())
      if (lanes.idle) for (const d of idleWaiters.splice(0)) Deferred.doneUnsafe(d, Effect.void)
    })

    const loop = Effect.gen(function* () {
      while (true) {
        if (lanes.idle) {
          yield* report
          wake.closeUnsafe()
          if (lanes.idle) yield* wake.await
        }
        yield* stepLock.withPermit(step).pipe(
          Effect.catchCause((cause) =>
            Effect.logError(`${options.worker}: engine step failed; failing its generations`, cause).pipe(
              Effect.andThen(lanes.failAll(`engine step failed: ${String(cause)}`))
            )
          )
        )
        yield* report.pipe(Effect.catchCause(() => Effect.void))
      }
    })
    yield* Effect.forkScoped(loop)
    yield* Effect.addFinalizer(() => lanes.cancelAll)

    const generate: Batcher["generate"] = (job) =>
      Effect.suspend((): Effect.Effect<GenerateResult, CacheMiss | ContextTooLong | WorkerUnavailable> => {
        if (draining) return Effect.fail(new WorkerUnavailable({ worker: options.worker, reason: "draining" }))
        const resolved = pool.contexts.resolvePrompt(job.execution, job.base, job.prompt)
        if ("miss" in resolved) return Effect.fail(new CacheMiss({ execution: job.execution, reason: resolved.miss }))
        const prompt = resolved.prompt
        if (prompt.length === 0 || prompt.length >= contextLimit) {
          return Effect.fail(new ContextTooLong({ tokens: prompt.length, limit: contextLimit, bound }))
        }
        const g = newGeneration(job, prompt, contextLimit, Deferred.makeUnsafe())
        waiting.push(g)
        wake.openUnsafe()
        return Deferred.await(g.done).pipe(
          Effect.tap((r) =>
            Effect.sync(() => {
              answered.promptTokens += r.promptTokens
              answered.cachedTokens += r.cachedTokens
              answered.reprefillTokens += r.reprefillTokens
            })
          ),
          Effect.onInterrupt(() =>
            Effect.sync(() => {
              g.cancelled = true
            })
          )
        )
      })

    const cancel: Batcher["cancel"] = (request) => {
      const g = [...running, ...waiting].find((x) => x.job.request === request)
      if (g === undefined) return false
      g.cancelled = true
      wake.openUnsafe()
      return true
    }

    const release: Batcher["release"] = (execution) =>
      stepLock.withPermit(
        Effect.gen(function* () {
          const before = (yield* cache.stats()).freeBlocks
          yield* pool.release(execution)
          const after = yield* cache.stats()
          blocks = { free: after.freeBlocks, used: after.usedBlocks }
          return after.freeBlocks - before
        })
      )

    /** Stops admitting, cancels the generations unless `finishRunning`; resolves once idle with those it cancelled. */
    const stop = (finishRunning: boolean) =>
      Effect.gen(function* () {
        draining = true
        const cancelled = finishRunning ? [] : [...running, ...waiting].filter((g) => !g.cancelled)
        for (const g of cancelled) g.cancelled = true
        wake.openUnsafe()
        if (!lanes.idle) {
          const idle = Deferred.makeUnsafe<void>()
          idleWaiters.push(idle)
          yield* Deferred.await(idle)
        }
        options.onLoad?.(load())
        return cancelled
      })
    const drain: Batcher["drain"] = (finishRunning) => stop(finishRunning).pipe(Effect.map((cancelled) => cancelled.length))
    const pause: Batcher["pause"] = stop(false).pipe(Effect.map((paused) => paused.map((g) => ({ execution: g.job.execution, request: g.job.request }))))
    const resume: Batcher["resume"] = () => {
      draining = false
      options.onLoad?.(load())
    }

    const swapWeights: Batcher["swapWeights"] = (apply, next) =>
      stepLock.withPermit(
        apply.pipe(
          Effect.tap(() =>
            Effect.sync(() => {
              version = next
              options.onLoad?.(load())
            })
          )
        )
      )

    return {
      generate,
      cancel,
      release,
      drain,
      pause,
      resume,
      executions: () => pool.contexts.ids(),
      swapWeights,
      load,
      counters: () => ({ steps, tokens: generated }),
      ...makeKvHandoff(cache, pool, stepLock)
    } satisfies Batcher
  })
