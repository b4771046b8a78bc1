/**
 * Reads what a JetStream stream holds now, in order, from a sequence or a time, and ends:
 * an ordered consumer from the start point up to the stream's last sequence at the time of
 * the call (with `subject`, only that subject's messages, up to its last one); what the
 * consumer's replica does not hold yet, from the stream's leader. The journal reader and the
 * trajectory readers are all this plus a decoder. With `follow`, the read does not end at the
 * last message: it waits for new ones until interrupted (`gyre replay --follow`).
 */
import { DeliverPolicy, type Consumer, type ConsumerMessages, type JsMsg, type StoredMsg } from "@nats-io/jetstream"
import type { NonEmptyReadonlyArray } from "effect/Array"
import { Effect, Stream } from "effect"
import { TransportError, messageOf } from "./errors.ts"
import { nextBySubject, type NatsShape } from "./nats.ts"

export type StartAt = { readonly seq: number } | { readonly time: Date }

/** Bytes a read keeps requested from the server, as a count of the stream's mean-sized messages. */
const PULL_BYTES = 8 << 20

/** Fewest and most messages a read keeps requested. */
const PULL_MIN = 8
const PULL_MAX = 512

/**
 * How many messages a read keeps requested: `PULL_BYTES` worth at the stream's mean message size,
 * within [`PULL_MIN`, `PULL_MAX`]. A count, not a byte limit: nats.js caps a byte-limited pull at
 * 100 messages and re-pulls every 25, and that pipelining left a whole-journal read waiting on
 * the server (bench:replay read 1.5-2x slower than with 500 messages requested). Sized by the
 * mean so a stream of near-`max_payload` messages (the subject fuzz's dead letters) asks for
 * `PULL_MIN` of them, not hundreds: asking the server for more than a client may have pending
 * stalled such a read (seen in CI when reads pulled 4000 messages).
 */
export const pullCount = (bytes: number, messages: number): number =>
  messages === 0 ? PULL_MAX : Math.max(PULL_MIN, Math.min(PULL_MAX, Math.floor(PULL_BYTES / Math.max(1, bytes / messages))))

/** Most messages one chunk of a read holds. */
const BATCH = 512

/**
 * Longest wait for the next message of a read that has not reached its last one: the server
 * sends heartbeats meanwhile and the ordered consumer recreates itself on missed ones, so a
 * silence this long is a read that will not finish, failed (and retried by its caller) rather
 * than waited on for good.
 */
const IDLE_MS = 60_000

/**
 * A stored message as the readers use it, whether the read's consumer delivered it or the
 * stream's leader returned it (`fromLeader`).
 */
export type StreamMessage = Pick<JsMsg, "subject" | "seq" | "headers" | "data" | "time" | "json" | "string">

const fromStored = (m: StoredMsg): StreamMessage => ({
  subject: m.subject,
  seq: m.seq,
  headers: m.header,
  data: m.data,
  time: m.time,
  json: <T>() => m.json<T>(),
  string: () => m.string()
})

/** How long a read waits for its next message before asking whether its consumer's server holds it. */
const BEHIND_MS = 2_000

/**
 * Where the consumer's server holds nothing more for the read although `last` is not reached,
 * the sequence after which the rest lies (the last one given out, or, none yet, the one before
 * the consumer's start); undefined while it may still deliver. On a cluster, an ephemeral
 * consumer is R1 on a random replica of the stream (nats-server's `createGroupForConsumer`),
 * and a replica restarted after a crash may lag the leader for minutes while it catches up (a
 * CI run: a trajectory read stalled at sequence 90 of 129 for three minutes, re-placed on the
 * same lagging replica by each retry).
 */
const behindAfter = (consumer: Consumer, given: number, last: number): Promise<number | undefined> =>
  consumer.info().then(
    (info) => {
      if (info.num_pending > 0 || given >= last) return undefined
      if (given > 0) return given
      // nothing given out: where the consumer started, if it has not delivered anything either
      return info.delivered.consumer_seq === 0 ? info.delivered.stream_seq : undefined
    },
    () => undefined
  )

/**
 * The consumer's messages up to sequence `last`, in arrays of what has already arrived (at most
 * `BATCH`): each array is one chunk of the stream, so the stages after the read pay their
 * per-chunk cost once per batch instead of once per message (bench:replay). A read that waits
 * `idleMs` for its next message (not counting the time the stages after it hold a batch) is
 * stopped with an error. A read whose consumer's server holds no more (`behindAfter`) after
 * `BEHIND_MS` of silence ends its consumer there and reads the rest from the stream's leader.
 */
async function* batches(consumer: Consumer, messages: ConsumerMessages, last: number, idleMs: number, leader: (after: number) => AsyncGenerator<StreamMessage>): AsyncGenerator<NonEmptyReadonlyArray<StreamMessage>> {
  let batch: Array<StreamMessage> = []
  let given = 0
  let waitingSince: number | undefined = performance.now()
  let asking = false
  let rest: number | undefined
  const watch = async () => {
    const waited = waitingSince === undefined ? 0 : performance.now() - waitingSince
    if (waited > idleMs) return messages.stop(new Error(`no message for ${idleMs} ms after sequence ${given} (reading up to ${last})`))
    if (waited < BEHIND_MS || asking) return
    asking = true
    rest = await behindAfter(consumer, given, last)
    asking = false
    if (rest !== undefined) messages.stop()
  }
  const watchdog = Number.isFinite(idleMs) ? setInterval(() => void watch(), BEHIND_MS / 2) : undefined
  try {
    for await (const m of messages) {
      given = m.seq
      waitingSince = performance.now()
      batch.push(m)
      const done = m.seq >= last
      if (done || batch.length >= BATCH || messages.getPending() === 0) {
        waitingSince = undefined
        yield batch as [StreamMessage, ...Array<StreamMessage>] // non-empty: m was just pushed
        waitingSince = performance.now()
        batch = []
      }
      if (done) return
    }
    if (batch.length > 0) yield batch as [StreamMessage, ...Array<StreamMessage>]
  } finally {
    clearInterval(watchdog)
    await messages.close().catch(() => undefined)
  }
  if (rest !== undefined) for await (const m of leader(Math.max(rest, given))) yield [m]
}

/**
 * The messages on `subject` (every subject: `>`) after sequence `after` up to `last`, one request
 * each to the stream's leader, which holds every message up to the last one its info reported.
 * Ends at the first gap past the stream's end (messages deleted since).
 */
export async function* fromLeader(nats: NatsShape, stream: string, subject: string | undefined, after: number, last: number): AsyncGenerator<StreamMessage> {
  for (let seq = after + 1; seq <= last; ) {
    const m = await nextBySubject(nats.jsm, stream, subject ?? ">", seq)
    if (m === null || m.seq > last) return
    yield fromStored(m)
    seq = m.seq + 1
  }
}

/** The messages of `stream` (on `subject`, when given) from `from` (default: the first) to its current last one. */
export const readStored = (
  nats: NatsShape,
  stream: string,
  from: StartAt = { seq: 1 },
  subject?: string,
  follow = false
): Stream.Stream<StreamMessage, TransportError> =>
  Stream.unwrap(
    Effect.gen(function* () {
      const { last, lastTime, pull } = yield* Effect.tryPromise({
        try: async () => {
          const info = await nats.jsm.streams.info(stream)
          const pull = pullCount(info.state.bytes, info.state.messages)
          if (subject === undefined) return { last: info.state.last_seq, lastTime: Date.parse(info.state.last_ts), pull }
          const m = await nats.jsm.streams.getMessage(stream, { last_by_subj: subject })
          return m === null ? { last: 0, lastTime: 0, pull } : { last: m.seq, lastTime: m.time.getTime(), pull }
        },
        catch: (e) => new TransportError({ operation: `stream info ${stream}`, message: messageOf(e) })
      })
      const empty = !follow && (last === 0 || ("seq" in from ? from.seq > last : from.time.getTime() > lastTime))
      if (empty) return Stream.empty
      // A string (not an array) becomes the single `filter_subject` nats-server 2.9 knows.
      const filter = subject === undefined ? {} : { filter_subjects: subject }
      const consumer = yield* Effect.tryPromise({
        try: () =>
          nats.js.consumers.get(
            stream,
            "seq" in from
              ? { deliver_policy: DeliverPolicy.StartSequence, opt_start_seq: Math.max(1, from.seq), ...filter }
              : { deliver_policy: DeliverPolicy.StartTime, opt_start_time: from.time.toISOString(), ...filter }
          ),
        catch: (e) => new TransportError({ operation: `read ${stream}`, message: messageOf(e) })
      })
      const messages = yield* Effect.tryPromise({
        // Iterated, not called back: nats.js queues each re-pull behind the messages before it,
        // so a slow reader (`--pace original`) holds back the pulls instead of buffering the stream.
        try: () => consumer.consume({ max_messages: pull }),
        catch: (e) => new TransportError({ operation: `read ${stream}`, message: messageOf(e) })
      })
      const end = follow ? Infinity : last
      const read = batches(consumer, messages, end, follow ? Infinity : IDLE_MS, (after) => fromLeader(nats, stream, subject, after, end))
      return Stream.fromAsyncIterable(read, (e) => new TransportError({ operation: `read ${stream}`, message: messageOf(e) })).pipe(
        Stream.flattenArray
      )
    })
  )

/** The last message stored on `subject` (an exact subject, no wildcards), if any. */
export const readLast = (nats: NatsShape, stream: string, subject: string): Effect.Effect<StoredMsg | undefined, TransportError> =>
  Effect.tryPromise({
    try: () => nats.jsm.streams.getMessage(stream, { last_by_subj: subject }).then((m) => m ?? undefined),
    catch: (e) => new TransportError({ operation: `read the last ${subject} of ${stream}`, message: messageOf(e) })
  })
