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
 * publishes them to the step's work queue (each batch an object of the run's micro-batch store, the
 * message its reference). Every training device claims them one at a time, reads the batch,
 * brings its model to the micro-batch's version, computes that micro-batch's gradient alone
 * (zeroGrads, train, getGrads) with the run's loss (decoupled PPO whose proximal policy is the
 * step's weights) and its tokens' log-probs, and either stores both (`s<k>.a<n>.m<i>`) and
 * tells the core `GradientReady` (satellite) or hands them over in memory (core), then
 * acknowledges. A micro-batch that cannot be trained (its object unreadable, or the engine refusing
 * it: `cannotTrain`) is acknowledged with `failed` and its reason instead, which the core records
 * in the step's errors; any other failure hands the claim back. The core sums gradients in
 * index order, and once every planned execution is told and every gradient is in: AdamW (and
 * with PPO epochs the later passes, `src/training/update.ts`),
 * `v<k+1>` published, a checkpoint when due, the metrics journaled and `StepDone` told to the
 * scheduler (`StepProgress` after every gradient).
 *
 * Here: the device's model, its trainer and the delivery of a claimed micro-batch's gradient.
 * The core's step is `src/training/core-step.ts`, the claim loop `src/training/claims.ts`.
 */
import { Effect, Semaphore, type Scope } from "effect"
import type { EngineShape, Model } from "../engine/engine.ts"
import type { PackedBatch } from "../common/packed-batch.ts"
import type { Trainer } from "../engine/trainer.ts"
import { DeviceRefused, type MicroBatchRef } from "../protocols/device.ts"
import type { RunConfig } from "../protocols/run.ts"
import type * as Actor from "../runtime/actor.ts"
import { formatAddress } from "../runtime/names.ts"
import { Device } from "../protocols/topology.ts"
import { transient } from "../common/retry.ts"
import { makeClaims } from "../training/claims.ts"
import { Core, type CoreShape, type ModelWeights } from "../training/core-step.ts"
import { openGradientStore, type GradientStore, type MicroBatchGradient } from "../training/gradients.ts"
import { ensureMicroBatchStream, type Claim } from "../training/microbatch-queue.ts"
import { openMicroBatchStore, type MicroBatchStore } from "../training/microbatch-store.ts"
import { microBatchStats, noStats, type MicroBatchStats } from "../training/step-metrics.ts"
import { stepLoss } from "../training/step-planner.ts"
import { fetchFlatWeights } from "../serving/rollout-role.ts"
import type { TrainingHandlers, TrainingRole, TrainingRoleFactory } from "../serving/training-role.ts"
import { pacedTrainer } from "../serving/pace.ts"

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

export type { TrainingRole } from "../serving/training-role.ts"

/** What a device's training role works with: its model and trainer (and the lock held around every use of it), and the run's stores. */
interface TrainingDeps {
  readonly system: Actor.ActorContext<unknown>["system"]
  /** This device's key, `device/<id>`. */
  readonly me: string
  readonly options: TrainingRoleOptions
  readonly trainerLock: Semaphore.Semaphore
  readonly gradients: GradientStore
  readonly batches: MicroBatchStore
}

/** Brings the model to `version` (from the object store) unless it is there. */
const ensureVersion = ({ system, options: { engine, model, weights } }: TrainingDeps, version: number) =>
  weights.version() === version
    ? Effect.void
    : fetchFlatWeights(system, engine, model, version).pipe(Effect.flatMap((flat) => weights.swap(model.setWeights(flat), version)))

/** The gradient of one micro-batch alone, on the model as it is. */
const compute = ({ trainerLock, options: { trainer, config } }: TrainingDeps, ref: MicroBatchRef, batch: PackedBatch) =>
  trainerLock.withPermit(
    Effect.gen(function* () {
      yield* trainer.zeroGrads()
      const result = yield* trainer.train(batch, stepLoss(config, ref.step))
      const gradient: MicroBatchGradient = { grads: yield* trainer.getGrads(), logprobs: result.tokenLogprobs }
      return { gradient, stats: microBatchStats(result, batch, ref.step, config.policyConfig.max_staleness, config.training.isCap) }
    })
  )

/** The claimed micro-batch's gradient, or why it cannot be trained (a failure of another kind hands the claim back). */
const train = (d: TrainingDeps, claim: Claim) =>
  Effect.gen(function* () {
    const ref = claim.microBatch
    yield* d.options.onClaim?.({ step: ref.step, index: ref.index, deliveryCount: claim.deliveryCount }) ?? Effect.void
    yield* ensureVersion(d, ref.version)
    const trained: Trained = yield* compute(d, ref, yield* d.batches.get(ref))
    return trained
  }).pipe(
    Effect.catch((e) => {
      const failed = cannotTrain(e, claim.deliveryCount)
      if (failed === undefined) return Effect.fail(e)
      const trained: Trained = { failed }
      return Effect.as(Effect.logError(`${d.me}: micro-batch ${claim.microBatch.step}.${claim.microBatch.index} cannot be trained: ${failed}`), trained)
    })
  )

/** Computes a claimed micro-batch and hands its gradient (or its failure) to the core of its attempt: in memory when that is this device, else stored and told. */
const deliver = (d: TrainingDeps, core: CoreShape) => (claim: Claim) =>
  Effect.gen(function* () {
    const ref = claim.microBatch
    yield* claim.hold(
      Effect.gen(function* () {
        const trained = yield* train(d, claim)
        const stats = "failed" in trained ? noStats : trained.stats
        if (ref.core === d.me) return yield* core.gradientIn(ref, ref.index, d.me, stats, "failed" in trained ? trained : trained.gradient)
        if (!("failed" in trained)) yield* d.gradients.put(ref, ref.index, trained.gradient)
        const coreRef = Device.refOfKey(ref.core)
        const ready = { step: ref.step, attempt: ref.attempt, index: ref.index, device: d.me, stats, ...("failed" in trained ? { failed: trained.failed } : {}) }
        yield* d.system.tell(coreRef, "GradientReady", ready, { msgId: `grad-${ref.step}-${ref.attempt}-${ref.index}`, sender: d.me })
        return true
      })
    )
    yield* claim.ack
  })

/** `StartStep`, `TrainExecution`, `JoinStep` and `GradientReady` over the core and the claim loop. */
const handlersOf = (me: string, core: CoreShape, claims: Effect.Success<ReturnType<typeof makeClaims>>): TrainingHandlers => ({
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
  GradientReady: ({ step, attempt, index, device, stats, failed }) =>
    core.gradientIn({ step, attempt }, index, device, stats, failed === undefined ? "stored" : { failed }).pipe(Effect.map((accepted) => ({ accepted })))
})

/** The run's gradient and micro-batch stores and its micro-batch stream, opened (or created) with transient failures retried. */
const openStores = Effect.fnUntraced(function* (system: TrainingDeps["system"], paramCount: number) {
  const gradients = yield* openGradientStore(system, paramCount).pipe(Effect.retry(transient), Effect.orDie)
  const batches = yield* openMicroBatchStore(system).pipe(Effect.retry(transient), Effect.orDie)
  yield* ensureMicroBatchStream(system).pipe(Effect.retry(transient), Effect.orDie)
  return { gradients, batches }
})

export const makeTrainingRole: (
  ctx: Pick<Actor.ActorContext<unknown>, "address" | "system">,
  options: TrainingRoleOptions
) => Effect.Effect<TrainingRole, never, Scope.Scope> = Effect.fn("TrainingRole.make")(function* (ctx, options) {
  const { system } = ctx
  const me = formatAddress(ctx.address)
  const ackWaitMs = options.ackWaitMs ?? 60_000
  const scope = yield* Effect.scope
  const trainerLock = yield* Semaphore.make(1)
  const d: TrainingDeps = { system, me, options, trainerLock, ...(yield* openStores(system, options.model.paramCount)) }
  const { model, trainer, config, weights } = options
  const core = yield* Core.make({
    system,
    me,
    config,
    model,
    trainer,
    trainerLock,
    gradients: d.gradients,
    batches: d.batches,
    weights,
    ensureVersion: (version) => ensureVersion(d, version),
    compute: (ref, batch) => compute(d, ref, batch),
    ackWaitMs,
    scope
  })
  const claims = yield* makeClaims({ system, me, ackWaitMs, scope, deliver: deliver(d, core) })
  return { handlers: handlersOf(me, core, claims), leave: claims.leave, step: claims.step }
})

/** A claimed micro-batch's gradient and statistics, or why it cannot be trained. */
type Trained = { readonly gradient: MicroBatchGradient; readonly stats: MicroBatchStats } | { readonly failed: string }

/** Deliveries of a micro-batch that failed in the engine before it counts as one that cannot be trained. */
export const ENGINE_FAILED_DELIVERIES = 3

/**
 * Why a claimed micro-batch cannot be trained, or undefined when the failure may pass (it is
 * handed back): its object unreadable, the engine refusing its input (`GYRE_ERR_INVALID_ARGUMENT`,
 * `GYRE_ERR_UNSUPPORTED`: the same batch fails on every device of the build), or another engine
 * failure on its `ENGINE_FAILED_DELIVERIES`th delivery.
 */
export const cannotTrain = (e: unknown, deliveryCount: number): string | undefined => {
  const tagged = e as { readonly _tag?: string; readonly code?: string; readonly message?: string; readonly reason?: string; readonly object?: string }
  if (tagged._tag === "MicroBatchUnreadable") return `${tagged.object}: ${tagged.reason}`
  if (tagged._tag !== "EngineError") return undefined
  const refused = tagged.code === "GYRE_ERR_INVALID_ARGUMENT" || tagged.code === "GYRE_ERR_UNSUPPORTED"
  return refused || deliveryCount >= ENGINE_FAILED_DELIVERIES ? `the engine failed (${tagged.code}): ${tagged.message}` : undefined
}

/**
 * The training role a device actor builds over its own model for the run `config`: a trainer for
 * micro-batches of the run's size (each `train` call paced on a paced device), and every weight change through the rollout role's batcher, so
 * no engine step sees the weights half changed.
 */
export const trainingRoleFor =
  (config: RunConfig): TrainingRoleFactory =>
  (device) =>
    Effect.gen(function* () {
      const trainer = pacedTrainer(yield* device.model.trainer({ maxTokens: config.training.microBatchTokens }), device.pacer)
      const weights: ModelWeights = { version: device.version, swap: device.swapWeights }
      return yield* makeTrainingRole(device.ctx, { model: device.model, trainer, engine: device.engine, config, weights })
    })
