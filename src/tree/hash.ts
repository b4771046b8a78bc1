/**
 * The prompt hash that verifies a delta-encoded call record: a sequential 64-bit hash over
 * int32 token ids, kept as two 32-bit lanes so it runs on plain JS integer arithmetic.
 *
 * It is sequential on purpose: the state after any prefix extends to the state after a
 * longer prefix, so the trajectory tree stores the state every 64 tokens and hashes a
 * 700k-token prompt by extending a stored state over its last few tokens instead of
 * reading the whole prompt again. It guards against reconstruction errors (a wrong
 * reference, a lost or reordered suffix), not against an adversary: it is not
 * cryptographic.
 *
 * Wire form of a digest: 16 lower-case hex digits, lane A then lane B, each finalised with
 * murmur3's fmix32 after mixing in the prompt length.
 */

/** The running state: two 32-bit lanes. Updated in place. */
export type HashState = Int32Array

const SEED_A = 0x9e3779b9 | 0
const SEED_B = 0x7f4a7c15 | 0

/** A fresh state (the state of the empty prefix). */
export const initialHashState = (): HashState => Int32Array.of(SEED_A, SEED_B)

/** Sets `state` to the state of the empty prefix. */
export const resetHashState = (state: HashState): void => {
  state[0] = SEED_A
  state[1] = SEED_B
}

/** Extends `state` over `tokens[from..to)`. */
export const hashTokens = (tokens: Int32Array, from: number, to: number, state: HashState): void => {
  let a = state[0]!
  let b = state[1]!
  for (let i = from; i < to; i++) {
    const t = tokens[i]!
    a = Math.imul(a ^ t, 0x9e3779b1)
    a = (a << 13) | (a >>> 19)
    b = Math.imul(b + t, 0x85ebca77) ^ a
    b = (b << 17) | (b >>> 15)
  }
  state[0] = a
  state[1] = b
}

const fmix32 = (h: number): number => {
  h ^= h >>> 16
  h = Math.imul(h, 0x85ebca6b)
  h ^= h >>> 13
  h = Math.imul(h, 0xc2b2ae35)
  h ^= h >>> 16
  return h >>> 0
}

const hex8 = (x: number): string => x.toString(16).padStart(8, "0")

/** The digest of a prefix of `length` tokens whose running state is `state`. */
export const hashDigest = (state: HashState, length: number): string =>
  hex8(fmix32(state[0]! ^ length)) + hex8(fmix32(state[1]! ^ Math.imul(length, 0x27d4eb2f)))

/** The digest of a whole token array (what the gateway's encoder sends for a prompt). */
export const digestOf = (tokens: Int32Array): string => {
  const state = initialHashState()
  hashTokens(tokens, 0, tokens.length, state)
  return hashDigest(state, tokens.length)
}
