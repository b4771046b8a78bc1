/**
 * Packs training units into micro-batches of about `budget` tokens in the engine's
 * `PackedBatch` layout.
 *
 * A unit that fits is packed whole. A larger one is cut along its DFS preorder into
 * consecutive ranges [a, b); a part holds its range plus, in front, the ancestors of the
 * range's first token a (the root-to-parent path) as context with weight 0. That is all a
 * part needs: in preorder every ancestor of a token in [a, b) that lies before a is an
 * ancestor of a. Each generated token is trained in exactly one part, with its own
 * weight, and its attention context is its full prefix, so the split is exact. The cost
 * is the carried ancestors: depth(a) extra tokens per part, recomputed forward and
 * backward (reported as `carriedTokens`); the cuts are placed to minimise it.
 *
 * A unit with a token at depth >= budget (a path longer than the budget: no part can hold
 * that token's context within it) is a long unit: it is cut only where a part's carried
 * context is shallower than the budget and the cut spares more tokens beyond the budget than
 * it carries (`partStarts`), so its parts may exceed the budget. Such a part is a micro-batch
 * of its own, which the engine trains in chunks (`Trainer.train` takes a batch of any length).
 * Nothing is ever dropped.
 *
 * Pieces (whole units and parts) go into micro-batches first-fit decreasing; the fill ratio
 * is packed tokens / sum over micro-batches of max(budget, tokens). Micro-batches are built
 * on demand (`PackedMicroBatch.build`), so a caller holds one at a time, not the step's.
 */
import type { PackedBatch } from "../common/packed-batch.ts"
import type { TrainingUnit } from "./units.ts"

export interface PackReport {
  readonly budget: number
  readonly microBatches: number
  /** Tokens in all micro-batches, carried ancestors included. */
  readonly tokens: number
  /** Tokens with a non-zero loss weight. */
  readonly trainedTokens: number
  /** Ancestor tokens repeated in front of split parts, and the most in front of one part (always < budget). */
  readonly carriedTokens: number
  readonly maxCarried: number
  /** Units larger than the budget, and the parts they were cut into. */
  readonly splitUnits: number
  readonly parts: number
  /** Units with a path longer than the budget, and their micro-batches over the budget. */
  readonly longUnits: number
  readonly longMicroBatches: number
  /** Tokens of the largest micro-batch. */
  readonly largest: number
  readonly fillRatio: number
}

/** One micro-batch, not built yet. */
export interface PackedMicroBatch {
  /** Its length in tokens. */
  readonly tokens: number
  /** The executions with tokens in it (in packing order, each once). */
  readonly executions: ReadonlyArray<string>
  /** Builds its arrays (a new batch on each call; the same content every time). */
  readonly build: () => PackedBatch
}

export interface Packed {
  readonly microBatches: ReadonlyArray<PackedMicroBatch>
  readonly report: PackReport
}

/** A whole unit (empty chain, full range) or a part of one. */
interface Piece {
  readonly unit: TrainingUnit
  /** Unit indices of the range's ancestors, root first (chain[k] has depth k). */
  readonly chain: Int32Array
  readonly from: number
  readonly to: number
  readonly size: number
}

const ancestorsOf = (unit: TrainingUnit, index: number): Int32Array => {
  const chain = new Int32Array(unit.positions[index]!)
  for (let p = unit.parents[index]!, k = chain.length - 1; p >= 0; p = unit.parents[p]!, k--) chain[k] = p
  return chain
}

/**
 * Part starts 0 = a_0 < a_1 < ... of a unit larger than the budget, by dynamic programming from
 * the right over subtree starts (0 and every token whose parent is not the previous token):
 * there the ancestor chain drops to the branch point, so only they can start a part cheaply.
 *
 * - A unit whose deepest token fits (`long` false): minimise the carried tokens
 *   sum depth(a_k) subject to depth(a_k) + (a_{k+1} - a_k) <= budget. Some subtree start (or
 *   the unit's end) is always within reach: from any a, preorder runs down first children to a
 *   leaf at depth <= deepest < budget, and the token after a leaf starts a subtree.
 * - A long unit (a token at depth >= budget; no cut can bring every part within the budget):
 *   minimise carried + excess, excess = sum max(0, size_k - budget), the tokens micro-batches
 *   hold beyond the budget. A cut at depth d between two parts over the budget trades d carried
 *   tokens for budget - d tokens of excess, so it is made only where d < budget / 2; a cut at
 *   depth >= budget never lowers the cost, so only subtree starts shallower than the budget are
 *   candidates, and no part recomputes an ancestor context as long as a micro-batch.
 */
const partStarts = (unit: TrainingUnit, budget: number, long: boolean): Array<number> => {
  const { positions, parents, length } = unit
  const starts = [0]
  for (let i = 1; i < length; i++) if (parents[i] !== i - 1 && (!long || positions[i]! < budget)) starts.push(i)
  const m = starts.length
  const cost = new Float64Array(m)
  const next = new Int32Array(m)
  const excess = (size: number) => (size > budget ? size - budget : 0)
  for (let k = m - 1; k >= 0; k--) {
    const depth = positions[starts[k]!]!
    let best = long ? excess(depth + length - starts[k]!) : 0
    let bestNext = m
    if (long) {
      for (let j = k + 1; j < m; j++) {
        const c = excess(depth + starts[j]! - starts[k]!) + cost[j]!
        if (c < best) {
          best = c
          bestNext = j
        }
      }
    } else if (starts[k]! + budget - depth < length) {
      best = Infinity
      for (let j = k + 1; j < m && starts[j]! <= starts[k]! + budget - depth; j++) {
        if (cost[j]! <= best) {
          best = cost[j]!
          bestNext = j
        }
      }
    }
    cost[k] = depth + best
    next[k] = bestNext
  }
  const chosen: Array<number> = []
  for (let k = 0; k < m; k = next[k]!) chosen.push(starts[k]!)
  return chosen
}

const cut = (unit: TrainingUnit, budget: number): Array<Piece> => {
  if (unit.length <= budget) return [{ unit, chain: new Int32Array(0), from: 0, to: unit.length, size: unit.length }]
  const deepest = unit.positions.reduce((a, d) => Math.max(a, d), 0)
  const starts = partStarts(unit, budget, deepest >= budget)
  return starts.map((from, k) => {
    const to = starts[k + 1] ?? unit.length
    const chain = ancestorsOf(unit, from)
    return { unit, chain, from, to, size: chain.length + to - from }
  })
}

const assemble = (pieces: ReadonlyArray<Piece>): PackedBatch => {
  const length = pieces.reduce((a, p) => a + p.size, 0)
  const batch = {
    length,
    tokens: new Int32Array(length),
    parents: new Int32Array(length),
    positions: new Int32Array(length),
    weights: new Float32Array(length),
    advantages: new Float32Array(length),
    behaviourLogprobs: new Float32Array(length),
    proximalLogprobs: new Float32Array(length).fill(Number.NaN),
    versions: new Int32Array(length)
  }
  let k = 0
  for (const { unit, chain, from, to } of pieces) {
    const offset = k
    chain.forEach((source, depth) => {
      batch.tokens[k] = unit.tokens[source]!
      batch.parents[k] = depth === 0 ? -1 : k - 1
      batch.positions[k] = depth
      batch.behaviourLogprobs[k] = unit.behaviourLogprobs[source]!
      batch.versions[k] = unit.versions[source]!
      batch.advantages[k] = unit.advantages[source]!
      k++
    })
    batch.tokens.set(unit.tokens.subarray(from, to), k)
    batch.positions.set(unit.positions.subarray(from, to), k)
    batch.weights.set(unit.weights.subarray(from, to), k)
    batch.behaviourLogprobs.set(unit.behaviourLogprobs.subarray(from, to), k)
    batch.versions.set(unit.versions.subarray(from, to), k)
    batch.advantages.set(unit.advantages.subarray(from, to), k)
    for (let i = from; i < to; i++, k++) {
      const p = unit.parents[i]!
      batch.parents[k] = p < 0 ? -1 : p < from ? offset + unit.positions[p]! : offset + chain.length + p - from
    }
  }
  return batch
}

export const packMicroBatches = (units: ReadonlyArray<TrainingUnit>, budget: number): Packed => {
  const pieces: Array<Piece> = []
  let splitUnits = 0
  let parts = 0
  let longUnits = 0
  for (const unit of units) {
    const unitPieces = cut(unit, budget)
    if (unitPieces.length > 1) {
      splitUnits++
      parts += unitPieces.length
    }
    if (unitPieces.some((p) => p.size > budget)) longUnits++
    pieces.push(...unitPieces)
  }
  const bins: Array<{ free: number; size: number; pieces: Array<Piece> }> = []
  for (const piece of [...pieces].sort((a, b) => b.size - a.size)) {
    const bin = bins.find((b) => b.free >= piece.size)
    if (bin === undefined) bins.push({ free: budget - piece.size, size: piece.size, pieces: [piece] })
    else {
      bin.free -= piece.size
      bin.size += piece.size
      bin.pieces.push(piece)
    }
  }
  let tokens = 0
  let trainedTokens = 0
  let capacity = 0
  for (const piece of pieces) for (let i = piece.from; i < piece.to; i++) if (piece.unit.weights[i] !== 0) trainedTokens++
  for (const bin of bins) {
    tokens += bin.size
    capacity += Math.max(budget, bin.size)
  }
  return {
    microBatches: bins.map((bin) => ({
      tokens: bin.size,
      executions: [...new Set(bin.pieces.map((p) => p.unit.execution))],
      build: () => assemble(bin.pieces)
    })),
    report: {
      budget,
      microBatches: bins.length,
      tokens,
      trainedTokens,
      carriedTokens: pieces.reduce((a, p) => a + p.chain.length, 0),
      maxCarried: pieces.reduce((a, p) => Math.max(a, p.chain.length), 0),
      splitUnits,
      parts,
      longUnits,
      longMicroBatches: bins.filter((b) => b.size > budget).length,
      largest: bins.reduce((a, b) => Math.max(a, b.size), 0),
      fillRatio: bins.length === 0 ? 0 : tokens / capacity
    }
  }
}
