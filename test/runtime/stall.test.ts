/**
 * After a crash, the tells the dead incarnation held unacknowledged (up to max_ack_pending)
 * come back at once, not after the consumer's ack wait (issue 13: "256 unacked messages
 * stall an actor's tells for the 10 s ack wait"), and an ask that reached the crashing
 * incarnation is answered (a drained subscription) instead of timing out.
 */
import { Effect, Ref, Schema } from "effect"
import { Rpc, RpcGroup } from "effect/rpc"
import { describe, expect, it } from "vitest"
import * as Actor from "../../src/runtime/actor.ts"
import { address } from "../../src/runtime/names.ts"
import { startNode } from "../../src/runtime/node.ts"
import { ActorSystem, refOf } from "../../src/runtime/system.ts"
import { eventually, withSystem } from "./harness.ts"

const CountProtocol = RpcGroup.make(
  Rpc.make("Add", { payload: { n: Schema.Number, dieOnce: Schema.optional(Schema.Boolean) } }),
  Rpc.make("Seen", { success: Schema.Array(Schema.Number) })
)

/** Counts the `n`s it saw; `dieOnce` crashes the handler on the message's first delivery. */
const Counter = Actor.make({
  kind: "counter",
  protocol: CountProtocol,
  state: { schema: Schema.Struct({ seen: Schema.Array(Schema.Number) }), initial: () => ({ seen: [] as ReadonlyArray<number> }) },
  persistence: { everyMessages: 50, maxDelayMs: 20 },
  behaviour: (ctx) =>
    Effect.succeed({
      Add: ({ n, dieOnce }, meta) =>
        dieOnce === true && meta.deliveryCount === 1
          ? Effect.die(new Error("dies once"))
          : Ref.update(ctx.state, (s) => ({ seen: [...s.seen, n] })),
      Seen: () => Ref.get(ctx.state).pipe(Effect.map((s) => s.seen))
    })
})

describe("tells after a crash", () => {
  it("an incarnation's crash does not stall the next one's tells for the ack wait", async () => {
    const ackWaitMs = 20_000
    const result = await withSystem("stall", Effect.gen(function* () {
      const system = yield* ActorSystem
      const ref = refOf(CountProtocol, address("counter", "c1"))
      const count = 600
      yield* system.tell(ref, "Add", { n: 0, dieOnce: true })
      for (let n = 1; n < count; n++) yield* system.tell(ref, "Add", { n })
      const node = yield* startNode({ name: "n1", types: [Counter], ackWaitMs })
      const t0 = performance.now()
      yield* node.spawn("counter", "c1")
      // An ask lost in the crash would take its whole timeout: the bound below would fail.
      const seen = yield* eventually(system.ask(ref, "Seen", undefined, { timeoutMs: 8000 }).pipe(Effect.map((s) => (s.length >= count ? s : undefined))), 60_000, 100)
      return { seen, ms: performance.now() - t0, count }
    }))
    expect(new Set(result.seen).size).toBe(result.count)
    expect(result.ms).toBeLessThan(8000)
    console.log(`tells after a crash: ${result.count} handled in ${Math.round(result.ms)} ms (ack wait ${ackWaitMs} ms)`)
  }, 90_000)
})
