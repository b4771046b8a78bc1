/**
 * The integrity scan of `gyre replay --verify` over entries as the read gives them: a record
 * written twice the same way (a retried publish) passes; written twice differently is two
 * writers, under the same term or another; a lower term after a higher one is stale; a skipped
 * index is a record gap and a skipped stream sequence a sequence gap.
 */
import { describe, expect, it } from "vitest"
import type { Entry } from "../../src/replay/read.ts"
import { IntegrityScan } from "../../src/replay/verify.ts"
import type { PolicyRecord } from "../../src/protocols/scheduler.ts"

const record = (index: number, term: number, at = index): PolicyRecord => ({ index, term, event: { _tag: "StepDone", step: index, at }, actions: [], digest: "d" })
const entry = (seq: number, r: PolicyRecord): Entry => ({
  seq,
  time: new Date(0),
  subject: "gyre.r.sys.policy",
  via: "event",
  actor: undefined,
  name: "policy",
  msgId: undefined,
  payload: r,
  error: undefined,
  record: r
})
const scan = (records: ReadonlyArray<PolicyRecord>, seqs = records.map((_, i) => i + 1)) => {
  const s = new IntegrityScan()
  records.forEach((r, i) => s.add(entry(seqs[i]!, r)))
  return s
}

describe("integrity scan", () => {
  it("a record stored twice the same way passes and is kept once", () => {
    const s = scan([record(0, 1), record(1, 1), record(1, 1), record(2, 1)])
    expect(s.findings).toEqual([])
    expect(s.records.map((r) => r.record.index)).toEqual([0, 1, 2])
  })

  it("a record written again differently: two writers, naming the terms and the first sequence", () => {
    const same = scan([record(0, 1), record(1, 1), record(1, 1, 99)])
    expect(same.findings).toEqual([{ check: "two-writers", seq: 3, message: "record 1 written again by a second writer under term 1, differently (first at sequence 2)" }])
    const other = scan([record(0, 1), record(1, 1), record(1, 2, 99)])
    expect(other.findings.map((f) => [f.check, f.message])).toEqual([["two-writers", "record 1 written again by term 2 (first written under term 1), differently (first at sequence 2)"]])
  })

  it("stale terms, record gaps and sequence gaps", () => {
    const s = scan([record(0, 2), record(1, 1), record(3, 2)], [1, 2, 5])
    expect(s.findings.map((f) => [f.check, f.seq])).toEqual([["stale-term", 2], ["sequence-gap", 5], ["record-gap", 5]])
  })
})
