/**
 * A binary min-heap of (time, id) pairs in typed arrays: the simulator's future event list.
 * Ties pop in an order fixed by the sequence of pushes, so runs are deterministic.
 */
export class TimeHeap {
  private times = new Float64Array(1024)
  private ids = new Int32Array(1024)
  size = 0

  push(time: number, id: number): void {
    if (this.size === this.times.length) {
      const times = new Float64Array(this.size * 2)
      const ids = new Int32Array(this.size * 2)
      times.set(this.times)
      ids.set(this.ids)
      this.times = times
      this.ids = ids
    }
    let i = this.size++
    const t = this.times
    const d = this.ids
    while (i > 0) {
      const p = (i - 1) >> 1
      if (t[p]! <= time) break
      t[i] = t[p]!
      d[i] = d[p]!
      i = p
    }
    t[i] = time
    d[i] = id
  }

  /** Time of the earliest entry (Infinity when empty). */
  peekTime(): number {
    return this.size > 0 ? this.times[0]! : Infinity
  }

  /** Removes the earliest entry and returns its id; read its time with `peekTime` first. */
  pop(): number {
    const t = this.times
    const d = this.ids
    const top = d[0]!
    const n = --this.size
    if (n > 0) {
      const time = t[n]!
      const id = d[n]!
      let i = 0
      for (;;) {
        let c = 2 * i + 1
        if (c >= n) break
        if (c + 1 < n && t[c + 1]! < t[c]!) c++
        if (t[c]! >= time) break
        t[i] = t[c]!
        d[i] = d[c]!
        i = c
      }
      t[i] = time
      d[i] = id
    }
    return top
  }

  /** Calls `f` with every (time, id) entry, in no particular order. */
  forEach(f: (time: number, id: number) => void): void {
    for (let i = 0; i < this.size; i++) f(this.times[i]!, this.ids[i]!)
  }
}
