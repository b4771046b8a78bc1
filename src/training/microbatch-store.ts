/**
 * The packed arrays of a step's micro-batches, as objects of the run's object store
 * `GYRE_<run>_batches`: object `s<step>.a<attempt>.m<index>` (`microBatchObject`) holds the
 * eight arrays of the `PackedBatch` in `packedBatchDigest` order (tokens, parents, positions,
 * weights, advantages, behaviour log-probs, proximal log-probs, versions), each `length` 4-byte
 * little-endian values, nothing else: `32 x length` bytes, whose sha256 is the batch's
 * `packedBatchDigest`. The work-queue message (`MicroBatchRef`) carries the name's parts, the
 * length and that digest, so a message is a few hundred bytes whatever the micro-batch's length,
 * and the object moves in chunks of the server's `max_payload` (`putObject`).
 *
 * A read checks the length and the digest against the reference (`MicroBatchUnreadable` when
 * they differ or the object is gone). The core writes each object before it publishes its
 * reference, reads it back for a recomputation or a later PPO epoch, and removes the step's
 * objects when the step ends; a new attempt at a step first removes every object an earlier
 * attempt left (`removeStep`).
 */
import { createHash } from "node:crypto"
import { Objm, type ObjectStore } from "@nats-io/obj"
import { Effect, Schema } from "effect"
import type { PackedBatch } from "../common/packed-batch.ts"
import { microBatchObject, type MicroBatchRef } from "../protocols/device.ts"
import { rlLayout } from "../protocols/layout.ts"
import { TransportError, messageOf } from "../runtime/errors.ts"
import { getObject, putObject } from "../runtime/nats.ts"
import type { ActorSystemShape } from "../runtime/system.ts"

/** A micro-batch's object is missing, or does not hold what its reference says. */
export class MicroBatchUnreadable extends Schema.TaggedError<MicroBatchUnreadable>()("MicroBatchUnreadable", {
  object: Schema.String,
  reason: Schema.String
}) {}

/** Bytes per token of a micro-batch object: eight 4-byte arrays. */
export const MICROBATCH_BYTES_PER_TOKEN = 32

const FIELDS = ["tokens", "parents", "positions", "weights", "advantages", "behaviourLogprobs", "proximalLogprobs", "versions"] as const
const FLOATS = new Set<string>(["weights", "advantages", "behaviourLogprobs", "proximalLogprobs"])

/** The object's bytes of `batch` (see the module comment). */
export const encodeMicroBatch = (batch: PackedBatch): Uint8Array => {
  const n = batch.length
  const out = new Uint8Array(n * MICROBATCH_BYTES_PER_TOKEN)
  FIELDS.forEach((field, k) => {
    const a = batch[field]
    out.set(new Uint8Array(a.buffer, a.byteOffset, n * 4), k * n * 4)
  })
  return out
}

/** The batch of an object's bytes (views on `bytes` when aligned). */
export const decodeMicroBatch = (bytes: Uint8Array): PackedBatch => {
  const n = bytes.length / MICROBATCH_BYTES_PER_TOKEN
  const own = bytes.byteOffset % 4 === 0 ? bytes : bytes.slice()
  const arrays = Object.fromEntries(
    FIELDS.map((field, k) => {
      const offset = own.byteOffset + k * n * 4
      return [field, FLOATS.has(field) ? new Float32Array(own.buffer, offset, n) : new Int32Array(own.buffer, offset, n)]
    })
  )
  return { length: n, ...arrays } as unknown as PackedBatch
}

/** sha256 (hex) of an object's bytes: the `packedBatchDigest` of its batch. */
export const microBatchDigest = (bytes: Uint8Array): string => createHash("sha256").update(bytes).digest("hex")

export interface MicroBatchStore {
  /** Stores `batch` as micro-batch `index` of the attempt; returns its digest. */
  readonly put: (at: { readonly step: number; readonly attempt: number }, index: number, batch: PackedBatch) => Effect.Effect<string, TransportError>
  /** The batch a reference names, checked against its length and digest. */
  readonly get: (ref: MicroBatchRef) => Effect.Effect<PackedBatch, TransportError | MicroBatchUnreadable>
  /** Deletes every object of step `step` (of any attempt). */
  readonly removeStep: (step: number) => Effect.Effect<void, TransportError>
}

/** Deletes the objects of `store` whose names start with `s<step>.` (any attempt). */
export const removeStepObjects = (store: ObjectStore, step: number): Promise<void> =>
  store.list().then(async (infos) => {
    for (const info of infos) if (info.name.startsWith(`s${step}.`)) await store.delete(info.name).catch(() => undefined)
  })

/** Opens (creating when missing) the run's micro-batch object store. */
export const openMicroBatchStore = (system: ActorSystemShape): Effect.Effect<MicroBatchStore, TransportError> =>
  Effect.gen(function* () {
    const bucket = rlLayout(system.run).batchesBucket
    const store: ObjectStore = yield* Effect.tryPromise({
      try: () => new Objm(system.nats.nc).create(bucket, { replicas: system.nats.replicas }),
      catch: (e) => new TransportError({ operation: `open object store ${bucket}`, message: messageOf(e) })
    })
    const attempt = <A>(operation: string, f: () => Promise<A>) => Effect.tryPromise({ try: f, catch: (e) => new TransportError({ operation, message: messageOf(e) }) })
    return {
      put: (at, index, batch) => {
        const name = microBatchObject(at.step, at.attempt, index)
        const bytes = encodeMicroBatch(batch)
        return attempt(`store ${name}`, () => putObject(store, name, bytes)).pipe(Effect.as(microBatchDigest(bytes)))
      },
      get: (ref) =>
        Effect.gen(function* () {
          const object = microBatchObject(ref.step, ref.attempt, ref.index)
          const bytes = yield* attempt(`read ${object}`, () => getObject(system.nats.jsm, store, bucket, object))
          if (bytes === null) return yield* new MicroBatchUnreadable({ object, reason: `not in ${bucket}` })
          if (bytes.length !== ref.tokens * MICROBATCH_BYTES_PER_TOKEN) {
            return yield* new MicroBatchUnreadable({ object, reason: `${bytes.length} bytes, expected ${ref.tokens * MICROBATCH_BYTES_PER_TOKEN} for ${ref.tokens} tokens` })
          }
          const digest = microBatchDigest(bytes)
          if (digest !== ref.digest) return yield* new MicroBatchUnreadable({ object, reason: `digest ${digest}, the reference says ${ref.digest}` })
          return decodeMicroBatch(bytes)
        }),
      removeStep: (step) => attempt(`delete the micro-batches of step ${step}`, () => removeStepObjects(store, step))
    }
  })
