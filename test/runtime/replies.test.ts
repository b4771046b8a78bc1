/**
 * The asks' request/reply (`makeReplies`) on a real nats-server: each outcome told once (a
 * reply, a timeout, no responders, a publish the connection refuses), a cancelled request told
 * nothing, replies matched to their requests when many are out at once, and the requests still
 * out when the scope closes told `Failed`.
 */
import { Effect, Scope } from "effect"
import { describe, expect, it } from "vitest"
import { Nats } from "../../src/runtime/nats.ts"
import { makeReplies, type ReplyOutcome } from "../../src/runtime/replies.ts"
import { withSystem } from "./harness.ts"

const bytes = (s: string) => new TextEncoder().encode(s)
const text = (o: ReplyOutcome) => (o._tag === "Reply" ? new TextDecoder().decode(o.msg.data) : o._tag)

describe("replies", () => {
  it("tells each request its outcome once: reply, timeout, no responders, refused publish; a cancel tells nothing", async () => {
    const r = await withSystem("replies", Effect.gen(function* () {
      const { nc } = yield* Nats
      const replies = yield* makeReplies(nc)
      nc.subscribe("echo", { callback: (_e, m) => void m.respond(bytes(`re:${new TextDecoder().decode(m.data)}`)) })
      nc.subscribe("silent", { callback: () => undefined })
      yield* Effect.promise(() => nc.flush())
      const outcome = (subject: string, data: Uint8Array, waitMs: number) =>
        Effect.callback<Array<string>>((resume) => {
          const told: Array<string> = []
          replies.request(subject, data, undefined, waitMs, (o) => {
            told.push(text(o))
            // Any second outcome would land within this wait.
            setTimeout(() => resume(Effect.succeed(told)), waitMs + 100)
          })
        })
      const reply = yield* outcome("echo", bytes("a"), 300)
      const timeout = yield* outcome("silent", bytes("b"), 200)
      const none = yield* outcome("nobody.here", bytes("c"), 500)
      const refused = yield* outcome("echo", new Uint8Array(nc.info!.max_payload + 1), 300)
      // Many out at once: each gets its own answer.
      const many = yield* Effect.all(
        Array.from({ length: 50 }, (_, i) => outcome("echo", bytes(String(i)), 500)),
        { concurrency: "unbounded" }
      )
      const cancelled: Array<string> = []
      const cancel = replies.request("echo", bytes("late"), undefined, 300, (o) => cancelled.push(text(o)))
      cancel()
      yield* Effect.sleep("500 millis")
      return { reply, timeout, none, refused, many, cancelled }
    }))
    expect(r.reply).toEqual(["re:a"])
    expect(r.timeout).toEqual(["Timeout"])
    expect(r.none).toEqual(["NoResponders"])
    expect(r.refused).toHaveLength(1)
    expect(r.refused[0]).toBe("Failed")
    expect(r.many).toEqual(Array.from({ length: 50 }, (_, i) => [`re:${i}`]))
    expect(r.cancelled).toEqual([])
  }, 30_000)

  it("a request still out when the scope closes is told Failed", async () => {
    const told = await withSystem("replies-close", Effect.gen(function* () {
      const { nc } = yield* Nats
      const scope = yield* Scope.make()
      const replies = yield* makeReplies(nc).pipe(Scope.provide(scope))
      nc.subscribe("silent", { callback: () => undefined })
      const got: Array<string> = []
      replies.request("silent", bytes("x"), undefined, 10_000, (o) => got.push(text(o)))
      yield* Scope.close(scope, Effect.void as never)
      yield* Effect.sleep("200 millis")
      return got
    }))
    expect(told).toEqual(["Failed"])
  }, 30_000)
})
