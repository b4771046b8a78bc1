/**
 * A device's role and the switches between its roles, on one loaded model and KV pool.
 *
 * Leaving rollout (the harness-preserving switch, `SwitchRole {role: "training"}`):
 *   1. stop admitting and pause every generation at a step boundary (`batcher.pause`: each
 *      answers with its partial output, finishReason "cancelled", and leaves its context);
 *      the load says `draining` and `switching` from here on. Until step 4, answers of paused
 *      generations and refusals of new `Generate`s are held (`generate` below);
 *   2. pin and export the context of every paused generation and every execution's latest
 *      context (`handoff.ts`), spread the executions over the destinations by free blocks;
 *   3. hand them over through the run's KV object store (`ImportContexts` on each
 *      destination, which imports them under the same request ids);
 *   4. tell the gateway where each context went (`ContextsMoved`), then release the held
 *      answers: a paused generation whose context moved answers with `movedTo` (the gateway
 *      continues it there with nothing prefilled again), a held refusal fails
 *      `WorkerUnavailable` (the gateway retries on the execution's moved route);
 *   5. free every context on this device and unpin (the destinations answered), and report
 *      the figures (`SwitchResult`).
 * Joining rollout (`SwitchRole {role: "rollout", version}`): leave the training role (await
 * its `leave`), load `version`'s weights if given and not held already, start admitting.
 *
 * Switches run one at a time; a switch to the role the device is in answers at once with zero
 * figures (so a scheduler re-executing a journaled action is harmless).
 */
import type { ObjectStore } from "@nats-io/obj"
import { Context, Deferred, Effect, Layer, Semaphore } from "effect"
import type { RpcGroup } from "effect/rpc"
import type * as Actor from "../runtime/actor.ts"
import type { ActorRef, ActorSystemShape } from "../runtime/system.ts"
import type { CellRole } from "../policy/vocabulary.ts"
import { DeviceProtocol, DeviceRefused, type DeviceLoad, type SwitchResult } from "../protocols/device.ts"
import type { GatewayProtocol } from "../protocols/gateway.ts"
import type { WorkerLoad } from "../protocols/rollout.ts"
import { Device } from "../protocols/topology.ts"
import { exportContexts, movable, receiveContexts, sendContexts, spread, type Destination, type OutgoingContext, type SentContexts } from "./handoff.ts"
import type { RolloutRole } from "./rollout-role.ts"
import type { TrainingRole } from "./training-role.ts"

type Handlers = Actor.Handlers<RpcGroup.Rpcs<typeof DeviceProtocol>>

/** The role a device is in, or is going to while `switching`. */
export interface RoleState {
  role: CellRole
  switching: boolean
}

/** A device's registry load: its batcher's figures, its role and its step. */
export const deviceLoad = (load: WorkerLoad, state: RoleState, step: number): DeviceLoad => ({ ...load, role: state.role, switching: state.switching, step })

export interface RoleSwitchOptions {
  readonly system: ActorSystemShape
  /** This device's key, `device/<id>`. */
  readonly self: string
  readonly gateway: ActorRef<RpcGroup.Rpcs<typeof GatewayProtocol>>
  readonly rollout: RolloutRole
  readonly training: TrainingRole | undefined
  readonly state: RoleState
  /** KV block size of the device's cache (to estimate the blocks a context takes). */
  readonly blockTokens: number
  readonly store: ObjectStore
  /** Publishes the device's load now. */
  readonly report: () => void
}

/** Where each moved request went (request id -> destination key). */
type Moves = ReadonlyMap<string, string>

const ASK_MS = 10_000

/** A device's role switch: its `Generate`, `SwitchRole` and `ImportContexts` handlers. */
export interface RoleSwitchShape {
  /** Rollout `Generate`, holding the answers of generations paused by a switch until their contexts moved. */
  readonly generate: Handlers["Generate"]
  readonly switchRole: Handlers["SwitchRole"]
  /** Destination side of a hand-off: imports while serving rollouts, else refuses every context. */
  readonly importContexts: Handlers["ImportContexts"]
}

/** What the switch's operations share: the options, one switch at a time, the latest hand-off. */
interface Switching {
  readonly options: RoleSwitchOptions
  readonly lock: Semaphore.Semaphore
  /** The hand-off of the latest switch out of rollout (completed once its moves are announced). */
  handoff: Deferred.Deferred<Moves> | undefined
}

const resultOf = (role: CellRole, started: number, figures: Partial<SwitchResult> = {}): SwitchResult => ({
  role,
  generationsMoved: 0,
  contextsMoved: 0,
  bytesMoved: 0,
  reprefillTokens: 0,
  controlMs: 0,
  ...figures,
  ms: performance.now() - started
})

/** The answer of a generation, or (paused by a switch) once its context moved, with where it went. */
const generate = (sw: Switching): Handlers["Generate"] => (request, meta) =>
  sw.options.rollout.handlers.Generate(request, meta).pipe(
    Effect.flatMap((answer) => {
      const moves = sw.handoff
      if (answer.finishReason !== "cancelled" || moves === undefined) return Effect.succeed(answer)
      return Deferred.await(moves).pipe(
        Effect.map((m) => {
          const to = m.get(request.request)
          return to === undefined ? answer : { ...answer, movedTo: to }
        })
      )
    }),
    Effect.catchTag("WorkerUnavailable", (e) => (sw.handoff === undefined ? Effect.fail(e) : Deferred.await(sw.handoff).pipe(Effect.andThen(Effect.fail(e)))))
  )

/** Destinations that answer `Status` and still serve rollouts, with their free blocks. */
const destinationsOf = (o: RoleSwitchOptions, keys: ReadonlyArray<string>) =>
  Effect.forEach(
    keys.filter((k) => k !== o.self),
    (key) =>
      o.system.ask(Device.refOfKey(key), "Status", undefined, { timeoutMs: ASK_MS }).pipe(
        Effect.map((load): Destination | undefined => (load.draining ? undefined : { key, freeBlocks: load.freeBlocks })),
        Effect.catch(() => Effect.succeed(undefined))
      ),
    { concurrency: "unbounded" }
  ).pipe(Effect.map((ds) => ds.filter((d): d is Destination => d !== undefined)))

/** Tells the gateway where the moved contexts went (their executions' routes follow); false when it could not be told. */
const announce = (o: RoleSwitchOptions, to: string, moved: ReadonlyArray<OutgoingContext>) =>
  o.system
    .ask(o.gateway, "ContextsMoved", {
      from: o.self,
      to,
      moves: moved.map((c) => ({ execution: c.execution, request: c.exported.request, tokens: c.exported.kvLength }))
    })
    .pipe(
      Effect.as(true),
      Effect.catch(() => Effect.succeed(false))
    )

/**
 * Sends the contexts to the destinations; what one refuses (it is switching too, or full) goes
 * to the others in the next round, until every context is placed or no destination is left.
 */
const handOver = Effect.fn("RoleSwitch.handOver")(function* (o: RoleSwitchOptions, contexts: ReadonlyArray<OutgoingContext>, destinations: ReadonlyArray<Destination>) {
  const sent: Array<SentContexts> = []
  let pending = contexts
  let targets = destinations
  while (pending.length > 0 && targets.length > 0) {
    const plan = spread(pending, targets, o.blockTokens)
    const round = yield* Effect.forEach([...plan], ([to, list]) => sendContexts(o.system, o.store, o.self, to, list), { concurrency: "unbounded" })
    sent.push(...round.filter((s) => s.imported.length > 0))
    pending = round.flatMap((s) => s.failed)
    const refused = new Set(round.filter((s) => s.failed.length > 0).map((s) => s.to))
    targets = targets.filter((t) => !refused.has(t.key))
  }
  return sent
})

/** A switch out of rollout's figures: what moved, and the tokens of what did not (prefilled again later). */
const leftRollout = (started: number, controlMs: number, outgoing: ReadonlyArray<OutgoingContext>, sent: ReadonlyArray<SentContexts>, told: ReadonlyArray<boolean>) => {
  const imported = sent.flatMap((s) => s.imported)
  const moved = new Set(imported)
  const unannounced = sent.flatMap((s, i) => (told[i] ? [] : s.imported.filter((c) => !c.inFlight)))
  const lost = [...outgoing.filter((c) => !moved.has(c)), ...unannounced]
  return resultOf("training", started, {
    generationsMoved: imported.filter((c) => c.inFlight).length,
    contextsMoved: imported.filter((c) => !c.inFlight).length,
    bytesMoved: sent.reduce((n, s) => n + s.bytes, 0),
    reprefillTokens: lost.reduce((n, c) => n + c.exported.kvLength, 0),
    controlMs
  })
}

/** Sets the role, reports the load; `switching` until `effect` ends, reported again then. */
const switching = <A, E>(o: RoleSwitchOptions, role: CellRole, effect: Effect.Effect<A, E>) =>
  Effect.suspend(() => {
    o.state.role = role
    o.state.switching = true
    o.report()
    return effect
  }).pipe(
    Effect.ensuring(
      Effect.sync(() => {
        o.state.switching = false
        o.report()
      })
    )
  )

const leaveRollout = (sw: Switching, destinations: ReadonlyArray<string>) => {
  const o = sw.options
  const batcher = o.rollout.batcher
  const started = performance.now()
  const moves = Deferred.makeUnsafe<Moves>()
  const leave = Effect.gen(function* () {
    const paused = new Map((yield* batcher.pause).map((g) => [g.request, g.execution]))
    const controlMs = performance.now() - started
    const outgoing = yield* exportContexts(batcher, paused)
    const sent = yield* handOver(o, outgoing.filter(movable), yield* destinationsOf(o, destinations))
    const told = yield* Effect.forEach(sent, (s) => announce(o, s.to, s.imported), { concurrency: "unbounded" })
    Deferred.doneUnsafe(moves, Effect.succeed(new Map(sent.flatMap((s) => s.imported.map((c) => [c.exported.request, s.to] as const)))))
    // The destinations answered: free this device's copies.
    for (const execution of batcher.executions()) yield* batcher.release(execution).pipe(Effect.ignore)
    for (const c of outgoing) yield* batcher.unpinContext(c.execution).pipe(Effect.ignore)
    return leftRollout(started, controlMs, outgoing, sent, told)
  }).pipe(Effect.ensuring(Effect.sync(() => sw.handoff !== undefined && Deferred.doneUnsafe(sw.handoff, Effect.succeed(new Map())))))
  return Effect.suspend(() => {
    sw.handoff = moves
    return switching(o, "training", leave)
  })
}

const joinRollout = (o: RoleSwitchOptions, version: number | undefined) => {
  const started = performance.now()
  const join = Effect.gen(function* () {
    if (o.training !== undefined) yield* o.training.leave
    const controlMs = performance.now() - started
    if (version !== undefined) {
      yield* o.rollout.loadWeights(version).pipe(
        Effect.tapError(() =>
          Effect.sync(() => {
            o.state.role = "training"
          })
        ),
        Effect.mapError((e) => new DeviceRefused({ device: o.self, reason: `weights of version ${version}: ${e.reason}` }))
      )
    }
    o.rollout.batcher.resume()
    return resultOf("rollout", started, { controlMs })
  })
  return switching(o, "rollout", join)
}

const switchRole = (sw: Switching): Handlers["SwitchRole"] =>
  Effect.fn("RoleSwitch.switchRole")(({ role, destinations, version }) =>
    sw.lock.withPermit(
      Effect.suspend(() => {
        if (role === sw.options.state.role) return Effect.succeed(resultOf(role, performance.now()))
        return role === "training" ? leaveRollout(sw, destinations) : joinRollout(sw.options, version)
      })
    )
  )

const importContexts = (o: RoleSwitchOptions): Handlers["ImportContexts"] => ({ contexts }) =>
  o.state.role === "rollout" && !o.state.switching
    ? receiveContexts(o.system, o.store, o.rollout.batcher, contexts)
    : Effect.succeed({ imported: 0, failed: contexts.map((c) => c.request) })

const makeRoleSwitch = Effect.fn("RoleSwitch.make")(function* (options: RoleSwitchOptions) {
  const sw: Switching = { options, lock: yield* Semaphore.make(1), handoff: undefined }
  return { generate: generate(sw), switchRole: switchRole(sw), importContexts: importContexts(options) } satisfies RoleSwitchShape
})

/** A device's role switch over its rollout role, training role and KV pool (the module comment). */
export class RoleSwitch extends Context.Service<RoleSwitch, RoleSwitchShape>()("gyre/serving/RoleSwitch") {
  static readonly make: (options: RoleSwitchOptions) => Effect.Effect<RoleSwitchShape> = makeRoleSwitch
  static readonly layer = (options: RoleSwitchOptions) => Layer.effect(RoleSwitch, makeRoleSwitch(options))
}
