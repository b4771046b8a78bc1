/**
 * The registry of live actors and nodes (a KV bucket, key `kind/id`) and liveness.
 *
 * Every incarnation writes its entry on start and then every `heartbeatMs` (with its load
 * figures); a node does the same under `node/<name>`. The liveness monitor watches the
 * bucket and remembers, on its own monotonic clock, when it last saw each entry change (so
 * clocks of different machines never matter). An entry that claims to be running but has not
 * changed for `deadAfterMs` is declared dead: the monitor marks it `dead` with a
 * compare-and-set on the revision it saw (so of several monitors exactly one wins), publishes
 * a `dead` system event to the journal and calls `onDead`.
 */
import type { KV } from "@nats-io/kv"
import { Duration, Effect, Schedule, Schema } from "effect"
import { TransportError, messageOf } from "./errors.ts"
import { encodeJson } from "./protocol.ts"
import type { ActorSystemShape } from "./system.ts"

export const RegistryEntry = Schema.Struct({
  kind: Schema.String,
  id: Schema.String,
  node: Schema.String,
  incarnation: Schema.String,
  status: Schema.Literals(["running", "stopped", "failed", "dead"]),
  /** Wall-clock milliseconds of the writer, for people reading the bucket. */
  heartbeatAt: Schema.Number,
  load: Schema.Record(Schema.String, Schema.Unknown)
})
export type RegistryEntry = typeof RegistryEntry.Type

/** The `dead` system event. */
export const DeadEvent = Schema.Struct({
  kind: Schema.String,
  id: Schema.String,
  node: Schema.String,
  incarnation: Schema.String,
  silentForMs: Schema.Number
})
export type DeadEvent = typeof DeadEvent.Type

export const writeEntry = (registry: KV, key: string, entry: RegistryEntry) =>
  Effect.tryPromise({
    try: () => registry.put(key, encodeJson(entry)),
    catch: (e) => new TransportError({ operation: `registry put ${key}`, message: messageOf(e) })
  }).pipe(Effect.asVoid)

/** Re-writes the entry every `everyMs` until interrupted; a failed write is logged and retried next beat. */
export const heartbeatLoop = (registry: KV, key: string, entry: () => RegistryEntry, everyMs: number) =>
  Effect.suspend(() => writeEntry(registry, key, entry())).pipe(
    Effect.catchCause((cause) => Effect.logWarning(`heartbeat of ${key} failed`, cause)),
    Effect.repeat(Schedule.spaced(Duration.millis(everyMs))),
    Effect.asVoid
  )

/** Reads every entry of the registry. */
export const listEntries = (registry: KV) =>
  Effect.tryPromise({
    try: async () => {
      const out: Array<RegistryEntry> = []
      for await (const key of await registry.keys()) {
        const e = await registry.get(key)
        if (e !== null && e.operation === "PUT") {
          const decoded = Schema.decodeUnknownOption(RegistryEntry)(e.json())
          if (decoded._tag === "Some") out.push(decoded.value)
        }
      }
      return out
    },
    catch: (e) => new TransportError({ operation: "registry list", message: messageOf(e) })
  })

export interface LivenessOptions {
  readonly deadAfterMs: number
  readonly checkEveryMs?: number
  readonly onDead?: (event: DeadEvent) => Effect.Effect<void>
}

/** One change of the registry as a watcher sees it: the entry, or undefined when deleted or unreadable. */
export interface RegistryChange {
  readonly key: string
  readonly entry: RegistryEntry | undefined
  readonly revision: number
}

const decodeEntry = Schema.decodeUnknownOption(RegistryEntry)

/**
 * Calls `onChange` for every entry of the registry, then for every change, for the lifetime
 * of the scope (the watch stops when it closes).
 */
export const watchRegistry = (system: ActorSystemShape, onChange: (change: RegistryChange) => void) =>
  Effect.gen(function* () {
    const watch = yield* Effect.acquireRelease(
      Effect.tryPromise({
        try: () => system.registry.watch(),
        catch: (e) => new TransportError({ operation: "registry watch", message: messageOf(e) })
      }),
      (w) => Effect.sync(() => w.stop())
    )
    yield* Effect.forkScoped(
      Effect.promise(async () => {
        for await (const e of watch) {
          const decoded = e.operation === "PUT" ? decodeEntry(e.json()) : undefined
          onChange({ key: e.key, entry: decoded?._tag === "Some" ? decoded.value : undefined, revision: e.revision })
        }
      })
    )
  })

/** Watches the registry for the lifetime of the scope and declares silent entries dead. */
export const monitorLiveness = (system: ActorSystemShape, options: LivenessOptions) =>
  Effect.gen(function* () {
    const seen = new Map<string, { entry: RegistryEntry; revision: number; at: number }>()
    yield* watchRegistry(system, ({ key, entry, revision }) => {
      if (entry === undefined) seen.delete(key)
      else seen.set(key, { entry, revision, at: performance.now() })
    })
    const check = Effect.gen(function* () {
      const now = performance.now()
      for (const [key, s] of seen) {
        if (s.entry.status !== "running" || now - s.at < options.deadAfterMs) continue
        const dead: RegistryEntry = { ...s.entry, status: "dead" }
        const won = yield* Effect.promise(() =>
          system.registry.update(key, encodeJson(dead), s.revision).then(() => true, () => false)
        )
        seen.delete(key)
        if (!won) continue
        const event: DeadEvent = {
          kind: s.entry.kind,
          id: s.entry.id,
          node: s.entry.node,
          incarnation: s.entry.incarnation,
          silentForMs: Math.round(now - s.at)
        }
        yield* system.publishEvent("dead", event).pipe(Effect.catchCause((c) => Effect.logWarning("dead event not published", c)))
        if (options.onDead) yield* options.onDead(event)
      }
    })
    yield* Effect.forkScoped(
      check.pipe(Effect.repeat(Schedule.spaced(Duration.millis(options.checkEveryMs ?? Math.max(100, options.deadAfterMs / 4)))))
    )
  })
