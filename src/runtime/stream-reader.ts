/**
 * Reads what a JetStream stream holds now, in order, from a sequence or a time, and ends:
 * an ordered consumer from the start point up to the stream's last sequence at the time of
 * the call (or, for a read of one subject, that subject's last sequence). The journal reader,
 * the trajectory reader and the scheduler's record reader are all this plus a decoder.
 */
import { DeliverPolicy, type JsMsg, type StoredMsg } from "@nats-io/jetstream"
import { Effect, Stream } from "effect"
import { TransportError, messageOf } from "./errors.ts"
import type { NatsShape } from "./nats.ts"

export type StartAt = { readonly seq: number } | { readonly time: Date }

/** The last message stored on `subject` (an exact subject, no wildcards), if any. */
export const readLast = (nats: NatsShape, stream: string, subject: string): Effect.Effect<StoredMsg | undefined, TransportError> =>
  Effect.tryPromise({
    try: () => nats.jsm.streams.getMessage(stream, { last_by_subj: subject }).then((m) => m ?? undefined),
    catch: (e) => new TransportError({ operation: `read the last ${subject} of ${stream}`, message: messageOf(e) })
  })

/** The stream's last sequence and time, or those of its last message on `subject`; 0 when empty. */
const lastOf = (nats: NatsShape, stream: string, subject: string | undefined) =>
  subject === undefined
    ? Effect.tryPromise({
        try: () => nats.jsm.streams.info(stream).then((info) => ({ seq: info.state.last_seq, time: Date.parse(info.state.last_ts) })),
        catch: (e) => new TransportError({ operation: `stream info ${stream}`, message: messageOf(e) })
      })
    : readLast(nats, stream, subject).pipe(Effect.map((m) => ({ seq: m?.seq ?? 0, time: m?.time.getTime() ?? 0 })))

/**
 * The messages of `stream` from `from` (default: the first) to its current last one; with
 * `subject` (exact), only that subject's messages, up to its current last one.
 */
export const readStored = (
  nats: NatsShape,
  stream: string,
  from: StartAt = { seq: 1 },
  subject?: string
): Stream.Stream<JsMsg, TransportError> =>
  Stream.unwrap(
    Effect.gen(function* () {
      const last = yield* lastOf(nats, stream, subject)
      const empty = last.seq === 0 || ("seq" in from ? from.seq > last.seq : from.time.getTime() > last.time)
      if (empty) return Stream.empty
      const start =
        "seq" in from
          ? { deliver_policy: DeliverPolicy.StartSequence, opt_start_seq: Math.max(1, from.seq) }
          : { deliver_policy: DeliverPolicy.StartTime, opt_start_time: from.time.toISOString() }
      const consumer = yield* Effect.tryPromise({
        try: () => nats.js.consumers.get(stream, subject === undefined ? start : { ...start, filter_subjects: subject }),
        catch: (e) => new TransportError({ operation: `read ${stream}`, message: messageOf(e) })
      })
      const messages = yield* Effect.tryPromise({
        try: () => consumer.consume(),
        catch: (e) => new TransportError({ operation: `read ${stream}`, message: messageOf(e) })
      })
      return Stream.fromAsyncIterable(
        {
          async *[Symbol.asyncIterator]() {
            try {
              for await (const m of messages) {
                yield m
                if (m.seq >= last.seq) break
              }
            } finally {
              await messages.close().catch(() => undefined)
            }
          }
        },
        (e) => new TransportError({ operation: `read ${stream}`, message: messageOf(e) })
      )
    })
  )
