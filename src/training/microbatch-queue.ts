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
import { AckPolicy, DeliverPolicy, RetentionPolicy, StorageType, type Consumer, type JsMsg } from "@nats-io/jetstream"
import { Effect, Exit, Schema } from "effect"
import { MicroBatchRef } from "../protocols/device.ts"
import { rlLayout } from "../protocols/layout.ts"
import { TransportError, messageOf } from "../runtime/errors.ts"
import { publishDeadLetter } from "../runtime/intake.ts"
import { formatAddress, type ActorAddress } from "../runtime/names.ts"
import type { ActorSystemShape } from "../runtime/system.ts"

const MicroBatchText = Schema.fromJsonString(MicroBatchRef)
const encodeRef = Schema.encodeSync(MicroBatchText)
const decodeRef = Schema.decodeUnknownExit(MicroBatchText)

const attempt = <A>(operation: string, f: () => Promise<A>) =>
  Effect.tryPromise({ try: f, catch: (e) => new TransportError({ operation, message: messageOf(e) }) })

/** The consumer (or its stream) is gone: the step is over. */
const notFound = (e: unknown) => /not found|deleted/i.test(messageOf(e))

/** Creates the run's micro-batch stream when it is missing (idempotent). */
export const ensureMicroBatchStream = (system: ActorSystemShape) => {
  const names = rlLayout(system.run)
  return attempt(`create stream ${names.microBatchStream}`, async () => {
    const jsm = system.nats.jsm
    const exists = () => jsm.streams.info(names.microBatchStream).then(() => true, () => false)
    if (await exists()) return
    await jsm.streams
      .add({
        name: names.microBatchStream,
        subjects: [names.allMicroBatches],
        retention: RetentionPolicy.Workqueue,
        storage: StorageType.File,
        num_replicas: system.nats.replicas,
        duplicate_window: 120_000 * 1_000_000
      })
      .catch(async (e) => {
        if (!(await exists())) throw e
      })
  })
}

/** Creates step `step`'s shared consumer when it is missing (idempotent). */
export const openStepQueue = (system: ActorSystemShape, step: number, ackWaitMs: number) => {
  const names = rlLayout(system.run)
  const durable = names.microBatchConsumer(step)
  return attempt(`create consumer ${durable}`, async () => {
    const jsm = system.nats.jsm
    if ((await jsm.consumers.info(names.microBatchStream, durable).catch(() => null)) !== null) return
    await jsm.consumers.add(names.microBatchStream, {
      durable_name: durable,
      filter_subject: names.microBatches(step),
      ack_policy: AckPolicy.Explicit,
      deliver_policy: DeliverPolicy.All,
      ack_wait: ackWaitMs * 1_000_000,
      max_deliver: -1
    })
  })
}

/** Deletes step `step`'s consumer and whatever its subject still holds. */
export const closeStepQueue = (system: ActorSystemShape, step: number) => {
  const names = rlLayout(system.run)
  return attempt(`close ${names.microBatchConsumer(step)}`, async () => {
    await system.nats.jsm.consumers.delete(names.microBatchStream, names.microBatchConsumer(step)).catch((e) => {
      if (!notFound(e)) throw e
    })
    await system.nats.jsm.streams.purge(names.microBatchStream, { filter: names.microBatches(step) })
  })
}

/** Publishes a micro-batch's reference (its object stored first, `MicroBatchStore.put`). */
export const publishMicroBatch = (system: ActorSystemShape, mb: MicroBatchRef) => {
  const names = rlLayout(system.run)
  return attempt(`publish micro-batch ${mb.step}.${mb.index}`, () =>
    system.nats.js.publish(names.microBatches(mb.step), encodeRef(mb), { msgID: `mb-${mb.step}-${mb.attempt}-${mb.index}` })
  ).pipe(Effect.asVoid)
}

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
    const names = rlLayout(system.run)
    const durable = names.microBatchConsumer(options.step)
    const consumer: Consumer | undefined = yield* attempt(`bind ${durable}`, () =>
      system.nats.js.consumers.get(names.microBatchStream, durable).catch((e) => {
        if (notFound(e)) return undefined
        throw e
      })
    )
    if (consumer === undefined) return
    const open = attempt(`consumer info ${durable}`, () =>
      system.nats.jsm.consumers.info(names.microBatchStream, durable).then(() => true, (e) => (notFound(e) ? false : Promise.reject(e)))
    )
    while (!options.stop()) {
      // A pull from a consumer deleted meanwhile (the step ended) is answered "no responders".
      const next = yield* attempt(`claim from ${durable}`, () => consumer.next({ expires: 1000 })).pipe(
        Effect.map((msg) => ({ msg })),
        Effect.catch((e) =>
          notFound(e.message)
            ? Effect.succeed({ msg: "closed" as const })
            : /no responders/i.test(e.message)
              ? Effect.flatMap(open, (still) => (still ? Effect.fail(e) : Effect.succeed({ msg: "closed" as const })))
              : Effect.fail(e)
        )
      )
      if (next.msg === "closed") return
      if (next.msg === null) {
        if (!(yield* open)) return
        continue
      }
      const msg = next.msg
      const decoded = decodeRef(msg.string())
      if (decoded._tag === "Failure" || decoded.value.step !== options.step) {
        const reason = decoded._tag === "Failure" ? `not a micro-batch reference: ${String(decoded.cause)}` : `a micro-batch of step ${decoded.value.step} on step ${options.step}'s queue`
        const source = { reason, subject: msg.subject, seq: msg.seq, actor: formatAddress(options.device) }
        yield* publishDeadLetter(system, options.device, msg.data, msg.headers, source, `mb-dead-${msg.seq}`)
        msg.term()
        continue
      }
      yield* handle(claimOf(msg, decoded.value, options.ackWaitMs))
    }
  })
