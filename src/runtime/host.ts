/**
 * One incarnation of an actor: from restoring its snapshot to its last acknowledgement.
 *
 * Intake: the actor's durable JetStream consumer (tells, in journal order) and a core NATS
 * subscription on its ask subject both feed one mailbox, from which at most `concurrency`
 * handlers run at a time (one = strictly in order). For each message:
 *  1. a message id already handled (redelivery, re-publish) is acknowledged and skipped;
 *  2. a message that is not JSON, fails the payload schema or names an unknown request goes
 *     to the dead-letter stream with the reason and its bytes and headers, then is acked
 *     (an ask also gets a `Rejected` reply);
 *  3. a tell delivered more than `maxDeliveries` times is dead-lettered the same way;
 *  4. otherwise the handler runs; a typed failure is a result (an ask gets it, a tell logs
 *     it); a defect crashes the incarnation (its supervisor restarts it from the snapshot, and
 *     the message comes back).
 * With persistence, acknowledgements wait for the next snapshot (after `everyMessages`
 * handled messages or `maxDelayMs`), so an acknowledged message is always in the snapshot and
 * a crash re-handles exactly the messages whose effect on the state was lost. Snapshots are
 * compare-and-set on the KV revision: a second incarnation writing the same actor loses.
 *
 * Draining stops intake, lets the handler in progress finish, hands buffered tells back to
 * JetStream (nak: redelivered at once to the next incarnation), rejects buffered asks, writes
 * the last snapshot and acknowledges.
 *
 * The incarnation holds its address's claim (claim.ts), renewed as its heartbeat. Once the claim
 * is lost (a newer incarnation or a death mark in the registry), nothing more is snapshotted or
 * acknowledged and the incarnation ends: what it holds goes back to JetStream unacknowledged.
 */
import type { JsMsg, ConsumerMessages } from "@nats-io/jetstream"
import { AckPolicy, DeliverPolicy } from "@nats-io/jetstream"
import { headers as natsHeaders, nuid, type Msg, type MsgHdrs, type Subscription } from "@nats-io/transport-node"
import { Cause, Deferred, Effect, Exit, FiberSet, Ref, Schema } from "effect"
import type { Rpc } from "effect/rpc"
import type { ActorContext, ActorType, Handler, MessageMeta } from "./actor.ts"
import { SnapshotConflict, TransportError, messageOf } from "./errors.ts"
import { formatAddress, type ActorAddress } from "./names.ts"
import { Headers, codecsOf, encodeExitReply, encodeJson, encodeRejectedReply, parseJson, requestOf } from "./protocol.ts"
import type { Claim } from "./claim.ts"
import type { EndpointStats } from "./discovery.ts"
import { speakingAs, type ActorSystemShape } from "./system.ts"

export interface HostOptions {
  readonly node: string
  readonly heartbeatMs: number
  /** JetStream ack wait of the actor's consumer; in-progress handlers extend it. */
  readonly ackWaitMs: number
  /** Request counts and timings, read by service discovery. */
  readonly stats: EndpointStats
  /** This incarnation's claim on the address: renewed as its heartbeat; once lost, nothing more is handled or acked. */
  readonly claim: Claim
}

/** The switches of a running actor, shared by its incarnations. */
export interface IncarnationControl {
  /** Completed to drain the actor. */
  readonly drain: Deferred.Deferred<void>
  /** Completed by the first incarnation that serves (intake subscribed and flushed). */
  readonly ready: Deferred.Deferred<void>
}

type Incoming =
  | { readonly via: "tell"; readonly msg: JsMsg }
  | { readonly via: "ask"; readonly msg: Msg }


const HANDLED_IN_MEMORY = 10_000
const HANDLED_IN_SNAPSHOT = 512

/** The snapshot document in the state bucket. */
export const Snapshot = Schema.Struct({
  state: Schema.Unknown,
  handled: Schema.Array(Schema.String),
  incarnation: Schema.Number,
  at: Schema.Number
})

const copyHeaders = (from: MsgHdrs | undefined): MsgHdrs => {
  const h = natsHeaders()
  if (from) for (const [k, vs] of from) for (const v of vs) h.append(k, v)
  return h
}

/** Header values are one line: newlines become spaces, and long reasons are cut. */
const oneLine = (text: string): string => text.replace(/[\r\n]+\s*/g, " ").slice(0, 2000)

/** Runs one incarnation until it is drained (success) or crashes (failure). */
export const runIncarnation = <R extends Rpc.Any, S, Req>(
  type: ActorType<R, S, Req>,
  address: ActorAddress,
  system: ActorSystemShape,
  options: HostOptions,
  control: IncarnationControl
): Effect.Effect<void, unknown, Req> =>
  Effect.scoped(
    Effect.gen(function* () {
      const names = system.layout
      const actor = formatAddress(address)
      const key = names.registryKey(address)
      const incarnation = options.claim.incarnation
      const stateCodec = Schema.toCodecJson(type.stateSchema)
      const { js, jsm, nc } = system.nats

      // 1. Restore.
      const stored = yield* Effect.tryPromise({
        try: () => system.state.get(key),
        catch: (e) => new TransportError({ operation: `read snapshot of ${actor}`, message: messageOf(e) })
      })
      let revision = stored !== null && stored.operation === "PUT" ? stored.revision : 0
      const handled = new Map<string, true>()
      let initial = type.initialState(address.id)
      if (revision > 0) {
        const snapshot = Schema.decodeUnknownSync(Snapshot)(stored!.json())
        initial = Schema.decodeUnknownSync(stateCodec)(snapshot.state) as S
        for (const id of snapshot.handled) handled.set(id, true)
      }
      const state = yield* Ref.make(initial)
      let load: Readonly<Record<string, unknown>> = {}
      const ctx: ActorContext<S> = {
        address,
        incarnation,
        node: options.node,
        state,
        system: speakingAs(system, address, incarnation),
        reportLoad: (l) => {
          load = l
        }
      }

      // 2. Heartbeat: renewals of the claim (the registry entry) with the load figures.
      yield* Effect.forkScoped(options.claim.renew(() => load, options.heartbeatMs))

      // 3. Handlers (resources they acquire live in this scope).
      const handlers = (yield* type.behaviour(ctx)) as Record<string, Handler<any>>

      // 4. Acknowledgements, snapshots.
      let pendingAcks: Array<JsMsg> = []
      let sinceSnapshot = 0
      let flushTimer: ReturnType<typeof setTimeout> | undefined
      const inFlight = new Set<JsMsg>()

      const remember = (id: string) => {
        handled.set(id, true)
        if (handled.size > HANDLED_IN_MEMORY) handled.delete(handled.keys().next().value!)
      }

      const snapshotNow = Effect.gen(function* () {
        const encoded = Schema.encodeSync(stateCodec)(yield* Ref.get(state))
        const ids = [...handled.keys()].slice(-HANDLED_IN_SNAPSHOT)
        const doc = encodeJson({ state: encoded, handled: ids, incarnation, at: Date.now() })
        revision = yield* Effect.tryPromise({
          try: () => (revision === 0 ? system.state.create(key, doc) : system.state.update(key, doc, revision)),
          catch: () => new SnapshotConflict({ actor, expectedRevision: revision })
        })
      })

      const flush = Effect.gen(function* () {
        if (flushTimer !== undefined) clearTimeout(flushTimer)
        flushTimer = undefined
        if (!options.claim.held()) return // fenced: no snapshot, no acks
        if (type.persistence !== undefined && sinceSnapshot > 0) yield* snapshotNow
        sinceSnapshot = 0
        const acks = pendingAcks
        pendingAcks = []
        for (const m of acks) m.ack()
      })

      const runFlush = Effect.runForkWith(yield* Effect.context<never>())
      // Acknowledges a handled tell. With persistence, a tell that changed the state is acked
      // only after the snapshot that holds the change; one that did not is acked at once unless
      // changes are pending (it may be a redelivered copy of one of them).
      const settle = (m: JsMsg | undefined, changedState: boolean) =>
        Effect.gen(function* () {
          if (type.persistence === undefined || (!changedState && sinceSnapshot === 0)) {
            if (options.claim.held()) m?.ack()
            return
          }
          if (m !== undefined) pendingAcks.push(m)
          if (changedState) sinceSnapshot++
          if (sinceSnapshot >= type.persistence.everyMessages) {
            yield* flush
          } else if (flushTimer === undefined) {
            flushTimer = setTimeout(() => {
              flushTimer = undefined
              runFlush(flush.pipe(Effect.catchCause((c) => Effect.logError(`flush of ${actor} failed`, c))))
            }, type.persistence.maxDelayMs)
          }
        })

      const deadLetter = (subject: string, seq: number, bytes: Uint8Array, hdrs: MsgHdrs | undefined, reason: string) => {
        const h = copyHeaders(hdrs)
        h.set(Headers.deadReason, oneLine(reason))
        h.set(Headers.deadSubject, subject)
        h.set(Headers.deadSeq, String(seq))
        h.set(Headers.deadActor, actor)
        return Effect.tryPromise({
          try: () => js.publish(names.dead(address), bytes, { headers: h }),
          catch: (e) => new TransportError({ operation: `dead-letter to ${names.dead(address)}`, message: messageOf(e) })
        }).pipe(Effect.tap(() => Effect.logWarning(`${actor}: dead-lettered a message: ${reason}`)))
      }

      // 5. Handling one message.
      const handle = (item: Incoming) =>
        Effect.gen(function* () {
          const msg = item.msg
          const tell = item.via === "tell" ? item.msg : undefined
          const seq = tell?.seq ?? 0
          const msgId = msg.headers?.get(Headers.msgId) || (tell ? `seq:${seq}` : nuid.next())
          const tag = msg.headers?.get(Headers.request) ?? ""
          const reply = (bytes: Uint8Array) => {
            if (item.via === "ask") item.msg.respond(bytes)
          }

          if (handled.has(msgId)) return yield* settle(tell, false)

          const reject = (reason: string) =>
            Effect.gen(function* () {
              yield* deadLetter(msg.subject, seq, msg.data, msg.headers, reason)
              reply(encodeRejectedReply(reason))
              remember(msgId)
              yield* settle(tell, false)
            })

          if (tell !== undefined && tell.info.deliveryCount > type.maxDeliveries) {
            return yield* reject(`delivered ${tell.info.deliveryCount} times without being handled (the handler crashed or the actor restarted each time)`)
          }
          const rpc = requestOf(type.protocol, tag)
          if (rpc === undefined) {
            return yield* reject(tag === "" ? `no ${Headers.request} header` : `unknown request '${tag}' for ${address.kind}`)
          }
          const parsed = parseJson(msg.data)
          if (!parsed.ok) return yield* reject(parsed.reason)
          const payload = Schema.decodeUnknownExit(codecsOf(rpc).payload)(parsed.value)
          if (Exit.isFailure(payload)) {
            return yield* reject(`payload does not match ${tag}: ${Cause.pretty(payload.cause)}`)
          }

          const meta: MessageMeta = {
            via: item.via,
            msgId,
            seq,
            deliveryCount: tell?.info.deliveryCount ?? 1,
            sender: msg.headers?.get(Headers.sender) || undefined,
            senderIncarnation: Number(msg.headers?.get(Headers.incarnation)) || undefined
          }
          const before = yield* Ref.get(state)
          if (tell !== undefined) inFlight.add(tell)
          const progress = tell ? setInterval(() => tell.working(), Math.max(500, options.ackWaitMs / 3)) : undefined
          const started = process.hrtime.bigint()
          const exit = yield* Effect.exit(handlers[tag]!(payload.value, meta))
          if (progress) clearInterval(progress)
          if (tell !== undefined) inFlight.delete(tell)
          options.stats.numRequests++
          options.stats.processingTimeNs += Number(process.hrtime.bigint() - started)
          if (Exit.isFailure(exit)) {
            options.stats.numErrors++
            options.stats.lastError = Cause.pretty(exit.cause).slice(0, 500)
          }

          if (Exit.isFailure(exit) && !Cause.hasFails(exit.cause)) {
            // A defect or interruption: the actor crashes; the message is handed back.
            reply(encodeRejectedReply(`handler crashed: ${Cause.pretty(exit.cause)}`))
            return yield* Effect.failCause(exit.cause)
          }
          if (Exit.isFailure(exit) && tell !== undefined) {
            yield* Effect.logWarning(`${actor}: ${tag} (seq ${seq}) failed: ${Cause.pretty(exit.cause)}`)
          }
          remember(msgId)
          const changed = (yield* Ref.get(state)) !== before
          if (item.via === "ask") {
            if (changed && type.persistence !== undefined) {
              sinceSnapshot++
              yield* flush
            }
            reply(encodeExitReply(rpc, exit))
            // The journal's copy, after the reply (ARCHITECTURE.md: "asks are journaled at most once").
            system.copyToJournal(names.asked(address), msg.data, msg.headers)
          } else {
            yield* settle(tell, changed)
          }
        })

      // Mailbox: messages wait here in arrival order (journal order for tells) while
      // `concurrency` handlers are busy. A handler is started with runFork from the NATS
      // callback itself, so an idle actor answers without a scheduler hop.
      const waiting: Array<Incoming> = []
      let busy = 0
      let draining = false
      const crashed = yield* Deferred.make<never, unknown>()
      const idle = yield* Deferred.make<void>()
      const fork = yield* FiberSet.makeRuntime<never, void, unknown>()
      const handBack = (item: Incoming) => {
        if (item.via === "tell") item.msg.nak()
        else item.msg.respond(encodeRejectedReply(`${actor} is stopping; retry`))
      }
      const dispatch = (): void => {
        while (busy < type.concurrency && waiting.length > 0 && !draining) {
          const item = waiting.shift()!
          busy++
          fork(
            handle(item).pipe(
              Effect.catchCause((cause) => Deferred.failCause(crashed, cause)),
              Effect.ensuring(
                Effect.sync(() => {
                  busy--
                  dispatch()
                })
              ),
              Effect.asVoid
            )
          )
        }
        if (draining && busy === 0) Deferred.doneUnsafe(idle, Exit.void)
      }
      const enqueue = (item: Incoming) => {
        if (draining) return handBack(item)
        waiting.push(item)
        dispatch()
      }

      // 7. Hand back what this incarnation holds when it ends for any reason.
      yield* Effect.addFinalizer(() =>
        Effect.sync(() => {
          draining = true
          if (flushTimer !== undefined) clearTimeout(flushTimer)
          for (const m of inFlight) m.nak()
          for (const m of pendingAcks) m.nak()
          pendingAcks = []
          for (const item of waiting.splice(0)) handBack(item)
        })
      )

      // 6. Intake: the consumer's and the subscription's callbacks dispatch straight into handlers.
      const durable = names.consumer(address)
      yield* Effect.tryPromise({
        try: async () => {
          const existing = await jsm.consumers.info(names.journalStream, durable).catch(() => null)
          if (existing === null) {
            await jsm.consumers.add(names.journalStream, {
              durable_name: durable,
              filter_subject: names.tell(address),
              ack_policy: AckPolicy.Explicit,
              deliver_policy: DeliverPolicy.All,
              ack_wait: options.ackWaitMs * 1_000_000,
              max_ack_pending: 256 * type.concurrency,
              max_deliver: -1
            })
          }
        },
        catch: (e) => new TransportError({ operation: `create consumer ${durable}`, message: messageOf(e) })
      })
      const consumer = yield* Effect.tryPromise({
        try: () => js.consumers.get(names.journalStream, durable),
        catch: (e) => new TransportError({ operation: `bind consumer ${durable}`, message: messageOf(e) })
      })
      const tells: ConsumerMessages = yield* Effect.acquireRelease(
        Effect.tryPromise({
          try: () => consumer.consume({ max_messages: 128, callback: (msg) => enqueue({ via: "tell", msg }) }),
          catch: (e) => new TransportError({ operation: `consume ${durable}`, message: messageOf(e) })
        }),
        (it) => Effect.promise(() => it.close().then(() => undefined, () => undefined))
      )
      const asks: Subscription = yield* Effect.acquireRelease(
        Effect.sync(() =>
          nc.subscribe(names.ask(address), {
            queue: "gyre",
            callback: (err, msg) => {
              if (err === null) enqueue({ via: "ask", msg })
            }
          })
        ),
        (sub) => Effect.sync(() => sub.unsubscribe())
      )
      yield* Effect.tryPromise({
        try: () => nc.flush(),
        catch: (e) => new TransportError({ operation: "flush", message: messageOf(e) })
      })
      yield* Deferred.succeed(control.ready, undefined)

      // 8. Run until drained (intake stops, waiting messages go back, the handler in progress
      // finishes), until a handler crashes, or until the claim is lost (fenced: the scope's
      // close hands back what is held, unacknowledged).
      yield* Effect.raceAllFirst([
        options.claim.lost,
        Deferred.await(crashed),
        Effect.gen(function* () {
          yield* Deferred.await(control.drain)
          asks.unsubscribe()
          yield* Effect.promise(() => tells.close().then(() => undefined, () => undefined))
          draining = true
          for (const item of waiting.splice(0)) handBack(item)
          dispatch()
          yield* Deferred.await(idle)
        })
      ])
      if (!options.claim.held()) return
      yield* flush
      yield* options.claim.release("stopped")
    })
  )
