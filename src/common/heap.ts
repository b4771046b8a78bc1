/**
 * A binary min-heap of (key, id) pairs in typed arrays (keys are doubles, ids int32): the
 * simulator's future event list (key: time) and BPE's ranked merges (key: rank and position,
 * id: the position's version). Ties pop in an order fixed by the sequence of pushes, so runs
 * are deterministic.
 */
export class KeyHeap {
  private keys = new Float64Array(1024)
  private ids = new Int32Array(1024)
  size = 0

  push(key: number, id: number): void {
    if (this.size === this.keys.length) {
      const keys = new Float64Array(this.size * 2)
      const ids = new Int32Array(this.size * 2)
      keys.set(this.keys)
      ids.set(this.ids)
      this.keys = keys
      this.ids = ids
    }
    let i = this.size++
    const t = this.keys
    const d = this.ids
    while (i > 0) {
      const p = (i - 1) >> 1
      if (t[p]! <= key) break
      t[i] = t[p]!
      d[i] = d[p]!
      i = p
    }
    t[i] = key
    d[i] = id
  }

  /** Key of the least entry (Infinity when empty). */
  peekKey(): number {
    return this.size > 0 ? this.keys[0]! : Infinity
  }

  /** Removes the least entry and returns its id; read its key with `peekKey` first. */
  pop(): number {
    const t = this.keys
    const d = this.ids
    const top = d[0]!
    const n = --this.size
    if (n > 0) {
      const key = t[n]!
      const id = d[n]!
      let i = 0
      for (;;) {
        let c = 2 * i + 1
        if (c >= n) break
        if (c + 1 < n && t[c + 1]! < t[c]!) c++
        if (t[c]! >= key) break
        t[i] = t[c]!
        d[i] = d[c]!
        i = c
      }
      t[i] = key
      d[i] = id
    }
    return top
  }

  /** Calls `f` with every (key, id) entry, in no particular order. */
  forEach(f: (key: number, id: number) => void): void {
    for (let i = 0; i < this.size; i++) f(this.keys[i]!, this.ids[i]!)
  }
}
