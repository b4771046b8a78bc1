/**
 * The intake: the dead letter's shape (pure), and on a real nats-server (the intake is the NATS
 * boundary, so the server is the point) the deliveries it hands over: asks answered, deduplicated
 * by message id and handed back as `Rejected`; tells acknowledged or redelivered after a hand-back;
 * dead letters published with their reason.
 */
import { headers as natsHeaders } from "@nats-io/transport-node"
import { createHash } from "node:crypto"
import { Effect, Queue } from "effect"
import { describe, expect, it } from "vitest"
import { deadLetterOf, openIntake, type Delivery } from "../../src/runtime/intake.ts"
import { address } from "../../src/runtime/names.ts"
import { Headers, encodeRejectedReply } from "../../src/runtime/protocol.ts"
import { ActorSystem } from "../../src/runtime/system.ts"
import { withSystem } from "./harness.ts"

const text = (b: Uint8Array) => new TextDecoder().decode(b)
const bytes = (s: string) => new TextEncoder().encode(s)

describe("deadLetterOf", () => {
  const where = { reason: "bad\npayload:\r\n  x", subject: "gyre.r.tell.k.i", seq: 7, actor: "k/i" }

  it("carries the reason on one line, where it came from, and the original headers (Nats-* renamed but the message id)", () => {
    const h = natsHeaders()
    h.append(Headers.msgId, "id-1")
    h.append("Nats-Expected-Last-Sequence", "3")
    h.append("Gyre-Request", "Add")
    const { headers, body } = deadLetterOf(bytes("{}"), h, where, 1024 * 1024)
    expect(text(body)).toBe("{}")
    expect(headers.get(Headers.deadReason)).toBe("bad payload: x")
    expect(headers.get(Headers.deadSubject)).toBe(where.subject)
    expect(headers.get(Headers.deadSeq)).toBe("7")
    expect(headers.get(Headers.deadActor)).toBe("k/i")
    expect(headers.get(Headers.msgId)).toBe("id-1")
    expect(headers.get("Nats-Expected-Last-Sequence")).toBe("")
    expect(headers.get("Gyre-Dead-Header-Nats-Expected-Last-Sequence")).toBe("3")
    expect(headers.get("Gyre-Request")).toBe("Add")
    expect(headers.get(Headers.deadOriginalLength)).toBe("")
  })

  it("cuts a body over max_payload, keeping the original's length and SHA-256", () => {
    const data = new Uint8Array(20_000).map((_, i) => i % 251)
    const { headers, body } = deadLetterOf(data, undefined, where, 10_000)
    expect(body.length).toBeGreaterThan(0)
    expect(body.length).toBeLessThan(10_000 - 4096)
    expect([...body]).toEqual([...data.subarray(0, body.length)])
    expect(headers.get(Headers.deadOriginalLength)).toBe("20000")
    expect(headers.get(Headers.deadOriginalDigest)).toBe(`sha256:${createHash("sha256").update(data).digest("hex")}`)
  })
})

const self = address("probe", "p1")

/** The intake of `probe/p1`, its deliveries in a queue. */
const intakeOf = Effect.gen(function* () {
  const system = yield* ActorSystem
  const deliveries = yield* Queue.unbounded<Delivery>()
  const intake = yield* openIntake({
    system,
    address: self,
    actor: "probe/p1",
    ackWaitMs: 30_000,
    maxAckPending: 16,
    delayed: new Map(),
    onDelivery: (d) => Queue.offerUnsafe(deliveries, d)
  })
  return { system, deliveries, intake }
})

const askHeaders = (msgId: string) => {
  const h = natsHeaders()
  h.set(Headers.request, "Ping")
  h.set(Headers.msgId, msgId)
  return h
}

describe("intake", () => {
  it("hands an ask over once, answers repeats of its message id with the same reply, and hands back as Rejected", async () => {
    const out = await withSystem(
      "intake-asks",
      Effect.gen(function* () {
        const { system, deliveries } = yield* intakeOf
        const nc = system.nats.nc
        const subject = system.layout.ask(self)
        const first = nc.request(subject, bytes("1"), { headers: askHeaders("a"), timeout: 5000 })
        const d = yield* Queue.take(deliveries)
        // A second ask with the id, while the first is handled: no delivery, the same answer.
        const follower = nc.request(subject, bytes("1"), { headers: askHeaders("a"), timeout: 5000 })
        yield* Effect.promise(() => nc.flush())
        yield* Effect.sleep("50 millis")
        const extra = yield* Queue.size(deliveries)
        d.reply = bytes("pong")
        d.confirm()
        d.confirm()
        const answers = yield* Effect.promise(() => Promise.all([first, follower]))
        // After the answer: recorded, a repeat is answered without a delivery.
        const repeat = yield* Effect.promise(() => nc.request(subject, bytes("1"), { headers: askHeaders("a"), timeout: 5000 }))
        // A hand-back answers Rejected and records nothing: the retry is delivered.
        const other = nc.request(subject, bytes("2"), { headers: askHeaders("b"), timeout: 5000 })
        const b = yield* Queue.take(deliveries)
        b.handBack()
        const rejected = yield* Effect.promise(() => other)
        const retried = nc.request(subject, bytes("2"), { headers: askHeaders("b"), timeout: 5000 })
        const b2 = yield* Queue.take(deliveries)
        b2.reply = bytes("ok")
        b2.confirm()
        const retriedAnswer = yield* Effect.promise(() => retried)
        return {
          d: { via: d.via, seq: d.seq, deliveryCount: d.deliveryCount, request: d.header(Headers.request), missing: d.header("Nope"), data: text(d.data) },
          extra,
          answers: answers.map((m) => m.string()),
          repeat: repeat.string(),
          rejected: rejected.string(),
          retried: retriedAnswer.string(),
          left: yield* Queue.size(deliveries)
        }
      })
    )
    expect(out.d).toEqual({ via: "ask", seq: 0, deliveryCount: 1, request: "Ping", missing: "", data: "1" })
    expect(out.extra).toBe(0)
    expect(out.answers).toEqual(["pong", "pong"])
    expect(out.repeat).toBe("pong")
    expect(out.rejected).toBe(text(encodeRejectedReply("probe/p1 is stopping; retry")))
    expect(out.retried).toBe("ok")
    expect(out.left).toBe(0)
  })

  it("hands tells over in journal order; one handed back comes again, one confirmed does not", async () => {
    const out = await withSystem(
      "intake-tells",
      Effect.gen(function* () {
        const { system, deliveries } = yield* intakeOf
        const subject = system.layout.tell(self)
        for (const n of ["1", "2"]) yield* Effect.promise(() => system.nats.js.publish(subject, bytes(n)))
        const one = yield* Queue.take(deliveries)
        const two = yield* Queue.take(deliveries)
        one.confirm()
        two.handBack(0)
        const again = yield* Queue.take(deliveries)
        again.confirm()
        yield* Effect.sleep("200 millis")
        return {
          first: [one.via, one.seq, one.deliveryCount, text(one.data)],
          second: [two.seq, text(two.data)],
          again: [again.seq, again.deliveryCount, text(again.data), again.settled],
          left: yield* Queue.size(deliveries)
        }
      })
    )
    expect(out.first).toEqual(["tell", out.first[1], 1, "1"])
    expect(out.second).toEqual([(out.first[1] as number) + 1, "2"])
    expect(out.again).toEqual([out.second[0], 2, "2", true])
    expect(out.left).toBe(0)
  })

  it("dead-letters a delivery to the actor's dead-letter subject with its reason and origin", async () => {
    const out = await withSystem(
      "intake-dead",
      Effect.gen(function* () {
        const { system, deliveries } = yield* intakeOf
        yield* Effect.promise(() => system.nats.js.publish(system.layout.tell(self), bytes("{broken")))
        const d = yield* Queue.take(deliveries)
        yield* d.deadLetter("not JSON")
        d.confirm()
        const dead = yield* Effect.promise(() => system.nats.jsm.streams.getMessage(system.layout.deadStream, { last_by_subj: system.layout.dead(self) }))
        return { seq: d.seq, body: text(dead!.data), reason: dead!.header.get(Headers.deadReason), from: dead!.header.get(Headers.deadSeq), actor: dead!.header.get(Headers.deadActor) }
      })
    )
    expect(out).toEqual({ seq: out.seq, body: "{broken", reason: "not JSON", from: String(out.seq), actor: "probe/p1" })
  })

  it("stops handing over once closed", async () => {
    const closed = await withSystem(
      "intake-close",
      Effect.gen(function* () {
        const { system, deliveries, intake } = yield* intakeOf
        yield* intake.close
        yield* intake.close
        const refused = yield* Effect.promise(() =>
          system.nats.nc.request(system.layout.ask(self), bytes("x"), { headers: askHeaders("z"), timeout: 500 }).then(
            () => "answered",
            (e: Error) => e.message
          )
        )
        return { refused, left: yield* Queue.size(deliveries) }
      })
    )
    expect(closed.refused).not.toBe("answered")
    expect(closed.left).toBe(0)
  })
})
