/**
 * The actor runtime in one process against a fresh nats-server: delivery, dedup, dead letters,
 * typed errors, supervision, the journal and service discovery.
 */
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { headers as natsHeaders, nuid } from "@nats-io/transport-node"
import { Duration, Effect, Exit, Schema, Stream } from "effect"
import { describe, expect, it } from "vitest"
import { readJournal } from "../../src/runtime/journal.ts"
import { address } from "../../src/runtime/names.ts"
import { startNode, nodeRef } from "../../src/runtime/node.ts"
import { Headers } from "../../src/runtime/protocol.ts"
import { RegistryEntry } from "../../src/runtime/registry.ts"
import { ActorSystem, refOf } from "../../src/runtime/system.ts"
import { Crasher, CrasherProtocol, Ledger, LedgerProtocol } from "../fixtures/actors.ts"
import { Evaluator, EvaluatorProtocol } from "../../examples/evaluator.ts"
import { withSystem, eventually } from "./harness.ts"

const ledger = (id: string) => refOf(LedgerProtocol, address("ledger", id))

/** Polls `check` until it returns a value or `timeoutMs` passes. */

const readStream = (name: string) =>
  Effect.gen(function* () {
    const system = yield* ActorSystem
    const info = yield* Effect.promise(() => system.nats.jsm.streams.info(name))
    const out: Array<{ subject: string; data: string; headers: Record<string, string> }> = []
    for (let seq = info.state.first_seq; seq <= info.state.last_seq && info.state.messages > 0; seq++) {
      const m = yield* Effect.promise(() => system.nats.jsm.streams.getMessage(name, { seq }))
      if (m === null) continue
      const headers: Record<string, string> = {}
      if (m.header) for (const [k, vs] of m.header) headers[k] = vs[0]!
      out.push({ subject: m.subject, data: new TextDecoder().decode(m.data), headers })
    }
    return out
  })

describe("actor runtime (one process)", () => {
  it("handles tells in order and answers asks with the protocol's success and typed error", async () => {
    const result = await withSystem("order", Effect.gen(function* () {
      const system = yield* ActorSystem
      const node = yield* startNode({ name: "n1", types: [Ledger] })
      yield* node.spawn("ledger", "l1")
      for (let i = 0; i < 20; i++) yield* system.tell(ledger("l1"), "Append", { item: `m${i}` })
      const items = yield* eventually(system.ask(ledger("l1"), "Items", undefined).pipe(Effect.map((xs) => (xs.length === 20 ? xs : undefined))))
      const boom = yield* Effect.exit(system.ask(ledger("l1"), "Boom", { why: "because" }))
      return { items, boom }
    }))
    expect(result.items).toEqual(Array.from({ length: 20 }, (_, i) => `m${i}`))
    expect(Exit.isFailure(result.boom)).toBe(true)
    if (Exit.isFailure(result.boom)) {
      const err = result.boom.cause.reasons[0]
      expect(err?._tag).toBe("Fail")
      expect((err as any).error._tag).toBe("Boom")
      expect((err as any).error.why).toBe("because")
    }
  })

  it("handles a re-published message once and a redelivered one once", async () => {
    const result = await withSystem("dedup", Effect.gen(function* () {
      const system = yield* ActorSystem
      const node = yield* startNode({ name: "n1", types: [Ledger], ackWaitMs: 1000 })
      yield* node.spawn("ledger", "d1")
      const first = yield* system.tell(ledger("d1"), "Append", { item: "once" }, { msgId: "fixed-id" })
      const again = yield* system.tell(ledger("d1"), "Append", { item: "once" }, { msgId: "fixed-id" })
      // The same payload under another message id is another message.
      const h = natsHeaders()
      h.set(Headers.request, "Append")
      const raw = yield* Effect.promise(() =>
        system.nats.js.publish(system.layout.tell(address("ledger", "d1")), JSON.stringify({ item: "once" }), { headers: h, msgID: "fixed-id-2" })
      )
      // A slow message holds the actor past the ack wait: the one buffered behind it is redelivered.
      yield* system.tell(ledger("d1"), "Append", { item: "slow", holdMs: 2500 })
      yield* system.tell(ledger("d1"), "Append", { item: "behind" })
      const items = yield* eventually(system.ask(ledger("d1"), "Items", undefined).pipe(Effect.map((xs) => (xs.includes("behind") ? xs : undefined))))
      yield* Effect.sleep(Duration.millis(1500))
      const after = yield* system.ask(ledger("d1"), "Items", undefined)
      const consumer = yield* Effect.promise(() => system.nats.jsm.consumers.info(system.layout.journalStream, system.layout.consumer(address("ledger", "d1"))))
      return { first, again, raw, items: after, deliveries: consumer.delivered.consumer_seq, sawBehind: items }
    }))
    expect(result.first.duplicate).toBe(false)
    expect(result.again.duplicate).toBe(true)
    expect(result.again.seq).toBe(result.first.seq)
    // The raw publish carried another Nats-Msg-Id, so JetStream stored it: the actor handles it (different id).
    expect(result.raw.duplicate).toBe(false)
    expect(result.items).toEqual(["once", "once", "slow", "behind"])
    // Four distinct messages were stored for the actor; more deliveries than that = redeliveries.
    expect(result.deliveries).toBeGreaterThan(4)
  })

  it("drops a re-publish outside JetStream's duplicate window by message id", async () => {
    const items = await withSystem("window", Effect.gen(function* () {
      const system = yield* ActorSystem
      const node = yield* startNode({ name: "n1", types: [Ledger] })
      yield* node.spawn("ledger", "w1")
      // JetStream forgets an id after its window; the actor remembers it.
      yield* Effect.promise(() => system.nats.jsm.streams.update(system.layout.journalStream, { duplicate_window: 100 * 1_000_000 }))
      const a = yield* system.tell(ledger("w1"), "Append", { item: "x" }, { msgId: "same" })
      yield* Effect.sleep(Duration.millis(400))
      const b = yield* system.tell(ledger("w1"), "Append", { item: "x" }, { msgId: "same" })
      expect(b.duplicate).toBe(false)
      expect(b.seq).toBeGreaterThan(a.seq)
      yield* system.tell(ledger("w1"), "Append", { item: "y" })
      return yield* eventually(system.ask(ledger("w1"), "Items", undefined).pipe(Effect.map((xs) => (xs.includes("y") ? xs : undefined))))
    }))
    expect(items).toEqual(["x", "y"])
  })

  it("dead-letters malformed JSON, a wrong schema and an unknown request with the reason, and keeps answering", async () => {
    const result = await withSystem("dead", Effect.gen(function* () {
      const system = yield* ActorSystem
      const node = yield* startNode({ name: "n1", types: [Ledger] })
      yield* node.spawn("ledger", "b1")
      const subject = system.layout.tell(address("ledger", "b1"))
      const publish = (tag: string, body: string) => {
        const h = natsHeaders()
        h.set(Headers.request, tag)
        return Effect.promise(() => system.nats.js.publish(subject, body, { headers: h, msgID: nuid.next() }))
      }
      yield* publish("Append", "{not json")
      yield* publish("Append", JSON.stringify({ item: 5 }))
      yield* publish("Nope", JSON.stringify({}))
      yield* system.tell(ledger("b1"), "Append", { item: "good" })
      const items = yield* eventually(system.ask(ledger("b1"), "Items", undefined).pipe(Effect.map((xs) => (xs.length > 0 ? xs : undefined))))
      // A bad ask: wrong payload type through a raw request, and an unknown request.
      const askRaw = (tag: string, body: string) => {
        const h = natsHeaders()
        h.set(Headers.request, tag)
        return Effect.promise(() => system.nats.nc.request(system.layout.ask(address("ledger", "b1")), body, { headers: h, timeout: 5000 })).pipe(
          Effect.map((m) => JSON.parse(new TextDecoder().decode(m.data)) as { _tag: string; reason?: string })
        )
      }
      const badAsk = yield* askRaw("Append", JSON.stringify({ item: [1] }))
      const unknownAsk = yield* askRaw("Explode", "{}")
      const dead = yield* eventually(readStream(system.layout.deadStream).pipe(Effect.map((xs) => (xs.length >= 5 ? xs : undefined))))
      const stillAnswers = yield* system.ask(ledger("b1"), "Append", { item: "after" })
      return { items, dead, badAsk, unknownAsk, stillAnswers }
    }))
    expect(result.items).toEqual(["good"])
    expect(result.stillAnswers).toBe(2)
    expect(result.badAsk._tag).toBe("Rejected")
    expect(result.badAsk.reason).toMatch(/payload does not match Append/)
    expect(result.unknownAsk._tag).toBe("Rejected")
    expect(result.unknownAsk.reason).toMatch(/unknown request 'Explode'/)
    const reasons = result.dead.map((d) => d.headers[Headers.deadReason])
    expect(reasons[0]).toMatch(/malformed JSON/)
    expect(result.dead[0]!.data).toBe("{not json")
    expect(result.dead[0]!.headers[Headers.request]).toBe("Append")
    expect(reasons[1]).toMatch(/payload does not match Append/)
    expect(reasons[2]).toMatch(/unknown request 'Nope'/)
    expect(result.dead.every((d) => d.headers[Headers.deadActor] === "ledger/b1")).toBe(true)
    expect(result.dead.every((d) => d.subject === "gyre.dead.dead.ledger.b1")).toBe(true)
  })

  it("an ask to an actor nobody serves fails with ActorUnavailable", async () => {
    const result = await withSystem("askerr", Effect.gen(function* () {
      const system = yield* ActorSystem
      const missing = yield* Effect.exit(system.ask(ledger("nobody"), "Items", undefined, { timeoutMs: 2000 }))
      return { missing }
    }))
    expect(Exit.isFailure(result.missing)).toBe(true)
    if (Exit.isFailure(result.missing)) expect((result.missing.cause.reasons[0] as any).error._tag).toBe("ActorUnavailable")
  })

  it("escalates a crash loop after exactly maxRestarts restarts within the period, and the node keeps serving", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gyre-crash-"))
    process.env.GYRE_TEST_DIR = dir
    try {
      const result = await withSystem("crash", Effect.gen(function* () {
        const system = yield* ActorSystem
        const events: Array<unknown> = []
        const sub = system.nats.nc.subscribe(system.layout.sys("escalated"), { callback: (_e, m) => void events.push(m.json()) })
        const node = yield* startNode({ name: "n1", types: [Crasher, Ledger] })
        yield* node.spawn("ledger", "ok")
        yield* node.spawn("crasher", "loop1")
        const escalated = yield* eventually(Effect.sync(() => (events.length > 0 ? events[0] : undefined)))
        sub.unsubscribe()
        const entry = yield* Effect.promise(() => system.registry.get("crasher/loop1"))
        const status = Schema.decodeUnknownSync(RegistryEntry)(entry!.json()).status
        // A crash inside a handler restarts the actor and it answers again.
        yield* node.spawn("crasher", "c2")
        const crash = yield* Effect.exit(system.ask(refOf(CrasherProtocol, address("crasher", "c2")), "Crash", undefined))
        const pong = yield* eventually(
          system.ask(refOf(CrasherProtocol, address("crasher", "c2")), "Ping", undefined).pipe(Effect.option, Effect.map((o) => (o._tag === "Some" ? o.value : undefined)))
        )
        const alive = yield* system.ask(ledger("ok"), "Append", { item: "still here" })
        return { escalated, status, alive, crash, pong, hosted: node.hosted().map((h) => `${h.kind}/${h.id}`) }
      }))
      const starts = fs.readFileSync(path.join(dir, "loop1.starts"), "utf8").trim().split("\n")
      expect(starts.length).toBe(Crasher.supervision.maxRestarts + 1)
      expect(result.escalated).toMatchObject({ kind: "crasher", id: "loop1", node: "n1", restarts: Crasher.supervision.maxRestarts })
      expect(result.status).toBe("failed")
      expect(result.alive).toBe(1)
      expect(result.hosted).not.toContain("crasher/loop1")
      expect(Exit.isFailure(result.crash)).toBe(true)
      if (Exit.isFailure(result.crash)) {
        const e = (result.crash.cause.reasons[0] as any).error
        expect(e._tag).toBe("RequestRejected")
        expect(e.reason).toMatch(/handler crashed/)
      }
      expect(result.pong).toMatch(/^pong from /)
      const c2starts = fs.readFileSync(path.join(dir, "c2.starts"), "utf8").trim().split("\n")
      expect(c2starts.length).toBe(2)
    } finally {
      delete process.env.GYRE_TEST_DIR
      fs.rmSync(dir, { recursive: true, force: true })
    }
  })

  it("replays the run's journal in order, decoded with the protocols, from a sequence and from a time", async () => {
    const result = await withSystem("journal", Effect.gen(function* () {
      const system = yield* ActorSystem
      const node = yield* startNode({ name: "n1", types: [Ledger, Evaluator] })
      yield* node.spawn("ledger", "j1")
      yield* node.spawn("evaluator", "e1")
      const sent: Array<string> = []
      for (let i = 0; i < 5; i++) {
        yield* system.tell(ledger("j1"), "Append", { item: `t${i}` })
        sent.push(`t${i}`)
      }
      const mid = new Date()
      yield* Effect.sleep(Duration.millis(20))
      yield* system.ask(refOf(EvaluatorProtocol, address("evaluator", "e1")), "Evaluate", { candidate: "a b", reference: "a b" })
      yield* system.tell(ledger("j1"), "Append", { item: "last" })
      yield* eventually(system.ask(ledger("j1"), "Items", undefined).pipe(Effect.map((xs) => (xs.length === 6 ? xs : undefined))))
      // The ask's journal copy is published after the reply; wait until it is there.
      const protocols = { ledger: LedgerProtocol, evaluator: EvaluatorProtocol, node: nodeRef("x").protocol }
      const all = yield* eventually(
        Stream.runCollect(readJournal(system, { protocols })).pipe(Effect.map((xs) => (xs.some((x) => x.via === "ask" && x.name === "Evaluate") ? xs : undefined)))
      )
      const fromTime = yield* Stream.runCollect(readJournal(system, { protocols, from: { time: mid } }))
      const fromSeq = yield* Stream.runCollect(readJournal(system, { protocols, from: { seq: all[3]!.seq } }))
      return { all, fromTime, fromSeq, sent }
    }))
    const tells = result.all.filter((e) => e.via === "tell" && e.actor?.kind === "ledger")
    expect(tells.map((e) => (e.payload as { item: string }).item)).toEqual([...result.sent, "last"])
    expect(tells.every((e) => e.name === "Append" && e.error === undefined)).toBe(true)
    const seqs = result.all.map((e) => e.seq)
    expect([...seqs].sort((a, b) => a - b)).toEqual(seqs)
    const ask = result.all.find((e) => e.via === "ask")!
    expect(ask.actor).toEqual({ kind: "evaluator", id: "e1" })
    expect(ask.payload).toEqual({ candidate: "a b", reference: "a b" })
    expect(result.fromTime.map((e) => e.name)).toEqual(expect.arrayContaining(["Evaluate", "Append"]))
    expect(result.fromTime.some((e) => (e.payload as { item?: string } | undefined)?.item === "t0")).toBe(false)
    expect(result.fromSeq[0]!.seq).toBe(result.all[3]!.seq)
    // Copies of later asks may have landed after `all` was read: the overlap must agree.
    expect(result.fromSeq.slice(0, result.all.length - 3).map((e) => e.seq)).toEqual(result.all.slice(3).map((e) => e.seq))
  })

  it("answers NATS service discovery ($SRV.PING/INFO/STATS) with the node's actors as endpoints", async () => {
    const result = await withSystem("srv", Effect.gen(function* () {
      const system = yield* ActorSystem
      const node = yield* startNode({ name: "disc", types: [Ledger] })
      yield* node.spawn("ledger", "s1")
      yield* system.ask(ledger("s1"), "Append", { item: "x" })
      const req = (subject: string) => Effect.promise(() => system.nats.nc.request(subject, "", { timeout: 3000 })).pipe(Effect.map((m) => m.json<any>()))
      return { ping: yield* req("$SRV.PING.gyre-node"), info: yield* req("$SRV.INFO"), stats: yield* req("$SRV.STATS.gyre-node") }
    }))
    expect(result.ping.type).toBe("io.nats.micro.v1.ping_response")
    expect(result.ping.name).toBe("gyre-node")
    expect(result.ping.metadata["gyre.node"]).toBe("disc")
    expect(result.info.endpoints.map((e: any) => e.name)).toEqual(expect.arrayContaining(["ledger/s1", "node/disc"]))
    const s1 = result.stats.endpoints.find((e: any) => e.name === "ledger/s1")
    expect(s1.num_requests).toBe(1)
    expect(s1.subject).toBe("gyre.srv.ask.ledger.s1")
  })
})
