/**
 * Stream reads on a real nats-server: how many messages a read keeps requested (sized by the
 * stream's mean message size), and reads of a stream that mixes small messages with
 * near-`max_payload` ones, whole, from a sequence, by subject, and by a reader slower than the
 * server; a read whose consumer's server holds nothing more before the end the stream's info
 * named asks the leader for the rest.
 */
import { Effect, Stream } from "effect"
import { describe, expect, it } from "vitest"
import { Nats } from "../../src/runtime/nats.ts"
import { fromLeader, pullCount, readStored } from "../../src/runtime/stream-reader.ts"
import { withSystem } from "./harness.ts"

describe("pullCount", () => {
  it("requests 8 MiB worth of mean-sized messages, at least 8 and at most 512", () => {
    expect(pullCount(0, 0)).toBe(512)
    expect(pullCount(200 * 1000, 1000)).toBe(512)
    expect(pullCount(64 * 1024 * 10, 10)).toBe(128)
    expect(pullCount(1024 * 1024 * 10, 10)).toBe(8)
    expect(pullCount(4 * 1024 * 1024 * 10, 10)).toBe(8)
  })
})

const STREAM = "READER_TEST"
const big = new Uint8Array(900 * 1024).fill(7)

/** 3,000 small messages on `t.small`, with a near-`max_payload` one on `t.big` after every 100th. */
const fill = Effect.gen(function* () {
  const nats = yield* Nats
  yield* Effect.promise(() => nats.jsm.streams.add({ name: STREAM, subjects: ["t.>"], max_msg_size: -1 }))
  for (let i = 1; i <= 3000; i++) {
    yield* Effect.promise(() => nats.js.publish("t.small", JSON.stringify({ i })))
    if (i % 100 === 0) yield* Effect.promise(() => nats.js.publish("t.big", big))
  }
  return nats
})

const seqs = (msgs: ReadonlyArray<{ readonly seq: number }>) => msgs.map((m) => m.seq)
const range = (from: number, to: number) => Array.from({ length: to - from + 1 }, (_, i) => from + i)

describe("readStored", () => {
  it("reads a mixed stream whole and in order, from a sequence, and by subject", async () => {
    const r = await withSystem("reader", Effect.gen(function* () {
      const nats = yield* fill
      const all = yield* Stream.runCollect(readStored(nats, STREAM))
      const tail = yield* Stream.runCollect(readStored(nats, STREAM, { seq: 2900 }))
      const bigs = yield* Stream.runCollect(readStored(nats, STREAM, { seq: 1 }, "t.big"))
      return { all, tail, bigs }
    }))
    expect(seqs(r.all)).toEqual(range(1, 3030))
    expect(seqs(r.tail)).toEqual(range(2900, 3030))
    expect(r.bigs.length).toBe(30)
    expect(r.bigs.every((m) => m.subject === "t.big" && m.data.length === big.length)).toBe(true)
    expect(seqs(r.bigs)).toEqual(range(1, 30).map((k) => k * 101))
  }, 60_000)

  it("a reader slower than the server gets every message, in order", async () => {
    const got = await withSystem("slowreader", Effect.gen(function* () {
      const nats = yield* fill
      return yield* readStored(nats, STREAM, { seq: 2500 }).pipe(
        Stream.tap((m) => (m.seq % 50 === 0 ? Effect.sleep("20 millis") : Effect.void)),
        Stream.map((m) => m.seq),
        Stream.runCollect
      )
    }))
    expect(got).toEqual(range(2500, 3030))
  }, 60_000)

  it("a read whose consumer runs dry before the stream's last sequence asks the leader for the rest, and ends", async () => {
    const r = await withSystem("drytail", Effect.gen(function* () {
      const nats = yield* fill
      // The stream's last sequence stays 3030 while the messages after 3020 are gone: a consumer
      // sees what a replica lagging the leader would show it, nothing past 3020.
      for (let seq = 3021; seq <= 3030; seq++) yield* Effect.promise(() => nats.jsm.streams.deleteMessage(STREAM, seq))
      const info = yield* Effect.promise(() => nats.jsm.streams.info(STREAM))
      const tail = yield* Stream.runCollect(readStored(nats, STREAM, { seq: 3000 }))
      const gone = yield* Stream.runCollect(readStored(nats, STREAM, { seq: 3025 }))
      const leader = (subject: string | undefined, after: number) => Stream.runCollect(Stream.fromAsyncIterable(fromLeader(nats, STREAM, subject, after, 3030), String))
      return { last: info.state.last_seq, tail, gone, leaderAll: yield* leader(undefined, 2990), leaderBig: yield* leader("t.big", 0) }
    }))
    expect(r.last).toBe(3030)
    expect(seqs(r.tail)).toEqual(range(3000, 3020))
    // a read that starts past what is left gets nothing, not the stream from its first message
    expect(seqs(r.gone)).toEqual([])
    // the leader's answers: every subject, or one, after a sequence, up to what is left
    expect(seqs(r.leaderAll)).toEqual(range(2991, 3020))
    expect(seqs(r.leaderBig)).toEqual(range(1, 29).map((k) => k * 101))
    expect(r.leaderBig.every((m) => m.subject === "t.big" && m.data.length === big.length)).toBe(true)
  }, 60_000)
})
