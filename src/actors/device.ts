/**
 * The device actor (`device/<node>.<i>`, `DeviceProtocol`): one per device, owning one loaded
 * model, its paged KV cache and its batcher for the whole incarnation, serving in one role at
 * a time.
 *
 * - `rollout` (the initial role): the rollout role of `../serving/rollout-role.ts`, exactly a
 *   rollout worker's requests; the gateway routes to devices whose load says `role: "rollout"`
 *   and not `draining`.
 * - `training`: `StartStep`, `TrainExecution`, `JoinStep` and `GradientReady` go to the
 *   training role (`../serving/training-role.ts`, built over the same model by
 *   `config.training`); without one, StartStep / JoinStep answer `DeviceRefused`.
 * - `SwitchRole` changes the role of the same loaded model (`../serving/role-switch.ts`):
 *   leaving rollout pauses the in-flight generations and hands their contexts, and the cached
 *   contexts of executions between calls, to `destinations` over the run's KV object store
 *   (`../serving/handoff.ts`), tells the gateway where they went and frees them here; joining
 *   rollout leaves the training role, loads `version`'s weights, and admits again.
 *   `ImportContexts` is the destination side of a hand-off.
 *
 * Its registry load is a `DeviceLoad` (the rollout figures, `role`, `switching`, `step`),
 * reported after every engine step and at every change of role. `Generate` handlers wait on
 * the batcher, so the actor declares a high `concurrency`.
 *
 * With `scheduler`, the device tells it `DeviceJoined` once it serves (the scheduler numbers cells
 * in join order).
 *
 * With `threads`, its model computes on that many host threads (`cpuDeviceThreads`: the K CPU
 * devices of one process split the cores); each model has its own engine queue, so the devices
 * of a process compute at the same time.
 *
 * With `pace` (`src/serving/pace.ts`), one pacer serves both roles: the batcher's engine steps
 * and the training role's micro-batches complete no earlier than the pace's rates allow, and
 * the load carries its counts (`pacedWork`, `paceOverruns`).
 *
 * `gyre node --load src/actors/device.ts --spawn device/<node>.0` hosts one configured from the
 * environment (`DeviceSettings`, a `Config`: the rollout role's variables, `GYRE_GATEWAY`, `GYRE_SCHEDULER`).
 */
import { Config, Effect, Option, Schema } from "effect"
import type { EngineShape } from "../engine/engine.ts"
import type { RpcGroup } from "effect/rpc"
import * as Actor from "../runtime/actor.ts"
import { formatAddress } from "../runtime/names.ts"
import { DeviceProtocol, DeviceRefused } from "../protocols/device.ts"
import { Device as DeviceKind, Gateway, Scheduler, type GatewayRef, type SchedulerRef } from "../protocols/topology.ts"
import { WeightsUnavailable, type WorkerLoad } from "../protocols/rollout.ts"
import { RoleSwitch, deviceLoad, type RoleState } from "../serving/role-switch.ts"
import { KV_BLOCK_TOKENS, RolloutSettings, startRollout, type RolloutConfig } from "../serving/rollout-role.ts"
import type { TrainingRole, TrainingRoleFactory } from "../serving/training-role.ts"

export interface DeviceConfig extends RolloutConfig {
  /** The gateway told where moved contexts went (default `gateway/main`). */
  readonly gateway?: GatewayRef
  /** Builds the training role over the device's model; without it the device only serves rollouts. */
  readonly training?: TrainingRoleFactory
  /** The run's scheduler (`scheduler/main`): told `DeviceJoined` once the device serves; none: not announced. */
  readonly scheduler?: SchedulerRef
  /** Host threads of the device's model (none: the engine's default, every core). */
  readonly threads?: number
}

/**
 * The threads of each of `devices` device actors of one process: on the CPU backend they split
 * the engine's cores, floor(cores / devices) each (at least 1); a GPU device computes on its own
 * device (none).
 */
export const cpuDeviceThreads = (engine: EngineShape, devices: number): Effect.Effect<number | undefined> =>
  engine.backend === "cpu" ? engine.threads.pipe(Effect.map((cores) => Math.max(1, Math.floor(cores / Math.max(1, devices))))) : Effect.succeed(undefined)

/** An optional `kind/id` setting naming an actor of `kind` (a ConfigError names the variable when it is not one). */
const refSetting = <R>(name: string, kind: string, ref: (key: string) => R) =>
  Config.schema(Schema.String.check(Schema.isPattern(new RegExp(`^${kind}/[A-Za-z0-9_-]+(\\.[A-Za-z0-9_-]+)*$`))), name).pipe(
    Config.option,
    Config.map((o) => ({ ref: Option.isSome(o) ? ref(o.value) : undefined }))
  )

/** The configuration from the `ConfigProvider`: the rollout role's settings (`RolloutSettings`), `GYRE_GATEWAY`, `GYRE_SCHEDULER`. */
export const DeviceSettings: Config.Config<DeviceConfig> = Config.all({
  rollout: RolloutSettings,
  gateway: refSetting("GYRE_GATEWAY", Gateway.kind, Gateway.refOfKey),
  scheduler: refSetting("GYRE_SCHEDULER", Scheduler.kind, Scheduler.refOfKey)
}).pipe(
  Config.map(({ rollout, gateway, scheduler }) => ({
    ...rollout,
    ...(gateway.ref === undefined ? {} : { gateway: gateway.ref }),
    ...(scheduler.ref === undefined ? {} : { scheduler: scheduler.ref })
  }))
)

/** The device actor type for a configuration (or a `Config` read when an incarnation starts). */
export const device = (configured: DeviceConfig | Config.Config<DeviceConfig>) =>
  DeviceKind.implement({
    state: { schema: Schema.Struct({}), initial: () => ({}) },
    concurrency: 1024,
    behaviour: (ctx) =>
      Effect.gen(function* () {
        const config = Config.isConfig(configured) ? yield* configured : configured
        const self = formatAddress(ctx.address)
        const state: RoleState = { role: "rollout", switching: false }
        let training: TrainingRole | undefined
        const report = (load: WorkerLoad) => ctx.reportLoad(deviceLoad(load, state, training?.step() ?? -1))
        const rollout = yield* startRollout(ctx, config, report)
        if (config.threads !== undefined) yield* rollout.model.setThreads(config.threads).pipe(Effect.orDie)
        training = config.training === undefined ? undefined : yield* config.training({ ...rollout, ctx, version: () => rollout.batcher.load().version, swapWeights: rollout.batcher.swapWeights })
        const roles = yield* RoleSwitch.make({
          system: ctx.system,
          self,
          gateway: config.gateway ?? Gateway.ref("main"),
          rollout,
          training,
          state,
          blockTokens: config.blockTokens ?? KV_BLOCK_TOKENS,
          store: rollout.store,
          report: () => report(rollout.batcher.load())
        })
        if (config.scheduler !== undefined) {
          // Durable and deduplicated per incarnation: a restarted device joins again, a redelivered tell once.
          yield* ctx.system.tell(config.scheduler, "DeviceJoined", { device: self }, { msgId: `joined-${self}-${ctx.incarnation}`, sender: self })
        }
        const refused = (reason: string) => new DeviceRefused({ device: self, reason })
        /** A step request, for the training role while the device is in it. */
        const inTraining = <A>(run: (role: TrainingRole) => Effect.Effect<A, DeviceRefused>) =>
          Effect.suspend(() =>
            training === undefined
              ? Effect.fail(refused("this device has no training role"))
              : state.role !== "training"
                ? Effect.fail(refused(`in the ${state.role} role`))
                : run(training)
          )
        return {
          ...rollout.handlers,
          Generate: roles.generate,
          LoadWeights: (request, meta) =>
            state.role === "rollout" && !state.switching
              ? rollout.handlers.LoadWeights(request, meta)
              : Effect.fail(new WeightsUnavailable({ version: request.version, reason: `${self} is not serving rollouts (the training role owns its weights)` })),
          SwitchRole: roles.switchRole,
          ImportContexts: roles.importContexts,
          StartStep: (plan, meta) => inTraining((t) => t.handlers.StartStep(plan, meta)),
          JoinStep: (join, meta) => inTraining((t) => t.handlers.JoinStep(join, meta)),
          TrainExecution: (ref, meta) => (training === undefined ? Effect.succeed({ queued: false }) : training.handlers.TrainExecution(ref, meta)),
          GradientReady: (ready, meta) => (training === undefined ? Effect.succeed({ accepted: false }) : training.handlers.GradientReady(ready, meta))
        } satisfies Actor.Handlers<RpcGroup.Rpcs<typeof DeviceProtocol>>
      })
  })

/** A device configured from the environment when it starts (for `gyre node --load`). */
export const Device = device(DeviceSettings)
