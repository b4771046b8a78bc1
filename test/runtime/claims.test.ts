/**
 * One activation per address and leader leases, on a fresh nats-server with in-process nodes:
 * a second spawn of a held address is refused naming the holder, concurrent spawns leave one
 * winner, a zombie that sees a newer incarnation stops handling and acknowledging and its
 * messages go to the new one, a fenced incarnation's messages are recognisably stale, and a
 * lease passes to a standby on release, on silence, and is lost when taken or not renewed; a
 * standby waits through an unanswering registry; a renewal lost on the way holds the beat up
 * for about a second only.
 */
import { Duration, Effect, Exit, Fiber, Scope } from "effect"
import { describe, expect, it } from "vitest"
import { acquire, isCurrent, renewalTimeoutMs } from "../../src/runtime/claim.ts"
import * as Lease from "../../src/runtime/lease.ts"
import { address } from "../../src/runtime/names.ts"
import { nodeRef, startNode } from "../../src/runtime/node.ts"
import { encodeJson } from "../../src/runtime/protocol.ts"
import { ActorSystem, refOf } from "../../src/runtime/system.ts"
import { Probe, ProbeProtocol, contexts, log } from "../fixtures/probe.ts"
import { withSystem, eventually, registryEntry } from "./harness.ts"

const probe = (id: string) => refOf(ProbeProtocol, address("probe", id))
const fast = { heartbeatMs: 150, deadAfterMs: 1500 }



describe("claims", () => {
  it("refuses a second spawn of a held address naming the holder; of two concurrent spawns one wins; a stopped address passes on", async () => {
    const result = await withSystem("claim", Effect.gen(function* () {
      const system = yield* ActorSystem
      const a = yield* startNode({ name: "a", types: [Probe], ...fast })
      const b = yield* startNode({ name: "b", types: [Probe], ...fast })
      yield* a.spawn("probe", "c1")
      const t0 = performance.now()
      const refused = yield* Effect.flip(b.spawn("probe", "c1"))
      const refusedAfterMs = performance.now() - t0
      const viaProtocol = yield* Effect.flip(system.ask(nodeRef("b"), "Spawn", { kind: "probe", id: "c1" }))
      const both = yield* Effect.all([Effect.exit(a.spawn("probe", "c2")), Effect.exit(b.spawn("probe", "c2"))], { concurrency: 2 })
      const c2 = yield* registryEntry("probe/c2")
      yield* a.stop("probe", "c1")
      const moved = yield* b.spawn("probe", "c1")
      const c1 = yield* registryEntry("probe/c1")
      const answer = yield* system.ask(probe("c1"), "Record", { item: "x" })
      return { refused, refusedAfterMs, viaProtocol, both, c2, moved, c1, answer, hostedB: b.hosted().map((h) => `${h.kind}/${h.id}`) }
    }))
    expect(result.refused).toMatchObject({ _tag: "AddressClaimed", address: "probe/c1", node: "a", incarnation: 1, status: "running" })
    expect(result.refusedAfterMs).toBeLessThan(1500) // one heartbeat proves the holder alive
    expect(result.viaProtocol).toMatchObject({ _tag: "AddressClaimed", node: "a", incarnation: 1 })
    const wins = result.both.filter(Exit.isSuccess)
    expect(wins.length).toBe(1)
    const loss = result.both.find(Exit.isFailure)!
    expect(Exit.isFailure(loss) && (loss.cause.reasons[0] as any).error._tag).toBe("AddressClaimed")
    expect(result.c2!.status).toBe("running")
    expect(result.moved.alreadyRunning).toBe(false)
    expect(result.c1).toMatchObject({ node: "b", incarnation: 2, status: "running" })
    expect(result.answer).toBe(1)
    expect(result.hostedB).toContain("probe/c1")
  })

  it("fences a zombie: on a newer incarnation in the registry it stops handling and acking, its messages go to the new one, and what it sends is stale", async () => {
    const result = await withSystem("zombie", Effect.gen(function* () {
      const system = yield* ActorSystem
      // A long ack wait: only the zombie's hand-back can bring the message back within the test.
      const slowDeath = { heartbeatMs: 150, deadAfterMs: 8000 } // no re-placement while the test plays the partition
      const a = yield* startNode({ name: "a", types: [Probe], ...slowDeath, ackWaitMs: 60_000 })
      yield* a.spawn("probe", "z1")
      yield* system.tell(probe("z1"), "Record", { item: "m1" })
      yield* eventually(system.ask(probe("z1"), "Items", undefined).pipe(Effect.map((xs) => (xs.length === 1 ? xs : undefined))))
      yield* system.tell(probe("z1"), "Record", { item: "slow", holdMs: 2000 })
      yield* eventually(Effect.sync(() => (log.some((h) => h.item === "slow" && h.node === "a") ? true : undefined)))
      // A partition healed: another node's newer incarnation is in the registry.
      const old = (yield* registryEntry("probe/z1"))!
      yield* Effect.promise(() => system.registry.put("probe/z1", encodeJson({ ...old, node: "b", incarnation: old.incarnation + 1 })))
      const zombie = contexts.find((c) => c.address.id === "z1" && c.incarnation === old.incarnation)!
      yield* eventually(Effect.sync(() => (a.hosted().some((h) => h.id === "z1") ? undefined : true)), 3000)
      yield* system.tell(probe("z1"), "Record", { item: "m3" })
      const b = yield* startNode({ name: "b", types: [Probe], ...slowDeath })
      yield* b.spawn("probe", "z1")
      yield* b.spawn("probe", "sink")
      const items = yield* eventually(system.ask(probe("z1"), "Items", undefined).pipe(Effect.map((xs) => (xs.length === 3 ? xs : undefined))))
      const current = (yield* registryEntry("probe/z1"))!
      const live = contexts.find((c) => c.address.id === "z1" && c.incarnation === current.incarnation)!
      yield* zombie.system.tell(probe("sink"), "Record", { item: "from-zombie" })
      yield* live.system.tell(probe("sink"), "Record", { item: "from-live" })
      const sunk = yield* eventually(Effect.sync(() => {
        const got = log.filter((h) => h.actor === "probe/sink" && h.phase === "end")
        return got.length === 2 ? got : undefined
      }))
      const stale = yield* Effect.forEach(sunk, (h) => isCurrent(system.registry, h.sender!, h.senderIncarnation!))
      return { old, current, items, sunk, stale }
    }))
    const z1 = log.filter((h) => h.actor === "probe/z1")
    // the zombie never finished "slow": it was interrupted and handed back unacknowledged
    expect(z1.filter((h) => h.item === "slow" && h.node === "a").map((h) => h.phase)).toEqual(["start"])
    expect(z1.some((h) => h.item === "m3" && h.node === "a")).toBe(false)
    // handed back, not left to the 60 s ack wait: the new incarnation handled it within the test
    expect(z1.some((h) => h.item === "slow" && h.node === "b" && h.phase === "end")).toBe(true)
    expect(result.items).toEqual(["m1", "slow", "m3"])
    expect(result.current).toMatchObject({ node: "b", incarnation: result.old.incarnation + 2, status: "running" })
    expect(result.sunk.map((h) => [h.item, h.sender, h.senderIncarnation])).toEqual([
      ["from-zombie", "probe/z1", result.old.incarnation],
      ["from-live", "probe/z1", result.current.incarnation]
    ])
    expect(result.stale).toEqual([false, true])
  })

  it("a renewal whose write is never answered (lost in a connection cut) holds the beat up for about a second, not for good", async () => {
    const result = await withSystem("lost-renewal", Effect.gen(function* () {
      const system = yield* ActorSystem
      // The registry as the claim sees it; `drop` makes its next update a request that never returns.
      let drop = false
      const registry = new Proxy(system.registry, {
        get: (target, p) => {
          if (p === "update" && drop) {
            drop = false
            return () => new Promise(() => undefined)
          }
          const v = Reflect.get(target, p, target)
          return typeof v === "function" ? v.bind(target) : v
        }
      })
      const claim = yield* acquire(registry, address("probe", "beat"), { holder: "x", silentMs: 1000, whenHeld: "refuse" })
      yield* Effect.forkScoped(claim.renew(() => ({}), 200))
      const revision = Effect.promise(() => system.registry.get("probe/beat")).pipe(Effect.map((e) => e?.revision ?? 0))
      yield* Effect.sleep(Duration.millis(600))
      const before = yield* revision
      drop = true
      const t0 = performance.now()
      yield* eventually(revision.pipe(Effect.map((r) => (r > before + 1 ? r : undefined))), 5000, 20)
      return { gapMs: performance.now() - t0, held: claim.held() }
    }))
    // The lost renewal is given up after renewalTimeoutMs (1 s); the next ones land.
    expect(result.gapMs).toBeLessThan(renewalTimeoutMs(200) + 1500)
    expect(result.held).toBe(true)
  })
})

describe("leases", () => {
  it("passes a lease to a standby at once on release and after ttl of silence, with a new term each time", async () => {
    const result = await withSystem("lease", Effect.gen(function* () {
      const system = yield* ActorSystem
      const holderScope = yield* Scope.make()
      const first = yield* Lease.acquire(system, "scheduler", "x", { ttlMs: 600 }).pipe(Scope.provide(holderScope))
      let standbyAt = 0
      const standby = yield* Effect.forkScoped(
        Lease.acquire(system, "scheduler", "y", { ttlMs: 600 }).pipe(Effect.tap(() => Effect.sync(() => (standbyAt = performance.now()))))
      )
      yield* Effect.sleep(Duration.millis(1500)) // x renews: y keeps waiting
      const waitingWhileRenewed = standbyAt === 0
      const releasedAt = performance.now()
      yield* Scope.close(holderScope, Exit.void)
      const second = yield* Fiber.join(standby)
      const takeoverMs = standbyAt - releasedAt
      // A holder that died without releasing: its entry is left as it was.
      const dead = { kind: "lease", id: "silent", node: "z", incarnation: 7, status: "running", heartbeatAt: Date.now(), load: {} }
      yield* Effect.promise(() => system.registry.put("lease/silent", encodeJson(dead)))
      const t0 = performance.now()
      const third = yield* Lease.acquire(system, "silent", "y", { ttlMs: 600 })
      return { first: first.term, waitingWhileRenewed, second: second.term, holder: second.holder, takeoverMs, third: third.term, silentMs: performance.now() - t0 }
    }))
    expect(result.first).toBe(1)
    expect(result.waitingWhileRenewed).toBe(true)
    expect(result.second).toBe(2)
    expect(result.holder).toBe("y")
    expect(result.takeoverMs).toBeLessThan(500)
    expect(result.third).toBe(8)
    expect(result.silentMs).toBeGreaterThanOrEqual(600)
    expect(result.silentMs).toBeLessThan(3000)
  })

  it("keeps waiting for a lease while the registry does not answer, and takes it once it does", async () => {
    const result = await withSystem("lease-wait", Effect.gen(function* () {
      const system = yield* ActorSystem
      // The registry's reads fail for the first second (as while a cluster elects its leader).
      const until = performance.now() + 1000
      let failed = 0
      const registry = new Proxy(system.registry, {
        get: (target, p) => {
          if (p === "get" && performance.now() < until) {
            return () => {
              failed++
              return Promise.reject(new Error("jetstream is not enabled"))
            }
          }
          const v = Reflect.get(target, p, target)
          return typeof v === "function" ? v.bind(target) : v
        }
      })
      const t0 = performance.now()
      const lease = yield* Lease.acquire({ ...system, registry }, "unanswered", "x", { ttlMs: 900 })
      return { term: lease.term, held: lease.held(), failed, ms: performance.now() - t0 }
    }))
    expect(result.failed).toBeGreaterThan(1)
    expect(result.term).toBe(1)
    expect(result.held).toBe(true)
    expect(result.ms).toBeGreaterThanOrEqual(1000)
    expect(result.ms).toBeLessThan(4000)
  })

  it("loses a lease that another holder took, and one it cannot renew for ttl", async () => {
    const result = await withSystem("lost", Effect.gen(function* () {
      const system = yield* ActorSystem
      const lease = yield* Lease.acquire(system, "taken", "x", { ttlMs: 900 })
      const entry = (yield* registryEntry("lease/taken"))!
      yield* Effect.promise(() => system.registry.put("lease/taken", encodeJson({ ...entry, node: "w", incarnation: entry.incarnation + 1 })))
      const t0 = performance.now()
      yield* lease.lost
      const takenAfterMs = performance.now() - t0
      const renewing = yield* Lease.acquire(system, "cut", "x", { ttlMs: 900 })
      // Renewals now fail (the bucket is gone): the holder gives the lease up after ttl.
      yield* Effect.promise(() => system.nats.jsm.streams.delete(`KV_${system.layout.registryBucket}`))
      const t1 = performance.now()
      yield* renewing.lost
      return { takenAfterMs, heldAfterTaken: lease.held(), cutAfterMs: performance.now() - t1, heldAfterCut: renewing.held() }
    }))
    expect(result.takenAfterMs).toBeLessThan(900)
    expect(result.heldAfterTaken).toBe(false)
    expect(result.cutAfterMs).toBeGreaterThan(300)
    expect(result.cutAfterMs).toBeLessThan(1500)
    expect(result.heldAfterCut).toBe(false)
  })
})
