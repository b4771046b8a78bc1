/**
 * Finite-difference check of the analytic gradient of every parameter tensor (every layer:
 * embedding, both RMSNorms, q/k/v/o, gate/up/down, final norm, lm_head) for both losses,
 * on a micro model over a packed forest with branches and two roots; and SFT again with 20
 * query heads per kv head (attention tasks that split one kv head's group of heads), and PPO
 * with head_dim x heads != hidden_size.
 */
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import type { PackedBatch } from "../../src/common/packed-batch.ts"
import type { LlamaConfig } from "../../src/engine/config.ts"
import { Engine } from "../../src/engine/engine.ts"
import type { LossConfig } from "../../src/engine/trainer.ts"
import { micro, packed, rng, runEngine } from "./helpers.ts"

// a tree 0-1-2-3 branching at 3 into 4-5-6 and 7-8, and a second tree 9-10-11
const parents = [-1, 0, 1, 2, 3, 4, 5, 3, 7, -1, 9, 10]
const tokens = [3, 17, 5, 9, 30, 2, 11, 8, 21, 4, 19, 26]

/** Directional derivative of each tensor: analytic g.u against (L(w+eu) - L(w-eu)) / 2e. */
const checkGradients = (config: LlamaConfig, loss: LossConfig, makeBatch: (logp: Float32Array) => PackedBatch) =>
  runEngine(
    Effect.gen(function* () {
      const engine = yield* Engine
      const model = yield* engine.createModel(config, { seed: 7, initStd: 0.3 })
      const trainer = yield* model.trainer({ maxTokens: 32 })
      const base = packed(tokens, parents)
      const current = (yield* trainer.train(base, { kind: "sft" }, { backward: false })).tokenLogprobs
      const batch = makeBatch(current)
      yield* trainer.zeroGrads()
      yield* trainer.train(batch, loss)
      const grads = yield* trainer.getGrads()
      const weights = yield* model.getWeights()
      const lossAt = (w: Float32Array) =>
        model.setWeights(w).pipe(
          Effect.andThen(trainer.train(batch, loss, { backward: false })),
          Effect.map((r) => r.stats.loss)
        )
      const random = rng(11)
      const results: Array<{ name: string; analytic: number; numeric: number }> = []
      for (const t of yield* engine.layout(config)) {
        const size = t.shape.reduce((a, b) => a * b, 1)
        const u = Float64Array.from({ length: size }, () => random() - 0.5)
        const scale = 1 / Math.hypot(...u)
        let analytic = 0
        for (let i = 0; i < size; i++) analytic += grads[t.offset + i]! * u[i]! * scale
        const eps = 5e-3
        const shifted = (sign: number) => {
          const w = Float32Array.from(weights)
          for (let i = 0; i < size; i++) w[t.offset + i]! += sign * eps * u[i]! * scale
          return w
        }
        const numeric = ((yield* lossAt(shifted(1))) - (yield* lossAt(shifted(-1)))) / (2 * eps)
        results.push({ name: t.name, analytic, numeric })
      }
      return results
    })
  )

const expectClose = (results: ReadonlyArray<{ name: string; analytic: number; numeric: number }>) => {
  expect(results.length).toBeGreaterThan(10)
  for (const r of results) {
    const scale = Math.max(Math.abs(r.analytic), Math.abs(r.numeric), 1e-3)
    expect(Math.abs(r.analytic - r.numeric) / scale, `${r.name}: analytic ${r.analytic} vs numeric ${r.numeric}`).toBeLessThan(2e-2)
    expect(Math.abs(r.analytic), `${r.name} has a gradient`).toBeGreaterThan(1e-5)
  }
}

describe("gradients match finite differences", () => {
  it("SFT cross-entropy, untied lm_head, every tensor", async () => {
    const results = await checkGradients(micro(false), { kind: "sft" }, () =>
      packed(tokens, parents, { weights: Float32Array.from(parents, (p, i) => (p < 0 ? 0 : 0.05 + 0.01 * i)) })
    )
    expect(results.map((r) => r.name)).toContain("lm_head.weight")
    expectClose(results)
  })

  it("PPO-clip with decoupled, truncated importance weights, tied embeddings", async () => {
    // per token: proximal = current + offset, behaviour = proximal + offset: some ratios inside
    // the clip range, some clipped (zero gradient) on either side; some w over the cap
    const ratioOffsets = [0, 0.05, -0.08, 0.6, -0.7, 0.02, 0.1, -0.03, 0.5, 0, -0.04, 0.07]
    const isOffsets = [0, 0.3, -0.2, 0.1, 0, 2.0, -0.1, 0.4, 0, 0, 1.5, -0.3]
    const advantages = Float32Array.from([0, 1.0, -0.7, 1.2, 0.9, -1.1, 0.4, -0.8, -1.3, 0, 0.6, -0.5])
    const results = await checkGradients(micro(true), { kind: "ppo", clipLow: 0.2, clipHigh: 0.28, isCap: 2 }, (logp) => {
      const proximal = Float32Array.from(logp, (lp, i) => (parents[i]! < 0 ? Number.NaN : lp + ratioOffsets[i]!))
      return packed(tokens, parents, {
        weights: Float32Array.from(parents, (p) => (p < 0 ? 0 : 0.1)),
        advantages,
        proximalLogprobs: proximal,
        behaviourLogprobs: Float32Array.from(proximal, (p, i) => (Number.isNaN(p) ? 0 : p - isOffsets[i]!))
      })
    })
    expect(results.map((r) => r.name)).not.toContain("lm_head.weight")
    expectClose(results)
  })

  it("SFT with 20 query heads per kv head (more than one attention task's queries)", async () => {
    const config = { ...micro(false), hidden_size: 40, num_attention_heads: 20, num_key_value_heads: 1 }
    const results = await checkGradients(config, { kind: "sft" }, () => packed(tokens, parents))
    expect(results.map((r) => r.name)).toContain("model.layers.1.self_attn.q_proj.weight")
    expectClose(results)
  })

  it("PPO-clip with head_dim 6 x 4 heads != hidden_size 16 (q_proj [24, 16], o_proj [16, 24])", async () => {
    const config = { ...micro(false), head_dim: 6 }
    const advantages = Float32Array.from(parents, (_, i) => (i % 3) - 1 + 0.3)
    const results = await checkGradients(config, { kind: "ppo", clipLow: 0.2, clipHigh: 0.28, isCap: 2 }, (logp) =>
      packed(tokens, parents, { weights: Float32Array.from(parents, (p) => (p < 0 ? 0 : 0.1)), advantages, behaviourLogprobs: Float32Array.from(logp, (lp) => (Number.isNaN(lp) ? 0 : lp - 0.1)) })
    )
    expect(results.map((r) => r.name)).toContain("model.layers.0.self_attn.o_proj.weight")
    expectClose(results)
  })
})
