/**
 * The micro-batch work queue of a run: stream `GYRE_<run>_MICROBATCHES` (work-queue
 * retention: a message is gone once acknowledged), subject `gyre.<run>.mb.<step>`, one
 * `MicroBatchRef` per message (JSON, a few hundred bytes: the batch itself is an object of
 * `GYRE_<run>_batches`, `microbatch-store.ts`) with `Nats-Msg-Id: mb-<step>-<attempt>-<index>`
 * (a re-publish of a micro-batch within the duplicate window is stored once).
 *
 * Every training device of step k pulls from the one shared durable consumer `mb-<k>`
 * (explicit ack), one message at a time. A claim is held while it is computed: `working()`
 * every third of the ack wait extends it, a failed or interrupted computation hands it back
 * at once (`nak`), and a device that dies holding one lets its ack wait lapse, after which JetStream
 * delivers it to another device. The core deletes the consumer when the step is done, which
 * ends every device's claim loop for that step; a core starting a new attempt at a step (the
 * previous core was lost) deletes it and purges the subject first, so nothing of the earlier
 * attempt is claimed.
 */
import type { JsMsg } from "@nats-io/jetstream"
import { Effect, Exit } from "effect"
import type { MicroBatchRef } from "../protocols/device.ts"
import { rlLayout } from "../protocols/layout.ts"
import { MicroBatches } from "../protocols/topology.ts"
import { bindQueue, closeQueue, ensureStream, notFound, openQueue, publish } from "../runtime/channel-io.ts"
import { TransportError, messageOf } from "../runtime/errors.ts"
import { publishDeadLetter } from "../runtime/intake.ts"
import { formatAddress, type ActorAddress } from "../runtime/names.ts"
import type { ActorSystemShape } from "../runtime/system.ts"

const attempt = <A>(operation: string, f: () => Promise<A>) =>
  Effect.tryPromise({ try: f, catch: (e) => new TransportError({ operation, message: messageOf(e) }) })

/** Creates the run's micro-batch stream when it is missing (idempotent). */
export const ensureMicroBatchStream = (system: ActorSystemShape) => ensureStream(system, [MicroBatches])

/** Creates step `step`'s shared consumer when it is missing (idempotent). */
export const openStepQueue = (system: ActorSystemShape, step: number, ackWaitMs: number) =>
  openQueue(system, MicroBatches, step, rlLayout(system.run).microBatchConsumer(step), ackWaitMs)

/** Deletes step `step`'s consumer and whatever its subject still holds. */
export const closeStepQueue = (system: ActorSystemShape, step: number) => closeQueue(system, MicroBatches, step, rlLayout(system.run).microBatchConsumer(step))

/** Publishes a micro-batch's reference (its object stored first, `MicroBatchStore.put`). */
export const publishMicroBatch = (system: ActorSystemShape, mb: MicroBatchRef) =>
  publish(system, MicroBatches, mb.step, mb, { msgId: `mb-${mb.step}-${mb.attempt}-${mb.index}` })

/** A claimed micro-batch (its reference: the holder reads the batch). */
export interface Claim {
  readonly microBatch: MicroBatchRef
  readonly deliveryCount: number
  /** Runs `work` keeping the claim alive; a failure or interruption hands the micro-batch back. */
  readonly hold: <A, E>(work: Effect.Effect<A, E>) => Effect.Effect<A, E>
  /** Acknowledges (removes) the micro-batch, confirmed by the server. */
  readonly ack: Effect.Effect<void, TransportError>
  /** Hands the micro-batch back untouched (a nak: the server delivers it again at once). */
  readonly handBack: Effect.Effect<void>
}

const claimOf = (msg: JsMsg, microBatch: MicroBatchRef, ackWaitMs: number): Claim => ({
  microBatch,
  deliveryCount: msg.info.deliveryCount,
  hold: (work) =>
    Effect.acquireUseRelease(
      Effect.sync(() => setInterval(() => msg.working(), Math.max(200, ackWaitMs / 3))),
      () => work.pipe(Effect.onExit((exit) => (Exit.isFailure(exit) ? Effect.sync(() => msg.nak()) : Effect.void))),
      (timer) => Effect.sync(() => clearInterval(timer))
    ),
  ack: attempt(`ack micro-batch ${microBatch.step}.${microBatch.index}`, () => msg.ackAck()).pipe(Effect.asVoid),
  handBack: Effect.sync(() => msg.nak())
})

export interface ClaimLoopOptions {
  readonly step: number
  readonly ackWaitMs: number
  /** The claiming device: a message that is not a micro-batch of the step goes to its dead letters. */
  readonly device: ActorAddress
  /** Checked before each claim: stop claiming when true. */
  readonly stop: () => boolean
}

/**
 * Claims step `step`'s micro-batches one at a time and hands each to `handle` (which holds,
 * computes and acknowledges it), until `stop()` or the step's consumer is gone. A message that
 * is not a micro-batch of the step goes to the claiming device's dead letters with the reason,
 * then is terminated (never redelivered).
 */
export const claimLoop = <E>(system: ActorSystemShape, options: ClaimLoopOptions, handle: (claim: Claim) => Effect.Effect<void, E>) =>
  Effect.gen(function* () {
    const durable = rlLayout(system.run).microBatchConsumer(options.step)
    const queue = yield* bindQueue(system, MicroBatches, durable)
    if (queue === undefined) return
    while (!options.stop()) {
      // A pull from a consumer deleted meanwhile (the step ended) is answered "no responders".
      const next = yield* queue.next(1000).pipe(
        Effect.map((delivery) => ({ delivery })),
        Effect.catch((e) =>
          notFound(e.message)
            ? Effect.succeed({ delivery: "closed" as const })
            : /no responders/i.test(e.message)
              ? Effect.flatMap(queue.exists, (still) => (still ? Effect.fail(e) : Effect.succeed({ delivery: "closed" as const })))
              : Effect.fail(e)
        )
      )
      if (next.delivery === "closed") return
      if (next.delivery === null) {
        if (!(yield* queue.exists)) return
        continue
      }
      const { msg, value: decoded } = next.delivery
      if (Exit.isFailure(decoded) || decoded.value.step !== options.step) {
        const reason = Exit.isFailure(decoded) ? `not a micro-batch reference: ${String(decoded.cause)}` : `a micro-batch of step ${decoded.value.step} on step ${options.step}'s queue`
        const source = { reason, subject: msg.subject, seq: msg.seq, actor: formatAddress(options.device) }
        yield* publishDeadLetter(system, options.device, msg.data, msg.headers, source, `mb-dead-${msg.seq}`)
        msg.term()
        continue
      }
      yield* handle(claimOf(msg, decoded.value, options.ackWaitMs))
    }
  })
