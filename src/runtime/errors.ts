/**
 * The runtime's own tagged errors: what `tell` and `ask` can fail with besides a protocol's
 * typed errors, and how supervision reports a child it gave up on.
 */
import { Schema } from "effect"

/** No reply within the ask's timeout. */
export class AskTimeout extends Schema.TaggedError<AskTimeout>()("AskTimeout", {
  actor: Schema.String,
  request: Schema.String,
  timeoutMs: Schema.Number
}) {}

/** Nobody is serving the actor's ask subject (not spawned, stopped, or its node is gone). */
export class ActorUnavailable extends Schema.TaggedError<ActorUnavailable>()("ActorUnavailable", {
  actor: Schema.String,
  request: Schema.String
}) {}

/** The actor refused the request: it did not decode, named an unknown request, or crashed the handler. */
export class RequestRejected extends Schema.TaggedError<RequestRejected>()("RequestRejected", {
  actor: Schema.String,
  request: Schema.String,
  reason: Schema.String
}) {}

/** The actor has more asks waiting than it queues (`maxQueuedAsks`, `maxQueuedAskBytes`): retry later or elsewhere. */
export class ActorOverloaded extends Schema.TaggedError<ActorOverloaded>()("ActorOverloaded", {
  actor: Schema.String,
  request: Schema.String,
  reason: Schema.String
}) {}

/** A NATS or JetStream operation failed (publish not acknowledged, connection closed, ...). */
export class TransportError extends Schema.TaggedError<TransportError>()("TransportError", {
  operation: Schema.String,
  message: Schema.String
}) {}

/**
 * A snapshot write lost its compare-and-set: someone else (another incarnation of the same
 * actor) wrote its state since this one read or wrote it. A fencing matter, not a transport
 * fault: retrying cannot help, and this incarnation must stop acknowledging.
 */
export class SnapshotConflict extends Schema.TaggedError<SnapshotConflict>()("SnapshotConflict", {
  actor: Schema.String,
  expectedRevision: Schema.Number,
  /** The incarnation that wrote the revision found, when it could be read. */
  writtenBy: Schema.optional(Schema.Number)
}) {}

/** The stored snapshot of an actor does not decode (it was quarantined with this reason). */
export class SnapshotCorrupt extends Schema.TaggedError<SnapshotCorrupt>()("SnapshotCorrupt", {
  actor: Schema.String,
  revision: Schema.Number,
  reason: Schema.String
}) {}

/** A supervisor gave up on a child after too many restarts within its period. */
export class Escalation extends Schema.TaggedError<Escalation>()("Escalation", {
  child: Schema.String,
  restarts: Schema.Number,
  withinMs: Schema.Number,
  lastFailure: Schema.String
}) {}

export type AskError = AskTimeout | ActorUnavailable | RequestRejected | ActorOverloaded | TransportError

export const messageOf = (e: unknown): string => (e instanceof Error ? e.message : String(e))
