/**
 * The harness runner's and the gateway's protocols, shared by their senders and receivers.
 *
 * A harness runner runs one execution per `RunExecution`: a fresh workspace from the task's
 * template, the harness command with `OPENAI_BASE_URL`, `OPENAI_API_KEY`, `GYRE_TASK_ID` and
 * `GYRE_WORKSPACE`, then the task's scorer; it answers (and publishes on
 * `gyre.<run>.outcomes.<execution>`) the `ExecutionOutcome`. The API key it hands the harness
 * is registered with the gateway first (`OpenExecution`), so the gateway knows which
 * execution, task and role every model call belongs to.
 */
import { Schema } from "effect"
import { Rpc, RpcGroup } from "effect/rpc"
import { ExecutionOutcome } from "../tree/outcome.ts"
import { Role } from "../tree/role.ts"
import { ExecutionId } from "./layout.ts"

const NonNegativeInt = Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))

export const Split = Schema.Literals(["train", "heldout"])
export type Split = typeof Split.Type

/** A task of a suite (`suites/<suite>/`, format in ARCHITECTURE.md). */
export const TaskRef = Schema.Struct({
  suite: Schema.NonEmptyString,
  task: Schema.NonEmptyString
})
export type TaskRef = typeof TaskRef.Type

export const RunExecution = Schema.Struct({
  task: TaskRef,
  execution: ExecutionId,
  /** Wall-clock limit of the harness; null = the suite's default. */
  timeoutMs: Schema.NullOr(Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))),
  /** Keep the workspace afterwards: never, when the harness or the evaluation failed, or always. */
  keepWorkspace: Schema.Literals(["never", "on-failure", "always"]),
  /** Extra environment for the harness (e.g. the toy suite's horizon). */
  env: Schema.Record(Schema.String, Schema.String)
})
export type RunExecution = typeof RunExecution.Type

export class UnknownTask extends Schema.TaggedError<UnknownTask>()("UnknownTask", {
  suite: Schema.String,
  task: Schema.String,
  reason: Schema.String
}) {}

export const RunnerStatus = Schema.Struct({
  running: NonNegativeInt,
  capacity: NonNegativeInt,
  finished: NonNegativeInt,
  /** Executions dropped because their evaluation never succeeded. */
  dropped: NonNegativeInt
})

export const HarnessRunnerProtocol = RpcGroup.make(
  Rpc.make("RunExecution", { payload: RunExecution, success: ExecutionOutcome, error: UnknownTask }),
  Rpc.make("Status", { success: RunnerStatus })
)

export class UnknownExecution extends Schema.TaggedError<UnknownExecution>()("UnknownExecution", {
  execution: Schema.String
}) {}

/** Figures of the gateway's most recent calls (a window of the last 4096). */
export const RecentCalls = Schema.Struct({
  calls: NonNegativeInt,
  /** From the request's arrival to its record on JetStream (the response is written then). */
  roundTripP50Ms: Schema.Number,
  /** The worker's share of engine time for the call (batched steps split among their calls). */
  computeP50Ms: Schema.Number,
  /** Time inside the worker: from taking the request to its answer (batching waits included). */
  workerP50Ms: Schema.Number,
  /** Per call, round trip minus time inside the worker: what HTTP, the gateway and NATS add. */
  overheadP50Ms: Schema.Number,
  promptTokens: NonNegativeInt,
  /** Prompt tokens the worker found cached (not prefilled again). */
  cachedTokens: NonNegativeInt,
  generatedTokens: NonNegativeInt
})
export type RecentCalls = typeof RecentCalls.Type

export const GatewayStatus = Schema.Struct({
  baseUrl: Schema.String,
  openExecutions: NonNegativeInt,
  calls: NonNegativeInt,
  errors: NonNegativeInt,
  recent: RecentCalls
})

export const GatewayProtocol = RpcGroup.make(
  /** Registers the bearer key of an execution; returns the OpenAI base URL to hand the harness. */
  Rpc.make("OpenExecution", {
    payload: {
      key: Schema.String.check(Schema.isMinLength(16)),
      task: Schema.NonEmptyString,
      execution: ExecutionId,
      /** Role of calls that do not name one in the `X-Gyre-Role` header. */
      defaultRole: Role
    },
    success: Schema.Struct({ baseUrl: Schema.String })
  }),
  /** Revokes the key, frees the execution's cached context on its worker, drops its encoder. */
  Rpc.make("CloseExecution", {
    payload: { execution: ExecutionId },
    success: Schema.Struct({ calls: NonNegativeInt }),
    error: UnknownExecution
  }),
  Rpc.make("Status", { success: GatewayStatus })
)
