import { Effect, Layer, Logger } from "effect"
import { Engine } from "../src/engine/engine.ts"
import { presets } from "../src/engine/presets.ts"
import { adamwDefaults } from "../src/engine/trainer.ts"
const N = Number(process.env.STEPS ?? 60)
const preset = (process.env.PRESET ?? "tiny") as "tiny"
const main = Effect.gen(function* () {
  const engine = yield* Engine
  const model = yield* engine.createModel(presets[preset], { seed: 1 })
  const count = 4, length = 256, n = count * length
  const tokens = Int32Array.from({ length: n }, (_, i) => (3 * 7919 + i * 104729) % 256)
  const parents = Int32Array.from({ length: n }, (_, i) => (i % length === 0 ? -1 : i - 1))
  const positions = Int32Array.from({ length: n }, (_, i) => i % length)
  const batch = { length: n, tokens, parents, positions, weights: Float32Array.from(parents, (p) => (p < 0 ? 0 : 1 / (n - count))), advantages: new Float32Array(n), behaviourLogprobs: new Float32Array(n), versions: new Int32Array(n) } as any
  const trainer = yield* model.trainer({ maxTokens: n })
  const times: number[] = []
  for (let i = 0; i < N; i++) {
    const t = performance.now()
    yield* trainer.zeroGrads()
    yield* trainer.train(batch, { kind: "sft" })
    yield* trainer.step({ ...adamwDefaults, lr: 1e-4 })
    times.push(performance.now() - t)
  }
  times.sort((a, b) => a - b)
  console.log(`${preset} step best ${times[0]!.toFixed(1)} ms median ${times[times.length >> 1]!.toFixed(1)} ms tok/s best ${(n / times[0]! * 1000).toFixed(0)}`)
})
await Effect.runPromise(Effect.scoped(main).pipe(Effect.provide(Engine.layer.pipe(Layer.provide(Logger.layer([]))))))
