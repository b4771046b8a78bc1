import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { digestOf } from "../../src/tree/hash.ts"
import { plainCall, type ModelCall } from "../../src/tree/record.ts"
import { executionStats } from "../../src/tree/stats.ts"
import { build, deliveryOrder, executionArb, listing, naivePreorder, naiveTrie, wireRecords, type NaiveNode } from "./simulate.ts"

const naiveListing = (root: NaiveNode) => naivePreorder(root).map((n) => [n.depth, n.token, n.version, n.version < 0 ? 0 : n.logprob])

describe("trajectory tree from delta-encoded records", () => {
  it("reproduces every call's sequence from out-of-order, duplicated records; content, masks and stats match a naive trie", () => {
    fc.assert(
      fc.property(executionArb(), fc.array(fc.nat(), { maxLength: 40 }), (calls, seeds) => {
        const records = wireRecords(calls)
        records.forEach((r, i) => expect(r.promptHash).toBe(digestOf(calls[i]!.prompt)))
        const inOrder = build(records)
        const shuffled = build(deliveryOrder(records, seeds))
        for (const decoder of [inOrder, shuffled]) {
          const { tree } = decoder
          calls.forEach((c) => {
            const index = tree.callIndex(c.callId)!
            expect(Array.from(tree.callSequence(index))).toEqual([...c.prompt, ...c.output])
            expect(decoder.callInfo(c.callId)?.toolCalls).toEqual(c.toolCalls)
          })
        }
        const naive = naiveTrie(calls)
        const expected = naiveListing(naive)
        expect(listing(inOrder.tree)).toEqual(expected)
        expect(listing(shuffled.tree)).toEqual(expected)
        const stats = executionStats(shuffled.tree)
        expect(stats).toEqual(executionStats(inOrder.tree))
        const total = calls.reduce((a, c) => a + c.prompt.length + c.output.length, 0)
        expect(stats.totalTokens).toBe(total)
        expect(stats.uniqueTokens).toBe(expected.length)
        expect(stats.generatedTokens).toBe(expected.filter((row) => row[2]! >= 0).length)
        expect(stats.dedupRatio).toBeCloseTo(expected.length === 0 ? 1 : total / expected.length, 12)
        const leaves = naivePreorder(naive).filter((n) => n.children.size === 0)
        const byRole: Record<string, number> = {}
        for (const leaf of leaves) byRole[leaf.endRole!] = (byRole[leaf.endRole!] ?? 0) + 1
        expect(stats.leavesByRole).toEqual(byRole)
        expect(stats.depth).toBe(Math.max(0, ...leaves.map((l) => l.depth + 1)))
      }),
      { numRuns: 150 }
    )
  })

  it("counts a hand-built execution: retry, subagent fork and compaction", () => {
    const call = (callId: string, role: string, prompt: Array<number>, output: Array<number>): ModelCall =>
      plainCall(callId, role, prompt, output, {
        logprobs: new Float32Array(output.length).fill(-0.5),
        versions: new Int32Array(output.length).fill(3),
        finishedAt: 1
      })
    const calls = [
      call("a", "main", [1, 2, 3], [10, 11]), // 5 new tokens
      call("b", "main", [1, 2, 3], [12]), // retry: 1 new
      call("c", "main", [1, 2, 3, 12, 20], [13, 14]), // continues the retry: 3 new
      call("d", "subagent", [1, 2, 3, 12, 20, 30], [15]), // fork: 2 new
      call("e", "main-summary", [1, 2, 3, 12, 20, 13, 14, 40], [16]), // 2 new
      call("f", "main", [1, 2, 9, 16], [17]) // after compaction, shares the system prefix 1 2: 3 new
    ]
    const { tree } = build(wireRecords(calls))
    const stats = executionStats(tree)
    expect(stats.totalTokens).toBe(5 + 4 + 7 + 7 + 9 + 5)
    expect(stats.uniqueTokens).toBe(5 + 1 + 3 + 2 + 2 + 3)
    expect(stats.generatedTokens).toBe(2 + 1 + 2 + 1 + 1 + 1)
    expect(stats.dedupRatio).toBeCloseTo(37 / 16, 12)
    expect(stats.depth).toBe(9)
    expect(stats.leavesByRole).toEqual({ main: 2, subagent: 1, "main-summary": 1 })
    expect(stats.pathTokens).toBe(5 + 7 + 9 + 5)
  })

  it("rebuilds identically from the recorded stream (replay)", () => {
    fc.assert(
      fc.property(executionArb(), (calls) => {
        const records = wireRecords(calls, 128)
        const a = build(records, 64).tree
        const b = build(records, 64).tree
        expect(listing(b)).toEqual(listing(a))
        expect(Array.from(b.preorder())).toEqual(Array.from(a.preorder()))
        expect(b.byteSize).toBe(a.byteSize)
      }),
      { numRuns: 40 }
    )
  })

  it("stores tokens in chunked typed arrays: under 13 bytes per unique token for long executions", () => {
    const calls = Array.from({ length: 50 }, (_, i) => plainCall(`c${i}`, "main", Int32Array.from({ length: 2600 * (i + 1) }, (_, t) => t), []))
    const { tree } = build(wireRecords(calls, 1 << 16), 1 << 16)
    expect(tree.uniqueTokens).toBe(130_000)
    expect(tree.nodeCount).toBe(3) // root + one node per 64k-token chunk
    expect(tree.byteSize / tree.uniqueTokens).toBeLessThan(13)
  })
})
