import { Schema } from "effect"
import { describe, expect, it } from "vitest"
import { DeltaDecoder } from "../../src/tree/decoder.ts"
import { DeltaEncoder } from "../../src/tree/encoder.ts"
import { digestOf } from "../../src/tree/hash.ts"
import { CallRecord, CallRecordJson, type ModelCall } from "../../src/tree/record.ts"

const ids = { run: "r", task: "t", execution: "e" }

const call = (callId: string, prompt: Array<number>, output: Array<number>): ModelCall => ({
  callId,
  role: "main",
  prompt: Int32Array.from(prompt),
  output: Int32Array.from(output),
  logprobs: Float32Array.from(output, (_, i) => -0.25 * (i + 1)),
  versions: new Int32Array(output.length).fill(2),
  sampling: { temperature: 0.7, topP: 0.9 },
  finishReason: "tool_calls",
  startedAt: 1000,
  finishedAt: 1500,
  toolCalls: { call_1: '{"name":"bash","arguments":{"cmd":"ls"}}' }
})

/** a -> b -> c: each prompt extends the previous call's prompt and output. */
const chain = () => {
  const encoder = new DeltaEncoder(ids)
  const a = encoder.encode(call("a", [1, 2, 3, 4], [5, 6]))
  const b = encoder.encode(call("b", [1, 2, 3, 4, 5, 6, 7, 8], [9]))
  const c = encoder.encode(call("c", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [11, 12]))
  return { a, b, c }
}

describe("delta-encoded call records", () => {
  it("sends only the new suffix, referencing the earlier call it shares most with", () => {
    const { a, b, c } = chain()
    expect(a.ref).toBeNull()
    expect(Array.from(a.suffix)).toEqual([1, 2, 3, 4, 5, 6])
    expect(b.ref).toEqual({ callId: "a", shared: 6 })
    expect(Array.from(b.suffix)).toEqual([7, 8, 9])
    expect(c.ref).toEqual({ callId: "b", shared: 9 })
    expect(Array.from(c.suffix)).toEqual([10, 11, 12])
    expect(c.promptHash).toBe(digestOf(Int32Array.from([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])))

    const encoder = new DeltaEncoder(ids)
    encoder.encode(call("a", [1, 2, 3, 4], [5, 6]))
    const retry = encoder.encode(call("r", [1, 2, 3, 4], [5, 7]))
    expect(retry.ref).toEqual({ callId: "a", shared: 5 }) // the retry's output shares a token too
    expect(Array.from(retry.suffix)).toEqual([7])
    const compacted = encoder.encode(call("k", [20, 21], [22]))
    expect(compacted.ref).toBeNull()
  })

  it("round-trips through the JSON wire form with base64 little-endian token arrays", () => {
    const { b } = chain()
    const json = Schema.encodeSync(CallRecordJson)(b)
    const wire = JSON.parse(json)
    expect(wire.suffix).toBe(Buffer.from(Int32Array.from([7, 8, 9]).buffer).toString("base64"))
    expect(wire.logprobs).toBe(Buffer.from(Float32Array.from([-0.25]).buffer).toString("base64"))
    const back = Schema.decodeUnknownSync(CallRecordJson)(json)
    expect(back).toEqual(b)
    expect(back.suffix).toBeInstanceOf(Int32Array)
    expect(() => Schema.decodeUnknownSync(CallRecord)({ ...wire, suffix: "AAA=" })).toThrow(/4-byte/)
    expect(() => Schema.decodeUnknownSync(CallRecord)({ ...wire, suffix: "AA*AAAAA" })).toThrow(/4-byte/)
    expect(() => Schema.decodeUnknownSync(CallRecord)({ ...wire, logprobs: 12 })).toThrow()
    expect(() => Schema.decodeUnknownSync(CallRecord)({ ...wire, promptHash: "xyz" })).toThrow()
  })

  it("keeps a record whose reference is unknown waiting until the reference arrives", () => {
    const { a, b, c } = chain()
    const decoder = new DeltaDecoder("e")
    const first = decoder.add(c)
    expect(first).toEqual({ added: [], waiting: true, duplicate: false, rejected: [] })
    expect(decoder.add(b).waiting).toBe(true)
    expect(decoder.pending()).toEqual(
      expect.arrayContaining([
        { callId: "c", waitsFor: "b" },
        { callId: "b", waitsFor: "a" }
      ])
    )
    expect(decoder.tree.uniqueTokens).toBe(0)
    expect(decoder.add(c).duplicate).toBe(true)
    const last = decoder.add(a)
    expect(last.added).toEqual(["a", "b", "c"])
    expect(decoder.pending()).toEqual([])
    expect(Array.from(decoder.tree.callSequence(decoder.tree.callIndex("c")!))).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    expect(decoder.add(a).duplicate).toBe(true)
    expect(decoder.tree.uniqueTokens).toBe(12)
    expect(decoder.callInfo("b")).toMatchObject({ role: "main", finishReason: "tool_calls", startedAt: 1000 })
  })

  it("rejects a record whose reconstructed prompt does not hash to its digest, and the records waiting on it", () => {
    const { a, b, c } = chain()
    const decoder = new DeltaDecoder("e")
    decoder.add(a)
    expect(decoder.add(c).waiting).toBe(true)
    const tampered = { ...b, suffix: Int32Array.from([7, 99, 9]) }
    const report = decoder.add(tampered)
    expect(report.added).toEqual([])
    expect(report.rejected.map((r) => [r._tag, r.callId, r.reason])).toEqual([
      ["CallRecordRejected", "b", "hash-mismatch"],
      ["CallRecordRejected", "c", "reference-rejected"]
    ])
    expect(report.rejected[0]!.detail).toMatch(/hashes to/)
    expect(decoder.tree.uniqueTokens).toBe(6) // the tree is unchanged
    expect(decoder.tree.callIndex("b")).toBeUndefined()
    expect(decoder.pending()).toEqual([])
    // A wrong reference length is caught by the hash too: shared one token short.
    const other = new DeltaDecoder("e")
    other.add(a)
    expect(other.add({ ...b, ref: { callId: "a", shared: 5 }, suffix: Int32Array.from([6, 7, 8, 9]) }).rejected).toEqual([])
    const shifted = new DeltaDecoder("e")
    shifted.add(a)
    expect(shifted.add({ ...b, ref: { callId: "a", shared: 5 }, suffix: Int32Array.from([7, 7, 8, 9]) }).rejected[0]?.reason).toBe("hash-mismatch")
  })

  it("rejects malformed records and records of another execution", () => {
    const { a, b } = chain()
    const decoder = new DeltaDecoder("e")
    expect(decoder.add({ ...a, execution: "other" }).rejected[0]?.reason).toBe("wrong-execution")
    expect(decoder.add({ ...a, suffix: Int32Array.from([1, 2, 3]) }).rejected[0]?.reason).toBe("malformed")
    expect(decoder.add({ ...a, callId: "a2", versions: Int32Array.from([0]) }).rejected[0]?.reason).toBe("malformed")
    decoder.add({ ...a, callId: "a3" })
    expect(decoder.add({ ...b, ref: { callId: "a3", shared: 7 }, suffix: Int32Array.from([8, 9]) }).rejected[0]?.detail).toMatch(/has 6/)
  })
})
