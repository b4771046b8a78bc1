/**
 * The runtime's system events (`gyre.<run>.sys.<name>` on the journal), each a channel with its
 * schema (`channel.ts`): published with `ActorSystem.publishEvent(channel, value)` and decoded by
 * the same declaration when the journal is read.
 */
import { Schema } from "effect"
import { event } from "./channel.ts"

/** The `dead` system event. */
export const DeadEvent = Schema.Struct({
  kind: Schema.String,
  id: Schema.String,
  node: Schema.String,
  incarnation: Schema.Number,
  silentForMs: Schema.Number
})
export type DeadEvent = typeof DeadEvent.Type

/** The `placed` system event. */
export const PlacedEvent = Schema.Struct({
  kind: Schema.String,
  id: Schema.String,
  from: Schema.String,
  to: Schema.String,
  incarnation: Schema.Number,
  by: Schema.String
})
export type PlacedEvent = typeof PlacedEvent.Type

/** The `escalated` system event. */
export const EscalatedEvent = Schema.Struct({
  kind: Schema.String,
  id: Schema.String,
  node: Schema.String,
  restarts: Schema.Number,
  withinMs: Schema.Number,
  lastFailure: Schema.String
})
export type EscalatedEvent = typeof EscalatedEvent.Type

/** The `fenced` system event. */
export const FencedEvent = Schema.Struct({ kind: Schema.String, id: Schema.String, node: Schema.String })
export type FencedEvent = typeof FencedEvent.Type

export const Dead = event("dead", DeadEvent, "a registry entry silent for longer than the dead-after time, declared dead")
export const Placed = event("placed", PlacedEvent, "a dead actor placed again on a live node")
export const Escalated = event("escalated", EscalatedEvent, "a supervisor gave up on an actor after too many restarts")
export const Fenced = event("fenced", FencedEvent, "an incarnation stopped because another one owns the actor now")

/** Every system event the runtime publishes. */
export const runtimeEvents = [Dead, Placed, Escalated, Fenced] as const
