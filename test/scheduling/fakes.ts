/**
 * Scripted stand-ins for the scheduler's counterparts, as real actors on a real NATS: a
 * device (`device/<id>`, `DeviceProtocol`) whose switches, weight loads and training take
 * scripted times, and a harness runner (`harness-runner/<id>`) whose executions do. They keep
 * what they were asked in an `Observed` the test reads.
 *
 * - The fake device tells `DeviceJoined` when it starts (each incarnation; `Drain` crashes it). As a step's core (`StartStep`) it
 *   trains every execution told (`TrainExecution`, deduplicated by execution) for
 *   `trainMs`, one at a time and only while it is in the training role, reporting
 *   `StepProgress` after each and, once the batch's executions are all trained, takes
 *   `updateMs` for its update, then reports its metrics (the measured training and update
 *   times as `computeMs` and `reduceMs`) on `gyre.<run>.sys.step` (as the real trainer) and `StepDone`.
 * - The fake runner sleeps `executionMs(n)`, writes `calls(n)` call records of the execution to
 *   the trajectory stream (through the gateway's delta encoder) and its outcome, and answers;
 *   a second `RunExecution` of one execution joins the running one or gets its outcome.
 */
import { Deferred, Duration, Effect, FiberSet, Schema } from "effect"
import * as Actor from "../../src/runtime/actor.ts"
import { formatAddress } from "../../src/runtime/names.ts"
import { DeviceProtocol, type StepExecutionRef, type StepPlan } from "../../src/protocols/device.ts"
import { HarnessRunnerProtocol } from "../../src/protocols/harness.ts"
import { WeightsUnavailable } from "../../src/protocols/rollout.ts"
import { ensureTrajectoryStream, rlLayout } from "../../src/protocols/layout.ts"
import { parseExecutionName } from "../../src/protocols/run.ts"
import type { StepMetrics } from "../../src/protocols/scheduler.ts"
import { Events } from "../../src/protocols/topology.ts"
import type { CellRole } from "../../src/policy/vocabulary.ts"
import { DeltaEncoder } from "../../src/tree/encoder.ts"
import type { ExecutionOutcome } from "../../src/tree/outcome.ts"
import { CallRecord, plainCall } from "../../src/tree/record.ts"
import { schedulerRef } from "../../src/actors/scheduler.ts"

export interface Script {
  readonly executionMs: (n: number) => number
  readonly switchMs: number
  readonly trainMs: number
  readonly updateMs: number
  readonly calls: (n: number) => number
}

export interface Observed {
  /** RunExecution requests per execution, and how many of them started it. */
  readonly asks: Map<string, number>
  readonly starts: Map<string, number>
  /** Unique tokens of each execution's tree, as written. */
  readonly tokens: Map<string, number>
  /** TrainExecution messages per execution (duplicates included), and executions trained. */
  readonly told: Map<string, number>
  readonly trained: Map<string, number>
  /** The evaluation of each told execution's outcome. */
  readonly evaluations: Map<string, string>
  readonly switches: Array<{ readonly device: string; readonly role: CellRole }>
  readonly loads: Array<{ readonly device: string; readonly version: number }>
  readonly joins: Array<{ readonly device: string; readonly step: number }>
}

export const observed = (): Observed => ({
  asks: new Map(),
  starts: new Map(),
  tokens: new Map(),
  told: new Map(),
  trained: new Map(),
  evaluations: new Map(),
  switches: [],
  loads: [],
  joins: []
})

const bump = (m: Map<string, number>, k: string) => m.set(k, (m.get(k) ?? 0) + 1)
const notHere = Effect.die(new Error("not used by the scheduler tests"))

const metricsOf = (
  plan: StepPlan,
  tokens: number,
  device: string,
  trained: ReadonlyArray<string>,
  times: { readonly computeMs: number; readonly reduceMs: number }
): StepMetrics => ({
  step: plan.step,
  version: plan.step + 1,
  executions: plan.executions,
  dropped: 0,
  meanScore: 0.5,
  tokensTrained: tokens,
  loss: 0,
  entropy: 0,
  clipFraction: 0,
  isWeightMean: 1,
  isWeightMax: 1,
  behaviourKl: 0,
  staleness: [tokens],
  staleTokens: 0,
  dedupRatio: 1,
  microBatches: plan.executions,
  trainedExecutions: trained,
  devices: [device],
  gradNorm: 0,
  waitMs: 0,
  ...times,
  publishMs: 0
})

interface CoreStep {
  readonly plan: StepPlan
  readonly queue: Array<StepExecutionRef>
  readonly seen: Set<string>
}

export const fakeDevice = (script: Script, seen: Observed) =>
  Actor.make({
    kind: "device",
    protocol: DeviceProtocol,
    state: { schema: Schema.Struct({}), initial: () => ({}) },
    concurrency: 16,
    behaviour: (ctx) =>
      Effect.gen(function* () {
        const system = ctx.system
        const key = formatAddress(ctx.address)
        let role: CellRole = "rollout"
        let switching = false
        let version = 0
        const steps = new Map<number, CoreStep>()
        const early: Array<StepExecutionRef> = []
        const fork = yield* FiberSet.makeRuntime<never, unknown, unknown>()
        const tellScheduler = system.tell

        const trainLoop = (s: CoreStep) =>
          Effect.gen(function* () {
            let trained = 0
            let tokens = 0
            let computeMs = 0
            const executions: Array<string> = []
            while (trained < s.plan.executions) {
              if (s.queue.length === 0 || role !== "training" || switching) {
                yield* Effect.sleep(Duration.millis(10))
                continue
              }
              const ref = s.queue.shift()!
              const started = Date.now()
              yield* Effect.sleep(Duration.millis(script.trainMs))
              computeMs += Date.now() - started
              bump(seen.trained, ref.execution)
              trained++
              tokens += ref.tokens
              executions.push(ref.execution)
              yield* tellScheduler(schedulerRef, "StepProgress", { step: s.plan.step, trainedTokens: tokens }, { msgId: `progress-${s.plan.step}-${trained}` })
            }
            const updating = Date.now()
            yield* Effect.sleep(Duration.millis(script.updateMs))
            const metrics = metricsOf(s.plan, tokens, key, executions, { computeMs, reduceMs: Date.now() - updating })
            yield* system.publishEvent(Events.step, metrics)
            yield* tellScheduler(schedulerRef, "StepDone", { step: s.plan.step, version: s.plan.step + 1, metrics }, { msgId: `done-${s.plan.step}` })
          })

        const queue = (ref: StepExecutionRef) => {
          const s = steps.get(ref.step)
          if (s === undefined) return void early.push(ref)
          if (s.seen.has(ref.execution)) return
          s.seen.add(ref.execution)
          s.queue.push(ref)
        }

        yield* tellScheduler(schedulerRef, "DeviceJoined", { device: key }, { msgId: `joined-${key}-${ctx.incarnation}` })
        return {
          SwitchRole: ({ role: to, version: newest }) =>
            Effect.gen(function* () {
              if (to === "rollout" && newest !== undefined) version = Math.max(version, newest)
              if (to !== role || switching) {
                switching = true
                role = to
                yield* Effect.sleep(Duration.millis(script.switchMs))
                switching = false
                seen.switches.push({ device: key, role: to })
              }
              return { role: to, generationsMoved: 0, contextsMoved: 1, bytesMoved: 1000, reprefillTokens: 0, ms: script.switchMs, controlMs: 1 }
            }),
          // As the real device: only a device serving rollouts loads weights.
          LoadWeights: ({ version: v }) =>
            role !== "rollout" || switching
              ? Effect.fail(new WeightsUnavailable({ version: v, reason: `${key} is not serving rollouts` }))
              : Effect.sync(() => {
                  version = Math.max(version, v)
                  seen.loads.push({ device: key, version: v })
                  return { version }
                }),
          StartStep: (plan) =>
            Effect.sync(() => {
              if (!steps.has(plan.step)) {
                const s: CoreStep = { plan, queue: [], seen: new Set() }
                steps.set(plan.step, s)
                for (const ref of early.splice(0)) queue(ref)
                fork(trainLoop(s))
              }
              return { started: true }
            }),
          TrainExecution: (ref) =>
            Effect.sync(() => {
              bump(seen.told, ref.execution)
              seen.evaluations.set(ref.execution, ref.outcome.evaluation)
              queue(ref)
              return { queued: true }
            }),
          JoinStep: ({ step }) =>
            Effect.sync(() => {
              seen.joins.push({ device: key, step })
              return { joined: true }
            }),
          Status: () =>
            Effect.succeed({ activeSequences: 0, cachedExecutions: 0, freeBlocks: 0, usedBlocks: 0, tokensPerSecond: 0, version, draining: role !== "rollout", processedTokens: 0, promptTokens: 0, cachedTokens: 0, reprefillTokens: 0, evictedContexts: 0, preemptions: 0 }),
          Generate: () => notHere,
          Cancel: () => notHere,
          Release: () => notHere,
          // The tests' way to crash a device: its supervisor restarts it as a new incarnation.
          Drain: () => Effect.die(new Error("asked to crash")),
          ImportContexts: () => notHere,
          GradientReady: () => notHere
        }
      })
  })

const encodeRecord = Schema.encodeSync(CallRecord)

export const fakeRunner = (script: Script, seen: Observed) =>
  Actor.make({
    kind: "harness-runner",
    protocol: HarnessRunnerProtocol,
    state: { schema: Schema.Struct({}), initial: () => ({}) },
    concurrency: 64,
    behaviour: (ctx) =>
      Effect.gen(function* () {
        const system = ctx.system
        const names = rlLayout(system.run)
        yield* ensureTrajectoryStream(system)
        const running = new Map<string, Deferred.Deferred<ExecutionOutcome>>()
        const publish = (subject: string, data: string, msgID: string) => Effect.promise(() => system.nats.js.publish(subject, data, { msgID }))
        // Every RunExecution sent, seen on the wire: an ask again with the same message id is
        // answered by the runtime (joined to the first) and never reaches the handler.
        const wire = system.nats.nc.subscribe(system.layout.ask(ctx.address), {
          callback: (_, m) => {
            if (m.headers?.get("Gyre-Request") === "RunExecution") bump(seen.asks, (m.json() as { execution: string }).execution)
          }
        })
        yield* Effect.addFinalizer(() => Effect.sync(() => wire.unsubscribe()))

        const execute = (execution: string, task: string) =>
          Effect.gen(function* () {
            bump(seen.starts, execution)
            const n = parseExecutionName(execution)?.n ?? 0
            yield* Effect.sleep(Duration.millis(script.executionMs(n)))
            const encoder = new DeltaEncoder({ run: system.run, task, execution })
            const prompt = [1, 2, 3, n % 50]
            for (let i = 0; i < script.calls(n); i++) {
              const output = [10 + i, 20 + n % 7, 30]
              const record = encoder.encode(plainCall(`c${i}`, "main", prompt, output))
              yield* publish(names.calls(execution), JSON.stringify(encodeRecord(record)), `${execution}.c${i}`)
              prompt.push(...output, 40 + i)
            }
            seen.tokens.set(execution, encoder.uniqueTokens)
            const outcome: ExecutionOutcome = { run: system.run, task, execution, ended: "finished", evaluation: "scored", score: n % 2, attempts: 1, detail: "fake" }
            yield* publish(names.outcomes(execution), JSON.stringify(outcome), `outcome-${execution}`)
            return outcome
          })

        return {
          RunExecution: (req) =>
            Effect.gen(function* () {
              const known = running.get(req.execution)
              if (known !== undefined) return yield* Deferred.await(known)
              const done = yield* Deferred.make<ExecutionOutcome>()
              running.set(req.execution, done)
              const outcome = yield* execute(req.execution, `${req.task.suite}/${req.task.task}`)
              yield* Deferred.succeed(done, outcome)
              return outcome
            }),
          Status: () => Effect.succeed({ running: running.size, capacity: 64, finished: 0, dropped: 0 })
        }
      })
  })
