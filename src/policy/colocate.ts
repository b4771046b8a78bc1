/**
 * `colocate`: every cell rolls out batch k, then every cell trains step k, in lock step.
 *
 * Rules, in order, after every event:
 * 1. on `StepDone`: publish the new version;
 * 2. batch k (k = steps done) complete and no step running: switch every rollout cell to
 *    training; once none is switching, start step k on all of them;
 * 3. step k trained: switch every training cell back to rollout;
 * 4. all cells serving rollouts, version k published, batch k not dispatched: dispatch it.
 * The staleness bound is not used: lock step is on-policy by construction. A cell that joins
 * while a step trains waits in rollout for the next batch.
 */
import { Schema } from "effect"
import { Ledger, batchComplete, decide, emptyLedger, publishOnStepDone, startStep, type Decision } from "./ledger.ts"
import type { Policy } from "./policy.ts"
import type { PolicyEvent, CellRole } from "./vocabulary.ts"

export const ColocateState = Schema.Struct({ ledger: Ledger })
export type ColocateState = typeof ColocateState.Type

const switchAll = (d: Decision, from: CellRole, to: CellRole) => {
  const l = d.ledger
  if ((from === "rollout" ? l.serving : l.trainingReady) === 0) return
  for (const c of l.cells) if (c.role === from && !c.switching) d.act({ _tag: "SwitchRole", cell: c.cell, role: to })
}

const rules = (d: Decision, event: PolicyEvent) => {
  publishOnStepDone(d, event)
  const l = d.ledger
  const k = l.stepsDone
  if (k >= l.config.steps || l.stepRunning) return
  if (l.nextBatch > k && batchComplete(l, k)) {
    switchAll(d, "rollout", "training")
    if (d.ledger.trainingReady === l.cells.length) startStep(d)
  } else {
    switchAll(d, "training", "rollout")
    const ready = d.ledger.serving === l.cells.length && l.cells.length > 0
    if (ready && l.nextBatch === k && l.published >= k) d.act({ _tag: "Dispatch", batch: k })
  }
}

export const colocate: Policy<ColocateState> = {
  name: "colocate",
  summary: "all cells roll out a batch, then all cells train it, in lock step",
  State: ColocateState,
  initial: (config) => ({ ledger: emptyLedger(config) }),
  step: (state, event) => {
    const d = decide(state.ledger, event, rules)
    return { state: { ledger: d.ledger }, actions: d.actions }
  }
}
