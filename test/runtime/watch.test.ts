/**
 * The supervised registry watch: when its consumer is deleted under it (the client stalls
 * without a word) it is reopened and resynchronised, so a change and a deletion made meanwhile
 * (one that left no delete marker, as an expiry) still reach the watcher; after a nats-server
 * restart it is reopened and reports what changes after it.
 */
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Duration, Effect, Exit, Layer, Schedule, Scope } from "effect"
import { describe, expect, it } from "vitest"
import { startEmbeddedServer } from "../../src/runtime/nats-server.ts"
import { Nats } from "../../src/runtime/nats.ts"
import { encodeJson } from "../../src/runtime/protocol.ts"
import { watchRegistry, type RegistryChange, type RegistryEntry } from "../../src/runtime/registry.ts"
import { ActorSystem, type ActorSystemShape } from "../../src/runtime/system.ts"
import { withSystem } from "./harness.ts"

const entry = (id: string): RegistryEntry => ({ kind: "probe", id, node: "n", incarnation: 1, status: "running", heartbeatAt: Date.now(), load: {} })
/** Retried: right after a server restart the connection may not be back yet. */
const retrying = <A>(f: () => Promise<A>) => Effect.tryPromise(f).pipe(Effect.retry({ times: 50, schedule: Schedule.spaced(Duration.millis(100)) }), Effect.orDie)
const put = (system: ActorSystemShape, id: string) => retrying(() => system.registry.put(`probe/${id}`, encodeJson(entry(id))))
/** Removes every trace of a key, delete marker included, as if it had expired. */
const erase = (system: ActorSystemShape, id: string) =>
  retrying(() => system.nats.jsm.streams.purge(`KV_${system.layout.registryBucket}`, { filter: `$KV.${system.layout.registryBucket}.probe/${id}` }))

const present = (changes: ReadonlyArray<RegistryChange>) => {
  const now = new Map<string, boolean>()
  for (const c of changes) now.set(c.key, c.entry !== undefined)
  return [...now].filter(([, p]) => p).map(([k]) => k).sort()
}

const until = (check: () => boolean, timeoutMs: number) =>
  Effect.gen(function* () {
    const deadline = performance.now() + timeoutMs
    while (!check()) {
      if (performance.now() > deadline) return yield* Effect.die(new Error("condition not met in time"))
      yield* Effect.sleep(Duration.millis(50))
    }
  })

describe("registry watch", () => {
  it("resynchronises after its consumer is deleted: a change and a deletion made meanwhile arrive", async () => {
    const result = await withSystem("watch", Effect.gen(function* () {
      const system = yield* ActorSystem
      const changes: Array<RegistryChange> = []
      yield* put(system, "a")
      yield* put(system, "b")
      yield* watchRegistry(system, (c) => changes.push(c), { probeEveryMs: 200 })
      const initial = present(changes)
      const stream = `KV_${system.layout.registryBucket}`
      const consumers = yield* Effect.promise(async () => (await system.nats.jsm.consumers.list(stream).next()).map((c) => c.name))
      for (const c of consumers) yield* Effect.promise(() => system.nats.jsm.consumers.delete(stream, c))
      yield* erase(system, "b")
      yield* put(system, "c")
      const t0 = performance.now()
      yield* until(() => present(changes).join() === "probe/a,probe/c", 8000)
      const recoveredMs = performance.now() - t0
      yield* put(system, "d")
      yield* until(() => present(changes).includes("probe/d"), 3000)
      return { initial, consumers, recoveredMs, final: present(changes) }
    }))
    expect(result.initial).toEqual(["probe/a", "probe/b"])
    expect(result.consumers.length).toBeGreaterThanOrEqual(1)
    // the client's own recovery (missed heartbeats) takes 10 s and never reports the deletion
    expect(result.recoveredMs).toBeLessThan(3000)
    expect(result.final).toEqual(["probe/a", "probe/c", "probe/d"])
  })

  it("reopens after the nats-server restarts on the same store and reports the changes that follow", async () => {
    const storeDir = fs.mkdtempSync(path.join(os.tmpdir(), "gyre-watch-store-"))
    try {
      const result = await Effect.runPromise(Effect.scoped(Effect.gen(function* () {
        const firstScope = yield* Scope.make()
        const first = yield* startEmbeddedServer({ storeDir }).pipe(Scope.provide(firstScope))
        const port = Number(new URL(first.url).port)
        const systemLayer = ActorSystem.layer({ run: "restart" }).pipe(Layer.provideMerge(Nats.layer({ url: first.url })))
        return yield* Effect.gen(function* () {
          const system = yield* ActorSystem
          const changes: Array<RegistryChange> = []
          yield* put(system, "a")
          yield* put(system, "b")
          yield* watchRegistry(system, (c) => changes.push(c), { probeEveryMs: 200 })
          yield* Scope.close(firstScope, Exit.void)
          yield* startEmbeddedServer({ storeDir, port })
          // Written once the connection is back; the watch's consumer did not survive the restart.
          yield* put(system, "c")
          yield* retrying(() => system.registry.delete("probe/a"))
          const t0 = performance.now()
          yield* until(() => present(changes).join() === "probe/b,probe/c", 8000)
          return { present: present(changes), afterMs: performance.now() - t0 }
        }).pipe(Effect.provide(systemLayer))
      })))
      expect(result.present).toEqual(["probe/b", "probe/c"])
      expect(result.afterMs).toBeLessThan(6000)
    } finally {
      fs.rmSync(storeDir, { recursive: true, force: true })
    }
  })
})
