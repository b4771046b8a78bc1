/**
 * Poison inputs cannot stop an actor (issue 13): a message whose dead letter would be larger
 * than the server's max_payload, a snapshot that does not decode, asks that reuse an earlier
 * message id (or one being handled, more of them than it keeps waiting), and more asks than the
 * actor's queue holds.
 */
import { headers as natsHeaders, nuid } from "@nats-io/transport-node"
import { Duration, Effect, Schedule } from "effect"
import { describe, expect, it } from "vitest"
import { address } from "../../src/runtime/names.ts"
import { startNode } from "../../src/runtime/node.ts"
import { Headers } from "../../src/runtime/protocol.ts"
import { ActorSystem, refOf } from "../../src/runtime/system.ts"
import { Ledger, LedgerProtocol } from "../fixtures/actors.ts"
import { eventually, registryEntry, withSystem } from "./harness.ts"

const ledger = (id: string) => refOf(LedgerProtocol, address("ledger", id))

/** A raw request to `id`'s ask subject with `tag` and `body`; the reply's JSON. */
const askRaw = (id: string, tag: string, body: Uint8Array | string, msgId?: string) =>
  Effect.gen(function* () {
    const system = yield* ActorSystem
    const h = natsHeaders()
    h.set(Headers.request, tag)
    if (msgId !== undefined) h.set(Headers.msgId, msgId)
    const m = yield* Effect.promise(() => system.nats.nc.request(system.layout.ask(address("ledger", id)), body, { headers: h, timeout: 5000 }))
    return JSON.parse(new TextDecoder().decode(m.data)) as { _tag: string; reason?: string; exit?: unknown }
  })

/** The dead-letter stream's messages (subject, size, headers). */
const deadLetters = Effect.gen(function* () {
  const system = yield* ActorSystem
  const info = yield* Effect.promise(() => system.nats.jsm.streams.info(system.layout.deadStream))
  const out: Array<{ size: number; headers: Record<string, string> }> = []
  for (let seq = info.state.first_seq; info.state.messages > 0 && seq <= info.state.last_seq; seq++) {
    const m = yield* Effect.promise(() => system.nats.jsm.streams.getMessage(system.layout.deadStream, { seq }))
    const headers: Record<string, string> = {}
    if (m?.header) for (const [k, vs] of m.header) headers[k] = vs[0]!
    if (m !== null) out.push({ size: m.data.length, headers })
  }
  return out
})

describe("poison messages", () => {
  it("six asks near max_payload with a long unknown tag are dead-lettered truncated, and the actor keeps its incarnation", async () => {
    const result = await withSystem("poison-big", Effect.gen(function* () {
      const system = yield* ActorSystem
      const node = yield* startNode({ name: "n1", types: [Ledger] })
      yield* node.spawn("ledger", "p1")
      const maxPayload = system.nats.nc.info!.max_payload
      const tag = "X".repeat(6000)
      const body = new Uint8Array(maxPayload - 6500).fill(0x41)
      const replies = []
      for (let i = 0; i < 6; i++) replies.push(yield* askRaw("p1", tag, body))
      const after = yield* system.ask(ledger("p1"), "Append", { item: "still here" })
      const entry = yield* registryEntry("ledger/p1")
      const dead = yield* eventually(deadLetters.pipe(Effect.map((xs) => (xs.length >= 6 ? xs : undefined))))
      return { maxPayload, replies, after, entry, dead }
    }))
    expect(result.replies.every((r) => r._tag === "Rejected" && /unknown request/.test(r.reason!))).toBe(true)
    expect(result.after).toBe(1)
    expect(result.entry?.status).toBe("running")
    expect(result.entry?.incarnation).toBe(1)
    expect(result.dead.length).toBe(6)
    for (const d of result.dead) {
      expect(d.size).toBeLessThan(result.maxPayload)
      expect(d.headers[Headers.deadOriginalLength]).toBe(String(result.maxPayload - 6500))
      expect(d.headers[Headers.deadOriginalDigest]).toMatch(/^sha256:[0-9a-f]{64}$/)
      expect(d.headers[Headers.deadReason]).toMatch(/unknown request/)
    }
  })

  it("a dead letter that cannot be published crashes nothing: the ask is answered, the tell goes back until it can be", async () => {
    const result = await withSystem("poison-nodead", Effect.gen(function* () {
      const system = yield* ActorSystem
      const node = yield* startNode({ name: "n1", types: [Ledger] })
      yield* node.spawn("ledger", "p2")
      const config = (yield* Effect.promise(() => system.nats.jsm.streams.info(system.layout.deadStream))).config
      yield* Effect.promise(() => system.nats.jsm.streams.delete(system.layout.deadStream))
      const ask = yield* askRaw("p2", "Nope", "{}")
      // A tell whose copied headers would make JetStream refuse the dead letter, were they kept.
      const h = natsHeaders()
      h.set(Headers.request, "Nope")
      h.set("Nats-Expected-Stream", system.layout.journalStream)
      yield* Effect.promise(() => system.nats.js.publish(system.layout.tell(address("ledger", "p2")), "{}", { headers: h, msgID: nuid.next() }))
      yield* Effect.sleep("500 millis")
      const during = yield* system.ask(ledger("p2"), "Append", { item: "during" })
      yield* Effect.promise(() => system.nats.jsm.streams.add(config))
      const dead = yield* eventually(deadLetters.pipe(Effect.map((xs) => (xs.length >= 1 ? xs : undefined))), 15_000)
      const entry = yield* registryEntry("ledger/p2")
      return { ask, during, dead, entry }
    }))
    expect(result.ask._tag).toBe("Rejected")
    expect(result.during).toBe(1)
    expect(result.entry?.incarnation).toBe(1)
    expect(result.dead.length).toBe(1)
    expect(result.dead[0]!.headers[Headers.deadReason]).toMatch(/unknown request 'Nope'|delivered \d+ times/)
    expect(result.dead[0]!.headers["Gyre-Dead-Header-Nats-Expected-Stream"]).toMatch(/journal|JOURNAL/i)
  })

  it("a snapshot that does not decode is quarantined with its reason; the actor starts from its initial state, or escalates by its policy", async () => {
    const Strict: typeof Ledger = {
      ...Ledger,
      kind: "strict",
      corruptSnapshot: "escalate",
      supervision: { maxRestarts: 2, withinMs: 60_000, backoff: Schedule.spaced(Duration.millis(50)) }
    }
    const result = await withSystem("poison-snap", Effect.gen(function* () {
      const system = yield* ActorSystem
      yield* Effect.promise(() => system.state.put("ledger/q1", "{not json"))
      yield* Effect.promise(() => system.state.put("ledger/q2", JSON.stringify({ state: { items: 5 }, handled: [], incarnation: 1, at: 0 })))
      yield* Effect.promise(() => system.state.put("strict/q3", "{not json"))
      const node = yield* startNode({ name: "n1", types: [Ledger, Strict] })
      yield* node.spawn("ledger", "q1")
      yield* node.spawn("ledger", "q2")
      yield* node.spawn("strict", "q3")
      const fresh = [yield* system.ask(ledger("q1"), "Items", undefined), yield* system.ask(ledger("q2"), "Items", undefined)]
      const appended = yield* system.ask(ledger("q1"), "Append", { item: "new" })
      const stored = (yield* Effect.promise(() => system.state.get("ledger/q1")))!.json() as { state: unknown }
      const strict = yield* eventually(registryEntry("strict/q3").pipe(Effect.map((e) => (e?.status === "failed" ? e : undefined))))
      const dead = yield* deadLetters
      return { fresh, appended, stored, strict, dead, q1: yield* registryEntry("ledger/q1") }
    }))
    expect(result.fresh).toEqual([[], []])
    expect(result.appended).toBe(1)
    expect(result.stored.state).toEqual({ items: ["new"] })
    expect(result.q1?.incarnation).toBe(1)
    expect(result.strict.status).toBe("failed")
    const reasons = result.dead.map((d) => `${d.headers[Headers.deadActor]}: ${d.headers[Headers.deadReason]}`)
    expect(reasons.filter((r) => r.startsWith("ledger/q1: snapshot of ledger/q1 (revision 1) does not decode"))).toHaveLength(1)
    expect(reasons.filter((r) => r.startsWith("ledger/q2: snapshot of ledger/q2 (revision 2) does not decode"))).toHaveLength(1)
    // Three starts of strict/q3 (two restarts, then the escalation), one quarantined copy.
    expect(reasons.filter((r) => r.startsWith("strict/q3: snapshot of strict/q3"))).toHaveLength(1)
    expect(result.dead.find((d) => d.headers[Headers.deadActor] === "ledger/q1")!.size).toBe("{not json".length)
  })

  it("an ask that reuses an earlier message id gets the recorded answer", async () => {
    const result = await withSystem("poison-reuse", Effect.gen(function* () {
      const system = yield* ActorSystem
      const node = yield* startNode({ name: "n1", types: [Ledger] })
      yield* node.spawn("ledger", "r1")
      const id = nuid.next()
      const first = yield* askRaw("r1", "Append", JSON.stringify({ item: "a" }), id)
      const again = yield* askRaw("r1", "Append", JSON.stringify({ item: "a" }), id)
      // Two at once while the first holds: one handling, the same answer for both.
      const id2 = nuid.next()
      const both = yield* Effect.all([askRaw("r1", "Append", JSON.stringify({ item: "b", holdMs: 300 }), id2), askRaw("r1", "Append", JSON.stringify({ item: "b", holdMs: 300 }), id2)], { concurrency: 2 })
      // 70 at once (AskOptions.msgId): one handling; past 64 followers the oldest are let go.
      const id3 = nuid.next()
      const many = yield* Effect.forEach(
        Array.from({ length: 70 }, () => system.ask(ledger("r1"), "Append", { item: "c", holdMs: 1000 }, { msgId: id3, timeoutMs: 3000 })),
        (ask) => Effect.exit(ask),
        { concurrency: "unbounded" }
      )
      const items = yield* system.ask(ledger("r1"), "Items", undefined)
      return { first, again, both, many, items }
    }))
    expect(result.first).toEqual({ _tag: "Exit", exit: { _tag: "Success", value: 1 } })
    expect(result.again).toEqual(result.first)
    expect(result.both[0]).toEqual({ _tag: "Exit", exit: { _tag: "Success", value: 2 } })
    expect(result.both[1]).toEqual(result.both[0])
    const answered = result.many.filter((e) => e._tag === "Success")
    expect(answered).toHaveLength(65)
    expect(new Set(answered.map((e) => JSON.stringify(e)))).toEqual(new Set([JSON.stringify(answered[0])]))
    expect(result.many.filter((e) => e._tag === "Failure")).toHaveLength(5)
    expect(result.items).toEqual(["a", "b", "c"])
  })

  it("asks past the queue's bound (count or bytes) are refused at once with ActorOverloaded; the queued ones are answered", async () => {
    const Busy: typeof Ledger = { ...Ledger, kind: "busy", persistence: undefined, maxQueuedAsks: 50, maxQueuedAskBytes: 3_000_000 }
    const busy = (id: string) => refOf(LedgerProtocol, address("busy", id))
    const result = await withSystem("poison-queue", Effect.gen(function* () {
      const system = yield* ActorSystem
      const node = yield* startNode({ name: "n1", types: [Busy] })
      yield* node.spawn("busy", "count")
      yield* node.spawn("busy", "bytes")
      const t0 = performance.now()
      const outcome = (id: string, item: string) =>
        system.ask(busy(id), "Append", { item }, { timeoutMs: 60_000 }).pipe(
          Effect.as("ok"),
          Effect.catch((e) => Effect.succeed(e._tag)),
          Effect.map((tag) => ({ tag, at: performance.now() - t0 }))
        )
      const holds = Effect.all([busy("count"), busy("bytes")].map((r) => system.ask(r, "Append", { item: "hold", holdMs: 3000 }).pipe(Effect.map(() => performance.now() - t0))), { concurrency: 2 })
      const [held, small, big] = yield* Effect.all(
        [holds, Effect.all(Array.from({ length: 300 }, (_, i) => outcome("count", `s${i}`)), { concurrency: "unbounded" }),
          Effect.all(Array.from({ length: 300 }, (_, i) => outcome("bytes", `${i}`.padEnd(100_000, "x"))), { concurrency: "unbounded" })],
        { concurrency: 3 }
      )
      const refused = [...small, ...big].filter((x) => x.tag === "ActorOverloaded")
      return {
        small,
        big,
        refusedSmall: small.filter((x) => x.tag === "ActorOverloaded").length,
        refusedBig: big.filter((x) => x.tag === "ActorOverloaded").length,
        lastRefusedAt: Math.max(...refused.map((x) => x.at)),
        heldUntil: Math.min(...held),
        items: yield* system.ask(busy("count"), "Items", undefined)
      }
    }))
    expect(result.small.filter((x) => x.tag === "ok").length).toBe(50)
    expect(result.refusedSmall).toBe(250)
    // 3 MB of 100 kB asks: 29 or 30 wait (the JSON is a little larger than the item).
    expect(result.big.filter((x) => x.tag === "ok").length).toBeGreaterThanOrEqual(25)
    expect(result.big.filter((x) => x.tag === "ok").length).toBeLessThanOrEqual(30)
    expect(result.refusedBig + result.big.filter((x) => x.tag === "ok").length).toBe(300)
    expect(result.items.length).toBe(51)
    // Refused at once: before the handler that held the queue finished.
    expect(result.lastRefusedAt).toBeLessThan(result.heldUntil)
  })
})
