/**
 * The scheduler's fenced record writes (`recordWriter`): a write whose acknowledgement is lost
 * but which the server stored (its connection cut at that moment) is the writer's own, not a
 * sign of another leader; a writer that really is behind another's records is still fenced.
 * Found by test/chaos/cluster.test.ts: the killed server was the leader's, its record landed,
 * the acknowledgement did not, and the scheduler stopped with `JournalFenced` (the run stalled).
 */
import { Effect, Exit } from "effect"
import { describe, expect, it } from "vitest"
import type { PolicyRecord } from "../../src/protocols/scheduler.ts"
import { readRecords, recordWriter } from "../../src/scheduling/records.ts"
import { ActorSystem, type ActorSystemShape } from "../../src/runtime/system.ts"
import { withSystem } from "../runtime/harness.ts"

const record = (index: number, term: number): PolicyRecord => ({
  index,
  term,
  event: { _tag: "CellJoined", cell: index, at: index },
  actions: [],
  digest: `d${index}`
})

/** `system` whose next `js.publish` reaches the server but fails as if its acknowledgement were lost. */
const losingAcks = (system: ActorSystemShape) => {
  let loseNext = false
  const js = new Proxy(system.nats.js, {
    get: (target, p) => {
      const v = Reflect.get(target, p, target)
      if (p !== "publish" || !loseNext) return typeof v === "function" ? v.bind(target) : v
      loseNext = false
      return async (...args: Parameters<typeof target.publish>) => {
        await target.publish(...args)
        throw new Error("TIMEOUT")
      }
    }
  })
  return { system: { ...system, nats: { ...system.nats, js } } as ActorSystemShape, loseNext: () => void (loseNext = true) }
}

describe("scheduler records", () => {
  it("a record stored with its acknowledgement lost is taken as written; a writer behind another's records is fenced", async () => {
    const result = await withSystem("records-ack", Effect.gen(function* () {
      const system = yield* ActorSystem
      const lossy = losingAcks(system)
      const write = recordWriter(lossy.system, 0)
      yield* write(record(0, 1))
      lossy.loseNext()
      const lost = yield* Effect.exit(write(record(1, 1)))
      const next = yield* Effect.exit(write(record(2, 1)))
      // A second writer that knows none of these records: fenced.
      const behind = yield* Effect.flip(recordWriter(system, 0)(record(0, 2)))
      const records = yield* readRecords(system)
      return { lost, next, behind, records: records.map((r) => `${r.record.term}-${r.record.index}`) }
    }))
    expect(Exit.isSuccess(result.lost)).toBe(true)
    expect(Exit.isSuccess(result.next)).toBe(true)
    expect(result.behind).toMatchObject({ _tag: "JournalFenced", index: 0, term: 2 })
    expect(result.records).toEqual(["1-0", "1-1", "1-2"])
  })
})
