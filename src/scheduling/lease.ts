/**
 * Leadership by a lease: one compare-and-set record in a KV bucket, until the runtime's
 * `src/runtime/lease.ts` lands (then this module goes and its callers take that one).
 *
 * The record is `{holder, term, released}`. A candidate takes it when it is missing (term 1),
 * released, or has not changed for `ttlMs` on the candidate's own monotonic clock (so machine
 * clocks never matter), each time with a compare-and-set on the revision it read and the term
 * one higher; of several candidates exactly one wins. The holder renews every `ttlMs / 4`
 * (compare-and-set on its last revision) and counts itself deposed when the record names
 * another holder or term, or when no renewal has succeeded for `ttlMs / 2`: earlier than any
 * standby can take over. Closing the leadership's scope releases the record, so a standby takes
 * over at once after a graceful stop; a killed holder's record lapses after `ttlMs`.
 */
import type { KV } from "@nats-io/kv"
import { Deferred, Duration, Effect, Schedule, Schema, type Scope } from "effect"
import { TransportError, messageOf } from "../runtime/errors.ts"
import { encodeJson } from "../runtime/protocol.ts"

/** What the holder of a lease knows. */
export interface Leadership {
  readonly holder: string
  /** Increases with every change of holder (records written under it carry it). */
  readonly term: number
  /** Completes when the lease is lost (another holder took it, or renewals stopped working). */
  readonly lost: Effect.Effect<void>
}

export interface Lease {
  /** Waits until this candidate holds the lease; it is held (and renewed) for the scope's lifetime. */
  readonly acquire: Effect.Effect<Leadership, TransportError, Scope.Scope>
}

export interface KvLeaseOptions {
  readonly kv: KV
  readonly key: string
  /** Unique per candidate (per process and start). */
  readonly holder: string
  readonly ttlMs: number
}

const LeaseRecord = Schema.Struct({ holder: Schema.String, term: Schema.Int, released: Schema.Boolean })
type LeaseRecord = typeof LeaseRecord.Type
const decodeRecord = Schema.decodeUnknownOption(LeaseRecord)

/** A lease on `key` of `kv`. */
export const kvLease = (options: KvLeaseOptions): Lease => {
  const { kv, key, holder, ttlMs } = options
  const fail = (operation: string) => (e: unknown) => new TransportError({ operation: `lease ${key}: ${operation}`, message: messageOf(e) })
  const read = Effect.tryPromise({
    try: async () => {
      const e = await kv.get(key)
      if (e === null || e.operation !== "PUT") return undefined
      const record = decodeRecord(e.json())
      return { revision: e.revision, record: record._tag === "Some" ? record.value : { holder: "", term: 0, released: true } }
    },
    catch: fail("read")
  })
  /** The new revision, or undefined when another writer came first. */
  const write = (record: LeaseRecord, revision: number | undefined) =>
    Effect.promise(() =>
      (revision === undefined ? kv.create(key, encodeJson(record)) : kv.update(key, encodeJson(record), revision)).then(
        (r) => r,
        () => undefined
      )
    )

  const take = Effect.gen(function* () {
    let seen: { revision: number; at: number } | undefined
    while (true) {
      const current = yield* read
      const now = performance.now()
      if (current !== undefined && seen?.revision !== current.revision) seen = { revision: current.revision, at: now }
      const free = current === undefined || current.record.released || now - seen!.at >= ttlMs
      if (free) {
        const term = (current?.record.term ?? 0) + 1
        const revision = yield* write({ holder, term, released: false }, current?.revision)
        if (revision !== undefined) return { term, revision }
      } else yield* Effect.sleep(Duration.millis(ttlMs / 4))
    }
  })

  const acquire = Effect.gen(function* () {
    const won = yield* take
    const lost = yield* Deferred.make<void>()
    let revision = won.revision
    let renewedAt = performance.now()
    const mine = (r: LeaseRecord) => r.holder === holder && r.term === won.term && !r.released
    const renew = Effect.gen(function* () {
      const started = performance.now()
      const next = yield* write({ holder, term: won.term, released: false }, revision)
      if (next !== undefined) {
        revision = next
        renewedAt = started
        return
      }
      // Our last write may have landed without our seeing it: the record tells.
      const current = yield* read.pipe(Effect.orElseSucceed(() => null))
      if (current === undefined || (current !== null && !mine(current.record))) return yield* Deferred.succeed(lost, undefined)
      if (current !== null) revision = current.revision
      if (performance.now() - renewedAt > ttlMs / 2) yield* Deferred.succeed(lost, undefined)
    })
    yield* Effect.forkScoped(
      renew.pipe(
        Effect.repeat({ schedule: Schedule.spaced(Duration.millis(ttlMs / 4)), until: () => Deferred.isDoneUnsafe(lost) })
      )
    )
    yield* Effect.addFinalizer(() =>
      Deferred.isDoneUnsafe(lost) ? Effect.void : write({ holder, term: won.term, released: true }, revision).pipe(Effect.asVoid)
    )
    return { holder, term: won.term, lost: Deferred.await(lost) } satisfies Leadership
  })

  return { acquire }
}
