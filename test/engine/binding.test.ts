/**
 * The koffi binding: long native calls run off the event loop, handles close with their
 * scope, the backend choice honours GYRE_BACKEND, and models are created on a chosen device.
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

  it("creates a model and its cache on a chosen device; an unknown device is a clear error", async () => {
    const out = await runEngine(
      Effect.gen(function* () {
        const engine = yield* Engine
        const count = engine.devices.length
        const model = yield* engine.createModel(presets.tiny, { seed: 1, device: count - 1 })
        const cache = yield* model.cache({ blockTokens: 16, numBlocks: 4 })
        const seq = yield* cache.create()
        const logits = (yield* cache.forward([{ seq, tokens: [1, 2, 3] }])).logits!
        const loaded = yield* engine.loadModel(presets.tiny, yield* model.save(), { device: 0 })
        const sameWeights = Buffer.from((yield* loaded.getWeights()).buffer).equals(Buffer.from((yield* model.getWeights()).buffer))
        const beyond = yield* Effect.flip(engine.createModel(presets.tiny, { device: count }))
        const negative = yield* Effect.flip(engine.loadModel(presets.tiny, yield* model.save(), { device: -1 }))
        const fractional = yield* Effect.flip(engine.createModel(presets.tiny, { device: 0.5 }))
        // a failed selection leaves the engine usable
        const after = yield* engine.createModel(presets.tiny, { seed: 1 })
        return { count, model, logits, loaded, sameWeights, beyond, negative, fractional, after }
      })
    )
    expect(out.model.device).toBe(out.count - 1)
    expect(out.logits.length).toBe(presets.tiny.vocab_size)
    expect(out.loaded.device).toBe(0)
    expect(out.sameWeights).toBe(true)
    expect(out.after.device).toBe(0)
    for (const [error, device] of [[out.beyond, out.count], [out.negative, -1]] as const) {
      expect(error).toBeInstanceOf(EngineError)
      expect(error).toMatchObject({ op: "gyre_set_device", code: "GYRE_ERR_INVALID_ARGUMENT" })
      expect(error.message).toContain(`gyre_set_device: device ${device} not in [0, ${out.count})`)
    }
    expect(out.fractional).toMatchObject({ code: "GYRE_ERR_INVALID_ARGUMENT", message: "device must be an integer index, got 0.5" })
  })
})
