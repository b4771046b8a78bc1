/**
 * The core's side of a training step: the step's plan, its micro-batches, the in-order sum of
 * their gradients, the update and the publication of the next version (ARCHITECTURE.md,
 * "Training"). The device's training role (`src/actors/trainer.ts`) owns one per incarnation
 * and routes `StartStep`, `TrainExecution` and `GradientReady` to it.
 *
 * - `startStep(plan)` begins an attempt at a step (or finds it running): the model and the
 *   optimizer brought to the step's version, the step's work queue opened empty, executions
 *   told before the step planned.
 * - `trainExecution(ref)` reads a finished execution's call records back, plans it
 *   (`StepPlanner`) and publishes the micro-batches its group completes, in index order: each
 *   built, stored as an object (`microbatch-store.ts`) and its reference put on the work queue,
 *   one at a time, so the core holds one built micro-batch, not the step's.
 * - `gradientIn(...)` takes micro-batch `index`'s gradient once (in memory from this device, or
 *   `"stored"` by a satellite, or `{failed}`: it cannot be trained), adds what is in order and
 *   tells the scheduler `StepProgress`. The core's own gradient that is not next in order is
 *   stored like a satellite's, so no more than one gradient waits in memory.
 * - Once every planned execution is told and every gradient is in, `finish` (forked in the
 *   incarnation's scope): the update (`stepUpdate`), `v<k+1>` and the optimizer state published,
 *   a checkpoint when due, the metrics journaled, `StepDone` told, the step's queue, batches
 *   and gradients removed.
 *
 * Nothing is dropped with only a log line: an execution whose call records were rejected or did
 * not decode, or one with tokens in a micro-batch that failed, is an error of the step
 * (`StepMetrics.errors`, with the reason).
 */
import { Context, Effect, Layer, Semaphore, type Scope } from "effect"
import type { RpcGroup } from "effect/rpc"
import type { PackedBatch } from "../common/packed-batch.ts"
import type { Model } from "../engine/engine.ts"
import type { NativeError } from "../engine/native.ts"
import type { Trainer } from "../engine/trainer.ts"
import { DeviceRefused, type MicroBatchRef, type StepExecutionRef, type StepPlan } from "../protocols/device.ts"
import type { RunConfig } from "../protocols/run.ts"
import { SCHEDULER_KIND, SchedulerProtocol } from "../protocols/scheduler.ts"
import { Events } from "../protocols/topology.ts"
import { readExecution } from "../protocols/trajectories.ts"
import { fetchOptimizer, publishWeights } from "../protocols/weights.ts"
import { address } from "../runtime/names.ts"
import { refOf, type ActorRef, type ActorSystemShape } from "../runtime/system.ts"
import { persistently, transient } from "../common/retry.ts"
import { checkpointDue, saveTrainingCheckpoint } from "./checkpoints.ts"
import { InOrderSum, type GradientSource, type GradientStore, type MicroBatchGradient, type StepAttempt } from "./gradients.ts"
import { closeStepQueue, openStepQueue, publishMicroBatch } from "./microbatch-queue.ts"
import type { MicroBatchStore } from "./microbatch-store.ts"
import { MetricsSum, PhaseClock, summarize, type BatchSummary, type MicroBatchStats } from "./step-metrics.ts"
import { StepPlanner, type PlannedMicroBatch } from "./step-planner.ts"
import { ppoEpochs, stepUpdate, type StepUpdate } from "./update.ts"

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

/** What the core needs of its device and role. */
export interface CoreDeps {
  readonly system: ActorSystemShape
  /** This device's key, `device/<id>`. */
  readonly me: string
  readonly config: RunConfig
  readonly model: Model
  readonly trainer: Trainer
  /** Held around every use of `trainer`. */
  readonly trainerLock: Semaphore.Semaphore
  readonly gradients: GradientStore
  readonly batches: MicroBatchStore
  readonly weights: ModelWeights
  /** Brings the model to `version` (from the object store) unless it is there. */
  readonly ensureVersion: (version: number) => Effect.Effect<void, { readonly message: string }>
  /** One micro-batch's gradient alone, on the model as it is. */
  readonly compute: (ref: MicroBatchRef, batch: PackedBatch) => Effect.Effect<{ readonly gradient: MicroBatchGradient }, unknown>
  readonly ackWaitMs: number
  /** The incarnation's scope: the step's finishing fiber lives there. */
  readonly scope: Scope.Scope
}

/** The core's running step. */
interface CoreStep {
  readonly plan: StepPlan
  readonly planner: StepPlanner
  readonly sum: InOrderSum
  readonly metrics: MetricsSum
  readonly clock: PhaseClock
  /** Every micro-batch planned so far (its reference: the batch is in the store), and what the metrics need of it. */
  readonly planned: Map<number, { readonly ref: MicroBatchRef; readonly summary: BatchSummary }>
  readonly received: Set<number>
  readonly devices: Array<string>
  trainedTokens: number
  progressTold: number
  finishing: boolean
}

/** What `gradientIn` is handed: a gradient in memory, one in the store, or why the micro-batch cannot be trained. */
export type Delivered = MicroBatchGradient | "stored" | { readonly failed: string }

const outstanding = (s: CoreStep) => s.planner.microBatches - s.received.size

/** The core's state across steps. */
interface CoreState {
  /** Steps before this one are done here (the version the role started on, then each finished step's). */
  stepsDone: number
  /** The version the trainer's AdamW state belongs to (a fresh state: the version the role started on). */
  optimizerAt: number
  /** The running step. */
  step: CoreStep | undefined
  /** Executions told before their step started here, by step. */
  readonly early: Map<number, Array<StepExecutionRef>>
}

/** What the core's operations share: its device and role, the scheduler, the step lock, the state. */
interface CoreContext {
  readonly deps: CoreDeps
  readonly scheduler: ActorRef<RpcGroup.Rpcs<typeof SchedulerProtocol>>
  /** Held by every operation on the running step. */
  readonly stepLock: Semaphore.Semaphore
  readonly state: CoreState
}

const refuse = (c: CoreContext, reason: string) => new DeviceRefused({ device: c.deps.me, reason })

/** Brings the optimizer to its state at `version`: the core that made it stored it beside the weights. */
const ensureOptimizer = (c: CoreContext, version: number) => {
  const { system, trainer, trainerLock } = c.deps
  return c.state.optimizerAt === version
    ? Effect.void
    : version === 0
      ? Effect.fail(refuse(c, `the optimizer is at version ${c.state.optimizerAt}; step 0 needs a fresh one`))
      : fetchOptimizer(system, version).pipe(
          Effect.flatMap((bytes) => trainerLock.withPermit(trainer.loadOptimizer(bytes))),
          Effect.mapError((e) => refuse(c, `optimizer state of v${version}: ${e._tag === "WeightsUnavailable" ? e.reason : e.message}`)),
          Effect.tap(() =>
            Effect.sync(() => {
              c.state.optimizerAt = version
            })
          )
        )
}

/** Progress is a running total: one that cannot be told is said in the log and left to the next one (or `StepDone`). */
const tellProgress = (c: CoreContext, s: CoreStep) => {
  const { system, me } = c.deps
  return system
    .tell(c.scheduler, "StepProgress", { step: s.plan.step, trainedTokens: s.trainedTokens }, { msgId: `progress-${s.plan.step}-${s.plan.attempt}-${++s.progressTold}`, sender: me })
    .pipe(
      Effect.retry(transient),
      Effect.catch((e) => Effect.logWarning(`${me}: progress of step ${s.plan.step} not told: ${e.message}`))
    )
}

/** Records micro-batch `index`'s gradient (once), adds what is in order, tells progress. */
const gradientIn = (c: CoreContext) =>
  Effect.fn("Core.gradientIn")((at: StepAttempt, index: number, device: string, stats: MicroBatchStats, delivered: Delivered) =>
    c.stepLock.withPermit(
      Effect.gen(function* () {
        const s = c.state.step
        const planned = s?.planned.get(index)
        if (s === undefined || s.plan.step !== at.step || s.plan.attempt !== at.attempt || s.finishing || planned === undefined) return false
        if (s.received.has(index)) return false
        if (typeof delivered === "object" && "failed" in delivered) {
          for (const e of planned.ref.executions) s.metrics.addError(e, `micro-batch ${index}: ${delivered.failed}`)
        } else s.metrics.add(stats, planned.summary, planned.ref.executions)
        s.sum.offer(index, yield* sourceOf(c, s, index, delivered))
        s.received.add(index)
        if (!s.devices.includes(device)) s.devices.push(device)
        s.trainedTokens += s.planner.gradientIn(index)
        s.clock.set(outstanding(s) > 0, Date.now())
        yield* s.sum.drain((i) => storedGradient(c, s, i))
        yield* tellProgress(c, s)
        yield* finishWhenComplete(c, s)
        return true
      })
    ))

/** Where a delivered gradient waits for its turn: the core's own goes to the store, not memory, unless it is next. */
const sourceOf = (c: CoreContext, s: CoreStep, index: number, delivered: Delivered): Effect.Effect<GradientSource> =>
  typeof delivered === "object" && "failed" in delivered
    ? Effect.succeed("failed")
    : delivered === "stored" || s.sum.inTurn(index)
      ? Effect.succeed(delivered)
      : c.deps.gradients.put(s.plan, index, delivered).pipe(persistently(`storing the gradient of ${s.plan.step}.${index}`), Effect.as("stored" as const))

/** A planned micro-batch's batch, read back from the store. */
const batchOf = (c: CoreContext, s: CoreStep, index: number) =>
  c.deps.batches.get(s.planned.get(index)!.ref).pipe(persistently(`reading micro-batch ${s.plan.step}.${index}`, (e) => e._tag === "MicroBatchUnreadable"))

/**
 * A stored gradient; one that cannot be read (its micro-batch already acknowledged) is
 * recomputed here, from the batch the core planned, on the same weights.
 */
const storedGradient = (c: CoreContext, s: CoreStep, index: number) =>
  c.deps.gradients.get(s.plan, index, s.planned.get(index)!.ref.tokens).pipe(
    Effect.catchTag("GradientUnreadable", (e) => Effect.as(Effect.logWarning(`${c.deps.me}: ${e.object} unreadable (${e.reason}); recomputing it`), undefined)),
    persistently(`reading the gradient of micro-batch ${s.plan.step}.${index}`),
    Effect.flatMap((stored) =>
      stored !== undefined
        ? Effect.succeed(stored)
        : batchOf(c, s, index).pipe(
            Effect.flatMap((batch) => c.deps.compute(s.planned.get(index)!.ref, batch)),
            Effect.map((r) => r.gradient),
            Effect.orDie
          )
    )
  )

/** Micro-batches of a completed group: each built, stored, kept by reference and published, in index order. */
const enqueue = (c: CoreContext, s: CoreStep, microBatches: ReadonlyArray<PlannedMicroBatch>) =>
  Effect.gen(function* () {
    const { system, me, config, batches } = c.deps
    for (const mb of microBatches) {
      const batch = mb.build()
      const summary = summarize(batch, s.plan.step, config.policyConfig.max_staleness)
      const digest = yield* batches.put(s.plan, mb.index, batch).pipe(persistently(`storing micro-batch ${s.plan.step}.${mb.index}`))
      const ref: MicroBatchRef = {
        step: s.plan.step,
        attempt: s.plan.attempt,
        core: me,
        index: mb.index,
        version: s.plan.step,
        executions: mb.executions,
        completesTokens: mb.completesTokens,
        tokens: batch.length,
        digest
      }
      s.planned.set(mb.index, { ref, summary })
      yield* publishMicroBatch(system, ref).pipe(Effect.retry(transient), Effect.orDie)
    }
    s.clock.set(outstanding(s) > 0, Date.now())
  })

/** Plans one finished execution of the running step (under the step lock). */
const planExecution = (c: CoreContext, s: CoreStep, ref: StepExecutionRef) =>
  Effect.gen(function* () {
    const { system, me } = c.deps
    const { trajectory, malformed } = yield* readExecution(system, ref.execution).pipe(Effect.retry(transient), Effect.orDie)
    const told = s.planner.tell(ref, trajectory.decoder.tree)
    if (told._tag === "Refused") {
      yield* Effect.logWarning(`${me}: TrainExecution ${ref.execution} refused: ${told.reason}`)
      return false
    }
    if (told._tag === "Duplicate") return true
    const lost = [
      ...trajectory.rejected.map((r) => `record ${r.callId} rejected (${r.reason}): ${r.detail}`),
      ...malformed.map((m) => `record at sequence ${m.seq} malformed: ${m.reason}`),
      ...[...trajectory.decoder.pending()].map((p) => `record ${p.callId} waits for ${p.waitsFor}, which never came`)
    ]
    if (lost.length > 0) {
      s.metrics.addError(ref.execution, `${lost.length} call record(s) not trained; the first: ${lost[0]}`)
      yield* Effect.logError(`${me}: ${ref.execution}: ${lost.length} call record(s) not trained (in the step's errors); the first: ${lost[0]}`)
    }
    yield* enqueue(c, s, told.microBatches)
    if (told.consumedTokens > 0) {
      s.trainedTokens += told.consumedTokens
      yield* tellProgress(c, s)
    }
    yield* finishWhenComplete(c, s)
    return true
  })

const finishWhenComplete = (c: CoreContext, s: CoreStep) =>
  s.finishing || !s.planner.complete || outstanding(s) > 0 || s.sum.summed < s.planner.microBatches
    ? Effect.void
    : Effect.sync(() => {
        s.finishing = true
        s.clock.stop(Date.now())
      }).pipe(
        Effect.andThen(
          Effect.forkIn(
            finish(c, s).pipe(Effect.tapCause((cause) => Effect.logError(`${c.deps.me}: finishing step ${s.plan.step} failed`, cause))),
            c.deps.scope
          )
        ),
        Effect.asVoid
      )

/** The step's update (`stepUpdate`; none when nothing was trained), under `swap`. */
const update = (c: CoreContext, s: CoreStep) =>
  Effect.gen(function* () {
    const { trainer, trainerLock, config } = c.deps
    let result: StepUpdate = { gradNorm: 0, clipFraction: undefined }
    const next = s.plan.step + 1
    const apply =
      s.planner.microBatches === s.sum.failed.size
        ? Effect.void
        : stepUpdate(trainer, config, s.plan.step, { count: s.planner.microBatches, load: (i) => batchOf(c, s, i) }, s.sum).pipe(
            Effect.map((r) => {
              result = r
            })
          )
    yield* trainerLock.withPermit(c.deps.weights.swap(apply, next))
    c.state.optimizerAt = next
    return result
  })

/** The version's weights and optimizer state published, and a checkpoint when due. */
const publishVersion = (c: CoreContext, version: number) =>
  Effect.gen(function* () {
    const { system, config, model, trainer, trainerLock } = c.deps
    const safetensors = yield* model.save().pipe(Effect.orDie)
    const optimizer = yield* trainerLock.withPermit(trainer.saveOptimizer()).pipe(Effect.orDie)
    yield* publishWeights(system, version, safetensors, optimizer).pipe(persistently(`publishing v${version}`))
    if (checkpointDue(config, version)) {
      yield* saveTrainingCheckpoint(config.checkpointDir, model, trainer, { run: system.run, version }).pipe(Effect.orDie)
    }
  })

/** The update, once; then each publication retried on its own (never the update). */
const finish = (c: CoreContext, s: CoreStep) =>
  c.stepLock.withPermit(
    Effect.gen(function* () {
      const { system, me, batches, gradients } = c.deps
      const step = s.plan.step
      const version = step + 1
      const reduceStart = Date.now()
      const { gradNorm, clipFraction } = yield* update(c, s).pipe(Effect.orDie)
      const publishStart = Date.now()
      yield* publishVersion(c, version)
      const metrics = {
        ...s.metrics.metrics({
          step,
          figures: s.planner.figures,
          microBatches: s.planner.microBatches,
          batchDigests: Array.from({ length: s.planner.microBatches }, (_, i) => s.planned.get(i)!.ref.digest),
          devices: s.devices,
          gradNorm,
          clipFraction,
          clock: s.clock,
          reduceMs: publishStart - reduceStart,
          publishMs: Date.now() - publishStart
        }),
        plan: s.plan
      }
      yield* system.publishEvent(Events.step, metrics).pipe(persistently(`journaling step ${step}'s metrics`))
      yield* system.tell(c.scheduler, "StepDone", { step, version, metrics }, { msgId: `step-${step}-done`, sender: me }).pipe(persistently(`telling StepDone ${step}`))
      c.state.stepsDone = version
      c.state.step = undefined
      yield* Effect.all([closeStepQueue(system, step), batches.removeStep(step), gradients.removeStep(step)]).pipe(
        Effect.catch((e) => Effect.logWarning(`${me}: cleaning up step ${step}: ${e.message}`))
      )
    })
  )

/** A new attempt's running step, empty. */
const newStep = (c: CoreContext, plan: StepPlan): CoreStep => ({
  plan,
  planner: new StepPlanner(plan, c.deps.config.training, c.deps.config.seed),
  sum: new InOrderSum(c.deps.model.paramCount, ppoEpochs(c.deps.config) > 1),
  metrics: new MetricsSum(),
  clock: new PhaseClock(Date.now()),
  planned: new Map(),
  received: new Set(),
  devices: [c.deps.me],
  trainedTokens: 0,
  progressTold: 0,
  finishing: false
})

const begin = (c: CoreContext, plan: StepPlan) =>
  Effect.gen(function* () {
    const { system, batches, gradients } = c.deps
    const planned = plan.groupSizes.reduce((a, b) => a + b, 0)
    if (plan.version !== plan.step) return yield* refuse(c, `step ${plan.step} must train version ${plan.step}, not ${plan.version}`)
    if (planned !== plan.executions) return yield* refuse(c, `groups of ${planned} executions in a plan of ${plan.executions}`)
    yield* c.deps.ensureVersion(plan.version).pipe(Effect.mapError((e) => refuse(c, `weights v${plan.version}: ${e.message}`)))
    yield* ensureOptimizer(c, plan.version)
    // Nothing of an earlier attempt at the step (a lost core's micro-batches) is claimed; its objects go.
    yield* Effect.all([closeStepQueue(system, plan.step), batches.removeStep(plan.step), gradients.removeStep(plan.step)]).pipe(
      Effect.andThen(openStepQueue(system, plan.step, c.deps.ackWaitMs)),
      Effect.retry(transient),
      Effect.orDie
    )
    c.state.stepsDone = plan.step
    const s = newStep(c, plan)
    c.state.step = s
    for (const ref of c.state.early.get(plan.step) ?? []) yield* planExecution(c, s, ref)
    c.state.early.delete(plan.step)
  })

/** `StartStep`: true when the attempt runs here (begun now or already), false for a step done. */
const startStep = (c: CoreContext) =>
  Effect.fn("Core.startStep")((plan: StepPlan) =>
    c.stepLock.withPermit(
      Effect.gen(function* () {
        const core = c.state.step
        if (plan.step < c.state.stepsDone) return false
        if (core !== undefined && core.plan.step !== plan.step) return yield* refuse(c, `step ${core.plan.step} is running`)
        if (core?.finishing === true && core.plan.attempt !== plan.attempt) return yield* refuse(c, `attempt ${core.plan.attempt} at step ${plan.step} is finishing`)
        // A later attempt at the step (this device was its core, and was counted lost) replaces the earlier one.
        if (core === undefined || core.plan.attempt !== plan.attempt) yield* begin(c, plan)
        return true
      })
    ))

/** `TrainExecution`: planned now, or kept until its step starts here; false when refused or for a step done. */
const trainExecution = (c: CoreContext) =>
  Effect.fn("Core.trainExecution")((ref: StepExecutionRef) =>
    c.stepLock.withPermit(
      Effect.gen(function* () {
        const core = c.state.step
        if (ref.step < c.state.stepsDone) return false
        if (core === undefined || ref.step > core.plan.step) {
          const waiting = c.state.early.get(ref.step) ?? []
          if (!waiting.some((r) => r.execution === ref.execution)) waiting.push(ref)
          c.state.early.set(ref.step, waiting)
          return true
        }
        return yield* planExecution(c, core, ref)
      })
    ))

/** The core's operations, as the device's training role routes them. */
export interface CoreShape {
  /** `StartStep`: true when the attempt runs here (begun now or already), false for a step done. */
  readonly startStep: (plan: StepPlan) => Effect.Effect<boolean, DeviceRefused>
  /** `TrainExecution`: planned now, or kept until its step starts here; false when refused or for a step done. */
  readonly trainExecution: (ref: StepExecutionRef) => Effect.Effect<boolean>
  /** Records micro-batch `index`'s gradient (once), adds what is in order, tells progress; false when not taken. */
  readonly gradientIn: (at: StepAttempt, index: number, device: string, stats: MicroBatchStats, delivered: Delivered) => Effect.Effect<boolean>
  /** Whether attempt `attempt` at `step` is this device's running step. */
  readonly runs: (at: StepAttempt) => boolean
}

const makeCore = Effect.fn("Core.make")(function* (deps: CoreDeps) {
  const version = deps.weights.version()
  const c: CoreContext = {
    deps,
    scheduler: refOf(SchedulerProtocol, address(SCHEDULER_KIND, "main")),
    stepLock: yield* Semaphore.make(1),
    state: { stepsDone: version, optimizerAt: version, step: undefined, early: new Map() }
  }
  const runs = (at: StepAttempt) => c.state.step?.plan.step === at.step && c.state.step.plan.attempt === at.attempt
  return { startStep: startStep(c), trainExecution: trainExecution(c), gradientIn: gradientIn(c), runs } satisfies CoreShape
})

/** The core's side of a training step, one per training-role incarnation (the module comment). */
export class Core extends Context.Service<Core, CoreShape>()("gyre/training/Core") {
  static readonly make: (deps: CoreDeps) => Effect.Effect<CoreShape> = makeCore
  static readonly layer = (deps: CoreDeps) => Layer.effect(Core, makeCore(deps))
}
