/**
 * The gateway's protocol, shared by its senders and receivers.
 *
 * The harness runner registers each execution's bearer key (`OpenExecution`) before it hands
 * the key to the harness, so the gateway knows which execution, task and role every model
 * call belongs to; `CloseExecution` revokes it.
 */
import { Schema } from "effect"
import { Rpc, RpcGroup } from "effect/rpc"
import { Role } from "../tree/role.ts"
import { ExecutionId } from "./layout.ts"

const NonNegativeInt = Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))

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
  /**
   * A device leaving rollout handed executions' cached contexts to `to` (each under its request
   * id): their routes and remembered sequences move there, so their next calls prefill only
   * their new suffix.
   */
  Rpc.make("ContextsMoved", {
    payload: {
      from: Schema.String,
      to: Schema.String,
      moves: Schema.Array(Schema.Struct({ execution: ExecutionId, request: Schema.String, tokens: NonNegativeInt }))
    },
    success: Schema.Struct({ routed: NonNegativeInt })
  }),
  Rpc.make("Status", { success: GatewayStatus })
)
