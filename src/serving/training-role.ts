/**
 * What a device actor needs of its training role, and what it gives it.
 *
 * The device (`src/actors/device.ts`) owns the loaded model for the whole incarnation. A
 * `TrainingRoleFactory` builds the training role over that model once, in the incarnation's
 * scope (the trainer actor module, `src/actors/trainer.ts`, provides one); the device delegates
 * `StartStep`, `TrainExecution`, `JoinStep` and `GradientReady` to its handlers, and awaits
 * `leave` when it switches back to rollout (the role leaves its step after the current
 * micro-batch; the core keeps the step's accumulated gradients). A device built without a
 * training role refuses `StartStep` / `JoinStep` (`DeviceRefused`) and answers the two tells
 * with `queued` / `accepted` false.
 */
import type { Effect, Scope } from "effect"
import type { RpcGroup } from "effect/rpc"
import type { EngineShape, Model } from "../engine/engine.ts"
import type { NativeError } from "../engine/native.ts"
import type * as Actor from "../runtime/actor.ts"
import type { DeviceProtocol } from "../protocols/device.ts"
import type { Pacer } from "./pace.ts"

export type TrainingHandlers = Pick<
  Actor.Handlers<RpcGroup.Rpcs<typeof DeviceProtocol>>,
  "StartStep" | "TrainExecution" | "JoinStep" | "GradientReady"
>

export interface TrainingRole {
  readonly handlers: TrainingHandlers
  /** Leaves the running step after the current micro-batch; resolves once the role is idle. */
  readonly leave: Effect.Effect<void>
  /** The step the role trains in, -1 when none (reported in the device's load). */
  readonly step: () => number
}

/** The device's resources a training role works with. */
export interface DeviceResources {
  readonly ctx: Pick<Actor.ActorContext<unknown>, "address" | "system">
  readonly engine: EngineShape
  /** The device's model: the rollout role samples from the same weights. */
  readonly model: Model
  /** Engine device index of the model. */
  readonly device: number
  /** Policy version of the weights the model holds as the rollout role last loaded them. */
  readonly version: () => number
  /** Runs `apply` (which makes the weights version `version`) between two engine steps of the rollout role. */
  readonly swapWeights: (apply: Effect.Effect<void, NativeError>, version: number) => Effect.Effect<void, NativeError>
  /** The device's pacer, shared with the rollout role: the role paces its trainer's `train` calls with it (`pacedTrainer`). */
  readonly pacer: Pacer
}

export type TrainingRoleFactory = (device: DeviceResources) => Effect.Effect<TrainingRole, unknown, Scope.Scope>
