/**
 * The training role of a device actor: claiming micro-batches on every training device, and on
 * the core the step itself (planning, the in-order reduce, AdamW, publishing the new weights).
 *
 * Contract with the device actor (`src/actors/device.ts`):
 * - `makeTrainingRole(ctx, options)` runs once per incarnation, in the incarnation's scope (the
 *   claim loop and the step's finishing fiber live there and are interrupted with it). `options`:
 *   the device's loaded `model` and a `trainer` on it for micro-batches of the run's
 *   `microBatchTokens`, the `engine`, the run's `config`, and `weights`: the model's current
 *   policy version and a `swap` that changes the weights where no engine step of the rollout role
 *   sees them half changed (the batcher's `swapWeights`; `ownWeights(v)` for a model nothing
 *   else uses). Every weight change of the role (a satellite loading `v<k>`, the core's AdamW)
 *   goes through `swap`.
 * - `handlers` serve `StartStep`, `TrainExecution`, `JoinStep` and `GradientReady` of
 *   `DeviceProtocol`; the device routes them while it is in the training role (a core that left
 *   its step to roll out still takes `TrainExecution` and `GradientReady`, and finishes the step).
 * - `leave` stops claiming after the micro-batch in hand and returns once none is in hand
 *   (`SwitchRole {role: "rollout"}`); the loop's pending pull ends in the background and hands
 *   back what it brings. The core keeps the step's plan and gradients.
 * - `step()` is the step this device claims micro-batches of, -1 when none (`DeviceLoad.step`).
 *
 * Flow (ARCHITECTURE.md, "Training"): the core (`StartStep`) reads each told execution's call
 * records back (`readExecution`), plans micro-batches as groups complete (`StepPlanner`) and
 * publishes them to the step's work queue. Every training device claims them one at a time,
 * brings its model to the micro-batch's version, computes that micro-batch's gradient alone
 * (zeroGrads, train, getGrads) with the run's loss (decoupled PPO whose proximal policy is the
 * step's weights) and its tokens' log-probs, and either stores both (`s<k>.a<n>.m<i>`) and
 * tells the core `GradientReady` (satellite) or hands them over in memory (core), then
 * acknowledges. The core sums gradients in
 * index order, and once every planned execution is told and every gradient is in: AdamW (and
 * with PPO epochs the later passes, `src/training/update.ts`),
 * `v<k+1>` published, a checkpoint when due, the metrics journaled and `StepDone` told to the
 * scheduler (`StepProgress` after every gradient).
 *
 * Here: the device's model, its trainer and the delivery of a claimed micro-batch's gradient.
 * The core's step is `src/training/core-step.ts`, the claim loop `src/training/claims.ts`.
 */
import { Effect, Semaphore, type Scope } from "effect"
import type { RpcGroup } from "effect/rpc"
import type { EngineShape, Model } from "../engine/engine.ts"
import type { Trainer } from "../engine/trainer.ts"
import { DeviceRefused, TrainingProtocol, type MicroBatchJson } from "../protocols/device.ts"
import type { RunConfig } from "../protocols/run.ts"
import type * as Actor from "../runtime/actor.ts"
import { formatAddress, parseAddress } from "../runtime/names.ts"
import { refOf } from "../runtime/system.ts"
import { transient } from "../common/retry.ts"
import { makeClaims } from "../training/claims.ts"
import { makeCore, type ModelWeights } from "../training/core-step.ts"
import { openGradientStore, type MicroBatchGradient } from "../training/gradients.ts"
import { ensureMicroBatchStream, type Claim } from "../training/microbatch-queue.ts"
import { microBatchStats } from "../training/step-metrics.ts"
import { stepLoss } from "../training/step-planner.ts"
import { fetchFlatWeights } from "../serving/rollout-role.ts"
import type { TrainingRoleFactory } from "../serving/training-role.ts"

export interface TrainingRoleOptions {
  readonly model: Model
  readonly trainer: Trainer
  readonly engine: EngineShape
  readonly config: RunConfig
  readonly weights: ModelWeights
  /** Ack wait of the step queues this device opens as core (default 60 s). */
  readonly ackWaitMs?: number
  /** Called when this device has claimed a micro-batch (holding it), before computing it. */
  readonly onClaim?: (claim: { readonly step: number; readonly index: number; readonly deliveryCount: number }) => Effect.Effect<void>
}

export type TrainingHandlers = Actor.Handlers<RpcGroup.Rpcs<typeof TrainingProtocol>>

export interface TrainingRole {
  readonly handlers: TrainingHandlers
  readonly leave: Effect.Effect<void>
  readonly step: () => number
}

export const makeTrainingRole = (
  ctx: Pick<Actor.ActorContext<unknown>, "address" | "system">,
  options: TrainingRoleOptions
): Effect.Effect<TrainingRole, never, Scope.Scope> =>
  Effect.gen(function* () {
    const { model, trainer, engine, config, weights } = options
    const system = ctx.system
    const me = formatAddress(ctx.address)
    const ackWaitMs = options.ackWaitMs ?? 60_000
    const scope = yield* Effect.scope
    const trainerLock = yield* Semaphore.make(1)
    const gradients = yield* openGradientStore(system, model.paramCount).pipe(Effect.retry(transient), Effect.orDie)
    yield* ensureMicroBatchStream(system).pipe(Effect.retry(transient), Effect.orDie)

    /** Brings the model to `version` (from the object store) unless it is there. */
    const ensureVersion = (version: number) =>
      weights.version() === version
        ? Effect.void
        : fetchFlatWeights(system, engine, model, version).pipe(Effect.flatMap((flat) => weights.swap(model.setWeights(flat), version)))

    /** The gradient of one micro-batch alone, on the model as it is. */
    const compute = (mb: MicroBatchJson) =>
      trainerLock.withPermit(
        Effect.gen(function* () {
          yield* trainer.zeroGrads()
          const result = yield* trainer.train(mb.batch, stepLoss(config, mb.step))
          const gradient: MicroBatchGradient = { grads: yield* trainer.getGrads(), logprobs: result.tokenLogprobs }
          return { gradient, stats: microBatchStats(result, mb.batch, mb.step, config.policyConfig.max_staleness, config.training.isCap) }
        })
      )

    const core = yield* makeCore({ system, me, config, model, trainer, trainerLock, gradients, weights, ensureVersion, compute, ackWaitMs, scope })

    /** Computes a claimed micro-batch and hands its gradient to the core of its attempt: in memory when that is this device, else stored and told. */
    const deliver = (claim: Claim) =>
      Effect.gen(function* () {
        const mb = claim.microBatch
        yield* claim.hold(
          Effect.gen(function* () {
            yield* options.onClaim?.({ step: mb.step, index: mb.index, deliveryCount: claim.deliveryCount }) ?? Effect.void
            yield* ensureVersion(mb.version)
            const { gradient, stats } = yield* compute(mb)
            if (mb.core === me) return yield* core.gradientIn(mb, mb.index, me, stats, gradient)
            yield* gradients.put(mb, mb.index, gradient)
            const coreRef = refOf(TrainingProtocol, parseAddress(mb.core))
            const ready = { step: mb.step, attempt: mb.attempt, index: mb.index, device: me, stats }
            yield* system.tell(coreRef, "GradientReady", ready, { msgId: `grad-${mb.step}-${mb.attempt}-${mb.index}`, sender: me })
            return true
          })
        )
        yield* claim.ack
      })

    const claims = yield* makeClaims({ system, me, ackWaitMs, scope, deliver })

    const handlers: TrainingHandlers = {
      StartStep: (plan) =>
        core.startStep(plan).pipe(
          Effect.tap((started) => (started ? claims.start(plan) : Effect.void)),
          Effect.map((started) => ({ started }))
        ),
      TrainExecution: (ref) => core.trainExecution(ref).pipe(Effect.map((queued) => ({ queued }))),
      JoinStep: ({ step, attempt, core: coreDevice }) =>
        Effect.gen(function* () {
          if (coreDevice === me && !core.runs({ step, attempt })) return yield* new DeviceRefused({ device: me, reason: `step ${step} attempt ${attempt} is not running here` })
          yield* claims.start({ step, attempt })
          return { joined: true }
        }),
      GradientReady: ({ step, attempt, index, device, stats }) =>
        core.gradientIn({ step, attempt }, index, device, stats, "stored").pipe(Effect.map((accepted) => ({ accepted })))
    }

    return { handlers, leave: claims.leave, step: claims.step }
  })

/**
 * The training role a device actor builds over its own model for the run `config`: a trainer for
 * micro-batches of the run's size, and every weight change through the rollout role's batcher, so
 * no engine step sees the weights half changed.
 */
export const trainingRoleFor =
  (config: RunConfig): TrainingRoleFactory =>
  (device) =>
    Effect.gen(function* () {
      const trainer = yield* device.model.trainer({ maxTokens: config.training.microBatchTokens })
      const weights: ModelWeights = { version: device.version, swap: device.swapWeights }
      return yield* makeTrainingRole(device.ctx, { model: device.model, trainer, engine: device.engine, config, weights })
    })
