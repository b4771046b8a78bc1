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
 */
import { Cause, Duration, Effect, Fiber, Schedule, Semaphore, type Scope } from "effect"
import type { RpcGroup } from "effect/rpc"
import type { EngineShape, Model } from "../engine/engine.ts"
import type { NativeError } from "../engine/native.ts"
import type { Trainer } from "../engine/trainer.ts"
import { DeviceRefused, TrainingProtocol, type MicroBatchJson, type StepExecutionRef, type StepPlan } from "../protocols/device.ts"
import type { RunConfig } from "../protocols/run.ts"
import { SCHEDULER_KIND, SchedulerProtocol } from "../protocols/scheduler.ts"
import { readExecution } from "../protocols/trajectories.ts"
import { fetchOptimizer, publishWeights } from "../protocols/weights.ts"
import type * as Actor from "../runtime/actor.ts"
import { address, formatAddress, parseAddress } from "../runtime/names.ts"
import { refOf } from "../runtime/system.ts"
import { persistently } from "../common/retry.ts"
import { checkpointDue, saveTrainingCheckpoint } from "../training/checkpoints.ts"
import { InOrderSum, openGradientStore, type GradientSource, type MicroBatchGradient, type StepAttempt } from "../training/gradients.ts"
import { claimLoop, closeStepQueue, ensureMicroBatchStream, openStepQueue, publishMicroBatch, type Claim } from "../training/microbatch-queue.ts"
import { MetricsSum, PhaseClock, microBatchStats, summarize, type BatchSummary, type MicroBatchStats } from "../training/step-metrics.ts"
import { StepPlanner, stepLoss, type PlannedMicroBatch } from "../training/step-planner.ts"
import { stepUpdate, type StepUpdate } from "../training/update.ts"
import { fetchFlatWeights } from "../serving/rollout-role.ts"
import type { TrainingRoleFactory } from "../serving/training-role.ts"

/** The model's policy version and the one way the role changes its weights. */
export interface ModelWeights {
  readonly version: () => number
  /** Runs `apply`, which makes the weights version `version`, out of the way of any engine step. */
  readonly swap: (apply: Effect.Effect<void, NativeError>, version: number) => Effect.Effect<void, NativeError>
}

/** Weights of a model only the training role uses, at version `initial`. */
export const ownWeights = (initial: number): ModelWeights => {
  let version = initial
  return {
    version: () => version,
    swap: (apply, next) =>
      apply.pipe(
        Effect.tap(() =>
          Effect.sync(() => {
            version = next
          })
        )
      )
  }
}

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

/** The core's running step. */
interface CoreStep {
  readonly plan: StepPlan
  readonly planner: StepPlanner
  readonly sum: InOrderSum
  readonly metrics: MetricsSum
  readonly clock: PhaseClock
  /** Every micro-batch planned so far, and what the metrics need of it. */
  readonly planned: Map<number, { readonly microBatch: MicroBatchJson; readonly summary: BatchSummary }>
  readonly received: Set<number>
  readonly devices: Array<string>
  trainedTokens: number
  progressTold: number
  finishing: boolean
}

interface Claiming {
  readonly step: number
  readonly attempt: number
  stop: boolean
  fiber: Fiber.Fiber<void, unknown> | undefined
  /** Held while a claim is handled: a claim that finds `stop` set under it is handed back. */
  readonly handling: Semaphore.Semaphore
}

/**
 * Transport hiccups in a handler are retried; what still fails after that is a defect of the
 * incarnation (it crashes, and the request comes back to the next one). Work of the role's own
 * fibers (finishing a step, a claimed gradient) has no one to ask again: it retries
 * `persistently`, through an outage of NATS of any length, until the incarnation ends.
 */
const transient = { times: 8, schedule: Schedule.exponential(Duration.millis(100)) }

const toJson = (plan: StepPlan, core: string, mb: PlannedMicroBatch): MicroBatchJson => ({
  step: plan.step,
  attempt: plan.attempt,
  core,
  index: mb.index,
  version: plan.step,
  executions: mb.executions,
  completesTokens: mb.completesTokens,
  batch: mb.batch
})

export const makeTrainingRole = (
  ctx: Pick<Actor.ActorContext<unknown>, "address" | "system">,
  options: TrainingRoleOptions
): Effect.Effect<TrainingRole, never, Scope.Scope> =>
  Effect.gen(function* () {
    const { model, trainer, engine, config, weights } = options
    const system = ctx.system
    const me = formatAddress(ctx.address)
    const ackWaitMs = options.ackWaitMs ?? 60_000
    const maxStaleness = config.policyConfig.max_staleness
    const scope = yield* Effect.scope
    const stepLock = yield* Semaphore.make(1)
    const trainerLock = yield* Semaphore.make(1)
    const claimLock = yield* Semaphore.make(1)
    const scheduler = refOf(SchedulerProtocol, address(SCHEDULER_KIND, "main"))
    const gradients = yield* openGradientStore(system, model.paramCount).pipe(Effect.retry(transient), Effect.orDie)
    yield* ensureMicroBatchStream(system).pipe(Effect.retry(transient), Effect.orDie)

    let stepsDone = weights.version()
    /** The version the trainer's AdamW state belongs to (a fresh state: the version the role started on). */
    let optimizerAt = weights.version()
    let core: CoreStep | undefined
    let claiming: Claiming | undefined
    const early = new Map<number, Array<StepExecutionRef>>()

    const refuse = (reason: string) => new DeviceRefused({ device: me, reason })

    /** Brings the model to `version` (from the object store) unless it is there. */
    const ensureVersion = (version: number) =>
      weights.version() === version
        ? Effect.void
        : fetchFlatWeights(system, engine, model, version).pipe(Effect.flatMap((flat) => weights.swap(model.setWeights(flat), version)))

    /** Brings the optimizer to its state at `version`: the core that made it stored it beside the weights. */
    const ensureOptimizer = (version: number) =>
      optimizerAt === version
        ? Effect.void
        : version === 0
          ? Effect.fail(refuse(`the optimizer is at version ${optimizerAt}; step 0 needs a fresh one`))
          : fetchOptimizer(system, version).pipe(
              Effect.flatMap((bytes) => trainerLock.withPermit(trainer.loadOptimizer(bytes))),
              Effect.mapError((e) => refuse(`optimizer state of v${version}: ${e._tag === "WeightsUnavailable" ? e.reason : e.message}`)),
              Effect.tap(() =>
                Effect.sync(() => {
                  optimizerAt = version
                })
              )
            )

    /** The gradient of one micro-batch alone, on the model as it is. */
    const compute = (mb: MicroBatchJson) =>
      trainerLock.withPermit(
        Effect.gen(function* () {
          yield* trainer.zeroGrads()
          const result = yield* trainer.train(mb.batch, stepLoss(config, mb.step))
          const gradient: MicroBatchGradient = { grads: yield* trainer.getGrads(), logprobs: result.tokenLogprobs }
          return { gradient, stats: microBatchStats(result, mb.batch, mb.step, maxStaleness, config.training.isCap) }
        })
      )

    // ---- core: progress, gradients, finishing ------------------------------------------------

    const outstanding = (s: CoreStep) => s.planner.microBatches - s.received.size

    /** Progress is a running total: one that cannot be told is said in the log and left to the next one (or `StepDone`). */
    const tellProgress = (s: CoreStep) =>
      system
        .tell(scheduler, "StepProgress", { step: s.plan.step, trainedTokens: s.trainedTokens }, { msgId: `progress-${s.plan.step}-${s.plan.attempt}-${++s.progressTold}`, sender: me })
        .pipe(
          Effect.retry(transient),
          Effect.catch((e) => Effect.logWarning(`${me}: progress of step ${s.plan.step} not told: ${e.message}`))
        )

    /** Records micro-batch `index`'s gradient (once), adds what is in order, tells progress. */
    const gradientIn = (at: StepAttempt, index: number, device: string, stats: MicroBatchStats, source: GradientSource) =>
      stepLock.withPermit(
        Effect.gen(function* () {
          const s = core
          const planned = s?.planned.get(index)
          if (s === undefined || s.plan.step !== at.step || s.plan.attempt !== at.attempt || s.finishing || planned === undefined) return false
          if (!s.sum.offer(index, source)) return false
          s.received.add(index)
          if (!s.devices.includes(device)) s.devices.push(device)
          s.metrics.add(stats, planned.summary, planned.microBatch.executions)
          s.trainedTokens += s.planner.gradientIn(index)
          s.clock.set(outstanding(s) > 0, Date.now())
          yield* s.sum.drain((i) => storedGradient(s, i))
          yield* tellProgress(s)
          yield* finishWhenComplete(s)
          return true
        })
      )

    /**
     * A satellite's gradient from the store; one that cannot be read (its micro-batch already
     * acknowledged) is recomputed here, from the batch the core planned, on the same weights.
     */
    const storedGradient = (s: CoreStep, index: number) =>
      gradients.get(s.plan, index, s.planned.get(index)!.microBatch.batch.length).pipe(
        Effect.catchTag("GradientUnreadable", (e) => Effect.as(Effect.logWarning(`${me}: ${e.object} unreadable (${e.reason}); recomputing it`), undefined)),
        persistently(`reading the gradient of micro-batch ${s.plan.step}.${index}`),
        Effect.flatMap((stored) => (stored !== undefined ? Effect.succeed(stored) : compute(s.planned.get(index)!.microBatch).pipe(Effect.map((r) => r.gradient), Effect.orDie)))
      )

    /** Micro-batches of a completed group: kept, then published in index order. */
    const enqueue = (s: CoreStep, microBatches: ReadonlyArray<PlannedMicroBatch>) =>
      Effect.gen(function* () {
        for (const mb of microBatches) {
          const microBatch = toJson(s.plan, me, mb)
          s.planned.set(mb.index, { microBatch, summary: summarize(mb.batch, s.plan.step, maxStaleness) })
          yield* publishMicroBatch(system, microBatch).pipe(Effect.retry(transient), Effect.orDie)
        }
        s.clock.set(outstanding(s) > 0, Date.now())
      })

    /** Plans one finished execution of the running step (under the step lock). */
    const planExecution = (s: CoreStep, ref: StepExecutionRef) =>
      Effect.gen(function* () {
        const { trajectory, malformed } = yield* readExecution(system, ref.execution).pipe(Effect.retry(transient), Effect.orDie)
        for (const r of trajectory.rejected) yield* Effect.logWarning(`${me}: ${ref.execution}: record ${r.callId} rejected (${r.reason}): ${r.detail}`)
        for (const m of malformed) yield* Effect.logWarning(`${me}: ${ref.execution}: malformed record ${m.seq}: ${m.reason}`)
        const told = s.planner.tell(ref, trajectory.decoder.tree)
        if (told._tag === "Refused") {
          yield* Effect.logWarning(`${me}: TrainExecution ${ref.execution} refused: ${told.reason}`)
          return false
        }
        if (told._tag === "Duplicate") return true
        for (const e of told.tooLong) yield* Effect.logWarning(`${me}: ${e} dropped: a path is longer than ${config.training.microBatchTokens} tokens`)
        yield* enqueue(s, told.microBatches)
        if (told.consumedTokens > 0) {
          s.trainedTokens += told.consumedTokens
          yield* tellProgress(s)
        }
        yield* finishWhenComplete(s)
        return true
      })

    const finishWhenComplete = (s: CoreStep) =>
      s.finishing || !s.planner.complete || outstanding(s) > 0 || s.sum.summed < s.planner.microBatches
        ? Effect.void
        : Effect.sync(() => {
            s.finishing = true
            s.clock.stop(Date.now())
          }).pipe(
            Effect.andThen(
              Effect.forkIn(
                finish(s).pipe(Effect.tapCause((cause) => Effect.logError(`${me}: finishing step ${s.plan.step} failed`, cause))),
                scope
              )
            ),
            Effect.asVoid
          )

    /** The step's update (`stepUpdate`; none when nothing was trained), under `swap`. */
    const update = (s: CoreStep) =>
      Effect.gen(function* () {
        let result: StepUpdate = { gradNorm: 0, clipFraction: undefined }
        const next = s.plan.step + 1
        const batches = [...s.planned.keys()].sort((a, b) => a - b).map((i) => s.planned.get(i)!.microBatch.batch)
        const apply =
          s.planner.microBatches === 0
            ? Effect.void
            : stepUpdate(trainer, config, s.plan.step, batches, s.sum).pipe(
                Effect.map((r) => {
                  result = r
                })
              )
        yield* trainerLock.withPermit(weights.swap(apply, next))
        optimizerAt = next
        return result
      })

    /** The update, once; then each publication retried on its own (never the update). */
    const finish = (s: CoreStep) =>
      stepLock.withPermit(
        Effect.gen(function* () {
          const step = s.plan.step
          const version = step + 1
          const reduceStart = Date.now()
          const { gradNorm, clipFraction } = yield* update(s).pipe(Effect.orDie)
          const publishStart = Date.now()
          const safetensors = yield* model.save().pipe(Effect.orDie)
          const optimizer = yield* trainerLock.withPermit(trainer.saveOptimizer()).pipe(Effect.orDie)
          yield* publishWeights(system, version, safetensors, optimizer).pipe(persistently(`publishing v${version}`))
          if (checkpointDue(config, version)) {
            yield* saveTrainingCheckpoint(config.checkpointDir, model, trainer, { run: system.run, version }).pipe(Effect.orDie)
          }
          const metrics = {
            ...s.metrics.metrics({
              step,
              figures: s.planner.figures,
              microBatches: s.planner.microBatches,
              devices: s.devices,
              gradNorm,
              clipFraction,
              clock: s.clock,
              reduceMs: publishStart - reduceStart,
              publishMs: Date.now() - publishStart
            }),
            plan: s.plan
          }
          yield* system.publishEvent("step", metrics).pipe(persistently(`journaling step ${step}'s metrics`))
          yield* system.tell(scheduler, "StepDone", { step, version, metrics }, { msgId: `step-${step}-done`, sender: me }).pipe(persistently(`telling StepDone ${step}`))
          stepsDone = version
          core = undefined
          yield* Effect.all([closeStepQueue(system, step), gradients.removeStep(s.plan, s.planner.microBatches)]).pipe(
            Effect.catch((e) => Effect.logWarning(`${me}: cleaning up step ${step}: ${e.message}`))
          )
        })
      )

    // ---- every training device: the claim loop ------------------------------------------------

    /** Computes a claimed micro-batch and hands its gradient to the core of its attempt. */
    const deliver = (claim: Claim) =>
      Effect.gen(function* () {
        const mb = claim.microBatch
        yield* claim.hold(
          Effect.gen(function* () {
            yield* options.onClaim?.({ step: mb.step, index: mb.index, deliveryCount: claim.deliveryCount }) ?? Effect.void
            yield* ensureVersion(mb.version)
            const { gradient, stats } = yield* compute(mb)
            if (mb.core === me) return yield* gradientIn(mb, mb.index, me, stats, gradient)
            yield* gradients.put(mb, mb.index, gradient)
            const coreRef = refOf(TrainingProtocol, parseAddress(mb.core))
            const ready = { step: mb.step, attempt: mb.attempt, index: mb.index, device: me, stats }
            yield* system.tell(coreRef, "GradientReady", ready, { msgId: `grad-${mb.step}-${mb.attempt}-${mb.index}`, sender: me })
            return true
          })
        )
        yield* claim.ack
      })

    const runClaims = (c: Claiming) =>
      claimLoop(system, { step: c.step, ackWaitMs, stop: () => c.stop }, (claim) =>
        c.handling.withPermit(Effect.suspend(() => (c.stop ? claim.handBack : deliver(claim))))
      ).pipe(
        Effect.tapError((e) => Effect.logWarning(`${me}: claiming step ${c.step} failed, retrying: ${String(e)}`)),
        Effect.retry({ while: () => !c.stop, schedule: Schedule.spaced(Duration.millis(500)) }),
        // Stopped while waiting to retry: the loop ends as asked (a claim in hand was handed back).
        Effect.catch((e) => (c.stop ? Effect.void : Effect.fail(e))),
        Effect.tapCause((cause) =>
          Cause.hasInterruptsOnly(cause) ? Effect.void : Effect.logError(`${me}: claim loop of step ${c.step} stopped`, cause)
        ),
        Effect.ensuring(
          Effect.sync(() => {
            c.stop = true
          })
        )
      )

    const stop = Effect.suspend(() => {
      const c = claiming
      if (c === undefined) return Effect.void
      c.stop = true
      return c.fiber === undefined ? Effect.void : Fiber.await(c.fiber).pipe(Effect.asVoid)
    })
    /**
     * Leaving the role: claiming stops once the micro-batch in hand (if any) is done, without
     * waiting out the loop's pending pull (up to 1 s); what that pull still brings is handed back.
     */
    const stopClaiming = claimLock.withPermit(
      Effect.suspend(() => {
        const c = claiming
        if (c === undefined) return Effect.void
        c.stop = true
        return c.handling.withPermit(Effect.void)
      })
    )

    /** Claims micro-batches of the attempt at a step (one loop per device: a loop of another is stopped first). */
    const startClaiming = (at: StepAttempt) =>
      claimLock.withPermit(
        Effect.gen(function* () {
          if (claiming !== undefined && claiming.step === at.step && claiming.attempt === at.attempt && !claiming.stop) return
          yield* stop
          const c: Claiming = { step: at.step, attempt: at.attempt, stop: false, fiber: undefined, handling: yield* Semaphore.make(1) }
          claiming = c
          c.fiber = yield* Effect.forkIn(runClaims(c), scope)
        })
      )

    // ---- handlers -------------------------------------------------------------------------------

    const begin = (plan: StepPlan) =>
      Effect.gen(function* () {
        const planned = plan.groupSizes.reduce((a, b) => a + b, 0)
        if (plan.version !== plan.step) return yield* refuse(`step ${plan.step} must train version ${plan.step}, not ${plan.version}`)
        if (planned !== plan.executions) return yield* refuse(`groups of ${planned} executions in a plan of ${plan.executions}`)
        yield* ensureVersion(plan.version).pipe(Effect.mapError((e) => refuse(`weights v${plan.version}: ${e.message}`)))
        yield* ensureOptimizer(plan.version)
        // Nothing of an earlier attempt at the step (a lost core's micro-batches) is claimed.
        yield* closeStepQueue(system, plan.step).pipe(Effect.andThen(openStepQueue(system, plan.step, ackWaitMs)), Effect.retry(transient), Effect.orDie)
        stepsDone = plan.step
        const s: CoreStep = {
          plan,
          planner: new StepPlanner(plan, config.training, config.seed),
          sum: new InOrderSum(model.paramCount),
          metrics: new MetricsSum(),
          clock: new PhaseClock(Date.now()),
          planned: new Map(),
          received: new Set(),
          devices: [me],
          trainedTokens: 0,
          progressTold: 0,
          finishing: false
        }
        core = s
        for (const ref of early.get(plan.step) ?? []) yield* planExecution(s, ref)
        early.delete(plan.step)
      })

    const handlers: TrainingHandlers = {
      StartStep: (plan) =>
        stepLock
          .withPermit(
            Effect.gen(function* () {
              if (plan.step < stepsDone) return false
              if (core !== undefined && core.plan.step !== plan.step) return yield* refuse(`step ${core.plan.step} is running`)
              if (core?.finishing === true && core.plan.attempt !== plan.attempt) return yield* refuse(`attempt ${core.plan.attempt} at step ${plan.step} is finishing`)
              // A later attempt at the step (this device was its core, and was counted lost) replaces the earlier one.
              if (core === undefined || core.plan.attempt !== plan.attempt) yield* begin(plan)
              return true
            })
          )
          .pipe(
            Effect.tap((started) => (started ? startClaiming(plan) : Effect.void)),
            Effect.map((started) => ({ started }))
          ),
      TrainExecution: (ref) =>
        stepLock.withPermit(
          Effect.gen(function* () {
            if (ref.step < stepsDone) return { queued: false }
            if (core === undefined || ref.step > core.plan.step) {
              const waiting = early.get(ref.step) ?? []
              if (!waiting.some((r) => r.execution === ref.execution)) waiting.push(ref)
              early.set(ref.step, waiting)
              return { queued: true }
            }
            return { queued: yield* planExecution(core, ref) }
          })
        ),
      JoinStep: ({ step, attempt, core: coreDevice }) =>
        Effect.gen(function* () {
          if (coreDevice === me && (core?.plan.step !== step || core.plan.attempt !== attempt)) return yield* refuse(`step ${step} attempt ${attempt} is not running here`)
          yield* startClaiming({ step, attempt })
          return { joined: true }
        }),
      GradientReady: ({ step, attempt, index, device, stats }) =>
        gradientIn({ step, attempt }, index, device, stats, "stored").pipe(Effect.map((accepted) => ({ accepted })))
    }

    return {
      handlers,
      leave: stopClaiming,
      step: () => (claiming === undefined || claiming.stop ? -1 : claiming.step)
    }
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
