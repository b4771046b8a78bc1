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
import { Cause, Deferred, Duration, Effect, Exit, Fiber, Option, Pull, Ref, Schedule, Tracer } from "effect"
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

export interface Dispatcher {
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

export const makeDispatcher = <S>(o: DispatchOptions<S>) =>
  Effect.gen(function* () {
    const run = Effect.runForkWith(yield* Effect.context<never>())
    const { type, metrics, stats } = o
    const mailbox = new Mailbox<Delivery>(type.concurrency)
    const book = new AckBook<Delivery>(type.persistence?.everyMessages)
    const crashed = yield* Deferred.make<never, unknown>()
    const idle = yield* Deferred.make<void>()
    const running = new Map<Fiber.Fiber<unknown, unknown>, Delivery>()
    let halted = false
    let stopping = false
    let pumping = false
    let snapshotWanted = false
    let snapshotting: Fiber.Fiber<void, unknown> | undefined
    let timer: ReturnType<typeof setTimeout> | undefined

    // The handler in its `Actor.handler` span, when spans reach a backend (`tracing`). Not
    // `Effect.fn` nor `Effect.withSpan`: the first captures a call-site stack on every call
    // (measured ~5-15 us, the largest single cost of an ask), the second also provides a stack
    // frame (a second context update per message); this span is the same.
    const spans = tracing(yield* Effect.withFiber((fiber) => Effect.succeed(fiber.getRef(Tracer.Tracer))))
    const traced = (p: Prepared, d: Delivery) => {
      const handler = o.handlers[p.tag]!(p.payload, p.meta)
      if (!spans) return handler
      const parent = parseTraceparent(d.header(Headers.traceparent))
      const options = {
        kind: p.meta.via === "ask" ? "server" : "consumer",
        parent: parent === undefined ? undefined : Tracer.externalSpan(parent),
        attributes: { "gyre.actor": o.actor, "gyre.request": p.tag, "gyre.via": p.meta.via, "gyre.seq": p.meta.seq }
      } as const
      // The span is the handler's parent (its own asks and tells are its children); no stack frame provided with it.
      return Effect.useSpan("Actor.handler", options, (span) => Effect.provideService(handler, Tracer.ParentSpan, span))
    }

    // 1-2: what a message is, decided without running anything.
    const prepare = (d: Delivery, msgId: string): Prepared | string | typeof DUPLICATE => {
      if (d.via === "tell" && o.handled.has(msgId)) return DUPLICATE
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
      return { rpc, tag, payload: payload.value, meta, before: Ref.getUnsafe(o.state), started: performance.now() }
    }

    const fail = (cause: Cause.Cause<unknown>) => {
      halted = true
      Deferred.doneUnsafe(crashed, Exit.failCause(cause))
    }

    const observe = <A, E>(fiber: Fiber.Fiber<A, E>, then: (exit: Exit.Exit<A, E>) => void) => {
      const done = fiber.pollUnsafe()
      if (done !== undefined) then(done)
      else fiber.addObserver(then)
    }

    const release = () => {
      mailbox.release()
      pump()
    }

    const settleTell = (d: Delivery, changed: boolean) => {
      const s = book.settleTell(d, changed)
      if (s === "ack") d.confirm()
      else wantSnapshot(s === "snapshot")
    }

    // A dead letter that cannot be published does not crash the actor: the ask is answered
    // all the same, the tell goes back (to be dead-lettered on a later delivery).
    const reject = (d: Delivery, msgId: string, reason: string) => {
      metrics.handled(d.via, "rejected", undefined)
      metrics.deadLettered()
      observe(run(d.deadLetter(reason)), (exit) => {
        const lost = Exit.isFailure(exit)
        if (lost) run(Effect.logError(`${o.actor}: could not dead-letter a message (${reason.slice(0, 200)}): ${Cause.pretty(exit.cause)}`))
        d.answer(encodeRejectedReply(reason))
        if (d.via === "tell" && lost) d.handBack(o.redeliveryDelays.at(-1) ?? 0)
        else if (d.via === "tell") {
          o.handled.remember(msgId)
          settleTell(d, false)
        }
        release()
      })
    }

    // 3: a defect or an interruption that is not ours: hand the message back, then crash.
    const crash = (d: Delivery, cause: Cause.Cause<unknown>) => {
      halted = true
      const pretty = Cause.pretty(cause)
      if (d.via === "ask") d.answer(encodeRejectedReply(`handler crashed: ${pretty}`))
      else if (d.deliveryCount >= type.maxDeliveries) {
        metrics.deadLettered()
        const reason = `the handler crashed on each of ${d.deliveryCount} deliveries; the last time: ${pretty}`
        return observe(run(d.deadLetter(reason)), (exit) => {
          if (Exit.isSuccess(exit)) d.confirm()
          else d.handBack(o.redeliveryDelays.at(-1) ?? 0)
          fail(cause)
        })
      } else d.handBack(o.redeliveryDelays[d.deliveryCount - 1] ?? o.redeliveryDelays.at(-1) ?? 0)
      fail(cause)
    }

    const finish = (d: Delivery, p: Prepared, exit: Exit.Exit<unknown, unknown>) => {
      book.finished(d)
      const elapsed = performance.now() - p.started
      stats.numRequests++
      stats.processingTimeNs += Math.round(elapsed * 1e6)
      const failed = Exit.isFailure(exit)
      if (failed) {
        stats.numErrors++
        stats.lastError = Cause.pretty(exit.cause).slice(0, 500)
      }
      const typedFailure = failed && Cause.hasFails(exit.cause)
      metrics.handled(d.via, !failed ? "ok" : typedFailure ? "error" : "crash", elapsed / 1000)
      if (d.settled) return release() // handed back by a stop that could not wait
      if (failed && !typedFailure) return crash(d, exit.cause)
      const changed = Ref.getUnsafe(o.state) !== p.before
      if (d.via === "ask") {
        d.reply = encodeExitReply(p.rpc, exit)
        if (book.settleAsk(d, changed) === "reply") d.confirm()
        else wantSnapshot(true)
      } else {
        o.handled.remember(p.meta.msgId)
        if (failed) run(Effect.logWarning(`${o.actor}: ${p.tag} (seq ${d.seq}) failed: ${Cause.pretty(exit.cause)}`))
        settleTell(d, changed)
      }
      release()
    }

    const start = (d: Delivery) => {
      if (d.via === "ask") {
        asksWaiting--
        askBytesWaiting -= d.data.length
      }
      if (d.via === "tell" && d.deliveryCount > 1) metrics.redelivered()
      const msgId = d.header(Headers.msgId) || (d.via === "tell" ? `seq:${d.seq}` : nuid.next())
      const p = prepare(d, msgId)
      if (p === DUPLICATE) {
        metrics.handled(d.via, "duplicate", undefined)
        if (d.via === "tell") settleTell(d, false)
        return release()
      }
      if (typeof p === "string") return reject(d, msgId, p)
      if (d.via === "tell") book.started(d)
      const fiber = run(traced(p, d))
      if (fiber.pollUnsafe() === undefined) running.set(fiber, d)
      observe(fiber, (exit) => {
        running.delete(fiber)
        finish(d, p, exit)
      })
    }

    // Snapshots: written when wanted and no handler runs; the mailbox is held meanwhile.
    const snapshotNow = Effect.suspend(() => {
      const { write, confirm } = book.takeForSnapshot()
      if (!write) {
        for (const d of confirm) d.confirm()
        return Effect.void
      }
      return o.snapshots.write(Ref.getUnsafe(o.state), o.handled).pipe(
        Effect.tap(() => Effect.sync(() => confirm.forEach((d) => d.confirm()))),
        Effect.tapError(() => Effect.sync(() => confirm.forEach((d) => d.handBack())))
      )
    })

    const wantSnapshot = (now: boolean) => {
      if (now) {
        snapshotWanted = true
        mailbox.hold(true)
      } else if (timer === undefined) {
        timer = setTimeout(() => {
          timer = undefined
          wantSnapshot(true)
          pump()
        }, type.persistence?.maxDelayMs ?? 0)
      }
    }

    const startSnapshot = () => {
      snapshotWanted = false
      if (timer !== undefined) clearTimeout(timer)
      timer = undefined
      const fiber = run(snapshotNow)
      snapshotting = fiber
      observe(fiber, (exit) => {
        snapshotting = undefined
        mailbox.hold(false)
        if (Exit.isFailure(exit)) fail(exit.cause)
        else pump()
      })
    }

    const pump = (): void => {
      if (pumping || halted) return
      pumping = true
      try {
        for (;;) {
          for (let d = mailbox.take(); d !== undefined && !halted; d = mailbox.take()) start(d)
          if (!snapshotWanted || snapshotting !== undefined || mailbox.busy > 0 || halted) break
          startSnapshot()
          if (snapshotting !== undefined) break
        }
      } finally {
        pumping = false
      }
      if (stopping && mailbox.busy === 0 && snapshotting === undefined) Deferred.doneUnsafe(idle, Exit.void)
    }

    // Asks waiting are bounded (count and bytes); one more is refused at once, unhandled.
    let asksWaiting = 0
    let askBytesWaiting = 0
    const offer = (d: Delivery) => {
      if (d.via === "ask") {
        if (asksWaiting >= type.maxQueuedAsks || askBytesWaiting + d.data.length > type.maxQueuedAskBytes) {
          metrics.handled("ask", "overloaded", undefined)
          return d.refuse(encodeOverloadedReply(`${o.actor} has ${asksWaiting} asks (${askBytesWaiting} bytes) waiting; retry later`))
        }
        asksWaiting++
        askBytesWaiting += d.data.length
      }
      if (!mailbox.offer(d)) return d.handBack()
      pump()
    }

    const progress = setInterval(() => book.inFlight.forEach((d) => d.working()), Math.max(500, o.ackWaitMs / 3))
    const unwatch = metrics.watch(() => mailbox.depth, () => mailbox.busy)

    const halt = () => {
      halted = true
      stopping = true
      clearInterval(progress)
      unwatch()
      if (timer !== undefined) clearTimeout(timer)
      for (const d of mailbox.close()) d.handBack()
      for (const d of book.releaseAll()) d.handBack()
      for (const [fiber, d] of running) {
        d.handBack()
        fiber.interruptUnsafe()
      }
    }

    const stop = (timeoutMs: number) =>
      Effect.gen(function* () {
        stopping = true
        for (const d of mailbox.close()) d.handBack()
        pump()
        const finished = yield* Deferred.await(idle).pipe(Effect.timeoutOption(Duration.millis(timeoutMs)))
        if (Option.isSome(finished)) {
          yield* snapshotNow
          return false
        }
        if (snapshotting !== undefined) yield* Fiber.await(snapshotting)
        yield* Effect.logWarning(`${o.actor}: ${running.size} handler(s) still running after the stop timeout of ${timeoutMs} ms: interrupted, their messages handed back`)
        halt()
        return true
      })

    yield* Effect.addFinalizer(() => Effect.sync(halt))
    return { offer, crashed: Deferred.await(crashed), stop, halt } satisfies Dispatcher
  })
