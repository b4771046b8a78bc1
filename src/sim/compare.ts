/**
 * Runs several policies on one scenario, as `gyre sim` and `bench:sim` do: `async` is swept
 * over every split (1 .. cells-1 rollout cells) and reported at its best one; every result
 * carries the scenario's lower bound.
 */
import { asyncSplit, fixedPolicies } from "../policy/index.ts"
import { lowerBound, type LowerBound } from "./bound.ts"
import { executionsOf, type Scenario } from "./scenario.ts"
import { simulate, type RunResult, type SimOptions } from "./simulate.ts"

/** Every policy name `gyre sim --policy` accepts besides `all`, in report order. */
export const policyNames = ["colocate", "async", "elastic", "elastic-published"] as const
export type PolicyName = (typeof policyNames)[number]

export interface AsyncSweep {
  readonly rollout_cells: number
  readonly training_cells: number
  /** Makespan of every split tried, by rollout cells. */
  readonly sweep: ReadonlyArray<{ readonly rollout_cells: number; readonly makespan_s: number }>
}

export interface PolicyReport {
  readonly run: RunResult
  readonly async?: AsyncSweep
}

export interface Comparison {
  readonly scenario: Scenario
  readonly bound: LowerBound
  readonly reports: ReadonlyArray<PolicyReport>
}

export class NotApplicable extends Error {
  readonly _tag = "NotApplicable"
}

const sweepAsync = (scenario: Scenario, executions: ReturnType<typeof executionsOf>, options: SimOptions): PolicyReport => {
  if (scenario.cells < 2) throw new NotApplicable("async needs at least 2 cells (one to roll out, one to train)")
  const sweep: Array<{ rollout_cells: number; makespan_s: number }> = []
  let best = 1
  for (let r = 1; r < scenario.cells; r++) {
    const makespan_s = simulate(scenario, executions, asyncSplit(r)).makespan_s
    sweep.push({ rollout_cells: r, makespan_s })
    if (makespan_s < sweep[best - 1]!.makespan_s) best = r
  }
  // Run the best split again with whatever the caller records.
  const run = simulate(scenario, executions, asyncSplit(best), options)
  return { run, async: { rollout_cells: best, training_cells: scenario.cells - best, sweep } }
}

/** Simulates `names` on `scenario` (async at its best split). */
export const compare = (scenario: Scenario, names: ReadonlyArray<PolicyName>, options: SimOptions = {}): Comparison => {
  const executions = executionsOf(scenario)
  const reports = names.map((name) =>
    name === "async" ? sweepAsync(scenario, executions, options) : { run: simulate(scenario, executions, fixedPolicies[name]!, options) }
  )
  return { scenario, bound: lowerBound(scenario, executions), reports }
}
