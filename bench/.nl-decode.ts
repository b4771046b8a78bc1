import { Effect, Layer, Logger } from "effect"
import { Engine } from "../src/engine/engine.ts"
import { presets } from "../src/engine/presets.ts"
const ctx = Number(process.argv[2] ?? 512)
const prog = Effect.gen(function* () {
  const engine = yield* Engine
  yield* engine.setThreads(2)
  const model = yield* engine.createModel(presets.tiny, { seed: 1 })
  const cache = yield* model.cache({ blockTokens: 16, numBlocks: 16 * Math.ceil((ctx + 200) / 16) })
  const seqs: number[] = []
  for (let s = 0; s < 16; s++) seqs.push(yield* cache.create())
  const t0 = performance.now()
  yield* cache.forward(seqs.map((seq, s) => ({ seq, tokens: Array.from({ length: ctx }, (_, i) => (s * 31 + i * 7) % 256) })), "last")
  const prefill = (performance.now() - t0) / 1000
  let best = Infinity
  for (let r = 0; r < 12; r++) {
    const t = performance.now()
    for (let k = 0; k < 8; k++) yield* cache.forward(seqs.map((seq) => ({ seq, tokens: [k + 1] })), "last")
    best = Math.min(best, (performance.now() - t) / 1000)
  }
  console.log(JSON.stringify({ ctx, prefill_tok_s: Math.round((16 * ctx) / prefill), decode_tok_s: Math.round((16 * 8) / best) }))
})
await Effect.runPromise(prog.pipe(Effect.scoped, Effect.provide(Engine.layer.pipe(Layer.provide(Logger.layer([]))))))
