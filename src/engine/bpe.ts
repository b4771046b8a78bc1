/**
 * Byte-pair encoding of one word by merge ranks, as `@huggingface/tokenizers`' BPE model does
 * it: the symbols start as the word's code points; the adjacent pair of lowest rank merges
 * first (of equal ranks, the leftmost), until no adjacent pair has a rank. A binary heap of
 * the ranked pairs, with stale entries skipped on pop, keeps long words O(n log n).
 */

/** Rank of each merge: `ranks.get(left)?.get(right)`. */
export type MergeRanks = ReadonlyMap<string, ReadonlyMap<string, number>>

/**
 * The ranks of tokenizer.json's `merges`: "left right" strings or [left, right] pairs (the
 * first entry decides which, as in the library); a repeated merge keeps its last rank.
 */
export const mergeRanks = (merges: ReadonlyArray<string | ReadonlyArray<string>>): MergeRanks => {
  const pairs = Array.isArray(merges[0])
  const ranks = new Map<string, Map<string, number>>()
  merges.forEach((merge, rank) => {
    const [left, right] = pairs ? (merge as ReadonlyArray<string>) : (merge as string).split(" ", 2)
    if (left === undefined || right === undefined) return
    let row = ranks.get(left)
    if (row === undefined) ranks.set(left, (row = new Map()))
    row.set(right, rank)
  })
  return ranks
}

/** A min-heap of (rank, position) keys, each with the version of its position when pushed. */
class PairHeap {
  private readonly keys: Array<number> = []
  private readonly versions: Array<number> = []
  get size() {
    return this.keys.length
  }
  push(key: number, version: number) {
    const { keys, versions } = this
    let i = keys.length
    keys.push(key)
    versions.push(version)
    while (i > 0) {
      const parent = (i - 1) >> 1
      if (keys[parent]! <= key) break
      keys[i] = keys[parent]!
      versions[i] = versions[parent]!
      i = parent
    }
    keys[i] = key
    versions[i] = version
  }
  /** Removes the least key; returns it and its version. */
  pop(): readonly [number, number] {
    const { keys, versions } = this
    const top = [keys[0]!, versions[0]!] as const
    const key = keys.pop()!
    const version = versions.pop()!
    const n = keys.length
    if (n === 0) return top
    let i = 0
    for (;;) {
      let child = 2 * i + 1
      if (child >= n) break
      if (child + 1 < n && keys[child + 1]! < keys[child]!) child++
      if (keys[child]! >= key) break
      keys[i] = keys[child]!
      versions[i] = versions[child]!
      i = child
    }
    keys[i] = key
    versions[i] = version
    return top
  }
}

/** The word's tokens after every ranked merge. */
export const bpe = (word: string, ranks: MergeRanks): Array<string> => {
  const symbols = Array.from(word)
  const n = symbols.length
  if (n < 2) return symbols
  const next = Int32Array.from({ length: n }, (_, i) => i + 1) // n: none
  const prev = Int32Array.from({ length: n }, (_, i) => i - 1) // -1: none
  const version = new Int32Array(n) // bumped when a symbol or its right neighbour changes; -1: merged away
  const heap = new PairHeap()
  // key = rank * n + position: the lowest rank first, then the leftmost
  const offer = (i: number) => {
    const j = next[i]!
    const rank = j < n ? ranks.get(symbols[i]!)?.get(symbols[j]!) : undefined
    if (rank !== undefined) heap.push(rank * n + i, version[i]!)
  }
  for (let i = 0; i < n - 1; i++) offer(i)
  while (heap.size > 0) {
    const [key, v] = heap.pop()
    const i = key % n
    if (version[i] !== v) continue
    const j = next[i]!
    symbols[i] += symbols[j]!
    version[j] = -1
    next[i] = next[j]!
    if (next[i]! < n) prev[next[i]!] = i
    version[i]!++
    offer(i)
    const p = prev[i]!
    if (p >= 0) {
      version[p]!++
      offer(p)
    }
  }
  const out: Array<string> = []
  for (let i = 0; i < n; i = next[i]!) out.push(symbols[i]!)
  return out
}
