import { Schema } from "effect"
import { describe, expect, it } from "vitest"
import { groupAdvantages, stepAdvantages, type AdvantageConfig } from "../../src/tree/advantage.ts"
import { ExecutionOutcome, rewardOf } from "../../src/tree/outcome.ts"

const config = (estimator: AdvantageConfig["estimator"]): AdvantageConfig => ({ estimator, epsilon: 1e-6 })

const outcome = (execution: string, task: string, evaluation: ExecutionOutcome["evaluation"], score: number | null, ended: ExecutionOutcome["ended"] = "finished"): ExecutionOutcome =>
  Schema.decodeUnknownSync(ExecutionOutcome)({ run: "r", task, execution, ended, evaluation, score, attempts: evaluation === "failed" ? 3 : 1, detail: "" })

describe("group-relative advantages", () => {
  it("computes GRPO, Dr. GRPO and RLOO on a known group", () => {
    const rewards = [1, 0, 0.5, 0.5]
    // mean 0.5, sample standard deviation sqrt(0.5 / 3)
    const std = Math.sqrt(0.5 / 3)
    groupAdvantages(rewards, config("grpo")).forEach((a, i) => expect(a).toBeCloseTo((rewards[i]! - 0.5) / (std + 1e-6), 9))
    expect(groupAdvantages(rewards, config("grpo"))[0]).toBeCloseTo(1.2247, 4)
    expect(groupAdvantages(rewards, config("dr-grpo"))).toEqual([0.5, -0.5, 0, 0])
    // RLOO: r_i minus the mean of the other three
    const rloo = groupAdvantages(rewards, config("rloo"))
    expect(rloo[0]).toBeCloseTo(1 - 1 / 3, 12)
    expect(rloo[1]).toBeCloseTo(0 - 2 / 3, 12)
    expect(rloo[2]).toBeCloseTo(0.5 - 0.5, 12)
  })

  it("gives 0 to a group of equal rewards and to a single execution", () => {
    for (const estimator of ["grpo", "dr-grpo", "rloo"] as const) {
      expect(groupAdvantages([0.3, 0.3, 0.3], config(estimator))).toEqual([0, 0, 0])
      expect(groupAdvantages([0.7], config(estimator))).toEqual([0])
      expect(groupAdvantages([], config(estimator))).toEqual([])
    }
  })

  it("scores timeouts by their partial score and no-artifact as 0, drops failed evaluations and counts them, groups by task", () => {
    const outcomes = [
      outcome("a1", "A", "scored", 1),
      outcome("a2", "A", "scored", 0.25, "timed-out"),
      outcome("a3", "A", "no-artifact", 0),
      outcome("a4", "A", "failed", null),
      outcome("b1", "B", "scored", 0.5),
      outcome("b2", "B", "failed", null)
    ]
    expect(outcomes.map(rewardOf)).toEqual([1, 0.25, 0, undefined, 0.5, undefined])
    const { advantages, dropped } = stepAdvantages(outcomes, config("dr-grpo"))
    expect(dropped).toEqual(["a4", "b2"])
    expect([...advantages.keys()].sort()).toEqual(["a1", "a2", "a3", "b1"])
    expect(advantages.get("a1")).toBeCloseTo(1 - 1.25 / 3, 12)
    expect(advantages.get("a3")).toBeCloseTo(-1.25 / 3, 12)
    expect(advantages.get("b1")).toBe(0)
  })

  it("validates outcomes: a failed evaluation has no score, no-artifact scores 0, scores lie in [0, 1]", () => {
    const decode = Schema.decodeUnknownSync(ExecutionOutcome)
    const base = { run: "r", task: "t", execution: "e", ended: "finished", attempts: 1, detail: "" }
    expect(() => decode({ ...base, evaluation: "failed", score: 0.5 })).toThrow(/no score/)
    expect(() => decode({ ...base, evaluation: "no-artifact", score: 0.1 })).toThrow(/scores 0/)
    expect(() => decode({ ...base, evaluation: "scored", score: 1.5 })).toThrow()
    expect(() => decode({ ...base, evaluation: "scored", score: null })).toThrow(/needs a score/)
  })
})
