/**
 * Per-execution statistics of a trajectory tree: how many tokens the calls sent in total,
 * how many the tree stores, how many of those the policy generated, and the shape.
 */
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
