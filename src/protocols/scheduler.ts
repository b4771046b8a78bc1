/**
 * The live scheduler's protocol (`scheduler/main`) and the records it journals.
 *
 * Every input is a durable tell, handled in order by the one scheduler holding the run's lease:
 * devices announce themselves, the scheduler's own action fibers report their completions, and the
 * core trainer reports progress. Each input becomes one `PolicyEvent`; the policy's answer is
 * journaled as a `PolicyRecord` on `gyre.<run>.sys.policy` (event, actions, digest of the policy
 * state after it), which is what a standby replays on takeover and `gyre replay --verify` checks.
 */
import { Schema } from "effect"
import { Rpc, RpcGroup } from "effect/rpc"
import { PolicyAction, PolicyEvent, CellRole } from "../policy/vocabulary.ts"
import { ExecutionOutcome } from "../tree/outcome.ts"
import { ExecutionId } from "./layout.ts"
import { StepPlan, SwitchResult } from "./device.ts"

const Count = Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))

export const SCHEDULER_KIND = "scheduler"

/** One execution's trajectory tree as the core trainer rebuilt it for its step. */
export const TreeFigures = Schema.Struct({
  execution: ExecutionId,
  calls: Count,
  uniqueTokens: Count,
  /** Leaves: root-to-leaf paths. */
  paths: Count,
  /** `treeDigest` (src/tree/stats.ts). */
  digest: Schema.String,
  /**
   * `nodeDigests` (src/tree/stats.ts): 8 hex digits per node in canonical preorder, so a replay
   * can name the first node that differs. Absent from trainers before it, and on the trees of a
   * step past `NODE_DIGEST_BUDGET` characters (src/training/step-planner.ts).
   */
  nodes: Schema.optional(Schema.String)
})
export type TreeFigures = typeof TreeFigures.Type

/** An execution of a step that could not be trained in full, with the first reason (src/training/step-metrics.ts). */
export const StepError = Schema.Struct({ execution: ExecutionId, reason: Schema.String })
export type StepError = typeof StepError.Type

/** What a step journals for the people watching the run (`gyre.<run>.sys.step`). */
export const StepMetrics = Schema.Struct({
  step: Count,
  version: Count,
  executions: Count,
  dropped: Count,
  meanScore: Schema.Number,
  tokensTrained: Count,
  loss: Schema.Number,
  entropy: Schema.Number,
  clipFraction: Schema.Number,
  isWeightMean: Schema.Number,
  isWeightMax: Schema.Number,
  /** Mean of (behaviour log-prob - trainer log-prob) over trained tokens: a KL(mu || pi) estimate. */
  behaviourKl: Schema.Number,
  /** Trained tokens by staleness (version k - token version): index = staleness. */
  staleness: Schema.Array(Count),
  staleTokens: Count,
  dedupRatio: Schema.Number,
  microBatches: Count,
  /** Executions whose tokens this step trained (an execution trained by two steps is a bug the audit reports). */
  trainedExecutions: Schema.Array(ExecutionId),
  /** Devices that computed micro-batches (core first). */
  devices: Schema.Array(Schema.String),
  gradNorm: Schema.Number,
  /** The step's time split, milliseconds. */
  waitMs: Schema.Number,
  computeMs: Schema.Number,
  reduceMs: Schema.Number,
  publishMs: Schema.Number,
  /** Each told execution's tree as the core rebuilt it (`gyre replay --trees` checks them). */
  trees: Schema.optional(Schema.Array(TreeFigures)),
  /** `packedBatchDigest` of each planned micro-batch, by index (the first `BATCH_DIGEST_LIMIT`, src/training/step-metrics.ts). */
  batchDigests: Schema.optional(Schema.Array(Schema.String)),
  /** sha256 (hex) of every planned micro-batch's digest, in index order (`allBatchesDigest`). */
  allBatchesDigest: Schema.optional(Schema.String),
  /** Executions the step could not train in full (a record rejected, a micro-batch that failed), each once. */
  errors: Schema.optional(Schema.Array(StepError)),
  /**
   * The plan the core trained the step on (its last attempt's): what `gyre replay --trees`
   * re-plans with. Journaled here, durably, because the `StartStep` ask's journal copy is at
   * most once (a server lost at that moment loses it).
   */
  plan: Schema.optional(StepPlan)
})
export type StepMetrics = typeof StepMetrics.Type

export const SchedulerProtocol = RpcGroup.make(
  /** A device actor started (or restarted) and serves rollouts. */
  Rpc.make("DeviceJoined", { payload: { device: Schema.String }, success: Schema.Struct({ cell: Schema.Int }) }),
  Rpc.make("DeviceLost", { payload: { device: Schema.String }, success: Schema.Struct({ cell: Schema.Int }) }),
  /** The harness runner answered an execution of the plan. */
  Rpc.make("ExecutionEnded", {
    payload: { execution: ExecutionId, outcome: ExecutionOutcome, tokens: Count, durationS: Schema.Number },
    success: Schema.Struct({ accepted: Schema.Boolean })
  }),
  Rpc.make("SwitchCompleted", { payload: { cell: Count, role: CellRole, result: SwitchResult }, success: Schema.Struct({ accepted: Schema.Boolean }) }),
  Rpc.make("WeightsLoaded", { payload: { version: Count }, success: Schema.Struct({ accepted: Schema.Boolean }) }),
  Rpc.make("StepProgress", { payload: { step: Count, trainedTokens: Count }, success: Schema.Struct({ accepted: Schema.Boolean }) }),
  Rpc.make("StepDone", { payload: { step: Count, version: Count, metrics: StepMetrics }, success: Schema.Struct({ accepted: Schema.Boolean }) }),
  /** The run's figures so far (for `gyre status` and progress lines). */
  Rpc.make("Status", {
    success: Schema.Struct({
      leader: Schema.String,
      stepsDone: Count,
      dispatched: Count,
      started: Count,
      finished: Count,
      cells: Schema.Array(Schema.Struct({ cell: Count, device: Schema.String, role: CellRole, switching: Schema.Boolean })),
      done: Schema.Boolean
    })
  })
)

/** One policy step as journaled: the event, the actions it produced and the state digest after it. */
export const PolicyRecord = Schema.Struct({
  /** Index of the event in the run (0, 1, ...): gaps show lost records. */
  index: Count,
  /** Lease term of the scheduler that wrote it (two writers of one term = a fencing failure). */
  term: Count,
  event: PolicyEvent,
  actions: Schema.Array(PolicyAction),
  /** `digestOf` of the encoded policy state after the event. */
  digest: Schema.String,
  /** The device of a `CellJoined` or `CellLost` event: the scheduler's cell map (the policy never sees it). */
  device: Schema.optional(Schema.String),
  /** The joining device's incarnation: a `DeviceJoined` from a newer one is a restart (lost, then joined). */
  incarnation: Schema.optional(Schema.Int)
})
export type PolicyRecord = typeof PolicyRecord.Type
