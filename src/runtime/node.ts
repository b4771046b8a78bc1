/**
 * A node: the process that hosts actors on one machine.
 *
 * It knows a catalogue of actor types, spawns actors of them on request (each under its
 * type's supervision policy; an actor whose supervisor gives up is stopped, marked `failed`
 * in the registry and reported as an `escalated` system event, and the node carries on),
 * claims each actor's address first (claim.ts: a spawn of an address a live actor holds
 * elsewhere is refused with `AddressClaimed`), runs the liveness monitor and re-placement
 * (placement.ts) over one supervised view of the registry, answers NATS service discovery, and
 * drains gracefully.
 * The node is itself an actor, `node/<name>`, speaking `NodeProtocol` (Spawn, Stop, List), so
 * spawning is a tell or an ask like any other message, and its registry entry is its heartbeat.
 */
import { nuid } from "@nats-io/transport-node"
import { Deferred, Effect, Exit, Fiber, Schema, Scope } from "effect"
import { Rpc, RpcGroup } from "effect/rpc"
import * as Actor from "./actor.ts"
import { serveDiscovery, type EndpointStats } from "./discovery.ts"
import * as Claim from "./claim.ts"
import { Escalation, TransportError } from "./errors.ts"
import { runIncarnation } from "./host.ts"
import { address, formatAddress, InvalidAddress, type ActorAddress } from "./names.ts"
import { replaceDead, type NodeLoad } from "./placement.ts"
import { monitorLiveness, viewRegistry, type DeadEvent } from "./registry.ts"
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
    error: Schema.Union([UnknownActorKind, NodeDraining, InvalidAddress, Claim.AddressClaimed, TransportError])
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
  /** Device ids this node offers (for placements pinned to a device). */
  readonly devices?: ReadonlyArray<string>
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
  /** The claim of the latest incarnation. */
  claim: Claim.Claim
}

export interface NodeHandle {
  readonly name: string
  readonly spawn: (
    kind: string,
    id: string
  ) => Effect.Effect<SpawnResult, UnknownActorKind | NodeDraining | InvalidAddress | Claim.AddressClaimed | TransportError>
  /** Drains one actor and waits until it has stopped; false when it was not hosted here. */
  readonly stop: (kind: string, id: string) => Effect.Effect<boolean>
  readonly hosted: () => ReadonlyArray<{ readonly kind: string; readonly id: string; readonly restarts: number }>
  /** Stops admitting spawns, drains every actor (the node actor last) and waits for them. */
  readonly drain: Effect.Effect<void>
}

/** Starts a node in the current scope; closing the scope stops its actors abruptly (no drain). */
export const startNode = <R>(
  options: NodeOptions<R>
): Effect.Effect<NodeHandle, TransportError | Claim.AddressClaimed, ActorSystem | Scope.Scope | R> =>
  Effect.gen(function* () {
    const system = yield* ActorSystem
    const scope = yield* Effect.scope
    const context = yield* Effect.context<R>()
    const catalogue = new Map<string, Actor.ActorType<any, any, R>>(options.types.map((t) => [t.kind, t]))
    const hosted = new Map<string, Hosted>()
    const spawning = new Map<string, Deferred.Deferred<void, Claim.AddressClaimed | TransportError>>()
    const deadAfterMs = options.deadAfterMs ?? 5000
    const hostOptions = {
      node: options.name,
      heartbeatMs: options.heartbeatMs ?? 1000,
      ackWaitMs: options.ackWaitMs ?? 10_000
    }
    let draining = false

    const claim = (at: ActorAddress) =>
      Claim.acquire(system.registry, at, { holder: options.name, silentMs: deadAfterMs, whenHeld: "refuse" })

    const host = (type: Actor.ActorType<any, any, any>, at: ActorAddress, first: Claim.Claim) =>
      Effect.gen(function* () {
        const key = formatAddress(at)
        const drain = yield* Deferred.make<void>()
        const ready = yield* Deferred.make<void>()
        const stats: EndpointStats = { name: key, subject: system.layout.ask(at), numRequests: 0, numErrors: 0, lastError: "", processingTimeNs: 0 }
        const entry = { address: at, drain, ready, stats, restarts: 0, claim: first } as Omit<Hosted, "fiber"> & { restarts: number }
        const run = (c: Claim.Claim) => {
          entry.claim = c
          return runIncarnation(type, at, system, { ...hostOptions, stats, claim: c }, { drain, ready })
        }
        // Every restart claims the address again (a new incarnation); one taken meanwhile by
        // another node ends the actor here.
        const start = (n: number) =>
          n === 0
            ? run(first)
            : claim(at).pipe(
                Effect.matchEffect({
                  onFailure: (e) =>
                    e._tag === "AddressClaimed" ? Effect.logWarning(`${key}: not restarted: ${e.node} holds incarnation ${e.incarnation}`) : Effect.fail(e),
                  onSuccess: run
                })
              )
        const supervised = supervise(
          key,
          start,
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
              yield* entry.claim.release("failed")
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
        const key = formatAddress(at)
        const pending = spawning.get(key)
        if (hosted.has(key) || pending !== undefined) {
          if (pending !== undefined) yield* Deferred.await(pending)
          return { kind, id, node: options.name, alreadyRunning: true }
        }
        const done = yield* Deferred.make<void, Claim.AddressClaimed | TransportError>()
        spawning.set(key, done)
        const exit = yield* Effect.exit(claim(at).pipe(Effect.flatMap((c) => host(type, at, c))))
        spawning.delete(key)
        yield* Deferred.done(done, exit)
        if (Exit.isFailure(exit)) return yield* Effect.failCause(exit.cause)
        return { kind, id, node: options.name, alreadyRunning: false }
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

    const nodeKey = `node/${options.name}`
    const nodeLoad = (): NodeLoad => ({
      actors: [...hosted.keys()].filter((k) => k !== nodeKey).length,
      types: [...catalogue.keys()],
      devices: options.devices ?? [],
      draining
    })
    const nodeType = Actor.make({
      kind: "node",
      protocol: NodeProtocol,
      state: { schema: Schema.Struct({}), initial: () => ({}) },
      concurrency: 4,
      behaviour: (ctx) =>
        Effect.sync(() => {
          const beat = setInterval(() => ctx.reportLoad(nodeLoad()), hostOptions.heartbeatMs)
          ctx.reportLoad(nodeLoad())
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
    const nodeAddress = address("node", options.name)
    yield* host(nodeType, nodeAddress, yield* claim(nodeAddress))

    const view = yield* viewRegistry(system)
    yield* monitorLiveness(system, view, { deadAfterMs, ...(options.onDead ? { onDead: options.onDead } : {}) })
    yield* replaceDead(system, view, { node: options.name, types: catalogue, deadAfterMs, spawn, accepting: () => !draining })
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
      const others = [...hosted.values()].filter((h) => formatAddress(h.address) !== nodeKey)
      yield* Effect.forEach(others, (h) => stop(h.address.kind, h.address.id), { concurrency: "unbounded", discard: true })
      yield* stop("node", options.name)
    })

    return { name: options.name, spawn, stop, hosted: list, drain } satisfies NodeHandle
  })
