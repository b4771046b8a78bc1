/**
 * The dispatch of one incarnation over fake deliveries (a `Delivery` that records what is done
 * with it), a fake snapshot store and fake metrics: what each kind of message ends as (reply,
 * confirmation, dead letter, hand-back, crash), the ask bound, the snapshot barrier, stops.
 * The intake from NATS in front of it is tested on a real server (intake.test.ts, and
 * end to end in this folder).
 */
import { Cause, Deferred, Effect, Exit, Fiber, Ref, Schema } from "effect"
import { Rpc, RpcGroup } from "effect/rpc"
import { describe, expect, it } from "vitest"
import * as Actor from "../../src/runtime/actor.ts"
import { Dispatcher, type DispatchOptions } from "../../src/runtime/dispatch.ts"
import type { Delivery } from "../../src/runtime/intake.ts"
import { HandledIds } from "../../src/runtime/mailbox.ts"
import { Headers } from "../../src/runtime/protocol.ts"

class Nope extends Schema.TaggedError<Nope>()("Nope", { why: Schema.String }) {}

const Protocol = RpcGroup.make(
  Rpc.make("Add", { payload: { n: Schema.Number }, success: Schema.Number }),
  Rpc.make("Fail", { payload: { why: Schema.String }, error: Nope }),
  Rpc.make("Die"),
  Rpc.make("Hold", { payload: { key: Schema.String } })
)

type State = { readonly total: number }

const typeOf = (o: { concurrency?: number; persistence?: boolean; maxDeliveries?: number; maxQueuedAsks?: number }) =>
  Actor.make({
    kind: "counter",
    protocol: Protocol,
    state: { schema: Schema.Struct({ total: Schema.Number }), initial: () => ({ total: 0 }) },
    concurrency: o.concurrency ?? 1,
    persistence: o.persistence ?? false,
    maxDeliveries: o.maxDeliveries ?? 3,
    maxQueuedAsks: o.maxQueuedAsks ?? 1024,
    behaviour: () => Effect.die("unused: the test hands the handlers over")
  })

const encoder = new TextEncoder()
const decoder = new TextDecoder()

/** A delivery that records what is done with it, in order, in `log`. */
class FakeDelivery implements Delivery {
  settled = false
  reply: Uint8Array | undefined = undefined
  readonly done: Array<string> = []
  readonly data: Uint8Array
  readonly subject = "subject"
  constructor(
    readonly via: "tell" | "ask",
    readonly headers: Record<string, string>,
    data: string,
    readonly seq: number,
    readonly deliveryCount: number,
    readonly log: Array<string>,
    readonly deadLetterFails = false
  ) {
    this.data = encoder.encode(data)
  }
  header(name: string) {
    return this.headers[name] ?? ""
  }
  #record(what: string) {
    this.done.push(what)
    this.log.push(`${this.headers[Headers.msgId] ?? this.seq} ${what}`)
  }
  confirm() {
    if (this.settled) return
    this.settled = true
    this.#record(this.via === "ask" ? `confirm ${decoder.decode(this.reply)}` : "confirm")
  }
  handBack(delayMs?: number) {
    if (this.settled) return
    this.settled = true
    this.#record(`handBack ${delayMs ?? ""}`.trim())
  }
  answer(bytes: Uint8Array) {
    if (this.via === "tell" || this.settled) return
    this.settled = true
    this.#record(`answer ${decoder.decode(bytes)}`)
  }
  refuse(bytes: Uint8Array) {
    if (this.via === "tell" || this.settled) return
    this.settled = true
    this.#record(`refuse ${decoder.decode(bytes)}`)
  }
  working() {}
  deadLetter(reason: string) {
    return Effect.suspend(() => {
      this.#record(`deadLetter ${reason}`)
      return this.deadLetterFails ? Effect.fail(new Error("no stream") as never) : Effect.void
    })
  }
}

const setup = (o: Parameters<typeof typeOf>[0] & { readonly snapshotFails?: boolean } = {}) => {
  const log: Array<string> = []
  const metrics: Array<string> = []
  const holds = new Map<string, Deferred.Deferred<void>>()
  const hold = (key: string) => {
    let d = holds.get(key)
    if (d === undefined) holds.set(key, (d = Deferred.makeUnsafe<void>()))
    return d
  }
  const state = Ref.makeUnsafe<State>({ total: 0 })
  const handled = new HandledIds()
  const snapshots: Array<number> = []
  const running = { now: 0, most: 0 }
  const options: DispatchOptions<State> = {
    actor: "counter/c1",
    type: typeOf(o),
    handlers: {
      Add: ({ n }: any) => Ref.updateAndGet(state, (s) => ({ total: s.total + n })).pipe(Effect.map((s) => s.total)),
      Fail: ({ why }: any) => Effect.fail(new Nope({ why })),
      Die: () => Effect.die(new Error("boom")),
      Hold: ({ key }: any) =>
        Effect.gen(function* () {
          running.now++
          running.most = Math.max(running.most, running.now)
          yield* Deferred.await(hold(key))
          running.now--
        })
    },
    state,
    handled,
    snapshots: {
      restore: Effect.die("unused"),
      write: (s) =>
        Effect.suspend(() => {
          log.push(`snapshot ${s.total}`)
          snapshots.push(s.total)
          return o.snapshotFails ? Effect.fail(new Error("kv down") as never) : Effect.void
        })
    },
    stats: { name: "counter", subject: "s", numRequests: 0, numErrors: 0, lastError: "", processingTimeNs: 0 },
    metrics: {
      handled: (via, outcome) => void metrics.push(`${via} ${outcome}`),
      redelivered: () => void metrics.push("redelivered"),
      deadLettered: () => void metrics.push("deadLettered"),
      watch: () => () => {}
    },
    redeliveryDelays: [100, 200, 400],
    ackWaitMs: 30_000
  }
  let seq = 0
  const message = (via: "tell" | "ask", tag: string, payload: unknown, more: { msgId?: string; deliveryCount?: number; raw?: string; deadLetterFails?: boolean } = {}) => {
    const s = ++seq
    const headers: Record<string, string> = { [Headers.request]: tag, [Headers.msgId]: more.msgId ?? `m${s}` }
    return new FakeDelivery(via, headers, more.raw ?? JSON.stringify(payload ?? null), via === "tell" ? s : 0, more.deliveryCount ?? 1, log, more.deadLetterFails)
  }
  return { log, metrics, hold, state, handled, snapshots, running, options, message }
}

/** The reply an ask was confirmed or answered with. */
const replyOf = (d: FakeDelivery) => JSON.parse(d.done.at(-1)!.replace(/^(confirm|answer|refuse) /, ""))

const scoped = <A, E>(effect: Effect.Effect<A, E, import("effect").Scope.Scope>) => Effect.runPromise(Effect.scoped(effect))

describe("dispatch", () => {
  it("answers an ask with its handler's result, and a typed failure as a failure", async () => {
    const s = setup()
    await scoped(
      Effect.gen(function* () {
        const d = yield* Dispatcher.make(s.options)
        const add = s.message("ask", "Add", { n: 5 })
        const fail = s.message("ask", "Fail", { why: "no" })
        d.offer(add)
        d.offer(fail)
        yield* Effect.sleep("10 millis")
        expect(replyOf(add)).toMatchObject({ _tag: "Exit", exit: { _tag: "Success", value: 5 } })
        expect(JSON.stringify(replyOf(fail))).toContain('"Nope"')
        expect(replyOf(fail).exit._tag).toBe("Failure")
        expect(add.done).toHaveLength(1)
      })
    )
    expect(s.metrics).toEqual(["ask ok", "ask error"])
  })

  it("confirms a tell once handled and skips a tell whose message id it handled already", async () => {
    const s = setup()
    await scoped(
      Effect.gen(function* () {
        const d = yield* Dispatcher.make(s.options)
        d.offer(s.message("tell", "Add", { n: 2 }, { msgId: "a" }))
        d.offer(s.message("tell", "Add", { n: 2 }, { msgId: "a" }))
        d.offer(s.message("tell", "Add", { n: 3 }, { msgId: "b" }))
        yield* Effect.sleep("10 millis")
      })
    )
    expect(Ref.getUnsafe(s.state).total).toBe(5)
    expect(s.log).toEqual(["a confirm", "a confirm", "b confirm"])
    expect(s.metrics).toEqual(["tell ok", "tell duplicate", "tell ok"])
    expect(s.handled.has("a") && s.handled.has("b")).toBe(true)
  })

  it("dead-letters what it cannot handle with the reason, answering an ask Rejected", async () => {
    const s = setup()
    const cases = [
      [s.message("ask", "Add", null, { raw: "{not json" }), /JSON/i],
      [s.message("ask", "Nah", {}), /unknown request 'Nah' for counter/],
      [s.message("tell", "Add", { n: "x" }), /payload does not match Add/],
      [s.message("tell", "Add", { n: 1 }, { deliveryCount: 4 }), /delivered 4 times/]
    ] as const
    await scoped(
      Effect.gen(function* () {
        const d = yield* Dispatcher.make(s.options)
        for (const [m] of cases) d.offer(m)
        yield* Effect.sleep("10 millis")
      })
    )
    for (const [m, reason] of cases) {
      expect(m.done[0]).toMatch(/^deadLetter /)
      expect(m.done[0]).toMatch(reason)
      expect(m.done).toHaveLength(2)
      if (m.via === "ask") expect(replyOf(m)._tag).toBe("Rejected")
      else expect(m.done[1]).toBe("confirm")
    }
    expect(Ref.getUnsafe(s.state).total).toBe(0)
    expect(s.metrics.filter((x) => x === "deadLettered")).toHaveLength(4)
  })

  it("hands a tell back for a later delivery when its dead letter cannot be published", async () => {
    const s = setup()
    const m = s.message("tell", "Nah", {}, { deadLetterFails: true })
    await scoped(
      Effect.gen(function* () {
        const d = yield* Dispatcher.make(s.options)
        d.offer(m)
        yield* Effect.sleep("10 millis")
      })
    )
    expect(m.done).toEqual([expect.stringMatching(/^deadLetter /), "handBack 400"])
  })

  it("crashes on a defect: a tell goes back with its redelivery delay, an ask is answered Rejected", async () => {
    for (const [via, deliveryCount, expected] of [
      ["tell", 2, ["handBack 200"]],
      ["tell", 3, [expect.stringMatching(/^deadLetter the handler crashed on each of 3 deliveries/), "confirm"]],
      ["ask", 1, [expect.stringMatching(/^answer .*handler crashed/)]]
    ] as const) {
      const s = setup()
      const m = s.message(via, "Die", undefined, { deliveryCount })
      const crashed = await scoped(
        Effect.gen(function* () {
          const d = yield* Dispatcher.make(s.options)
          d.offer(m)
          return yield* d.crashed.pipe(Effect.timeout("2 seconds"), Effect.exit)
        })
      )
      // Crashed with the handler's defect (not the timeout).
      expect(Exit.isFailure(crashed) && Cause.pretty(crashed.cause)).toContain("boom")
      expect(m.done).toEqual(expected)
    }
  })

  it("refuses an ask Overloaded when maxQueuedAsks asks wait, and handles at most `concurrency` at once", async () => {
    const s = setup({ concurrency: 2, maxQueuedAsks: 1 })
    const asks = ["h1", "h2", "h3", "h4"].map((key) => s.message("ask", "Hold", { key }))
    await scoped(
      Effect.gen(function* () {
        const d = yield* Dispatcher.make(s.options)
        for (const a of asks) d.offer(a)
        yield* Effect.sleep("10 millis")
        // h1, h2 run; h3 waits; h4 finds one waiting: refused.
        expect(s.running.now).toBe(2)
        expect(asks[3]!.done).toHaveLength(1)
        expect(replyOf(asks[3]!)._tag).toBe("Overloaded")
        expect(asks[2]!.done).toEqual([])
        yield* Deferred.succeed(s.hold("h1"), undefined)
        yield* Deferred.succeed(s.hold("h3"), undefined)
        yield* Deferred.succeed(s.hold("h2"), undefined)
        yield* Effect.sleep("10 millis")
      })
    )
    expect(s.running.most).toBe(2)
    expect(asks.slice(0, 3).map((a) => replyOf(a)._tag)).toEqual(["Exit", "Exit", "Exit"])
    expect(s.metrics.filter((m) => m === "ask overloaded")).toHaveLength(1)
  })

  it("with persistence, confirms a tell that changed the state only after the snapshot that holds it", async () => {
    const s = setup({ persistence: true })
    await scoped(
      Effect.gen(function* () {
        const d = yield* Dispatcher.make(s.options)
        d.offer(s.message("tell", "Add", { n: 4 }, { msgId: "a" }))
        d.offer(s.message("tell", "Fail", { why: "x" }, { msgId: "b" }))
        yield* Effect.sleep("20 millis")
      })
    )
    expect(s.log.slice(0, 2)).toEqual(["snapshot 4", "a confirm"])
    expect(s.log).toContain("b confirm")
    expect(s.snapshots[0]).toBe(4)
  })

  it("a snapshot that cannot be written crashes the incarnation and hands back what it covered", async () => {
    const s = setup({ persistence: true, snapshotFails: true })
    const m = s.message("tell", "Add", { n: 4 })
    const crashed = await scoped(
      Effect.gen(function* () {
        const d = yield* Dispatcher.make(s.options)
        d.offer(m)
        return yield* Effect.exit(Effect.timeout(d.crashed, "2 seconds"))
      })
    )
    expect(Exit.isFailure(crashed) && Cause.pretty(crashed.cause)).toContain("kv down")
    expect(m.done).toEqual(["handBack"])
  })

  it("stops cleanly when handlers finish in time (last snapshot written), else interrupts and hands back", async () => {
    const s = setup({ persistence: true })
    const waiting = s.message("tell", "Add", { n: 1 })
    const slow = s.message("tell", "Hold", { key: "never" })
    const interrupted = await scoped(
      Effect.gen(function* () {
        const d = yield* Dispatcher.make(s.options)
        d.offer(slow)
        d.offer(waiting)
        yield* Effect.sleep("10 millis")
        return yield* d.stop(50)
      })
    )
    expect(interrupted).toBe(true)
    expect(slow.done).toEqual(["handBack"])
    expect(waiting.done).toEqual(["handBack"])
    expect(s.snapshots).toEqual([])

    const t = setup({ persistence: true })
    const quick = t.message("tell", "Hold", { key: "k" })
    const clean = await scoped(
      Effect.gen(function* () {
        const d = yield* Dispatcher.make(t.options)
        d.offer(quick)
        yield* Effect.sleep("10 millis")
        const stopping = yield* Effect.forkChild(d.stop(5_000))
        yield* Effect.sleep("10 millis")
        // Stopping: a new message is handed back at once.
        const late = t.message("ask", "Add", { n: 1 })
        d.offer(late)
        expect(late.done[0]).toMatch(/^handBack/)
        yield* Deferred.succeed(t.hold("k"), undefined)
        return yield* Fiber.join(stopping)
      })
    )
    expect(clean).toBe(false)
    expect(quick.done).toEqual(["confirm"])
  })
})
