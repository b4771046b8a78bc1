/**
 * Bounded dedup sampling (the published design): choose at most `maxPaths` root-to-leaf
 * paths of an execution's tree so that no generated token is trained twice.
 *
 * Repeat up to `maxPaths` times: among the leaves whose path still has unmasked trainable
 * tokens, take the best role class present (main > main-summary > subagent >
 * subagent-summary > custom); draw one of its leaves with probability proportional to its
 * path's unmasked trainable tokens; mask every node on its path. The tokens a path trains
 * are the ones it unmasked, so the chosen paths' node union holds every trained token once.
 * Masks are per node: a path covers whole nodes, from the root down to its leaf node.
 *
 * Deterministic: leaves are visited in canonical preorder and the draw uses a seeded
 * mulberry32 generator, so the same tree and seed give the same paths on any machine and
 * in any arrival order of the records.
 */
import { roleRank } from "./role.ts"
import { ROOT, type TrajectoryTree } from "./tree.ts"

/** One drawn path, in draw order. */
export interface SampledPath {
  readonly leaf: number
  readonly role: string
  /** Generated tokens this path trains (unmasked when it was drawn). */
  readonly trainedTokens: number
  /** Tokens from the root to the leaf (what training the path as its own sequence costs). */
  readonly pathTokens: number
}

export interface PathSample {
  readonly paths: ReadonlyArray<SampledPath>
  /** 1 for every node on a chosen path. */
  readonly inUnion: Uint8Array
  readonly trainedTokens: number
}

/** A deterministic 32-bit seed for one execution of a step. */
export const seedFor = (seed: number, execution: string): number => {
  let h = (0x811c9dc5 ^ seed) >>> 0
  for (let i = 0; i < execution.length; i++) h = Math.imul(h ^ execution.charCodeAt(i), 0x01000193) >>> 0
  return h
}

/** mulberry32: a generator of uniform floats in [0, 1) from a 32-bit seed. */
export const mulberry32 = (seed: number) => () => {
  seed = (seed + 0x6d2b79f5) | 0
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed)
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296
}

export const samplePaths = (tree: TrajectoryTree, maxPaths: number, seed: number): PathSample => {
  const trainable = tree.trainableCounts()
  const leaves = tree.leaves()
  const masked = new Uint8Array(tree.nodeCount)
  const random = mulberry32(seed)
  const unmaskedOnPath = (leaf: number): number => {
    let n = 0
    for (let node = leaf; node !== ROOT; node = tree.parentOf(node)) if (masked[node] === 0) n += trainable[node]!
    return n
  }
  const paths: Array<SampledPath> = []
  let trainedTokens = 0
  while (paths.length < maxPaths) {
    const counts = leaves.map((leaf) => unmaskedOnPath(leaf.node))
    let best = Infinity
    leaves.forEach((leaf, i) => {
      if (counts[i]! > 0) best = Math.min(best, roleRank(leaf.role))
    })
    if (best === Infinity) break
    const candidates = leaves.flatMap((leaf, i) => (roleRank(leaf.role) === best ? [{ leaf, count: counts[i]! }] : []))
    let r = Math.floor(random() * candidates.reduce((a, c) => a + c.count, 0))
    const chosen = candidates.find((c) => (r -= c.count) < 0)!
    for (let node = chosen.leaf.node; node !== ROOT; node = tree.parentOf(node)) masked[node] = 1
    paths.push({ leaf: chosen.leaf.node, role: chosen.leaf.role, trainedTokens: chosen.count, pathTokens: tree.lastDepthOf(chosen.leaf.node) + 1 })
    trainedTokens += chosen.count
  }
  return { paths, inUnion: masked, trainedTokens }
}
