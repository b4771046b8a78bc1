/**
 * Scripted tiny scenarios whose makespans are computed by hand (the timelines are written out
 * beside each expectation), for every policy, plus the lower bound's two parts.
 */
import { describe, expect, it } from "vitest"
import { asyncSplit, colocate, elastic, elasticPublished } from "../../src/policy/index.ts"
import { lowerBound } from "../../src/sim/bound.ts"
import { executionsOf, parseScenario, type Scenario } from "../../src/sim/scenario.ts"
import { simulate } from "../../src/sim/simulate.ts"
import type { Policy } from "../../src/policy/policy.ts"
import { tinyScenario } from "./fixtures.ts"

/** The shared tiny scenario (see `fixtures.ts`) with `max_staleness` versions of staleness. */
const tiny = (max_staleness: number): Scenario => parseScenario({ ...tinyScenario, max_staleness })

const makespan = (s: Scenario, p: Policy<any>) => simulate(s, executionsOf(s), p).makespan_s

describe("tiny scenarios, by hand", () => {
  it("colocate: roll out, switch, train on both cells, switch back, wait for the weights", () => {
    // e0 0-10, e1 0-20 | switch 20-21 | train 200 tokens at 20/s 21-31 | switch back 31-33,
    // version 1 arrives 34 | e2 34-44, e3 34-54 | switch 54-55 | train 55-65.
    expect(makespan(tiny(0), colocate)).toBeCloseTo(65, 9)
    // Lock step ignores the staleness bound.
    expect(makespan(tiny(1), colocate)).toBeCloseTo(65, 9)
  })

  it("colocate with one micro-batch a step: the second cell has nothing to claim, training takes one cell's time", () => {
    // As above, but each step's 200 tokens are one micro-batch: train at 10/s 21-41 | switch back
    // 41-43, version 1 arrives 44 | e2 44-54, e3 44-64 | switch 64-65 | train 65-85.
    expect(makespan(parseScenario({ ...tinyScenario, max_staleness: 0, micro_batch_tokens: 200 }), colocate)).toBeCloseTo(85, 9)
    // Two micro-batches of 100 tokens: both cells train, as without the field.
    expect(makespan(parseScenario({ ...tinyScenario, max_staleness: 0, micro_batch_tokens: 100 }), colocate)).toBeCloseTo(65, 9)
  })

  it("async 1+1, on-policy: one slot rolls out, one cell trains", () => {
    // cell 1 switches 0-1 | e0 0-10, e1 10-30 | step 0 30-50 (200 tokens at 10/s) | version 1
    // at 53 | e2 53-63, e3 63-83 | step 1 83-103.
    const r = simulate(tiny(0), executionsOf(tiny(0)), asyncSplit(1))
    expect(r.makespan_s).toBeCloseTo(103, 9)
    expect(r.switches).toBe(1)
    expect(r.mean_staleness).toBe(0)
  })

  it("async 1+1, one version stale: batch 1 rolls out while step 0 trains", () => {
    // e0 0-10, e1 10-30, e2 30-40, e3 40-60 (version 0, one behind) | step 0 30-50 | step 1 60-80.
    const r = simulate(tiny(1), executionsOf(tiny(1)), asyncSplit(1))
    expect(r.makespan_s).toBeCloseTo(80, 9)
    expect(r.mean_staleness).toBeCloseTo(0.5, 9)
  })

  for (const policy of [elastic, elasticPublished]) {
    it(`${policy.name}: cells move to training as the water level falls, core first`, () => {
      // e0 0-10, e1 0-20. At 10 w = 1 <= C_R - C_e = 1: the core leaves (10-11) and starts
      // step 0 on e0's 100 tokens (11-21). At 20 w = 0: cell 1 leaves (20-21) and joins; at 21
      // 100 tokens are left for 2 cells: step 0 ends at 26. Version 1 arrives at 29: batch 1
      // is dispatched, no step runs and work waits: cell 1, then the core, return (29-31).
      // e2 31-41, e3 31-51; the core leaves at 41 (41-42) and starts step 1 on e2's tokens
      // (42-52); cell 1 leaves at 51 (51-52) and joins; 100 tokens left for 2 cells: 52-57.
      const r = simulate(tiny(0), executionsOf(tiny(0)), policy)
      expect(r.makespan_s).toBeCloseTo(57, 9)
      expect(r.switches).toBe(6)
      expect(r.utilization).toBeCloseTo((60 / 1 + 400 / 10) / (2 * 57), 9)
    })
  }

  it("a step's update: the step ends step_update_s after its batch is trained; a core back to rollout waits for it", () => {
    const withUpdate = (max_staleness: number, steps: number) => parseScenario({ ...tinyScenario, max_staleness, steps, step_update_s: 4 })
    // async 1+1 as above, each step 4 s longer: step 0 30-50, update 50-54, version 1 at 57 |
    // e2 57-67, e3 67-87 | step 1 87-107, update 107-111.
    const s0 = withUpdate(0, 2)
    expect(makespan(s0, asyncSplit(1))).toBeCloseTo(111, 9)
    // Lower bound: T0 = 25 + 4, version 1 at 32, e2 32-42, e3 32-52, T1 = max(39, 57, 52) + 4 = 61;
    // work at tau = 42: 42 + (10 s of e3 left + 200 tokens at 10/s) / 2 = 57.
    expect(lowerBound(s0, executionsOf(s0))).toEqual({ lower_bound_s: 61, work_s: 57, critical_path_s: 61 })
    // elastic, one version stale, 3 steps: the core trains step 0 21-41, cell 1 joins at 41 with
    // nothing left; update 41-45. Step 1 (batch 1 all in) on both cells 45-55: drained, batch 2
    // waits for slots, so both cells return at 55: cell 1 serves at 57, the core at 59 (its
    // switch ends at 57, its update at 59); step 1 ends at 59. e4 57-67, e5 59-79; the core
    // leaves at 67 (67-68) and trains e4's tokens 68-78; cell 1 leaves at 79 (79-80): 90
    // tokens left at 20/s, 80-84.5; update 84.5-88.5.
    const s1 = withUpdate(1, 3)
    const r = simulate(s1, executionsOf(s1), elastic, { timeline: true })
    expect(r.makespan_s).toBeCloseTo(88.5, 9)
    expect(r.timeline!.stepsDoneAt).toEqual([45, 59, 88.5])
    expect(r.timeline!.cells[0]).toEqual([0, 1, 20, 3, 21, 2, 55, 4, 59, 1, 67, 3, 68, 2])
    expect(r.timeline!.cells[1]).toEqual([0, 1, 40, 3, 41, 2, 55, 4, 57, 1, 79, 3, 80, 2])
  })

  it("lower bound: work and critical path by hand", () => {
    // Earliest schedule on M = 2 slots, R = 20 tokens/s: e0 0-10, e1 0-20; step 0 ends no
    // earlier than T0 = max(200/20, 20 + 100/20, 10 + 200/20) = 25; version 1 arrives 28, so
    // e2 28-38, e3 28-48 and T1 = max(25 + 10, 48 + 5, 38 + 10) = 53: the critical path.
    // Work at tau = 38 (e2's tokens trainable from 38): 10 s of e3 left on one slot + 200 tokens
    // at 10/s over 2 cells = 15, so 53; at tau = 10 it is 10 + (40 + 40) / 2 = 50.
    const s = tiny(0)
    expect(lowerBound(s, executionsOf(s))).toEqual({ lower_bound_s: 53, work_s: 53, critical_path_s: 53 })
    // With one version of staleness batch 1 needs no version: e2 10-20, e3 20-40, T1 =
    // max(35, 40 + 5, 20 + 10) = 45; work at tau = 10: 10 + (40 s of rollout left + 40) / 2 = 50.
    const s1 = tiny(1)
    expect(lowerBound(s1, executionsOf(s1))).toEqual({ lower_bound_s: 50, work_s: 50, critical_path_s: 45 })
  })
})
