/**
 * The registry of actors, nodes and leases (a KV bucket, key `kind/id`), its supervised watch,
 * and liveness.
 *
 * An entry is written by the claim that holds its address (claim.ts): on start, then every
 * `heartbeatMs` with its load figures; a node does the same under `node/<name>`.
 *
 * `watchRegistry` reports every entry, then every change, for the lifetime of a scope. It is
 * supervised: when the KV watch ends or fails, or falls behind (a probe every `probeEveryMs`
 * compares the last revision it delivered with the bucket's last sequence: a deleted watch
 * consumer stalls the client silently), it is reopened after a `Schedule` backoff and
 * resynchronised: every key is read again, newer entries are reported, and keys that vanished
 * meanwhile are reported as deleted. Revisions keep the reports in order across restarts.
 *
 * The liveness monitor remembers, on its own monotonic clock, when it last saw each entry
 * change (so clocks of different machines never matter). An entry that claims to be running
 * (or being placed) but has not changed for `deadAfterMs` is declared dead: the monitor marks
 * it `dead` with a compare-and-set on the revision it saw (so of several monitors exactly one
 * wins), publishes a `dead` system event and calls `onDead`. Leases (`lease/...`) keep their
 * own time-to-live (lease.ts) and are left alone.
 */
import { KvWatchInclude, type KV } from "@nats-io/kv"
import { Deferred, Duration, Effect, Schedule, Schema, type Scope } from "effect"
import { cappedBackoff } from "../common/retry.ts"
import { TransportError, messageOf } from "./errors.ts"
import { Dead, DeadEvent } from "./events.ts"
import { encodeJson } from "./protocol.ts"
import type { ActorSystemShape } from "./system.ts"

export const RegistryEntry = Schema.Struct({
  kind: Schema.String,
  id: Schema.String,
  /** The holder: the node hosting the actor (or, while `placing`, the node chosen to host it; a lease's holder). */
  node: Schema.String,
  /** Number of the activation; every claim writes the previous entry's + 1 (claim.ts). */
  incarnation: Schema.Number,
  status: Schema.Literals(["running", "placing", "stopped", "failed", "dead"]),
  /** Wall-clock milliseconds of the writer, for people reading the bucket. */
  heartbeatAt: Schema.Number,
  load: Schema.Record(Schema.String, Schema.Unknown)
})
export type RegistryEntry = typeof RegistryEntry.Type

export { DeadEvent }

/** An entry as stored: undefined when absent, deleted or unreadable; revision 0 when the key never existed. */
export interface StoredEntry {
  readonly entry: RegistryEntry | undefined
  readonly revision: number
}

const decodeEntry = Schema.decodeUnknownOption(RegistryEntry)

const entryOfKv = (e: { readonly operation: string; json: <T>() => T }): RegistryEntry | undefined => {
  if (e.operation !== "PUT") return undefined
  try {
    const decoded = decodeEntry(e.json())
    return decoded._tag === "Some" ? decoded.value : undefined
  } catch {
    return undefined
  }
}

/** Reads one entry. */
export const readEntry = (registry: KV, key: string) =>
  Effect.tryPromise({
    try: async (): Promise<StoredEntry> => {
      const e = await registry.get(key)
      return e === null ? { entry: undefined, revision: 0 } : { entry: entryOfKv(e), revision: e.revision }
    },
    catch: (e) => new TransportError({ operation: `registry get ${key}`, message: messageOf(e) })
  })

/** Reads every key of the registry that holds a value. */
const readAll = (registry: KV) =>
  Effect.tryPromise({
    try: async () => {
      const out = new Map<string, StoredEntry>()
      for await (const key of await registry.keys()) {
        const e = await registry.get(key)
        if (e !== null && e.operation === "PUT") out.set(key, { entry: entryOfKv(e), revision: e.revision })
      }
      return out
    },
    catch: (e) => new TransportError({ operation: "registry list", message: messageOf(e) })
  })

const lastSequence = (registry: KV) =>
  Effect.tryPromise({
    try: async () => (await registry.status()).streamInfo.state.last_seq,
    catch: (e) => new TransportError({ operation: "registry status", message: messageOf(e) })
  })

/** One change of the registry as a watcher sees it: the entry, or undefined when deleted or unreadable. */
export interface RegistryChange {
  readonly key: string
  readonly entry: RegistryEntry | undefined
  readonly revision: number
}

export interface WatchOptions {
  /** How often the watch is checked against the bucket's last sequence (default 2000 ms). */
  readonly probeEveryMs?: number
  /** Delay before each reopening (default exponential from 100 ms, at most 2 s, jittered). */
  readonly backoff?: Schedule.Schedule<unknown, unknown>
}

const defaultBackoff = cappedBackoff(Duration.millis(100), Duration.seconds(2)).pipe(Schedule.jittered)

type Report = (key: string, entry: RegistryEntry | undefined, revision: number, present: boolean) => void

/**
 * Hands changes to `onChange` at most once each, in revision order per key, across watch
 * sessions: it remembers what it last reported per key, deletions included. A deletion found
 * by a resynchronisation has no revision (0).
 */
const orderedReports = (onChange: (change: RegistryChange) => void) => {
  const known = new Map<string, { revision: number; present: boolean }>()
  const report: Report = (key, entry, revision, present) => {
    const k = known.get(key)
    if (k !== undefined && (revision > 0 ? k.revision >= revision : !k.present)) return
    if (k === undefined && !present) return
    known.set(key, { revision: Math.max(revision, k?.revision ?? 0), present })
    try {
      onChange({ key, entry, revision })
    } catch (e) {
      Effect.runFork(Effect.logError(`registry watcher failed on ${key}`, e))
    }
  }
  const present = () => [...known].filter(([, k]) => k.present).map(([key]) => key)
  return { report, present }
}

/**
 * One session: opens a watch of updates, reads every key (reporting newer entries and the
 * deletion of keys gone meanwhile), runs `onSynced`, then fails when the watch ends or fails, or
 * when a probe finds it behind the bucket's last sequence.
 */
const watchSession = (registry: KV, reports: ReturnType<typeof orderedReports>, probeEveryMs: number, onSynced: Effect.Effect<void>) =>
  Effect.gen(function* () {
    const watch = yield* Effect.acquireRelease(
      Effect.tryPromise({
        try: () => registry.watch({ include: KvWatchInclude.UpdatesOnly }),
        catch: (e) => new TransportError({ operation: "registry watch", message: messageOf(e) })
      }),
      (w) => Effect.sync(() => w.stop())
    )
    // Everything up to here is read below; everything after arrives through the watch.
    let delivered = yield* lastSequence(registry)
    const touched = new Set<string>()
    const ended = yield* Deferred.make<never, TransportError>()
    yield* Effect.forkScoped(
      Effect.promise(async () => {
        try {
          for await (const e of watch) {
            touched.add(e.key)
            delivered = Math.max(delivered, e.revision)
            reports.report(e.key, entryOfKv(e), e.revision, e.operation === "PUT")
          }
          return "the watch ended"
        } catch (e) {
          return `the watch failed: ${messageOf(e)}`
        }
      }).pipe(Effect.flatMap((why) => Deferred.fail(ended, new TransportError({ operation: "registry watch", message: why }))))
    )
    const all = yield* readAll(registry)
    for (const [key, stored] of all) reports.report(key, stored.entry, stored.revision, true)
    for (const key of reports.present()) if (!all.has(key) && !touched.has(key)) reports.report(key, undefined, 0, false)
    yield* onSynced

    const probe = Effect.gen(function* () {
      let expected = yield* lastSequence(registry)
      while (true) {
        yield* Effect.sleep(Duration.millis(probeEveryMs))
        if (delivered < expected) {
          return yield* Effect.fail(new TransportError({ operation: "registry watch", message: `behind: revision ${delivered} delivered, ${expected} stored` }))
        }
        expected = yield* lastSequence(registry)
      }
    })
    return yield* Effect.raceFirst(Deferred.await(ended), probe)
  }).pipe(Effect.scoped)

/**
 * Calls `onChange` for every entry of the registry, then for every change, for the lifetime of
 * the scope; returns once the first full read has been reported. Restarts and resynchronises
 * itself (after `backoff`) when the watch ends, fails or falls behind.
 */
export const watchRegistry = (
  system: ActorSystemShape,
  onChange: (change: RegistryChange) => void,
  options: WatchOptions = {}
): Effect.Effect<void, TransportError, Scope.Scope> =>
  Effect.gen(function* () {
    const synced = yield* Deferred.make<void, TransportError>()
    let everSynced = false
    const onSynced = Effect.suspend(() => {
      everSynced = true
      return Deferred.succeed(synced, undefined)
    })
    const session = watchSession(system.registry, orderedReports(onChange), options.probeEveryMs ?? 2000, Effect.asVoid(onSynced))
    yield* Effect.forkScoped(
      session.pipe(
        // A failure before the first full read fails the caller; later ones restart the watch.
        Effect.tapError((e) => (everSynced ? Effect.logWarning(`registry watch restarts: ${e.message}`) : Deferred.fail(synced, e))),
        Effect.retry({ schedule: options.backoff ?? defaultBackoff, while: () => everSynced })
      )
    )
    yield* Deferred.await(synced)
  })

/** An entry as a watcher last saw it, and when (`performance.now()`) it last changed. */
export interface Observed {
  readonly entry: RegistryEntry
  readonly revision: number
  readonly at: number
}

/** The registry as this process sees it, kept by one supervised watch. */
export interface RegistryView {
  readonly get: (key: string) => Observed | undefined
  readonly entries: () => IterableIterator<[string, Observed]>
}

/** Keeps a view of the registry for the lifetime of the scope. */
export const viewRegistry = (system: ActorSystemShape, options?: WatchOptions) =>
  Effect.gen(function* () {
    const seen = new Map<string, Observed>()
    yield* watchRegistry(
      system,
      ({ key, entry, revision }) => {
        if (entry === undefined) seen.delete(key)
        else seen.set(key, { entry, revision, at: performance.now() })
      },
      options
    )
    return { get: (key) => seen.get(key), entries: () => seen.entries() } satisfies RegistryView
  })

export interface LivenessOptions {
  readonly deadAfterMs: number
  /**
   * This process's own beating entry (its node's): after this process lost its connection, or
   * while its own entry looks silent (`ownSilentMs`), nobody is judged silent until its own next
   * beat has reached the registry, and silence is counted from that beat. A process that could
   * not write could not see others write either (a restarted server answers requests only once
   * its JetStream has recovered; a cluster's registry stream answers none while it elects a
   * leader).
   */
  readonly self?: string
  /** How often `self` beats (its node's heartbeat); see `ownSilentMs`. */
  readonly selfEveryMs?: number
  readonly checkEveryMs?: number
  readonly onDead?: (event: DeadEvent) => Effect.Effect<void>
}

/** Expects a beat from an entry with this status (a placement expects the chosen node's claim). */
const expectsBeat = (status: RegistryEntry["status"]) => status === "running" || status === "placing"

/**
 * How long this process's own entry may look unchanged before it doubts its view: half the
 * dead-after time, and at least two of its beats.
 */
const ownSilentMs = (options: LivenessOptions) => Math.max(options.deadAfterMs / 2, 2 * (options.selfEveryMs ?? 0))

/**
 * Since when (`performance.now()`) this process has seen the registry whole: 0 while it never
 * lost sight, undefined from losing it until its own entry `self` next changes (then that
 * change's time). It loses sight at a disconnect, and when its own running entry has looked
 * unchanged for `silentMs`: then its own beats are not landing or not reaching its watch (the
 * registry's stream has no leader while a cluster elects one after a server's loss, and every
 * write fails for seconds), so the others' silence is no evidence either. Without `self`,
 * nothing is tracked.
 */
const watchOwnSight = (system: ActorSystemShape, view: RegistryView, self: string | undefined, silentMs: number) =>
  Effect.gen(function* () {
    let lostAt: number | undefined
    let since = 0
    if (self !== undefined) {
      const status = system.nats.nc.status()
      yield* Effect.forkScoped(
        Effect.promise(async () => {
          for await (const s of status) if (s.type === "disconnect" || s.type === "staleConnection") lostAt = performance.now()
        })
      )
    }
    return (): number | undefined => {
      if (self === undefined) return since
      const own = view.get(self)
      const now = performance.now()
      if (lostAt === undefined && own !== undefined && expectsBeat(own.entry.status) && now - Math.max(own.at, since) > silentMs) lostAt = now
      if (lostAt === undefined) return since
      if (own === undefined || own.at <= lostAt) return undefined
      lostAt = undefined
      since = own.at
      return since
    }
  })

/** Declares silent entries of the view dead, for the lifetime of the scope. */
export const monitorLiveness = (system: ActorSystemShape, view: RegistryView, options: LivenessOptions) =>
  Effect.gen(function* () {
    const tried = new Map<string, number>()
    const sight = yield* watchOwnSight(system, view, options.self, ownSilentMs(options))
    const check = Effect.gen(function* () {
      const now = performance.now()
      const since = sight()
      if (since === undefined) return
      for (const [key, s] of view.entries()) {
        const silentFor = now - Math.max(s.at, since)
        if (!expectsBeat(s.entry.status) || key.startsWith("lease/") || silentFor < options.deadAfterMs || tried.get(key) === s.revision) continue
        tried.set(key, s.revision)
        const dead: RegistryEntry = { ...s.entry, status: "dead" }
        const won = yield* Effect.promise(() =>
          system.registry.update(key, encodeJson(dead), s.revision).then(() => true, () => false)
        )
        if (!won) continue
        const event: DeadEvent = {
          kind: s.entry.kind,
          id: s.entry.id,
          node: s.entry.node,
          incarnation: s.entry.incarnation,
          silentForMs: Math.round(silentFor)
        }
        yield* system.publishEvent(Dead, event).pipe(Effect.catchCause((c) => Effect.logWarning("dead event not published", c)))
        if (options.onDead) yield* options.onDead(event)
      }
    })
    yield* Effect.forkScoped(
      check.pipe(Effect.repeat(Schedule.spaced(Duration.millis(options.checkEveryMs ?? Math.max(100, options.deadAfterMs / 4)))))
    )
  })
