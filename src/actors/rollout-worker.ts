/**
 * The rollout-worker actor: one per device, serving `RolloutWorkerProtocol` (the rollout role,
 * `src/serving/rollout-role.ts`, for the whole incarnation).
 *
 * Each incarnation loads the checkpoint into the engine on its device, creates a paged KV cache
 * and runs the continuous-batching loop in its scope; all three are freed when the incarnation
 * ends. `Generate` handlers only queue work for the loop and wait, so the actor declares a high
 * `concurrency`: every request in flight is a handler, and control requests (Cancel, Status,
 * Drain) never wait behind them. Load (`WorkerLoad`) is reported after every step and published
 * with each heartbeat in the registry entry, where the gateway reads it to route. The host's
 * drain lets running generations finish.
 *
 * `gyre serve` hosts these. `gyre node --load src/actors/rollout-worker.ts --spawn
 * rollout-worker/<node>.cpu0` hosts one configured from the environment (`RolloutSettings`, a `Config`).
 * A device actor (`device.ts`) runs the same role and can also switch to training.
 */
import { Config, Effect, Schema } from "effect"
import * as Actor from "../runtime/actor.ts"
import { RolloutWorkerProtocol } from "../protocols/rollout.ts"
import { RolloutSettings, startRollout, type RolloutConfig } from "../serving/rollout-role.ts"

/** The rollout-worker actor type for a configuration (or a `Config` read when an incarnation starts). */
export const rolloutWorker = (config: RolloutConfig | Config.Config<RolloutConfig>) =>
  Actor.make({
    kind: "rollout-worker",
    protocol: RolloutWorkerProtocol,
    state: { schema: Schema.Struct({}), initial: () => ({}) },
    concurrency: 1024,
    behaviour: (ctx) =>
      (Config.isConfig(config) ? config : Effect.succeed(config)).pipe(
        Effect.flatMap((c) => startRollout(ctx, c, (load) => ctx.reportLoad(load))),
        Effect.map((role) => role.handlers)
      )
  })

/** A rollout worker configured from the environment when it starts (for `gyre node --load`). */
export const RolloutWorker = rolloutWorker(RolloutSettings)
