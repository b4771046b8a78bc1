/**
 * Triggers of the elastic policy: when may the next rollout cell leave for training, and how
 * many training cells must stay while rollout work waits for a slot?
 *
 * - `published`: the water level of the published design. A cell leaves while
 *   w(t) = d(t) - f(t) <= C_R(t) - C_e (outstanding executions fit in the slots that remain);
 *   training cells go back only once the step's finished data is consumed.
 * - `tail`: the water level, plus a target number of training cells predicted from the
 *   durations seen so far. The running step's batch still has m executions to finish; the last
 *   one will end around (its last start) + (longest duration seen), so the step's untrained
 *   tokens plus m x (mean tokens seen) must be trained by then, which takes
 *   N* = tokens / (rate x time left) cells (time left at least one switch round trip, so a
 *   finished batch gets every cell it can use), and never so many that the batch's own
 *   unfinished executions lack slots. Below N* trainers a cell leaves even if its
 *   executions must wait for a slot; while work waits, trainers beyond N* go back (whether or
 *   not the data is consumed), and the first N* stay even while they wait for data. Rollouts that would delay the next batch's longest executions thus get
 *   slots, and training keeps just the pace the tail allows.
 *
 * Untrained data is estimated from the step's members, the training rate and the time since
 * the last report (`TrainingEstimate`); a `MicroStepDone` makes it exact.
 */
import { Schema } from "effect"
import { batchOf, type Ledger } from "./ledger.ts"
import type { PolicyEvent } from "./vocabulary.ts"

export const TriggerName = Schema.Literals(["published", "tail"])
export type TriggerName = typeof TriggerName.Type

/** Tokens of step `step` trained by time `at` (the latest event), as the policy estimates them. */
export const TrainingEstimate = Schema.Struct({
  step: Schema.Int,
  tokens: Schema.Number.check(Schema.isGreaterThanOrEqualTo(0)),
  at: Schema.Number
})
export type TrainingEstimate = typeof TrainingEstimate.Type

/** What finished executions have shown so far. */
export const TailStats = Schema.Struct({
  count: Schema.Int.check(Schema.isGreaterThanOrEqualTo(0)),
  tokens: Schema.Number.check(Schema.isGreaterThanOrEqualTo(0)),
  longest_s: Schema.Number.check(Schema.isGreaterThanOrEqualTo(0))
})
export type TailStats = typeof TailStats.Type

export const noEstimate: TrainingEstimate = { step: 0, tokens: 0, at: 0 }
export const noStats: TailStats = { count: 0, tokens: 0, longest_s: 0 }

/** Brings the estimate up to `event` (call with the ledger as it was before the event). */
export const advanceEstimate = (e: TrainingEstimate, l: Ledger, event: PolicyEvent): TrainingEstimate => {
  if (event._tag === "StepDone") return { step: event.step + 1, tokens: 0, at: event.at }
  if (event._tag === "MicroStepDone" && event.step === e.step) return { step: e.step, tokens: event.trained_tokens, at: event.at }
  if (event.at === e.at) return e
  const members = l.trainingReady - l.trainersIdle
  const available = batchOf(l, e.step)?.tokens ?? 0
  const tokens = Math.min(available, e.tokens + members * l.config.train_tokens_per_s_per_cell * (event.at - e.at))
  return { step: e.step, tokens, at: event.at }
}

export const advanceStats = (s: TailStats, event: PolicyEvent): TailStats =>
  event._tag === "ExecutionFinished"
    ? { count: s.count + 1, tokens: s.tokens + event.tokens, longest_s: Math.max(s.longest_s, event.duration_s) }
    : s

/** What a trigger reads. */
export interface TriggerInput {
  readonly ledger: Ledger
  readonly trained: TrainingEstimate
  readonly stats: TailStats
  /** Whether every finished execution of the running step is trained (or no step runs). */
  readonly consumed: boolean
}

export interface Trigger {
  readonly summary: string
  /** Whether the first rollout cell may leave for training now. */
  readonly leave: (t: TriggerInput) => boolean
  /** Training cells to keep while rollout work waits for a slot. */
  readonly keep: (t: TriggerInput) => number
}

/** The published water-level condition w(t) <= C_R(t) - C_e. */
export const waterLevel = (l: Ledger): boolean => l.dispatched - l.finished <= (l.serving - 1) * l.config.slots_per_cell

/** Cells in the training role, arrived or on their way. */
const trainers = (l: Ledger): number => l.cells.length - l.rolloutBound

/** Finished tokens of the running step not yet trained (estimated). */
const untrained = ({ ledger: l, trained }: TriggerInput): number =>
  (batchOf(l, l.stepsDone)?.tokens ?? 0) - (trained.step === l.stepsDone ? trained.tokens : 0)

/**
 * N*: training cells that finish the running step as its predicted tail ends; -1 when there is
 * nothing to predict from, or the batch has finished (then the step is the critical path).
 */
export const trainersNeeded = ({ ledger: l, trained, stats }: TriggerInput): number => {
  const c = l.config
  const k = l.stepsDone
  const batch = batchOf(l, k)
  if (batch === undefined || stats.count === 0 || batch.finished === c.executions_per_step) return -1
  if (batch.started < c.executions_per_step) return -1
  const left = c.executions_per_step - batch.finished
  const untrained = batch.tokens - (trained.step === k ? trained.tokens : 0) + left * (stats.tokens / stats.count)
  const tailEnds = batch.started < c.executions_per_step ? trained.at + stats.longest_s : batch.lastStartAt + stats.longest_s
  const timeLeft = Math.max((tailEnds - trained.at) * Number(process.env.TF ?? 1), c.switch_to_train_s + c.switch_to_rollout_s)
  const rolloutNeeded = Math.ceil(left / c.slots_per_cell)
  return Math.min(l.cells.length - rolloutNeeded, Math.ceil(untrained / (c.train_tokens_per_s_per_cell * timeLeft)))
}

export const triggers: Record<TriggerName, Trigger> = {
  published: {
    summary: "cells move to training while w(t) = d(t) - f(t) <= C_R(t) - C_e (published water level)",
    leave: (t) => waterLevel(t.ledger),
    keep: (t) => (t.consumed ? 0 : Infinity)
  },
  tail: {
    summary: "water level, plus the training cells the predicted tail of the running step needs",
    leave: (t) => waterLevel(t.ledger),
    keep: (t) => {
      if (t.consumed) return 0
      const needed = trainersNeeded(t)
      return needed >= 0 ? Math.max(1, needed) : Infinity
    }
  }
}
