/**
 * Reading a run's journal: every tell, every ask (copied by the actor that answered it) and
 * every system event, in journal order, from a sequence number or a time.
 *
 * The journal is an ordinary JetStream stream with JSON payloads and a `Gyre-Request` header,
 * so any NATS client can read it; this module decodes each message with its actor kind's
 * protocol (when the caller supplies it) so a replay sees the same typed values the actors saw.
 * A read covers the messages present when it starts, then ends.
 */
import { Cause, Exit, Schema, Stream } from "effect"
import type { RpcGroup } from "effect/rpc"
import type { TransportError } from "./errors.ts"
import type { ActorAddress } from "./names.ts"
import { Headers, codecsOf, parseJson, requestOf } from "./protocol.ts"
import { readStored, type StartAt, type StreamMessage } from "./stream-reader.ts"
import type { ActorSystemShape } from "./system.ts"

export interface JournalEntry {
  readonly seq: number
  readonly time: Date
  readonly subject: string
  /** `tell`, `ask` (a copy of an answered ask) or `event` (a system event). */
  readonly via: "tell" | "ask" | "event"
  /** The actor addressed (tells and asks). */
  readonly actor: ActorAddress | undefined
  /** The request tag, or the event name. */
  readonly name: string
  readonly msgId: string | undefined
  /** The decoded payload when the kind's protocol was supplied, else the parsed JSON. */
  readonly payload: unknown
  /** Why decoding failed, when it did. */
  readonly error: string | undefined
}

/** What reading a run's journal needs of a system: a reader with no actors (`gyre replay`) passes just these. */
export type JournalSource = Pick<ActorSystemShape, "run" | "nats" | "layout">

export interface ReadJournalOptions {
  /** First sequence to read (default 1), or the first time. */
  readonly from?: StartAt
  /** Keep reading new messages until interrupted instead of ending at the last one. */
  readonly follow?: boolean
  /** Protocols by actor kind, to decode payloads. */
  readonly protocols?: Readonly<Record<string, RpcGroup.RpcGroup<any>>>
}

const classify = (prefix: string, subject: string) => {
  const rest = subject.slice(prefix.length + 1).split(".")
  const [section, second, ...more] = rest
  if (section === "sys") return { via: "event" as const, actor: undefined, name: [second, ...more].join(".") }
  const actor = second === undefined ? undefined : { kind: second, id: more.join(".") }
  return { via: section === "asked" ? ("ask" as const) : ("tell" as const), actor, name: "" }
}

/** Streams the journal of `system`'s run, decoded. */
export const readJournal = (system: JournalSource, options: ReadJournalOptions = {}): Stream.Stream<JournalEntry, TransportError> => {
  const prefix = `gyre.${system.run}`
  const decodeEntry = (m: StreamMessage): JournalEntry => {
    const where = classify(prefix, m.subject)
    const name = where.via === "event" ? where.name : m.headers?.get(Headers.request) ?? ""
    const parsed = parseJson(m.data)
    let payload: unknown = parsed.ok ? parsed.value : undefined
    let error: string | undefined = parsed.ok ? undefined : parsed.reason
    const protocol = where.actor ? options.protocols?.[where.actor.kind] : undefined
    if (parsed.ok && protocol !== undefined) {
      const rpc = requestOf(protocol, name)
      if (rpc === undefined) error = `unknown request '${name}'`
      else {
        const decoded = Schema.decodeUnknownExit(codecsOf(rpc).payload)(parsed.value)
        if (Exit.isSuccess(decoded)) payload = decoded.value
        else error = Cause.pretty(decoded.cause)
      }
    }
    return {
      seq: m.seq,
      time: m.time, // from the delivery info the sequence already parsed (timestampNanos parses it again)
      subject: m.subject,
      via: where.via,
      actor: where.actor,
      name,
      msgId: m.headers?.get(Headers.msgId) || undefined,
      payload,
      error
    }
  }
  return readStored(system.nats, system.layout.journalStream, options.from, undefined, options.follow).pipe(Stream.map(decodeEntry))
}
