/**
 * The koffi binding: long native calls run off the event loop, handles close with their
 * scope, and the backend choice honours GYRE_BACKEND.
 */
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { Engine } from "../../src/engine/engine.ts"
import { EngineError, cudaDriverDevices, loadNative } from "../../src/engine/native.ts"
import { presets } from "../../src/engine/presets.ts"
import { chain, packed, runEngine } from "./helpers.ts"

describe("engine binding", () => {
  it("keeps the event loop ticking while a long training call computes", async () => {
    const result = await runEngine(
      Effect.gen(function* () {
        const engine = yield* Engine
        const model = yield* engine.createModel(presets.tiny, { seed: 1 })
        const trainer = yield* model.trainer({ maxTokens: 2048 })
        const batch = packed(Array.from({ length: 2048 }, (_, i) => i % 256), chain(2048))
        let ticks = 0
        const timer = setInterval(() => ticks++, 5)
        const started = performance.now()
        yield* trainer.train(batch, { kind: "sft" })
        const elapsed = performance.now() - started
        clearInterval(timer)
        return { ticks, elapsed }
      })
    )
    expect(result.elapsed).toBeGreaterThan(100)
    // a blocked loop would tick at most once; a free one about every 5 ms
    expect(result.ticks).toBeGreaterThan(Math.min(10, result.elapsed / 50))
  })

  it("frees handles when their scope closes and keeps models alive for their caches", async () => {
    const stats = await runEngine(
      Effect.gen(function* () {
        const engine = yield* Engine
        const cache = yield* Effect.scoped(
          Effect.gen(function* () {
            const model = yield* engine.createModel(presets.tiny)
            return yield* Effect.scoped(model.cache({ blockTokens: 16, numBlocks: 4 })).pipe(Effect.as(model))
          })
        ).pipe(Effect.flatMap((model) => Effect.succeed(model)))
        return cache.paramCount
      })
    )
    expect(stats).toBeGreaterThan(300_000)
    // a cache outliving its model's scope still works (the cache holds the model)
    const logits = await runEngine(
      Effect.gen(function* () {
        const engine = yield* Engine
        const { cache } = yield* Effect.gen(function* () {
          const model = yield* engine.createModel(presets.tiny)
          return { cache: yield* model.cache({ blockTokens: 16, numBlocks: 4 }) }
        })
        const seq = yield* cache.create()
        return (yield* cache.forward([{ seq, tokens: [1, 2, 3] }])).logits!
      })
    )
    expect(logits.length).toBe(presets.tiny.vocab_size)
  })

  it("chooses the backend from GYRE_BACKEND, the built libraries and the CUDA driver", async () => {
    const auto = await Effect.runPromise(loadNative(""))
    const hasCuda = cudaDriverDevices().length > 0
    expect(auto.backend).toBe(hasCuda ? auto.backend : "cpu")
    expect(auto.devices.length).toBeGreaterThan(0)
    const cpu = await Effect.runPromise(loadNative("cpu"))
    expect(cpu.backend).toBe("cpu")
    const bogus = await Effect.runPromise(Effect.flip(loadNative("tpu")))
    expect(bogus).toBeInstanceOf(EngineError)
    expect(bogus.message).toContain("GYRE_BACKEND must be cpu or cuda")
    if (!hasCuda) {
      const cuda = await Effect.runPromise(Effect.flip(loadNative("cuda")))
      expect(cuda.message).toMatch(/GYRE_BACKEND=cuda but/)
    }
  })
})
