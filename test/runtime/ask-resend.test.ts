/**
 * An ask is core NATS request/reply, at most once: a request or a reply in flight when a
 * connection is cut is lost. An ask unanswered within `resendMs` is sent again with the same
 * message id, and the actor answers a repeated id without running its handler again (its
 * recorded answer, or the one it is working out). Found by the TCP-proxy fault during
 * `gyre train` (test/chaos/proxy.test.ts): a lost `Generate` reply held a run up for the
 * gateway's whole 600 s ask timeout.
 */
import { headers as natsHeaders, type Msg } from "@nats-io/transport-node"
import { Effect, Exit } from "effect"
import { describe, expect, it } from "vitest"
import { address } from "../../src/runtime/names.ts"
import { startNode } from "../../src/runtime/node.ts"
import { Headers, encodeExitReply, encodePayload, requestOf } from "../../src/runtime/protocol.ts"
import { ActorSystem, refOf } from "../../src/runtime/system.ts"
import { Probe, ProbeProtocol } from "../fixtures/probe.ts"
import { withSystem } from "./harness.ts"

describe("asks sent again with their message id", () => {
  it("an ask whose request is lost is sent again after resendMs with the same id, and its answer taken", async () => {
    const result = await withSystem("resend", Effect.gen(function* () {
      const system = yield* ActorSystem
      const ghost = address("probe", "ghost")
      const rpc = requestOf(ProbeProtocol, "Record")!
      // Not an actor: a subscriber that loses the first request it gets and answers the next.
      const ids: Array<string> = []
      const sub = system.nats.nc.subscribe(system.layout.ask(ghost), {
        callback: (_e, m: Msg) => {
          ids.push(m.headers?.get(Headers.msgId) ?? "")
          if (ids.length > 1) m.respond(encodeExitReply(rpc, Exit.succeed(7)))
        }
      })
      yield* Effect.addFinalizer(() => Effect.sync(() => sub.unsubscribe()))
      const t0 = performance.now()
      const answer = yield* system.ask(refOf(ProbeProtocol, ghost), "Record", { item: "x" }, { timeoutMs: 5000, resendMs: 300 })
      return { answer, ids, ms: performance.now() - t0 }
    }))
    expect(result.answer).toBe(7)
    expect(result.ids).toHaveLength(2)
    expect(result.ids[1]).toBe(result.ids[0])
    expect(result.ms).toBeGreaterThanOrEqual(290)
    expect(result.ms).toBeLessThan(3000)
  })

  it("an ask unanswered for its whole timeout still fails with AskTimeout naming that timeout, after sending it every resendMs", async () => {
    const result = await withSystem("resend-timeout", Effect.gen(function* () {
      const system = yield* ActorSystem
      const mute = address("probe", "mute")
      let seen = 0
      const sub = system.nats.nc.subscribe(system.layout.ask(mute), { callback: () => void seen++ })
      yield* Effect.addFinalizer(() => Effect.sync(() => sub.unsubscribe()))
      const error = yield* Effect.flip(system.ask(refOf(ProbeProtocol, mute), "Items", undefined, { timeoutMs: 1000, resendMs: 300 }))
      return { error, seen }
    }))
    expect(result.error).toMatchObject({ _tag: "AskTimeout", timeoutMs: 1000 })
    // at 0, 300, 600 and 900 ms, the last wait running to the deadline (3 when timers run late
    // on a loaded machine; never a 5th when one fires a little early, as in one CI run)
    expect(result.seen).toBeGreaterThanOrEqual(3)
    expect(result.seen).toBeLessThanOrEqual(4)
  })

  it("an actor whose reply was lost answers the same id again with its answer, the handler run once (also while it is still at it)", async () => {
    const result = await withSystem("resend-actor", Effect.gen(function* () {
      const system = yield* ActorSystem
      const node = yield* startNode({ name: "n", types: [Probe] })
      yield* node.spawn("probe", "p1")
      const p1 = address("probe", "p1")
      const rpc = requestOf(ProbeProtocol, "Record")!
      // An ask whose reply goes nowhere (as if lost): the actor handles it and records its answer.
      const lostAsk = (id: string, holdMs?: number) => {
        const h = natsHeaders()
        h.set(Headers.request, "Record")
        h.set(Headers.msgId, id)
        system.nats.nc.publish(system.layout.ask(p1), encodePayload(rpc, { item: id, ...(holdMs !== undefined ? { holdMs } : {}) }), { reply: "_INBOX.nobody", headers: h })
      }
      lostAsk("answered")
      yield* Effect.sleep("300 millis")
      const again = yield* system.ask(refOf(ProbeProtocol, p1), "Record", { item: "answered" }, { msgId: "answered" })
      lostAsk("working", 1000)
      yield* Effect.sleep("100 millis")
      const following = yield* system.ask(refOf(ProbeProtocol, p1), "Record", { item: "working", holdMs: 1000 }, { msgId: "working" })
      const items = yield* system.ask(refOf(ProbeProtocol, p1), "Items", undefined)
      return { again, following, items }
    }))
    expect(result.again).toBe(1)
    expect(result.following).toBe(2)
    expect(result.items).toEqual(["answered", "working"])
  })
})
