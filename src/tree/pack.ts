/**
 * Packs training units into micro-batches of at most `budget` tokens in the engine's
 * `PackedBatch` layout.
 *
 * A unit that fits is packed whole. A larger one is cut along its DFS preorder into
 * consecutive ranges [a, b); a part holds its range plus, in front, the ancestors of the
 * range's first token a (the root-to-parent path) as context with weight 0. That is all a
 * part needs: in preorder every ancestor of a token in [a, b) that lies before a is an
 * ancestor of a. Each generated token is trained in exactly one part, with its own
 * weight, and its attention context is its full prefix, so the split is exact. The cost
 * is the carried ancestors: depth(a) extra tokens per part, recomputed forward and
 * backward (reported as `carriedTokens`); the cuts are placed to minimise it. A part
 * holding a token at depth d holds d + 1 tokens, so a budget not above the deepest
 * token's depth fails with `BudgetTooSmall`.
 *
 * Pieces (whole units and parts) go into micro-batches first-fit decreasing; the fill
 * ratio is packed tokens / (micro-batches * budget).
 */
import { Result, Schema } from "effect"
import type { PackedBatch } from "../common/packed-batch.ts"
import type { TrainingUnit } from "./units.ts"

export interface PackReport {
  readonly budget: number
  readonly microBatches: number
  /** Tokens in all micro-batches, carried ancestors included. */
  readonly tokens: number
  /** Tokens with a non-zero loss weight. */
  readonly trainedTokens: number
  /** Ancestor tokens repeated in front of split parts. */
  readonly carriedTokens: number
  /** Units larger than the budget, and the parts they were cut into. */
  readonly splitUnits: number
  readonly parts: number
  readonly fillRatio: number
}

export interface Packed {
  readonly batches: ReadonlyArray<PackedBatch>
  /** Per micro-batch, the executions with tokens in it (in packing order, each once). */
  readonly executions: ReadonlyArray<ReadonlyArray<string>>
  readonly report: PackReport
}

/** A path is longer than the micro-batch budget, so no micro-batch can hold its context. */
export class BudgetTooSmall extends Schema.TaggedError<BudgetTooSmall>()("BudgetTooSmall", {
  execution: Schema.String,
  depth: Schema.Number,
  budget: Schema.Number
}) {}

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
 * Part starts 0 = a_0 < a_1 < ... for a unit larger than the budget, minimising the carried
 * tokens sum depth(a_k) subject to depth(a_k) + (a_{k+1} - a_k) <= budget, by dynamic
 * programming from the right over subtree starts (0 and every token whose parent is not the
 * previous token): there the ancestor chain drops to the branch point. Some subtree start
 * (or the unit's end) is always within reach: from any a, preorder runs down first children
 * to a leaf at depth <= deepest < budget, and the token after a leaf starts a subtree.
 */
const partStarts = (unit: TrainingUnit, budget: number): Array<number> => {
  const { positions, parents, length } = unit
  const starts = [0]
  for (let i = 1; i < length; i++) if (parents[i] !== i - 1) starts.push(i)
  const m = starts.length
  const carried = new Float64Array(m)
  const next = new Int32Array(m)
  for (let k = m - 1; k >= 0; k--) {
    const depth = positions[starts[k]!]!
    const end = starts[k]! + budget - depth
    let best = 0
    let bestNext = m
    if (end < length) {
      best = Infinity
      for (let j = k + 1; j < m && starts[j]! <= end; j++) {
        if (carried[j]! <= best) {
          best = carried[j]!
          bestNext = j
        }
      }
    }
    carried[k] = depth + best
    next[k] = bestNext
  }
  const chosen: Array<number> = []
  for (let k = 0; k < m; k = next[k]!) chosen.push(starts[k]!)
  return chosen
}

const cut = (unit: TrainingUnit, budget: number): Result.Result<Array<Piece>, BudgetTooSmall> => {
  if (unit.length <= budget) return Result.succeed([{ unit, chain: new Int32Array(0), from: 0, to: unit.length, size: unit.length }])
  const deepest = unit.positions.reduce((a, d) => Math.max(a, d), 0)
  if (deepest >= budget) return Result.fail(new BudgetTooSmall({ execution: unit.execution, depth: deepest + 1, budget }))
  const starts = partStarts(unit, budget)
  return Result.succeed(
    starts.map((from, k) => {
      const to = starts[k + 1] ?? unit.length
      const chain = ancestorsOf(unit, from)
      return { unit, chain, from, to, size: chain.length + to - from }
    })
  )
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

export const packMicroBatches = (units: ReadonlyArray<TrainingUnit>, budget: number): Result.Result<Packed, BudgetTooSmall> => {
  const pieces: Array<Piece> = []
  let splitUnits = 0
  let parts = 0
  for (const unit of units) {
    const cutResult = cut(unit, budget)
    if (Result.isFailure(cutResult)) return Result.fail(cutResult.failure)
    if (cutResult.success.length > 1) {
      splitUnits++
      parts += cutResult.success.length
    }
    pieces.push(...cutResult.success)
  }
  const bins: Array<{ free: number; pieces: Array<Piece> }> = []
  for (const piece of [...pieces].sort((a, b) => b.size - a.size)) {
    const bin = bins.find((b) => b.free >= piece.size)
    if (bin === undefined) bins.push({ free: budget - piece.size, pieces: [piece] })
    else {
      bin.free -= piece.size
      bin.pieces.push(piece)
    }
  }
  const batches = bins.map((bin) => assemble(bin.pieces))
  const executions = bins.map((bin) => [...new Set(bin.pieces.map((p) => p.unit.execution))])
  let tokens = 0
  let trainedTokens = 0
  for (const batch of batches) {
    tokens += batch.length
    for (const w of batch.weights) if (w !== 0) trainedTokens++
  }
  const carriedTokens = pieces.reduce((a, p) => a + p.chain.length, 0)
  return Result.succeed({
    batches,
    executions,
    report: {
      budget,
      microBatches: batches.length,
      tokens,
      trainedTokens,
      carriedTokens,
      splitUnits,
      parts,
      fillRatio: batches.length === 0 ? 0 : tokens / (batches.length * budget)
    }
  })
}
