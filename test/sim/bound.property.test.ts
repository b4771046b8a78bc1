/**
 * Property: on random scenarios no policy beats `lower_bound_s`, every policy trains every step
 * without an illegal action, and the accounting adds up (time per role = cells x makespan,
 * utilisation <= 1).
 */
import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { compare, policyNames } from "../../src/sim/compare.ts"
import { parseScenario } from "../../src/sim/scenario.ts"

const scenario = fc.record({
  cells: fc.integer({ min: 1, max: 5 }),
  slots_per_cell: fc.integer({ min: 1, max: 3 }),
  train_tokens_per_s_per_cell: fc.integer({ min: 1, max: 500 }),
  switch_to_train_s: fc.double({ min: 0, max: 5, noNaN: true }),
  switch_to_rollout_s: fc.double({ min: 0, max: 5, noNaN: true }),
  weight_sync_s: fc.double({ min: 0, max: 5, noNaN: true }),
  step_update_s: fc.oneof(fc.constant(0), fc.double({ min: 0, max: 5, noNaN: true })),
  steps: fc.integer({ min: 1, max: 4 }),
  executions_per_step: fc.integer({ min: 1, max: 6 }),
  max_staleness: fc.integer({ min: 0, max: 2 }),
  executions: fc.array(
    fc.record({ duration_s: fc.double({ min: 0.5, max: 100, noNaN: true }), tokens: fc.integer({ min: 0, max: 2000 }) }),
    { minLength: 1, maxLength: 8 }
  )
})

describe("lower bound", () => {
  it("no policy beats lower_bound_s on random scenarios", () => {
    fc.assert(
      fc.property(scenario, (raw) => {
        const s = parseScenario(raw)
        const names = s.cells < 2 ? policyNames.filter((n) => n !== "async") : policyNames
        const c = compare(s, names)
        for (const { run } of c.reports) {
          expect(run.steps).toBe(s.steps)
          expect(run.makespan_s).toBeGreaterThanOrEqual(c.bound.lower_bound_s * (1 - 1e-9))
          expect(run.utilization).toBeLessThanOrEqual(1 + 1e-9)
          const roles = run.time_per_role_s
          expect(roles.rollout + roles.training + roles.switching).toBeCloseTo(s.cells * run.makespan_s, 6)
        }
      }),
      { numRuns: 300 }
    )
  })
})
