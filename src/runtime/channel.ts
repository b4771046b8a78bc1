/**
 * A channel of a run: a family of NATS subjects (or objects) and the Schema codec of what travels
 * on it. Channels are declared once (the runtime's system events in `events.ts`, the RL parts'
 * in `src/protocols/topology.ts`); subjects, permissions, the journal's decoders and the
 * documentation's table are read from the declarations.
 *
 * - `event(name, codec)`: a system event, `gyre.<run>.sys.<name>` on the journal, published with
 *   `ActorSystem.publishEvent(channel, value)`;
 * - `subjects({...})`: `gyre.<run>.<token>.<key>`, stored on a stream of the run or core NATS
 *   only, one JSON value a message;
 * - `objects({...})`: objects of a run's object store (bytes; `format` says what they hold).
 *
 * Every value is JSON of the codec's encoded side: `encode` then `JSON.stringify`. Subject
 * channels are written and read through `channel-io.ts` (publish, subscribe, streams and work
 * queues), which counts and times each channel (`metrics.ts`).
 */
import { Effect, Exit, Schema, type Scope } from "effect"
import { channelMetrics } from "./metrics.ts"
import { checkRun } from "./names.ts"
import type { NatsShape } from "./nats.ts"
import { parseJson } from "./protocol.ts"

/** How a channel's messages travel. */
export type Transport = "journal" | "stream" | "work-queue" | "core"

interface Codec<A> {
  readonly codec: Schema.Codec<A, any>
  /** The JSON bytes of a value. */
  readonly encode: (value: A) => Uint8Array
  /** A value from parsed JSON, or why it is not one. */
  readonly decode: (json: unknown) => Exit.Exit<A, Schema.SchemaError>
}

export interface EventChannel<A> extends Codec<A> {
  readonly _tag: "Event"
  readonly name: string
  readonly doc: string
  readonly subject: (run: string) => string
}

export interface SubjectChannel<A> extends Codec<A> {
  readonly _tag: "Subjects"
  readonly name: string
  /** The subject token after the run (`calls` in `gyre.R.calls.<execution>`). */
  readonly token: string
  readonly transport: Exclude<Transport, "journal">
  /** The stream that stores it (`TRAJECTORIES` for `GYRE_R_TRAJECTORIES`); none for core NATS. */
  readonly stream: string | undefined
  /** What the last token is, for the docs (`<execution>`). */
  readonly key: string
  readonly doc: string
  readonly subject: (run: string, key: string | number) => string
  /** Every subject of the channel in a run (`*` for every run). */
  readonly pattern: (run: string) => string
  /** The stream of a run that stores it (`GYRE_<run>_<stream>`); undefined for core NATS. */
  readonly streamOf: (run: string) => string | undefined
}

export interface ObjectChannel {
  readonly _tag: "Objects"
  readonly name: string
  /** The bucket after the run (`grads` for `GYRE_R_grads`). */
  readonly bucket: string
  /** How an object is named, for the docs (`s<step>.a<attempt>.m<index>`). */
  readonly object: string
  /** What an object holds. */
  readonly format: string
  readonly bucketOf: (run: string) => string
}

export type AnyChannel = EventChannel<any> | SubjectChannel<any> | ObjectChannel

const codecOf = <A>(codec: Schema.Codec<A, any>): Codec<A> => {
  const encode = Schema.encodeSync(codec)
  return {
    codec,
    encode: (value) => Buffer.from(JSON.stringify(encode(value)), "utf8"),
    decode: Schema.decodeUnknownExit(codec) as (json: unknown) => Exit.Exit<A, Schema.SchemaError>
  }
}

const base = (run: string) => (run === "*" ? "gyre.*" : `gyre.${checkRun(run)}`)

export const event = <A>(name: string, codec: Schema.Codec<A, any>, doc: string): EventChannel<A> => ({
  _tag: "Event",
  name,
  doc,
  subject: (run) => `${base(run)}.sys.${name}`,
  ...codecOf(codec)
})

export const subjects = <A>(o: {
  readonly name: string
  readonly token: string
  readonly transport: Exclude<Transport, "journal">
  readonly stream?: string
  readonly key: string
  readonly codec: Schema.Codec<A, any>
  readonly doc: string
}): SubjectChannel<A> => ({
  _tag: "Subjects",
  name: o.name,
  token: o.token,
  transport: o.transport,
  stream: o.stream,
  key: o.key,
  doc: o.doc,
  subject: (run, key) => `${base(run)}.${o.token}.${key}`,
  pattern: (run) => `${base(run)}.${o.token}.>`,
  streamOf: (run) => (o.stream === undefined ? undefined : `GYRE_${checkRun(run)}_${o.stream}`),
  ...codecOf(o.codec)
})

export const objects = (o: { readonly name: string; readonly bucket: string; readonly object: string; readonly format: string }): ObjectChannel => ({
  _tag: "Objects",
  ...o,
  bucketOf: (run) => (run === "*" ? "*" : `GYRE_${checkRun(run)}_${o.bucket}`)
})

/** A handler of one event channel (`on(channel, f)` keeps the value's type). */
export interface EventHandler {
  readonly channel: EventChannel<any>
  readonly handle: (value: any) => void
}
export const on = <A>(channel: EventChannel<A>, handle: (value: A) => void): EventHandler => ({ channel, handle })

/**
 * Hears the run's system events as they are published (core NATS: at most once, nothing from
 * before), each decoded by its channel and counted (`sys.<name>`, in), for the lifetime of the
 * scope. A message that does not decode as its channel says is counted as an error and left to
 * the journal's readers (they report it).
 */
export const subscribeEvents = (nats: NatsShape, run: string, handlers: ReadonlyArray<EventHandler>): Effect.Effect<void, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.map(Effect.context<never>(), (context) =>
      handlers.map(({ channel, handle }) => {
        const m = channelMetrics(context, `sys.${channel.name}`, "in")
        return nats.nc.subscribe(channel.subject(run), {
          callback: (err, msg) => {
            if (err !== null) return
            m.message(msg.data.length)
            const parsed = parseJson(msg.data)
            const value = parsed.ok ? channel.decode(parsed.value) : undefined
            if (value !== undefined && Exit.isSuccess(value)) handle(value.value)
            else m.error()
          }
        })
      })
    ),
    (subscriptions) => Effect.sync(() => subscriptions.forEach((s) => s.unsubscribe()))
  ).pipe(Effect.asVoid)
