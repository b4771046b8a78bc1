/**
 * `async`: a fixed split. The first `rolloutCells` cells (in join order) roll out, the others
 * train; rollouts run ahead of training by up to `max_staleness` versions.
 *
 * Rules, after every event:
 * 1. on `StepDone`: publish the new version;
 * 2. a cell past the first `rolloutCells` that serves rollouts switches to training (once, when
 *    it joins; again only if cells are lost and the split shifts);
 * 3. dispatch every batch the staleness bound allows;
 * 4. step k (k = steps done) starts on every ready training cell once batch k is complete;
 *    training cells that arrive later join it.
 */
import { Schema } from "effect"
import {
  Ledger,
  batchComplete,
  decide,
  dispatchAllowed,
  emptyLedger,
  joinRunningStep,
  publishOnStepDone,
  startStep,
  touchesCells
} from "./ledger.ts"
import type { Policy } from "./policy.ts"

export const AsyncState = Schema.Struct({
  ledger: Ledger,
  /** How many cells roll out; the rest train. */
  rolloutCells: Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))
})
export type AsyncState = typeof AsyncState.Type

/** The async policy with `rolloutCells` rollout cells. */
export const asyncSplit = (rolloutCells: number): Policy<AsyncState> => ({
  name: "async",
  summary: `fixed split: ${rolloutCells} rollout cells, the rest train, up to max_staleness versions behind`,
  State: AsyncState,
  initial: (config) => ({ ledger: emptyLedger(config), rolloutCells }),
  step: (state, event) => {
    const d = decide(state.ledger, event, (d, event) => {
      publishOnStepDone(d, event)
      if (touchesCells(event)) {
        d.ledger.cells.forEach((c, i) => {
          const role = i < state.rolloutCells ? "rollout" : "training"
          if (c.role !== role && !c.switching) d.act({ _tag: "SwitchRole", cell: c.cell, role })
        })
      }
      dispatchAllowed(d)
      const k = d.ledger.stepsDone
      if (k < d.ledger.config.steps && !d.ledger.stepRunning && batchComplete(d.ledger, k)) startStep(d)
      joinRunningStep(d)
    })
    return { state: { ledger: d.ledger, rolloutCells: state.rolloutCells }, actions: d.actions }
  }
})
