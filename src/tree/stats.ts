/**
 * Per-execution statistics of a trajectory tree: how many tokens the calls sent in total,
 * how many the tree stores, how many of those the policy generated, and the shape; and a digest of
 * the tree's content (`treeDigest`), which the trainer journals and `gyre replay --trees` checks.
 */
import { digestOf } from "./hash.ts"
import type { TrajectoryTree } from "./tree.ts"

export interface ExecutionStats {
  readonly calls: number
  /** Sum over calls of prompt + output tokens (what the calls sent, flattened). */
  readonly totalTokens: number
  /** Tokens in the tree. */
  readonly uniqueTokens: number
  /** Tree tokens some call generated. */
  readonly generatedTokens: number
  /** totalTokens / uniqueTokens. */
  readonly dedupRatio: number
  /** Tokens on the longest root-to-leaf path. */
  readonly depth: number
  /** Sum over leaves of root-to-leaf tokens (training every path as its own sequence). */
  readonly pathTokens: number
  readonly leaves: number
  readonly leavesByRole: Readonly<Record<string, number>>
}

export const executionStats = (tree: TrajectoryTree): ExecutionStats => {
  const leavesByRole: Record<string, number> = {}
  let depth = 0
  let pathTokens = 0
  const leaves = tree.leaves()
  for (const { node, role } of leaves) {
    const length = tree.lastDepthOf(node) + 1
    depth = Math.max(depth, length)
    pathTokens += length
    leavesByRole[role] = (leavesByRole[role] ?? 0) + 1
  }
  return {
    calls: tree.callCount,
    totalTokens: tree.totalCallTokens,
    uniqueTokens: tree.uniqueTokens,
    generatedTokens: tree.generatedTokens,
    dedupRatio: tree.uniqueTokens === 0 ? 1 : tree.totalCallTokens / tree.uniqueTokens,
    depth,
    pathTokens,
    leaves: leaves.length,
    leavesByRole
  }
}

/**
 * Digest (16 hex digits, `hash.ts`) of the tree's content: every node in canonical preorder as
 * (depth of its first token, length, tokens). Two trees with the same nodes and tokens agree,
 * whatever the order their calls were inserted in.
 */
export const treeDigest = (tree: TrajectoryTree): string => {
  const order = tree.preorder()
  const parts: Array<number> = []
  for (const node of order) {
    const tokens = tree.tokensOf(node)
    parts.push(tree.depthOf(node), tokens.length)
    for (const t of tokens) parts.push(t)
  }
  return digestOf(Int32Array.from(parts))
}
