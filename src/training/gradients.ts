/**
 * Gradients of a step's micro-batches and their reduce.
 *
 * A micro-batch's result is its gradient alone and its tokens' log-probs on the step's weights
 * (the proximal policy of the later PPO epochs, `update.ts`, so the core need not score the
 * batch again). A satellite stores it as object `s<step>.a<attempt>.m<index>` of
 * `GYRE_<run>_grads`: the flat F32 gradient (gyre.h layout) then the micro-batch's F32 token
 * log-probs, little-endian. The core sums the gradients in micro-batch index order (`InOrderSum`):
 * float addition is not associative, so a fixed order is what makes the update bit-identical
 * whoever computed which micro-batch and whenever a satellite joined. The sum streams: each
 * gradient is added as soon as every lower index has been, so only out-of-order arrivals wait,
 * in the store until their turn (the core stores its own too when one arrives out of order, so it
 * holds one gradient at a time). A micro-batch that cannot be trained (`"failed"`) adds nothing.
 * The token log-probs are kept (4 bytes per token of the step) only for the later PPO epochs.
 */
import { Objm, type ObjectStore } from "@nats-io/obj"
import { Effect, Schema } from "effect"
import { gradientObject } from "../protocols/device.ts"
import { rlLayout } from "../protocols/layout.ts"
import { TransportError, messageOf } from "../runtime/errors.ts"
import { getObject, putObject } from "../runtime/nats.ts"
import type { ActorSystemShape } from "../runtime/system.ts"
import { removeStepObjects } from "./microbatch-store.ts"

/** A gradient object is missing or does not hold `paramCount` + the micro-batch's tokens floats. */
export class GradientUnreadable extends Schema.TaggedError<GradientUnreadable>()("GradientUnreadable", {
  object: Schema.String,
  reason: Schema.String
}) {}

/** What a micro-batch's computation hands the core: its gradient alone and its tokens' log-probs. */
export interface MicroBatchGradient {
  readonly grads: Float32Array
  readonly logprobs: Float32Array
}

export interface GradientStore {
  readonly put: (at: StepAttempt, index: number, gradient: MicroBatchGradient) => Effect.Effect<void, TransportError>
  /** Reads micro-batch `index`'s result; `tokens` is the micro-batch's length. */
  readonly get: (at: StepAttempt, index: number, tokens: number) => Effect.Effect<MicroBatchGradient, TransportError | GradientUnreadable>
  /** Deletes every gradient object of step `step` (of any attempt). */
  readonly removeStep: (step: number) => Effect.Effect<void, TransportError>
}

/** A step and the attempt at it (`StepPlan.attempt`). */
export interface StepAttempt {
  readonly step: number
  readonly attempt: number
}

const objectOf = (at: StepAttempt, index: number) => gradientObject(at.step, at.attempt, index)

/** Opens (creating when missing) the run's gradient store for gradients of `paramCount` floats. */
export const openGradientStore = (system: ActorSystemShape, paramCount: number): Effect.Effect<GradientStore, TransportError> =>
  Effect.gen(function* () {
    const bucket = rlLayout(system.run).gradsBucket
    const attempt = <A>(operation: string, f: (store: ObjectStore) => Promise<A>) =>
      Effect.tryPromise({ try: () => f(store), catch: (e) => new TransportError({ operation, message: messageOf(e) }) })
    const store: ObjectStore = yield* Effect.tryPromise({
      try: () => new Objm(system.nats.nc).create(bucket, { replicas: system.nats.replicas }),
      catch: (e) => new TransportError({ operation: `open object store ${bucket}`, message: messageOf(e) })
    })
    return {
      put: (at, index, { grads, logprobs }) =>
        attempt(`store ${objectOf(at, index)}`, (s) => {
          const out = new Float32Array(grads.length + logprobs.length)
          out.set(grads)
          out.set(logprobs, grads.length)
          return putObject(s, objectOf(at, index), new Uint8Array(out.buffer))
        }).pipe(Effect.asVoid),
      get: (at, index, tokens) =>
        Effect.gen(function* () {
          const object = objectOf(at, index)
          const bytes = yield* attempt(`read ${object}`, (s) => getObject(system.nats.jsm, s, bucket, object))
          if (bytes === null) return yield* new GradientUnreadable({ object, reason: `not in ${bucket}` })
          const expected = (paramCount + tokens) * 4
          if (bytes.length !== expected) return yield* new GradientUnreadable({ object, reason: `${bytes.length} bytes, expected ${expected}` })
          const floats = new Float32Array(paramCount + tokens)
          new Uint8Array(floats.buffer).set(bytes)
          return { grads: floats.subarray(0, paramCount), logprobs: floats.subarray(paramCount) }
        }),
      removeStep: (step) => attempt(`delete gradients of step ${step}`, (s) => removeStepObjects(s, step))
    }
  })

/** Where a gradient waiting for its turn is: in memory, in the store, or none (the micro-batch failed). */
export type GradientSource = MicroBatchGradient | "stored" | "failed"

/** The running sum of a step's gradients in index order (see the module comment). */
export class InOrderSum {
  readonly sum: Float32Array
  /** The summed micro-batches' token log-probs, in index order (kept only when asked; undefined for a failed one). */
  readonly logprobs: Array<Float32Array | undefined> = []
  /** Indices of the micro-batches that failed. */
  readonly failed = new Set<number>()
  private next = 0
  private readonly waiting = new Map<number, GradientSource>()

  constructor(
    paramCount: number,
    private readonly keepLogprobs = true
  ) {
    this.sum = new Float32Array(paramCount)
  }

  /** Gradients added so far (indices 0 .. summed - 1). */
  get summed(): number {
    return this.next
  }

  /** Whether `index`'s gradient would be added at once (every lower index is in). */
  inTurn(index: number): boolean {
    return index === this.next
  }

  /** Offers micro-batch `index`'s gradient; false when it was offered before. */
  offer(index: number, source: GradientSource): boolean {
    if (index < this.next || this.waiting.has(index)) return false
    this.waiting.set(index, source)
    return true
  }

  /** Adds every gradient whose turn has come, fetching stored ones with `load`. */
  drain<E>(load: (index: number) => Effect.Effect<MicroBatchGradient, E>): Effect.Effect<void, E> {
    return Effect.whileLoop({
      while: () => this.waiting.has(this.next),
      body: () => {
        const source = this.waiting.get(this.next)!
        return source === "stored" ? load(this.next) : Effect.succeed(source)
      },
      step: (source) => {
        if (source === "failed") this.failed.add(this.next)
        else {
          const sum = this.sum
          const grads = source.grads
          for (let i = 0; i < sum.length; i++) sum[i] = sum[i]! + grads[i]!
        }
        if (this.keepLogprobs) this.logprobs.push(source === "failed" ? undefined : source.logprobs)
        this.waiting.delete(this.next)
        this.next++
      }
    })
  }
}
