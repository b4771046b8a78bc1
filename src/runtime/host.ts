/**
 * One incarnation of an actor: from restoring its snapshot to its last acknowledgement. This
 * file is the story; each step's rules live in their own module:
 *
 *  1. restore the state and the handled ids from the last snapshot (`snapshot.ts`);
 *  2. register in the registry and heartbeat;
 *  3. build the handlers (the behaviour runs in the incarnation's scope);
 *  4. the dispatch (`dispatch.ts`: mailbox, handlers, dead letters, acknowledgements and
 *     snapshots, with the bookkeeping of `mailbox.ts`);
 *  5. the intake (`intake.ts`: the durable consumer of tells and the ask subscription, feeding
 *     the dispatch from their callbacks);
 *  6. run until asked to stop (`control.drain`), until the actor stops itself (`ctx.stop`),
 *     until it is fenced, or until the dispatch crashes; then stop intake, let the dispatch
 *     finish within the type's `stopTimeoutMs`, write the last snapshot and mark the entry
 *     `stopped`.
 *
 * Fencing, the one place where an incarnation is told to stop intake and acknowledgements:
 * `control.fenced` completed (the address is claimed by another incarnation), or a snapshot
 * conflict (another incarnation wrote the state). It stops intake and settles nothing more
 * (`dispatcher.halt`: everything it holds goes back, unacknowledged), leaves the registry
 * entry to the other, and ends `fenced` (never restarted). Whatever else
 * fails the incarnation crashes it: the scope closes, what it held goes back, and its
 * supervisor decides.
 */
import { nuid } from "@nats-io/transport-node"
import type { KV } from "@nats-io/kv"
import { Deferred, Effect, Ref } from "effect"
import type { Rpc } from "effect/rpc"
import type { ActorContext, ActorType, Handler } from "./actor.ts"
import type { EndpointStats } from "./discovery.ts"
import { makeDispatcher, scheduleDelays } from "./dispatch.ts"
import { SnapshotConflict } from "./errors.ts"
import { openIntake } from "./intake.ts"
import { actorMetrics } from "./metrics.ts"
import { formatAddress, type ActorAddress } from "./names.ts"
import { RegistryEntry, heartbeatLoop, writeEntry } from "./registry.ts"
import { makeSnapshotStore } from "./snapshot.ts"
import type { ChildEnd } from "./supervisor.ts"
import type { ActorSystemShape } from "./system.ts"

export interface HostOptions {
  readonly node: string
  readonly heartbeatMs: number
  /** JetStream ack wait of the actor's consumer; running handlers extend it. */
  readonly ackWaitMs: number
  /** Request counts and timings, read by service discovery. */
  readonly stats: EndpointStats
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
   */
  readonly fenced?: Deferred.Deferred<void>
}

/** Writes the incarnation's registry entry now and on every heartbeat, with its load figures. */
const register = (registry: KV, key: string, base: Omit<RegistryEntry, "status" | "heartbeatAt" | "load">, heartbeatMs: number) =>
  Effect.gen(function* () {
    let load: Readonly<Record<string, unknown>> = {}
    const entry = (status: RegistryEntry["status"]): RegistryEntry => ({ ...base, status, heartbeatAt: Date.now(), load })
    yield* writeEntry(registry, key, entry("running"))
    yield* Effect.forkScoped(heartbeatLoop(registry, key, () => entry("running"), heartbeatMs))
    return {
      reportLoad: (l: Readonly<Record<string, unknown>>) => {
        load = l
      },
      write: (status: RegistryEntry["status"]) => writeEntry(registry, key, entry(status))
    }
  })

const fencedOn = (e: unknown) => (e instanceof SnapshotConflict ? Effect.succeed("fenced" as const) : Effect.fail(e))

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
      const actor = formatAddress(address)
      const key = system.layout.registryKey(address)
      const incarnation = nuid.next()

      // 1. Restore.
      const snapshots = makeSnapshotStore({ kv: system.state, key, actor, incarnation, schema: type.stateSchema })
      const restored = yield* snapshots.restore
      const state = yield* Ref.make(restored.state !== undefined ? restored.state : type.initialState(address.id))

      // 2. Register and heartbeat.
      const registration = yield* register(system.registry, key, { kind: address.kind, id: address.id, node: options.node, incarnation }, options.heartbeatMs)

      // 3. Handlers (resources they acquire live in this scope).
      const stopSelf = yield* Deferred.make<void>()
      const ctx: ActorContext<S> = {
        address,
        incarnation,
        node: options.node,
        state,
        system,
        reportLoad: registration.reportLoad,
        stop: Deferred.succeed(stopSelf, undefined).pipe(Effect.asVoid)
      }
      const handlers = (yield* type.behaviour(ctx)) as Record<string, Handler<any>>

      // 4. Dispatch: its finalizer hands back what is left when the scope closes.
      const dispatcher = yield* makeDispatcher({
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

      // 5. Intake: opened after the dispatch, so it closes before the dispatch hands back.
      const intake = yield* openIntake({
        system,
        address,
        actor,
        ackWaitMs: options.ackWaitMs,
        maxAckPending: 256 * type.concurrency,
        onDelivery: dispatcher.offer
      })
      yield* Deferred.succeed(control.ready, undefined)

      // 6. Run until asked to stop, stopping on its own, or crashing.
      const why = yield* Effect.raceAllFirst([
        dispatcher.crashed.pipe(Effect.catch(fencedOn)),
        Deferred.await(control.drain).pipe(Effect.as("stopped" as const)),
        Deferred.await(stopSelf).pipe(Effect.as("exited" as const)),
        ...(control.fenced !== undefined ? [Deferred.await(control.fenced).pipe(Effect.as("fenced" as const))] : [])
      ])
      yield* intake.close
      if (why === "fenced") return yield* fenced(actor, dispatcher.halt)
      const ended = yield* dispatcher.stop(type.stopTimeoutMs).pipe(Effect.as(why), Effect.catch(fencedOn))
      if (ended === "fenced") return yield* fenced(actor, dispatcher.halt)
      yield* registration.write("stopped")
      return ended
    })
  )

const fenced = (actor: string, halt: () => void) =>
  Effect.sync(halt).pipe(
    Effect.andThen(Effect.logWarning(`${actor}: another incarnation wrote its state: fenced (intake and acknowledgements stopped)`)),
    Effect.as("fenced" as const)
  )
