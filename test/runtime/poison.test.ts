/**
 * Poison inputs cannot stop an actor (issue 13): a message whose dead letter would be larger
 * than the server's max_payload, a snapshot that does not decode, an ask that reuses an earlier
 * message id, and more asks than the actor's queue holds.
 */
import { headers as natsHeaders, nuid } from "@nats-io/transport-node"
import { Effect } from "effect"
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
})
