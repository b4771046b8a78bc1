import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { packMicroBatches } from "../../src/tree/pack.ts"
import { plainCall, type ModelCall } from "../../src/tree/record.ts"
import { roleRank } from "../../src/tree/role.ts"
import { samplePaths } from "../../src/tree/sample.ts"
import { ROOT, type TrajectoryTree } from "../../src/tree/tree.ts"
import { stepUnits, type TrainingUnit } from "../../src/tree/units.ts"
import { build, deliveryOrder, executionArb, naiveLeafCounts, naivePreorder, naiveTrie, wireRecords } from "./simulate.ts"

const treeOf = (calls: ReadonlyArray<ModelCall>, seeds: ReadonlyArray<number> = []) => build(deliveryOrder(wireRecords(calls), seeds)).tree

/** Trainable tokens (generated, depth > 0) on a leaf's path, as "node:offset" keys. */
const trainableOnPath = (tree: TrajectoryTree, leaf: number): Array<string> => {
  const keys: Array<string> = []
  for (let node = leaf; node !== ROOT; node = tree.parentOf(node)) {
    tree.versionsOf(node).forEach((v, j) => {
      if (v >= 0 && tree.depthOf(node) + j > 0) keys.push(`${node}:${j}`)
    })
  }
  return keys
}

/** The root-to-token path of unit (or batch) token i, following parents. */
const pathOf = (layout: { readonly tokens: Int32Array; readonly parents: Int32Array }, i: number): Array<number> => {
  const path: Array<number> = []
  for (let k = i; k >= 0; k = layout.parents[k]!) path.push(layout.tokens[k]!)
  return path.reverse()
}

const sumWeights = (units: ReadonlyArray<TrainingUnit>) => units.reduce((a, u) => a + u.weights.reduce((b, w) => b + w, 0), 0)

describe("bounded dedup sampling", () => {
  it("never trains a token twice, respects J_max and the role order, and is deterministic", () => {
    fc.assert(
      fc.property(executionArb(30), fc.integer({ min: 1, max: 6 }), fc.nat(), fc.array(fc.nat(), { maxLength: 20 }), (calls, maxPaths, seed, order) => {
        const tree = treeOf(calls)
        const sample = samplePaths(tree, maxPaths, seed)
        expect(sample.paths.length).toBeLessThanOrEqual(maxPaths)
        const leaves = tree.leaves()
        const trained = new Set<string>()
        const unmasked = (leaf: number) => trainableOnPath(tree, leaf).filter((k) => !trained.has(k)).length
        let lastRank = 0
        for (const path of sample.paths) {
          const best = Math.min(...leaves.filter((l) => unmasked(l.node) > 0).map((l) => roleRank(l.role)))
          expect(roleRank(path.role)).toBe(best)
          expect(roleRank(path.role)).toBeGreaterThanOrEqual(lastRank)
          lastRank = roleRank(path.role)
          const fresh = trainableOnPath(tree, path.leaf).filter((k) => !trained.has(k))
          expect(fresh.length).toBe(path.trainedTokens)
          expect(path.trainedTokens).toBeGreaterThan(0)
          for (const k of fresh) trained.add(k)
        }
        if (sample.paths.length < maxPaths) for (const l of leaves) expect(unmasked(l.node)).toBe(0)
        expect(sample.trainedTokens).toBe(trained.size)
        expect(samplePaths(tree, maxPaths, seed)).toEqual(sample)
        // The same records in another order give the same paths.
        const other = treeOf(calls, order)
        const again = samplePaths(other, maxPaths, seed)
        const pathTokens = (t: TrajectoryTree, leaf: number) => Array.from(t.pathTokens({ node: leaf, depth: t.lastDepthOf(leaf) }))
        expect(again.paths.map((p) => pathTokens(other, p.leaf))).toEqual(sample.paths.map((p) => pathTokens(tree, p.leaf)))
        // Packed, the union trains each of those tokens once, with weight 1 / (E * T_e).
        const { units, samples } = stepUnits([{ execution: "e", tree, advantage: 1 }], { _tag: "sampled", maxPaths, seed })
        const trainedInStep = samples.get("e")!.trainedTokens
        expect(units.length).toBe(trainedInStep > 0 ? 1 : 0)
        expect(units.flatMap((u) => Array.from(u.weights).filter((w) => w > 0)).length).toBe(trainedInStep)
        if (trainedInStep > 0) expect(sumWeights(units)).toBeCloseTo(1, 5)
      }),
      { numRuns: 120 }
    )
  })

  it("draws leaves of one class in proportion to their unmasked trainable tokens", () => {
    const call = (callId: string, prompt: Array<number>, output: Array<number>, role = "main"): ModelCall => plainCall(callId, role, prompt, output)
    const tree = treeOf([call("a", [1, 2], [3]), call("b", [1, 2], [4, 5, 6]), call("s", [1, 2, 9], [7, 7, 7, 7, 7, 7], "subagent")])
    let drewB = 0
    const draws = 4000
    for (let seed = 0; seed < draws; seed++) {
      const { paths } = samplePaths(tree, 1, seed)
      expect(paths[0]!.role).toBe("main") // the subagent leaf has more tokens but a lower class
      if (paths[0]!.trainedTokens === 3) drewB++
    }
    expect(drewB / draws).toBeGreaterThan(0.72)
    expect(drewB / draws).toBeLessThan(0.78)
    const all = samplePaths(tree, 5, 1)
    expect(all.paths.map((p) => p.role)).toEqual(["main", "main", "subagent"])
    expect(all.trainedTokens).toBe(10)
  })
})

describe("exact tree packing", () => {
  it("weights each generated token by the root-to-leaf paths through it, normalised per execution then over executions", () => {
    fc.assert(
      fc.property(fc.array(executionArb(20), { minLength: 1, maxLength: 3 }), (executions) => {
        const steps = executions.map((calls, i) => ({ execution: `e${i}`, tree: treeOf(calls), advantage: i - 1 }))
        const { units, executions: e } = stepUnits(steps, { _tag: "exact" })
        expect(units.length).toBe(e)
        for (const unit of units) {
          const calls = executions[Number(unit.execution.slice(1))]!
          const naive = naiveTrie(calls)
          const order = naivePreorder(naive)
          const counts = naiveLeafCounts(naive)
          expect(unit.length).toBe(order.length)
          let flat = 0
          order.forEach((n, i) => {
            expect(unit.tokens[i]).toBe(n.token)
            expect(unit.positions[i]).toBe(n.depth)
            const trainable = n.version >= 0 && n.depth > 0
            if (trainable) flat += counts.get(n)!
            expect(unit.weights[i]! / unit.lossScale).toBeCloseTo(trainable ? counts.get(n)! : 0, 3)
            expect(unit.parents[i]! < i).toBe(true)
          })
          expect(unit.lossScale).toBeCloseTo(1 / (e * flat), 12)
          expect(unit.advantages.every((a) => a === Number(unit.execution.slice(1)) - 1)).toBe(true)
        }
        if (units.length > 0) expect(sumWeights(units)).toBeCloseTo(1, 4)
      }),
      { numRuns: 80 }
    )
  })
})

describe("packing into micro-batches", () => {
  /** "advantage|path" -> weight of every trained token (each tree path is unique). */
  const trainedKeys = (layouts: ReadonlyArray<{ tokens: Int32Array; parents: Int32Array; weights: Float32Array; adv: (i: number) => number }>) => {
    const keys = new Map<string, number>()
    for (const layout of layouts) {
      layout.weights.forEach((w, i) => {
        if (w === 0) return
        const key = `${layout.adv(i)}|${pathOf(layout, i).join(",")}`
        expect(keys.has(key)).toBe(false)
        keys.set(key, w)
      })
    }
    return keys
  }

  const deepest = (u: TrainingUnit) => Math.max(...u.positions)

  it("splits trees larger than the budget into parts that train every token exactly once with its full context, paths longer than the budget included", () => {
    fc.assert(
      fc.property(
        fc.array(executionArb(24), { minLength: 1, maxLength: 4 }),
        fc.boolean(),
        fc.double({ min: 0, max: 1.3, noNaN: true }),
        (executions, sampled, fraction) => {
          const maxPaths = 3
          const steps = executions.map((calls, i) => ({ execution: `e${i}`, tree: treeOf(calls), advantage: i + 1 }))
          const { units } = stepUnits(steps, sampled ? { _tag: "sampled", maxPaths, seed: 7 } : { _tag: "exact" })
          const maxDepth = Math.max(0, ...units.map(deepest))
          // Budgets from 1 token to above the deepest path: below it, some paths are longer than a micro-batch.
          const budget = Math.max(1, Math.round(fraction * (maxDepth + 1)))
          const { microBatches, report } = packMicroBatches(units, budget)
          const batches = microBatches.map((mb) => mb.build())
          const unitTokens = units.reduce((a, u) => a + u.length, 0)
          const long = units.filter((u) => deepest(u) >= budget)
          batches.forEach((batch, k) => {
            expect(batch.length).toBe(microBatches[k]!.tokens)
            // Only a part of a long unit goes past the budget, and alone.
            if (batch.length > budget) {
              expect(microBatches[k]!.executions).toHaveLength(1)
              expect(long.map((u) => u.execution)).toContain(microBatches[k]!.executions[0])
            }
            batch.parents.forEach((p, i) => {
              expect(p).toBeLessThan(i)
              expect(batch.positions[i]).toBe(p < 0 ? 0 : batch.positions[p]! + 1)
              expect(batch.advantages[i]).toBe(p < 0 ? batch.advantages[i] : batch.advantages[p])
            })
            expect(batch.proximalLogprobs.every(Number.isNaN)).toBe(true)
          })
          const fromUnits = trainedKeys(units.map((u) => ({ ...u, adv: (i: number) => u.advantages[i]! })))
          const fromBatches = trainedKeys(batches.map((b) => ({ ...b, adv: (i: number) => b.advantages[i]! })))
          expect(fromBatches).toEqual(fromUnits)
          expect(report.trainedTokens).toBe(fromUnits.size)
          expect(report.tokens).toBe(unitTokens + report.carriedTokens)
          expect(report.microBatches).toBe(batches.length)
          expect(report.fillRatio).toBeLessThanOrEqual(1)
          expect(report.longUnits).toBe(long.length)
          expect(report.longMicroBatches).toBe(batches.filter((b) => b.length > budget).length)
          expect(report.largest).toBe(Math.max(0, ...batches.map((b) => b.length)))
          // No part recomputes a context as long as a micro-batch.
          if (report.carriedTokens > 0) expect(report.maxCarried).toBeLessThan(budget)
          const over = units.filter((u) => u.length > budget)
          expect(report.splitUnits).toBeGreaterThanOrEqual(over.filter((u) => deepest(u) < budget).length)
          expect(report.splitUnits).toBeLessThanOrEqual(over.length)
          // Sampling keeps its bound: the trained tokens of an execution lie on at most J_max root-to-leaf paths.
          if (sampled) {
            for (const u of units) {
              const paths = [...fromBatches.keys()].filter((k) => k.startsWith(`${u.advantages[0]}|`)).map((k) => k.split("|")[1]!)
              const maximal = paths.filter((p) => !paths.some((q) => q !== p && q.startsWith(`${p},`)))
              expect(maximal.length).toBeLessThanOrEqual(maxPaths)
            }
          }
        }
      ),
      { numRuns: 150 }
    )
  })

  /** Every choice of cuts of a unit at its subtree starts shallower than the budget: the least carried + excess. */
  const bruteForceCost = (u: TrainingUnit, budget: number): number => {
    const starts: Array<number> = []
    for (let i = 1; i < u.length; i++) if (u.parents[i] !== i - 1 && u.positions[i]! < budget) starts.push(i)
    let best = Infinity
    for (let mask = 0; mask < 1 << starts.length; mask++) {
      const cuts = [0, ...starts.filter((_, j) => (mask >> j) & 1), u.length]
      let cost = 0
      for (let k = 0; k + 1 < cuts.length; k++) {
        const size = u.positions[cuts[k]!]! + cuts[k + 1]! - cuts[k]!
        cost += u.positions[cuts[k]!]! + Math.max(0, size - budget)
      }
      best = Math.min(best, cost)
    }
    return best
  }

  it("cuts a long unit where the least tokens are carried or held past the budget (against every choice of cuts)", () => {
    fc.assert(
      fc.property(executionArb(16), fc.double({ min: 0.05, max: 1, noNaN: true }), (calls, fraction) => {
        const [unit] = stepUnits([{ execution: "e", tree: treeOf(calls), advantage: 1 }], { _tag: "exact" }).units
        if (unit === undefined) return
        const budget = Math.max(1, Math.floor(fraction * deepest(unit)))
        let candidates = 0
        for (let i = 1; i < unit.length; i++) if (unit.parents[i] !== i - 1 && unit.positions[i]! < budget) candidates++
        fc.pre(deepest(unit) >= budget && candidates <= 12)
        const { microBatches, report } = packMicroBatches([unit], budget)
        const excess = microBatches.reduce((a, mb) => a + Math.max(0, mb.tokens - budget), 0)
        expect(report.carriedTokens + excess).toBe(bruteForceCost(unit, budget))
      }),
      { numRuns: 150 }
    )
  })
})
