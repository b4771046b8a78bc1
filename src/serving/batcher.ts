/**
 * Continuous batching over one KV cache: the rollout worker's engine loop.
 *
 * `generate` resolves a request's prompt against the execution's cached contexts
 * (`kv-contexts.ts`) and queues it; one loop fiber runs engine steps while there is work.
 * Each step is one batched `forward` over every running generation: a decode token for
 * those that are generating and a chunk of prompt for those still prefilling (at most
 * `prefillChunk` prompt tokens per step, so a long prefill never stalls the decoders for
 * long). Requests join and leave between steps; at most `maxBatch` run at once, the rest
 * wait in arrival order. A step samples for every sequence (the engine's draw depends only on
 * the seed and the position, never on the batch), and a sample counts once a sequence's
 * prompt is in. Each token records the policy version of the weights that sampled it; new
 * weights are swapped in between steps.
 *
 * Contexts (`kv-contexts.ts`): a generation starts from a fork of the execution's cached
 * context whose K/V is the longest prefix of its prompt, and leaves two: its prompt without
 * the last token (forked off as soon as that is in, so a retry of the same prompt prefills
 * one token) and, when it ends, its prompt ++ output.
 *
 * Memory: when the pool is short, the least recently used cached context of any execution
 * is dropped, then the youngest running generation is cancelled (it answers with what it
 * has; the gateway continues it elsewhere). The effective context limit is the smaller of
 * `maxContext` and the pool's size.
 *
 * KV hand-off hooks (for the scheduler): `pinContext`, `exportContext`, `importContext`,
 * `unpinContext` act on an execution's latest context. A cancelled generation leaves its
 * context (prompt ++ partial output) like a finished one, so a request moved off this worker
 * is exported after the cancel, imported at the destination, and continued there with
 * `base` pointing at it: nothing is prefilled again.
 */
import { Deferred, Effect, Latch, Semaphore } from "effect"
import type { KvCache, SequenceInput } from "../engine/kvcache.ts"
import type { NativeError } from "../engine/native.ts"
import { ExecutionContexts, type BaseRef, type CachedContext } from "./kv-contexts.ts"
import {
  CacheMiss,
  ContextTooLong,
  WorkerUnavailable,
  type FinishReason,
  type GenerateResult,
  type SamplingParams,
  type WorkerLoad
} from "../protocols/rollout.ts"

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
}

/** One step's new tokens of a generation. */
export interface StepTokens {
  readonly tokens: Int32Array
  readonly logprobs: Float32Array
  readonly versions: Int32Array
}

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

/** An execution's context as it leaves for another worker. */
export interface ExportedContext {
  readonly tokens: Int32Array
  readonly kvLength: number
  /** The engine's GYKV hand-off buffer of `tokens[0, kvLength)`. */
  readonly buffer: Uint8Array
}

interface Generation {
  readonly job: GenerateJob
  readonly prompt: Int32Array
  readonly limit: number
  readonly seed: bigint
  readonly done: Deferred.Deferred<GenerateResult, WorkerUnavailable>
  cancelled: boolean
  /** Set on admission. */
  seq: number
  cachedTokens: number
  /** Tokens to append before the next real sample, and how many of them are in. */
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

export interface Batcher {
  readonly generate: (job: GenerateJob) => Effect.Effect<GenerateResult, CacheMiss | ContextTooLong | WorkerUnavailable>
  /** Marks a generation cancelled; it answers with what it has at the next step. */
  readonly cancel: (request: string) => boolean
  /** Frees an execution's cached contexts; resolves to the blocks freed. */
  readonly release: (execution: string) => Effect.Effect<number, NativeError>
  /** Stops admitting; `finish` lets running generations end, else cancels them. Resolves once idle. */
  readonly drain: (finish: boolean) => Effect.Effect<number>
  /** Runs `apply` (which changes the model's weights) between steps; later tokens carry `version`. */
  readonly swapWeights: (apply: Effect.Effect<void, NativeError>, version: number) => Effect.Effect<void, NativeError>
  readonly load: () => WorkerLoad
  /** Engine steps run and tokens sampled since the start. */
  readonly counters: () => { readonly steps: number; readonly tokens: number }
  /** Hand-off: pins the execution's latest context; its tokens and K/V length, or undefined. */
  readonly pinContext: (
    execution: string
  ) => Effect.Effect<{ readonly tokens: Int32Array; readonly kvLength: number; readonly seq: number } | undefined, NativeError>
  /** Hand-off: pins and exports the execution's latest context (unpin after the destination acknowledged). */
  readonly exportContext: (execution: string) => Effect.Effect<ExportedContext | undefined, NativeError>
  /** Hand-off: releases a pin taken by `pinContext` / `exportContext`. */
  readonly unpinContext: (execution: string) => Effect.Effect<void, NativeError>
  /** Hand-off: imports an exported context as the execution's latest, named by `request`. */
  readonly importContext: (execution: string, request: string, context: ExportedContext) => Effect.Effect<void, NativeError>
}

const randomSeed = (): bigint => BigInt(Math.floor(Math.random() * 2 ** 53))

/** Whether `seq` ends with `stop` at a position that includes at least one output token. */
const endsWith = (prompt: Int32Array, output: ReadonlyArray<number>, stop: Int32Array): boolean => {
  const n = stop.length
  if (n === 0 || n > prompt.length + output.length) return false
  for (let k = 0; k < n; k++) {
    const i = output.length - n + k
    const token = i >= 0 ? output[i] : prompt[prompt.length + i]
    if (token !== stop[k]) return false
  }
  return true
}

/** Starts the loop in the current scope; generations still running when it closes are cancelled. */
export const makeBatcher = (cache: KvCache, options: BatcherOptions) =>
  Effect.gen(function* () {
    const stats = yield* cache.stats()
    const capacity = stats.numBlocks * stats.blockTokens
    const contextLimit = Math.min(options.maxContext, capacity)
    const contexts = new ExecutionContexts(options.contextsPerExecution)
    const waiting: Array<Generation> = []
    const running: Array<Generation> = []
    const stepLock = yield* Semaphore.make(1)
    const wake = yield* Latch.make(false)
    let version = options.version
    let draining = false
    let idleWaiters: Array<Deferred.Deferred<void>> = []
    let generated = 0
    let steps = 0
    let rate = { at: performance.now(), generated: 0, perSecond: 0 }
    let blocks = { free: stats.freeBlocks, used: stats.usedBlocks }

    const load = (): WorkerLoad => ({
      activeSequences: running.length + waiting.length,
      cachedExecutions: contexts.executions,
      freeBlocks: blocks.free,
      usedBlocks: blocks.used,
      tokensPerSecond: rate.perSecond,
      version,
      draining
    })

    const freeSeq = (seq: number) => cache.free(seq).pipe(Effect.catchCause(() => Effect.void))
    const freeContexts = (list: ReadonlyArray<CachedContext>) => Effect.forEach(list, (c) => freeSeq(c.seq), { discard: true })

    const resultOf = (g: Generation, finishReason: FinishReason): GenerateResult => ({
      output: Int32Array.from(g.output),
      logprobs: Float32Array.from(g.logprobs),
      versions: Int32Array.from(g.versions),
      finishReason,
      promptTokens: g.prompt.length,
      cachedTokens: g.cachedTokens,
      computeMs: g.computeMs,
      workerMs: performance.now() - g.receivedAt,
      worker: options.worker
    })

    /** Ends a running generation: its sequence becomes a cached context (unless `keep` is false). */
    const finish = (g: Generation, reason: FinishReason, keep = true) =>
      Effect.gen(function* () {
        const at = running.indexOf(g)
        if (at < 0) return
        running.splice(at, 1)
        if (keep) {
          const tokens = new Int32Array(g.prompt.length + g.output.length)
          tokens.set(g.prompt)
          tokens.set(g.output, g.prompt.length)
          const kvLength = yield* cache.length(g.seq)
          yield* freeContexts(contexts.add({ execution: g.job.execution, request: g.job.request, seq: g.seq, tokens, kvLength }))
        } else {
          yield* freeSeq(g.seq)
        }
        Deferred.doneUnsafe(g.done, Effect.succeed(resultOf(g, reason)))
      })

    const admit = Effect.gen(function* () {
      while (running.length < options.maxBatch && waiting.length > 0) {
        const g = waiting.shift()!
        if (g.cancelled) {
          Deferred.doneUnsafe(g.done, Effect.succeed(resultOf(g, "cancelled")))
          continue
        }
        const anchor = contexts.bestPrefix(g.job.execution, g.prompt)
        g.seq = anchor === undefined ? yield* cache.create() : yield* cache.fork(anchor.seq)
        g.cachedTokens = anchor?.kvLength ?? 0
        g.pending = g.prompt.subarray(g.cachedTokens)
        g.anchorPrompt = g.pending.length > 1
        running.push(g)
      }
    })

    /**
     * Keeps the prompt's K/V without its last token as a context (a fork: it shares the blocks),
     * so a retry of the same prompt, or another continuation of it, prefills one token.
     */
    const anchorPrompt = (g: Generation) =>
      Effect.gen(function* () {
        g.anchorPrompt = false
        const seq = yield* cache.fork(g.seq)
        const kvLength = g.prompt.length - 1
        yield* freeContexts(contexts.add({ execution: g.job.execution, request: `${g.job.request}:prompt`, seq, tokens: g.prompt.subarray(0, kvLength), kvLength }))
      })

    /** Makes room in the pool: drops a cached context, else cancels the youngest generation. */
    const makeRoom = Effect.gen(function* () {
      const victim = contexts.evictOldest()
      if (victim !== undefined) return yield* freeSeq(victim.seq)
      const youngest = running.at(-1)
      if (youngest !== undefined) yield* finish(youngest, "cancelled", false)
    })

    const step = Effect.gen(function* () {
      yield* admit
      for (const g of running.filter((g) => g.cancelled)) yield* finish(g, "cancelled")
      if (running.length === 0) return
      // Decoders first, then prompt chunks within the step's budget.
      const inputs: Array<{ g: Generation; take: number }> = []
      let budget = options.prefillChunk
      for (const g of running) if (g.pending.length - g.appended === 1) inputs.push({ g, take: 1 })
      for (const g of running) {
        const left = g.pending.length - g.appended
        if (left > 1 && budget > 0) {
          const take = Math.min(g.anchorPrompt ? left - 1 : left, budget)
          budget -= take
          inputs.push({ g, take })
        }
      }
      const batch: Array<SequenceInput> = inputs.map(({ g, take }) => ({
        seq: g.seq,
        tokens: g.pending.subarray(g.appended, g.appended + take),
        sampling: { temperature: g.job.sampling.temperature, topP: g.job.sampling.topP, seed: g.seed }
      }))
      const stepVersion = version
      const started = performance.now()
      const result = yield* cache.forward(batch, "none").pipe(
        Effect.map((r) => r as typeof r | undefined),
        Effect.catchTag("OutOfKvBlocks", () => makeRoom.pipe(Effect.as(undefined)))
      )
      if (result === undefined) return
      const ms = performance.now() - started
      steps++
      const total = inputs.reduce((s, i) => s + i.take, 0)
      const ended: Array<[Generation, FinishReason]> = []
      const anchored: Array<Generation> = []
      inputs.forEach(({ g, take }, i) => {
        g.computeMs += (ms * take) / total
        g.appended += take
        if (g.anchorPrompt && g.appended === g.pending.length - 1) anchored.push(g)
        if (g.appended < g.pending.length) return
        const token = result.sampled![i]!
        const logprob = result.sampledLogprobs![i]!
        g.output.push(token)
        g.logprobs.push(logprob)
        g.versions.push(stepVersion)
        g.pending = Int32Array.of(token)
        g.appended = 0
        generated++
        g.job.onTokens?.({ tokens: Int32Array.of(token), logprobs: Float32Array.of(logprob), versions: Int32Array.of(stepVersion) })
        if (g.job.sampling.stop.some((s) => endsWith(g.prompt, g.output, s))) ended.push([g, "stop"])
        else if (g.output.length >= g.limit) ended.push([g, "length"])
      })
      for (const g of anchored) yield* anchorPrompt(g)
      for (const [g, reason] of ended) yield* finish(g, reason)
    })

    const report = Effect.gen(function* () {
      const now = performance.now()
      if (now - rate.at >= 1000) rate = { at: now, generated, perSecond: ((generated - rate.generated) * 1000) / (now - rate.at) }
      const s = yield* cache.stats()
      blocks = { free: s.freeBlocks, used: s.usedBlocks }
      options.onLoad?.(load())
      if (running.length === 0 && waiting.length === 0) for (const d of idleWaiters.splice(0)) Deferred.doneUnsafe(d, Effect.void)
    })

    const failRunning = (reason: string) =>
      Effect.gen(function* () {
        for (const g of [...running, ...waiting.splice(0)]) {
          if (running.includes(g)) {
            running.splice(running.indexOf(g), 1)
            yield* freeSeq(g.seq)
          }
          Deferred.doneUnsafe(g.done, Effect.fail(new WorkerUnavailable({ worker: options.worker, reason })))
        }
      })

    const loop = Effect.gen(function* () {
      while (true) {
        if (running.length === 0 && waiting.length === 0) {
          yield* report
          wake.closeUnsafe()
          if (running.length === 0 && waiting.length === 0) yield* wake.await
        }
        yield* stepLock.withPermit(step).pipe(
          Effect.catchCause((cause) =>
            Effect.logError(`${options.worker}: engine step failed; failing its generations`, cause).pipe(
              Effect.andThen(failRunning(`engine step failed: ${String(cause)}`))
            )
          )
        )
        yield* report.pipe(Effect.catchCause(() => Effect.void))
      }
    })
    yield* Effect.forkScoped(loop)
    yield* Effect.addFinalizer(() =>
      Effect.gen(function* () {
        for (const g of [...running, ...waiting]) g.cancelled = true
        for (const g of waiting.splice(0)) Deferred.doneUnsafe(g.done, Effect.succeed(resultOf(g, "cancelled")))
        for (const g of running.splice(0)) Deferred.doneUnsafe(g.done, Effect.succeed(resultOf(g, "cancelled")))
      })
    )

    const generate: Batcher["generate"] = (job) =>
      Effect.suspend((): Effect.Effect<GenerateResult, CacheMiss | ContextTooLong | WorkerUnavailable> => {
        if (draining) return Effect.fail(new WorkerUnavailable({ worker: options.worker, reason: "draining" }))
        const resolved = contexts.resolvePrompt(job.execution, job.base, job.prompt)
        if ("miss" in resolved) return Effect.fail(new CacheMiss({ execution: job.execution, reason: resolved.miss }))
        const prompt = resolved.prompt
        if (prompt.length === 0 || prompt.length >= contextLimit) {
          return Effect.fail(new ContextTooLong({ tokens: prompt.length, limit: contextLimit }))
        }
        const done = Deferred.makeUnsafe<GenerateResult, WorkerUnavailable>()
        const g: Generation = {
          job,
          prompt,
          limit: Math.min(job.sampling.maxTokens, contextLimit - prompt.length),
          seed: job.sampling.seed === null ? randomSeed() : BigInt.asUintN(64, BigInt(job.sampling.seed)),
          done,
          cancelled: false,
          seq: -1,
          cachedTokens: 0,
          pending: prompt,
          appended: 0,
          anchorPrompt: false,
          output: [],
          logprobs: [],
          versions: [],
          computeMs: 0,
          receivedAt: performance.now()
        }
        waiting.push(g)
        wake.openUnsafe()
        return Deferred.await(done).pipe(
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
          yield* freeContexts(contexts.release(execution))
          const after = yield* cache.stats()
          blocks = { free: after.freeBlocks, used: after.usedBlocks }
          return after.freeBlocks - before
        })
      )

    const drain: Batcher["drain"] = (finishRunning) =>
      Effect.gen(function* () {
        draining = true
        let cancelled = 0
        if (!finishRunning) {
          for (const g of [...running, ...waiting]) {
            if (!g.cancelled) cancelled++
            g.cancelled = true
          }
        }
        wake.openUnsafe()
        if (running.length > 0 || waiting.length > 0) {
          const idle = Deferred.makeUnsafe<void>()
          idleWaiters.push(idle)
          yield* Deferred.await(idle)
        }
        options.onLoad?.(load())
        return cancelled
      })

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

    // Contexts pinned for a hand-off, per execution (a pinned context may be released
    // meanwhile: its blocks stay until the unpin).
    const pinned = new Map<string, Array<CachedContext>>()

    const pinContext: Batcher["pinContext"] = (execution) =>
      stepLock.withPermit(
        Effect.gen(function* () {
          const c = contexts.latest(execution)
          if (c === undefined) return undefined
          yield* cache.pin(c.seq)
          c.pins++
          pinned.set(execution, [...(pinned.get(execution) ?? []), c])
          return { tokens: c.tokens, kvLength: c.kvLength, seq: c.seq }
        })
      )

    const exportContext: Batcher["exportContext"] = (execution) =>
      Effect.gen(function* () {
        const c = yield* pinContext(execution)
        if (c === undefined) return undefined
        const buffer = yield* stepLock.withPermit(cache.export(c.seq))
        return { tokens: c.tokens, kvLength: c.kvLength, buffer }
      })

    const unpinContext: Batcher["unpinContext"] = (execution) =>
      stepLock.withPermit(
        Effect.gen(function* () {
          const list = pinned.get(execution) ?? []
          const c = list.pop()
          if (list.length === 0) pinned.delete(execution)
          if (c === undefined) return
          c.pins--
          yield* cache.unpin(c.seq)
        })
      )

    const importContext: Batcher["importContext"] = (execution, request, context) =>
      stepLock.withPermit(
        Effect.gen(function* () {
          const seq = yield* cache.import(context.buffer)
          yield* freeContexts(contexts.add({ execution, request, seq, tokens: context.tokens, kvLength: context.kvLength }))
        })
      )

    return {
      generate,
      cancel,
      release,
      drain,
      swapWeights,
      load,
      counters: () => ({ steps, tokens: generated }),
      pinContext,
      exportContext,
      unpinContext,
      importContext
    } satisfies Batcher
  })
