/**
 * A node: the process that hosts actors on one machine.
 *
 * It knows a catalogue of actor types, spawns actors of them on request (each under its
 * type's supervision policy; an actor whose supervisor gives up is stopped, marked `failed`
 * in the registry and reported as an `escalated` system event, and the node carries on),
 * runs the liveness monitor, answers NATS service discovery, and drains gracefully.
 * The node is itself an actor, `node/<name>`, speaking `NodeProtocol` (Spawn, Stop, List), so
 * spawning is a tell or an ask like any other message, and its registry entry is its heartbeat.
 */
import { nuid } from "@nats-io/transport-node"
import { Deferred, Effect, Fiber, Schema, Scope } from "effect"
import { Rpc, RpcGroup } from "effect/rpc"
import * as Actor from "./actor.ts"
import { serveDiscovery, type EndpointStats } from "./discovery.ts"
import { Escalation, type TransportError } from "./errors.ts"
import { runIncarnation } from "./host.ts"
import { address, formatAddress, InvalidAddress, type ActorAddress } from "./names.ts"
import { monitorLiveness, writeEntry, type DeadEvent } from "./registry.ts"
import { supervise } from "./supervisor.ts"
import { ActorSystem, refOf } from "./system.ts"

export class UnknownActorKind extends Schema.TaggedError<UnknownActorKind>()("UnknownActorKind", {
  kind: Schema.String,
  node: Schema.String,
  known: Schema.Array(Schema.String)
}) {}

export class NodeDraining extends Schema.TaggedError<NodeDraining>()("NodeDraining", {
  node: Schema.String
}) {}

export const SpawnResult = Schema.Struct({
  kind: Schema.String,
  id: Schema.String,
  node: Schema.String,
  alreadyRunning: Schema.Boolean
})
export type SpawnResult = typeof SpawnResult.Type

export const HostedActor = Schema.Struct({
  kind: Schema.String,
  id: Schema.String,
  restarts: Schema.Number
})

const ActorId = { kind: Schema.String, id: Schema.String }

export const NodeProtocol = RpcGroup.make(
  Rpc.make("Spawn", {
    payload: ActorId,
    success: SpawnResult,
    error: Schema.Union([UnknownActorKind, NodeDraining, InvalidAddress])
  }),
  Rpc.make("Stop", { payload: ActorId, success: Schema.Struct({ stopped: Schema.Boolean }) }),
  Rpc.make("List", { success: Schema.Array(HostedActor) })
)

/** A reference to the node actor of `name`. */
export const nodeRef = (name: string) => refOf(NodeProtocol, address("node", name))

export interface NodeOptions<R> {
  readonly name: string
  readonly types: ReadonlyArray<Actor.ActorType<any, any, R>>
  readonly heartbeatMs?: number
  readonly deadAfterMs?: number
  readonly ackWaitMs?: number
  readonly version?: string
  /** Called when the liveness monitor declares an actor dead. */
  readonly onDead?: (event: DeadEvent) => Effect.Effect<void>
}

interface Hosted {
  readonly address: ActorAddress
  readonly drain: Deferred.Deferred<void>
  readonly ready: Deferred.Deferred<void>
  readonly fiber: Fiber.Fiber<void, never>
  readonly stats: EndpointStats
  restarts: number
}

export interface NodeHandle {
  readonly name: string
  readonly spawn: (kind: string, id: string) => Effect.Effect<SpawnResult, UnknownActorKind | NodeDraining | InvalidAddress>
  /** Drains one actor and waits until it has stopped; false when it was not hosted here. */
  readonly stop: (kind: string, id: string) => Effect.Effect<boolean>
  readonly hosted: () => ReadonlyArray<{ readonly kind: string; readonly id: string; readonly restarts: number }>
  /** Stops admitting spawns, drains every actor (the node actor last) and waits for them. */
  readonly drain: Effect.Effect<void>
}

/** Starts a node in the current scope; closing the scope stops its actors abruptly (no drain). */
export const startNode = <R>(options: NodeOptions<R>): Effect.Effect<NodeHandle, TransportError, ActorSystem | Scope.Scope | R> =>
  Effect.gen(function* () {
    const system = yield* ActorSystem
    const scope = yield* Effect.scope
    const context = yield* Effect.context<R>()
    const catalogue = new Map<string, Actor.ActorType<any, any, R>>(options.types.map((t) => [t.kind, t]))
    const hosted = new Map<string, Hosted>()
    const hostOptions = {
      node: options.name,
      heartbeatMs: options.heartbeatMs ?? 1000,
      ackWaitMs: options.ackWaitMs ?? 10_000
    }
    let draining = false

    const host = (type: Actor.ActorType<any, any, any>, at: ActorAddress) =>
      Effect.gen(function* () {
        const key = formatAddress(at)
        const drain = yield* Deferred.make<void>()
        const ready = yield* Deferred.make<void>()
        const stats: EndpointStats = { name: key, subject: system.layout.ask(at), numRequests: 0, numErrors: 0, lastError: "", processingTimeNs: 0 }
        const entry = { address: at, drain, ready, stats, restarts: 0 } as Omit<Hosted, "fiber"> & { restarts: number }
        const supervised = supervise(
          key,
          () => runIncarnation(type, at, system, { ...hostOptions, stats }, { drain, ready }),
          type.supervision,
          (start, cause) =>
            Effect.gen(function* () {
              entry.restarts = start
              yield* Effect.logWarning(`${key} crashed; restart ${start}`, cause)
            })
        ).pipe(
          Effect.catch((e: Escalation) =>
            Effect.gen(function* () {
              yield* Effect.logError(`${key}: supervisor gave up after ${e.restarts} restarts within ${e.withinMs} ms`)
              yield* writeEntry(system.registry, system.layout.registryKey(at), {
                kind: at.kind,
                id: at.id,
                node: options.name,
                incarnation: "",
                status: "failed",
                heartbeatAt: Date.now(),
                load: {}
              }).pipe(Effect.ignore)
              yield* system
                .publishEvent("escalated", { kind: at.kind, id: at.id, node: options.name, restarts: e.restarts, withinMs: e.withinMs, lastFailure: e.lastFailure })
                .pipe(Effect.ignore)
            })
          ),
          Effect.ensuring(Effect.sync(() => hosted.delete(key))),
          Effect.provideContext(context)
        ) as Effect.Effect<void, never>
        const fiber = yield* Effect.forkIn(supervised, scope)
        hosted.set(key, Object.assign(entry, { fiber }))
        // Serving, or given up on (a crash loop escalates instead of becoming ready).
        yield* Effect.raceFirst(Deferred.await(ready), Fiber.await(fiber).pipe(Effect.asVoid))
      })

    const spawn: NodeHandle["spawn"] = (kind, id) =>
      Effect.gen(function* () {
        if (draining) return yield* Effect.fail(new NodeDraining({ node: options.name }))
        const at = yield* Effect.try({ try: () => address(kind, id), catch: (e) => e as InvalidAddress })
        const type = catalogue.get(kind)
        if (type === undefined) {
          return yield* Effect.fail(new UnknownActorKind({ kind, node: options.name, known: [...catalogue.keys()] }))
        }
        const alreadyRunning = hosted.has(formatAddress(at))
        if (!alreadyRunning) yield* host(type, at)
        return { kind, id, node: options.name, alreadyRunning }
      })

    const stop: NodeHandle["stop"] = (kind, id) =>
      Effect.gen(function* () {
        const h = hosted.get(`${kind}/${id}`)
        if (h === undefined) return false
        yield* Deferred.succeed(h.drain, undefined)
        yield* Fiber.await(h.fiber)
        return true
      })

    const list = () => [...hosted.values()].map((h) => ({ kind: h.address.kind, id: h.address.id, restarts: h.restarts }))

    const nodeType = Actor.make({
      kind: "node",
      protocol: NodeProtocol,
      state: { schema: Schema.Struct({}), initial: () => ({}) },
      concurrency: 4,
      behaviour: (ctx) =>
        Effect.sync(() => {
          const beat = setInterval(() => ctx.reportLoad({ actors: hosted.size - 1, types: [...catalogue.keys()] }), hostOptions.heartbeatMs)
          ctx.reportLoad({ actors: hosted.size, types: [...catalogue.keys()] })
          return { beat }
        }).pipe(
          Effect.tap(({ beat }) => Effect.addFinalizer(() => Effect.sync(() => clearInterval(beat)))),
          Effect.as({
            Spawn: ({ kind, id }) => spawn(kind, id),
            Stop: ({ kind, id }) => (kind === "node" ? Effect.succeed({ stopped: false }) : stop(kind, id).pipe(Effect.map((stopped) => ({ stopped })))),
            List: () => Effect.succeed(list())
          })
        )
    })
    yield* host(nodeType, address("node", options.name))

    yield* monitorLiveness(system, { deadAfterMs: options.deadAfterMs ?? 5000, ...(options.onDead ? { onDead: options.onDead } : {}) })
    yield* serveDiscovery(system.nats.nc, {
      id: nuid.next(),
      version: options.version ?? "0.1.0",
      description: `Gyre node ${options.name} of run ${system.run}`,
      metadata: { "gyre.node": options.name, "gyre.run": system.run, "gyre.types": [...catalogue.keys()].join(",") },
      started: new Date(),
      endpoints: () => [...hosted.values()].map((h) => h.stats)
    })

    const drain = Effect.gen(function* () {
      draining = true
      const nodeKey = `node/${options.name}`
      const others = [...hosted.values()].filter((h) => formatAddress(h.address) !== nodeKey)
      yield* Effect.forEach(others, (h) => stop(h.address.kind, h.address.id), { concurrency: "unbounded", discard: true })
      yield* stop("node", options.name)
    })

    return { name: options.name, spawn, stop, hosted: list, drain } satisfies NodeHandle
  })
