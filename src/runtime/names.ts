/**
 * Addresses and the NATS layout of a run: every subject, stream, consumer and bucket name
 * is computed here and nowhere else (ARCHITECTURE.md documents the same table).
 *
 * An actor is addressed as `kind/id` (`rollout-worker/node-a.gpu3`). A kind is lower-case
 * letters, digits and dashes; an id is letters, digits, `_`, `-` and `.` (dots make extra
 * subject tokens, which is harmless because a kind never holds one). A run id namespaces
 * everything, so several runs share one NATS system.
 */
import { Schema } from "effect"

const KIND = /^[a-z][a-z0-9-]*$/
const ID = /^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$/
const RUN = /^[A-Za-z0-9-]+$/

export class InvalidAddress extends Schema.TaggedError<InvalidAddress>()("InvalidAddress", {
  address: Schema.String,
  message: Schema.String
}) {}

/** The address of one actor. */
export const ActorAddress = Schema.Struct({ kind: Schema.String, id: Schema.String })
export type ActorAddress = typeof ActorAddress.Type

export const checkKind = (kind: string): string => {
  if (!KIND.test(kind)) throw new InvalidAddress({ address: kind, message: `actor kind '${kind}' must match ${KIND.source}` })
  return kind
}

export const address = (kind: string, id: string): ActorAddress => {
  checkKind(kind)
  if (!ID.test(id)) throw new InvalidAddress({ address: `${kind}/${id}`, message: `actor id '${id}' must match ${ID.source}` })
  return { kind, id }
}

/** Parses `kind/id`. */
export const parseAddress = (text: string): ActorAddress => {
  const slash = text.indexOf("/")
  if (slash < 0) throw new InvalidAddress({ address: text, message: `'${text}' is not kind/id` })
  return address(text.slice(0, slash), text.slice(slash + 1))
}

export const formatAddress = (a: ActorAddress): string => `${a.kind}/${a.id}`

/** Consumer names may not hold dots: every byte outside [A-Za-z0-9-] becomes `_` + two hex digits. */
const escapeToken = (s: string): string =>
  s.replace(/[^A-Za-z0-9-]/g, (c) => `_${c.charCodeAt(0).toString(16).padStart(2, "0")}`)

export const checkRun = (run: string): string => {
  if (!RUN.test(run)) throw new InvalidAddress({ address: run, message: `run id '${run}' must match ${RUN.source}` })
  return run
}

/** Every name of a run's NATS layout. */
export const layout = (run: string) => {
  checkRun(run)
  const base = `gyre.${run}`
  return {
    run,
    /** Journal stream: tells, copies of asks, and system events; limits retention. */
    journalStream: `GYRE_${run}_JOURNAL`,
    journalSubjects: [`${base}.tell.>`, `${base}.asked.>`, `${base}.sys.>`],
    /** Dead-letter stream: undecodable or unknown requests, with the reason. */
    deadStream: `GYRE_${run}_DEAD`,
    deadSubjects: [`${base}.dead.>`],
    /** KV bucket of live actors and nodes (key `kind/id`). */
    registryBucket: `GYRE_${run}_registry`,
    /** KV bucket of actor snapshots (key `kind/id`). */
    stateBucket: `GYRE_${run}_state`,
    tell: (a: ActorAddress) => `${base}.tell.${a.kind}.${a.id}`,
    ask: (a: ActorAddress) => `${base}.ask.${a.kind}.${a.id}`,
    asked: (a: ActorAddress) => `${base}.asked.${a.kind}.${a.id}`,
    dead: (a: ActorAddress) => `${base}.dead.${a.kind}.${a.id}`,
    /** System events (`spawned`, `stopped`, `dead`, `escalated`, ...). */
    sys: (event: string) => `${base}.sys.${event}`,
    sysAll: `${base}.sys.>`,
    /** Durable consumer of an actor's tells. */
    consumer: (a: ActorAddress) => `${escapeToken(a.kind)}__${escapeToken(a.id)}`,
    registryKey: (a: ActorAddress) => `${a.kind}/${a.id}`
  }
}

export type Layout = ReturnType<typeof layout>
