/**
 * The packed trees against the flat computation on the native engine: the loss and the
 * gradient of a step's micro-batches (exact trees, split at a tight budget or whole; and
 * the union of sampled paths) equal those of training every root-to-leaf path (every chosen
 * path) as its own sequence with the per-path weights the normalisation defines.
 */
import fc from "fast-check"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import type { PackedBatch } from "../../src/common/packed-batch.ts"
import { Engine } from "../../src/engine/engine.ts"
import type { LossConfig } from "../../src/engine/trainer.ts"
import { packMicroBatches } from "../../src/tree/pack.ts"
import { ROOT, type TrajectoryTree } from "../../src/tree/tree.ts"
import { stepUnits, type StepExecution, type TrainingMode } from "../../src/tree/units.ts"
import { micro, relativeError, runEngine } from "../engine/helpers.ts"
import { build, executionArb, wireRecords } from "./simulate.ts"

/** The engine tests' micro model, with room for the trees' depths. */
const config = { ...micro(true), max_position_embeddings: 1024 }

/** Tokens, versions and log-probs from the root to the end of `leaf`. */
const pathArrays = (tree: TrajectoryTree, leaf: number) => {
  const nodes: Array<number> = []
  for (let node = leaf; node !== ROOT; node = tree.parentOf(node)) nodes.unshift(node)
  const concat = <A extends Int32Array | Float32Array>(make: (n: number) => A, part: (node: number) => A): A => {
    const out = make(tree.lastDepthOf(leaf) + 1)
    for (const node of nodes) out.set(part(node), tree.depthOf(node))
    return out
  }
  return {
    nodes,
    tokens: concat((n) => new Int32Array(n), (node) => tree.tokensOf(node)),
    versions: concat((n) => new Int32Array(n), (node) => tree.versionsOf(node)),
    logprobs: concat((n) => new Float32Array(n), (node) => tree.logprobsOf(node))
  }
}

/** A plain sequence as a packed batch. */
const sequence = (path: ReturnType<typeof pathArrays>, weights: Float32Array, advantage: number): PackedBatch => {
  const n = path.tokens.length
  return {
    length: n,
    tokens: path.tokens,
    parents: Int32Array.from({ length: n }, (_, i) => i - 1),
    positions: Int32Array.from({ length: n }, (_, i) => i),
    weights,
    advantages: new Float32Array(n).fill(advantage),
    behaviourLogprobs: path.logprobs,
    proximalLogprobs: new Float32Array(n).fill(Number.NaN),
    versions: path.versions
  }
}

const trainable = (path: ReturnType<typeof pathArrays>, i: number) => path.versions[i]! >= 0 && i > 0

/** Every root-to-leaf path of every execution, weighted c(t) / (E N_e) summed per path: 1 / (E N_e) each. */
const flatExact = (steps: ReadonlyArray<StepExecution>): Array<PackedBatch> => {
  const perExecution = steps.map((step) => {
    const paths = step.tree.leaves().map((leaf) => pathArrays(step.tree, leaf.node))
    const total = paths.reduce((a, p) => a + p.tokens.filter((_, i) => trainable(p, i)).length, 0)
    return { step, paths, total }
  })
  const training = perExecution.filter((e) => e.total > 0)
  return training.flatMap(({ step, paths, total }) =>
    paths.map((p) => sequence(p, Float32Array.from(p.tokens, (_, i) => (trainable(p, i) ? 1 / (training.length * total) : 0)), step.advantage))
  )
}

/** Every chosen path as its own sequence; tokens an earlier chosen path trained get weight 0. */
const flatSampled = (steps: ReadonlyArray<StepExecution>, mode: TrainingMode & { _tag: "sampled" }): Array<PackedBatch> => {
  const { samples, executions } = stepUnits(steps, mode)
  return steps.flatMap((step) => {
    const sample = samples.get(step.execution)!
    if (sample.trainedTokens === 0) return []
    const trained = new Set<number>()
    return sample.paths.map((chosen) => {
      const p = pathArrays(step.tree, chosen.leaf)
      const weights = new Float32Array(p.tokens.length)
      for (const node of p.nodes) {
        if (trained.has(node)) continue
        trained.add(node)
        for (let i = step.tree.depthOf(node); i <= step.tree.lastDepthOf(node); i++) {
          if (trainable(p, i)) weights[i] = 1 / (executions * sample.trainedTokens)
        }
      }
      return sequence(p, weights, step.advantage)
    })
  })
}

const lossAndGrads = (batches: ReadonlyArray<PackedBatch>, loss: LossConfig, maxTokens: number) =>
  Effect.gen(function* () {
    const engine = yield* Engine
    const model = yield* engine.createModel(config, { seed: 5, initStd: 0.1 })
    const trainer = yield* model.trainer({ maxTokens })
    yield* trainer.zeroGrads()
    let total = 0
    for (const batch of batches) total += (yield* trainer.train(batch, loss)).stats.loss
    return { loss: total, grads: yield* trainer.getGrads() }
  })

const ppo: LossConfig = { kind: "ppo", clipLow: 0.2, clipHigh: 0.28, isCap: 0 }

describe("packed trees on the engine", () => {
  it("give the loss and gradient of training every path as its own sequence (exact and sampled, split and whole)", async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(executionArb(14), { minLength: 1, maxLength: 3 }), fc.integer({ min: 1, max: 12 }), async (executions, slack) => {
        const steps = executions.map((calls, i) => ({ execution: `e${i}`, tree: build(wireRecords(calls)).tree, advantage: 0.5 - i }))
        const maxDepth = Math.max(0, ...steps.map((s) => Math.max(0, ...s.tree.leaves().map((l) => s.tree.lastDepthOf(l.node)))))
        const sampledMode = { _tag: "sampled", maxPaths: 2, seed: 3 } as const
        const cases: Array<{ mode: TrainingMode; budget: number; flat: Array<PackedBatch> }> = [
          { mode: { _tag: "exact" }, budget: maxDepth + 1 + slack, flat: flatExact(steps) },
          { mode: { _tag: "exact" }, budget: 4096, flat: flatExact(steps) },
          // Paths longer than the budget: long parts are micro-batches of their own.
          { mode: { _tag: "exact" }, budget: Math.max(2, maxDepth >> 1), flat: flatExact(steps) },
          { mode: sampledMode, budget: Math.max(2, maxDepth >> 1), flat: flatSampled(steps, sampledMode) },
          { mode: sampledMode, budget: maxDepth + 1 + slack, flat: flatSampled(steps, sampledMode) }
        ]
        for (const { mode, budget, flat } of cases) {
          const batches = packMicroBatches(stepUnits(steps, mode).units, budget).microBatches.map((mb) => mb.build())
          for (const loss of [{ kind: "sft" } as const, ppo]) {
            // The trainer is the budget's size: a longer micro-batch trains in chunks.
            const maxTokens = budget
            const tree = await runEngine(lossAndGrads(batches, loss, maxTokens))
            const paths = await runEngine(lossAndGrads(flat, loss, maxTokens))
            expect(tree.loss).toBeCloseTo(paths.loss, 5)
            if (flat.length > 0) expect(relativeError(tree.grads, paths.grads)).toBeLessThan(1e-4)
          }
        }
      }),
      { numRuns: 8 }
    )
  })
})
