/**
 * Snapshots of an actor's state in the run's state bucket (key `kind/id`): the last one is
 * restored when an incarnation starts; new ones are written with compare-and-set on the KV
 * revision this incarnation last read or wrote.
 *
 * A stored snapshot that does not decode (not JSON, not a snapshot document, or a state its
 * schema refuses) is quarantined: `quarantine` keeps its bytes with the reason (the host sends
 * them to the dead-letter stream), and then, by the type's `corruptSnapshot` policy, the actor
 * starts from its initial state (the next write replaces the bad revision) or the restore fails
 * with `SnapshotCorrupt` (a crash its supervisor counts, and escalates by its policy).
 *
 * A failed write is classified, and each class is handled its own way:
 * - `SnapshotConflict`: the revision moved, someone else wrote the actor's state. Retrying
 *   cannot help; it is a fencing matter (the caller stops acknowledging and hands back).
 * - `TransportError`: no answer, connection trouble: the write is retried on `retry` (a
 *   `Schedule`). A retry after a write that the server stored but whose acknowledgement was
 *   lost meets its own document at the newer revision; that counts as written.
 */
import { JetStreamApiCodes, JetStreamApiError } from "@nats-io/jetstream"
import type { KV } from "@nats-io/kv"
import { Duration, Effect, Schedule, Schema } from "effect"
import { SnapshotConflict, SnapshotCorrupt, TransportError, messageOf } from "./errors.ts"
import { HandledIds } from "./mailbox.ts"
import { encodeJson } from "./protocol.ts"

/** The snapshot document in the state bucket. */
export const Snapshot = Schema.Struct({
  state: Schema.Unknown,
  handled: Schema.Array(Schema.String),
  incarnation: Schema.Number,
  at: Schema.Number
})

export interface SnapshotStoreOptions<S> {
  readonly kv: KV
  readonly key: string
  /** `kind/id`, for errors. */
  readonly actor: string
  /** The writer's incarnation number (its claim's, claim.ts). */
  readonly incarnation: number
  readonly schema: Schema.Codec<S, any>
  /** Retries of a write that failed in transport (default: 100 ms doubling, 5 retries). */
  readonly retry?: Schedule.Schedule<unknown, unknown>
  /** How long one write waits for the server's acknowledgement. */
  readonly timeoutMs?: number
  /** Keeps a snapshot that does not decode (its bytes, revision and why); default: drops it. */
  readonly quarantine?: (bytes: Uint8Array, revision: number, reason: string) => Effect.Effect<void, TransportError>
  /** After a quarantine: start from the initial state (default) or fail the restore. */
  readonly corrupt?: CorruptSnapshotPolicy
}

/** What an actor does with a snapshot that does not decode, once quarantined. */
export type CorruptSnapshotPolicy = "initial" | "escalate"

export interface Restored<S> {
  /** The stored state, or `undefined` when the actor has none yet. */
  readonly state: S | undefined
  readonly handled: HandledIds
  readonly revision: number
}

export interface SnapshotStore<S> {
  readonly restore: Effect.Effect<Restored<S>, TransportError | SnapshotCorrupt>
  /**
   * Encodes `state` and `handled` at the call (so the document is what they are now) and
   * returns the write of it.
   */
  readonly write: (state: S, handled: HandledIds) => Effect.Effect<void, SnapshotConflict | TransportError>
}

const defaultRetry = Schedule.exponential(Duration.millis(100)).pipe(Schedule.upTo({ times: 5 }))

const isWrongRevision = (e: unknown): boolean =>
  e instanceof JetStreamApiError &&
  (e.code === JetStreamApiCodes.StreamWrongLastSequence || e.code === JetStreamApiCodes.StreamWrongLastSequenceUnknown)

const sameBytes = (a: Uint8Array, b: Uint8Array) => a.length === b.length && a.every((x, i) => x === b[i])

/** One actor's snapshot store: its options, its state codec and the revision its next write must follow. */
interface Store<S> {
  readonly options: SnapshotStoreOptions<S>
  readonly codec: Schema.Codec<S, unknown>
  revision: number
}

const read = <S>({ options: { kv, key, actor } }: Store<S>, operation: string) =>
  Effect.tryPromise({
    try: () => kv.get(key),
    catch: (e) => new TransportError({ operation: `${operation} of ${actor}`, message: messageOf(e) })
  })

const decode = <S>(st: Store<S>, stored: { json: () => unknown }): Restored<S> | string => {
  try {
    const doc = Schema.decodeUnknownSync(Snapshot)(stored.json())
    return { state: Schema.decodeUnknownSync(st.codec)(doc.state) as S, handled: HandledIds.from(doc.handled), revision: st.revision }
  } catch (e) {
    return messageOf(e)
  }
}

/** The stored state; one that does not decode is quarantined, then the actor starts from its initial state or fails (`corrupt`). */
const restore = <S>(st: Store<S>) =>
  read(st, "read snapshot").pipe(
    Effect.flatMap((stored) => {
      const { options } = st
      if (stored === null || stored.operation !== "PUT") return Effect.succeed<Restored<S>>({ state: undefined, handled: new HandledIds(), revision: 0 })
      st.revision = stored.revision
      const revision = st.revision
      const restored = decode(st, stored)
      if (typeof restored !== "string") return Effect.succeed(restored)
      const reason = `snapshot of ${options.actor} (revision ${revision}) does not decode: ${restored}`
      return (options.quarantine?.(stored.value, revision, reason) ?? Effect.void).pipe(
        Effect.andThen(Effect.logError(`${reason}; quarantined, ${options.corrupt === "escalate" ? "failing the start" : "starting from the initial state"}`)),
        Effect.andThen(
          options.corrupt === "escalate"
            ? Effect.fail(new SnapshotCorrupt({ actor: options.actor, revision, reason }))
            : Effect.succeed<Restored<S>>({ state: undefined, handled: new HandledIds(), revision })
        )
      )
    })
  )

// One attempt; a wrong revision is ours when the stored bytes are the document we sent.
const attempt = <S>(st: Store<S>, doc: Uint8Array, expected: number) => {
  const { kv, key, actor, timeoutMs } = st.options
  return Effect.tryPromise({
    try: () => kv.put(key, doc, { previousSeq: expected, ...(timeoutMs ? { timeout: timeoutMs } : {}) }),
    catch: (e) => e
  }).pipe(
    Effect.catch((e) => {
      if (!isWrongRevision(e)) {
        return Effect.fail(new TransportError({ operation: `write snapshot of ${actor}`, message: messageOf(e) }))
      }
      return read(st, "check snapshot").pipe(
        Effect.flatMap((found) =>
          found !== null && sameBytes(found.value, doc)
            ? Effect.succeed(found.revision)
            : Effect.fail(new SnapshotConflict({ actor, expectedRevision: expected, writtenBy: writer(found) }))
        )
      )
    })
  )
}

const write = <S>(st: Store<S>) => {
  const encodeState = Schema.encodeSync(st.codec)
  return (state: S, handled: HandledIds) => {
    const doc = encodeJson({ state: encodeState(state), handled: handled.recent(), incarnation: st.options.incarnation, at: Date.now() })
    const expected = st.revision
    return attempt(st, doc, expected).pipe(
      Effect.retry({ schedule: st.options.retry ?? defaultRetry, while: (e) => e._tag === "TransportError" }),
      Effect.map((r) => {
        st.revision = r
      })
    )
  }
}

export const makeSnapshotStore = <S>(options: SnapshotStoreOptions<S>): SnapshotStore<S> => {
  const st: Store<S> = { options, codec: Schema.toCodecJson(options.schema), revision: 0 }
  return { restore: restore(st), write: write(st) }
}

const writer = (found: { json: () => unknown } | null): number | undefined => {
  if (found === null) return undefined
  try {
    return Schema.decodeUnknownSync(Snapshot)(found.json()).incarnation
  } catch {
    return undefined
  }
}
