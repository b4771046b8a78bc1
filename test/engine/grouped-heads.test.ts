/**
 * Grouped-query attention with more query heads per kv head than one CPU attention task
 * holds (16): 17 and 20 heads sharing one kv head, and 20 per kv head over two. Cached decode
 * equals a full forward (the paged path, blocks in place and gathered), and training
 * log-probs and gradients of a forest equal those of its paths (the forest path).
 */
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import type { LlamaConfig } from "../../src/engine/config.ts"
import { Engine } from "../../src/engine/engine.ts"
import { chain, maxAbsDiff, micro, packed, relativeError, rng, runEngine } from "./helpers.ts"

/** A micro model with head_dim 2 and `heads` query heads over `kvHeads` kv heads. */
const grouped = (heads: number, kvHeads: number): LlamaConfig => ({
  ...micro(false),
  hidden_size: 2 * heads,
  num_attention_heads: heads,
  num_key_value_heads: kvHeads
})

const random = rng(23)
const prompt = Array.from({ length: 37 }, () => Math.floor(random() * 32))

const shapes: ReadonlyArray<readonly [number, number]> = [[20, 1], [17, 1], [40, 2]]

describe("more than 16 query heads per kv head", () => {
  it.each(shapes)("%i heads over %i kv heads: cached decode equals a full forward (blocks of 16 and of 6)", async (heads, kvHeads) => {
    const config = grouped(heads, kvHeads)
    const V = config.vocab_size
    const out = await runEngine(
      Effect.gen(function* () {
        const model = yield* (yield* Engine).createModel(config, { seed: 4, initStd: 0.3 })
        const rows: Array<{ full: Float32Array; steps: Array<Float32Array>; batched: Float32Array }> = []
        for (const blockTokens of [16, 6]) {
          const cache = yield* model.cache({ blockTokens, numBlocks: 32 })
          const a = yield* cache.create()
          const full = (yield* cache.forward([{ seq: a, tokens: prompt }], "all")).logits!
          const b = yield* cache.create()
          const steps: Array<Float32Array> = []
          for (const t of prompt) steps.push((yield* cache.forward([{ seq: b, tokens: [t] }], "last")).logits!)
          // a prefill and a decode in one batch
          const c = yield* cache.create()
          yield* cache.forward([{ seq: c, tokens: prompt.slice(0, 30) }])
          const d = yield* cache.create()
          const batched = (yield* cache.forward([{ seq: d, tokens: prompt.slice(0, 5) }, { seq: c, tokens: prompt.slice(30, 31) }], "last")).logits!
          rows.push({ full, steps, batched })
        }
        return rows
      })
    )
    for (const { full, steps, batched } of out) {
      expect(full.length).toBe(prompt.length * V)
      steps.forEach((row, t) => expect(maxAbsDiff(row, full.subarray(t * V, (t + 1) * V)), `token ${t}`).toBeLessThan(1e-4))
      expect(maxAbsDiff(batched.subarray(0, V), full.subarray(4 * V, 5 * V))).toBeLessThan(1e-4)
      expect(maxAbsDiff(batched.subarray(V), full.subarray(30 * V, 31 * V))).toBeLessThan(1e-4)
    }
    // the block size does not change the arithmetic
    expect(Buffer.from(out[0]!.full.buffer).equals(Buffer.from(out[1]!.full.buffer))).toBe(true)
  })

  it.each(shapes)("%i heads over %i kv heads: a forest trains as its paths, with inference's log-probs", async (heads, kvHeads) => {
    const config = grouped(heads, kvHeads)
    const V = config.vocab_size
    // the prompt, then a branch of 6 tokens from its 20th token
    const branch = [5, 9, 30, 2, 11, 8]
    const pathB = [...prompt.slice(0, 20), ...branch]
    const forest = packed([...prompt, ...branch], [...chain(prompt.length), 19, ...branch.slice(1).map((_, i) => prompt.length + i)])
    const out = await runEngine(
      Effect.gen(function* () {
        const model = yield* (yield* Engine).createModel(config, { seed: 4, initStd: 0.3 })
        const trainer = yield* model.trainer({ maxTokens: 64 })
        const cache = yield* model.cache({ blockTokens: 16, numBlocks: 8 })
        const seq = yield* cache.create()
        const logits = (yield* cache.forward([{ seq, tokens: prompt }], "all")).logits!
        const packedResult = yield* trainer.train(forest, { kind: "sft" })
        const packedGrads = yield* trainer.getGrads()
        yield* trainer.zeroGrads()
        let separateLoss = 0
        for (const p of [prompt, pathB]) {
          // the shared prompt tokens train once: only the forest's branch is new in pathB
          const weights = Float32Array.from(p, (_, i) => (i === 0 || (p === pathB && i < 20) ? 0 : 1))
          separateLoss += (yield* trainer.train(packed(p, chain(p.length), { weights }), { kind: "sft" })).stats.loss
        }
        return { logits, packedResult, packedGrads, separateLoss, separateGrads: yield* trainer.getGrads() }
      })
    )
    let worst = 0
    for (let i = 1; i < prompt.length; i++) {
      const row = out.logits.subarray((i - 1) * V, i * V)
      const max = Math.max(...row)
      const lse = max + Math.log(row.reduce((s, x) => s + Math.exp(x - max), 0))
      worst = Math.max(worst, Math.abs(out.packedResult.tokenLogprobs[i]! - (row[prompt[i]!]! - lse)))
    }
    expect(worst).toBeLessThan(1e-5)
    expect(Math.abs(out.packedResult.stats.loss - out.separateLoss) / out.separateLoss).toBeLessThan(1e-5)
    expect(relativeError(out.packedGrads, out.separateGrads)).toBeLessThan(1e-5)
  })
})
