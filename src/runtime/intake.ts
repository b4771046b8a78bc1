/**
 * An incarnation's intake from NATS: the actor's durable JetStream consumer (tells, in journal
 * order) and a core NATS subscription on its ask subject (queue group `gyre`). Each message
 * becomes a `Delivery`, the one face of a message that the dispatch sees: its bytes and
 * headers, and what can be done with it once (confirm, hand back, dead-letter).
 *
 * - A tell is confirmed by acknowledging it and handed back by a nak (with a delay, to
 *   redeliver later).
 * - An ask is confirmed by sending the reply set on it and then queueing its copy for the
 *   journal; handing it back answers `Rejected` ("stopping; retry"). Its answer is recorded by
 *   message id (`AnswerCache`): an ask that reuses the id gets that answer, and one that comes
 *   while the first is being handled gets it when it is sent; neither runs the handler again.
 * A delivery is settled once: later confirms or hand-backs do nothing.
 */
import { AckPolicy, DeliverPolicy, type ConsumerInfo, type ConsumerMessages, type JsMsg } from "@nats-io/jetstream"
import { headers as natsHeaders, type Msg, type MsgHdrs, type Subscription } from "@nats-io/transport-node"
import { createHash } from "node:crypto"
import { Duration, Effect, Stream } from "effect"
import { TransportError, messageOf } from "./errors.ts"
import { AnswerCache } from "./mailbox.ts"
import type { ActorAddress } from "./names.ts"
import { Headers, encodeRejectedReply } from "./protocol.ts"
import { readStored } from "./stream-reader.ts"
import type { ActorSystemShape } from "./system.ts"

export interface Delivery {
  readonly via: "tell" | "ask"
  readonly subject: string
  readonly data: Uint8Array
  /** The header's value, "" when absent. */
  readonly header: (name: string) => string
  /** Journal sequence of a tell (0 for an ask). */
  readonly seq: number
  /** How many times JetStream has delivered this tell (1 for an ask). */
  readonly deliveryCount: number
  /** Settled (confirmed, handed back or answered) already. */
  readonly settled: boolean
  /** The reply an ask sends when confirmed. */
  reply: Uint8Array | undefined
  readonly confirm: () => void
  readonly handBack: (delayMs?: number) => void
  /** Answers an ask now (a rejection) and settles it; a tell is left as it is. */
  readonly answer: (bytes: Uint8Array) => void
  /** Answers an ask now without recording the answer for its id (a retry is handled); a tell is left as it is. */
  readonly refuse: (bytes: Uint8Array) => void
  /** Tells JetStream the handler is still at it (a tell's ack wait starts over). */
  readonly working: () => void
  /** Publishes the message to the dead-letter stream with `reason` (not settling it). */
  readonly deadLetter: (reason: string) => Effect.Effect<void, TransportError>
}

/** What deliveries of one incarnation share. */
interface Route {
  readonly system: ActorSystemShape
  readonly address: ActorAddress
  readonly actor: string
  /** Where copies of answered asks go. */
  readonly asked: string
  /** Answers of recent asks by message id, and the asks being handled by id. */
  readonly answers: AnswerCache
  readonly asking: Map<string, AskDelivery>
  readonly delayed: Map<number, number>
}

/** Header values are one line: newlines become spaces, and long reasons are cut. */
const oneLine = (text: string): string => text.replace(/[\r\n]+\s*/g, " ").slice(0, 2000)

/** A message's headers as one object, read once (`MsgHdrs.get` scans every key on each call). */
const headerValues = (hdrs: MsgHdrs | undefined): Record<string, string> => {
  const out: Record<string, string> = {}
  if (hdrs !== undefined) for (const [k, vs] of hdrs) out[k] = vs[0] ?? ""
  return out
}

/** Copied header values are cut to this many characters (a long unknown tag, say). */
const copiedHeaderChars = 1024
/** Room kept under `max_payload` for the protocol line and what the server adds. */
const deadLetterMargin = 4096

/**
 * A copied header's name: JetStream reads `Nats-*` headers of a publish (`Nats-Expected-Last-
 * Sequence` would make the dead letter's publish fail), so those but the message id are renamed.
 */
const copiedName = (k: string) => {
  const name = oneLine(k).slice(0, 256)
  return /^nats-/i.test(name) && name.toLowerCase() !== Headers.msgId.toLowerCase() ? `Gyre-Dead-Header-${name}` : name
}

/** Bytes a header takes on the wire (`key: value\r\n`). */
const headerBytes = (k: string, v: string) => Buffer.byteLength(k) + Buffer.byteLength(v) + 4

/** Where a dead letter comes from: the reason, the subject and sequence it had, the actor. */
export interface DeadLetterSource {
  readonly reason: string
  readonly subject: string
  readonly seq: number
  readonly actor: string
}

/**
 * The dead letter of `data`: its headers (values cut to one line of `copiedHeaderChars`) with
 * the reason and where it came from, and as much of `data` as fits in `maxPayload`; a cut
 * body keeps the original's length and SHA-256 in `Gyre-Dead-Original-Length` and `-Digest`.
 */
export const deadLetterOf = (
  data: Uint8Array,
  hdrs: MsgHdrs | undefined,
  where: DeadLetterSource,
  maxPayload: number
): { readonly headers: MsgHdrs; readonly body: Uint8Array } => {
  const h = natsHeaders()
  let size = 12 // "NATS/1.0\r\n" and the blank line
  const add = (k: string, v: string) => {
    h.append(k, v)
    size += headerBytes(k, v)
  }
  add(Headers.deadReason, oneLine(where.reason))
  add(Headers.deadSubject, oneLine(where.subject).slice(0, copiedHeaderChars))
  add(Headers.deadSeq, String(where.seq))
  add(Headers.deadActor, where.actor)
  if (hdrs) for (const [k, vs] of hdrs) for (const v of vs) add(copiedName(k), oneLine(v).slice(0, copiedHeaderChars))
  const room = Math.max(0, maxPayload - deadLetterMargin - size - 200)
  if (data.length <= room) return { headers: h, body: data }
  add(Headers.deadOriginalLength, String(data.length))
  add(Headers.deadOriginalDigest, `sha256:${createHash("sha256").update(data).digest("hex")}`)
  return { headers: h, body: data.subarray(0, room) }
}

/**
 * Publishes `data` (cut to fit, `deadLetterOf`) to `address`'s dead-letter subject; `msgId`
 * makes a repeated dead letter of the same thing one message (JetStream's duplicate window).
 */
export const publishDeadLetter = (
  system: ActorSystemShape,
  address: ActorAddress,
  data: Uint8Array,
  hdrs: MsgHdrs | undefined,
  source: DeadLetterSource,
  msgId?: string
) => {
  const { nc, js } = system.nats
  const { headers, body } = deadLetterOf(data, hdrs, source, nc.info?.max_payload ?? 1024 * 1024)
  const subject = system.layout.dead(address)
  return Effect.tryPromise({
    try: () => js.publish(subject, body, { headers, ...(msgId !== undefined ? { msgID: msgId } : {}) }),
    catch: (e) => new TransportError({ operation: `dead-letter to ${subject}`, message: messageOf(e) })
  }).pipe(Effect.tap(() => Effect.logWarning(`${source.actor}: dead-lettered: ${oneLine(source.reason).slice(0, 300)}`)), Effect.asVoid)
}

const deadLetter = (route: Route, d: Delivery, hdrs: MsgHdrs | undefined, reason: string) =>
  publishDeadLetter(route.system, route.address, d.data, hdrs, { reason, subject: d.subject, seq: d.seq, actor: route.actor })

class TellDelivery implements Delivery {
  readonly via = "tell"
  settled = false
  reply: Uint8Array | undefined = undefined
  #headers: Record<string, string> | undefined
  constructor(
    readonly msg: JsMsg,
    readonly route: Route
  ) {}
  get subject() {
    return this.msg.subject
  }
  get data() {
    return this.msg.data
  }
  get seq() {
    return this.msg.seq
  }
  get deliveryCount() {
    return this.msg.info.deliveryCount
  }
  header(name: string) {
    return (this.#headers ??= headerValues(this.msg.headers))[name] ?? ""
  }
  confirm() {
    if (this.settled) return
    this.settled = true
    this.msg.ack()
  }
  handBack(delayMs?: number) {
    if (this.settled) return
    this.settled = true
    this.msg.nak(delayMs)
    if (delayMs !== undefined && delayMs > 0) this.route.delayed.set(this.msg.seq, Date.now() + delayMs)
  }
  answer() {}
  refuse() {}
  working() {
    if (!this.settled) this.msg.working()
  }
  deadLetter(reason: string) {
    return deadLetter(this.route, this, this.msg.headers, reason)
  }
}

class AskDelivery implements Delivery {
  readonly via = "ask"
  readonly seq = 0
  readonly deliveryCount = 1
  settled = false
  reply: Uint8Array | undefined = undefined
  #headers: Record<string, string> | undefined
  /** Requests that came with the same message id while this one was being handled. */
  #followers: Array<Msg> | undefined
  constructor(
    readonly msg: Msg,
    readonly route: Route
  ) {}
  get subject() {
    return this.msg.subject
  }
  get data() {
    return this.msg.data
  }
  header(name: string) {
    return (this.#headers ??= headerValues(this.msg.headers))[name] ?? ""
  }
  /**
   * Answers `msg` (the same message id) with this one's answer. Past `maxFollowers` the oldest
   * follower is let go: an asker asking again with the same id has given up on its earlier
   * asks, and one that has not asks again and gets the recorded answer.
   */
  follow(msg: Msg): void {
    this.#followers ??= []
    if (this.#followers.push(msg) > maxFollowers) this.#followers.shift()
  }
  /** Sends `bytes` to the asker and its followers; an answer (not a hand-back) is recorded for its id. */
  #settle(bytes: Uint8Array | undefined, recorded: boolean) {
    this.settled = true
    const id = this.header(Headers.msgId)
    if (id !== "") this.route.asking.delete(id)
    if (bytes === undefined) return
    this.msg.respond(bytes)
    if (this.#followers !== undefined) for (const f of this.#followers) f.respond(bytes)
    if (recorded && id !== "") this.route.answers.record(id, bytes)
  }
  confirm() {
    if (this.settled) return
    this.#settle(this.reply, true)
    // The journal's copy, after the reply (ARCHITECTURE.md: "asks are journaled at most once").
    this.route.system.copyToJournal(this.route.asked, this.msg.data, this.msg.headers)
  }
  handBack() {
    this.refuse(encodeRejectedReply(`${this.route.actor} is stopping; retry`))
  }
  refuse(bytes: Uint8Array) {
    if (!this.settled) this.#settle(bytes, false)
  }
  answer(bytes: Uint8Array) {
    if (!this.settled) this.#settle(bytes, true)
  }
  working() {}
  deadLetter(reason: string) {
    return deadLetter(this.route, this, this.msg.headers, reason)
  }
}

/** Asks with the same message id that may wait for the first one's answer. */
const maxFollowers = 64

/**
 * An ask whose message id was answered gets the recorded answer, one whose id is being handled
 * gets the same answer when that is sent (both: `undefined`); a new one is returned, to handle.
 */
const dedupAsk = (route: Route, d: AskDelivery): AskDelivery | undefined => {
  const id = d.header(Headers.msgId)
  if (id === "") return d
  const answered = route.answers.get(id)
  if (answered !== undefined) return void d.msg.respond(answered)
  const first = route.asking.get(id)
  if (first !== undefined) return void first.follow(d.msg)
  route.asking.set(id, d)
  return d
}

export interface IntakeOptions {
  readonly system: ActorSystemShape
  readonly address: ActorAddress
  readonly actor: string
  readonly ackWaitMs: number
  /** Upper bound of unacknowledged tells the consumer hands this actor. */
  readonly maxAckPending: number
  /**
   * Tells handed back with a delay (the redelivery backoff), by sequence: when they are due.
   * Shared by the incarnations of one actor, so a restart does not hurry them (`releaseOrphans`).
   */
  readonly delayed: Map<number, number>
  readonly onDelivery: (d: Delivery) => void
}

export interface Intake {
  /** Stops taking messages (drains the ask subscription, closes the consumer's pull); idempotent. */
  readonly close: Effect.Effect<void>
}

/** The actor's durable consumer, created when it does not exist; its info when it did. */
const ensureConsumer = (o: IntakeOptions) => {
  const { jsm } = o.system.nats
  const names = o.system.layout
  const durable = names.consumer(o.address)
  return Effect.tryPromise({
    try: async () => {
      const existing = await jsm.consumers.info(names.journalStream, durable).catch(() => null)
      if (existing !== null) return existing
      await jsm.consumers.add(names.journalStream, {
        durable_name: durable,
        filter_subject: names.tell(o.address),
        ack_policy: AckPolicy.Explicit,
        deliver_policy: DeliverPolicy.All,
        ack_wait: o.ackWaitMs * 1_000_000,
        max_ack_pending: o.maxAckPending,
        max_deliver: -1
      })
      return undefined
    },
    catch: (e) => new TransportError({ operation: `create consumer ${durable}`, message: messageOf(e) })
  }).pipe(
    Effect.flatMap((info) =>
      Effect.tryPromise({
        try: () => o.system.nats.js.consumers.get(names.journalStream, durable),
        catch: (e) => new TransportError({ operation: `bind consumer ${durable}`, message: messageOf(e) })
      }).pipe(Effect.map((consumer) => ({ consumer, info })))
    )
  )
}

/**
 * Tells an earlier incarnation held unacknowledged when it crashed or its node died (pulled,
 * perhaps never seen by its dispatch) would wait out the ack wait before JetStream hands them
 * out again: this incarnation, which holds the address's claim now, naks them at once. They
 * lie between the consumer's ack floor and its last delivered message; the nak of one that
 * was acknowledged meanwhile is ignored by the server (it is not pending). One handed back
 * with a delay by an incarnation of this process keeps its delay (`delayed`).
 */
const releaseOrphans = (o: IntakeOptions, info: ConsumerInfo | undefined) => {
  if (info === undefined || info.num_ack_pending === 0) return Effect.void
  const { nats, layout: names } = o.system
  const last = info.delivered
  // `$JS.ACK.<stream>.<consumer>.<delivery count>.<stream seq>.<consumer seq>.<time>.<pending>`:
  // the server reads the stream sequence, and checks the consumer sequence is in its window.
  const ack = `$JS.ACK.${names.journalStream}.${names.consumer(o.address)}.1`
  const now = Date.now()
  for (const [seq, due] of o.delayed) if (due <= now) o.delayed.delete(seq)
  return readStored(nats, names.journalStream, { seq: info.ack_floor.stream_seq + 1 }, names.tell(o.address)).pipe(
    Stream.takeWhile((m) => m.seq <= last.stream_seq),
    Stream.filter((m) => !o.delayed.has(m.seq)),
    Stream.runForEach((m) => Effect.sync(() => nats.nc.publish(`${ack}.${m.seq}.${last.consumer_seq}.0.0`, "-NAK"))),
    Effect.andThen(
      Effect.tryPromise({ try: () => nats.nc.flush(), catch: (e) => new TransportError({ operation: "flush", message: messageOf(e) }) })
    ),
    Effect.andThen(Effect.logInfo(`${o.actor}: handed back ${info.num_ack_pending} tells an earlier incarnation held`))
  )
}

const PULL_EXPIRES_MS = 5_000

/**
 * Opens both intakes; `onDelivery` is called from the NATS callbacks themselves (so an idle
 * actor answers without a scheduler hop). The intake closes with the scope at the latest.
 */
export const openIntake = (o: IntakeOptions) =>
  Effect.gen(function* () {
    const route: Route = { system: o.system, address: o.address, actor: o.actor, asked: o.system.layout.asked(o.address), answers: new AnswerCache(), asking: new Map(), delayed: o.delayed }
    const { consumer, info } = yield* ensureConsumer(o)
    yield* releaseOrphans(o, info)
    const tells: ConsumerMessages = yield* Effect.tryPromise({
      // Pulls expire after 5 s (heartbeats every 2.5 s), not nats.js's 30 s: a pull lost with a
      // consumer leader that died (a clustered server killed) is noticed by two missed
      // heartbeats and pulled again within seconds instead of half a minute.
      try: () => consumer.consume({ max_messages: 128, expires: PULL_EXPIRES_MS, callback: (msg) => o.onDelivery(new TellDelivery(msg, route)) }),
      catch: (e) => new TransportError({ operation: `consume ${o.system.layout.consumer(o.address)}`, message: messageOf(e) })
    })
    const asks: Subscription = o.system.nats.nc.subscribe(o.system.layout.ask(o.address), {
      queue: "gyre",
      callback: (err, msg) => {
        if (err !== null) return
        const d = dedupAsk(route, new AskDelivery(msg, route))
        if (d !== undefined) o.onDelivery(d)
      }
    })
    let closed = false
    const close = Effect.suspend(() => {
      if (closed) return Effect.void
      closed = true
      // A drain, not an unsubscribe: asks the server routed here already still reach the
      // dispatch (which answers or hands them back), instead of being dropped unanswered. A
      // drain waits for the server: without one in 2 s (NATS is gone), an unsubscribe.
      const drained = Effect.promise(() => asks.drain().catch(() => undefined)).pipe(
        Effect.timeout(Duration.seconds(2)),
        Effect.catch(() => Effect.sync(() => asks.unsubscribe()))
      )
      // The pull's close drains its subscription too: bounded the same way, so a close never
      // waits on a server that does not answer (the consumer itself is durable).
      const pullClosed = Effect.promise(() => tells.close().then(() => undefined, () => undefined)).pipe(Effect.timeout(Duration.seconds(2)), Effect.ignore)
      return Effect.all([drained, pullClosed], { concurrency: 2, discard: true })
    })
    yield* Effect.addFinalizer(() => close)
    yield* Effect.tryPromise({
      try: () => o.system.nats.nc.flush(),
      catch: (e) => new TransportError({ operation: "flush", message: messageOf(e) })
    })
    return { close } satisfies Intake
  })
