/**
 * `gyre replay --what-if POLICY`: the run's recorded execution durations and token counts, its
 * measured training rate, switch costs, step updates and weight-sync times (all from the journal's audit) as a
 * simulator scenario (`runScenario`, which `bench:elastic` uses too), run through `src/sim` under
 * another policy or cell count; the makespan it would have had beside the real one and beside
 * the simulator's own figure for the policy the run used (how far to trust the counterfactual),
 * and the makespan no policy can beat on those cells (`src/sim/bound.ts`: how much any policy
 * could still win). The scenario itself comes back too (`gyre replay --scenario-out` writes it,
 * with notes naming the run, for `gyre sim --scenario` to run every policy on and draw).
 */
import { Effect } from "effect"
import { asyncSplit, fixedPolicies, type Policy } from "../policy/index.ts"
import type { RunConfig } from "../protocols/run.ts"
import type { TransportError } from "../runtime/errors.ts"
import type { JournalSource } from "../runtime/journal.ts"
import { lowerBound } from "../sim/bound.ts"
import { executionsOf, parseScenario, type Scenario } from "../sim/scenario.ts"
import { simulate } from "../sim/simulate.ts"
import { auditRun, type RunAudit } from "../scheduling/audit.ts"

const mean = (xs: ReadonlyArray<number>) => (xs.length === 0 ? 0 : xs.reduce((a, b) => a + b, 0) / xs.length)

/** The simulator's view of a live run: its measured executions and costs, on `cells` cells. */
export const runScenario = (audit: RunAudit, config: Pick<RunConfig, "policyConfig">, cells: number): Scenario => {
  const trainedTokens = audit.executions.reduce((a, e) => a + e.tokens, 0)
  // A step's cells beyond its micro-batches had nothing to claim: they do not count as training.
  const cellSeconds = audit.steps.reduce((a, s) => a + (s.computeMs / 1000) * Math.max(1, Math.min(s.devices.length, s.microBatches)), 0)
  const microBatches = audit.steps.reduce((a, s) => a + s.microBatches, 0)
  const p = config.policyConfig
  return parseScenario(
    {
      cells,
      slots_per_cell: p.slots_per_cell,
      train_tokens_per_s_per_cell: Math.max(1, trainedTokens / Math.max(1e-3, cellSeconds)),
      switch_to_train_s: mean(audit.switchMs.training) / 1000,
      // A running step's core serves again once its update is done, which the simulator models
      // itself (step_update_s): its switches count only when no other cell's are there.
      switch_to_rollout_s: mean(audit.switchMs.rollout.length > 0 ? audit.switchMs.rollout : audit.switchMs.rolloutCore) / 1000,
      weight_sync_s: mean(audit.weightSyncS),
      step_update_s: mean(audit.steps.map((s) => s.reduceMs + s.publishMs)) / 1000,
      ...(microBatches === 0 ? {} : { micro_batch_tokens: Math.max(1, trainedTokens / microBatches) }),
      steps: Math.max(1, audit.stepsDone),
      executions_per_step: p.executions_per_step,
      max_staleness: p.max_staleness,
      executions: audit.executions.map((e) => ({ duration_s: Math.max(1e-3, e.duration_s), tokens: e.tokens }))
    },
    "live run"
  )
}

/** `elastic`, `elastic-published`, `colocate`, `async` (its best split) or `async:R` (R rollout cells). */
export const whatIfPolicies = ["async", "async:R", ...Object.keys(fixedPolicies)]

const simulated = (scenario: Scenario, name: string): { readonly policy: string; readonly makespanS: number } | string => {
  const executions = executionsOf(scenario)
  const run = (p: Policy<any>) => simulate(scenario, executions, p).makespan_s
  const split = /^async(?::(\d+))?$/.exec(name)
  if (split !== null) {
    if (scenario.cells < 2) return "async needs at least 2 cells"
    const splits = split[1] !== undefined ? [Number(split[1])] : Array.from({ length: scenario.cells - 1 }, (_, i) => i + 1)
    if (splits.some((r) => r < 1 || r >= scenario.cells)) return `async:${split[1]} needs 1 .. ${scenario.cells - 1} rollout cells`
    const best = splits.map((r) => ({ policy: `async:${r}`, makespanS: run(asyncSplit(r)) })).sort((a, b) => a.makespanS - b.makespanS)[0]!
    return best
  }
  const policy = fixedPolicies[name]
  return policy === undefined ? `unknown policy '${name}' (known: ${whatIfPolicies.join(", ")})` : { policy: name, makespanS: run(policy) }
}

export interface WhatIf {
  readonly run: string
  readonly policy: string
  readonly cells: number
  /** The run's makespan on the policy clock (its start to its last `StepDone`). */
  readonly realS: number
  /** The simulator under the run's own policy and cells, fed the same figures. */
  readonly simulatedS: number
  readonly whatIf: { readonly policy: string; readonly cells: number; readonly makespanS: number; readonly lowerBoundS: number }
  readonly executions: number
  /** The costs measured from the run that the simulator was fed (the scenario's fields). */
  readonly costs: Pick<
    Scenario,
    "train_tokens_per_s_per_cell" | "switch_to_train_s" | "switch_to_rollout_s" | "step_update_s" | "weight_sync_s"
  >
  /** What the what-if simulated: the run's executions and costs on the what-if's cells, as a scenario file holds them. */
  readonly scenario: Scenario
}

/** A counterfactual of `log`'s run under `policy` on `cells` cells (default: the run's). */
export const whatIf = (log: JournalSource, config: RunConfig, policy: string, cells?: number): Effect.Effect<WhatIf | string, TransportError> =>
  Effect.gen(function* () {
    const audit = yield* auditRun(log, config.policyConfig.executions_per_step)
    if (audit.executions.length === 0) return "the run has no finished executions to replay"
    const realCells = Math.max(1, audit.cells.length)
    const own = simulated(runScenario(audit, config, realCells), config.policy === "async" ? `async:${config.rolloutCells ?? 1}` : config.policy)
    const scenario = runScenario(audit, config, cells ?? realCells)
    const other = simulated(scenario, policy)
    if (typeof own === "string") return own
    if (typeof other === "string") return other
    return {
      run: log.run,
      policy: config.policy,
      cells: realCells,
      realS: audit.lastStepDoneS,
      simulatedS: own.makespanS,
      whatIf: { policy: other.policy, cells: scenario.cells, makespanS: other.makespanS, lowerBoundS: lowerBound(scenario, executionsOf(scenario)).lower_bound_s },
      executions: audit.executions.length,
      costs: {
        train_tokens_per_s_per_cell: scenario.train_tokens_per_s_per_cell,
        switch_to_train_s: scenario.switch_to_train_s,
        switch_to_rollout_s: scenario.switch_to_rollout_s,
        step_update_s: scenario.step_update_s ?? 0,
        weight_sync_s: scenario.weight_sync_s
      },
      scenario: {
        notes: [
          `measured from run ${log.run} (${config.policy} on ${realCells} cells, ${audit.executions.length} executions; real makespan ${audit.lastStepDoneS.toFixed(1)} s) by gyre replay --what-if`,
          "executions: each finished execution's duration and trained tokens, in dispatch order; costs: the run's mean switch, step-update and weight-sync times and its training rate"
        ],
        ...scenario
      }
    }
  })
