/**
 * The words a scheduling policy hears and says: its configuration, the events it consumes and
 * the actions it emits, all as Schema types so the live scheduler can journal them and
 * `replay --verify` can feed them back.
 *
 * Time arrives only inside events (`at`, seconds since the run started); a policy has no clock.
 * Executions are numbered in run order: batch `b` holds executions
 * `b * executions_per_step .. (b + 1) * executions_per_step - 1`, and step `k` trains batch `k`.
 * Policy version `v` is the weights after `v` steps (version 0 = the initial weights).
 *
 * "Execution dispatched" is the policy's own `Dispatch` action: the policy is the only
 * dispatcher, so it counts d(t) when it emits one and no echo event exists.
 */
import { Schema } from "effect"

const Count = Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))
const Positive = Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))
const Seconds = Schema.Number.check(Schema.isFinite(), Schema.isGreaterThanOrEqualTo(0))

/** The role a cell (a device) serves in: rollout or training (a call's agent role is `AgentRole`, src/tree/role.ts). */
export const CellRole = Schema.Literals(["rollout", "training"])
export type CellRole = typeof CellRole.Type

/**
 * What every policy knows of the run before its first event. Cells arrive as events; execution
 * durations are never known in advance.
 */
export const PolicyConfig = Schema.Struct({
  /** Concurrent executions one cell serves in rollout (C_e = one cell's capacity). */
  slots_per_cell: Positive,
  executions_per_step: Positive,
  steps: Positive,
  /** Batch k may start once version k - max_staleness is published (0 = on-policy). */
  max_staleness: Count
})
export type PolicyConfig = typeof PolicyConfig.Type

// ---- events -------------------------------------------------------------------------------

/** A cell is available; it arrives serving rollouts. */
export const CellJoined = Schema.TaggedStruct("CellJoined", { cell: Count, at: Seconds })
/** A cell is gone; the router re-queues its in-flight executions, its micro-steps are re-claimed. */
export const CellLost = Schema.TaggedStruct("CellLost", { cell: Count, at: Seconds })
/** An execution got a rollout slot. */
export const ExecutionStarted = Schema.TaggedStruct("ExecutionStarted", { execution: Count, batch: Count, at: Seconds })
/** An execution ended; its `tokens` are now trainable by step `batch`. */
export const ExecutionFinished = Schema.TaggedStruct("ExecutionFinished", {
  execution: Count,
  batch: Count,
  tokens: Count,
  duration_s: Seconds,
  at: Seconds
})
/** A cell finished switching and now serves `role`. */
export const SwitchDone = Schema.TaggedStruct("SwitchDone", { cell: Count, role: CellRole, at: Seconds })
/**
 * Progress of the running step: `trained_tokens` of its batch are trained so far. The simulator
 * reports it when the training cells have consumed every finished execution (they wait for data);
 * a live trainer may report it after every micro-step.
 */
export const MicroStepDone = Schema.TaggedStruct("MicroStepDone", { step: Count, trained_tokens: Count, at: Seconds })
/** Step `step` applied its update: version `step + 1` exists on the training cells. */
export const StepDone = Schema.TaggedStruct("StepDone", { step: Count, at: Seconds })
/** Version `version` reached every rollout cell; executions started from now on use it. */
export const WeightsPublished = Schema.TaggedStruct("WeightsPublished", { version: Count, at: Seconds })

export const PolicyEvent = Schema.Union([
  CellJoined,
  CellLost,
  ExecutionStarted,
  ExecutionFinished,
  SwitchDone,
  MicroStepDone,
  StepDone,
  WeightsPublished
])
export type PolicyEvent = typeof PolicyEvent.Type

// ---- actions ------------------------------------------------------------------------------

/** Hand batch `batch`'s executions to the harness runners; they start as rollout slots free up. */
export const Dispatch = Schema.TaggedStruct("Dispatch", { batch: Count })
/**
 * Move a cell to `role`. Leaving rollout: the cell stops admitting and its in-flight executions
 * move to other cells (harness-preserving switch). Leaving training: the cell leaves its step.
 */
export const SwitchRole = Schema.TaggedStruct("SwitchRole", { cell: Count, role: CellRole })
/** Start training step `step` on `cells` (all in the training role); `core` holds the optimizer. */
export const StartStep = Schema.TaggedStruct("StartStep", { step: Count, core: Count, cells: Schema.Array(Count) })
/** A training cell joins the running step and claims micro-steps from its queue. */
export const JoinStep = Schema.TaggedStruct("JoinStep", { step: Count, cell: Count })
/** Send version `version` (just trained) to the rollout cells. */
export const PublishWeights = Schema.TaggedStruct("PublishWeights", { version: Count })

export const PolicyAction = Schema.Union([Dispatch, SwitchRole, StartStep, JoinStep, PublishWeights])
export type PolicyAction = typeof PolicyAction.Type
