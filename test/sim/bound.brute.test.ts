/**
 * The lower bound against brute force: on small random scenarios, every schedule an explorer
 * policy can reach with up to cells + 1 role switches, each made at any event, for any subset
 * of the cells, ends at or after `lower_bound_s` (on most such scenarios the best of them meets
 * the bound), and on a scenario where the bound is tight by hand the search meets it.
 *
 * The explorer dispatches every batch the staleness bound allows, publishes every version at
 * once, starts a step on every idle training cell and lets every idle training cell join it;
 * the search decides only which cells switch role at which event (the choice that separates
 * one policy from another). A run is named by its choices, one per event that had a switchable
 * cell (0: none; else a bit per switchable cell); the search tries every name with at most
 * `budget` switches, running each from the start (a run past its name's end chooses 0).
 */
import fc from "fast-check"
import { describe, expect, it } from "vitest"
import {
  Ledger,
  decide,
  dispatchAllowed,
  emptyLedger,
  joinRunningStep,
  publishOnStepDone,
  startStep
} from "../../src/policy/ledger.ts"
import type { Policy } from "../../src/policy/policy.ts"
import { lowerBound } from "../../src/sim/bound.ts"
import { executionsOf, parseScenario, type Scenario } from "../../src/sim/scenario.ts"
import { PolicyViolation, simulate } from "../../src/sim/simulate.ts"

/** A policy that switches the cells `choices` name; `options` records each choice's width. */
const explorer = (choices: ReadonlyArray<number>, options: Array<number>): Policy<Ledger> => ({
  name: "explorer",
  summary: "brute force over role switches",
  State: Ledger,
  initial: emptyLedger,
  step: (ledger, event) => {
    const d = decide(ledger, event, (d, event) => {
      publishOnStepDone(d, event)
      if (d.ledger.stepsDone >= d.ledger.config.steps) return
      dispatchAllowed(d)
      const l = d.ledger
      // Satellites before the core: the core may leave its step only once it is alone in it.
      const free = l.cells.filter((c) => !c.switching).sort((a, b) => Number(a.cell === l.stepCore) - Number(b.cell === l.stepCore))
      if (free.length > 0) {
        const choice = choices[options.length] ?? 0
        options.push(1 << free.length)
        free.forEach((c, bit) => {
          if (!(choice & (1 << bit))) return
          const inStep = d.ledger.cells.filter((x) => x.inStep).length
          if (c.cell === d.ledger.stepCore && c.inStep && inStep > 1) return
          d.act({ _tag: "SwitchRole", cell: c.cell, role: c.role === "rollout" ? "training" : "rollout" })
        })
      }
      if (!d.ledger.stepRunning && d.ledger.stepsDone < d.ledger.nextBatch) startStep(d)
      joinRunningStep(d)
    })
    return { state: d.ledger, actions: d.actions }
  }
})

const bits = (x: number) => x.toString(2).replaceAll("0", "").length

/** The shortest makespan over every run with at most `budget` switches, and how many ran. */
const search = (s: Scenario, budget: number) => {
  const e = executionsOf(s)
  let best = Infinity
  let runs = 0
  const visit = (choices: Array<number>, used: number) => {
    const options: Array<number> = []
    runs++
    try {
      best = Math.min(best, simulate(s, e, explorer(choices, options)).makespan_s)
    } catch (error) {
      if (!(error instanceof PolicyViolation)) throw error // stalled: nothing trains any more
    }
    for (let j = choices.length; j < options.length; j++) {
      for (let o = 1; o < options[j]!; o++) {
        if (used + bits(o) > budget) continue
        visit([...choices, ...Array<number>(j - choices.length).fill(0), o], used + bits(o))
      }
    }
  }
  visit([], 0)
  return { best, runs }
}

const scenario = fc.record({
  cells: fc.integer({ min: 1, max: 2 }),
  slots_per_cell: fc.integer({ min: 1, max: 2 }),
  train_tokens_per_s_per_cell: fc.integer({ min: 1, max: 50 }),
  switch_to_train_s: fc.double({ min: 0, max: 3, noNaN: true }),
  switch_to_rollout_s: fc.double({ min: 0, max: 3, noNaN: true }),
  weight_sync_s: fc.double({ min: 0, max: 3, noNaN: true }),
  step_update_s: fc.oneof(fc.constant(0), fc.double({ min: 0, max: 3, noNaN: true })),
  steps: fc.integer({ min: 1, max: 2 }),
  executions_per_step: fc.integer({ min: 1, max: 3 }),
  max_staleness: fc.integer({ min: 0, max: 1 }),
  executions: fc.array(
    fc.record({ duration_s: fc.double({ min: 0.5, max: 20, noNaN: true }), tokens: fc.integer({ min: 0, max: 200 }) }),
    { minLength: 1, maxLength: 6 }
  )
})

describe("lower bound against brute force", () => {
  it("no reachable schedule beats lower_bound_s on small random scenarios", () => {
    fc.assert(
      fc.property(scenario, (raw) => {
        const s = parseScenario(raw)
        const bound = lowerBound(s, executionsOf(s)).lower_bound_s
        const { best, runs } = search(s, s.cells + 1)
        expect(runs).toBeGreaterThan(1)
        if (Number.isFinite(best)) expect(best).toBeGreaterThanOrEqual(bound * (1 - 1e-9))
      }),
      { numRuns: 40 }
    )
  }, 180_000)

  it("finds a schedule that meets the bound where it is tight", () => {
    // One cell, one slot, free switches: e0 0-10, switch, train 100 tokens 10-20, switch back,
    // version 1 at 20, e1 20-30, switch, train 30-40. The bound: T1 = 30 + 100/10 = 40.
    const s = parseScenario({
      cells: 1,
      slots_per_cell: 1,
      train_tokens_per_s_per_cell: 10,
      switch_to_train_s: 0,
      switch_to_rollout_s: 0,
      weight_sync_s: 0,
      steps: 2,
      executions_per_step: 1,
      max_staleness: 0,
      executions: [{ duration_s: 10, tokens: 100 }]
    })
    expect(lowerBound(s, executionsOf(s)).lower_bound_s).toBe(40)
    expect(search(s, 4).best).toBeCloseTo(40, 9)
  })
})
