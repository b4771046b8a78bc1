/**
 * The `ActorSystem` service: a run's streams and buckets, and the two ways to reach an actor.
 *
 * - `tell` publishes a request durably to the actor's tell subject on the journal stream with
 *   a `Nats-Msg-Id` (JetStream drops a re-publish of the same id within its duplicate window;
 *   the actor drops one outside it) and returns once JetStream has stored it.
 * - `ask` is a core NATS request to the actor's ask subject with a timeout; the reply decodes
 *   to the protocol's success or typed error, or to the runtime's `AskError`s. Core NATS is at
 *   most once: a request or reply in flight when a connection is cut is lost. So an ask not
 *   answered within `resendMs` (10 s) is sent again with the same message id until its timeout:
 *   the actor answers a repeated id with its recorded answer, or with the one it is working
 *   out, never running the handler twice (`AnswerCache`, intake.ts); an actor that never saw
 *   the id (the request was lost, or another incarnation holds the address now) handles it.
 *
 * Building the layer creates the run's journal and dead-letter streams and its registry and
 * state KV buckets when they do not exist yet (idempotent, so every node may do it).
 */
import { nuid, type MsgHdrs } from "@nats-io/transport-node"
import { RetentionPolicy, StorageType, type JetStreamManager, type StreamConfig } from "@nats-io/jetstream"
import type { KV } from "@nats-io/kv"
import { Context, Duration, Effect, Layer, Schedule, Tracer } from "effect"
import type { Rpc, RpcGroup } from "effect/rpc"
import { ActorOverloaded, ActorUnavailable, AskTimeout, RequestRejected, TransportError, messageOf, type AskError } from "./errors.ts"
import type { EventChannel } from "./channel.ts"
import { channelCounter } from "./metrics.ts"
import { Nats, type NatsShape } from "./nats.ts"
import { formatAddress, layout, type ActorAddress, type Layout } from "./names.ts"
import { makeReplies, type Replies, type ReplyOutcome } from "./replies.ts"
import { decodeAskReply, encodePayload, formatTraceparent, requestHeaders, requestOf, tracing } from "./protocol.ts"

/** A typed reference to an actor: its address and the protocol it speaks. */
export interface ActorRef<R extends Rpc.Any> {
  readonly address: ActorAddress
  readonly protocol: RpcGroup.RpcGroup<R>
}

export const refOf = <R extends Rpc.Any>(protocol: RpcGroup.RpcGroup<R>, address: ActorAddress): ActorRef<R> => ({
  address,
  protocol
})

type RequestOf<R extends Rpc.Any, Tag extends string> = Extract<R, { readonly _tag: Tag }>

export interface TellOptions {
  /** Message id for deduplication; a fresh unique id when absent. */
  readonly msgId?: string
  /** Sender address, recorded in the `Gyre-Sender` header. */
  readonly sender?: string
  /** The sender's incarnation, recorded in the `Gyre-Incarnation` header. */
  readonly incarnation?: number
}

export interface AskOptions {
  readonly timeoutMs?: number
  /**
   * Message id (a fresh unique id when absent). An ask again with the same id gets the actor's
   * recorded answer, or waits for the one being worked out, instead of being handled twice.
   */
  readonly msgId?: string
  readonly sender?: string
  readonly incarnation?: number
  /** Sent again with the same message id when unanswered for this long (default 10 s; see the module doc). */
  readonly resendMs?: number
}

export interface EventOptions {
  readonly msgId?: string
  /** The subject's last journal sequence must be this (0: none yet), or the publish fails. */
  readonly expectLastSeq?: number
}

export interface SystemOptions {
  readonly run: string
  /** How long the journal keeps messages (0 = forever). */
  readonly journalMaxAgeMs?: number
  /** JetStream duplicate window of the journal. */
  readonly duplicateWindowMs?: number
}

export interface ActorSystemShape {
  readonly run: string
  readonly layout: Layout
  readonly nats: NatsShape
  readonly registry: KV
  readonly state: KV
  readonly tell: <R extends Rpc.Any, const Tag extends R["_tag"]>(
    ref: ActorRef<R>,
    tag: Tag,
    payload: Rpc.Payload<RequestOf<R, Tag>>,
    options?: TellOptions
  ) => Effect.Effect<{ readonly seq: number; readonly duplicate: boolean }, TransportError>
  readonly ask: <R extends Rpc.Any, const Tag extends R["_tag"]>(
    ref: ActorRef<R>,
    tag: Tag,
    payload: Rpc.Payload<RequestOf<R, Tag>>,
    options?: AskOptions
  ) => Effect.Effect<Rpc.Success<RequestOf<R, Tag>>, Rpc.Error<RequestOf<R, Tag>> | AskError>
  /**
   * Publishes a system event (`gyre.<run>.sys.<name>`, `channel.ts`) to the journal: its journal
   * sequence. `msgId` deduplicates; `expectLastSeq` fences (the subject's last sequence must be it).
   */
  readonly publishEvent: <A>(channel: EventChannel<A>, event: A, options?: EventOptions) => Effect.Effect<{ readonly seq: number }, TransportError>
  /**
   * Queues a copy of an answered ask for the journal. Copies are written in batches (every
   * 2 ms, on the journal connection) so they cost the request path no socket write of its
   * own; outstanding copies are written when the system's scope closes.
   */
  readonly copyToJournal: (subject: string, data: Uint8Array, headers: MsgHdrs | undefined) => void
}

const ms = (n: number) => n * 1_000_000

/** What a refused creation may owe to `GYRE_REPLICAS` (JetStream refuses more replicas than it has servers). */
const replicasHint = (replicas: number) => (replicas > 1 ? ` (GYRE_REPLICAS=${replicas}: needs a JetStream cluster of at least ${replicas} servers)` : "")

const isTimeout = (e: TransportError) => /timeout/i.test(e.message)

/**
 * A creation that timed out is tried again, every second for up to 30 s: a JetStream cluster
 * answers nothing while it elects its leaders after a server's loss (found by
 * test/chaos/cluster.test.ts: the held-out evaluation after a run whose cluster lost a server
 * failed on its first stream). A refusal (too many replicas, a permission) fails at once.
 */
const untilElected = <A>(create: Effect.Effect<A, TransportError>) =>
  create.pipe(
    Effect.tapError((e) => (isTimeout(e) ? Effect.logWarning(`${e.operation}: ${e.message}; trying again`) : Effect.void)),
    Effect.retry({ while: isTimeout, times: 30, schedule: Schedule.spaced(Duration.seconds(1)) })
  )

const ensureStream = (jsm: JetStreamManager, config: Partial<StreamConfig> & { name: string }) =>
  untilElected(Effect.tryPromise({
    try: async () => {
      try {
        await jsm.streams.info(config.name)
      } catch {
        try {
          await jsm.streams.add(config)
        } catch (e) {
          // Another node created it between our info and add: fine if it now exists.
          await jsm.streams.info(config.name).catch(() => {
            throw e
          })
        }
      }
    },
    catch: (e) => new TransportError({ operation: `create stream ${config.name}`, message: messageOf(e) + replicasHint(config.num_replicas ?? 1) })
  }))

const openBucket = (nats: NatsShape, name: string) =>
  untilElected(Effect.tryPromise({
    try: () => nats.kvm.create(name, { history: 1, replicas: nats.replicas }),
    catch: (e) => new TransportError({ operation: `create KV bucket ${name}`, message: messageOf(e) + replicasHint(nats.replicas) })
  }))

const defaultAskTimeoutMs = 10_000
const defaultAskResendMs = 10_000

const askError = (o: Exclude<ReplyOutcome, { readonly _tag: "Reply" }>, actor: string, request: string, timeoutMs: number): AskError =>
  o._tag === "Timeout"
    ? new AskTimeout({ actor, request, timeoutMs })
    : o._tag === "NoResponders"
      ? new ActorUnavailable({ actor, request })
      : new TransportError({ operation: `ask ${actor} ${request}`, message: o.message })

/** What an ask's reply says: the handler's result, a rejection, or a defect for bytes that are not a reply. */
const replyOf = (rpc: Rpc.Any, bytes: Uint8Array, actor: string, request: string): Effect.Effect<unknown, unknown> => {
  const reply = decodeAskReply(rpc, bytes)
  switch (reply._tag) {
    case "Exit":
      return reply.exit
    case "Rejected":
      return Effect.fail(new RequestRejected({ actor, request, reason: reply.reason }))
    case "Overloaded":
      return Effect.fail(new ActorOverloaded({ actor, request, reason: reply.reason }))
    case "Malformed":
      return Effect.die(new Error(`malformed ask reply from ${actor} to ${request}: ${reply.reason}`))
  }
}

/** What `tell`, `ask` and `publishEvent` share: the connection, the run's names, the reply inbox and the channel counters. */
interface Parts {
  readonly run: string
  readonly nats: NatsShape
  readonly names: Layout
  readonly replies: Replies
  readonly counted: ReturnType<typeof channelCounter>
}

/** The run's journal and dead-letter streams, created when they do not exist yet. */
const ensureStreams = (nats: NatsShape, names: Layout, options: SystemOptions) =>
  Effect.gen(function* () {
    yield* ensureStream(nats.jsm, {
      name: names.journalStream,
      subjects: names.journalSubjects,
      retention: RetentionPolicy.Limits,
      storage: StorageType.File,
      num_replicas: nats.replicas,
      max_age: ms(options.journalMaxAgeMs ?? 0),
      duplicate_window: ms(options.duplicateWindowMs ?? 120_000)
    })
    yield* ensureStream(nats.jsm, {
      name: names.deadStream,
      subjects: names.deadSubjects,
      retention: RetentionPolicy.Limits,
      storage: StorageType.File,
      num_replicas: nats.replicas
    })
  })

// A tell's or ask's span, when spans reach a backend (`tracing`), and the `traceparent` the
// message carries (its span, when sampled). Without `Effect.fn`'s call-site stack capture
// (see dispatch.ts), and not made the fiber's parent span: nothing runs inside it, and
// providing it costs two context updates per message (bench:runtime).
const inSpan = <A, E>(send: (traceparent: string | undefined) => Effect.Effect<A, E>, name: string, kind: "producer" | "client", actor: string, tag: string) =>
  Effect.withFiber((fiber) =>
    tracing(fiber.getRef(Tracer.Tracer))
      ? Effect.useSpan(name, { kind, attributes: { "gyre.actor": actor, "gyre.request": tag } }, (span) =>
          send(span.sampled ? formatTraceparent(span) : undefined)
        )
      : send(undefined)
  )

const tellOf = (p: Parts) =>
  ((ref: ActorRef<Rpc.Any>, tag: string, payload: unknown, tellOptions?: TellOptions) => {
    const actor = formatAddress(ref.address)
    return inSpan((traceparent) => {
      const rpc = requestOf(ref.protocol, tag)
      if (rpc === undefined) return Effect.die(new Error(`${tag} is not a request of ${actor}'s protocol`))
      const msgID = tellOptions?.msgId ?? nuid.next()
      const headers = requestHeaders(tag, undefined, tellOptions, traceparent)
      const data = encodePayload(rpc, payload)
      p.counted(`tell.${ref.address.kind}`, "out")(data.length)
      return Effect.tryPromise({
        try: () => p.nats.js.publish(p.names.tell(ref.address), data, { msgID, headers }),
        catch: (e) => new TransportError({ operation: `tell ${actor} ${tag}`, message: messageOf(e) })
      }).pipe(Effect.map((ack) => ({ seq: ack.seq, duplicate: ack.duplicate })))
    }, "Actor.tell", "producer", actor, tag)
  }) as ActorSystemShape["tell"]

/**
 * Sends an ask and resends it with the same id while unanswered (the module comment), in one
 * callback from the reply to the decoded answer: no step between.
 */
const askWithResends = (p: Parts, rpc: Rpc.Any, subject: string, data: Uint8Array, headers: MsgHdrs, actor: string, tag: string, timeoutMs: number, resendMs: number) =>
  Effect.callback<unknown, unknown>((resume) => {
    const deadline = performance.now() + timeoutMs
    let cancel: () => void
    const send = () => {
      const left = deadline - performance.now()
      // The wait that runs to the deadline is the last, even when its timer fires a
      // little early (Node's timers start from the loop's cached clock).
      const last = resendMs >= left
      cancel = p.replies.request(subject, data, headers, Math.min(resendMs, left), (o) => {
        if (o._tag === "Reply") return resume(replyOf(rpc, o.msg.data, actor, tag))
        // Unanswered: the request or its reply may have been lost; again, with the same id.
        if (o._tag === "Timeout" && !last && deadline - performance.now() >= 1) send()
        else resume(Effect.fail(askError(o, actor, tag, timeoutMs)))
      })
    }
    send()
    // Interrupted: nothing more is sent, and a reply still to come is not heard.
    return Effect.sync(() => cancel())
  })

const askOf = (p: Parts) =>
  ((ref: ActorRef<Rpc.Any>, tag: string, payload: unknown, askOptions?: AskOptions) => {
    const actor = formatAddress(ref.address)
    return inSpan((traceparent) => {
      const rpc = requestOf(ref.protocol, tag)
      if (rpc === undefined) return Effect.die(new Error(`${tag} is not a request of ${actor}'s protocol`))
      const timeoutMs = askOptions?.timeoutMs ?? defaultAskTimeoutMs
      const resendMs = askOptions?.resendMs ?? defaultAskResendMs
      const headers = requestHeaders(tag, askOptions?.msgId ?? nuid.next(), askOptions, traceparent)
      const data = encodePayload(rpc, payload)
      p.counted(`ask.${ref.address.kind}`, "out")(data.length)
      return askWithResends(p, rpc, p.names.ask(ref.address), data, headers, actor, tag, timeoutMs, resendMs)
    }, "Actor.ask", "client", actor, tag)
  }) as ActorSystemShape["ask"]

// A value its own schema refuses is a bug of the publisher: a defect, not a transport failure to retry.
const publishEventOf = (p: Parts) => <A>(channel: EventChannel<A>, event: A, o: EventOptions = {}) =>
  Effect.try({ try: () => channel.encode(event), catch: (e) => e }).pipe(
    Effect.orDie,
    Effect.tap((data) => Effect.sync(() => p.counted(`sys.${channel.name}`, "out")(data.length))),
    Effect.flatMap((data) =>
      Effect.tryPromise({
        try: () =>
          p.nats.js.publish(channel.subject(p.run), data, {
            ...(o.msgId === undefined ? {} : { msgID: o.msgId }),
            ...(o.expectLastSeq === undefined ? {} : { expect: { lastSubjectSequence: o.expectLastSeq } })
          }),
        catch: (e) => new TransportError({ operation: `publish event ${channel.name}`, message: messageOf(e) })
      })
    ),
    Effect.map((ack) => ({ seq: ack.seq }))
  )

/** Copies of answered asks waiting for the journal, and the interval that writes them while they come. */
interface JournalCopies {
  copies: Array<[string, Uint8Array, MsgHdrs | undefined]>
  ticker: ReturnType<typeof setInterval> | undefined
}

const writeCopies = (nats: NatsShape, j: JournalCopies) => {
  const batch = j.copies
  j.copies = []
  for (const [subject, data, headers] of batch) nats.journalNc.publish(subject, data, headers ? { headers } : {})
}

// One interval while copies come (stopped by the first tick that finds none): an ask adds
// its copy to an array and arms nothing. What is outstanding is written when the scope closes.
const journalCopier = (nats: NatsShape) =>
  Effect.gen(function* () {
    const j: JournalCopies = { copies: [], ticker: undefined }
    const tick = () => {
      if (j.copies.length > 0) return writeCopies(nats, j)
      clearInterval(j.ticker)
      j.ticker = undefined
    }
    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        if (j.ticker !== undefined) clearInterval(j.ticker)
        writeCopies(nats, j)
      })
    )
    const copyToJournal: ActorSystemShape["copyToJournal"] = (subject, data, headers) => {
      j.copies.push([subject, data, headers])
      j.ticker ??= setInterval(tick, 2)
    }
    return copyToJournal
  })

const make = Effect.fn("ActorSystem.make")(function* (options: SystemOptions) {
  const nats = yield* Nats
  const names = layout(options.run)
  yield* ensureStreams(nats, names, options)
  const replies = yield* makeReplies(nats.nc)
  const counted = channelCounter(yield* Effect.context<never>())
  const registry = yield* openBucket(nats, names.registryBucket)
  const state = yield* openBucket(nats, names.stateBucket)
  const p: Parts = { run: options.run, nats, names, replies, counted }
  const copyToJournal = yield* journalCopier(nats)
  return { run: options.run, layout: names, nats, registry, state, tell: tellOf(p), ask: askOf(p), publishEvent: publishEventOf(p), copyToJournal } satisfies ActorSystemShape
})

/**
 * The system as one incarnation of an actor uses it: its tells and asks carry its address and
 * incarnation (`Gyre-Sender`, `Gyre-Incarnation`), so a receiver can tell a fenced one's messages
 * from the live one's (`claim.isCurrent`).
 */
export const speakingAs = (system: ActorSystemShape, sender: ActorAddress, incarnation: number): ActorSystemShape => {
  const from = { sender: formatAddress(sender), incarnation }
  return {
    ...system,
    tell: (ref, tag, payload, options) => system.tell(ref, tag, payload, { ...from, ...options }),
    ask: (ref, tag, payload, options) => system.ask(ref, tag, payload, { ...from, ...options })
  }
}

export class ActorSystem extends Context.Service<ActorSystem, ActorSystemShape>()("gyre/runtime/ActorSystem") {
  /** The system of one run over the `Nats` connection in context. */
  static readonly layer = (options: SystemOptions) => Layer.effect(ActorSystem, make(options))
}
