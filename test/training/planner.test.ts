/**
 * The step planner alone (pure): groups become micro-batches as they complete, scaled by the
 * step's planned executions; dropped and equal-reward executions; executions with paths longer
 * than the budget trained whole (nothing dropped); progress; refusals. A step's metrics stay
 * bounded whatever its size.
 */
import { createHash } from "node:crypto"
import { describe, expect, it } from "vitest"
import type { StepExecutionRef, StepPlan } from "../../src/protocols/device.ts"
import { executionName, stepLearningRate, type TrainingSettings } from "../../src/protocols/run.ts"
import { BATCH_DIGEST_LIMIT, ERROR_REASON_CHARS, MetricsSum, PhaseClock } from "../../src/training/step-metrics.ts"
import { DR_GRPO_TOKENS, NODE_DIGEST_BUDGET, StepPlanner, type PlannedMicroBatch, type Told } from "../../src/training/step-planner.ts"
import { callAdvantages, stateAdvantages } from "../../src/tree/advantage.ts"
import { digestOf } from "../../src/tree/hash.ts"
import { pathCounts } from "../../src/tree/units.ts"
import type { TrajectoryTree } from "../../src/tree/tree.ts"
import { build, wireRecords } from "../tree/simulate.ts"
import { agentCalls, scored } from "./fixtures.ts"

const settings = (over: Partial<TrainingSettings> = {}): TrainingSettings => ({
  advantage: "grpo",
  mode: "exact",
  maxPaths: 2,
  loss: "ppo",
  clipLow: 0.2,
  clipHigh: 0.2,
  isCap: 2,
  lr: 1e-3,
  microBatchTokens: 64,
  checkpointEvery: 1,
  ...over
})

const plan: StepPlan = { step: 2, attempt: 0, version: 2, executions: 4, groupSizes: [2, 2], cells: [] }

const execution = (n: number, score: number | null): { ref: StepExecutionRef; tree: TrajectoryTree } => {
  const tree = build(wireRecords(agentCalls(n))).tree
  const id = executionName(2, 8 + n)
  return { ref: { step: 2, execution: id, task: `t${n >> 1}`, group: n >> 1, tokens: tree.uniqueTokens, outcome: scored("r", `t${n >> 1}`, id, score) }, tree }
}

const queued = (t: Told) => {
  if (t._tag !== "Queued") throw new Error(`expected Queued, got ${JSON.stringify(t)}`)
  return t
}

const weightSum = (mbs: ReadonlyArray<PlannedMicroBatch>) => mbs.reduce((a, mb) => a + mb.build().weights.reduce((b, w) => b + w, 0), 0)

describe("step planner", () => {
  it("plans each group when it completes, numbers micro-batches consecutively, and scales by the planned executions", () => {
    for (const mode of ["exact", "sampled"] as const) {
      const planner = new StepPlanner(plan, settings({ mode }), 5)
      const xs = [0, 1, 2, 3].map((n) => execution(n, n % 2 === 0 ? 0.1 : 0.7))
      expect(queued(planner.tell(xs[0]!.ref, xs[0]!.tree)).microBatches).toEqual([])
      const first = queued(planner.tell(xs[1]!.ref, xs[1]!.tree)).microBatches
      expect(first.length).toBeGreaterThan(1)
      expect(planner.complete).toBe(false)
      const second = queued(planner.tell(xs[3]!.ref, xs[3]!.tree)).microBatches
      expect(second).toEqual([])
      const third = queued(planner.tell(xs[2]!.ref, xs[2]!.tree)).microBatches
      const all = [...first, ...third]
      expect(all.map((mb) => mb.index)).toEqual(all.map((_, i) => i))
      for (const mb of all) expect([mb.tokens, mb.build().length]).toEqual([mb.tokens, mb.tokens])
      for (const mb of all) expect(mb.tokens).toBeLessThanOrEqual(64)
      // each execution's weights sum to 1 / E: 4 executions of E = 4
      expect(weightSum(first)).toBeCloseTo(0.5, 5)
      expect(weightSum(all)).toBeCloseTo(1, 5)
      expect(planner.complete).toBe(true)
      // progress: an execution is trained once all its micro-batches are in, whatever the order
      let tokens = 0
      for (const mb of [...all].reverse()) tokens += planner.gradientIn(mb.index)
      expect(tokens).toBe(xs.reduce((a, x) => a + x.ref.tokens, 0))
      expect(all.reduce((a, mb) => a + mb.completesTokens, 0)).toBe(tokens)
      expect(planner.figures).toMatchObject({ told: 4, dropped: 0, scored: 4 })
    }
  })

  it("Dr. GRPO sums its loss over tokens: each execution weighs its path tokens / (E * DR_GRPO_TOKENS)", () => {
    const planner = new StepPlanner(plan, settings({ advantage: "dr-grpo", microBatchTokens: 4096 }), 5)
    const [short, long] = [execution(0, 0.2), execution(6, 0.8)].map((x, i) => ({ ...x, ref: { ...x.ref, execution: executionName(2, 8 + i), group: 0 } }))
    queued(planner.tell(short!.ref, short!.tree))
    const mbs = queued(planner.tell(long!.ref, long!.tree)).microBatches
    const pathTokens = (tree: TrajectoryTree) => {
      const counts = pathCounts(tree)
      const trainable = tree.trainableCounts()
      return counts.reduce((a, c, node) => a + c * trainable[node]!, 0)
    }
    // GRPO would give each execution 1 / E (0.5 for the two); Dr. GRPO their path tokens / (E * 1024)
    const expected = (pathTokens(short!.tree) + pathTokens(long!.tree)) / (4 * DR_GRPO_TOKENS)
    expect(Math.abs(expected - 0.5)).toBeGreaterThan(0.01)
    expect(weightSum(mbs)).toBeCloseTo(expected, 5)
  })

  it("drops failed evaluations, skips zero advantages, trains paths longer than the budget", () => {
    const planner = new StepPlanner(plan, settings(), 5)
    const [a, b, c, d] = [execution(0, null), execution(1, 0.5), execution(2, 0.4), execution(3, 0.4)]
    queued(planner.tell(a!.ref, a!.tree))
    // a group of one scored execution: GRPO advantage 0, nothing to train; its tokens are consumed
    const alone = queued(planner.tell(b!.ref, b!.tree))
    expect(alone.microBatches).toEqual([])
    expect(alone.consumedTokens).toBe(a!.ref.tokens + b!.ref.tokens)
    queued(planner.tell(c!.ref, c!.tree))
    const equal = queued(planner.tell(d!.ref, d!.tree))
    expect(equal.microBatches).toEqual([])
    expect(planner.complete).toBe(true)
    expect(planner.microBatches).toBe(0)
    expect(planner.figures).toMatchObject({ told: 4, dropped: 1, scored: 3 })

    // Budgets far below the deepest path: the same weights as a budget that holds everything, nothing dropped.
    const [e, f] = [execution(0, 0.1), execution(1, 0.9)]
    const deepest = Math.max(...[e!, f!].map(({ tree }) => Math.max(...tree.leaves().map((l) => tree.lastDepthOf(l.node)))))
    const planned = (budget: number) => {
      const p = new StepPlanner(plan, settings({ microBatchTokens: budget }), 5)
      queued(p.tell(e!.ref, e!.tree))
      const long = queued(p.tell(f!.ref, f!.tree))
      expect(long.consumedTokens).toBe(0)
      expect(p.figures.dropped).toBe(0)
      return long.microBatches
    }
    const whole = planned(1 << 16)
    for (const budget of [4, 16, deepest]) {
      const long = planned(budget)
      expect(Math.max(...long.map((mb) => mb.tokens))).toBeGreaterThan(budget)
      expect(weightSum(long)).toBeCloseTo(weightSum(whole), 5)
      expect(new Set(long.flatMap((mb) => mb.executions))).toEqual(new Set([e!.ref.execution, f!.ref.execution]))
    }
  })

  it("call credit: each call trains with its own reward pooled over the group; execution credit ignores per-call rewards", () => {
    const withRewards = (n: number, score: number, rewards: Record<string, number>) => {
      const x = execution(n, score)
      return { ...x, ref: { ...x.ref, outcome: { ...x.ref.outcome, rewards } } }
    }
    const group = () => [withRewards(0, 0.5, { c0: 1, c1r: 0 }), withRewards(1, 0.5, { c0: 0 })]
    const advantagesOf = (over: Partial<TrainingSettings>) => {
      const planner = new StepPlanner(plan, settings({ microBatchTokens: 4096, ...over }), 5)
      const [a, b] = group()
      queued(planner.tell(a!.ref, a!.tree))
      return queued(planner.tell(b!.ref, b!.tree)).microBatches.flatMap((mb) => {
        const batch = mb.build()
        return Array.from(batch.advantages).filter((_, i) => batch.weights[i] !== 0)
      })
    }
    // Equal scores: with execution credit nothing trains, whatever the calls' rewards.
    expect(advantagesOf({ credit: "execution" })).toEqual([])
    expect(advantagesOf({})).toEqual([])
    const trained = advantagesOf({ credit: "call" })
    const [a, b] = group()
    const rewards = [a!, b!].map(({ ref, tree }) => Array.from({ length: tree.callCount }, (_, c) => ref.outcome.rewards![tree.call(c).id] ?? 0.5))
    const expected = new Set(callAdvantages(rewards, { estimator: "grpo", epsilon: 1e-6 }).flatMap((v) => Array.from(v, Math.fround)))
    expect(new Set(trained).size).toBeGreaterThanOrEqual(3)
    for (const v of trained) expect(expected.has(v)).toBe(true)
    expect(trained.some((v) => v > 0) && trained.some((v) => v < 0)).toBe(true)
    // State credit: the same rewards judged among the calls with the same input.
    const inputs = [a!, b!].map(({ tree }) => Array.from({ length: tree.callCount }, (_, c) => digestOf(tree.newInput(c))))
    const byState = new Set(stateAdvantages(rewards, inputs, { estimator: "grpo", epsilon: 1e-6 }).flatMap((v) => Array.from(v, Math.fround)))
    expect([...byState].sort()).not.toEqual([...expected].sort()) // some calls share an input
    const trainedByState = advantagesOf({ credit: "state" })
    expect(trainedByState.length).toBeGreaterThan(0)
    for (const v of trainedByState) expect(byState.has(v)).toBe(true)
  })

  it("refuses executions outside the plan and ignores duplicates", () => {
    const planner = new StepPlanner(plan, settings(), 5)
    const x = execution(0, 0.3)
    expect(planner.tell({ ...x.ref, step: 3 }, x.tree)._tag).toBe("Refused")
    expect(planner.tell({ ...x.ref, execution: executionName(1, 8) }, x.tree)._tag).toBe("Refused")
    expect(planner.tell({ ...x.ref, group: 2 }, x.tree)._tag).toBe("Refused")
    expect(planner.tell(x.ref, x.tree)._tag).toBe("Queued")
    expect(planner.tell(x.ref, x.tree)._tag).toBe("Duplicate")
    const y = execution(1, 0.3)
    expect(planner.tell(y.ref, y.tree)._tag).toBe("Queued")
    const z = execution(2, 0.3)
    expect(planner.tell({ ...z.ref, group: 0 }, z.tree)).toMatchObject({ _tag: "Refused", reason: expect.stringContaining("already has") })
  })
})

describe("the learning rate of a step", () => {
  it("rises linearly over the warm-up, then stays; no warm-up (or a run journaled before it) is the full rate at once", () => {
    const rates = [0, 1, 2, 3, 4, 40].map((k) => stepLearningRate(settings({ lr: 4e-4, lrWarmup: 4 }), k) * 1e4)
    rates.forEach((r, i) => expect(r).toBeCloseTo([1, 2, 3, 4, 4, 4][i]!, 9))
    expect([0, 5].map((k) => stepLearningRate(settings({ lr: 4e-4, lrWarmup: 0 }), k))).toEqual([4e-4, 4e-4])
    expect(stepLearningRate(settings({ lr: 4e-4 }), 0)).toBe(4e-4)
  })
})

describe("a step's metrics", () => {
  it("stay below a message's max_payload (1 MiB) however many micro-batches, trees and errors the step has", () => {
    const executions = 512
    const nodeChars = NODE_DIGEST_BUDGET / executions
    const figures = {
      told: executions,
      dropped: 0,
      scored: executions,
      scoreSum: 0,
      callTokens: 0,
      uniqueTokens: 0,
      trees: Array.from({ length: executions }, (_, n) => ({ execution: executionName(7, n), calls: 300, uniqueTokens: 1_000_000, paths: 40, digest: "f".repeat(16), nodes: "a".repeat(nodeChars) }))
    }
    const digests = Array.from({ length: 50_000 }, (_, i) => createHash("sha256").update(String(i)).digest("hex"))
    const sum = new MetricsSum()
    for (let n = 0; n < executions; n++) {
      sum.addError(executionName(7, n), `micro-batch ${n}: the engine failed (GYRE_ERR_INVALID_ARGUMENT): ${"x".repeat(5000)}`)
      sum.addError(executionName(7, n), "a second reason is not kept")
    }
    const m = sum.metrics({ step: 7, figures, microBatches: digests.length, batchDigests: digests, devices: ["device/a.0"], gradNorm: 1, clock: new PhaseClock(0), reduceMs: 0, publishMs: 0 })
    expect(JSON.stringify(m).length).toBeLessThan(1 << 20)
    expect(m.batchDigests).toEqual(digests.slice(0, BATCH_DIGEST_LIMIT))
    expect(m.allBatchesDigest).toBe(createHash("sha256").update(digests.join("")).digest("hex"))
    expect(m.errors).toHaveLength(executions)
    expect(m.errors!.every((e) => e.reason.length <= ERROR_REASON_CHARS && e.reason.startsWith("micro-batch "))).toBe(true)
  })
})
