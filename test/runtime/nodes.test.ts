/**
 * The actor runtime across `gyre node` child processes on one fresh nats-server: asks and
 * tells between nodes, a node killed with SIGKILL mid-message, heartbeat loss, graceful drain,
 * and a new actor type loaded from one file and spawned by request.
 */
import { Duration, Effect, Schema } from "effect"
import { afterEach, describe, expect, it } from "vitest"
import { address } from "../../src/runtime/names.ts"
import { nodeRef, startNode } from "../../src/runtime/node.ts"
import type { DeadEvent } from "../../src/runtime/registry.ts"
import { ActorSystem, refOf } from "../../src/runtime/system.ts"
import { EvaluatorProtocol } from "../../examples/evaluator.ts"
import { LedgerProtocol, RelayProtocol } from "../fixtures/actors.ts"
import { startNodeProcess, withSystem, type NodeProcess, eventually } from "./harness.ts"

const until = <A>(check: Effect.Effect<A | undefined, any, any>, timeoutMs = 20_000) => eventually(check, timeoutMs, 100)

const FIXTURES = "test/fixtures/actors.ts"
const ledger = (id: string) => refOf(LedgerProtocol, address("ledger", id))

const started: Array<NodeProcess> = []
const node = (url: string, args: ReadonlyArray<string>) => {
  const p = startNodeProcess(url, args)
  started.push(p)
  return p
}
afterEach(() => {
  for (const p of started.splice(0)) if (p.child.exitCode === null) p.child.kill("SIGKILL")
})


const ready = (p: NodeProcess) => Effect.promise(() => p.waitFor("ready"))

describe("actor runtime (node processes)", () => {
  it("asks and tells across two node processes, actor to actor", async () => {
    const result = await withSystem("two", Effect.gen(function* () {
      const system = yield* ActorSystem
      const a = node(system.nats.servers, ["--name", "a", "--run", "two", "--load", FIXTURES, "--spawn", "relay/r1"])
      const b = node(system.nats.servers, ["--name", "b", "--run", "two", "--load", FIXTURES, "--spawn", "ledger/on-b"])
      yield* ready(a)
      yield* ready(b)
      const relay = refOf(RelayProtocol, address("relay", "r1"))
      const first = yield* system.ask(relay, "Forward", { target: "ledger/on-b", item: "via-a" })
      yield* system.tell(relay, "Forward", { target: "ledger/on-b", item: "told-to-a" })
      yield* system.tell(ledger("on-b"), "Append", { item: "told-to-b" })
      const items = yield* until(system.ask(ledger("on-b"), "Items", undefined).pipe(Effect.map((xs) => (xs.length === 3 ? xs : undefined))))
      return { first, items }
    }))
    expect(result.first).toBe(1)
    expect([...result.items].sort()).toEqual(["told-to-a", "told-to-b", "via-a"])
  })

  it("resumes an actor whose node was killed with SIGKILL mid-message from its snapshot, and handles that message after the restart", async () => {
    const result = await withSystem("kill", Effect.gen(function* () {
      const system = yield* ActorSystem
      const args = ["--run", "kill", "--load", FIXTURES, "--spawn", "ledger/k1", "--ack-wait-ms", "1500", "--dead-after-ms", "2000"]
      const first = node(system.nats.servers, ["--name", "first", ...args])
      yield* ready(first)
      yield* system.tell(ledger("k1"), "Append", { item: "before" })
      yield* until(system.ask(ledger("k1"), "Items", undefined).pipe(Effect.map((xs) => (xs.length === 1 ? xs : undefined))))
      yield* system.tell(ledger("k1"), "Append", { item: "interrupted", holdMs: 3000 })
      yield* Effect.sleep(Duration.millis(700))
      first.child.kill("SIGKILL")
      yield* Effect.promise(() => first.exited)
      const second = node(system.nats.servers, ["--name", "second", ...args])
      yield* ready(second)
      const items = yield* until(system.ask(ledger("k1"), "Items", undefined).pipe(Effect.map((xs) => (xs.length === 2 ? xs : undefined))))
      yield* Effect.sleep(Duration.millis(2000))
      const settled = yield* system.ask(ledger("k1"), "Items", undefined)
      return { items, settled }
    }))
    expect(result.items).toEqual(["before", "interrupted"])
    expect(result.settled).toEqual(["before", "interrupted"])
  })

  it("detects heartbeat loss of a killed node and of its actors", async () => {
    const result = await withSystem("beat", Effect.gen(function* () {
      const system = yield* ActorSystem
      const deaths: Array<DeadEvent> = []
      yield* startNode({ name: "watcher", types: [], heartbeatMs: 200, deadAfterMs: 1200, onDead: (e) => Effect.sync(() => deaths.push(e)) })
      const victim = node(system.nats.servers, ["--name", "victim", "--run", "beat", "--load", FIXTURES, "--spawn", "ledger/h1", "--heartbeat-ms", "200"])
      yield* ready(victim)
      yield* Effect.sleep(Duration.millis(1500))
      const beforeKill = deaths.length
      const killedAt = Date.now()
      victim.child.kill("SIGKILL")
      const found = yield* until(Effect.sync(() => (deaths.length >= 2 ? [...deaths] : undefined)), 10_000)
      const entry = yield* Effect.promise(() => system.registry.get("ledger/h1"))
      return { beforeKill, found, detectedAfterMs: Date.now() - killedAt, status: (entry!.json() as { status: string }).status }
    }))
    expect(result.beforeKill).toBe(0)
    expect(result.found.map((d) => `${d.kind}/${d.id}`).sort()).toEqual(["ledger/h1", "node/victim"])
    expect(result.found.every((d) => d.node === "victim" && d.silentForMs >= 1200)).toBe(true)
    expect(result.detectedAfterMs).toBeLessThan(6000)
    expect(result.status).toBe("dead")
  })

  it("drains gracefully on SIGTERM: nothing told is lost or handled twice, and order is kept", async () => {
    const total = 120
    const result = await withSystem("drain", Effect.gen(function* () {
      const system = yield* ActorSystem
      const args = ["--run", "drain", "--load", FIXTURES, "--spawn", "ledger/d1"]
      const first = node(system.nats.servers, ["--name", "first", ...args])
      yield* ready(first)
      for (let i = 0; i < total; i++) yield* system.tell(ledger("d1"), "Append", { item: `m${i}`, holdMs: 10 })
      yield* until(system.ask(ledger("d1"), "Items", undefined).pipe(Effect.map((xs) => (xs.length >= 20 ? xs : undefined))))
      first.child.kill("SIGTERM")
      const code = yield* Effect.promise(() => first.exited)
      const drained = first.events.some((e) => e.event === "drained")
      const second = node(system.nats.servers, ["--name", "second", ...args])
      yield* ready(second)
      const items = yield* until(system.ask(ledger("d1"), "Items", undefined).pipe(Effect.map((xs) => (xs.length >= total ? xs : undefined))), 30_000)
      return { code, drained, items }
    }))
    expect(result.code).toBe(0)
    expect(result.drained).toBe(true)
    expect(result.items).toEqual(Array.from({ length: total }, (_, i) => `m${i}`))
  })

  it("spawns an actor type loaded from one file on request and asks it", async () => {
    const result = await withSystem("spawn", Effect.gen(function* () {
      const system = yield* ActorSystem
      const n = node(system.nats.servers, ["--name", "host", "--run", "spawn", "--load", "examples/evaluator.ts"])
      yield* ready(n)
      const spawned = yield* system.ask(nodeRef("host"), "Spawn", { kind: "evaluator", id: "e1" })
      const again = yield* system.ask(nodeRef("host"), "Spawn", { kind: "evaluator", id: "e1" })
      const unknown = yield* Effect.flip(system.ask(nodeRef("host"), "Spawn", { kind: "nope", id: "x" }))
      const evaluator = refOf(EvaluatorProtocol, address("evaluator", "e1"))
      const score = yield* system.ask(evaluator, "Evaluate", { candidate: "the cat sat", reference: "the cat sat down" })
      const empty = yield* Effect.flip(system.ask(evaluator, "Evaluate", { candidate: "x", reference: " " }))
      const listed = yield* system.ask(nodeRef("host"), "List", undefined)
      return { spawned, again, unknown, score, empty, listed }
    }))
    expect(result.spawned).toEqual({ kind: "evaluator", id: "e1", node: "host", alreadyRunning: false })
    expect(result.again.alreadyRunning).toBe(true)
    expect(result.unknown._tag).toBe("UnknownActorKind")
    expect(result.score.exact).toBe(false)
    expect(result.score.score).toBeCloseTo((2 * 3) / 7, 10)
    expect(result.empty._tag).toBe("EmptyReference")
    expect(result.listed.map((a) => `${a.kind}/${a.id}`).sort()).toEqual(["evaluator/e1", "node/host"])
    expect(Schema.is(Schema.Array(Schema.Struct({ kind: Schema.String, id: Schema.String, restarts: Schema.Number })))(result.listed)).toBe(true)
  })
})
