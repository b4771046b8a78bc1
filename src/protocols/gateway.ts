/**
 * The gateway's protocol, shared by its senders and receivers.
 *
 * The harness runner registers each execution's bearer key (`OpenExecution`) before it hands
 * the key to the harness, so the gateway knows which execution, task and role every model
 * call belongs to; `CloseExecution` revokes it.
 *
 * API keys: `newApiKey()` draws 192 bits from the CSPRNG (nothing in them comes from an id).
 * The key itself never travels on NATS, so it is never in the journal (which copies every
 * ask): `OpenExecution` carries `keyDigest`, an HMAC-SHA256 of the key under a fixed
 * domain-separation key, and the gateway keeps only digests and compares that of each
 * request's bearer key. A digest opens one execution only, and an open execution cannot be
 * re-opened with another digest (`ExecutionConflict`); re-opening with the same one is a no-op
 * (a retried ask).
 */
import { createHmac, randomBytes } from "node:crypto"
import { Schema } from "effect"
import { Rpc, RpcGroup } from "effect/rpc"
import { AgentRole } from "../tree/role.ts"
import { ExecutionId } from "./layout.ts"

const NonNegativeInt = Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))

/** A fresh API key: 192 bits from the CSPRNG, hex. */
export const newApiKey = (): string => `gyre-${randomBytes(24).toString("hex")}`

/** The digest a key is registered and looked up by (hex HMAC-SHA256). */
export const apiKeyDigest = (key: string): string => createHmac("sha256", "gyre/api-key/v1").update(key).digest("hex")

const KeyDigest = Schema.String.check(Schema.isPattern(/^[0-9a-f]{64}$/))

/** `OpenExecution` refused: the execution is open under another key, or the key names another execution. */
export class ExecutionConflict extends Schema.TaggedError<ExecutionConflict>()("ExecutionConflict", {
  execution: Schema.String,
  reason: Schema.String
}) {}

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
  overheadP99Ms: Schema.Number,
  /** Parts of the overhead: from the request's arrival to its routing (body, key, schema, chat template, tokens). */
  preparedP50Ms: Schema.Number,
  preparedP99Ms: Schema.Number,
  /** From the routing to the answer, less the worker's own time: the router, the ask's encoding and decoding, NATS both ways. */
  askP50Ms: Schema.Number,
  askP99Ms: Schema.Number,
  /** The call record's JetStream publish until acknowledged (stored, and fsynced where the server syncs always). */
  recordP50Ms: Schema.Number,
  recordP99Ms: Schema.Number,
  promptTokens: NonNegativeInt,
  /** Prompt tokens the worker found cached (not prefilled again). */
  cachedTokens: NonNegativeInt,
  generatedTokens: NonNegativeInt
})
export type RecentCalls = typeof RecentCalls.Type

/**
 * Counts over every call the gateway answered since it started. `cachedTokens / promptTokens` is
 * the share of prompt tokens served from a worker's KV cache (the benchmark's `cached_fraction`).
 */
export const CallTotals = Schema.Struct({
  calls: NonNegativeInt,
  promptTokens: NonNegativeInt,
  /** Prompt tokens the first worker of each call found in its cache. */
  cachedTokens: NonNegativeInt,
  /** Tokens workers had evicted from their KV pool (or preempted) and prefilled again. */
  reprefillTokens: NonNegativeInt,
  /** Asks that carried a whole prompt again: a `CacheMiss`, or a move to a worker without the execution's context. */
  fullResends: NonNegativeInt
})
export type CallTotals = typeof CallTotals.Type

export const GatewayStatus = Schema.Struct({
  baseUrl: Schema.String,
  openExecutions: NonNegativeInt,
  calls: NonNegativeInt,
  errors: NonNegativeInt,
  /** Requests answered 500 because of a bug (logged with their cause). */
  internalErrors: NonNegativeInt,
  recent: RecentCalls,
  totals: CallTotals
})

export const GatewayProtocol = RpcGroup.make(
  /** Registers the bearer key of an execution (by its digest); returns the OpenAI base URL to hand the harness. */
  Rpc.make("OpenExecution", {
    payload: {
      /** `apiKeyDigest(key)`: the key itself never goes on the wire (nor into the journal). */
      keyDigest: KeyDigest,
      task: Schema.NonEmptyString,
      execution: ExecutionId,
      /** Agent role of calls that do not name one in the `X-Gyre-Role` header. */
      defaultRole: AgentRole
    },
    success: Schema.Struct({ baseUrl: Schema.String }),
    error: ExecutionConflict
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
