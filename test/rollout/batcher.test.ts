/**
 * The rollout worker's engine loop on the real CPU engine (tiny preset), in process:
 * continuous batching gives the same tokens as one-at-a-time generation in fewer steps,
 * an execution's next call prefills only its new suffix, a retry from an earlier point
 * forks the right cached context, a prompt sharing only part of a context forks that part, context limits, cancellation, a pool too small for the
 * cached contexts, the KV hand-off hooks (export -> import -> identical continuation), and
 * the pause of a role switch (every generation leaves its context; resume admits again).
 */
import { Effect, Fiber, Layer, Logger, type Scope } from "effect"
import { describe, expect, it } from "vitest"
import { Engine } from "../../src/engine/engine.ts"
import type { KvCache } from "../../src/engine/kvcache.ts"
import { presets } from "../../src/engine/presets.ts"
import { special } from "../../src/engine/tokenizer.ts"
import { makeBatcher, type BatcherShape, type BatcherOptions } from "../../src/serving/batcher.ts"
import type { SamplingParams } from "../../src/protocols/rollout.ts"
import { digestOf } from "../../src/tree/hash.ts"

const run = <A, E>(effect: Effect.Effect<A, E, Engine | Scope.Scope>): Promise<A> =>
  Effect.runPromise(effect.pipe(Effect.scoped, Effect.provide(Engine.layer.pipe(Layer.provide(Logger.layer([]))))))

const options: BatcherOptions = { worker: "rollout-worker/test", maxContext: 4096, maxBatch: 8, prefillChunk: 64, contextsPerExecution: 8, version: 3 }

const cacheOf = (numBlocks: number) =>
  Effect.gen(function* () {
    const engine = yield* Engine
    const model = yield* engine.createModel(presets.tiny, { seed: 11, initStd: 0.2 })
    return yield* model.cache({ blockTokens: 16, numBlocks })
  })

const withBatcher = <A, E>(numBlocks: number, opts: Partial<BatcherOptions>, use: (b: BatcherShape, cache: KvCache) => Effect.Effect<A, E, Scope.Scope>) =>
  run(
    Effect.gen(function* () {
      const cache = yield* cacheOf(numBlocks)
      return yield* use(yield* makeBatcher(cache, { ...options, ...opts }), cache)
    })
  )

const sampling = (maxTokens: number, seed: number | null = 7, temperature = 1): SamplingParams => ({
  maxTokens,
  temperature,
  topP: 1,
  seed,
  stop: []
})

const text = (s: string) => Int32Array.from([special.bos, ...Buffer.from(s)])
const commonPrefixLength = (a: Int32Array, b: Int32Array) => {
  let i = 0
  while (i < a.length && i < b.length && a[i] === b[i]) i++
  return i
}
const concat = (...xs: ReadonlyArray<ArrayLike<number>>) => Int32Array.from(xs.flatMap((x) => Array.from(x)))

describe("continuous batching (batcher.ts)", () => {
  it("batches concurrent generations: the same tokens as one at a time, in fewer engine steps", async () => {
    const prompts = ["alpha beta", "gamma delta epsilon", "zeta", "eta theta iota kappa"].map(text)
    const jobs = (b: BatcherShape, tag: string) =>
      prompts.map((prompt, i) => b.generate({ execution: `${tag}${i}`, request: `${tag}r${i}`, base: null, prompt, sampling: sampling(24, 100 + i) }))
    const { alone, together, stepsAlone, stepsTogether } = await withBatcher(512, {}, (b) =>
      Effect.gen(function* () {
        const alone = []
        for (const job of jobs(b, "a")) alone.push(yield* job)
        const stepsAlone = b.counters().steps
        const together = yield* Effect.all(jobs(b, "b"), { concurrency: "unbounded" })
        return { alone, together, stepsAlone, stepsTogether: b.counters().steps - stepsAlone }
      })
    )
    together.forEach((r, i) => {
      expect(Array.from(r.output)).toEqual(Array.from(alone[i]!.output))
      expect(r.output.length).toBe(24)
      expect(Array.from(r.versions)).toEqual(new Array(24).fill(3))
      expect(r.logprobs.every((l) => l <= 0 && Number.isFinite(l))).toBe(true)
      expect(r.finishReason).toBe("length")
    })
    expect(stepsTogether).toBeLessThan(stepsAlone / 2)
  })

  it("prefills only an execution's new suffix, and forks the cached context a retry branches from", async () => {
    const out = await withBatcher(512, {}, (b) =>
      Effect.gen(function* () {
        const p1 = text("You are a helpful agent. Task: count to three.")
        const r1 = yield* b.generate({ execution: "x", request: "r1", base: null, prompt: p1, sampling: sampling(8) })
        const seq1 = concat(p1, r1.output)
        const delta2 = Int32Array.from([special.end, special.user, ...Buffer.from("next"), special.end, special.assistant])
        const base = { length: seq1.length, digest: digestOf(seq1), request: "r1" }
        const r2 = yield* b.generate({ execution: "x", request: "r2", base, prompt: delta2, sampling: sampling(8) })
        // a retry of the second call from after the first answer, with another message
        const retry = concat(seq1, [special.end, special.user, ...Buffer.from("other"), special.end, special.assistant])
        const r3 = yield* b.generate({ execution: "x", request: "r3", base: null, prompt: retry, sampling: sampling(4) })
        const miss = yield* Effect.flip(b.generate({ execution: "x", request: "r4", base: { ...base, digest: "0000000000000000" }, prompt: delta2, sampling: sampling(4) }))
        const unknown = yield* Effect.flip(b.generate({ execution: "y", request: "r5", base, prompt: delta2, sampling: sampling(4) }))
        // a retry of the very first prompt: its K/V without the last token was kept
        const again = yield* b.generate({ execution: "x", request: "r6", base: null, prompt: p1, sampling: sampling(4) })
        return { p1, r1, r2, r3, seq1, delta2, miss, unknown, again }
      })
    )
    expect(out.r1.cachedTokens).toBe(0)
    expect(out.r2.promptTokens).toBe(out.seq1.length + out.delta2.length)
    expect(out.r2.cachedTokens).toBe(out.seq1.length - 1)
    expect(out.r3.cachedTokens).toBe(out.seq1.length + 2) // seq1 and the next turn's [end, user]: a prefix fork of r2's context
    expect(out.miss._tag).toBe("CacheMiss")
    expect(out.unknown._tag).toBe("CacheMiss")
    expect(out.again.cachedTokens).toBe(out.p1.length - 1)
  })

  it("a prompt sharing only part of a cached context forks that part: cached = the shared length, the same tokens as a fresh prefill", async () => {
    const system = "You are a careful coding agent. Follow the house rules. "
    const first = text(`${system}[A: read the file][B: run the tests]`)
    const compacted = text(`${system}[C: summary so far]`)
    const shared = commonPrefixLength(first, compacted)
    const out = await withBatcher(512, {}, (b) =>
      Effect.gen(function* () {
        const greedy = sampling(12, 1, 0)
        const r1 = yield* b.generate({ execution: "x", request: "r1", base: null, prompt: first, sampling: greedy })
        const forked = yield* b.generate({ execution: "x", request: "r2", base: null, prompt: compacted, sampling: greedy })
        const fresh = yield* b.generate({ execution: "fresh", request: "f", base: null, prompt: compacted, sampling: greedy })
        // the context forked from is intact: its prompt again gives the first answer
        const again = yield* b.generate({ execution: "x", request: "r3", base: null, prompt: first, sampling: greedy })
        return { r1, forked, fresh, again }
      })
    )
    expect(shared % 16).not.toBe(0) // the fork ends inside a shared block: the child copies it before writing
    expect(out.forked.cachedTokens).toBe(shared)
    expect(out.fresh.cachedTokens).toBe(0)
    expect(Array.from(out.forked.output)).toEqual(Array.from(out.fresh.output))
    Array.from(out.forked.logprobs).forEach((l, i) => expect(l).toBeCloseTo(out.fresh.logprobs[i]!, 4))
    expect(Array.from(out.again.output)).toEqual(Array.from(out.r1.output))
    expect(out.again.cachedTokens).toBe(first.length - 1)
  })

  it("stops at a stop sequence and enforces the context limit", async () => {
    const out = await withBatcher(512, { maxContext: 64 }, (b) =>
      Effect.gen(function* () {
        const p = text("abc")
        const free = yield* b.generate({ execution: "s", request: "s1", base: null, prompt: p, sampling: sampling(12, 5) })
        const stopAt = free.output.subarray(3, 5)
        const stopped = yield* b.generate({ execution: "s", request: "s2", base: null, prompt: p, sampling: { ...sampling(12, 5), stop: [stopAt] } })
        const tooLong = yield* Effect.flip(b.generate({ execution: "t", request: "t1", base: null, prompt: new Int32Array(64).fill(65), sampling: sampling(4) }))
        const capped = yield* b.generate({ execution: "t", request: "t2", base: null, prompt: new Int32Array(60).fill(65), sampling: sampling(50) })
        return { free, stopped, tooLong, capped }
      })
    )
    const first = Array.from(out.free.output.subarray(0, 5))
    // the stop sequence may occur first earlier than position 3; it is kept in the output
    expect(Array.from(out.stopped.output)).toEqual(first.slice(0, out.stopped.output.length))
    expect(out.stopped.finishReason).toBe("stop")
    expect(out.tooLong._tag).toBe("ContextTooLong")
    expect(out.capped.output.length).toBe(4)
    expect(out.capped.finishReason).toBe("length")
  })

  it("cancels a running generation: it answers with its partial output and leaves its context", async () => {
    const out = await withBatcher(512, {}, (b) =>
      Effect.gen(function* () {
        const fiber = yield* Effect.forkChild(b.generate({ execution: "c", request: "c1", base: null, prompt: text("go on"), sampling: sampling(3000) }))
        yield* Effect.sleep("200 millis")
        const found = b.cancel("c1")
        const cancelled = yield* Fiber.join(fiber)
        const load = b.load()
        return { found, cancelled, load, missing: b.cancel("nope") }
      })
    )
    expect(out.found).toBe(true)
    expect(out.missing).toBe(false)
    expect(out.cancelled.finishReason).toBe("cancelled")
    expect(out.cancelled.output.length).toBeGreaterThan(0)
    expect(out.cancelled.output.length).toBeLessThan(3000)
    expect(out.load.cachedExecutions).toBe(1)
    expect(out.load.activeSequences).toBe(0)
  })

  it("drops cached contexts when the pool is short and keeps serving", async () => {
    // 24 blocks of 16 tokens: each generation needs ~6 blocks and leaves a cached context
    const results = await withBatcher(24, { maxBatch: 2, contextsPerExecution: 8 }, (b) =>
      Effect.forEach(Array.from({ length: 10 }, (_, i) => i), (i) =>
        b.generate({ execution: `e${i}`, request: `q${i}`, base: null, prompt: new Int32Array(70).fill(40 + i), sampling: sampling(16) })
      )
    )
    expect(results.map((r) => r.output.length)).toEqual(new Array(10).fill(16))
  })

  it("hands an execution's context to another cache: the destination continues without prefill, token for token", async () => {
    const out = await run(
      Effect.gen(function* () {
        const source = yield* makeBatcher(yield* cacheOf(256), options)
        const destination = yield* makeBatcher(yield* cacheOf(256), { ...options, worker: "rollout-worker/dest" })
        const p = text("hand me off please")
        const first = yield* source.generate({ execution: "h", request: "h1", base: null, prompt: p, sampling: sampling(10, 1, 0) })
        const exported = (yield* source.exportContext("h"))!
        yield* destination.importContext("h", "h1", exported)
        yield* source.unpinContext("h")
        const seq = concat(p, first.output)
        const next = Int32Array.from([special.end, special.user, 66, special.end, special.assistant])
        const base = { length: seq.length, digest: digestOf(seq), request: "h1" }
        const there = yield* destination.generate({ execution: "h", request: "h2", base, prompt: next, sampling: sampling(10, 1, 0) })
        const here = yield* source.generate({ execution: "h", request: "h2", base, prompt: next, sampling: sampling(10, 1, 0) })
        return { exported, first, there, here }
      })
    )
    expect(out.exported.kvLength).toBe(out.exported.tokens.length - 1)
    expect(out.there.cachedTokens).toBe(out.exported.kvLength)
    expect(Array.from(out.there.output)).toEqual(Array.from(out.here.output))
    expect(out.there.worker).toBe("rollout-worker/dest")
  })

  it("pauses every generation at a step boundary for a switch: each leaves its context, named by its request; admits again after resume", async () => {
    const out = await withBatcher(512, {}, (b) =>
      Effect.gen(function* () {
        const first = yield* b.generate({ execution: "p", request: "p1", base: null, prompt: text("first call"), sampling: sampling(6) })
        const fibers = yield* Effect.forEach(["p2", "p3"], (request) =>
          Effect.forkChild(b.generate({ execution: "p", request, base: null, prompt: text(`parallel ${request}`), sampling: sampling(3000) }))
        )
        yield* Effect.sleep("200 millis")
        const paused = yield* b.pause
        const answers = yield* Effect.forEach(fibers, Fiber.join)
        const refused = yield* Effect.flip(b.generate({ execution: "q", request: "q1", base: null, prompt: text("new"), sampling: sampling(4) }))
        const named = (yield* b.exportContext("p", "p2"))!
        const older = (yield* b.exportContext("p", "p1"))!
        const executions = b.executions()
        b.resume()
        const admitted = yield* b.generate({ execution: "q", request: "q2", base: null, prompt: text("new"), sampling: sampling(4) })
        return { first, paused, answers, refused, named, older, executions, admitted, load: b.load() }
      })
    )
    expect(out.paused.map((g) => g.request).sort()).toEqual(["p2", "p3"])
    expect(out.answers.map((a) => a.finishReason)).toEqual(["cancelled", "cancelled"])
    expect(out.refused._tag).toBe("WorkerUnavailable")
    expect(out.named.request).toBe("p2")
    expect(out.named.tokens.length).toBe(text("parallel p2").length + out.answers[0]!.output.length)
    expect(out.named.kvLength).toBe(out.named.tokens.length - 1)
    expect(out.older.request).toBe("p1")
    expect(out.older.tokens.length).toBe(text("first call").length + out.first.output.length)
    expect(out.executions).toEqual(["p"])
    expect(out.admitted.output.length).toBe(4)
    expect(out.load.draining).toBe(false)
    expect(out.load.processedTokens).toBeGreaterThan(0)
  })
})
