/**
 * The dispatch of one incarnation: from a `Delivery` in the mailbox to its handler and back to
 * a confirmation, a snapshot, a dead letter or a crash.
 *
 * An ask that finds `maxQueuedAsks` asks (or `maxQueuedAskBytes` bytes of them) waiting is
 * answered `Overloaded` at once (the asker's `ActorOverloaded`) and never handled.
 *
 * For each message, in mailbox order, with at most `concurrency` handlers running:
 *  1. a tell whose message id was handled already (redelivery, re-publish) is confirmed and
 *     skipped (asks are never redelivered: their ids are neither checked nor remembered, so
 *     they cannot push tells' ids out of the dedup window);
 *  2. a message that is not JSON, fails the payload schema or names an unknown request goes to
 *     the dead-letter stream with the reason and its bytes and headers, then is confirmed (an
 *     ask is answered `Rejected`); so is a tell delivered more than `maxDeliveries` times;
 *  3. otherwise its handler runs, in an `Actor.handler` span (a child of the sender's span
 *     when the message carries a `traceparent`). A typed failure is a result (an ask gets it,
 *     a tell logs it). A defect crashes the incarnation; before that, an ask is answered
 *     `Rejected`, and a tell is handed back at once with the next delay of the type's
 *     `redelivery` schedule, or dead-lettered with the crash as its reason when this was its
 *     `maxDeliveries`-th delivery.
 * Settling follows `AckBook` (mailbox.ts): with persistence, messages that changed the state
 * wait for the snapshot that holds the change. A snapshot is a barrier: no handler starts
 * while one is written, and it is taken only when none runs, so it never holds half of a
 * handler's work.
 *
 * A handler is started with `runFork` from the NATS callback itself and completes through a
 * fiber observer, so an idle actor answers without a scheduler hop and a synchronous handler
 * costs no fiber switch.
 */
import { nuid } from "@nats-io/transport-node"
import { Cause, Context, Deferred, Duration, Effect, Exit, Fiber, Layer, Option, Pull, Ref, Schedule, Tracer, type Scope } from "effect"
import type { Rpc } from "effect/rpc"
import type { AnyActorType, Handler, MessageMeta } from "./actor.ts"
import type { EndpointStats } from "./discovery.ts"
import type { Delivery } from "./intake.ts"
import { AckBook, Mailbox, type HandledIds } from "./mailbox.ts"
import type { ActorMetrics } from "./metrics.ts"
import { Headers, codecsOf, encodeExitReply, encodeOverloadedReply, encodeRejectedReply, parseJson, parseTraceparent, requestOf, tracing } from "./protocol.ts"
import type { SnapshotStore } from "./snapshot.ts"

export interface DispatchOptions<S> {
  /** `kind/id`. */
  readonly actor: string
  readonly type: AnyActorType
  readonly handlers: Readonly<Record<string, Handler<any>>>
  readonly state: Ref.Ref<S>
  readonly handled: HandledIds
  readonly snapshots: SnapshotStore<S>
  readonly stats: EndpointStats
  readonly metrics: ActorMetrics
  /** Delay (ms) before redelivering a tell whose handler crashed on its n-th delivery: index n - 1. */
  readonly redeliveryDelays: ReadonlyArray<number>
  readonly ackWaitMs: number
}

export interface DispatcherShape {
  /** Takes a message from the intake (handed back at once when the dispatcher is stopping). */
  readonly offer: (d: Delivery) => void
  /** Fails when a handler crashes or a snapshot cannot be written; never succeeds. */
  readonly crashed: Effect.Effect<never, unknown>
  /**
   * A bounded stop: hands back what waits, lets running handlers finish for at most
   * `timeoutMs`, then interrupts them and hands their messages back (with no last snapshot,
   * since the state may hold half of their work); otherwise writes the last snapshot and
   * confirms what it covers. Returns whether handlers had to be interrupted.
   */
  readonly stop: (timeoutMs: number) => Effect.Effect<boolean, unknown>
  /**
   * Stops at once, settling nothing more: waiting, running and held messages are handed back.
   * Runs when the incarnation ends for any reason (a no-op after a clean stop), and is the
   * place where a fenced incarnation stops acknowledging.
   */
  readonly halt: () => void
}

interface Prepared {
  readonly rpc: Rpc.AnyWithProps
  readonly tag: string
  readonly payload: unknown
  readonly meta: MessageMeta
  readonly before: unknown
  readonly started: number
}

const DUPLICATE = Symbol("duplicate")

/** The delays a schedule gives its first `count` steps, in milliseconds. */
export const scheduleDelays = (schedule: Schedule.Schedule<unknown>, count: number) =>
  Effect.gen(function* () {
    const step = yield* Schedule.toStep(schedule)
    const out: Array<number> = []
    let now = 0
    for (let i = 0; i < count; i++) {
      const delay = yield* step(now, undefined).pipe(
        Effect.map(([, d]) => Duration.toMillis(d)),
        Pull.catchDone(() => Effect.succeed(undefined))
      )
      if (delay === undefined) break
      out.push(delay)
      now += delay
    }
    return out
  })

/** What the dispatch loop's callbacks change, in one place. */
interface DispatchState {
  /** Crashed or halted: nothing more starts. */
  halted: boolean
  /** Stopping: `idle` completes once nothing runs. */
  stopping: boolean
  /** Inside `pump` (it is not re-entered from a callback it caused). */
  pumping: boolean
  /** A snapshot is due as soon as no handler runs. */
  snapshotWanted: boolean
  snapshotting: Fiber.Fiber<void, unknown> | undefined
  /** The timer of a snapshot due after `persistence.maxDelayMs`. */
  timer: ReturnType<typeof setTimeout> | undefined
  /** Asks offered and not started yet, and their bytes (the ask bound). */
  asksWaiting: number
  askBytesWaiting: number
}

/**
 * The dispatch loop of one incarnation: the mailbox, the ack book, the handlers running and the
 * state above. Its methods are called from NATS callbacks and fiber observers, synchronously.
 */
class DispatchLoop<S> {
  readonly mailbox: Mailbox<Delivery>
  readonly book: AckBook<Delivery>
  readonly running = new Map<Fiber.Fiber<unknown, unknown>, Delivery>()
  readonly state: DispatchState = {
    halted: false,
    stopping: false,
    pumping: false,
    snapshotWanted: false,
    snapshotting: undefined,
    timer: undefined,
    asksWaiting: 0,
    askBytesWaiting: 0
  }

  constructor(
    readonly o: DispatchOptions<S>,
    readonly run: <A, E>(effect: Effect.Effect<A, E>) => Fiber.Fiber<A, E>,
    /** Whether spans reach a backend (`tracing`). */
    readonly spans: boolean,
    readonly crashed: Deferred.Deferred<never, unknown>,
    readonly idle: Deferred.Deferred<void>
  ) {
    this.mailbox = new Mailbox<Delivery>(o.type.concurrency)
    this.book = new AckBook<Delivery>(o.type.persistence?.everyMessages)
  }

  // The handler in its `Actor.handler` span, when spans reach a backend (`tracing`). Not
  // `Effect.fn` nor `Effect.withSpan`: the first captures a call-site stack on every call
  // (measured ~5-15 us, the largest single cost of an ask), the second also provides a stack
  // frame (a second context update per message); this span is the same.
  traced(p: Prepared, d: Delivery) {
    const handler = this.o.handlers[p.tag]!(p.payload, p.meta)
    if (!this.spans) return handler
    const parent = parseTraceparent(d.header(Headers.traceparent))
    const options = {
      kind: p.meta.via === "ask" ? "server" : "consumer",
      parent: parent === undefined ? undefined : Tracer.externalSpan(parent),
      attributes: { "gyre.actor": this.o.actor, "gyre.request": p.tag, "gyre.via": p.meta.via, "gyre.seq": p.meta.seq }
    } as const
    // The span is the handler's parent (its own asks and tells are its children); no stack frame provided with it.
    return Effect.useSpan("Actor.handler", options, (span) => Effect.provideService(handler, Tracer.ParentSpan, span))
  }

  // 1-2: what a message is, decided without running anything.
  prepare(d: Delivery, msgId: string): Prepared | string | typeof DUPLICATE {
    const { type } = this.o
    if (d.via === "tell" && this.o.handled.has(msgId)) return DUPLICATE
    if (d.via === "tell" && d.deliveryCount > type.maxDeliveries) {
      return `delivered ${d.deliveryCount} times without being handled (the handler crashed or the actor restarted each time)`
    }
    const tag = d.header(Headers.request)
    const rpc = requestOf(type.protocol, tag)
    if (rpc === undefined) return tag === "" ? `no ${Headers.request} header` : `unknown request '${tag}' for ${type.kind}`
    const parsed = parseJson(d.data)
    if (!parsed.ok) return parsed.reason
    const payload = codecsOf(rpc).decodePayload(parsed.value)
    if (Exit.isFailure(payload)) return `payload does not match ${tag}: ${Cause.pretty(payload.cause)}`
    const sender = d.header(Headers.sender)
    const senderIncarnation = Number(d.header(Headers.incarnation)) || undefined
    const meta: MessageMeta = { via: d.via, msgId, seq: d.seq, deliveryCount: d.deliveryCount, sender: sender === "" ? undefined : sender, senderIncarnation }
    return { rpc, tag, payload: payload.value, meta, before: Ref.getUnsafe(this.o.state), started: performance.now() }
  }

  fail(cause: Cause.Cause<unknown>) {
    this.state.halted = true
    Deferred.doneUnsafe(this.crashed, Exit.failCause(cause))
  }

  release() {
    this.mailbox.release()
    this.pump()
  }

  settleTell(d: Delivery, changed: boolean) {
    const s = this.book.settleTell(d, changed)
    if (s === "ack") d.confirm()
    else this.wantSnapshot(s === "snapshot")
  }

  // A dead letter that cannot be published does not crash the actor: the ask is answered
  // all the same, the tell goes back (to be dead-lettered on a later delivery).
  reject(d: Delivery, msgId: string, reason: string) {
    const { metrics, actor } = this.o
    metrics.handled(d.via, "rejected", undefined)
    metrics.deadLettered()
    observe(this.run(d.deadLetter(reason)), (exit) => {
      const lost = Exit.isFailure(exit)
      if (lost) this.run(Effect.logError(`${actor}: could not dead-letter a message (${reason.slice(0, 200)}): ${Cause.pretty(exit.cause)}`))
      d.answer(encodeRejectedReply(reason))
      if (d.via === "tell" && lost) d.handBack(this.o.redeliveryDelays.at(-1) ?? 0)
      else if (d.via === "tell") {
        this.o.handled.remember(msgId)
        this.settleTell(d, false)
      }
      this.release()
    })
  }

  // 3: a defect or an interruption that is not ours: hand the message back, then crash.
  crash(d: Delivery, cause: Cause.Cause<unknown>) {
    const { type, redeliveryDelays } = this.o
    this.state.halted = true
    const pretty = Cause.pretty(cause)
    if (d.via === "ask") d.answer(encodeRejectedReply(`handler crashed: ${pretty}`))
    else if (d.deliveryCount >= type.maxDeliveries) {
      this.o.metrics.deadLettered()
      const reason = `the handler crashed on each of ${d.deliveryCount} deliveries; the last time: ${pretty}`
      return observe(this.run(d.deadLetter(reason)), (exit) => {
        if (Exit.isSuccess(exit)) d.confirm()
        else d.handBack(redeliveryDelays.at(-1) ?? 0)
        this.fail(cause)
      })
    } else d.handBack(redeliveryDelays[d.deliveryCount - 1] ?? redeliveryDelays.at(-1) ?? 0)
    this.fail(cause)
  }

  /** The handler's figures, in the endpoint stats and the metrics. */
  count(d: Delivery, p: Prepared, exit: Exit.Exit<unknown, unknown>) {
    const { stats } = this.o
    const elapsed = performance.now() - p.started
    stats.numRequests++
    stats.processingTimeNs += Math.round(elapsed * 1e6)
    const failed = Exit.isFailure(exit)
    if (failed) {
      stats.numErrors++
      stats.lastError = Cause.pretty(exit.cause).slice(0, 500)
    }
    const typedFailure = failed && Cause.hasFails(exit.cause)
    this.o.metrics.handled(d.via, !failed ? "ok" : typedFailure ? "error" : "crash", elapsed / 1000)
    return { failed, typedFailure }
  }

  finish(d: Delivery, p: Prepared, exit: Exit.Exit<unknown, unknown>) {
    this.book.finished(d)
    const { typedFailure } = this.count(d, p, exit)
    if (d.settled) return this.release() // handed back by a stop that could not wait
    if (Exit.isFailure(exit) && !typedFailure) return this.crash(d, exit.cause)
    const changed = Ref.getUnsafe(this.o.state) !== p.before
    if (d.via === "ask") {
      d.reply = encodeExitReply(p.rpc, exit)
      if (this.book.settleAsk(d, changed) === "reply") d.confirm()
      else this.wantSnapshot(true)
    } else {
      this.o.handled.remember(p.meta.msgId)
      if (Exit.isFailure(exit)) this.run(Effect.logWarning(`${this.o.actor}: ${p.tag} (seq ${d.seq}) failed: ${Cause.pretty(exit.cause)}`))
      this.settleTell(d, changed)
    }
    this.release()
  }

  start(d: Delivery) {
    if (d.via === "ask") {
      this.state.asksWaiting--
      this.state.askBytesWaiting -= d.data.length
    }
    if (d.via === "tell" && d.deliveryCount > 1) this.o.metrics.redelivered()
    const msgId = d.header(Headers.msgId) || (d.via === "tell" ? `seq:${d.seq}` : nuid.next())
    const p = this.prepare(d, msgId)
    if (p === DUPLICATE) {
      this.o.metrics.handled(d.via, "duplicate", undefined)
      if (d.via === "tell") this.settleTell(d, false)
      return this.release()
    }
    if (typeof p === "string") return this.reject(d, msgId, p)
    if (d.via === "tell") this.book.started(d)
    const fiber = this.run(this.traced(p, d))
    if (fiber.pollUnsafe() === undefined) this.running.set(fiber, d)
    observe(fiber, (exit) => {
      this.running.delete(fiber)
      this.finish(d, p, exit)
    })
  }

  // Snapshots: written when wanted and no handler runs; the mailbox is held meanwhile.
  readonly snapshotNow = Effect.suspend(() => {
    const { write, confirm } = this.book.takeForSnapshot()
    if (!write) {
      for (const d of confirm) d.confirm()
      return Effect.void
    }
    return this.o.snapshots.write(Ref.getUnsafe(this.o.state), this.o.handled).pipe(
      Effect.tap(() => Effect.sync(() => confirm.forEach((d) => d.confirm()))),
      Effect.tapError(() => Effect.sync(() => confirm.forEach((d) => d.handBack())))
    )
  })

  wantSnapshot(now: boolean) {
    if (now) {
      this.state.snapshotWanted = true
      this.mailbox.hold(true)
    } else if (this.state.timer === undefined) {
      this.state.timer = setTimeout(() => {
        this.state.timer = undefined
        this.wantSnapshot(true)
        this.pump()
      }, this.o.type.persistence?.maxDelayMs ?? 0)
    }
  }

  startSnapshot() {
    const state = this.state
    state.snapshotWanted = false
    if (state.timer !== undefined) clearTimeout(state.timer)
    state.timer = undefined
    const fiber = this.run(this.snapshotNow)
    state.snapshotting = fiber
    observe(fiber, (exit) => {
      state.snapshotting = undefined
      this.mailbox.hold(false)
      if (Exit.isFailure(exit)) this.fail(exit.cause)
      else this.pump()
    })
  }

  pump(): void {
    const state = this.state
    if (state.pumping || state.halted) return
    state.pumping = true
    try {
      for (;;) {
        for (let d = this.mailbox.take(); d !== undefined && !state.halted; d = this.mailbox.take()) this.start(d)
        if (!state.snapshotWanted || state.snapshotting !== undefined || this.mailbox.busy > 0 || state.halted) break
        this.startSnapshot()
        if (state.snapshotting !== undefined) break
      }
    } finally {
      state.pumping = false
    }
    if (state.stopping && this.mailbox.busy === 0 && state.snapshotting === undefined) Deferred.doneUnsafe(this.idle, Exit.void)
  }

  // Asks waiting are bounded (count and bytes); one more is refused at once, unhandled.
  offer(d: Delivery) {
    const state = this.state
    if (d.via === "ask") {
      const { maxQueuedAsks, maxQueuedAskBytes } = this.o.type
      if (state.asksWaiting >= maxQueuedAsks || state.askBytesWaiting + d.data.length > maxQueuedAskBytes) {
        this.o.metrics.handled("ask", "overloaded", undefined)
        return d.refuse(encodeOverloadedReply(`${this.o.actor} has ${state.asksWaiting} asks (${state.askBytesWaiting} bytes) waiting; retry later`))
      }
      state.asksWaiting++
      state.askBytesWaiting += d.data.length
    }
    if (!this.mailbox.offer(d)) return d.handBack()
    this.pump()
  }

  /** Hands everything back and stops acknowledging (`Dispatcher.halt`). */
  halt() {
    const state = this.state
    state.halted = true
    state.stopping = true
    if (state.timer !== undefined) clearTimeout(state.timer)
    for (const d of this.mailbox.close()) d.handBack()
    for (const d of this.book.releaseAll()) d.handBack()
    for (const [fiber, d] of this.running) {
      d.handBack()
      fiber.interruptUnsafe()
    }
  }

  /** A bounded stop (`Dispatcher.stop`). */
  stop(timeoutMs: number, halt: () => void) {
    const loop = this
    return Effect.gen(function* () {
      loop.state.stopping = true
      for (const d of loop.mailbox.close()) d.handBack()
      loop.pump()
      const finished = yield* Deferred.await(loop.idle).pipe(Effect.timeoutOption(Duration.millis(timeoutMs)))
      if (Option.isSome(finished)) {
        yield* loop.snapshotNow
        return false
      }
      if (loop.state.snapshotting !== undefined) yield* Fiber.await(loop.state.snapshotting)
      yield* Effect.logWarning(
        `${loop.o.actor}: ${loop.running.size} handler(s) still running after the stop timeout of ${timeoutMs} ms: interrupted, their messages handed back`
      )
      halt()
      return true
    })
  }
}

/** Completes `then` with the fiber's exit: at once when it is done already, else when it ends. */
const observe = <A, E>(fiber: Fiber.Fiber<A, E>, then: (exit: Exit.Exit<A, E>) => void) => {
  const done = fiber.pollUnsafe()
  if (done !== undefined) then(done)
  else fiber.addObserver(then)
}

const makeDispatcher = <S>(o: DispatchOptions<S>): Effect.Effect<DispatcherShape, never, Scope.Scope> =>
  Effect.gen(function* () {
    const run = Effect.runForkWith(yield* Effect.context<never>())
    const spans = tracing(yield* Effect.withFiber((fiber) => Effect.succeed(fiber.getRef(Tracer.Tracer))))
    const loop = new DispatchLoop(o, run, spans, yield* Deferred.make<never, unknown>(), yield* Deferred.make<void>())
    const progress = setInterval(() => loop.book.inFlight.forEach((d) => d.working()), Math.max(500, o.ackWaitMs / 3))
    const unwatch = o.metrics.watch(() => loop.mailbox.depth, () => loop.mailbox.busy)
    const halt = () => {
      clearInterval(progress)
      unwatch()
      loop.halt()
    }
    yield* Effect.addFinalizer(() => Effect.sync(halt))
    return {
      offer: (d) => loop.offer(d),
      crashed: Deferred.await(loop.crashed),
      stop: Effect.fn("Dispatcher.stop")((timeoutMs: number) => loop.stop(timeoutMs, halt)),
      halt
    } satisfies DispatcherShape
  })

/** The dispatch of one incarnation (the module comment), over its handlers, state and snapshot store. */
export class Dispatcher extends Context.Service<Dispatcher, DispatcherShape>()("gyre/runtime/Dispatcher") {
  static readonly make = makeDispatcher
  static readonly layer = <S>(options: DispatchOptions<S>) => Layer.effect(Dispatcher, makeDispatcher(options))
}
