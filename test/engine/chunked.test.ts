/**
 * Batches longer than the trainer's max_tokens: trained in chunks (K/V of earlier chunks
 * carried forward, their gradients carried back), they give the loss, stats, log-probs and
 * gradients of one unchunked pass, on forests whose branches reach ancestors several chunks
 * back; and a batch 128 times max_tokens trains in the memory of one chunk's activations plus
 * its K/V, which the trainer reports.
 */
import { readFileSync } from "node:fs"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import type { PackedBatch } from "../../src/common/packed-batch.ts"
import type { LlamaConfig } from "../../src/engine/config.ts"
import { Engine } from "../../src/engine/engine.ts"
import { presets } from "../../src/engine/presets.ts"
import type { LossConfig, TrainResult } from "../../src/engine/trainer.ts"
import { maxAbsDiff, micro, packed, relativeError, rng, runEngine } from "./helpers.ts"

/**
 * A forest in depth-first order: a 70-token prompt, three continuations of it (one branching
 * again after 20 tokens), a fourth from the prompt's 30th token, and a second tree.
 */
const forestParents = (): Array<number> => {
  const parents: Array<number> = []
  const chainFrom = (parent: number, length: number) => {
    for (let k = 0; k < length; k++) parents.push(k === 0 ? parent : parents.length - 1)
    return parents.length - 1
  }
  const promptEnd = chainFrom(-1, 70)
  const a = chainFrom(promptEnd, 20)
  chainFrom(a, 25)
  chainFrom(a, 18)
  chainFrom(promptEnd, 33)
  chainFrom(29, 21)
  chainFrom(-1, 40)
  return parents
}

const forestBatch = (vocab: number): PackedBatch => {
  const parents = forestParents()
  const next = rng(5)
  const n = parents.length
  return packed(
    parents.map(() => Math.floor(next() * vocab)),
    parents,
    {
      weights: Float32Array.from(parents, (p, i) => (p < 0 ? 0 : 0.01 + 0.002 * (i % 7))),
      advantages: Float32Array.from(parents, (_, i) => Math.sin(i * 1.3)),
      behaviourLogprobs: Float32Array.from({ length: n }, (_, i) => -5.6 + 0.4 * Math.cos(i * 0.7))
    }
  )
}

/** Loss, stats, log-probs and gradients of the batch with a trainer of `maxTokens`. */
const trainWith = (config: LlamaConfig, batch: PackedBatch, loss: LossConfig, maxTokens: number) =>
  Effect.gen(function* () {
    const engine = yield* Engine
    const model = yield* engine.createModel(config, { seed: 3, initStd: 0.1 })
    const trainer = yield* model.trainer({ maxTokens })
    const result: TrainResult = yield* trainer.train(batch, loss)
    return { result, grads: yield* trainer.getGrads(), memory: yield* trainer.memory() }
  })

const expectSame = (chunked: { result: TrainResult; grads: Float32Array }, whole: { result: TrainResult; grads: Float32Array }) => {
  const [a, b] = [chunked.result, whole.result]
  expect(Math.abs(a.stats.loss - b.stats.loss) / Math.abs(b.stats.loss)).toBeLessThan(1e-5)
  expect(relativeError(chunked.grads, whole.grads)).toBeLessThan(1e-5)
  expect(Array.from(a.tokenLogprobs, Number.isNaN)).toEqual(Array.from(b.tokenLogprobs, Number.isNaN))
  const finite = (x: Float32Array) => Array.from(x).filter((v) => !Number.isNaN(v))
  expect(maxAbsDiff(finite(a.tokenLogprobs), finite(b.tokenLogprobs))).toBeLessThan(1e-5)
  expect(a.stats.trainedTokens).toBe(b.stats.trainedTokens)
  for (const key of ["entropy", "meanLogprob", "meanRatio", "clipFraction", "meanIsWeight", "weightSum"] as const) {
    expect(a.stats[key]).toBeCloseTo(b.stats[key], 5)
  }
}

/** Peak resident set of this process (VmHWM), bytes. */
const peakRss = () => Number(/VmHWM:\s+(\d+) kB/.exec(readFileSync("/proc/self/status", "utf8"))![1]) * 1024

describe("a batch longer than max_tokens trains in chunks", () => {
  it("in the memory of one chunk's activations plus each token's K/V", async () => {
    const config = presets["tiny-long"]
    const maxTokens = 128
    const [chains, length] = [128, 128] // 16384 tokens: 128 chunks
    const parents = Array.from({ length: chains * length }, (_, i) => (i % length === 0 ? -1 : i - 1))
    const next = rng(9)
    const batch = packed(parents.map(() => Math.floor(next() * config.vocab_size)), parents)
    const r = await runEngine(
      Effect.gen(function* () {
        const engine = yield* Engine
        const model = yield* engine.createModel(config, { seed: 1 })
        const trainer = yield* model.trainer({ maxTokens })
        yield* trainer.train(packed([1, 2, 3], [-1, 0, 1]), { kind: "sft" }) // scratch and pages of one chunk in place
        const before = yield* trainer.memory()
        const peakBefore = peakRss()
        const result = yield* trainer.train(batch, { kind: "sft" })
        return { before, after: yield* trainer.memory(), grew: peakRss() - peakBefore, result, params: trainer.paramCount, backend: engine.backend }
      })
    )
    const n = batch.length
    expect(r.result.stats.trainedTokens).toBe(n - chains)
    expect(r.before.lastBatchBytes).toBe(0)
    expect(r.after.fixedBytes).toBe(r.before.fixedBytes)
    // the batch's store per token and layer: its K/V and their gradients, 6 x kv_dim floats (CUDA:
    // 4, no transposed copies), and its attention output and log-sum-exp, q_dim + heads
    const kvDim = config.num_key_value_heads * config.head_dim
    const qDim = config.num_attention_heads * config.head_dim
    const floats = (r.backend === "cuda" ? 4 : 6) * kvDim + qDim + config.num_attention_heads
    expect(r.after.kvBytesPerToken).toBe(4 * floats * config.num_hidden_layers)
    expect(r.after.lastBatchBytes).toBeGreaterThanOrEqual(n * r.after.kvBytesPerToken)
    expect(r.after.lastBatchBytes).toBeLessThan(1.1 * n * r.after.kvBytesPerToken)
    // activations for all n rows would take n / maxTokens times those of one chunk (~300 MB here)
    const perRow = (r.before.fixedBytes - 12 * r.params) / maxTokens
    expect(n * perRow).toBeGreaterThan(200e6)
    expect(r.grew).toBeLessThan(r.after.lastBatchBytes + 64 * n + 48e6)
  })

  const tinyLong = presets["tiny-long"]
  const grouped: LlamaConfig = { ...micro(false), max_position_embeddings: 512 } // 4 heads on 2 kv heads, untied

  it("SFT: every chunk size gives the unchunked loss, log-probs and gradients (tiny-long)", async () => {
    const batch = forestBatch(tinyLong.vocab_size)
    const runs = await runEngine(Effect.all([batch.length, 7, 16, 50, 100].map((m) => trainWith(tinyLong, batch, { kind: "sft" }, m))))
    expect(runs[0]!.memory.lastBatchBytes).toBe(0)
    for (const chunked of runs.slice(1)) {
      expect(chunked.memory.lastBatchBytes).toBeGreaterThan(0)
      expectSame(chunked, runs[0]!)
    }
  })

  it("PPO with clipping: chunked equals unchunked (4 heads on 2 kv heads, untied)", async () => {
    const batch = forestBatch(grouped.vocab_size)
    const loss = { kind: "ppo", clipLow: 0.2, clipHigh: 0.28, isCap: 2 } as const
    const runs = await runEngine(Effect.all([batch.length, 13, 64].map((m) => trainWith(grouped, batch, loss, m))))
    expect(runs[0]!.result.stats.clipFraction).toBeGreaterThan(0)
    for (const chunked of runs.slice(1)) expectSame(chunked, runs[0]!)
  })
})
