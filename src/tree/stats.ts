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

/** A node's content as hashed: the depth of its first token, its length, its tokens. */
const nodeParts = (tree: TrajectoryTree, node: number, into: Array<number>): void => {
  const tokens = tree.tokensOf(node)
  into.push(tree.depthOf(node), tokens.length)
  for (const t of tokens) into.push(t)
}

/**
 * Digest (16 hex digits, `hash.ts`) of the tree's content: every node in canonical preorder as
 * (depth of its first token, length, tokens). Two trees with the same nodes and tokens agree,
 * whatever the order their calls were inserted in.
 */
export const treeDigest = (tree: TrajectoryTree): string => {
  const parts: Array<number> = []
  for (const node of tree.preorder()) nodeParts(tree, node, parts)
  return digestOf(Int32Array.from(parts))
}

/** Hex digits per node in `nodeDigests`. */
export const NODE_DIGEST_CHARS = 8

/**
 * Each node's own digest (its first 8 hex digits) in canonical preorder, concatenated: where two
 * trees' strings first differ is their first differing node (`gyre replay --trees`).
 */
export const nodeDigests = (tree: TrajectoryTree): string => {
  let out = ""
  for (const node of tree.preorder()) {
    const parts: Array<number> = []
    nodeParts(tree, node, parts)
    out += digestOf(Int32Array.from(parts)).slice(0, NODE_DIGEST_CHARS)
  }
  return out
}

/** The first node (index in canonical preorder) where two `nodeDigests` differ; undefined when equal. */
export const firstDifferingNode = (a: string, b: string): number | undefined => {
  if (a === b) return undefined
  const n = Math.min(a.length, b.length)
  let i = 0
  while (i < n && a[i] === b[i]) i++
  return Math.floor(i / NODE_DIGEST_CHARS)
}
