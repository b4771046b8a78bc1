/**
 * `elastic`: cells move from rollout to training one at a time, the core (first cell in join
 * order) first, while a trigger allows it; satellites join the running step (streaming
 * training: the step trains finished executions while its batch's tail still runs); cells
 * return to rollout, last in first out, when the step's data is consumed and work waits.
 *
 * Rules, after every event:
 * 1. on `StepDone`: publish the new version;
 * 2. dispatch every batch the staleness bound allows;
 * 3. while the trigger allows, move the first rollout cell (join order) to training;
 * 4. no step running, the next one's batch dispatched and the core ready: start it (streaming);
 *    every other ready training cell joins it;
 * 5. work waits (outstanding executions exceed the rollout slots, counting cells already on
 *    their way back): return the last-moved cells, as many as the excess needs, keeping the
 *    training cells the trigger asks for (published: all until the step's finished data is
 *    consumed). The core goes last, keeping its step's gradients, and rejoins it first.
 * The trigger is a `Trigger` (see `trigger.ts`): `elastic` uses `tail`, `elastic-published`
 * the published water level.
 */
import { Schema } from "effect"
import {
  Ledger,
  batchOf,
  decide,
  dispatchAllowed,
  emptyLedger,
  joinRunningStep,
  publishOnStepDone,
  startStep,
  type Decision
} from "./ledger.ts"
import type { Policy } from "./policy.ts"
import {
  TailStats,
  TrainingEstimate,
  TriggerName,
  advanceEstimate,
  advanceStats,
  noEstimate,
  noStats,
  triggers,
  type Trigger,
  type TriggerInput
} from "./trigger.ts"
import type { PolicyEvent } from "./vocabulary.ts"

export const ElasticState = Schema.Struct({
  ledger: Ledger,
  trigger: TriggerName,
  trained: TrainingEstimate,
  stats: TailStats
})
export type ElasticState = typeof ElasticState.Type

const dataConsumed = (l: Ledger): boolean => !l.stepRunning || l.trainedTokens >= (batchOf(l, l.stepsDone)?.tokens ?? 0)

const rules = (trigger: Trigger, trained: TrainingEstimate, stats: TailStats) => (d: Decision, event: PolicyEvent) => {
  const input = (): TriggerInput => ({ ledger: d.ledger, trained, stats, consumed: dataConsumed(d.ledger) })
  publishOnStepDone(d, event)
  if (d.ledger.stepsDone >= d.ledger.config.steps) return
  dispatchAllowed(d)
  while (d.ledger.serving > 0 && trigger.leave(input())) {
    const next = d.ledger.cells.find((c) => c.role === "rollout" && !c.switching)!
    d.act({ _tag: "SwitchRole", cell: next.cell, role: "training" })
  }
  const core = d.ledger.cells[0]
  if (!d.ledger.stepRunning && d.ledger.nextBatch > d.ledger.stepsDone && core?.role === "training" && !core.switching) {
    startStep(d)
  }
  joinRunningStep(d)
  const l = d.ledger
  // Work waits: outstanding executions exceed the slots of cells serving or on their way.
  let excess = l.dispatched - l.finished - l.rolloutBound * l.config.slots_per_cell
  if (excess <= 0) return
  let spare = l.cells.length - l.rolloutBound - trigger.keep(input())
  for (let i = l.cells.length - 1; i >= 0 && excess > 0 && spare > 0; i--) {
    const c = l.cells[i]!
    if (c.role !== "training" || c.switching) continue
    if (c.cell === l.stepCore && d.ledger.rolloutBound < l.cells.length - 1) break
    d.act({ _tag: "SwitchRole", cell: c.cell, role: "rollout" })
    excess -= l.config.slots_per_cell
    spare--
  }
}

/** The elastic policy with trigger `trigger`, under the name `name`. */
export const elasticWith = (name: string, trigger: TriggerName): Policy<ElasticState> => {
  const t = triggers[trigger]
  return {
    name,
    summary: t.summary,
    State: ElasticState,
    initial: (config) => ({ ledger: emptyLedger(config), trigger, trained: noEstimate, stats: noStats }),
    step: (state, event) => {
      const trained = advanceEstimate(state.trained, state.ledger, event)
      const stats = advanceStats(state.stats, event)
      const d = decide(state.ledger, event, rules(t, trained, stats))
      return { state: { ledger: d.ledger, trigger, trained, stats }, actions: d.actions }
    }
  }
}
