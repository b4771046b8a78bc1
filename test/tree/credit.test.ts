/**
 * Call credit: per-call rewards pooled over a group, and each generated token of a unit
 * trained with the mean advantage of the calls that generated it. State credit: a call judged
 * among the group's calls that answered the same input (`TrajectoryTree.newInput`).
 */
import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { callAdvantages, groupAdvantages, stateAdvantages, type AdvantageConfig } from "../../src/tree/advantage.ts"
import { plainCall } from "../../src/tree/record.ts"
import { stepUnits, type TrainingMode } from "../../src/tree/units.ts"
import { build, executionArb, wireRecords } from "./simulate.ts"

const grpo: AdvantageConfig = { estimator: "grpo", epsilon: 1e-6 }

/** The root-to-token path of unit token i, following parents. */
const pathOf = (unit: { readonly tokens: Int32Array; readonly parents: Int32Array }, i: number): Array<number> => {
  const path: Array<number> = []
  for (let k = i; k >= 0; k = unit.parents[k]!) path.push(unit.tokens[k]!)
  return path.reverse()
}

describe("call credit", () => {
  it("pools every call of the group's executions under one estimator", () => {
    const rewards = [[1, 0.5, 0.5], [0], [1, 1]]
    for (const estimator of ["grpo", "dr-grpo", "rloo"] as const) {
      const config = { estimator, epsilon: 1e-6 }
      const pooled = groupAdvantages(rewards.flat(), config)
      expect(callAdvantages(rewards, config).map((a) => Array.from(a))).toEqual([pooled.slice(0, 3), pooled.slice(3, 4), pooled.slice(4)])
    }
    expect(callAdvantages([[0.5, 0.5], [0.5]], grpo).every((a) => a.every((v) => v === 0))).toBe(true)
  })

  it("gives a generated token its call's advantage; a retry that sampled the same tokens shares the mean", () => {
    const calls = [
      plainCall("a", "main", [1, 2], [3, 4]),
      plainCall("b", "main", [1, 2], [5]),
      plainCall("c", "main", [1, 2, 3, 4, 9], [6, 7]),
      plainCall("d", "main", [1, 2], [3, 4])
    ]
    const tree = build(wireRecords(calls)).tree
    const [unit] = stepUnits([{ execution: "e", tree, advantage: 0, callAdvantages: [0.5, -1, 2, 1.5] }], { _tag: "exact" }).units
    const byPath = new Map<string, number>()
    unit!.weights.forEach((w, i) => {
      if (w !== 0) byPath.set(pathOf(unit!, i).join(","), unit!.advantages[i]!)
    })
    expect(Object.fromEntries(byPath)).toEqual({ "1,2,3": 1, "1,2,3,4": 1, "1,2,5": -1, "1,2,3,4,9,6": 2, "1,2,3,4,9,6,7": 2 })
  })

  it("matches the calls whose output holds each trained token, in both training modes", () => {
    const modes: ReadonlyArray<TrainingMode> = [{ _tag: "exact" }, { _tag: "sampled", maxPaths: 3, seed: 7 }]
    fc.assert(
      fc.property(executionArb(30), fc.integer({ min: 0, max: 1 }), fc.nat(), (calls, m, seed) => {
        const tree = build(wireRecords(calls)).tree
        const perCall = Array.from({ length: tree.callCount }, (_, c) => ((seed + c * 7919) % 13) - 6)
        const byId = new Map(Array.from({ length: tree.callCount }, (_, c) => [tree.call(c).id, perCall[c]!]))
        const { units } = stepUnits([{ execution: "e", tree, advantage: 99, callAdvantages: perCall }], modes[m]!)
        for (const unit of units) {
          unit.weights.forEach((w, i) => {
            if (w === 0) return expect(unit.advantages[i]).toBe(0)
            const path = pathOf(unit, i)
            const makers = calls.filter((c) => {
              const sequence = [...c.prompt, ...c.output]
              return path.length - 1 >= c.prompt.length && path.length <= sequence.length && path.every((t, k) => sequence[k] === t)
            })
            expect(makers.length).toBeGreaterThan(0)
            const mean = makers.reduce((a, c) => a + byId.get(c.callId)!, 0) / makers.length
            expect(unit.advantages[i]).toBeCloseTo(mean, 5)
          })
        }
      }),
      { numRuns: 80 }
    )
  })

  it("state credit: judges a call among the calls with its input; a call alone with its input keeps its pooled advantage", () => {
    const rewards = [[1, 0, 0.5], [0, 1], [1]]
    const keys = [["a", "b", "lone"], ["a", "b"], ["a"]]
    for (const estimator of ["grpo", "dr-grpo", "rloo"] as const) {
      const config = { estimator, epsilon: 1e-6 }
      const a = groupAdvantages([1, 0, 1], config)
      const b = groupAdvantages([0, 1], config)
      const pooled = callAdvantages(rewards, config)
      expect(stateAdvantages(rewards, keys, config).map((x) => Array.from(x))).toEqual([[a[0], b[0], pooled[0]![2]], [a[1], b[1]], [a[2]]])
    }
  })

  it("newInput is what a call's prompt adds after the last generated token (the whole prompt of a first call)", () => {
    const calls = [
      plainCall("first", "main", [1, 2], [3, 4]),
      plainCall("next", "main", [1, 2, 3, 4, 8, 9], [5]),
      plainCall("fork", "sub", [1, 2, 3, 7], [6]),
      plainCall("retry", "main", [1, 2, 3, 4, 8, 9, 5, 8, 9], [6])
    ]
    const tree = build(wireRecords(calls)).tree
    const inputs = Array.from({ length: tree.callCount }, (_, c) => [tree.call(c).id, Array.from(tree.newInput(c))])
    expect(Object.fromEntries(inputs)).toEqual({ first: [1, 2], next: [8, 9], fork: [7], retry: [8, 9] })
  })
})
