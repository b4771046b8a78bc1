/**
 * Byte-pair encoding of one word by merge ranks, as `@huggingface/tokenizers`' BPE model does
 * it: the symbols start as the word's code points; the adjacent pair of lowest rank merges
 * first (of equal ranks, the leftmost), until no adjacent pair has a rank.
 *
 * Symbols are numbers: every string of the vocabulary and of the merges gets one (`Merges`),
 * so merging looks up integer pairs and builds no strings. A binary heap of the ranked pairs,
 * with stale entries skipped on pop, keeps long words O(n log n).
 */
import { KeyHeap } from "../common/heap.ts"

/** The merges of a tokenizer.json over numbered symbols. */
export interface Merges {
  /** The symbol of a string (a vocabulary entry or a merge's part or result). */
  readonly symbol: ReadonlyMap<string, number>
  /** The string of each symbol. */
  readonly strings: ReadonlyArray<string>
  /** `ranks[left]?.get(right)`: the rank of merging the two symbols. */
  readonly ranks: ReadonlyArray<ReadonlyMap<number, number> | undefined>
  /** The symbol each rank's merge makes. */
  readonly merged: Int32Array
}

/**
 * Numbers `vocabulary` and the parts and results of `merges` ("left right" strings or
 * [left, right] pairs, the first entry deciding which, as in the library; a repeated merge
 * keeps its last rank).
 */
export const numberMerges = (vocabulary: Iterable<string>, merges: ReadonlyArray<string | ReadonlyArray<string>>): Merges => {
  const symbol = new Map<string, number>()
  const strings: Array<string> = []
  const of = (s: string) => {
    let id = symbol.get(s)
    if (id === undefined) symbol.set(s, (id = strings.push(s) - 1))
    return id
  }
  for (const s of vocabulary) of(s)
  const pairs = Array.isArray(merges[0])
  const left = new Int32Array(merges.length).fill(-1), right = new Int32Array(merges.length)
  const merged = new Int32Array(merges.length).fill(-1)
  merges.forEach((merge, rank) => {
    const [l, r] = pairs ? (merge as ReadonlyArray<string>) : (merge as string).split(" ", 2)
    if (l === undefined || r === undefined) return
    ;[left[rank], right[rank], merged[rank]] = [of(l), of(r), of(l + r)]
  })
  const ranks = new Array<Map<number, number> | undefined>(strings.length).fill(undefined)
  for (let rank = 0; rank < merges.length; rank++) {
    if (left[rank]! >= 0) (ranks[left[rank]!] ??= new Map()).set(right[rank]!, rank)
  }
  return { symbol, strings, ranks, merged }
}

/** The symbols of a word after every ranked merge (`symbols` is merged in place). */
export const bpe = (symbols: Int32Array, merges: Merges): Array<number> => {
  const n = symbols.length
  if (n < 2) return Array.from(symbols)
  const { ranks, merged } = merges
  const next = new Int32Array(n) // n: none
  const prev = new Int32Array(n) // -1: none
  const version = new Int32Array(n) // bumped when a symbol or its right neighbour changes
  for (let i = 0; i < n; i++) {
    next[i] = i + 1
    prev[i] = i - 1
  }
  const heap = new KeyHeap() // (rank * n + position, the position's version when pushed)
  // key = rank * n + position: the lowest rank first, then the leftmost
  const offer = (i: number) => {
    const j = next[i]!
    const rank = j < n ? ranks[symbols[i]!]?.get(symbols[j]!) : undefined
    if (rank !== undefined) heap.push(rank * n + i, version[i]!)
  }
  for (let i = 0; i < n - 1; i++) offer(i)
  while (heap.size > 0) {
    const key = heap.peekKey()
    const v = heap.pop()
    const i = key % n
    if (version[i] !== v) continue
    const j = next[i]!
    symbols[i] = merged[(key - i) / n]!
    version[j] = -1 // merged away: no entry of j is valid again
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
  const out: Array<number> = []
  for (let i = 0; i < n; i = next[i]!) out.push(symbols[i]!)
  return out
}
