/**
 * A node: the process that hosts actors on one machine.
 *
 * It knows a catalogue of actor types and spawns actors of them on request, each under its
 * type's supervision policy and restart type (`supervisor.ts`), alone (one-for-one) or in a
 * group that restarts together (one-for-all). Every start claims the actor's address first
 * (claim.ts: a spawn of an address a live actor holds elsewhere is refused with
 * `AddressClaimed`; a restart whose address was taken meanwhile ends the actor `fenced`). An
 * actor whose supervisor gives up is stopped, marked `failed` in the registry and reported as
 * an `escalated` system event; a temporary actor that crashes is marked `failed`; one fenced by
 * another incarnation is reported as a `fenced` event. The node carries on in every case. It
 * runs the liveness monitor and re-placement (placement.ts) over one supervised view of the
 * registry, answers NATS service discovery, serves Prometheus metrics when given a port, and
 * drains gracefully.
 * The node is itself an actor, `node/<name>`, speaking `NodeProtocol` (Spawn, SpawnGroup,
 * Stop, List), so spawning is a tell or an ask like any other message, and its registry entry
 * is its heartbeat. Settings not given as options are read from `RuntimeSettings` (config.ts)
 * when the node starts.
 */
import { nuid } from "@nats-io/transport-node"
import { Cause, Context, Deferred, Duration, Effect, Exit, Layer, Result, Schedule, Schema, Scope } from "effect"
import type { ConfigError } from "effect/Config"
import { Rpc, RpcGroup } from "effect/rpc"
import * as Actor from "./actor.ts"
import * as Claim from "./claim.ts"
import { RuntimeSettings } from "./config.ts"
import { serveDiscovery, type EndpointStats } from "./discovery.ts"
import { Escalation, TransportError } from "./errors.ts"
import { Escalated, Fenced } from "./events.ts"
import { runIncarnation, type IncarnationControl } from "./host.ts"
import { serveMetrics, type MetricsServerError } from "./metrics.ts"
import { address, formatAddress, InvalidAddress, type ActorAddress } from "./names.ts"
import { GroupSpec, groupAddress, replaceDead, type NodeLoad } from "./placement.ts"
import { monitorLiveness, readEntry, viewRegistry, type DeadEvent } from "./registry.ts"
import { defaultSupervision, supervise, superviseGroup, type ChildEnd, type ChildSpec, type OnRestart, type SupervisionPolicy } from "./supervisor.ts"
import { ActorSystem, refOf, type ActorSystemShape } from "./system.ts"

export class UnknownActorKind extends Schema.TaggedError<UnknownActorKind>()("UnknownActorKind", {
  kind: Schema.String,
  node: Schema.String,
  known: Schema.Array(Schema.String)
}) {}

export class NodeDraining extends Schema.TaggedError<NodeDraining>()("NodeDraining", {
  node: Schema.String
}) {}

/** A group was asked for with a member this node already hosts. */
export class AlreadyHosted extends Schema.TaggedError<AlreadyHosted>()("AlreadyHosted", {
  kind: Schema.String,
  id: Schema.String,
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
  restarts: Schema.Number,
  /** The group it was spawned in, if any. */
  group: Schema.optional(Schema.String)
})
export type HostedActor = typeof HostedActor.Type

const ActorId = { kind: Schema.String, id: Schema.String }

const SpawnError = Schema.Union([UnknownActorKind, NodeDraining, InvalidAddress, AlreadyHosted, Claim.AddressClaimed, TransportError])

export const NodeProtocol = RpcGroup.make(
  Rpc.make("Spawn", { payload: ActorId, success: SpawnResult, error: SpawnError }),
  Rpc.make("SpawnGroup", { payload: GroupSpec, success: Schema.Array(SpawnResult), error: SpawnError }),
  Rpc.make("Stop", { payload: ActorId, success: Schema.Struct({ stopped: Schema.Boolean }) }),
  Rpc.make("List", { success: Schema.Array(HostedActor) })
)

/** A reference to the node actor of `name`. */
export const nodeRef = (name: string) => refOf(NodeProtocol, address("node", name))

export interface NodeOptions<R> {
  readonly name: string
  readonly types: ReadonlyArray<Actor.ActorType<any, any, R>>
  /** Defaults from `RuntimeSettings` (GYRE_HEARTBEAT_MS, GYRE_DEAD_AFTER_MS, GYRE_ACK_WAIT_MS, GYRE_METRICS_PORT). */
  readonly heartbeatMs?: number
  readonly deadAfterMs?: number
  readonly ackWaitMs?: number
  /** Serve Prometheus `/metrics` on 127.0.0.1 at this port (0 = any free port). */
  readonly metricsPort?: number
  readonly version?: string
  /** Device ids this node offers (for placements pinned to a device). */
  readonly devices?: ReadonlyArray<string>
  /** Called when the liveness monitor declares an actor dead. */
  readonly onDead?: (event: DeadEvent) => Effect.Effect<void>
}

interface Hosted {
  readonly address: ActorAddress
  readonly control: IncarnationControl
  /** Completed when the actor has ended for good. */
  readonly ended: Deferred.Deferred<void>
  readonly stats: EndpointStats
  readonly group: string | undefined
  restarts: number
  /** Ended for good by a failure (an escalation, a temporary actor's crash). */
  failed: boolean
  /** The claim of the latest incarnation. */
  claim: Claim.Claim
}

export type SpawnError = UnknownActorKind | NodeDraining | InvalidAddress | AlreadyHosted | Claim.AddressClaimed | TransportError

export interface NodeHandle {
  readonly name: string
  readonly spawn: (kind: string, id: string) => Effect.Effect<SpawnResult, SpawnError>
  /**
   * Spawns `members` under one supervisor: `one-for-all` restarts them all when one is to be
   * restarted (`supervision`, default the first member type's policy, counts those restarts).
   */
  readonly spawnGroup: (group: GroupSpec, supervision?: SupervisionPolicy) => Effect.Effect<ReadonlyArray<SpawnResult>, SpawnError>
  /** Drains one actor and waits until it has stopped; false when it was not hosted here. */
  readonly stop: (kind: string, id: string) => Effect.Effect<boolean>
  readonly hosted: () => ReadonlyArray<HostedActor>
  /** Stops admitting spawns, drains every actor (the node actor last) and waits for them. */
  readonly drain: Effect.Effect<void>
  /** Where `/metrics` is served, when it is. */
  readonly metricsUrl: string | undefined
}

/** What a node's operations share: its options and settings, its scope and context, what it hosts. */
interface NodeContext<R> {
  readonly options: NodeOptions<R>
  readonly system: ActorSystemShape
  readonly deadAfterMs: number
  readonly hostOptions: { readonly node: string; readonly heartbeatMs: number; readonly ackWaitMs: number }
  readonly scope: Scope.Scope
  readonly context: Context.Context<R>
  readonly catalogue: Map<string, Actor.ActorType<any, any, R>>
  readonly hosted: Map<string, Hosted>
  /** Spawns whose claim is being taken, so a concurrent spawn of the same address waits for it. */
  readonly spawning: Map<string, Deferred.Deferred<void, Claim.AddressClaimed | TransportError>>
  readonly state: { draining: boolean }
}

const claim = <R>(n: NodeContext<R>, at: ActorAddress, load?: Readonly<Record<string, unknown>>) =>
  Claim.acquire(n.system.registry, at, { holder: n.options.name, silentMs: n.deadAfterMs, whenHeld: "refuse", ...(load ? { load } : {}) })

/** Claims every address (each with its first load), or none: on a failure the claims taken so far are released. */
const claimAll = <R>(n: NodeContext<R>, ats: ReadonlyArray<readonly [ActorAddress, Readonly<Record<string, unknown>> | undefined]>) =>
  Effect.gen(function* () {
    const taken: Array<Claim.Claim> = []
    for (const [at, load] of ats) {
      taken.push(yield* claim(n, at, load).pipe(Effect.onError(() => Effect.forEach(taken, (c) => c.release("stopped"), { discard: true }))))
    }
    return taken
  })

const admit = <R>(n: NodeContext<R>, at: ActorAddress, group: string | undefined, first: Claim.Claim) =>
  Effect.gen(function* () {
    const key = formatAddress(at)
    const stats: EndpointStats = { name: key, subject: n.system.layout.ask(at), numRequests: 0, numErrors: 0, lastError: "", processingTimeNs: 0 }
    const entry: Hosted = {
      address: at,
      control: { drain: yield* Deferred.make<void>(), ready: yield* Deferred.make<void>(), fenced: yield* Deferred.make<void>() },
      ended: yield* Deferred.make<void>(),
      stats,
      group,
      restarts: 0,
      failed: false,
      claim: first
    }
    n.hosted.set(key, entry)
    return entry
  })

// Every start after the first claims the address again (a new incarnation); an address
// taken meanwhile by another node ends the actor here, fenced.
const child = <R>(n: NodeContext<R>, type: Actor.ActorType<any, any, any>, entry: Hosted): ChildSpec<unknown, R> => {
  const name = formatAddress(entry.address)
  const run = (c: Claim.Claim) => {
    entry.claim = c
    return runIncarnation(type, entry.address, n.system, { ...n.hostOptions, stats: entry.stats, claim: c }, entry.control) as Effect.Effect<ChildEnd, unknown, R>
  }
  return {
    name,
    restart: type.restart,
    run: (start) =>
      start === 0
        ? run(entry.claim)
        : claim(n, entry.address).pipe(
            Effect.matchEffect({
              onFailure: (e) =>
                e._tag === "AddressClaimed"
                  ? Effect.logWarning(`${name}: not restarted: ${e.node} holds incarnation ${e.incarnation}`).pipe(Effect.as("fenced" as const))
                  : Effect.fail(e),
              onSuccess: run
            })
          )
  }
}

const onRestart =
  <R>(n: NodeContext<R>): OnRestart =>
  (name, start, exit) =>
    Effect.gen(function* () {
      const entry = n.hosted.get(name)
      if (entry !== undefined) entry.restarts = start
      if (Exit.isFailure(exit)) yield* Effect.logWarning(`${name} crashed; restart ${start}`, exit.cause)
      else yield* Effect.logInfo(`${name} ended (${exit.value}); restart ${start}`)
    })

// An actor ended for good: report how, and forget it.
const leave = <R>(n: NodeContext<R>, entry: Hosted, exit: Exit.Exit<ChildEnd, unknown>) =>
  Effect.gen(function* () {
    const at = entry.address
    const key = formatAddress(at)
    const node = n.options.name
    if (Exit.isFailure(exit) && !Cause.hasInterruptsOnly(exit.cause)) {
      entry.failed = true
      const error = Cause.findError(exit.cause)
      yield* entry.claim.release("failed")
      if (Result.isSuccess(error) && error.success instanceof Escalation) {
        const e = error.success
        yield* Effect.logError(`${key}: supervisor ${e.child} gave up after ${e.restarts} restarts within ${e.withinMs} ms`)
        yield* n.system.publishEvent(Escalated, { kind: at.kind, id: at.id, node, restarts: e.restarts, withinMs: e.withinMs, lastFailure: e.lastFailure }).pipe(Effect.ignore)
      } else yield* Effect.logError(`${key} crashed and is not restarted (restart: temporary)`, exit.cause)
    } else if (Exit.isSuccess(exit) && exit.value === "fenced") {
      yield* n.system.publishEvent(Fenced, { kind: at.kind, id: at.id, node }).pipe(Effect.ignore)
    }
    n.hosted.delete(key)
    yield* Deferred.succeed(entry.ended, undefined)
  })

// Serving, or given up on (a crash loop escalates instead of becoming ready).
const serving = (entries: ReadonlyArray<Hosted>) =>
  Effect.forEach(entries, (e) => Effect.raceFirst(Deferred.await(e.control.ready), Deferred.await(e.ended)), { discard: true })

/** Runs `effect` in the node's scope, with the node's context. */
const runIn = <R>(n: NodeContext<R>, effect: Effect.Effect<void, never, R>) => Effect.forkIn(effect.pipe(Effect.provideContext(n.context)), n.scope)

const hostOne = <R>(n: NodeContext<R>, type: Actor.ActorType<any, any, R>, at: ActorAddress, first: Claim.Claim, group?: string) =>
  Effect.gen(function* () {
    const entry = yield* admit(n, at, group, first)
    yield* runIn(n, Effect.exit(supervise(child(n, type, entry), type.supervision, onRestart(n))).pipe(Effect.flatMap((exit) => leave(n, entry, exit))))
    return entry
  })

const hostAll = <R>(
  n: NodeContext<R>,
  name: string,
  members: ReadonlyArray<readonly [Actor.ActorType<any, any, R>, ActorAddress]>,
  claims: ReadonlyArray<Claim.Claim>,
  policy: SupervisionPolicy
) =>
  Effect.gen(function* () {
    const entries = yield* Effect.forEach(members, ([, at], i) => admit(n, at, name, claims[i]!))
    const byName = new Map(entries.map((e) => [formatAddress(e.address), e]))
    const children = members.map(([type], i) => child(n, type, entries[i]!))
    const restartAll: OnRestart = (c, start, exit) =>
      onRestart(n)(c, start, exit).pipe(Effect.tap(() => Effect.sync(() => entries.forEach((e) => (e.restarts = start)))))
    const group = superviseGroup(name, children, policy, restartAll, (c, exit) => leave(n, byName.get(c)!, exit))
    // What is still hosted when the group ends failed with it (an escalation).
    const stillHere = (exit: Exit.Exit<void, unknown>) =>
      Effect.forEach(entries.filter((e) => n.hosted.get(formatAddress(e.address)) === e), (e) => leave(n, e, exit as Exit.Exit<never, unknown>), { discard: true })
    yield* runIn(n, Effect.exit(group).pipe(Effect.flatMap(stillHere)))
    return entries
  })

const resolve = <R>(n: NodeContext<R>, kind: string, id: string) =>
  Effect.gen(function* () {
    if (n.state.draining) return yield* Effect.fail(new NodeDraining({ node: n.options.name }))
    const at = yield* Effect.try({ try: () => address(kind, id), catch: (e) => e as InvalidAddress })
    const type = n.catalogue.get(kind)
    if (type === undefined) return yield* Effect.fail(new UnknownActorKind({ kind, node: n.options.name, known: [...n.catalogue.keys()] }))
    return [type, at] as const
  })

const spawn = <R>(n: NodeContext<R>): NodeHandle["spawn"] =>
  Effect.fn("Node.spawn")(function* (kind: string, id: string) {
    const [type, at] = yield* resolve(n, kind, id)
    const key = formatAddress(at)
    const pending = n.spawning.get(key)
    if (n.hosted.has(key) || pending !== undefined) {
      if (pending !== undefined) yield* Deferred.await(pending)
      return { kind, id, node: n.options.name, alreadyRunning: true }
    }
    const done = yield* Deferred.make<void, Claim.AddressClaimed | TransportError>()
    n.spawning.set(key, done)
    const exit = yield* Effect.exit(claim(n, at).pipe(Effect.flatMap((c) => hostOne(n, type, at, c))))
    n.spawning.delete(key)
    yield* Deferred.done(done, Exit.asVoid(exit))
    if (Exit.isFailure(exit)) return yield* Effect.failCause(exit.cause)
    yield* serving([exit.value])
    return { kind, id, node: n.options.name, alreadyRunning: false }
  })

/**
 * Claims `at` again when liveness marked its entry dead while this node lives (its event
 * loop stalled past deadAfterMs) and carries on with the new claim; not when someone else
 * holds the entry now (another process of this node's name, a re-placement).
 */
const claimAgainIfDead = <R>(
  n: NodeContext<R>,
  at: ActorAddress,
  load: Readonly<Record<string, unknown>> | undefined,
  carryOn: (c: Claim.Claim) => Effect.Effect<void, never, R>
): Effect.Effect<void, never, R> =>
  Effect.gen(function* () {
    const { entry } = yield* readEntry(n.system.registry, formatAddress(at))
    if (n.state.draining || entry?.status !== "dead") return
    yield* Effect.logWarning(`${formatAddress(at)} was declared dead while this node lives; claiming it again`)
    yield* carryOn(yield* claim(n, at, load))
  }).pipe(
    Effect.retry({ while: (e) => e._tag === "TransportError", schedule: Schedule.spaced(Duration.millis(n.hostOptions.heartbeatMs)) }),
    Effect.catch((e) => Effect.logWarning(`${formatAddress(at)} not claimed again`, e))
  )

/**
 * Holds the group's entry while any member is hosted: renewed with the members still here
 * (what re-placement spawns again if this node dies), released when the last one has left,
 * claimed again if it was declared dead while they are here.
 */
const keepGroup = <R>(n: NodeContext<R>, c: Claim.Claim, group: GroupSpec, entries: ReadonlyArray<Hosted>): Effect.Effect<void, never, R> => {
  const here = () => entries.filter((e) => n.hosted.get(formatAddress(e.address)) === e)
  const load = () => ({ group: { ...group, members: here().map((e) => ({ kind: e.address.kind, id: e.address.id })) } })
  const allLeft = Effect.forEach(entries, (e) => Deferred.await(e.ended), { discard: true })
  const after = Effect.suspend(() =>
    c.held()
      ? c.release(entries.some((e) => e.failed) ? "failed" : "stopped")
      : here().length > 0
        ? claimAgainIfDead(n, c.address, load(), (next) => keepGroup(n, next, group, entries))
        : Effect.void
  )
  return Effect.raceFirst(c.renew(load, n.hostOptions.heartbeatMs), allLeft).pipe(Effect.andThen(after))
}

const spawnGroup = <R>(n: NodeContext<R>): NodeHandle["spawnGroup"] =>
  Effect.fn("Node.spawnGroup")(function* (group: GroupSpec, supervision?: SupervisionPolicy) {
    const members = yield* Effect.forEach(group.members, (m) => resolve(n, m.kind, m.id))
    const at = yield* Effect.try({ try: () => groupAddress(group.name), catch: (e) => e as InvalidAddress })
    for (const [, member] of members) {
      const key = formatAddress(member)
      if (n.hosted.has(key) || n.spawning.has(key)) return yield* Effect.fail(new AlreadyHosted({ ...member, node: n.options.name }))
    }
    const [groupClaim, ...claims] = yield* claimAll(n, [[at, { group }], ...members.map(([, m]) => [m, undefined] as const)])
    const entries =
      group.strategy === "one-for-all"
        ? yield* hostAll(n, group.name, members, claims, supervision ?? members[0]?.[0].supervision ?? defaultSupervision)
        : yield* Effect.forEach(members, ([type, m], i) => hostOne(n, type, m, claims[i]!, group.name))
    yield* runIn(n, keepGroup(n, groupClaim!, group, entries))
    yield* serving(entries)
    return members.map(([, m]) => ({ kind: m.kind, id: m.id, node: n.options.name, alreadyRunning: false }))
  })

const stop = <R>(n: NodeContext<R>): NodeHandle["stop"] =>
  Effect.fn("Node.stop")(function* (kind: string, id: string) {
    const h = n.hosted.get(`${kind}/${id}`)
    if (h === undefined) return false
    yield* Deferred.succeed(h.control.drain, undefined)
    yield* Deferred.await(h.ended)
    return true
  })

const list = <R>(n: NodeContext<R>) =>
  [...n.hosted.values()].map((h): HostedActor => ({
    kind: h.address.kind,
    id: h.address.id,
    restarts: h.restarts,
    ...(h.group !== undefined ? { group: h.group } : {})
  }))

/** The node's load in its registry entry: actors hosted (the node actor aside), types, devices, draining. */
const nodeLoad = <R>(n: NodeContext<R>): NodeLoad => ({
  actors: [...n.hosted.keys()].filter((k) => k !== `node/${n.options.name}`).length,
  types: [...n.catalogue.keys()],
  devices: n.options.devices ?? [],
  draining: n.state.draining
})

/** The node actor (`NodeProtocol`), beating its load. */
const nodeType = <R>(n: NodeContext<R>) =>
  Actor.make({
    kind: "node",
    protocol: NodeProtocol,
    state: { schema: Schema.Struct({}), initial: () => ({}) },
    concurrency: 4,
    behaviour: (ctx) =>
      Effect.sync(() => {
        const beat = setInterval(() => ctx.reportLoad(nodeLoad(n)), n.hostOptions.heartbeatMs)
        ctx.reportLoad(nodeLoad(n))
        return { beat }
      }).pipe(
        Effect.tap(({ beat }) => Effect.addFinalizer(() => Effect.sync(() => clearInterval(beat)))),
        Effect.as({
          Spawn: ({ kind, id }) => spawn(n)(kind, id),
          SpawnGroup: (group) => spawnGroup(n)(group),
          Stop: ({ kind, id }) => (kind === "node" ? Effect.succeed({ stopped: false }) : stop(n)(kind, id).pipe(Effect.map((stopped) => ({ stopped })))),
          List: () => Effect.succeed(list(n))
        })
      )
  })

// The node actor, hosted again when its entry was declared dead while this process lives.
const hostNode =
  <R>(n: NodeContext<R>, type: Actor.ActorType<any, any, R>) =>
  (c: Claim.Claim): Effect.Effect<void, never, R> =>
    Effect.gen(function* () {
      const at = address("node", n.options.name)
      const entry = yield* hostOne(n, type, at, c)
      yield* serving([entry])
      yield* runIn(n, Deferred.await(entry.ended).pipe(Effect.andThen(claimAgainIfDead(n, at, undefined, hostNode(n, type)))))
    })

/** Liveness, re-placement and service discovery over the node's view of the registry. */
const watchOver = <R>(n: NodeContext<R>) =>
  Effect.gen(function* () {
    const { system, options, deadAfterMs } = n
    const view = yield* viewRegistry(system)
    const self = `node/${options.name}`
    yield* monitorLiveness(system, view, { deadAfterMs, self, selfEveryMs: n.hostOptions.heartbeatMs, ...(options.onDead ? { onDead: options.onDead } : {}) })
    yield* replaceDead(system, view, { node: options.name, types: n.catalogue, deadAfterMs, spawn: spawn(n), spawnGroup: (group) => spawnGroup(n)(group), accepting: () => !n.state.draining })
    yield* serveDiscovery(system.nats.nc, {
      id: nuid.next(),
      version: options.version ?? "0.1.0",
      description: `Gyre node ${options.name} of run ${system.run}`,
      metadata: { "gyre.node": options.name, "gyre.run": system.run, "gyre.types": [...n.catalogue.keys()].join(",") },
      started: new Date(),
      endpoints: () => [...n.hosted.values()].map((h) => h.stats)
    })
  })

/** Stops admitting spawns, drains every actor (the node actor last) and waits for them. */
const drain = <R>(n: NodeContext<R>) =>
  Effect.gen(function* () {
    n.state.draining = true
    const others = [...n.hosted.values()].filter((h) => formatAddress(h.address) !== `node/${n.options.name}`)
    yield* Effect.forEach(others, (h) => stop(n)(h.address.kind, h.address.id), { concurrency: "unbounded", discard: true })
    yield* stop(n)("node", n.options.name)
  })

/** Starts a node in the current scope; closing the scope stops its actors abruptly (no drain). */
export const startNode = <R>(
  options: NodeOptions<R>
): Effect.Effect<NodeHandle, TransportError | Claim.AddressClaimed | MetricsServerError | ConfigError, ActorSystem | Scope.Scope | R> =>
  Effect.gen(function* () {
    const settings = yield* RuntimeSettings
    const n: NodeContext<R> = {
      options,
      system: yield* ActorSystem,
      deadAfterMs: options.deadAfterMs ?? settings.deadAfterMs,
      hostOptions: { node: options.name, heartbeatMs: options.heartbeatMs ?? settings.heartbeatMs, ackWaitMs: options.ackWaitMs ?? settings.ackWaitMs },
      scope: yield* Effect.scope,
      context: yield* Effect.context<R>(),
      catalogue: new Map(options.types.map((t) => [t.kind, t])),
      hosted: new Map(),
      spawning: new Map(),
      state: { draining: false }
    }
    // First, so a port in use fails the node before it hosts anything.
    const metricsPort = options.metricsPort ?? settings.metricsPort
    const metricsUrl = metricsPort === undefined ? undefined : yield* serveMetrics(metricsPort)
    yield* hostNode(n, nodeType(n) as Actor.ActorType<any, any, R>)(yield* claim(n, address("node", options.name)))
    yield* watchOver(n)
    return { name: options.name, spawn: spawn(n), spawnGroup: spawnGroup(n), stop: stop(n), hosted: () => list(n), drain: drain(n), metricsUrl } satisfies NodeHandle
  })

/** A node hosting actors (the module comment): its handle, in the scope that started it. */
export class ActorNode extends Context.Service<ActorNode, NodeHandle>()("gyre/runtime/ActorNode") {
  static readonly make = startNode
  static readonly layer = <R>(options: NodeOptions<R>) => Layer.effect(ActorNode, startNode(options))
}
