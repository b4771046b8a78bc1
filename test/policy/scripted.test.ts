/**
 * Each policy against scripted event sequences: the actions it emits at each event are
 * written out by hand.
 */
import { describe, expect, it } from "vitest"
import { asyncSplit, colocate, elastic, elasticPublished, replay } from "../../src/policy/index.ts"
import type { Policy } from "../../src/policy/policy.ts"
import type { PolicyAction, PolicyConfig, PolicyEvent } from "../../src/policy/vocabulary.ts"

const config = (over: Partial<PolicyConfig> = {}): PolicyConfig => ({
  slots_per_cell: 1,
  executions_per_step: 2,
  steps: 2,
  max_staleness: 0,
  ...over
})

const joined = (cell: number, at = 0): PolicyEvent => ({ _tag: "CellJoined", cell, at })
const started = (execution: number, batch: number, at: number): PolicyEvent => ({ _tag: "ExecutionStarted", execution, batch, at })
const finished = (execution: number, batch: number, at: number, tokens = 100, duration_s = 10): PolicyEvent => ({
  _tag: "ExecutionFinished",
  execution,
  batch,
  tokens,
  duration_s,
  at
})
const switched = (cell: number, role: "rollout" | "training", at: number): PolicyEvent => ({ _tag: "SwitchDone", cell, role, at })
const toTraining = (cell: number): PolicyAction => ({ _tag: "SwitchRole", cell, role: "training" })
const toRollout = (cell: number): PolicyAction => ({ _tag: "SwitchRole", cell, role: "rollout" })

/** Feeds `script` (event, expected actions) pairs through `policy`. */
const expectScript = <S>(policy: Policy<S>, c: PolicyConfig, script: ReadonlyArray<readonly [PolicyEvent, ReadonlyArray<PolicyAction>]>) => {
  const got = replay(
    policy,
    c,
    script.map(([e]) => e)
  )
  script.forEach(([event, actions], i) => expect({ event, actions: got[i] }).toEqual({ event, actions }))
}

describe("colocate", () => {
  it("rolls out, then trains on every cell, then returns every cell", () => {
    expectScript(colocate, config(), [
      [joined(0), [{ _tag: "Dispatch", batch: 0 }]],
      [joined(1), []],
      [started(0, 0, 0), []],
      [started(1, 0, 0), []],
      [finished(0, 0, 10), []],
      [finished(1, 0, 20), [toTraining(0), toTraining(1)]],
      [switched(0, "training", 21), []],
      [switched(1, "training", 21), [{ _tag: "StartStep", step: 0, core: 0, cells: [0, 1] }]],
      [{ _tag: "StepDone", step: 0, at: 31 }, [{ _tag: "PublishWeights", version: 1 }, toRollout(0), toRollout(1)]],
      [switched(0, "rollout", 33), []],
      [switched(1, "rollout", 33), []],
      [{ _tag: "WeightsPublished", version: 1, at: 34 }, [{ _tag: "Dispatch", batch: 1 }]]
    ])
  })

  it("a step whose core is lost starts again on the cells left; a lost satellite leaves the step running", () => {
    const training: ReadonlyArray<readonly [PolicyEvent, ReadonlyArray<PolicyAction>]> = [
      [joined(0), [{ _tag: "Dispatch", batch: 0 }]],
      [joined(1), []],
      [joined(2), []],
      ...[0, 1].map((i) => [started(i, 0, 0), []] as const),
      [finished(0, 0, 10), []],
      [finished(1, 0, 20), [toTraining(0), toTraining(1), toTraining(2)]],
      [switched(0, "training", 21), []],
      [switched(1, "training", 21), []],
      [switched(2, "training", 21), [{ _tag: "StartStep", step: 0, core: 0, cells: [0, 1, 2] }]]
    ]
    expectScript(colocate, config(), [
      ...training,
      [{ _tag: "CellLost", cell: 0, at: 25 }, [{ _tag: "StartStep", step: 0, core: 1, cells: [1, 2] }]],
      [{ _tag: "StepDone", step: 0, at: 31 }, [{ _tag: "PublishWeights", version: 1 }, toRollout(1), toRollout(2)]]
    ])
    expectScript(colocate, config(), [
      ...training,
      [{ _tag: "CellLost", cell: 2, at: 25 }, []],
      [{ _tag: "StepDone", step: 0, at: 31 }, [{ _tag: "PublishWeights", version: 1 }, toRollout(0), toRollout(1)]]
    ])
  })
})

describe("async", () => {
  it("keeps a fixed split, dispatches within the staleness bound, trains a complete batch", () => {
    expectScript(asyncSplit(1), config({ max_staleness: 1 }), [
      [joined(0), [{ _tag: "Dispatch", batch: 0 }, { _tag: "Dispatch", batch: 1 }]],
      [joined(1), [toTraining(1)]],
      [started(0, 0, 0), []],
      [switched(1, "training", 1), []],
      [finished(0, 0, 10), []],
      [started(1, 0, 10), []],
      [finished(1, 0, 30), [{ _tag: "StartStep", step: 0, core: 1, cells: [1] }]],
      [started(2, 1, 30), []],
      [{ _tag: "MicroStepDone", step: 0, trained_tokens: 200, at: 50 }, []],
      // Batch 2 does not exist (2 steps): nothing more to dispatch.
      [{ _tag: "StepDone", step: 0, at: 50 }, [{ _tag: "PublishWeights", version: 1 }]],
      [{ _tag: "WeightsPublished", version: 1, at: 53 }, []]
    ])
  })

  it("starts a step only when the training cell has arrived", () => {
    expectScript(asyncSplit(1), config(), [
      [joined(0), [{ _tag: "Dispatch", batch: 0 }]],
      [joined(1), [toTraining(1)]],
      [started(0, 0, 0), []],
      [started(1, 0, 0), []],
      [finished(0, 0, 0.2), []],
      [finished(1, 0, 0.5), []],
      [switched(1, "training", 1), [{ _tag: "StartStep", step: 0, core: 1, cells: [1] }]]
    ])
  })
})

describe("elastic", () => {
  // 2 cells x 2 slots; batches of 4.
  const c = config({ slots_per_cell: 2, executions_per_step: 4 })

  it("water-level trigger, core first, satellites join, idle cells return when work waits", () => {
    for (const policy of [elastic, elasticPublished]) {
      expectScript(policy, c, [
        [joined(0), [{ _tag: "Dispatch", batch: 0 }]],
        [joined(1), []],
        ...[0, 1, 2, 3].map((i) => [started(i, 0, 0), []] as const),
        // w = 3 > C_R - C_e = 2: nobody moves.
        [finished(0, 0, 5), []],
        // w = 2 <= 2: the core leaves first.
        [finished(1, 0, 6), [toTraining(0)]],
        // The core arrives and starts step 0 on the data so far (streaming).
        [switched(0, "training", 7), [{ _tag: "StartStep", step: 0, core: 0, cells: [0] }]],
        // w = 1 > C_R - C_e = 0: cell 1 stays.
        [finished(2, 0, 8), []],
        [{ _tag: "MicroStepDone", step: 0, trained_tokens: 300, at: 9 }, []],
        // w = 0 <= 0: cell 1 leaves too, then joins the running step.
        [finished(3, 0, 12), [toTraining(1)]],
        [switched(1, "training", 13), [{ _tag: "JoinStep", step: 0, cell: 1 }]],
        // Step 0 ends: publish; batch 1 waits for version 1 (on-policy).
        [{ _tag: "StepDone", step: 0, at: 20 }, [{ _tag: "PublishWeights", version: 1 }]],
        // Batch 1 is dispatched; no step runs and 4 executions wait: both cells return, core last.
        [{ _tag: "WeightsPublished", version: 1, at: 23 }, [{ _tag: "Dispatch", batch: 1 }, toRollout(1), toRollout(0)]]
      ])
    }
  })

  // One version of staleness, batches of 2: step 1 streams while batch 2 waits for slots.
  const stale = config({ slots_per_cell: 2, executions_per_step: 2, steps: 3, max_staleness: 1 })
  const streaming: ReadonlyArray<readonly [PolicyEvent, ReadonlyArray<PolicyAction>]> = [
    [joined(0), [{ _tag: "Dispatch", batch: 0 }, { _tag: "Dispatch", batch: 1 }]],
    [joined(1), []],
    [started(0, 0, 0), []],
    [started(1, 0, 0), []],
    [started(2, 1, 0), []],
    [started(3, 1, 0), []],
    [finished(0, 0, 5), []],
    [finished(1, 0, 6), [toTraining(0)]],
    [switched(0, "training", 7), [{ _tag: "StartStep", step: 0, core: 0, cells: [0] }]],
    [{ _tag: "MicroStepDone", step: 0, trained_tokens: 200, at: 27 }, []],
    // Step 1 has no finished data yet: it does not start.
    [{ _tag: "StepDone", step: 0, at: 27 }, [{ _tag: "PublishWeights", version: 1 }]],
    [finished(2, 1, 28), [{ _tag: "StartStep", step: 1, core: 0, cells: [0] }]],
    // Batch 2 is dispatched: w = 3 > 2 slots, but step 1's data is not consumed yet.
    [{ _tag: "WeightsPublished", version: 1, at: 30 }, [{ _tag: "Dispatch", batch: 2 }]]
  ]
  const consumed: PolicyEvent = { _tag: "MicroStepDone", step: 1, trained_tokens: 100, at: 38 }

  it("published: the core stays in its running step while it waits for data", () => {
    expectScript(elasticPublished, stale, [...streaming, [consumed, []]])
  })

  it("gyre: the core steps out of a running step that has nothing to train, and rejoins it first", () => {
    expectScript(elastic, stale, [
      ...streaming,
      [consumed, [toRollout(0)]],
      [switched(0, "rollout", 40), []],
      [started(4, 2, 40), []],
      // w = 2 <= (2 - 1) x 2: the core leaves again and rejoins step 1.
      [finished(3, 1, 45), [toTraining(0)]],
      [switched(0, "training", 46), [{ _tag: "JoinStep", step: 1, cell: 0 }]]
    ])
  })

  it("a lost rollout cell lowers C_R(t): the next cell no longer leaves", () => {
    const start: ReadonlyArray<readonly [PolicyEvent, ReadonlyArray<PolicyAction>]> = [
      [joined(0), [{ _tag: "Dispatch", batch: 0 }]],
      [joined(1), []],
      // w = 4 <= (3 - 1) x 2: the core leaves at once.
      [joined(2), [toTraining(0)]],
      ...[0, 1, 2, 3].map((i) => [started(i, 0, 0), []] as const),
      [finished(0, 0, 5), []]
    ]
    // With cells 1 and 2 serving, w = 2 <= (2 - 1) x 2: cell 1 leaves.
    expectScript(elasticPublished, c, [...start, [finished(1, 0, 6), [toTraining(1)]]])
    // With cell 2 lost, w = 2 > (1 - 1) x 2: cell 1 stays.
    expectScript(elasticPublished, c, [...start, [{ _tag: "CellLost", cell: 2, at: 5.5 }, []], [finished(1, 0, 6), []]])
  })
})
