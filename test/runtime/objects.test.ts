/**
 * Objects read from their stream's leader (`getObject`), on a real nats-server: a many-chunk
 * object comes back whole and equal to what `putObject` wrote (and to nats.js's own read); a
 * name never put, and one deleted, read as null; an object with a chunk gone fails with a message
 * naming it instead of returning short bytes.
 */
import { Objm } from "@nats-io/obj"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { Nats, getObject, putObject } from "../../src/runtime/nats.ts"
import { withSystem } from "./harness.ts"

const BUCKET = "objects-test"

/** Byte-equality without a deep compare of millions of elements. */
const same = (a: Uint8Array | null, b: Uint8Array) => a !== null && Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(Buffer.from(b.buffer, b.byteOffset, b.byteLength))

describe("getObject", () => {
  it("reads objects chunk by chunk from the leader, null when absent, and names a missing chunk", () =>
    withSystem(
      "objects",
      Effect.gen(function* () {
        const nats = yield* Nats
        const store = yield* Effect.promise(() => new Objm(nats.nc).create(BUCKET))
        const data = new Uint8Array(3_000_003)
        for (let i = 0; i < data.length; i++) data[i] = (i * 7919 + (i >> 9)) & 255
        // 128 KiB chunks: 23 of them, the last one short
        const info = yield* Effect.promise(() => store.putBlob({ name: "many", options: { max_chunk_size: 128 << 10 } }, data))
        expect(info.chunks).toBe(23)
        const read = yield* Effect.promise(() => getObject(nats.jsm, store, BUCKET, "many"))
        expect(read?.length).toBe(data.length)
        expect(same(read, data)).toBe(true)
        expect(same(yield* Effect.promise(() => store.getBlob("many")), data)).toBe(true)
        // chunks as large as the server takes (putObject's), an empty object, names never put or deleted
        const large = yield* Effect.promise(() => putObject(store, "one", data))
        expect(large.chunks).toBeLessThan(info.chunks) // the server's largest messages, as the run's weights are put
        expect(same(yield* Effect.promise(() => getObject(nats.jsm, store, BUCKET, "one")), data)).toBe(true)
        yield* Effect.promise(() => putObject(store, "empty", new Uint8Array(0)))
        expect(yield* Effect.promise(() => getObject(nats.jsm, store, BUCKET, "empty"))).toEqual(new Uint8Array(0))
        expect(yield* Effect.promise(() => getObject(nats.jsm, store, BUCKET, "never"))).toBeNull()
        yield* Effect.promise(() => store.delete("one"))
        expect(yield* Effect.promise(() => getObject(nats.jsm, store, BUCKET, "one"))).toBeNull()
        // a chunk deleted from the stream: a clear failure, not short bytes
        const chunks = `$O.${BUCKET}.C.${info.nuid}`
        const second = yield* Effect.promise(() => nats.jsm.streams.getMessage(`OBJ_${BUCKET}`, { next_by_subj: chunks, seq: 1 } as never))
        const third = yield* Effect.promise(() => nats.jsm.streams.getMessage(`OBJ_${BUCKET}`, { next_by_subj: chunks, seq: second!.seq + 1 } as never))
        yield* Effect.promise(() => nats.jsm.streams.deleteMessage(`OBJ_${BUCKET}`, third!.seq))
        const failure = yield* Effect.promise(() => getObject(nats.jsm, store, BUCKET, "many").then(() => "read", (e: Error) => e.message))
        expect(failure).toBe(`object many of ${BUCKET}: chunk 23 of 23 is missing`)
      })
    ))
})
