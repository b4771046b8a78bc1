/**
 * Reads what a JetStream stream holds now, in order, from a sequence or a time, and ends:
 * an ordered consumer from the start point up to the stream's last sequence at the time of
 * the call. The journal reader and the trajectory reader are both this plus a decoder.
 */
import { DeliverPolicy, type JsMsg } from "@nats-io/jetstream"
import { Effect, Stream } from "effect"
import { TransportError, messageOf } from "./errors.ts"
import type { NatsShape } from "./nats.ts"

export type StartAt = { readonly seq: number } | { readonly time: Date }

/** The messages of `stream` from `from` (default: the first) to its current last one. */
export const readStored = (nats: NatsShape, stream: string, from: StartAt = { seq: 1 }): Stream.Stream<JsMsg, TransportError> =>
  Stream.unwrap(
    Effect.gen(function* () {
      const info = yield* Effect.tryPromise({
        try: () => nats.jsm.streams.info(stream),
        catch: (e) => new TransportError({ operation: `stream info ${stream}`, message: messageOf(e) })
      })
      const last = info.state.last_seq
      const empty = last === 0 || ("seq" in from ? from.seq > last : from.time.getTime() > Date.parse(info.state.last_ts))
      if (empty) return Stream.empty
      const consumer = yield* Effect.tryPromise({
        try: () =>
          nats.js.consumers.get(
            stream,
            "seq" in from
              ? { deliver_policy: DeliverPolicy.StartSequence, opt_start_seq: Math.max(1, from.seq) }
              : { deliver_policy: DeliverPolicy.StartTime, opt_start_time: from.time.toISOString() }
          ),
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
                if (m.seq >= last) break
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
