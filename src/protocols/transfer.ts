/**
 * Arrays that grow with a context travel as objects, never as one message: the run's transfer
 * store `GYRE_<run>_kv` (memory storage, a 10-minute TTL for objects a crashed writer never
 * deleted; the KV hand-off's store too) holds them in chunks of the server's `max_payload`, and
 * the message that needs them carries only a `TokensRef {object, count}`.
 *
 * An object is `arrays` of `count` 4-byte little-endian values each, one after another (token ids
 * and versions as int32, log-probabilities as float32): a Generate's prompt (`p.<id>`, written by
 * the gateway when it has more than `INLINE_TOKENS` tokens), a long answer's output, log-probs and
 * versions (`o.<id>`, by the worker), a KV hand-off's tokens and GYKV buffer (`h.<id>`,
 * `handoff.ts`). The writer deletes what it wrote once the reader answered.
 */
import { StorageType } from "@nats-io/jetstream"
import { Objm, type ObjectStore } from "@nats-io/obj"
import { nuid } from "@nats-io/transport-node"
import { Effect, Schema } from "effect"
import { TransportError, messageOf } from "../runtime/errors.ts"
import { getObject, putObject } from "../runtime/nats.ts"
import type { ActorSystemShape } from "../runtime/system.ts"
import { rlLayout } from "./layout.ts"

/**
 * Tokens sent inside a message at most (~175 KB of base64): more go as an object. Far under the
 * default 1 MiB `max_payload` with every other field of the message, and small enough that the
 * journal's copy of an ask stays small.
 */
export const INLINE_TOKENS = 32_768

/** An object of the transfer store holding arrays of `count` values each. */
export const TokensRef = Schema.Struct({
  object: Schema.String,
  count: Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))
})
export type TokensRef = typeof TokensRef.Type

/** Opens the run's transfer store, creating it when missing. */
export const openTransferStore = Effect.fn("openTransferStore")(function* (system: ActorSystemShape) {
  const name = rlLayout(system.run).kvBucket
  const objm = new Objm(system.nats.nc)
  return yield* Effect.tryPromise({
    try: () => objm.create(name, { storage: StorageType.Memory, ttl: 600_000 * 1_000_000, replicas: system.nats.replicas }).catch(() => objm.open(name)),
    catch: (e) => new TransportError({ operation: `open object store ${name}`, message: messageOf(e) })
  })
})

/** The bytes of a typed array (4-byte values, little-endian: `src/tree/wire.ts` checks the host), not copied. */
export const bytesOf = (a: Int32Array | Float32Array | Uint8Array): Uint8Array => new Uint8Array(a.buffer, a.byteOffset, a.byteLength)

/** Stores `parts` one after another as object `name`. */
export const putParts = (store: ObjectStore, name: string, parts: ReadonlyArray<Uint8Array>) =>
  Effect.tryPromise({
    try: () => putObject(store, name, parts),
    catch: (e) => new TransportError({ operation: `put ${name}`, message: messageOf(e) })
  })

/** Stores `arrays` (each `count` values long) as a new object named `<prefix>.<nuid>`. */
export const putArrays = (store: ObjectStore, prefix: string, arrays: ReadonlyArray<Int32Array | Float32Array>) =>
  putParts(store, `${prefix}.${nuid.next()}`, arrays.map(bytesOf)).pipe(Effect.map((info): TokensRef => ({ object: info.name, count: arrays[0]?.length ?? 0 })))

/** The raw bytes of object `object` (chunks read from the stream's leader, size and digest checked). */
export const getBytes = (system: ActorSystemShape, store: ObjectStore, object: string) =>
  Effect.tryPromise({
    try: () => getObject(system.nats.jsm, store, rlLayout(system.run).kvBucket, object),
    catch: (e) => new TransportError({ operation: `get ${object}`, message: messageOf(e) })
  }).pipe(Effect.flatMap((bytes) => (bytes === null ? Effect.fail(new TransportError({ operation: `get ${object}`, message: "no such object (deleted, or expired)" })) : Effect.succeed(bytes))))

/** Object `ref` read back as `kinds.length` arrays of `ref.count` values each; a size that differs fails. */
export const getArrays = <K extends ReadonlyArray<"int32" | "float32">>(system: ActorSystemShape, store: ObjectStore, ref: TokensRef, kinds: K) =>
  getBytes(system, store, ref.object).pipe(
    Effect.flatMap((bytes) => {
      const size = ref.count * 4
      if (bytes.length !== size * kinds.length) {
        return Effect.fail(new TransportError({ operation: `get ${ref.object}`, message: `${bytes.length} bytes, expected ${kinds.length} arrays of ${ref.count} values` }))
      }
      const copy = bytes.byteOffset % 4 === 0 ? bytes : new Uint8Array(bytes) // aligned for the typed-array views
      return Effect.succeed(kinds.map((k, i) => (k === "int32" ? new Int32Array(copy.buffer, copy.byteOffset + i * size, ref.count) : new Float32Array(copy.buffer, copy.byteOffset + i * size, ref.count))) as { [I in keyof K]: K[I] extends "int32" ? Int32Array : Float32Array })
    })
  )

/** Deletes an object (best effort: the store's TTL removes what is left). */
export const deleteObject = (store: ObjectStore, object: string) => Effect.promise(() => store.delete(object).catch(() => undefined)).pipe(Effect.asVoid)
