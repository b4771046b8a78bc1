import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { startNode } from "../../src/runtime/node.ts"
import { ActorSystem, refOf } from "../../src/runtime/system.ts"
import { address } from "../../src/runtime/names.ts"
import { Ledger, LedgerProtocol } from "../fixtures/actors.ts"
import { withSystem } from "./harness.ts"

describe("smoke", () => {
  it("tells and asks an actor in-process", async () => {
    const items = await withSystem("smoke", Effect.gen(function* () {
      const system = yield* ActorSystem
      const node = yield* startNode({ name: "n1", types: [Ledger] })
      yield* node.spawn("ledger", "l1")
      const ref = refOf(LedgerProtocol, address("ledger", "l1"))
      yield* system.tell(ref, "Append", { item: "a" })
      yield* system.tell(ref, "Append", { item: "b" })
      const n = yield* system.ask(ref, "Append", { item: "c" })
      expect(n).toBe(3)
      return yield* system.ask(ref, "Items", undefined)
    }))
    expect(items).toEqual(["a", "b", "c"])
  })
})
