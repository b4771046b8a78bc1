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
import { Deferred, Effect, Semaphore } from "effect"
import type { RpcGroup } from "effect/rpc"
import type * as Actor from "../runtime/actor.ts"
import { parseAddress } from "../runtime/names.ts"
import { refOf, type ActorRef, type ActorSystemShape } from "../runtime/system.ts"
import type { Role } from "../policy/vocabulary.ts"
import { DeviceProtocol, DeviceRefused, type DeviceLoad, type SwitchResult } from "../protocols/device.ts"
import type { GatewayProtocol } from "../protocols/gateway.ts"
import type { WorkerLoad } from "../protocols/rollout.ts"
import { exportContexts, movable, receiveContexts, sendContexts, spread, type Destination, type OutgoingContext, type SentContexts } from "./handoff.ts"
import type { RolloutRole } from "./rollout-role.ts"
import type { TrainingRole } from "./training-role.ts"

type Handlers = Actor.Handlers<RpcGroup.Rpcs<typeof DeviceProtocol>>

/** The role a device is in, or is going to while `switching`. */
export interface RoleState {
  role: Role
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

export const makeRoleSwitch = Effect.fn("makeRoleSwitch")(function* (options: RoleSwitchOptions) {
  const { system, self, rollout, training, state, report } = options
  const batcher = rollout.batcher
  const lock = yield* Semaphore.make(1)
  /** The hand-off of the latest switch out of rollout (completed once its moves are announced). */
  let handoff: Deferred.Deferred<Moves> | undefined
  const deviceRef = (key: string) => refOf(DeviceProtocol, parseAddress(key))
  const result = (role: Role, started: number, figures: Partial<SwitchResult> = {}): SwitchResult => ({
    role,
    generationsMoved: 0,
    contextsMoved: 0,
    bytesMoved: 0,
    reprefillTokens: 0,
    controlMs: 0,
    ...figures,
    ms: performance.now() - started
  })

  /** Rollout `Generate`, holding the answers of generations paused by a switch until their contexts moved. */
  const generate: Handlers["Generate"] = (request, meta) =>
    rollout.handlers.Generate(request, meta).pipe(
      Effect.flatMap((answer) => {
        const moves = handoff
        if (answer.finishReason !== "cancelled" || moves === undefined) return Effect.succeed(answer)
        return Deferred.await(moves).pipe(
          Effect.map((m) => {
            const to = m.get(request.request)
            return to === undefined ? answer : { ...answer, movedTo: to }
          })
        )
      }),
      Effect.catchTag("WorkerUnavailable", (e) => (handoff === undefined ? Effect.fail(e) : Deferred.await(handoff).pipe(Effect.andThen(Effect.fail(e)))))
    )

  /** Destinations that answer `Status` and still serve rollouts, with their free blocks. */
  const destinationsOf = (keys: ReadonlyArray<string>) =>
    Effect.forEach(
      keys.filter((k) => k !== self),
      (key) =>
        system.ask(deviceRef(key), "Status", undefined, { timeoutMs: ASK_MS }).pipe(
          Effect.map((load): Destination | undefined => (load.draining ? undefined : { key, freeBlocks: load.freeBlocks })),
          Effect.catch(() => Effect.succeed(undefined))
        ),
      { concurrency: "unbounded" }
    ).pipe(Effect.map((ds) => ds.filter((d): d is Destination => d !== undefined)))

  /** Tells the gateway where the moved contexts went (their executions' routes follow); false when it could not be told. */
  const announce = (to: string, moved: ReadonlyArray<OutgoingContext>) =>
    system
      .ask(options.gateway, "ContextsMoved", {
        from: self,
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
  const handOver = (contexts: ReadonlyArray<OutgoingContext>, destinations: ReadonlyArray<Destination>) =>
    Effect.gen(function* () {
      const sent: Array<SentContexts> = []
      let pending = contexts
      let targets = destinations
      while (pending.length > 0 && targets.length > 0) {
        const plan = spread(pending, targets, options.blockTokens)
        const round = yield* Effect.forEach([...plan], ([to, list]) => sendContexts(system, options.store, self, to, list), { concurrency: "unbounded" })
        sent.push(...round.filter((s) => s.imported.length > 0))
        pending = round.flatMap((s) => s.failed)
        const refused = new Set(round.filter((s) => s.failed.length > 0).map((s) => s.to))
        targets = targets.filter((t) => !refused.has(t.key))
      }
      return sent
    })

  const leaveRollout = (destinations: ReadonlyArray<string>) =>
    Effect.gen(function* () {
      const started = performance.now()
      const moves = Deferred.makeUnsafe<Moves>()
      handoff = moves
      state.role = "training"
      state.switching = true
      report()
      const paused = new Map((yield* batcher.pause).map((g) => [g.request, g.execution]))
      const controlMs = performance.now() - started
      const outgoing = yield* exportContexts(batcher, paused)
      const sent = yield* handOver(outgoing.filter(movable), yield* destinationsOf(destinations))
      const told = yield* Effect.forEach(sent, (s) => announce(s.to, s.imported), { concurrency: "unbounded" })
      Deferred.doneUnsafe(moves, Effect.succeed(new Map(sent.flatMap((s) => s.imported.map((c) => [c.exported.request, s.to] as const)))))
      // The destinations answered: free this device's copies.
      for (const execution of batcher.executions()) yield* batcher.release(execution).pipe(Effect.ignore)
      for (const c of outgoing) yield* batcher.unpinContext(c.execution).pipe(Effect.ignore)
      const imported = sent.flatMap((s) => s.imported)
      const moved = new Set(imported)
      const unannounced = sent.flatMap((s, i) => (told[i] ? [] : s.imported.filter((c) => !c.inFlight)))
      const lost = [...outgoing.filter((c) => !moved.has(c)), ...unannounced]
      return result("training", started, {
        generationsMoved: imported.filter((c) => c.inFlight).length,
        contextsMoved: imported.filter((c) => !c.inFlight).length,
        bytesMoved: sent.reduce((n, s) => n + s.bytes, 0),
        reprefillTokens: lost.reduce((n, c) => n + c.exported.kvLength, 0),
        controlMs
      })
    }).pipe(
      Effect.ensuring(
        Effect.sync(() => {
          if (handoff !== undefined) Deferred.doneUnsafe(handoff, Effect.succeed(new Map()))
          state.switching = false
          report()
        })
      )
    )

  const joinRollout = (version: number | undefined) =>
    Effect.gen(function* () {
      const started = performance.now()
      state.role = "rollout"
      state.switching = true
      report()
      if (training !== undefined) yield* training.leave
      const controlMs = performance.now() - started
      if (version !== undefined) {
        yield* rollout.loadWeights(version).pipe(
          Effect.tapError(() =>
            Effect.sync(() => {
              state.role = "training"
            })
          ),
          Effect.mapError((e) => new DeviceRefused({ device: self, reason: `weights of version ${version}: ${e.reason}` }))
        )
      }
      batcher.resume()
      return result("rollout", started, { controlMs })
    }).pipe(
      Effect.ensuring(
        Effect.sync(() => {
          state.switching = false
          report()
        })
      )
    )

  const switchRole: Handlers["SwitchRole"] = ({ role, destinations, version }) =>
    lock.withPermit(
      Effect.suspend(() => {
        if (role === state.role) return Effect.succeed(result(role, performance.now()))
        return role === "training" ? leaveRollout(destinations) : joinRollout(version)
      })
    )

  /** Destination side of a hand-off: imports while serving rollouts, else refuses every context. */
  const importContexts: Handlers["ImportContexts"] = ({ contexts }) =>
    state.role === "rollout" && !state.switching
      ? receiveContexts(system, options.store, batcher, contexts)
      : Effect.succeed({ imported: 0, failed: contexts.map((c) => c.request) })

  return { generate, switchRole, importContexts }
})
