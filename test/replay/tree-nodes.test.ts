/**
 * Node digests of a trajectory tree (`nodeDigests`, what the trainer journals per tree) and the
 * first differing node `gyre replay --trees` names: on hand-built trees whose nodes are known.
 */
import { describe, expect, it } from "vitest"
import { nodeDifference } from "../../src/replay/trees.ts"
import { firstDifferingNode, nodeDigests, treeDigest } from "../../src/tree/stats.ts"
import { ROOT_POSITION, TrajectoryTree } from "../../src/tree/tree.ts"

/** A tree of `calls` (id, prompt length, tokens), inserted in the order given. */
const treeOf = (calls: ReadonlyArray<readonly [string, number, ReadonlyArray<number>]>) => {
  const tree = new TrajectoryTree()
  for (const [id, promptLength, tokens] of calls) {
    const t = Int32Array.from(tokens)
    tree.insertCall(ROOT_POSITION, t, 0, t.length, { id, role: "policy", promptLength, length: t.length }, undefined)
  }
  return tree
}

// Prefix [1, 2] branching by the third token: nodes [1,2] (depth 0), then its children by first token.
const cA = ["cA", 2, [1, 2, 3, 4]] as const
const cB = ["cB", 2, [1, 2, 7, 8]] as const
const cC = ["cC", 2, [1, 2, 5, 5]] as const // a child between [3,4] and [7,8]
const cE = ["cE", 2, [1, 2, 9, 9]] as const // a child after every other

describe("node digests", () => {
  it("agree whatever the order calls were inserted in, 8 hex digits per node", () => {
    const a = treeOf([cA, cB, cC, cE])
    const b = treeOf([cE, cC, cB, cA])
    expect(nodeDigests(a)).toBe(nodeDigests(b))
    expect(treeDigest(a)).toBe(treeDigest(b))
    expect(nodeDigests(a)).toMatch(/^[0-9a-f]{40}$/) // [1,2] [3,4] [5,5] [7,8] [9,9]
    expect(firstDifferingNode(nodeDigests(a), nodeDigests(b))).toBeUndefined()
  })

  it("name the first node that differs: a child the other lacks, a tree that ends early", () => {
    const two = treeOf([cA, cB])
    expect(nodeDifference(treeOf([cA, cB, cC]), nodeDigests(two))).toEqual({ index: 2, rebuilt: { depth: 2, length: 2, call: "cC" }, rebuiltNodes: 4, recordedNodes: 3 })
    expect(nodeDifference(two, nodeDigests(treeOf([cA, cB, cC])))).toEqual({ index: 2, rebuilt: { depth: 2, length: 2, call: "cB" }, rebuiltNodes: 3, recordedNodes: 4 })
    expect(nodeDifference(two, nodeDigests(treeOf([cA, cB, cE])))).toEqual({ index: 3, rebuiltNodes: 3, recordedNodes: 4 })
    expect(nodeDifference(two, nodeDigests(two))).toBeUndefined()
  })

  it("a changed token names its own node, not the ones before it", () => {
    const changed = treeOf([cA, ["cB", 2, [1, 2, 7, 9]]])
    expect(nodeDifference(changed, nodeDigests(treeOf([cA, cB])))).toEqual({ index: 2, rebuilt: { depth: 2, length: 2, call: "cB" }, rebuiltNodes: 3, recordedNodes: 3 })
  })
})
