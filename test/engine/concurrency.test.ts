/**
 * Models computing at the same time in one process (each with its own engine queue and thread
 * count, as the CPU devices of one process do): the same results, bit for bit, as one after the
 * other; one model's calls do not wait for another's; and a failure's message is the failed
 * call's own while another model fails at the same time on another thread.
 */
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { Engine, type Model } from "../../src/engine/engine.ts"
import { EngineError, OutOfKvBlocks } from "../../src/engine/native.ts"
import { presets } from "../../src/engine/presets.ts"
import { adamwDefaults } from "../../src/engine/trainer.ts"
import { chain, packed, rng, runEngine } from "./helpers.ts"

const tokens = (n: number, seed: number) => {
  const r = rng(seed)
  return Array.from({ length: n }, () => Math.floor(r() * presets.tiny.vocab_size))
}

/** Prefill then 8 sampled decode steps: every logit and sampled token, as bytes. */
const generate = (model: Model) =>
  Effect.scoped(
    Effect.gen(function* () {
      const cache = yield* model.cache({ blockTokens: 16, numBlocks: 64 })
      const seq = yield* cache.create()
      const sampling = { temperature: 1, topP: 0.9, seed: 7 }
      const chunks: Array<Uint8Array> = []
      let next = tokens(300, 11)
      for (let step = 0; step < 9; step++) {
        const out = yield* cache.forward([{ seq, tokens: next, sampling }])
        chunks.push(new Uint8Array(out.logits!.buffer.slice(0)), new Uint8Array(out.sampled!.buffer.slice(0)))
        next = [out.sampled![0]!]
      }
      return Buffer.concat(chunks)
    })
  )

/** Two micro-batches, gradients, one AdamW step: the gradients and the updated weights, as bytes. */
const train = (model: Model) =>
  Effect.scoped(
    Effect.gen(function* () {
      const trainer = yield* model.trainer({ maxTokens: 512 })
      for (const seed of [21, 22]) yield* trainer.train(packed(tokens(512, seed), chain(512)), { kind: "sft" })
      const grads = yield* trainer.getGrads()
      yield* trainer.step({ ...adamwDefaults, lr: 1e-3 })
      const weights = yield* model.getWeights()
      return Buffer.concat([new Uint8Array(grads.buffer), new Uint8Array(weights.buffer)])
    })
  )

/** A fresh pair of models (seeds 1 and 2), one thread each: the two CPU devices of a 2-core process. */
const pair = Effect.gen(function* () {
  const engine = yield* Engine
  const a = yield* engine.createModel(presets.tiny, { seed: 1, threads: 1 })
  const b = yield* engine.createModel(presets.tiny, { seed: 2, threads: 1 })
  return { a, b }
})

describe("models computing at the same time", () => {
  it("give bit-identical results to running one after the other (forward and train)", async () => {
    const results = await runEngine(
      Effect.gen(function* () {
        const one = yield* pair
        const sequential = [yield* generate(one.a), yield* train(one.b), yield* train(one.a)]
        const two = yield* pair
        const concurrent = yield* Effect.all([Effect.all([generate(two.a), train(two.a)]), train(two.b)], { concurrency: "unbounded" })
        return { sequential, concurrent: [concurrent[0][0], concurrent[1], concurrent[0][1]] }
      })
    )
    expect(results.sequential[0]!.length).toBeGreaterThan(9 * presets.tiny.vocab_size * 4)
    results.sequential.forEach((bytes, i) => expect(Buffer.compare(bytes, results.concurrent[i]!)).toBe(0))
    // the two models' work differs, so equality above is not of two empty or constant outputs
    expect(Buffer.compare(results.sequential[1]!, results.sequential[2]!)).not.toBe(0)
  })

  it("one model's calls do not wait for another's long call", async () => {
    const { shortCalls, longDone } = await runEngine(
      Effect.gen(function* () {
        const { a, b } = yield* pair
        const trainer = yield* a.trainer({ maxTokens: 2048 })
        const cache = yield* b.cache({ blockTokens: 16, numBlocks: 16 })
        const seq = yield* cache.create()
        yield* cache.forward([{ seq, tokens: [1, 2, 3] }])
        let longDone = false
        let shortCalls = 0
        const long = trainer.train(packed(tokens(2048, 5), chain(2048)), { kind: "sft" }).pipe(Effect.tap(() => Effect.sync(() => (longDone = true))))
        // decode steps on the other model while the long call runs; counted only before it ends
        const short = Effect.gen(function* () {
          while (!longDone && shortCalls < 20) {
            const probe = yield* cache.fork(seq)
            yield* cache.forward([{ seq: probe, tokens: [4] }])
            yield* cache.free(probe)
            if (!longDone) shortCalls++
          }
        })
        yield* Effect.all([long, short], { concurrency: "unbounded" })
        return { shortCalls, longDone }
      })
    )
    expect(longDone).toBe(true)
    // one shared lock would queue every short call behind the long one: none would finish first
    expect(shortCalls).toBeGreaterThan(0)
  })

  it("a failure's message is the failed call's, while another model fails on another thread", async () => {
    const outcomes = await runEngine(
      Effect.gen(function* () {
        const { a, b } = yield* pair
        const full = yield* a.cache({ blockTokens: 16, numBlocks: 2 })
        const small = yield* b.cache({ blockTokens: 16, numBlocks: 8 })
        const fullSeq = yield* full.create()
        const smallSeq = yield* small.create()
        // a: 40 tokens need 3 blocks of 2; b: a token outside the vocabulary. Both fail in the
        // native call, on pool threads, many times at once.
        const failA = full.forward([{ seq: fullSeq, tokens: tokens(40, 3) }]).pipe(Effect.flip)
        const failB = small.forward([{ seq: smallSeq, tokens: [1, presets.tiny.vocab_size + 5] }]).pipe(Effect.flip)
        const calls = Array.from({ length: 40 }, (_, i) => (i % 2 === 0 ? failA : failB))
        return yield* Effect.all(calls, { concurrency: "unbounded" })
      })
    )
    outcomes.forEach((e, i) => {
      if (i % 2 === 0) {
        expect(e).toBeInstanceOf(OutOfKvBlocks)
        expect(e.message).toMatch(/^gyre_forward: needs 3 free KV blocks but 2 of 2 are free/)
      } else {
        expect(e).toBeInstanceOf(EngineError)
        expect(e.message).toBe(`gyre_forward: token ${presets.tiny.vocab_size + 5} at row 1 is outside the vocabulary [0, ${presets.tiny.vocab_size})`)
      }
    })
  })

  it("each model computes with its own thread count; a negative count is a clear error", async () => {
    const counts = await runEngine(
      Effect.gen(function* () {
        const engine = yield* Engine
        const byDefault = yield* engine.createModel(presets.tiny)
        const one = yield* engine.createModel(presets.tiny, { threads: 1 })
        const three = yield* engine.createModel(presets.tiny, { threads: 3 })
        const bad = yield* one.setThreads(-1).pipe(Effect.flip)
        return { engine: yield* engine.threads, byDefault: yield* byDefault.threads(), one: yield* one.threads(), three: yield* three.threads(), bad }
      })
    )
    expect(counts.byDefault).toBe(counts.engine)
    expect(counts.one).toBe(1)
    expect(counts.three).toBe(3)
    expect(counts.bad.message).toBe("gyre_model_set_threads: n = -1, must be >= 0")
  })
})
