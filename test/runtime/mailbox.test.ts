/**
 * The incarnation's bookkeeping alone (no NATS): the dedup window, the mailbox's order and
 * concurrency, and which messages are acknowledged, held for a snapshot or handed back.
 */
import { describe, expect, it } from "vitest"
import { AckBook, AnswerCache, HandledIds, Mailbox } from "../../src/runtime/mailbox.ts"

describe("HandledIds (dedup window)", () => {
  it("remembers ids, forgets the oldest past its memory, and keeps the newest for a snapshot", () => {
    const ids = new HandledIds(5, 3)
    for (let i = 0; i < 7; i++) ids.remember(`m${i}`)
    expect(ids.size).toBe(5)
    expect(ids.has("m0")).toBe(false)
    expect(ids.has("m1")).toBe(false)
    expect(ids.has("m2")).toBe(true)
    expect(ids.recent()).toEqual(["m4", "m5", "m6"])
    // An id remembered again keeps its place.
    ids.remember("m2")
    expect(ids.size).toBe(5)
    expect(ids.recent()).toEqual(["m4", "m5", "m6"])
    ids.remember("m7")
    expect(ids.has("m2")).toBe(false)
    expect(ids.recent()).toEqual(["m5", "m6", "m7"])
  })

  it("stays O(1) per message at its full memory", () => {
    const ids = new HandledIds()
    const t0 = performance.now()
    for (let i = 0; i < 100_000; i++) {
      ids.has(`id-${i}`)
      ids.remember(`id-${i}`)
    }
    // ~0.1-0.5 us each; the old Map-based window took ~30 us each once full.
    expect((performance.now() - t0) * 10).toBeLessThan(5_000)
    expect(ids.size).toBe(10_000)
    expect(ids.recent()[511]).toBe("id-99999")
  })

  it("restores from a snapshot's list", () => {
    const ids = HandledIds.from(["a", "b", "c"], 10, 2)
    expect(ids.has("a") && ids.has("c")).toBe(true)
    expect(ids.recent()).toEqual(["b", "c"])
    expect(new HandledIds().recent()).toEqual([])
  })
})

describe("Mailbox", () => {
  it("hands out messages in arrival order, at most `concurrency` at a time", () => {
    const box = new Mailbox<string>(2)
    for (const m of ["a", "b", "c", "d"]) expect(box.offer(m)).toBe(true)
    expect(box.take()).toBe("a")
    expect(box.take()).toBe("b")
    expect(box.take()).toBeUndefined()
    expect(box.busy).toBe(2)
    expect(box.depth).toBe(2)
    box.release()
    expect(box.take()).toBe("c")
    box.release()
    box.release()
    expect(box.take()).toBe("d")
    expect(box.take()).toBeUndefined()
  })

  it("starts nothing while held, and gives back what waits when closed", () => {
    const box = new Mailbox<number>(1)
    box.offer(1)
    box.offer(2)
    box.hold(true)
    expect(box.take()).toBeUndefined()
    box.hold(false)
    expect(box.take()).toBe(1)
    expect(box.close()).toEqual([2])
    expect(box.open).toBe(false)
    expect(box.offer(3)).toBe(false)
    expect(box.take()).toBeUndefined()
    box.release()
    expect(() => box.release()).toThrow(/without a running handler/)
  })
})

describe("AckBook", () => {
  it("without persistence, acknowledges and answers every message at once", () => {
    const book = new AckBook<string>(undefined)
    expect(book.settleTell("t1", true)).toBe("ack")
    expect(book.settleTell("t2", false)).toBe("ack")
    expect(book.settleAsk("a1", true)).toBe("reply")
    expect(book.takeForSnapshot()).toEqual({ write: false, confirm: [] })
  })

  it("with persistence, holds changes until the snapshot that holds them", () => {
    const book = new AckBook<string>(3)
    // Nothing changed and nothing pending: acknowledged at once.
    expect(book.settleTell("read", false)).toBe("ack")
    expect(book.settleTell("t1", true)).toBe("hold")
    // Unchanged, but changes wait: it may be a redelivered copy of one of them.
    expect(book.settleTell("dup", false)).toBe("hold")
    expect(book.settleTell("t2", true)).toBe("hold")
    expect(book.settleTell("t3", true)).toBe("snapshot")
    expect(book.changes).toBe(3)
    expect(book.takeForSnapshot()).toEqual({ write: true, confirm: ["t1", "dup", "t2", "t3"] })
    expect(book.changes).toBe(0)
    expect(book.held).toBe(0)
    expect(book.settleTell("after", false)).toBe("ack")
  })

  it("answers an ask that changed the state only after a snapshot, at once otherwise", () => {
    const book = new AckBook<string>(10)
    expect(book.settleTell("t1", true)).toBe("hold")
    expect(book.settleAsk("read", false)).toBe("reply")
    expect(book.settleAsk("write", true)).toBe("snapshot")
    expect(book.takeForSnapshot().confirm).toEqual(["t1", "write"])
  })

  it("hands back what is in flight and what waits for a snapshot, once", () => {
    const book = new AckBook<string>(5)
    book.started("running")
    book.started("done")
    book.finished("done")
    expect(book.settleTell("done", true)).toBe("hold")
    expect([...book.inFlight]).toEqual(["running"])
    expect(book.releaseAll().sort()).toEqual(["done", "running"])
    expect(book.releaseAll()).toEqual([])
    expect(book.takeForSnapshot()).toEqual({ write: false, confirm: [] })
  })
})

describe("AnswerCache (answers of recent asks)", () => {
  it("keeps the first answer per id and forgets the oldest past its count or its bytes", () => {
    const cache = new AnswerCache(3, 10)
    const bytes = (n: number) => new Uint8Array(n).fill(n)
    cache.record("a", bytes(2))
    cache.record("a", bytes(3))
    expect(cache.get("a")).toEqual(bytes(2))
    cache.record("b", bytes(2))
    cache.record("c", bytes(2))
    cache.record("d", bytes(2))
    expect(cache.get("a")).toBeUndefined()
    expect(cache.size).toBe(3)
    // Full by count: b goes; then 4 + 6 bytes fit.
    cache.record("e", bytes(6))
    expect([cache.get("b"), cache.get("c")]).toEqual([undefined, bytes(2)])
    expect(cache.bytes).toBe(10)
    // Full by bytes: c and d go to make room for 4.
    cache.record("f", bytes(4))
    expect([cache.get("c"), cache.get("d"), cache.get("e"), cache.get("f")]).toEqual([undefined, undefined, bytes(6), bytes(4)])
    expect(cache.bytes).toBe(10)
    cache.record("huge", bytes(11))
    expect(cache.get("huge")).toBeUndefined()
    expect(cache.size).toBe(2)
  })
})
