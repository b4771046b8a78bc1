/**
 * The device actor's protocol (`device/<node>.<i>`), shared by the gateway, the scheduler, other
 * devices and the device itself.
 *
 * A device owns one loaded model and its KV pool for the whole run and serves in one role at a
 * time. In the `rollout` role it answers the rollout worker's requests (`RolloutWorkerProtocol`,
 * so the gateway's router talks to a device exactly as to a rollout worker). `SwitchRole` moves
 * it between roles without reloading weights (the harness-preserving switch: its in-flight
 * generations and cached contexts are handed to `destinations` first). In the `training` role
 * it claims micro-batches of the running step; the core device (`StartStep`) also plans the
 * step, reduces the gradients in micro-batch order, applies AdamW and publishes the new weights.
 *
 * Wire forms of the training path (micro-batch messages, gradient objects) are here too, since
 * the core writes what satellites read.
 */
import { Schema } from "effect"
import { Rpc, RpcGroup } from "effect/rpc"
import { ExecutionOutcome } from "../tree/outcome.ts"
import { ExecutionId } from "./layout.ts"
import { RolloutWorkerProtocol, WorkerLoad } from "./rollout.ts"
import { CellRole } from "../policy/vocabulary.ts"

const Count = Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))

export const DEVICE_KIND = "device"

/** A device's registry load: the rollout figures plus its role. */
export const DeviceLoad = Schema.Struct({
  ...WorkerLoad.fields,
  role: CellRole,
  /** A switch is under way (`role` is where it is going). */
  switching: Schema.Boolean,
  /** Step it trains in (training role), else -1. */
  step: Schema.Int
})
export type DeviceLoad = typeof DeviceLoad.Type

/** One context handed from a device leaving rollout to a destination (no field grows with the context). */
export const ContextHandoff = Schema.Struct({
  execution: ExecutionId,
  /** The request id the context is known by (the gateway's `base.request`). */
  request: ExecutionId,
  /**
   * Object `GYRE_<run>_kv/<object>`: the context's `length` tokens (int32, little-endian), then the
   * engine's GYKV buffer of its first `kvLength`.
   */
  object: Schema.String,
  length: Count,
  kvLength: Count,
  /** A paused generation (true) or a context cached between calls (false). */
  inFlight: Schema.Boolean
})
export type ContextHandoff = typeof ContextHandoff.Type

export const SwitchResult = Schema.Struct({
  role: CellRole,
  generationsMoved: Count,
  contextsMoved: Count,
  bytesMoved: Count,
  /** Tokens the destinations will have to prefill again (0 when every context moved). */
  reprefillTokens: Count,
  /** From the request to the answer. */
  ms: Schema.Number,
  /** Time to stop admitting and pause generations (the control plane). */
  controlMs: Schema.Number
})
export type SwitchResult = typeof SwitchResult.Type

/** The weights of a version could not be loaded, or a step request does not fit the device's state. */
export class DeviceRefused extends Schema.TaggedError<DeviceRefused>()("DeviceRefused", {
  device: Schema.String,
  reason: Schema.String
}) {}

/** An execution of the running step, told to the core as it finishes. */
export const StepExecutionRef = Schema.Struct({
  step: Count,
  execution: ExecutionId,
  task: Schema.String,
  /** Group within the batch (executions of one task). */
  group: Count,
  /** The policy's token count of the execution (unique tokens of its tree). */
  tokens: Count,
  outcome: ExecutionOutcome
})
export type StepExecutionRef = typeof StepExecutionRef.Type

export const StepPlan = Schema.Struct({
  step: Count,
  /**
   * The attempt at the step: the journal index of the scheduler's record that started it. A step
   * whose core was lost starts again on another core as a new attempt; its micro-batches,
   * gradients and progress are named by it, so nothing of an earlier attempt is mistaken for it.
   */
  attempt: Count,
  /** Weights the step's gradients are computed on (= step). */
  version: Count,
  /** Executions the batch holds and the size of each group (for streaming advantages). */
  executions: Count,
  groupSizes: Schema.Array(Count),
  /** Devices that train in the step with the core (more may join later). */
  cells: Schema.Array(Schema.String)
})
export type StepPlan = typeof StepPlan.Type

export const TrainStatsJson = Schema.Struct({
  loss: Schema.Number,
  weightSum: Schema.Number,
  entropy: Schema.Number,
  meanLogprob: Schema.Number,
  meanRatio: Schema.Number,
  clipFraction: Schema.Number,
  meanIsWeight: Schema.Number,
  /** Largest importance weight min(pi / mu, isCap) of a trained token (1 when none). */
  maxIsWeight: Schema.Number,
  truncatedFraction: Schema.Number,
  trainedTokens: Count,
  staleTokens: Count
})

/** The requests of the training role (`src/actors/trainer.ts`), part of `DeviceProtocol`. */
export const TrainingProtocol = RpcGroup.make(
  /** Core only: plan and run step `step` (idempotent per step). */
  Rpc.make("StartStep", { payload: StepPlan, success: Schema.Struct({ started: Schema.Boolean }), error: DeviceRefused }),
  /** Core only: a finished execution of the running step (durable tell, deduplicated by execution). */
  Rpc.make("TrainExecution", { payload: StepExecutionRef, success: Schema.Struct({ queued: Schema.Boolean }) }),
  /** Any training device: claim micro-batches of `step` computed on `version` (idempotent). */
  Rpc.make("JoinStep", { payload: { step: Count, attempt: Count, version: Count, core: Schema.String }, success: Schema.Struct({ joined: Schema.Boolean }), error: DeviceRefused }),
  /**
   * Core only: a satellite stored the gradient of micro-batch `index`; or, with `failed`, the
   * micro-batch cannot be trained (the reason; nothing stored, `stats` all 0).
   */
  Rpc.make("GradientReady", {
    payload: { step: Count, attempt: Count, index: Count, device: Schema.String, stats: TrainStatsJson, failed: Schema.optional(Schema.String) },
    success: Schema.Struct({ accepted: Schema.Boolean })
  })
)

export const DeviceProtocol = RolloutWorkerProtocol.add(
  Rpc.make("SwitchRole", {
    payload: {
      role: CellRole,
      /** Leaving rollout: device keys (`device/<id>`) to hand contexts to, preferred first. */
      destinations: Schema.Array(Schema.String),
      /** Joining rollout: the newest published version to load first. */
      version: Schema.optional(Count)
    },
    success: SwitchResult,
    error: DeviceRefused
  }),
  /** Destination side of the hand-off: import the contexts, then the source frees its copies. */
  Rpc.make("ImportContexts", {
    payload: { from: Schema.String, contexts: Schema.Array(ContextHandoff) },
    success: Schema.Struct({ imported: Count, failed: Schema.Array(Schema.String) })
  })
).merge(TrainingProtocol)

/**
 * One micro-batch on the step's work queue (`gyre.<run>.mb.<step>`, message id
 * `mb-<step>-<attempt>-<index>`): its reference. The batch itself is object
 * `microBatchObject(step, attempt, index)` of `GYRE_<run>_batches` (`src/training/microbatch-store.ts`),
 * so the message stays small whatever the micro-batch's length.
 */
export const MicroBatchRef = Schema.Struct({
  step: Count,
  /** The step's attempt (`StepPlan.attempt`) and its core (`device/<id>`), which gets the gradient. */
  attempt: Count,
  core: Schema.String,
  index: Count,
  version: Count,
  /** Executions with tokens in it. */
  executions: Schema.Array(ExecutionId),
  /** Sum of the scheduler's `tokens` of executions whose last micro-batch this is. */
  completesTokens: Count,
  /** The batch's length in tokens. */
  tokens: Count,
  /** `packedBatchDigest` of the batch (sha256, hex): also the digest of its object's bytes. */
  digest: Schema.String
})
export type MicroBatchRef = typeof MicroBatchRef.Type

/** Object name of micro-batch `index` of attempt `attempt` at step `step` in `GYRE_<run>_batches`. */
export const microBatchObject = (step: number, attempt: number, index: number) => `s${step}.a${attempt}.m${index}`

/** Object name of micro-batch `index`'s gradient of attempt `attempt` at step `step` in `GYRE_<run>_grads`. */
export const gradientObject = (step: number, attempt: number, index: number) => `s${step}.a${attempt}.m${index}`
