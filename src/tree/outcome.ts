/**
 * `ExecutionOutcome`: how an execution ended and what its evaluation said, as the harness
 * runner publishes it. An execution is scored also when it timed out (the partial score
 * of what was left in the workspace); "no-artifact" (nothing to evaluate) scores 0; a
 * "failed" evaluation (the scorer itself broke, retried by the runner within its budget)
 * has no score and drops the execution from training.
 */
import { Schema } from "effect"

const Reward = Schema.Number.check(Schema.isBetween({ minimum: 0, maximum: 1 }))

/**
 * Per-call rewards a scorer may report beside the score (process rewards), keyed by the call
 * id: the `id` of the chat completion the gateway answered (`chatcmpl-...`), which is the
 * call record's `callId`. Training with `credit: "call"` gives each call its own reward.
 */
export const CallRewards = Schema.Record(Schema.String, Reward)
export type CallRewards = typeof CallRewards.Type

export const EvaluationStatus = Schema.Literals(["scored", "no-artifact", "failed"])
export type EvaluationStatus = typeof EvaluationStatus.Type

export const ExecutionOutcome = Schema.Struct({
  run: Schema.String,
  task: Schema.String,
  execution: Schema.NonEmptyString,
  /** Whether the harness finished or was stopped by the execution's time limit. */
  ended: Schema.Literals(["finished", "timed-out"]),
  evaluation: EvaluationStatus,
  /** In [0, 1] when scored, 0 for no-artifact, null when the evaluation failed. */
  score: Schema.NullOr(Reward),
  /** The scorer's per-call rewards, when it reports them (scored evaluations only). */
  rewards: Schema.optional(CallRewards),
  /** Evaluation attempts made (retries of a failing scorer included). */
  attempts: Schema.Int.check(Schema.isGreaterThanOrEqualTo(0)),
  /** Free text: the scorer's summary or the last failure. */
  detail: Schema.String
}).check(
  Schema.makeFilter((o) =>
    o.evaluation === "scored"
      ? o.score !== null || "a scored evaluation needs a score"
      : o.evaluation === "no-artifact"
        ? o.score === 0 || "no-artifact scores 0"
        : o.score === null || "a failed evaluation has no score"
  ),
  Schema.makeFilter((o) => o.rewards === undefined || o.evaluation === "scored" || "only a scored evaluation has per-call rewards")
)
export type ExecutionOutcome = typeof ExecutionOutcome.Type

/** The reward that trains the execution, or undefined when it is dropped (evaluation failed). */
export const rewardOf = (outcome: ExecutionOutcome): number | undefined =>
  outcome.evaluation === "failed" ? undefined : (outcome.score ?? 0)

/** The reward of call `callId` of an execution that trains: the scorer's for that call, else the execution's. */
export const callRewardOf = (outcome: ExecutionOutcome, callId: string): number | undefined =>
  outcome.rewards?.[callId] ?? rewardOf(outcome)
