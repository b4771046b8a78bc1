/**
 * The scheduler's KV lease on a real nats-server: of racing candidates exactly one holds it;
 * a released lease passes on at once with the next term; a holder whose record another
 * writer took counts itself deposed.
 */
import { Deferred, Duration, Effect, Exit, Fiber, Scope } from "effect"
import { describe, expect, it } from "vitest"
import { encodeJson } from "../../src/runtime/protocol.ts"
import { ActorSystem } from "../../src/runtime/system.ts"
import { kvLease, type Leadership } from "../../src/scheduling/lease.ts"
import { withSystem } from "../runtime/harness.ts"

const ttlMs = 1000

describe("scheduler lease", () => {
  it("one of three racing candidates leads; a release passes the lease on with the next term", async () => {
    const result = await withSystem("lease-race", Effect.gen(function* () {
      const system = yield* ActorSystem
      const won: Array<{ name: string; term: number; at: number; scope: Scope.Closeable }> = []
      const t0 = performance.now()
      const fibers = yield* Effect.forEach(["a", "b", "c"], (name) =>
        Effect.gen(function* () {
          const scope = yield* Scope.make()
          const lead = yield* kvLease({ kv: system.state, key: "lease/test", holder: name, ttlMs }).acquire.pipe(Scope.provide(scope))
          won.push({ name, term: lead.term, at: performance.now() - t0, scope })
        }).pipe(Effect.forkChild)
      )
      yield* Effect.sleep(Duration.millis(ttlMs * 2))
      const first = [...won]
      yield* Scope.close(won[0]!.scope, Exit.void)
      yield* Effect.sleep(Duration.millis(ttlMs / 2))
      const second = [...won]
      yield* Effect.forEach(won, (w) => Scope.close(w.scope, Exit.void))
      yield* Effect.forEach(fibers, Fiber.interrupt)
      return { first, second }
    }))
    // Renewals keep the first holder in place past the time to live.
    expect(result.first.map((w) => w.term)).toEqual([1])
    expect(result.second.map((w) => w.term)).toEqual([1, 2])
    // The release handed it over well within the time to live.
    expect(result.second[1]!.at - ttlMs * 2).toBeLessThan(ttlMs / 2 + 200)
  })

  it("a holder whose record another writer took counts itself deposed", async () => {
    const lost = await withSystem("lease-lost", Effect.gen(function* () {
      const system = yield* ActorSystem
      const lead: Leadership = yield* kvLease({ kv: system.state, key: "lease/test", holder: "a", ttlMs }).acquire
      const done = yield* Deferred.make<void>()
      yield* Effect.forkScoped(lead.lost.pipe(Effect.andThen(Deferred.succeed(done, undefined))))
      yield* Effect.promise(() => system.state.put("lease/test", encodeJson({ holder: "intruder", term: 9, released: false })))
      return yield* Deferred.await(done).pipe(Effect.timeoutOption(Duration.millis(ttlMs)))
    }))
    expect(lost._tag).toBe("Some")
  })
})
