/**
 * Writing and reading a run's subject channels (`channel.ts`, declared in the run's topology):
 * publishes (stored on the channel's stream and acknowledged, or sent on core NATS), core
 * subscriptions, the channel's stream, and work queues (a shared durable consumer per key). The
 * RL parts meet NATS through these and the actor system only.
 *
 * Each operation counts its channel (`metrics.ts`, attribute `channel` = the channel's name):
 * messages and payload bytes out and in, errors (a publish that failed, a message received that
 * does not decode as the channel says) and each publish's time until stored or sent.
 */
import { AckPolicy, DeliverPolicy, RetentionPolicy, StorageType, type JsMsg } from "@nats-io/jetstream"
import type { MsgHdrs } from "@nats-io/transport-node"
import { Effect, Exit, type Schema } from "effect"
import type { SubjectChannel } from "./channel.ts"
import { TransportError, messageOf } from "./errors.ts"
import { channelMetrics, type ChannelMetrics } from "./metrics.ts"
import type { NatsShape } from "./nats.ts"
import { parseJson } from "./protocol.ts"

/** Where a channel lives: a connection and a run (an actor system, a journal reader). */
export interface ChannelSource {
  readonly nats: NatsShape
  readonly run: string
}

/** One message to publish: its bytes, its `Nats-Msg-Id` (a stream deduplicates it) and headers. */
export interface Outgoing {
  readonly data: Uint8Array
  readonly msgId?: string | undefined
  readonly headers?: MsgHdrs | undefined
}

const attempt = <A>(operation: string, f: () => Promise<A>) =>
  Effect.tryPromise({ try: f, catch: (e) => new TransportError({ operation, message: messageOf(e) }) })

/** The channel's metrics in `direction`, in the registry of the running fiber. */
const metricsOf = (channel: SubjectChannel<any>, direction: "in" | "out") =>
  Effect.map(Effect.context<never>(), (context) => channelMetrics(context, channel.name, direction))

const sendOne = (nats: NatsShape, channel: SubjectChannel<any>, subject: string, m: Outgoing): Promise<unknown> => {
  if (channel.stream === undefined) return Promise.resolve(nats.nc.publish(subject, m.data, m.headers === undefined ? {} : { headers: m.headers }))
  return nats.js.publish(subject, m.data, { ...(m.msgId === undefined ? {} : { msgID: m.msgId }), ...(m.headers === undefined ? {} : { headers: m.headers }) })
}

/**
 * Publishes `messages` on the channel's subject `key` in order, every one sent before any
 * acknowledgement is awaited (consecutive parts lie together on the stream); done when the
 * stream has stored them all (core NATS: when sent).
 */
export const publishAll = (src: ChannelSource, channel: SubjectChannel<any>, key: string | number, messages: ReadonlyArray<Outgoing>): Effect.Effect<void, TransportError> =>
  Effect.flatMap(metricsOf(channel, "out"), (m) => {
    const subject = channel.subject(src.run, key)
    const started = performance.now()
    return attempt(`publish ${channel.name} on ${subject}`, () => Promise.all(messages.map((o) => sendOne(src.nats, channel, subject, o)))).pipe(
      Effect.tapError(() => Effect.sync(() => m.error())),
      Effect.tap(() =>
        Effect.sync(() => {
          for (const o of messages) m.message(o.data.length)
          m.seconds((performance.now() - started) / 1000)
        })
      ),
      Effect.asVoid
    )
  })

/** Publishes raw bytes on the channel (a record's part, a marker): `publishAll` of one message. */
export const publishBytes = (src: ChannelSource, channel: SubjectChannel<any>, key: string | number, message: Outgoing) =>
  publishAll(src, channel, key, [message])

/** Publishes `value` (JSON of the channel's codec; a value its own schema refuses is a defect of the publisher). */
export const publish = <A>(src: ChannelSource, channel: SubjectChannel<A>, key: string | number, value: A, options: Omit<Outgoing, "data"> = {}) =>
  Effect.try({ try: () => channel.encode(value), catch: (e) => e }).pipe(
    Effect.orDie,
    Effect.flatMap((data) => publishBytes(src, channel, key, { ...options, data }))
  )

/** Decodes a message received on the channel, counting it (an error when it is not what the channel says). */
const received = <A>(m: ChannelMetrics, channel: SubjectChannel<A>, data: Uint8Array): Exit.Exit<A, Schema.SchemaError | string> => {
  m.message(data.length)
  const parsed = parseJson(data)
  const value: Exit.Exit<A, Schema.SchemaError | string> = parsed.ok ? channel.decode(parsed.value) : Exit.fail(parsed.reason)
  if (Exit.isFailure(value)) m.error()
  return value
}

/**
 * Hears the channel's subject `key` on core NATS until the returned subscription is ended: each
 * message decoded and handed to `handle`; one that does not decode is counted as an error and
 * skipped (core NATS keeps nothing: there is nothing to dead-letter).
 */
export const subscribe = <A>(src: ChannelSource, channel: SubjectChannel<A>, key: string | number, handle: (value: A) => void) =>
  Effect.map(metricsOf(channel, "in"), (m) =>
    src.nats.nc.subscribe(channel.subject(src.run, key), {
      callback: (err, msg) => {
        if (err !== null) return
        const value = received(m, channel, msg.data)
        if (Exit.isSuccess(value)) handle(value.value)
      }
    })
  )

/**
 * Creates the stream that stores `channels` (all on the same stream) when it is missing:
 * limits or work-queue retention as the channels' transport says, file storage, the
 * connection's replicas, a 2-minute duplicate window (publishers set `Nats-Msg-Id`). Idempotent;
 * a concurrent creation elsewhere is fine.
 */
export const ensureStream = (src: ChannelSource, channels: readonly [SubjectChannel<any>, ...ReadonlyArray<SubjectChannel<any>>]) => {
  const name = channels[0].streamOf(src.run)
  if (name === undefined || channels.some((c) => c.streamOf(src.run) !== name)) return Effect.die(new Error(`channels ${channels.map((c) => c.name).join(", ")} do not share a stream`))
  return attempt(`create stream ${name}`, async () => {
    const exists = () => src.nats.jsm.streams.info(name).then(() => true, () => false)
    if (await exists()) return
    await src.nats.jsm.streams
      .add({
        name,
        subjects: channels.map((c) => c.pattern(src.run)),
        retention: channels[0].transport === "work-queue" ? RetentionPolicy.Workqueue : RetentionPolicy.Limits,
        storage: StorageType.File,
        num_replicas: src.nats.replicas,
        duplicate_window: 120_000 * 1_000_000
      })
      .catch(async (e) => {
        if (!(await exists())) throw e
      })
  })
}

const streamName = (src: ChannelSource, channel: SubjectChannel<any>): string => {
  const name = channel.streamOf(src.run)
  if (name === undefined) throw new Error(`channel ${channel.name} is not stored on a stream`)
  return name
}

/** The keys of the channel's subjects its stream holds messages of now (none when the stream does not exist). */
export const keysOf = (src: ChannelSource, channel: SubjectChannel<any>): Effect.Effect<ReadonlyArray<string>, TransportError> =>
  attempt(`list the ${channel.name} subjects of ${src.run}`, async () => {
    const prefix = channel.subject(src.run, "")
    const info = await src.nats.jsm.streams.info(streamName(src, channel), { subjects_filter: `${prefix}>` }).catch((e) => {
      if (/not found/i.test(messageOf(e))) return undefined
      throw e
    })
    return Object.keys(info?.state.subjects ?? {}).map((subject) => subject.slice(prefix.length))
  })

/** The consumer (or its stream) is gone. */
export const notFound = (e: unknown) => /not found|deleted/i.test(messageOf(e))

/** Creates the shared durable consumer `durable` of the channel's subject `key` when it is missing (explicit ack, every message, no delivery limit). */
export const openQueue = (src: ChannelSource, channel: SubjectChannel<any>, key: string | number, durable: string, ackWaitMs: number) =>
  attempt(`create consumer ${durable}`, async () => {
    const stream = streamName(src, channel)
    if ((await src.nats.jsm.consumers.info(stream, durable).catch(() => null)) !== null) return
    await src.nats.jsm.consumers.add(stream, {
      durable_name: durable,
      filter_subject: channel.subject(src.run, key),
      ack_policy: AckPolicy.Explicit,
      deliver_policy: DeliverPolicy.All,
      ack_wait: ackWaitMs * 1_000_000,
      max_deliver: -1
    })
  })

/** Deletes the consumer `durable` (gone already is fine) and whatever the channel's subject `key` still holds. */
export const closeQueue = (src: ChannelSource, channel: SubjectChannel<any>, key: string | number, durable: string) =>
  attempt(`close ${durable}`, async () => {
    const stream = streamName(src, channel)
    await src.nats.jsm.consumers.delete(stream, durable).catch((e) => {
      if (!notFound(e)) throw e
    })
    await src.nats.jsm.streams.purge(stream, { filter: channel.subject(src.run, key) })
  })

/** A message pulled from a work queue, decoded (or why not). */
export interface Delivery<A> {
  readonly msg: JsMsg
  readonly value: Exit.Exit<A, Schema.SchemaError | string>
}

/** A bound work-queue consumer of a channel. */
export interface QueueConsumer<A> {
  /** The next message, or null when none came within `expiresMs`. */
  readonly next: (expiresMs: number) => Effect.Effect<Delivery<A> | null, TransportError>
  /** Whether the consumer still exists. */
  readonly exists: Effect.Effect<boolean, TransportError>
}

/** Binds the consumer `durable` of the channel's stream; undefined when it does not exist (its work is over). */
export const bindQueue = <A>(src: ChannelSource, channel: SubjectChannel<A>, durable: string): Effect.Effect<QueueConsumer<A> | undefined, TransportError> =>
  Effect.gen(function* () {
    const m = yield* metricsOf(channel, "in")
    const stream = streamName(src, channel)
    const consumer = yield* attempt(`bind ${durable}`, () => src.nats.js.consumers.get(stream, durable).catch((e) => (notFound(e) ? undefined : Promise.reject(e))))
    if (consumer === undefined) return undefined
    return {
      next: (expiresMs) =>
        attempt(`claim from ${durable}`, () => consumer.next({ expires: expiresMs })).pipe(
          Effect.map((msg) => (msg === null ? null : { msg, value: received(m, channel, msg.data) }))
        ),
      exists: attempt(`consumer info ${durable}`, () => src.nats.jsm.consumers.info(stream, durable).then(() => true, (e) => (notFound(e) ? false : Promise.reject(e))))
    }
  })
