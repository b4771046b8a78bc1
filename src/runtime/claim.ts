/**
 * One activation per address: a claim on `kind/id` in the registry bucket (leases, lease.ts,
 * are claims too).
 *
 * The claim is the registry entry itself, written with compare-and-set on the KV revision. It
 * names the holder (a node, or a lease holder) and an incarnation number, one more than that of
 * the entry it replaces. The address is free for holder H when it has no entry, when its entry
 * is `stopped`, `failed` or `dead`, or when the entry is H's own (`running`: H restarts it;
 * `placing`: the re-placement chose H). Held by anyone else, the claimant watches the entry on
 * its own monotonic clock: a change (a heartbeat) proves the holder alive, and `acquire` fails
 * with `AddressClaimed` (or, for a lease standby, keeps waiting); no change for `silentMs`
 * means the holder is gone, and the claimant takes the entry with a compare-and-set on the
 * revision it watched, so of several claimants exactly one wins.
 *
 * The holder renews the claim every beat with a compare-and-set on its last revision (each
 * renewal cut short after a beat, at least 1 s, so that one lost in a connection cut does not
 * silence the holder for the client's request timeout). A renewal
 * that finds the entry changed by someone else (a newer incarnation, a death mark) has lost the
 * claim: `held()` turns false and `lost` completes; the incarnation then stops handling and
 * acknowledging (host.ts). Actors are fenced on that evidence only: a holder that cannot reach
 * NATS can neither receive nor acknowledge. A lease also steps down after `stepDownAfterMs`
 * without a successful renewal, counted from when that renewal was sent, so it is never held
 * past the moment a standby may take it (both count on monotonic clocks; their rates agree).
 */
import { JetStreamApiCodes, JetStreamApiError } from "@nats-io/jetstream"
import type { KV } from "@nats-io/kv"
import { Deferred, Duration, Effect, Schema } from "effect"
import { TransportError, messageOf } from "./errors.ts"
import { formatAddress, type ActorAddress } from "./names.ts"
import { encodeJson } from "./protocol.ts"
import { readEntry, type RegistryEntry, type StoredEntry } from "./registry.ts"

/** The address is held by a live holder: its node (or lease holder) and incarnation. */
export class AddressClaimed extends Schema.TaggedError<AddressClaimed>()("AddressClaimed", {
  address: Schema.String,
  node: Schema.String,
  incarnation: Schema.Number,
  status: Schema.String
}) {}

export interface AcquireOptions {
  /** The claimant: a node name, or a lease holder's name. Unique among claimants. */
  readonly holder: string
  /** How long the entry of another holder must stay unchanged before it is taken over. */
  readonly silentMs: number
  /** `refuse`: fail with `AddressClaimed` once the holder shows it is alive; `wait`: keep waiting. */
  readonly whenHeld: "refuse" | "wait"
  /** How often a held entry is read while watching it (default silentMs / 8, 20..250 ms). */
  readonly pollMs?: number
  /** The load the claim's first entry carries (default none; `renew` writes it afterwards). */
  readonly load?: Readonly<Record<string, unknown>>
}

export interface RenewOptions {
  /** Lose the claim when no renewal succeeded for this long (leases); absent = only on evidence. */
  readonly stepDownAfterMs?: number
}

export interface Claim {
  readonly address: ActorAddress
  readonly holder: string
  readonly incarnation: number
  /** False once the claim was lost or released. */
  readonly held: () => boolean
  /** Completes when the claim is lost to someone else (never on release). */
  readonly lost: Effect.Effect<void>
  /** Renews the entry every `everyMs` with the load figures until interrupted or lost. */
  readonly renew: (load: () => Readonly<Record<string, unknown>>, everyMs: number, options?: RenewOptions) => Effect.Effect<void>
  /** Writes a last status if the claim is still held; afterwards it is not. */
  readonly release: (status: "stopped" | "failed") => Effect.Effect<void>
}

/** How long one renewal may take: a beat, at least 1 s. */
export const renewalTimeoutMs = (everyMs: number) => Math.max(everyMs, 1000)

const isConflict = (e: unknown): boolean =>
  e instanceof JetStreamApiError &&
  (e.code === JetStreamApiCodes.StreamWrongLastSequence || e.code === JetStreamApiCodes.StreamWrongLastSequenceUnknown)

/** True when `holder` may take an address whose entry is `entry`. */
export const isFreeFor = (entry: RegistryEntry | undefined, holder: string): boolean =>
  entry === undefined || entry.status === "stopped" || entry.status === "failed" || entry.status === "dead" || entry.node === holder

const entryOf = (at: ActorAddress, holder: string, incarnation: number, status: RegistryEntry["status"], load: Readonly<Record<string, unknown>>): RegistryEntry => ({
  kind: at.kind,
  id: at.id,
  node: holder,
  incarnation,
  status,
  heartbeatAt: Date.now(),
  load
})

/** Writes `doc` over `current` with compare-and-set; the new revision, or undefined on a conflict. */
const writeOver = (registry: KV, key: string, current: StoredEntry, doc: RegistryEntry) =>
  Effect.tryPromise({
    try: () =>
      (current.revision === 0 ? registry.create(key, encodeJson(doc)) : registry.update(key, encodeJson(doc), current.revision)).then(
        (revision): number | undefined => revision,
        (e) => {
          if (isConflict(e)) return undefined
          throw e
        }
      ),
    catch: (e) => new TransportError({ operation: `claim ${key}`, message: messageOf(e) })
  })

/** A claim as its holder keeps it: the entry's last revision, whether it is held, and when a renewal last succeeded. */
interface Held {
  readonly registry: KV
  readonly at: ActorAddress
  /** `kind/id`. */
  readonly key: string
  readonly holder: string
  readonly incarnation: number
  readonly lostSignal: Deferred.Deferred<void>
  revision: number
  held: boolean
  /** When the last successful renewal was sent (monotonic). */
  lastRenewedAt: number
}

const lose = (h: Held, why: string) =>
  Effect.gen(function* () {
    if (!h.held) return
    h.held = false
    yield* Effect.logWarning(`${h.key}: incarnation ${h.incarnation} of ${h.holder} lost its claim: ${why}`)
    yield* Deferred.succeed(h.lostSignal, undefined)
  })

// Writes this claim's entry over its last revision. A conflict is still ours when the entry
// names this incarnation (an earlier write landed but its reply was lost or interrupted):
// then it is written over the revision read. Else someone else wrote it: the reason.
const writeOwn = (h: Held, status: RegistryEntry["status"], load: Readonly<Record<string, unknown>>) =>
  Effect.gen(function* () {
    const doc = entryOf(h.at, h.holder, h.incarnation, status, load)
    const written = yield* writeOver(h.registry, h.key, { entry: undefined, revision: h.revision }, doc)
    if (written !== undefined) {
      h.revision = written
      return undefined
    }
    const now = yield* readEntry(h.registry, h.key)
    const e = now.entry
    if (e === undefined || e.node !== h.holder || e.incarnation !== h.incarnation || e.status !== "running") {
      return `the entry now says ${e === undefined ? "nothing" : `${e.status} by ${e.node}, incarnation ${e.incarnation}`}`
    }
    h.revision = now.revision
    const again = yield* writeOver(h.registry, h.key, now, doc)
    if (again !== undefined) h.revision = again
    return undefined
  })

// A renewal waits at most `renewalTimeoutMs(everyMs)`: one whose request or reply was lost
// (a connection cut) would otherwise hold up the beat for the client's whole request
// timeout (5 s, as long as GYRE_DEAD_AFTER_MS) after the connection is back. A renewal cut
// short may still land: the next one then finds its own entry and writes over it (writeOwn).
const renewOnce = (h: Held, load: Readonly<Record<string, unknown>>, everyMs: number) =>
  Effect.gen(function* () {
    const sentAt = performance.now()
    const lostBecause = yield* writeOwn(h, "running", load).pipe(Effect.timeout(Duration.millis(renewalTimeoutMs(everyMs))))
    if (lostBecause !== undefined) return yield* lose(h, lostBecause)
    h.lastRenewedAt = sentAt
  }).pipe(Effect.catch((e) => Effect.logWarning(`${h.key}: renewal failed`, e)))

const renew = (h: Held): Claim["renew"] => (load, everyMs, options) => {
  const beat = Effect.gen(function* () {
    while (h.held) {
      yield* Effect.sleep(Duration.millis(everyMs))
      if (h.held) yield* renewOnce(h, load(), everyMs)
    }
  })
  const stepDownAfterMs = options?.stepDownAfterMs
  if (stepDownAfterMs === undefined) return beat
  const watchdog = Effect.gen(function* () {
    while (h.held) {
      yield* Effect.sleep(Duration.millis(Math.max(10, everyMs / 4)))
      if (performance.now() - h.lastRenewedAt > stepDownAfterMs) yield* lose(h, `no renewal succeeded for ${stepDownAfterMs} ms`)
    }
  })
  return Effect.raceFirst(beat, watchdog)
}

const release = (h: Held): Claim["release"] => (status) =>
  Effect.gen(function* () {
    if (!h.held) return
    h.held = false
    const lostBecause = yield* writeOwn(h, status, {})
    if (lostBecause !== undefined) yield* Effect.logWarning(`${h.key}: not released as ${status}: ${lostBecause}`)
  }).pipe(Effect.catch((e) => Effect.logWarning(`${h.key}: release as ${status} failed`, e)))

const makeClaim = (registry: KV, at: ActorAddress, holder: string, incarnation: number, revision: number) =>
  Effect.gen(function* () {
    const h: Held = { registry, at, key: formatAddress(at), holder, incarnation, lostSignal: yield* Deferred.make<void>(), revision, held: true, lastRenewedAt: performance.now() }
    return { address: at, holder, incarnation, held: () => h.held, lost: Deferred.await(h.lostSignal), renew: renew(h), release: release(h) } satisfies Claim
  })

/** Polls `key` until its revision moves from `seen.revision` (the new entry) or `silentMs` pass (undefined). */
const awaitChange = (registry: KV, key: string, seen: StoredEntry, silentMs: number, pollMs: number) =>
  Effect.gen(function* () {
    const since = performance.now()
    while (performance.now() - since < silentMs) {
      yield* Effect.sleep(Duration.millis(pollMs))
      const now = yield* readEntry(registry, key)
      if (now.revision !== seen.revision) return now
    }
    return undefined
  })

/**
 * Claims `at` for `options.holder`: the claim with its incarnation number, or `AddressClaimed`
 * naming the live holder (only with `whenHeld: "refuse"`).
 */
export const acquire = Effect.fn("Claim.acquire")(function* (registry: KV, at: ActorAddress, options: AcquireOptions) {
  const key = formatAddress(at)
  const pollMs = options.pollMs ?? Math.max(20, Math.min(250, options.silentMs / 8))
  let current = yield* readEntry(registry, key)
  while (true) {
    if (!isFreeFor(current.entry, options.holder)) {
      const changed = yield* awaitChange(registry, key, current, options.silentMs, pollMs)
      if (changed !== undefined) {
        const e = changed.entry
        if (options.whenHeld === "refuse" && e !== undefined && e.status === "running" && e.node !== options.holder) {
          return yield* Effect.fail(new AddressClaimed({ address: key, node: e.node, incarnation: e.incarnation, status: e.status }))
        }
        current = changed
        continue
      }
      yield* Effect.logWarning(`${key}: ${current.entry!.node} (incarnation ${current.entry!.incarnation}) silent for ${options.silentMs} ms; taking over`)
    }
    const incarnation = (current.entry?.incarnation ?? 0) + 1
    const revision = yield* writeOver(registry, key, current, entryOf(at, options.holder, incarnation, "running", options.load ?? {}))
    if (revision !== undefined) return yield* makeClaim(registry, at, options.holder, incarnation, revision)
    current = yield* readEntry(registry, key)
  }
})

/** True when the registry names `incarnation` as the running activation of `sender` (`kind/id`). */
export const isCurrent = (registry: KV, sender: string, incarnation: number) =>
  readEntry(registry, sender).pipe(
    Effect.map(({ entry }) => entry !== undefined && entry.status === "running" && entry.incarnation === incarnation)
  )
