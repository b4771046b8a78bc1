/**
 * The harness runner's protocol, shared by its senders and receivers.
 *
 * A harness runner runs one execution per `RunExecution`: a fresh workspace from the task's
 * template, the harness command with `OPENAI_BASE_URL`, `OPENAI_API_KEY`, `GYRE_TASK_ID` and
 * `GYRE_WORKSPACE`, then the task's scorer; it answers (and publishes on
 * `gyre.<run>.outcomes.<execution>`) the `ExecutionOutcome`. The API key it hands the harness
 * is registered with the gateway first (`OpenExecution`, in `./gateway.ts`).
 */
import { Schema } from "effect"
import { Rpc, RpcGroup } from "effect/rpc"
import { ExecutionOutcome } from "../tree/outcome.ts"
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
  env: Schema.Record(Schema.String, Schema.String),
  /** The run's seed, given to the harness as `GYRE_SEED` (with `GYRE_EXECUTION_ID`) so what it draws can be drawn again. */
  seed: Schema.optional(Schema.Int)
})
export type RunExecution = typeof RunExecution.Type

export class UnknownTask extends Schema.TaggedError<UnknownTask>()("UnknownTask", {
  suite: Schema.String,
  task: Schema.String,
  reason: Schema.String
}) {}

/** `RunExecution.env` names a variable a harness may not be given (loader, shell start-up, credentials, the runner's own). */
export class ForbiddenEnvironment extends Schema.TaggedError<ForbiddenEnvironment>()("ForbiddenEnvironment", {
  names: Schema.Array(Schema.String),
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
  Rpc.make("RunExecution", { payload: RunExecution, success: ExecutionOutcome, error: Schema.Union([UnknownTask, ForbiddenEnvironment]) }),
  Rpc.make("Status", { success: RunnerStatus })
)
