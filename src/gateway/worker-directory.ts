/**
 * The gateway's view of the run's rollout workers, kept from a watch on the registry.
 *
 * A worker is alive while its entry says `running` and changed (a heartbeat) within
 * `deadAfterMs` on this process's monotonic clock, so a worker whose process was killed is
 * given up after `deadAfterMs` even before a liveness monitor marks it dead; it is usable
 * (takes new requests) while alive and its load does not say `draining`. `pick` returns the usable worker with the lowest load:
 * the caller's own figure for it (requests in flight, executions pinned to it) plus the
 * active sequences it last reported.
 */
import { Duration, Effect, Schema, type Scope } from "effect"
import type { TransportError } from "../runtime/errors.ts"
import { watchRegistry, type RegistryEntry } from "../runtime/registry.ts"
import type { ActorSystemShape } from "../runtime/system.ts"
import { WorkerLoad } from "../protocols/rollout.ts"

export const WORKER_KIND = "rollout-worker"

export interface WorkerView {
  /** `rollout-worker/<id>` */
  readonly key: string
  readonly id: string
  readonly node: string
  readonly status: RegistryEntry["status"]
  readonly load: WorkerLoad | undefined
  /** `performance.now()` when the entry last changed. */
  readonly seenAt: number
}

export interface WorkerDirectory {
  readonly alive: (key: string) => boolean
  readonly usable: (key: string) => boolean
  /** The least loaded usable worker not in `exclude`; `localLoad` adds the caller's own figure. */
  readonly pick: (exclude: ReadonlySet<string>, localLoad: (key: string) => number) => WorkerView | undefined
  /** Completes once the worker is no longer alive (checked every 100 ms). */
  readonly awaitDeath: (key: string) => Effect.Effect<void>
  readonly workers: () => ReadonlyArray<WorkerView>
}

const decodeLoad = Schema.decodeUnknownOption(WorkerLoad)

/** Watches the registry for the lifetime of the scope. */
export const watchWorkers = (
  system: ActorSystemShape,
  options: { readonly deadAfterMs: number }
): Effect.Effect<WorkerDirectory, TransportError, Scope.Scope> =>
  Effect.gen(function* () {
    const views = new Map<string, WorkerView>()
    yield* watchRegistry(system, ({ key, entry }) => {
      if (!key.startsWith(`${WORKER_KIND}/`)) return
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
    const usable = (key: string) => alive(key) && views.get(key)!.load?.draining !== true

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

    return { alive, usable, pick, awaitDeath, workers: () => [...views.values()] } satisfies WorkerDirectory
  })
