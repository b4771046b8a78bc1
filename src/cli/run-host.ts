/**
 * Hosting one training run on this node: `gyre train`'s and `gyre demo`'s shared middle.
 *
 * Starts a node (`main`) with `devices` device actors (each with the training role, announcing
 * itself to `scheduler/main`; CPU devices split the cores; none: the run waits for other nodes'
 * devices), the gateway on a free port, one harness runner with room for every execution the
 * plan can have open at once (B for each of the max_staleness + 1 open batches, whichever cells
 * serve them), and a scheduler candidate that stands by for the run's lease (the scheduler lives
 * on whichever candidate holds it; with `scheduler: false` none here, and the run waits for one on
 * another node, `gyre node --scheduler`). The run's configuration is journaled first, so candidates
 * elsewhere can read it. Devices of other nodes (`gyre node --devices K` with the same
 * `NATS_URL` and `--run`) join the same scheduler. Reports each step's metrics as they are
 * journaled and returns when the scheduler journals `run-done`, with the final checkpoint (the
 * core's own here, else the last version's published weights: `shared-checkpoint.ts`).
 */
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Deferred, Duration, Effect, Fiber, Schedule } from "effect"
import { cpuDeviceThreads, device } from "../actors/device.ts"
import { gateway } from "../actors/gateway.ts"
import { makeHarnessRunner } from "../actors/harness-runner.ts"
import { makeScheduler, schedulerRef } from "../actors/scheduler.ts"
import { trainingRoleFor } from "../actors/trainer.ts"
import { Engine } from "../engine/engine.ts"
import { runSampling, type RunConfig } from "../protocols/run.ts"
import type { StepMetrics } from "../protocols/scheduler.ts"
import { Events, Gateway, HarnessRunner, RunTopology, Scheduler, hostedIds, implement, spawnPlan } from "../protocols/topology.ts"
import { on, subscribeEvents } from "../runtime/channel.ts"
import { startNode } from "../runtime/node.ts"
import { ActorSystem, type ActorSystemShape } from "../runtime/system.ts"
import { journalRunConfig, runDoneJournaled } from "../scheduling/records.ts"
import { devicePaceCounts } from "./pace.ts"
import { finalCheckpoint } from "./shared-checkpoint.ts"
import { chatFormatFor } from "./tool-format.ts"

export interface RunProgress {
  readonly metrics: StepMetrics
  /** Seconds since the run's start. */
  readonly elapsedS: number
}

export interface HostRunOptions {
  readonly config: RunConfig
  /** The suite's train split, in suite order. */
  readonly trainTasks: ReadonlyArray<string>
  readonly devices: number
  readonly suitesDir: string
  /** Whether this node hosts a scheduler candidate (default true). */
  readonly scheduler?: boolean
  readonly onProgress: (p: RunProgress) => void
}

export interface HostedRun {
  readonly system: ActorSystemShape
  /** The configuration the run used (a resumed run's journal wins over the flags). */
  readonly config: RunConfig
  /** Directory of the final checkpoint. */
  readonly checkpoint: string
  /** Seconds from the node's start to `run-done`. */
  readonly runS: number
}

/** The harness runners of a hosted run, as its topology spawns them (the scheduler runs execution `n` on runner `n mod count`). */
export const RUN_RUNNERS = hostedIds(RunTopology, "harness-runner").map(HarnessRunner.ref)

/** Hosts the run until the scheduler journals `run-done`. */
export const hostRun = (o: HostRunOptions) =>
  Effect.scoped(
    Effect.gen(function* () {
      const system = yield* ActorSystem
      const started = Date.now()
      const engine = yield* Engine
      const { backend } = engine
      const threads = yield* cpuDeviceThreads(engine, o.devices)
      const workspaces = fs.mkdtempSync(path.join(os.tmpdir(), "gyre-train-ws-"))
      yield* Effect.addFinalizer(() => Effect.sync(() => fs.rmSync(workspaces, { recursive: true, force: true })))
      const { executions_per_step: B, max_staleness } = o.config.policyConfig
      const chat = yield* Effect.promise(() => chatFormatFor("train", o.config.checkpoint, o.config.toolFormat))
      const scheduler = makeScheduler({ config: o.config, trainTasks: o.trainTasks, runners: RUN_RUNNERS })
      yield* journalRunConfig(system, o.config)
      // One implementation per kind the topology hosts (the compiler asks for a new kind's); the scheduler stands by for its lease.
      const types = implement(RunTopology, {
        device: device({ checkpoint: o.config.checkpoint, kvDtype: o.config.kvDtype, numBlocks: o.config.kvBlocks, pace: o.config.pace, maxBatch: 64, scheduler: schedulerRef, training: trainingRoleFor(o.config), threads }),
        gateway: gateway({ port: 0, chat, sampling: runSampling(o.config) }),
        "harness-runner": makeHarnessRunner({
          suitesDir: o.suitesDir,
          gateway: Gateway.address("main"),
          capacity: B * (max_staleness + 1),
          maxQueued: 4 * o.config.policyConfig.executions_per_step,
          evaluationRetries: 2,
          workspaceRoot: workspaces
        }),
        scheduler: scheduler.type
      })
      const node = yield* startNode({ name: "main", types: types.filter((t) => o.scheduler !== false || t.kind !== Scheduler.kind) })
      const done = yield* Deferred.make<void>()
      yield* subscribeEvents(system.nats, system.run, [
        on(Events.runDone, () => Effect.runFork(Deferred.succeed(done, undefined))),
        on(Events.step, (metrics) => o.onProgress({ metrics, elapsedS: (Date.now() - started) / 1000 }))
      ])
      for (const { kind, id } of spawnPlan(RunTopology, Array.from({ length: o.devices }, (_, i) => `main.${backend}${i}`))) yield* node.spawn(kind, id)
      if (o.devices === 0) yield* Effect.logInfo(`no device on this node: run ${system.run} starts when other nodes' devices join it on ${system.nats.servers} (gyre node --devices K --run ${system.run})`)
      const candidate = o.scheduler === false ? undefined : yield* Effect.forkScoped(scheduler.standBy(node, system))
      // run-done is core NATS, at most once: one published while this connection was down is
      // missed, so the journal is asked too, every few seconds.
      const journaled = runDoneJournaled(system).pipe(
        Effect.orElseSucceed(() => false),
        Effect.repeat({ schedule: Schedule.spaced(Duration.seconds(3)), until: (d) => d })
      )
      yield* Effect.raceFirst(Deferred.await(done), journaled)
      const runS = (Date.now() - started) / 1000
      // The gateway's counts of the run's calls (tokens prefilled again after evictions are not in the journal).
      const calls = yield* system.ask(Gateway.ref("main"), "Status", undefined, { timeoutMs: 5000 }).pipe(
        Effect.map((status) => status.totals),
        Effect.orElseSucceed(() => undefined)
      )
      // Each paced device's counts, asked before the devices stop.
      const pace = o.config.pace === undefined ? [] : yield* devicePaceCounts(system).pipe(Effect.orElseSucceed(() => []))
      const checkpoint = yield* finalCheckpoint(system, o.config)
      // the candidate goes first: a scheduler stopped by the drain under it would read as one that gave up
      if (candidate !== undefined) yield* Fiber.interrupt(candidate)
      yield* node.drain
      return { system, config: o.config, checkpoint, runS, calls, pace }
    })
  )
