/**
 * Call records in bounded parts (`src/protocols/record-parts.ts`): the cut, the headers, joining
 * parts in any order, and on a real trajectory stream (nats-server) the reader's view: a record in
 * parts rebuilds the same tree as the record whole, and parts that never completed, or whose
 * headers are malformed, are reported as malformed messages, not dropped.
 */
import { headers } from "@nats-io/transport-node"
import { Effect, Schema } from "effect"
import { describe, expect, it } from "vitest"
import { ensureTrajectoryStream, rlLayout } from "../../src/protocols/layout.ts"
import { CALL_HEADER, PART_HEADER, RecordAssembler, partOf, recordParts } from "../../src/protocols/record-parts.ts"
import { readExecution } from "../../src/protocols/trajectories.ts"
import { ActorSystem } from "../../src/runtime/system.ts"
import { DeltaEncoder } from "../../src/tree/encoder.ts"
import { CallRecord, plainCall } from "../../src/tree/record.ts"
import { withSystem } from "../runtime/harness.ts"

const hdrs = (entries: Record<string, string>) => {
  const h = headers()
  for (const [k, v] of Object.entries(entries)) h.set(k, v)
  return h
}

describe("record parts", () => {
  it("cuts a record's bytes into parts of at most the part size and joins them in any order", () => {
    const bytes = Uint8Array.from({ length: 250 }, (_, i) => i)
    expect(recordParts(bytes, 250)).toHaveLength(1)
    const parts = recordParts(bytes, 100)
    expect(parts.map((p) => p.length)).toEqual([100, 100, 50])
    const assembler = new RecordAssembler()
    expect(assembler.add("c", 3, 3, parts[2]!, 7)).toBeUndefined()
    expect(assembler.add("c", 1, 3, parts[0]!, 5)).toBeUndefined()
    expect(assembler.add("c", 1, 3, parts[0]!, 6)).toBeUndefined() // delivered again
    expect(assembler.add("d", 1, 2, parts[0]!, 8)).toBeUndefined()
    expect(Array.from(assembler.add("c", 2, 3, parts[1]!, 9) as Uint8Array)).toEqual(Array.from(bytes))
    expect(assembler.add("d", 2, 3, parts[1]!, 10)).toEqual({ malformed: "record part 2/3 of call 'd': its first part said 2 parts" })
    expect(assembler.incomplete()).toEqual([{ seq: 8, reason: "record of call 'd': 1 of 2 parts on the stream (missing 2)" }])
  })

  it("reads the part headers, refusing malformed ones", () => {
    expect(partOf(undefined)).toBeUndefined()
    expect(partOf(hdrs({ [PART_HEADER]: "2/5", [CALL_HEADER]: "c1" }))).toEqual({ call: "c1", index: 2, count: 5 })
    expect(partOf(hdrs({ [PART_HEADER]: "2/5" }))).toHaveProperty("malformed")
    expect(partOf(hdrs({ [PART_HEADER]: "6/5", [CALL_HEADER]: "c1" }))).toHaveProperty("malformed")
    expect(partOf(hdrs({ [PART_HEADER]: "1/1", [CALL_HEADER]: "c1" }))).toHaveProperty("malformed")
    expect(partOf(hdrs({ [PART_HEADER]: "x/y", [CALL_HEADER]: "c1" }))).toHaveProperty("malformed")
    expect(partOf(hdrs({ [PART_HEADER]: "1/999999999", [CALL_HEADER]: "c1" }))).toHaveProperty("malformed")
  })

  it("rebuilds a record sent in parts on the trajectory stream, and reports parts that never completed", async () => {
    const out = await withSystem("record-parts", Effect.gen(function* () {
      const system = yield* ActorSystem
      yield* ensureTrajectoryStream(system)
      const subject = rlLayout(system.run).calls("e1")
      const encoder = new DeltaEncoder({ run: system.run, task: "t", execution: "e1" })
      const first = plainCall("c1", "main", Array.from({ length: 40_000 }, (_, i) => i % 250), [1, 2, 3])
      const second = plainCall("c2", "main", [...first.prompt, ...first.output, 7], [8])
      const encode = Schema.encodeSync(CallRecord)
      const whole = Buffer.from(JSON.stringify(encode(encoder.encode(first))))
      const parts = recordParts(whole, 60 * 1024)
      const publish = (data: Uint8Array, h?: ReturnType<typeof headers>) => Effect.promise(() => system.nats.js.publish(subject, data, h === undefined ? {} : { headers: h }))
      for (const [i, p] of parts.entries()) yield* publish(p, hdrs({ [PART_HEADER]: `${i + 1}/${parts.length}`, [CALL_HEADER]: "c1" }))
      yield* publish(Buffer.from(JSON.stringify(encode(encoder.encode(second)))))
      yield* publish(Buffer.from("{"), hdrs({ [PART_HEADER]: "1/2", [CALL_HEADER]: "c9" })) // its second part never comes
      yield* publish(Buffer.from("{}"), hdrs({ [PART_HEADER]: "3/2", [CALL_HEADER]: "c8" }))
      const read = yield* readExecution(system, "e1")
      const tree = read.trajectory.decoder.tree
      return { parts: parts.length, calls: tree.callCount, first: tree.callSequence(0).length, malformed: read.malformed.map((m) => m.reason), rejected: read.trajectory.rejected }
    }))
    expect(out.parts).toBeGreaterThan(2)
    expect([out.calls, out.first, out.rejected]).toEqual([2, 40_003, []])
    expect(out.malformed).toEqual(["record part 3/2 of call 'c8': out of range", "record of call 'c9': 1 of 2 parts on the stream (missing 2)"])
  })
})
