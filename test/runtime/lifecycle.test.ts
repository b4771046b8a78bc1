/**
 * An actor's lifecycle on a real nats-server, in one process: a crashed tell handed back within
 * its redelivery backoff and dead-lettered after `maxDeliveries`, a bounded stop that hands an
 * interrupted message back, restart types, and one-for-all / one-for-one groups.
 */
import { Duration, Effect, Schedule, Schema } from "effect"
import { Rpc, RpcGroup } from "effect/rpc"
import { describe, expect, it } from "vitest"
import * as Actor from "../../src/runtime/actor.ts"
import { address } from "../../src/runtime/names.ts"
import { startNode } from "../../src/runtime/node.ts"
import { Headers } from "../../src/runtime/protocol.ts"
import { ActorSystem, refOf } from "../../src/runtime/system.ts"
import { withSystem, eventually as poll, registryEntry } from "./harness.ts"

const eventually = <A>(check: Effect.Effect<A | undefined, any, any>, timeoutMs = 15_000) => poll(check, timeoutMs, 25)
const statusOf = (key: string) => registryEntry(key).pipe(Effect.map((e) => e?.status))

const ProbeProtocol = RpcGroup.make(
  Rpc.make("Work", { payload: { item: Schema.String, crashTimes: Schema.optional(Schema.Number), holdMs: Schema.optional(Schema.Number) } }),
  Rpc.make("Crash"),
  Rpc.make("Exit"),
  Rpc.make("Whoami", { success: Schema.Number })
)

interface Log {
  readonly starts: Array<number>
  readonly deliveries: Array<{ readonly item: string; readonly count: number; readonly at: number }>
}
const logs = new Map<string, Log>()
const logOf = (key: string): Log => {
  let l = logs.get(key)
  if (l === undefined) logs.set(key, (l = { starts: [], deliveries: [] }))
  return l
}

const fast = { maxRestarts: 20, withinMs: 60_000, backoff: Schedule.spaced(Duration.millis(10)) }

/** `Work` crashes on its first `crashTimes` deliveries and holds `holdMs` on its first; each start and delivery is logged. */
const probe = (kind: string, extra: { readonly restart?: Actor.ActorType<any, any, never>["restart"]; readonly maxDeliveries?: number; readonly stopTimeoutMs?: number } = {}) =>
  Actor.make({
    kind,
    protocol: ProbeProtocol,
    state: { schema: Schema.Struct({}), initial: () => ({}) },
    supervision: fast,
    ...extra,
    behaviour: (ctx) =>
      Effect.sync(() => {
        const log = logOf(`${ctx.address.kind}/${ctx.address.id}`)
        log.starts.push(ctx.incarnation)
        return {
          Work: ({ item, crashTimes, holdMs }, meta) =>
            Effect.gen(function* () {
              log.deliveries.push({ item, count: meta.deliveryCount, at: performance.now() })
              if (meta.deliveryCount <= (crashTimes ?? 0)) return yield* Effect.die(new Error(`crash ${meta.deliveryCount} on ${item}`))
              if (holdMs !== undefined && meta.deliveryCount === 1) yield* Effect.sleep(Duration.millis(holdMs))
            }),
          Crash: () => Effect.die(new Error("asked to crash")),
          Exit: () => ctx.stop,
          Whoami: () => Effect.succeed(ctx.incarnation)
        }
      })
  })

const ref = (kind: string, id: string) => refOf(ProbeProtocol, address(kind, id))



describe("a crashing tell", () => {
  it("is handed back at once with the redelivery backoff, long before the ack wait", async () => {
    const result = await withSystem("crashback", Effect.gen(function* () {
      const system = yield* ActorSystem
      const node = yield* startNode({ name: "n1", types: [probe("flaky")], ackWaitMs: 30_000 })
      yield* node.spawn("flaky", "f1")
      const sentAt = performance.now()
      yield* system.tell(ref("flaky", "f1"), "Work", { item: "x", crashTimes: 2 })
      const log = logOf("flaky/f1")
      yield* eventually(Effect.sync(() => (log.deliveries.length >= 3 ? true : undefined)))
      yield* Effect.sleep(Duration.millis(300))
      return { sentAt, deliveries: [...log.deliveries], starts: log.starts.length }
    }))
    const [d1, d2, d3] = result.deliveries
    expect(result.deliveries.map((d) => d.count)).toEqual([1, 2, 3])
    // The default redelivery schedule: 100 ms after the first crash, 200 ms after the second.
    expect(d2!.at - d1!.at).toBeGreaterThanOrEqual(90)
    expect(d3!.at - d2!.at).toBeGreaterThanOrEqual(180)
    // ... and nowhere near the 30 s ack wait.
    expect(d3!.at - result.sentAt).toBeLessThan(8000)
    expect(result.starts).toBe(3)
  })

  it("is dead-lettered with the crash, its bytes and headers after maxDeliveries, and the actor goes on", async () => {
    const result = await withSystem("crashdead", Effect.gen(function* () {
      const system = yield* ActorSystem
      const node = yield* startNode({ name: "n1", types: [probe("poison", { maxDeliveries: 3 })], ackWaitMs: 30_000 })
      yield* node.spawn("poison", "p1")
      const t0 = performance.now()
      yield* system.tell(ref("poison", "p1"), "Work", { item: "bad", crashTimes: 1000 })
      const dead = yield* eventually(
        Effect.promise(() => system.nats.jsm.streams.getMessage(system.layout.deadStream, { last_by_subj: system.layout.dead(address("poison", "p1")) })).pipe(
          Effect.map((m) => (m === null ? undefined : m))
        )
      )
      const deadAfterMs = performance.now() - t0
      // The third crash restarts it once more (incarnation 4): the good tell goes to that one.
      yield* eventually(registryEntry("poison/p1").pipe(Effect.map((e) => (e?.status === "running" && e.incarnation >= 4 ? e : undefined))))
      yield* system.tell(ref("poison", "p1"), "Work", { item: "good" })
      const log = logOf("poison/p1")
      yield* eventually(Effect.sync(() => (log.deliveries.some((d) => d.item === "good") ? true : undefined)))
      // The good tell's ack follows its handling: nothing is left pending once it has come.
      const pendingNow = Effect.promise(() => system.nats.jsm.consumers.info(system.layout.journalStream, system.layout.consumer(address("poison", "p1")))).pipe(
        Effect.map((c) => c.num_ack_pending + c.num_pending)
      )
      const pending = yield* eventually(pendingNow.pipe(Effect.map((n) => (n === 0 ? n : undefined))), 5000)
      return {
        deadAfterMs,
        reason: dead.header.get(Headers.deadReason),
        request: dead.header.get(Headers.request),
        data: JSON.parse(new TextDecoder().decode(dead.data)),
        deliveries: log.deliveries.map((d) => `${d.item}:${d.count}`),
        pending
      }
    }))
    expect(result.deliveries).toEqual(["bad:1", "bad:2", "bad:3", "good:1"])
    expect(result.reason).toMatch(/crashed on each of 3 deliveries/)
    expect(result.reason).toMatch(/crash 3 on bad/)
    expect(result.request).toBe("Work")
    expect(result.data).toEqual({ item: "bad", crashTimes: 1000 })
    expect(result.deadAfterMs).toBeLessThan(10_000)
    expect(result.pending).toBe(0)
  })
})

describe("a bounded stop", () => {
  it("interrupts a handler past stopTimeoutMs and hands its message back to the next incarnation", async () => {
    const result = await withSystem("boundedstop", Effect.gen(function* () {
      const system = yield* ActorSystem
      const node = yield* startNode({ name: "n1", types: [probe("slow", { stopTimeoutMs: 300 })], ackWaitMs: 30_000 })
      yield* node.spawn("slow", "s1")
      yield* system.tell(ref("slow", "s1"), "Work", { item: "long", holdMs: 60_000 })
      const log = logOf("slow/s1")
      yield* eventually(Effect.sync(() => (log.deliveries.length === 1 ? true : undefined)))
      const t0 = performance.now()
      yield* node.stop("slow", "s1")
      const stopMs = performance.now() - t0
      const hostedAfterStop = node.hosted().some((h) => h.kind === "slow")
      yield* node.spawn("slow", "s1")
      yield* eventually(Effect.sync(() => (log.deliveries.length === 2 ? true : undefined)))
      return { stopMs, hostedAfterStop, againMs: log.deliveries[1]!.at - t0, counts: log.deliveries.map((d) => d.count) }
    }))
    expect(result.stopMs).toBeGreaterThanOrEqual(250)
    expect(result.stopMs).toBeLessThan(5000)
    expect(result.hostedAfterStop).toBe(false)
    expect(result.counts).toEqual([1, 2])
    expect(result.againMs).toBeLessThan(10_000)
  })
})

describe("restart types", () => {
  it("restarts a permanent actor that ended on its own, a transient one only after a crash, a temporary one never", async () => {
    const result = await withSystem("restarts", Effect.gen(function* () {
      const system = yield* ActorSystem
      const node = yield* startNode({
        name: "n1",
        types: [probe("perm"), probe("trans", { restart: "transient" }), probe("temp", { restart: "temporary" })]
      })
      for (const [kind, id] of [["perm", "a"], ["trans", "a"], ["trans", "b"], ["temp", "a"]] as const) yield* node.spawn(kind, id)
      const hosted = (key: string) => node.hosted().some((h) => `${h.kind}/${h.id}` === key)

      yield* system.ask(ref("perm", "a"), "Exit", undefined)
      yield* eventually(Effect.sync(() => (logOf("perm/a").starts.length === 2 ? true : undefined)))
      const permAnswers = yield* eventually(system.ask(ref("perm", "a"), "Whoami", undefined))

      yield* system.ask(ref("trans", "a"), "Exit", undefined)
      yield* eventually(Effect.sync(() => (hosted("trans/a") ? undefined : true)))
      yield* Effect.exit(system.ask(ref("trans", "b"), "Crash", undefined))
      yield* eventually(Effect.sync(() => (logOf("trans/b").starts.length === 2 ? true : undefined)))

      yield* Effect.exit(system.ask(ref("temp", "a"), "Crash", undefined))
      yield* eventually(Effect.sync(() => (hosted("temp/a") ? undefined : true)))
      yield* Effect.sleep(Duration.millis(300))
      return {
        permAnswers,
        permHosted: hosted("perm/a"),
        transStarts: logOf("trans/a").starts.length,
        transStatus: yield* statusOf("trans/a"),
        transBHosted: hosted("trans/b"),
        tempStarts: logOf("temp/a").starts.length,
        tempStatus: yield* statusOf("temp/a")
      }
    }))
    expect(result.permAnswers).toBe(logOf("perm/a").starts[1])
    expect(result.permHosted).toBe(true)
    expect(result.transStarts).toBe(1)
    expect(result.transStatus).toBe("stopped")
    expect(result.transBHosted).toBe(true)
    expect(result.tempStarts).toBe(1)
    expect(result.tempStatus).toBe("failed")
  })
})

describe("groups", () => {
  it("one-for-all restarts every member when one crashes; one-for-one only that one; a member stopped alone leaves the rest; the group's entry is held until the last one leaves", async () => {
    const result = await withSystem("groups", Effect.gen(function* () {
      const system = yield* ActorSystem
      const node = yield* startNode({ name: "n1", types: [probe("rollout"), probe("trainer")] })
      const whoami = (kind: string, id: string) => system.ask(ref(kind, id), "Whoami", undefined)
      yield* node.spawnGroup({ name: "device-0", strategy: "one-for-all", members: [{ kind: "rollout", id: "d0" }, { kind: "trainer", id: "d0" }] })
      yield* node.spawnGroup({ name: "device-1", strategy: "one-for-one", members: [{ kind: "rollout", id: "d1" }, { kind: "trainer", id: "d1" }] })
      const before = { r0: yield* whoami("rollout", "d0"), t0: yield* whoami("trainer", "d0"), r1: yield* whoami("rollout", "d1"), t1: yield* whoami("trainer", "d1") }

      yield* Effect.exit(system.ask(ref("rollout", "d0"), "Crash", undefined))
      yield* Effect.exit(system.ask(ref("rollout", "d1"), "Crash", undefined))
      const r0 = yield* eventually(whoami("rollout", "d0").pipe(Effect.map((i) => (i !== before.r0 ? i : undefined))))
      const t0 = yield* eventually(whoami("trainer", "d0").pipe(Effect.map((i) => (i !== before.t0 ? i : undefined))))
      const r1 = yield* eventually(whoami("rollout", "d1").pipe(Effect.map((i) => (i !== before.r1 ? i : undefined))))
      yield* Effect.sleep(Duration.millis(300))
      const t1 = yield* whoami("trainer", "d1")
      const listed = node.hosted().filter((h) => h.kind !== "node")

      yield* node.stop("trainer", "d0")
      yield* Effect.sleep(Duration.millis(300))
      const r0After = yield* whoami("rollout", "d0")
      const hostedAfter = node.hosted().map((h) => `${h.kind}/${h.id}`)
      // The group's own entry: held while a member is hosted (a second node cannot take the
      // name), released when the last one has left.
      const other = yield* startNode({ name: "n2", types: [probe("rollout")] })
      const takenElsewhere = yield* Effect.flip(other.spawnGroup({ name: "device-0", strategy: "one-for-one", members: [{ kind: "rollout", id: "d9" }] }))
      const groupWhileHosted = yield* statusOf("group/device-0")
      yield* node.stop("rollout", "d0")
      const groupAfter = yield* eventually(statusOf("group/device-0").pipe(Effect.map((s) => (s === "stopped" ? s : undefined))))
      return { before, r0, t0, r1, t1, listed, r0After, hostedAfter, takenElsewhere, groupWhileHosted, groupAfter }
    }))
    expect(result.r0).not.toBe(result.before.r0)
    expect(result.t0).not.toBe(result.before.t0)
    expect(result.r1).not.toBe(result.before.r1)
    expect(result.t1).toBe(result.before.t1)
    expect(logOf("trainer/d0").starts.length).toBe(2)
    expect(logOf("trainer/d1").starts.length).toBe(1)
    expect(result.listed.map((h) => `${h.kind}/${h.id}@${h.group}`).sort()).toEqual([
      "rollout/d0@device-0",
      "rollout/d1@device-1",
      "trainer/d0@device-0",
      "trainer/d1@device-1"
    ])
    expect(result.listed.find((h) => h.kind === "trainer" && h.id === "d0")!.restarts).toBe(1)
    expect(result.r0After).toBe(result.r0)
    expect(result.hostedAfter).not.toContain("trainer/d0")
    expect(result.hostedAfter).toContain("rollout/d0")
    expect(result.takenElsewhere).toMatchObject({ _tag: "AddressClaimed", address: "group/device-0", node: "n1" })
    expect(result.groupWhileHosted).toBe("running")
    expect(result.groupAfter).toBe("stopped")
  })
})
