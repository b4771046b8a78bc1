/**
 * One incarnation of an actor: from restoring its snapshot to its last acknowledgement. This
 * file is the story; each step's rules live in their own module:
 *
 *  1. restore the state and the handled ids from the last snapshot (`snapshot.ts`; one that
 *     does not decode goes to the dead-letter stream, and the type's `corruptSnapshot` says
 *     whether the actor starts from its initial state or fails);
 *  2. heartbeat: renew the address's claim (claim.ts: the registry entry, taken by the node
 *     before the start, with this incarnation's number) with the load figures;
 *  3. build the handlers (the behaviour runs in the incarnation's scope);
 *  4. the dispatch (`dispatch.ts`: mailbox, handlers, dead letters, acknowledgements and
 *     snapshots, with the bookkeeping of `mailbox.ts`);
 *  5. the intake (`intake.ts`: the durable consumer of tells and the ask subscription, feeding
 *     the dispatch from their callbacks);
 *  6. run until asked to stop (`control.drain`), until the actor stops itself (`ctx.stop`),
 *     until it is fenced, or until the dispatch crashes; then stop intake, let the dispatch
 *     finish within the type's `stopTimeoutMs`, write the last snapshot and release the claim
 *     as `stopped`.
 *
 * Fencing, the one place where an incarnation is told to stop intake and acknowledgements:
 * `control.fenced` completed (the claim was lost: a renewal found the entry written by a newer
 * incarnation or marked dead; the incarnation completes it itself), or a snapshot conflict
 * (another incarnation wrote the state). It settles nothing more (`dispatcher.halt`: everything
 * it holds goes back, unacknowledged), stops intake, writes no snapshot, leaves the registry
 * entry to the other, and ends `fenced` (never restarted). Whatever else
 * fails the incarnation crashes it: the scope closes, what it held goes back, and its
 * supervisor decides.
 */
import { Deferred, Effect, Ref } from "effect"
import type { Rpc } from "effect/rpc"
import type { ActorContext, ActorType, Handler } from "./actor.ts"
import type { Claim } from "./claim.ts"
import type { EndpointStats } from "./discovery.ts"
import { Dispatcher, scheduleDelays } from "./dispatch.ts"
import { SnapshotConflict } from "./errors.ts"
import { openIntake, publishDeadLetter } from "./intake.ts"
import { actorMetrics } from "./metrics.ts"
import { formatAddress, type ActorAddress } from "./names.ts"
import { makeSnapshotStore } from "./snapshot.ts"
import type { ChildEnd } from "./supervisor.ts"
import { speakingAs, type ActorSystemShape } from "./system.ts"

export interface HostOptions {
  readonly node: string
  readonly heartbeatMs: number
  /** JetStream ack wait of the actor's consumer; running handlers extend it. */
  readonly ackWaitMs: number
  /** Request counts and timings, read by service discovery. */
  readonly stats: EndpointStats
  /** This incarnation's claim on the address: renewed as its heartbeat; its loss fences the incarnation. */
  readonly claim: Claim
}

/** The switches of a running actor, shared by its incarnations. */
export interface IncarnationControl {
  /** Completed to drain the actor. */
  readonly drain: Deferred.Deferred<void>
  /** Completed by the first incarnation that serves (intake subscribed and flushed). */
  readonly ready: Deferred.Deferred<void>
  /**
   * Completed when the actor's address belongs to another incarnation now (a lost claim):
   * the running incarnation stops intake and acknowledgements at once and ends `fenced`.
   * Each incarnation completes it when its own claim is lost; a fenced actor is never restarted.
   */
  readonly fenced: Deferred.Deferred<void>
}

/** Tells handed back with a delay, shared by an actor's incarnations (intake.ts, `releaseOrphans`). */
const delayedTells = new WeakMap<IncarnationControl, Map<number, number>>()
const delayedOf = (control: IncarnationControl) => {
  let delayed = delayedTells.get(control)
  if (delayed === undefined) delayedTells.set(control, (delayed = new Map()))
  return delayed
}

const fencedOn = (e: unknown) => (e instanceof SnapshotConflict ? Effect.succeed("fenced" as const) : Effect.fail(e))

/** What every step of one incarnation knows: the actor, its type, the run's system and the host's switches. */
interface Incarnation<R extends Rpc.Any, S, Req> {
  readonly type: ActorType<R, S, Req>
  readonly address: ActorAddress
  /** `kind/id`. */
  readonly actor: string
  readonly system: ActorSystemShape
  readonly options: HostOptions
  readonly control: IncarnationControl
}

/** 1. Restore: the snapshot store, what it restored, and the state (restored or initial). */
const restore = <R extends Rpc.Any, S, Req>({ type, address, actor, system, options }: Incarnation<R, S, Req>) =>
  Effect.gen(function* () {
    const key = system.layout.registryKey(address)
    const quarantine = (bytes: Uint8Array, revision: number, reason: string) =>
      publishDeadLetter(system, address, bytes, undefined, { reason, subject: `$KV.${system.layout.stateBucket}.${key}`, seq: revision, actor }, `quarantine:${key}:${revision}`)
    const snapshots = makeSnapshotStore({ kv: system.state, key, actor, incarnation: options.claim.incarnation, schema: type.stateSchema, quarantine, corrupt: type.corruptSnapshot })
    const restored = yield* snapshots.restore
    const state = yield* Ref.make(restored.state !== undefined ? restored.state : type.initialState(address.id))
    return { snapshots, restored, state }
  })

/**
 * 2. Heartbeat: renewals of the claim with the load figures; a lost claim fences. 3. The
 * handlers (resources they acquire live in the incarnation's scope), and the deferred the
 * actor completes to stop itself.
 */
const behave = <R extends Rpc.Any, S, Req>({ type, address, system, options, control }: Incarnation<R, S, Req>, state: Ref.Ref<S>) =>
  Effect.gen(function* () {
    let load: Readonly<Record<string, unknown>> = {}
    yield* Effect.forkScoped(options.claim.renew(() => load, options.heartbeatMs))
    yield* Effect.forkScoped(options.claim.lost.pipe(Effect.andThen(Deferred.succeed(control.fenced, undefined))))
    const stopSelf = yield* Deferred.make<void>()
    const incarnation = options.claim.incarnation
    const ctx: ActorContext<S> = {
      address,
      incarnation,
      node: options.node,
      state,
      system: speakingAs(system, address, incarnation),
      reportLoad: (l) => {
        load = l
      },
      stop: Deferred.succeed(stopSelf, undefined).pipe(Effect.asVoid)
    }
    const handlers = (yield* type.behaviour(ctx)) as Record<string, Handler<any>>
    return { handlers, stopSelf }
  })

/** 4. Dispatch (its finalizer hands back what is left when the scope closes), then 5. intake: it closes before the dispatch hands back. */
const serve = <R extends Rpc.Any, S, Req>(
  { type, address, actor, system, options, control }: Incarnation<R, S, Req>,
  handlers: Record<string, Handler<any>>,
  { snapshots, restored, state }: Effect.Success<ReturnType<typeof restore<R, S, Req>>>
) =>
  Effect.gen(function* () {
    const dispatcher = yield* Dispatcher.make({
      actor,
      type,
      handlers,
      state,
      handled: restored.handled,
      snapshots,
      stats: options.stats,
      metrics: actorMetrics(actor, options.node, yield* Effect.context<never>()),
      redeliveryDelays: yield* scheduleDelays(type.redelivery, type.maxDeliveries),
      ackWaitMs: options.ackWaitMs
    })
    const intake = yield* openIntake({
      system,
      address,
      actor,
      ackWaitMs: options.ackWaitMs,
      maxAckPending: 256 * type.concurrency,
      delayed: delayedOf(control),
      onDelivery: dispatcher.offer
    })
    return { dispatcher, intake }
  })

/** Runs one incarnation until it ends (how, as a `ChildEnd`) or crashes (failure). */
export const runIncarnation = <R extends Rpc.Any, S, Req>(
  type: ActorType<R, S, Req>,
  address: ActorAddress,
  system: ActorSystemShape,
  options: HostOptions,
  control: IncarnationControl
): Effect.Effect<ChildEnd, unknown, Req> =>
  Effect.scoped(
    Effect.gen(function* () {
      const inc: Incarnation<R, S, Req> = { type, address, actor: formatAddress(address), system, options, control }
      const restored = yield* restore(inc)
      const { handlers, stopSelf } = yield* behave(inc, restored.state)
      const { dispatcher, intake } = yield* serve(inc, handlers, restored)
      yield* Deferred.succeed(control.ready, undefined)

      // 6. Run until asked to stop, stopping on its own, or crashing.
      const why = yield* Effect.raceAllFirst([
        dispatcher.crashed.pipe(Effect.catch(fencedOn)),
        Deferred.await(control.drain).pipe(Effect.as("stopped" as const)),
        Deferred.await(stopSelf).pipe(Effect.as("exited" as const)),
        Deferred.await(control.fenced).pipe(Effect.as("fenced" as const))
      ])
      if (why === "fenced") return yield* fenced(inc.actor, dispatcher.halt, intake.close)
      yield* intake.close
      const ended = yield* dispatcher.stop(type.stopTimeoutMs).pipe(Effect.as(why), Effect.catch(fencedOn))
      if (ended === "fenced" || !options.claim.held()) return yield* fenced(inc.actor, dispatcher.halt, Effect.void)
      yield* options.claim.release("stopped")
      return ended
    })
  )

/** Settles nothing more (at once, before intake closes), then closes intake: the incarnation ends fenced. */
const fenced = (actor: string, halt: () => void, closeIntake: Effect.Effect<void>) =>
  Effect.sync(halt).pipe(
    Effect.andThen(closeIntake),
    Effect.andThen(Effect.logWarning(`${actor}: its address or state belongs to another incarnation: fenced (intake and acknowledgements stopped)`)),
    Effect.as("fenced" as const)
  )
