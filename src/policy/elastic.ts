/**
 * `elastic`: cells move from rollout to training one at a time, the core (first cell in join
 * order) first, while the water level allows it; satellites join the running step (streaming
 * training: the step trains finished executions while its batch's tail still runs); cells
 * return to rollout, last in first out, when the step's data is consumed and work waits.
 *
 * Rules, after every event:
 * 1. on `StepDone`: publish the new version;
 * 2. dispatch every batch the staleness bound allows;
 * 3. while w(t) = d(t) - f(t) <= C_R(t) - C_e (the outstanding executions fit in the slots
 *    that remain once one more cell has left), move the first rollout cell to training,
 *    re-checking after each move;
 * 4. no step running, some of the next step's batch finished and the core ready: start it
 *    (streaming: it trains what has finished while the rest still runs); every other ready
 *    training cell joins it;
 * 5. data consumed (every finished execution of the step trained, or no step running) and work
 *    waits (outstanding executions exceed the slots of the cells serving rollouts or on their
 *    way back): return the last-moved cells, as many as the excess needs, the core last.
 *
 * Two variants differ in one rule, the core's:
 * - `elastic-published`: the core runs its step until the step ends; it rolls out again only
 *   between steps (after a step, while the next one has no finished data).
 * - `elastic` (Gyre's): the core may also step out of a running step that has nothing to train
 *   when work waits (its accumulated gradients stay with it) and rejoins the step first. An
 *   idle core is a cell of rollout capacity lost; the simulator shows the gain (ARCHITECTURE.md).
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
import type { PolicyEvent } from "./vocabulary.ts"

export const ElasticVariant = Schema.Literals(["published", "gyre"])
export type ElasticVariant = typeof ElasticVariant.Type

export const ElasticState = Schema.Struct({ ledger: Ledger, variant: ElasticVariant })
export type ElasticState = typeof ElasticState.Type

/** The published water-level condition w(t) <= C_R(t) - C_e. */
export const waterLevel = (l: Ledger): boolean => l.dispatched - l.finished <= (l.serving - 1) * l.config.slots_per_cell

const dataConsumed = (l: Ledger): boolean => !l.stepRunning || l.trainedTokens >= (batchOf(l, l.stepsDone)?.tokens ?? 0)

const rules = (variant: ElasticVariant) => (d: Decision, event: PolicyEvent) => {
  publishOnStepDone(d, event)
  if (d.ledger.stepsDone >= d.ledger.config.steps) return
  dispatchAllowed(d)
  while (d.ledger.serving > 0 && waterLevel(d.ledger)) {
    const next = d.ledger.cells.find((c) => c.role === "rollout" && !c.switching)!
    d.act({ _tag: "SwitchRole", cell: next.cell, role: "training" })
  }
  const core = d.ledger.cells[0]
  const data = batchOf(d.ledger, d.ledger.stepsDone)?.finished ?? 0
  if (!d.ledger.stepRunning && data > 0 && core?.role === "training" && !core.switching) startStep(d)
  joinRunningStep(d)
  const l = d.ledger
  if (!dataConsumed(l)) return
  let excess = l.dispatched - l.finished - l.rolloutBound * l.config.slots_per_cell
  for (let i = l.cells.length - 1; i >= 0 && excess > 0; i--) {
    const c = l.cells[i]!
    if (c.role !== "training" || c.switching) continue
    if (c.cell === l.stepCore && (variant === "published" || d.ledger.rolloutBound < l.cells.length - 1)) break
    d.act({ _tag: "SwitchRole", cell: c.cell, role: "rollout" })
    excess -= l.config.slots_per_cell
  }
}

/** The elastic policy, variant `variant`, under the name `name`. */
export const elasticWith = (name: string, variant: ElasticVariant): Policy<ElasticState> => {
  const run = rules(variant)
  return {
    name,
    summary:
      variant === "published"
        ? "water-level trigger, streaming training with joining cells; the core stays in its step (published design)"
        : "water-level trigger, streaming training with joining cells; the core rolls out while its step has nothing to train",
    State: ElasticState,
    initial: (config) => ({ ledger: emptyLedger(config), variant }),
    step: (state, event) => {
      const d = decide(state.ledger, event, run)
      return { state: { ledger: d.ledger, variant }, actions: d.actions }
    }
  }
}
