/**
 * The packed training micro-batch: the one layout the trajectory processor (`src/tree`)
 * produces and the engine's training call consumes.
 *
 * The tokens of a micro-batch form a forest. Token `i` has a parent `parents[i]` (an index
 * into the same batch, always `< i`, or -1 for a root); attention at `i` sees exactly `i`'s
 * ancestors and `i` itself; `positions[i]` is its depth in its tree (root = 0, or the depth
 * it had in the full tree when a part of a larger tree is packed) and is what RoPE rotates by.
 * A plain sequence is the chain `parents = [-1, 0, 1, 2, ...]`.
 *
 * Loss terms are attached to the token being predicted: term `i` is
 * `-log p(tokens[i] | ancestors of i)`, computed from the model output at `parents[i]`.
 * So a branch point (one prompt, several sampled continuations) trains every child from
 * the same parent output, which a "target per position" layout cannot express. `weights[i]`
 * is 0 for roots and for context tokens (system, user, tool); for a generated token it is
 * the token's share of the loss (see the normalisation in ARCHITECTURE.md).
 */
import { createHash } from "node:crypto"

export interface PackedBatch {
  /** Number of tokens. Every array below has this length. */
  readonly length: number
  /** Input token ids. */
  readonly tokens: Int32Array
  /** Parent index within the batch, or -1 for a root; `parents[i] < i`. */
  readonly parents: Int32Array
  /** Position (depth) used by RoPE. */
  readonly positions: Int32Array
  /** Loss weight of predicting `tokens[i]` from `parents[i]`'s output (0 = not trained). */
  readonly weights: Float32Array
  /** Advantage of the loss term `i` (the execution's group-relative advantage). */
  readonly advantages: Float32Array
  /** Log-probability of `tokens[i]` under the behaviour policy that sampled it. */
  readonly behaviourLogprobs: Float32Array
  /** Log-probability under the proximal policy, or NaN where absent (then w = 1). */
  readonly proximalLogprobs: Float32Array
  /** Policy version that sampled `tokens[i]` (-1 for context tokens). */
  readonly versions: Int32Array
}

/** sha256 (hex) of every array of a packed batch, in field order: the digest the trainer journals per micro-batch. */
export const packedBatchDigest = (b: PackedBatch): string => {
  const hash = createHash("sha256")
  for (const a of [b.tokens, b.parents, b.positions, b.weights, b.advantages, b.behaviourLogprobs, b.proximalLogprobs, b.versions]) {
    hash.update(new Uint8Array(a.buffer, a.byteOffset, a.byteLength))
  }
  return hash.digest("hex")
}
