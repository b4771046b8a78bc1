/**
 * The gateway's view of the run's rollout workers, kept from a watch on the registry: the
 * `rollout-worker/*` entries (`gyre serve`) and the `device/*` entries (devices that switch
 * between rollout and training; their load is a `DeviceLoad`).
 *
 * A worker is alive while its entry says `running` and changed (a heartbeat) within
 * `deadAfterMs` on this process's monotonic clock, so a worker whose process was killed is
 * given up after `deadAfterMs` even before a liveness monitor marks it dead. It is usable
 * (takes new executions) while alive, its load does not say `draining` and, for a device, its
 * role is `rollout`. A device that is leaving rollout (`switching` to training) is not usable
 * but still `keeps` the executions routed to it: their calls go there and are answered once
 * their contexts have moved (the gateway is then told where). `pick` returns the usable worker
 * with the lowest load: the caller's own figure for it (requests in flight, executions pinned
 * to it) plus the active sequences it last reported.
 */
import { Duration, Effect, Schema, type Scope } from "effect"
import type { TransportError } from "../runtime/errors.ts"
import { watchRegistry, type RegistryEntry } from "../runtime/registry.ts"
import type { ActorSystemShape } from "../runtime/system.ts"
import { DEVICE_KIND, DeviceLoad } from "../protocols/device.ts"
import { WorkerLoad } from "../protocols/rollout.ts"

/** Kinds whose registry entries serve `RolloutWorkerProtocol`. */
const KINDS = ["rollout-worker", DEVICE_KIND]

/** A worker's load: a rollout worker's, or a device's with its role. */
const RoutingLoad = Schema.Struct({
  ...WorkerLoad.fields,
  role: Schema.optional(DeviceLoad.fields.role),
  switching: Schema.optional(Schema.Boolean)
})
type RoutingLoad = typeof RoutingLoad.Type

export interface WorkerView {
  /** `rollout-worker/<id>` or `device/<id>` */
  readonly key: string
  readonly id: string
  readonly node: string
  readonly status: RegistryEntry["status"]
  readonly load: RoutingLoad | undefined
  /** `performance.now()` when the entry last changed. */
  readonly seenAt: number
}

export interface WorkerDirectory {
  readonly alive: (key: string) => boolean
  readonly usable: (key: string) => boolean
  /** Usable, or a device leaving rollout: calls of executions routed to it still go there. */
  readonly keeps: (key: string) => boolean
  /** The least loaded usable worker not in `exclude`; `localLoad` adds the caller's own figure. */
  readonly pick: (exclude: ReadonlySet<string>, localLoad: (key: string) => number) => WorkerView | undefined
  /** Completes once the worker is no longer alive (checked every 100 ms). */
  readonly awaitDeath: (key: string) => Effect.Effect<void>
  readonly workers: () => ReadonlyArray<WorkerView>
}

const decodeLoad = Schema.decodeUnknownOption(RoutingLoad)

/** Watches the registry for the lifetime of the scope. */
export const watchWorkers = (
  system: ActorSystemShape,
  options: { readonly deadAfterMs: number }
): Effect.Effect<WorkerDirectory, TransportError, Scope.Scope> =>
  Effect.gen(function* () {
    const views = new Map<string, WorkerView>()
    yield* watchRegistry(system, ({ key, entry }) => {
      if (!KINDS.some((kind) => key.startsWith(`${kind}/`))) return
      if (entry === undefined) {
        views.delete(key)
        return
      }
      const load = decodeLoad(entry.load)
      views.set(key, {
        key,
        id: entry.id,
        node: entry.node,
        status: entry.status,
        load: load._tag === "Some" ? load.value : undefined,
        seenAt: performance.now()
      })
    })

    const alive = (key: string) => {
      const v = views.get(key)
      return v !== undefined && v.status === "running" && performance.now() - v.seenAt < options.deadAfterMs
    }
    const usable = (key: string) => {
      const load = views.get(key)?.load
      return alive(key) && load?.draining !== true && (load?.role ?? "rollout") === "rollout"
    }
    const keeps = (key: string) => usable(key) || (alive(key) && views.get(key)!.load?.switching === true && views.get(key)!.load?.role === "training")

    const pick: WorkerDirectory["pick"] = (exclude, localLoad) => {
      let best: WorkerView | undefined
      let bestScore = Infinity
      for (const v of views.values()) {
        if (exclude.has(v.key) || !usable(v.key)) continue
        const score = localLoad(v.key) + (v.load?.activeSequences ?? 0)
        if (score < bestScore) {
          best = v
          bestScore = score
        }
      }
      return best
    }

    const awaitDeath = (key: string) =>
      Effect.gen(function* () {
        while (alive(key)) yield* Effect.sleep(Duration.millis(100))
      })

    return { alive, usable, keeps, pick, awaitDeath, workers: () => [...views.values()] } satisfies WorkerDirectory
  })
