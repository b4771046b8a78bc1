/**
 * Re-placement: the policy as a pure choice; actors of a node that stopped beating placed again
 * as their policies say (spread, on a device, on a node; temporary ones not at all), once each,
 * resuming from their snapshots; a silent node's group placed again as one group, with the
 * members it still hosted; a node declared dead while it lives claiming its and its group's
 * entries again; and a `gyre node` process killed with SIGKILL whose actor then
 * answers from the other node.
 */
import { Duration, Effect, Exit, Schema, Scope } from "effect"
import { afterEach, describe, expect, it } from "vitest"
import { address } from "../../src/runtime/names.ts"
import { nodeRef, startNode } from "../../src/runtime/node.ts"
import { encodeJson } from "../../src/runtime/protocol.ts"
import { choose, onDevice, onNode, spread, PlacedEvent, type Candidate } from "../../src/runtime/placement.ts"
import { ActorSystem, refOf } from "../../src/runtime/system.ts"
import { LedgerProtocol, RelayProtocol } from "../fixtures/actors.ts"
import { ProbeProtocol, probeType } from "../fixtures/probe.ts"
import { startNodeProcess, withSystem, type NodeProcess, eventually, registryEntry } from "./harness.ts"



const placedEvents = (system: typeof ActorSystem.Service) => {
  const events: Array<PlacedEvent> = []
  const sub = system.nats.nc.subscribe(system.layout.sys("placed"), {
    callback: (_e, m) => void events.push(Schema.decodeUnknownSync(PlacedEvent)(m.json()))
  })
  return { events, stop: () => sub.unsubscribe() }
}

const timing = { heartbeatMs: 150, deadAfterMs: 1000 }

/** Node `a` in a scope of its own: `silence` closes it, so the node stops beating without a word (nothing released). */
const silenceable = (types: Parameters<typeof startNode>[0]["types"]) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const node = yield* startNode({ name: "a", types, ...timing }).pipe(Scope.provide(scope))
    return { node, silence: Scope.close(scope, Exit.void) }
  })

describe("placement policy", () => {
  const c = (node: string, actors: number, types: Array<string>, devices: Array<string> = []): Candidate => ({ node, actors, types, devices })
  const nodes = [c("b", 3, ["w"]), c("a", 1, ["w", "x"], ["gpu0"]), c("c", 1, ["w"], ["gpu1"])]

  it("spreads to the node with the fewest actors that has the type (ties by name), pins to a node or a device, or finds none", () => {
    expect(choose(spread, ["w"], nodes)).toBe("a")
    expect(choose(spread, ["x"], nodes)).toBe("a")
    expect(choose(spread, ["y"], nodes)).toBeUndefined()
    expect(choose(onNode("b"), ["w"], nodes)).toBe("b")
    expect(choose(onNode("b"), ["x"], nodes)).toBeUndefined()
    expect(choose(onNode("z"), ["w"], nodes)).toBeUndefined()
    expect(choose(onDevice("gpu1"), ["w"], nodes)).toBe("c")
    expect(choose(onDevice("gpu1"), ["x"], nodes)).toBeUndefined()
    expect(choose(onDevice("gpu9"), ["w"], nodes)).toBeUndefined()
  })

  it("places several kinds together only on a node that has every one", () => {
    expect(choose(spread, ["w", "x"], nodes)).toBe("a")
    expect(choose(onDevice("gpu1"), ["w", "x"], nodes)).toBeUndefined()
    expect(choose(spread, ["x", "y"], nodes)).toBeUndefined()
  })
})

describe("re-placement", () => {
  it("places the actors of a silent node again as their policies say, once each, from their snapshots; temporary ones stay dead", async () => {
    const types = [
      probeType("spread"),
      probeType("on-device", { placement: onDevice("gpu7") }),
      probeType("on-node", { placement: onNode("c") }),
      probeType("temporary", { restart: "temporary" })
    ]
    const result = await withSystem("place", Effect.gen(function* () {
      const system = yield* ActorSystem
      const placed = placedEvents(system)
      const { node: a, silence } = yield* silenceable(types)
      yield* startNode({ name: "b", types, devices: ["gpu7"], ...timing })
      yield* startNode({ name: "c", types, ...timing })
      const ids = ["spread/s1", "on-device/d1", "on-node/n1", "temporary/t1"]
      for (const key of ids) {
        const [kind, id] = key.split("/") as [string, string]
        yield* a.spawn(kind, id)
        yield* system.ask(refOf(ProbeProtocol, address(kind, id)), "Record", { item: `before-${id}` })
      }
      yield* Effect.sleep(Duration.millis(400)) // b and c have reported their types
      // Node a stops beating without a word (its scope closes; nothing is released).
      yield* silence
      const moved = yield* eventually(
        Effect.gen(function* () {
          const es = yield* Effect.forEach(ids.slice(0, 3), registryEntry)
          return es.every((e) => e?.status === "running" && e.node !== "a") ? es : undefined
        })
      )
      // The claim is written before the new incarnation subscribes: ask until each answers.
      const items = yield* Effect.forEach(ids.slice(0, 3), (key) => {
        const [kind, id] = key.split("/") as [string, string]
        return eventually(system.ask(refOf(ProbeProtocol, address(kind, id)), "Items", undefined))
      })
      yield* Effect.sleep(Duration.millis(1500)) // time enough to place the temporary one, were it placed
      const temporary = yield* registryEntry("temporary/t1")
      placed.stop()
      return { moved, items, temporary, events: placed.events }
    }))
    const [s1, d1, n1] = result.moved
    expect(d1).toMatchObject({ node: "b", incarnation: 2 })
    expect(n1).toMatchObject({ node: "c", incarnation: 2 })
    expect(["b", "c"]).toContain(s1!.node)
    expect(result.items).toEqual([["before-s1"], ["before-d1"], ["before-n1"]])
    expect(result.temporary).toMatchObject({ node: "a", status: "dead" })
    expect(result.events.map((e) => `${e.kind}/${e.id}`).sort()).toEqual(["on-device/d1", "on-node/n1", "spread/s1"])
    expect(result.events.every((e) => e.from === "a" && e.incarnation === 1 && ["b", "c"].includes(e.by))).toBe(true)
  })
})

describe("a node declared dead while it lives", () => {
  it("claims its entry and its group's again (new incarnations), keeps its members and takes spawns", async () => {
    const result = await withSystem("reclaim", Effect.gen(function* () {
      const system = yield* ActorSystem
      const placed = placedEvents(system)
      const a = yield* startNode({ name: "a", types: [probeType("spread")], ...timing })
      yield* a.spawnGroup({ name: "g1", strategy: "one-for-all", members: [{ kind: "spread", id: "m1" }] })
      const before = yield* Effect.forEach(["node/a", "group/g1"], registryEntry)
      // What liveness writes when it has not seen an entry change for deadAfterMs (retried past renewals).
      const markDead = (key: string) =>
        eventually(
          Effect.promise(async () => {
            const stored = await system.registry.get(key)
            const dead = { ...(stored!.json() as object), status: "dead" }
            return system.registry.update(key, encodeJson(dead), stored!.revision).then(() => true, () => undefined)
          })
        )
      yield* markDead("node/a")
      yield* markDead("group/g1")
      const after = yield* eventually(
        Effect.forEach(["node/a", "group/g1"], registryEntry).pipe(
          Effect.map((es) => (es.every((e, i) => e?.status === "running" && e.incarnation > before[i]!.incarnation) ? es : undefined))
        )
      )
      const spawned = yield* eventually(system.ask(nodeRef("a"), "Spawn", { kind: "spread", id: "s9" }))
      yield* Effect.sleep(Duration.millis(1500)) // time enough to place the group elsewhere, were it placed
      const member = yield* registryEntry("spread/m1")
      placed.stop()
      return { before, after, spawned, member, hosted: a.hosted().map((h) => `${h.kind}/${h.id}`), events: placed.events }
    }))
    expect(result.after.map((e) => e!.incarnation)).toEqual(result.before.map((e) => e!.incarnation + 1))
    expect(result.after[1]!.load).toEqual({ group: { name: "g1", strategy: "one-for-all", members: [{ kind: "spread", id: "m1" }] } })
    expect(result.spawned).toMatchObject({ kind: "spread", id: "s9", node: "a", alreadyRunning: false })
    expect(result.member).toMatchObject({ node: "a", status: "running", incarnation: 1 })
    expect(result.hosted).toEqual(expect.arrayContaining(["spread/m1", "spread/s9"]))
    expect(result.events).toEqual([])
  })
})

describe("re-placement of a group", () => {
  it("places a silent node's group again as a group, on a node with every member's kind, with the members it still hosted", async () => {
    const types = [probeType("grp-a"), probeType("grp-b"), probeType("grp-t", { restart: "temporary" })]
    const result = await withSystem("place-group", Effect.gen(function* () {
      const system = yield* ActorSystem
      const placed = placedEvents(system)
      const { node: a, silence } = yield* silenceable(types)
      // b cannot host grp-b, so the group can only go to c; grp-a alone would spread to b (ties by name).
      yield* startNode({ name: "b", types: [types[0]!], ...timing })
      const c = yield* startNode({ name: "c", types, ...timing })
      const members = ["grp-a/x", "grp-b/x", "grp-t/x", "grp-a/y"].map((k) => ({ kind: k.split("/")[0]!, id: k.split("/")[1]! }))
      yield* a.spawnGroup({ name: "dev-0", strategy: "one-for-all", members })
      for (const m of members.slice(0, 2)) yield* system.ask(refOf(ProbeProtocol, address(m.kind, m.id)), "Record", { item: `before-${m.kind}` })
      yield* a.stop("grp-a", "y") // leaves the group: not placed again with it
      yield* Effect.sleep(Duration.millis(400)) // a beat of the group entry without it; b and c have reported their types
      const groupBefore = yield* registryEntry("group/dev-0")
      yield* silence
      const moved = yield* eventually(
        Effect.gen(function* () {
          const es = yield* Effect.forEach(["group/dev-0", "grp-a/x", "grp-b/x"], registryEntry)
          return es.every((e) => e?.status === "running" && e.node !== "a") ? es : undefined
        })
      )
      const items = yield* Effect.forEach(members.slice(0, 2), (m) => eventually(system.ask(refOf(ProbeProtocol, address(m.kind, m.id)), "Items", undefined)))
      yield* Effect.sleep(Duration.millis(1500)) // time enough to place the others, were they placed
      const others = yield* Effect.forEach(["grp-t/x", "grp-a/y"], registryEntry)
      placed.stop()
      return { groupBefore, moved, items, others, hostedOnC: c.hosted().filter((h) => h.kind !== "node"), events: placed.events }
    }))
    expect(result.groupBefore).toMatchObject({ node: "a", status: "running", load: { group: { name: "dev-0", strategy: "one-for-all" } } })
    expect((result.groupBefore!.load as { group: { members: unknown } }).group.members).toEqual([
      { kind: "grp-a", id: "x" },
      { kind: "grp-b", id: "x" },
      { kind: "grp-t", id: "x" }
    ])
    expect(result.moved.map((e) => `${e!.kind}/${e!.id}@${e!.node}#${e!.incarnation}`)).toEqual(["group/dev-0@c#2", "grp-a/x@c#2", "grp-b/x@c#2"])
    expect(result.items).toEqual([["before-grp-a"], ["before-grp-b"]])
    expect(result.hostedOnC.map((h) => `${h.kind}/${h.id}@${h.group}`).sort()).toEqual(["grp-a/x@dev-0", "grp-b/x@dev-0"])
    expect(result.others.map((e) => `${e!.node}:${e!.status}`)).toEqual(["a:dead", "a:stopped"])
    expect(result.events).toEqual([{ kind: "group", id: "dev-0", from: "a", to: "c", incarnation: 1, by: "c" }])
  })
})

describe("re-placement across node processes", () => {
  const started: Array<NodeProcess> = []
  afterEach(() => {
    for (const p of started.splice(0)) if (p.child.exitCode === null) p.child.kill("SIGKILL")
  })

  it("an actor of a node killed with SIGKILL is placed on the other node and answers an ask from it", async () => {
    const result = await withSystem("replace", Effect.gen(function* () {
      const system = yield* ActorSystem
      const args = (name: string, spawn: string) =>
        ["--name", name, "--run", "replace", "--load", "test/fixtures/actors.ts", "--spawn", spawn, "--heartbeat-ms", "200", "--dead-after-ms", "1000"]
      const a = startNodeProcess(system.nats.servers, args("a", "ledger/p1"))
      const b = startNodeProcess(system.nats.servers, args("b", "relay/r1"))
      started.push(a, b)
      yield* Effect.promise(() => Promise.all([a.waitFor("ready"), b.waitFor("ready")]))
      const ledger = refOf(LedgerProtocol, address("ledger", "p1"))
      yield* system.tell(ledger, "Append", { item: "before" })
      yield* eventually(system.ask(ledger, "Items", undefined).pipe(Effect.map((xs) => (xs.length === 1 ? xs : undefined))))
      const before = yield* registryEntry("ledger/p1")
      const placed = placedEvents(system)
      const killedAt = performance.now()
      a.child.kill("SIGKILL")
      const after = yield* eventually(registryEntry("ledger/p1").pipe(Effect.map((e) => (e?.status === "running" && e.node === "b" ? e : undefined))))
      const movedAfterMs = performance.now() - killedAt
      // The claim is written before the new incarnation subscribes: wait until it answers.
      yield* eventually(system.ask(ledger, "Items", undefined))
      const viaRelay = yield* system.ask(refOf(RelayProtocol, address("relay", "r1")), "Forward", { target: "ledger/p1", item: "after" })
      const items = yield* system.ask(ledger, "Items", undefined)
      placed.stop()
      return { before, after, movedAfterMs, viaRelay, items, events: placed.events }
    }))
    expect(result.before).toMatchObject({ node: "a", incarnation: 1, status: "running" })
    expect(result.after).toMatchObject({ node: "b", incarnation: 2, status: "running" })
    expect(result.movedAfterMs).toBeLessThan(6000)
    expect(result.viaRelay).toBe(2)
    expect(result.items).toEqual(["before", "after"])
    expect(result.events).toEqual([{ kind: "ledger", id: "p1", from: "a", to: "b", incarnation: 1, by: "b" }])
  })
})
