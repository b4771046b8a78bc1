/**
 * Shared pieces of the training tests: a training-only device actor hosting the training role
 * (the device actor's four training requests, on a tiny checkpoint), a scheduler stand-in that
 * records what the core tells it, and executions whose call records are encoded as the gateway
 * encodes them and published on the run's trajectory stream.
 *
 * `device-node.ts` exports the same device for a `gyre node` child process, configured from
 * the environment (`trainingDeviceFromEnv`).
 */
import { Effect, Ref, Schema } from "effect"
import type { RpcGroup } from "effect/rpc"
import { makeTrainingRole, type TrainingRole, type TrainingRoleOptions } from "../../src/actors/trainer.ts"
import { ownWeights } from "../../src/training/core-step.ts"
import { loadCheckpoint } from "../../src/engine/checkpoint.ts"
import { Engine } from "../../src/engine/engine.ts"
import { TrainingProtocol, type StepExecutionRef } from "../../src/protocols/device.ts"
import { ensureTrajectoryStream, rlLayout } from "../../src/protocols/layout.ts"
import { RunConfig, executionName } from "../../src/protocols/run.ts"
import { SchedulerProtocol, type StepMetrics } from "../../src/protocols/scheduler.ts"
import * as Actor from "../../src/runtime/actor.ts"
import { ActorSystem } from "../../src/runtime/system.ts"
import { DeltaEncoder } from "../../src/tree/encoder.ts"
import type { ExecutionOutcome } from "../../src/tree/outcome.ts"
import { CallRecordJson, plainCall, type ModelCall } from "../../src/tree/record.ts"

export interface DeviceFixture {
  readonly checkpoint: string
  readonly config: RunConfig
  /** Policy version of the checkpoint's weights (default 0). */
  readonly version?: number
  readonly ackWaitMs?: number
  readonly onClaim?: TrainingRoleOptions["onClaim"]
  /** Receives the role (to call `leave` and `step` as a device's role switch would). */
  readonly onRole?: (role: TrainingRole) => void
  /** The trainer's `maxTokens` (default: the run's micro-batch budget, as `trainingRoleFor` makes it). */
  readonly trainerTokens?: number
}

/** A device (kind `device`) in the training role only, on `checkpoint`'s model. */
export const trainingDevice = (fixture: DeviceFixture) =>
  Actor.make({
    kind: "device",
    protocol: TrainingProtocol,
    state: { schema: Schema.Struct({}), initial: () => ({}) },
    concurrency: 64,
    behaviour: (ctx) =>
      Effect.gen(function* () {
        const engine = yield* Engine
        const { model } = yield* loadCheckpoint(fixture.checkpoint)
        const trainer = yield* model.trainer({ maxTokens: fixture.trainerTokens ?? fixture.config.training.microBatchTokens })
        const role = yield* makeTrainingRole(ctx, {
          model,
          trainer,
          engine,
          config: fixture.config,
          weights: ownWeights(fixture.version ?? 0),
          ...(fixture.ackWaitMs === undefined ? {} : { ackWaitMs: fixture.ackWaitMs }),
          ...(fixture.onClaim === undefined ? {} : { onClaim: fixture.onClaim })
        })
        fixture.onRole?.(role)
        return role.handlers
      })
  })

/** A training device configured by GYRE_TEST_DEVICE (JSON of `DeviceFixture` without onClaim) and GYRE_TEST_HOLD_MS. */
export const trainingDeviceFromEnv = () => {
  const raw = process.env.GYRE_TEST_DEVICE
  if (raw === undefined) return undefined
  const parsed = JSON.parse(raw) as { checkpoint: string; config: unknown; ackWaitMs?: number }
  const holdMs = Number(process.env.GYRE_TEST_HOLD_MS ?? 0)
  return trainingDevice({
    checkpoint: parsed.checkpoint,
    config: Schema.decodeUnknownSync(RunConfig)(parsed.config),
    ...(parsed.ackWaitMs === undefined ? {} : { ackWaitMs: parsed.ackWaitMs }),
    onClaim: (claim) =>
      Effect.sync(() => console.log(JSON.stringify({ event: "claimed", ...claim }))).pipe(Effect.andThen(Effect.sleep(holdMs)))
  })
}

export type SchedulerEvent =
  | { readonly _tag: "StepProgress"; readonly step: number; readonly trainedTokens: number; readonly at: number }
  | { readonly _tag: "StepDone"; readonly step: number; readonly version: number; readonly metrics: StepMetrics; readonly at: number }

/** `scheduler/main` that records the core's StepProgress and StepDone tells in `events`. */
export const schedulerStandIn = (events: Ref.Ref<ReadonlyArray<SchedulerEvent>>) =>
  Actor.make({
    kind: "scheduler",
    protocol: SchedulerProtocol,
    state: { schema: Schema.Struct({}), initial: () => ({}) },
    behaviour: () => {
      const record = (e: SchedulerEvent) => Ref.update(events, (es) => [...es, e]).pipe(Effect.as({ accepted: true }))
      const cell = () => Effect.succeed({ cell: 0 })
      const accepted = () => Effect.succeed({ accepted: true })
      const handlers: Actor.Handlers<RpcGroup.Rpcs<typeof SchedulerProtocol>> = {
        DeviceJoined: cell,
        DeviceLost: cell,
        ExecutionEnded: accepted,
        SwitchCompleted: accepted,
        WeightsLoaded: accepted,
        StepProgress: ({ step, trainedTokens }) => record({ _tag: "StepProgress", step, trainedTokens, at: Date.now() }),
        StepDone: ({ step, version, metrics }) => record({ _tag: "StepDone", step, version, metrics, at: Date.now() }),
        Status: () => Effect.succeed({ leader: "test", stepsDone: 0, dispatched: 0, started: 0, finished: 0, cells: [], done: false })
      }
      return Effect.succeed(handlers)
    }
  })

/** Waits (polling) until `events` holds one matching `match`; dies after `timeoutMs`. */
export const waitForEvent = <E extends SchedulerEvent>(
  events: Ref.Ref<ReadonlyArray<SchedulerEvent>>,
  match: (e: SchedulerEvent) => e is E,
  timeoutMs = 30_000
): Effect.Effect<E> =>
  Effect.gen(function* () {
    const deadline = Date.now() + timeoutMs
    for (;;) {
      const found = (yield* Ref.get(events)).find(match)
      if (found !== undefined) return found as E
      if (Date.now() > deadline) return yield* Effect.die(new Error(`no matching scheduler event within ${timeoutMs} ms`))
      yield* Effect.sleep(20)
    }
  })

export const isStepDone = (step: number) => (e: SchedulerEvent): e is Extract<SchedulerEvent, { _tag: "StepDone" }> =>
  e._tag === "StepDone" && e.step === step

/** A run configuration for `executions` executions in groups of `groupSize`. */
export const runConfig = (
  run: string,
  checkpointDir: string,
  over: {
    readonly maxStaleness?: number
    readonly microBatchTokens?: number
    readonly executions?: number
    readonly loss?: "ppo" | "is"
    readonly ppoEpochs?: number
  } = {}
): RunConfig => ({
  run,
  policy: "elastic",
  policyConfig: { slots_per_cell: 4, executions_per_step: over.executions ?? 4, steps: 4, max_staleness: over.maxStaleness ?? 1 },
  suite: "toy",
  groupSize: 2,
  env: {},
  seed: 7,
  training: {
    advantage: "grpo",
    mode: "exact",
    maxPaths: 4,
    loss: over.loss ?? "ppo",
    clipLow: 0.2,
    clipHigh: 0.28,
    isCap: 2,
    lr: 1e-3,
    ...(over.ppoEpochs === undefined ? {} : { ppoEpochs: over.ppoEpochs }),
    microBatchTokens: over.microBatchTokens ?? 64,
    checkpointEvery: 1
  },
  checkpoint: "",
  checkpointDir,
  startedAt: 0
})

/** Deterministic pseudo-random integers. */
const rng = (seed: number) => {
  let s = seed >>> 0
  return (n: number) => {
    s = (Math.imul(s ^ (s >>> 15), 0x2c1b3c6d) + 0x6d2b79f5) >>> 0
    s ^= s + Math.imul(s ^ (s >>> 7), 61)
    return (((s ^ (s >>> 14)) >>> 0) / 4294967296) * n
  }
}

/**
 * The model calls of one agent-like execution: a shared system prompt, three calls that each
 * extend the previous one with a tool result, and a retry of the second call. `versions` gives
 * the policy version of each call's output; behaviour log-probs sit near a tiny model's.
 */
export const agentCalls = (seed: number, versions: ReadonlyArray<number> = [0, 0, 0, 0]): Array<ModelCall> => {
  const next = rng(seed)
  const tokens = (n: number) => Array.from({ length: n }, () => Math.floor(next(256)))
  const call = (id: string, prompt: ReadonlyArray<number>, output: ReadonlyArray<number>, version: number) =>
    plainCall(id, "main", prompt, output, {
      logprobs: Float32Array.from(output, () => -5.6 + (next(1) - 0.5) * 0.6),
      versions: new Int32Array(output.length).fill(version)
    })
  const system = [7, 8, 9, 10, 11, 12]
  const c0 = call("c0", [...system, ...tokens(6)], tokens(14), versions[0]!)
  const s0 = [...c0.prompt, ...c0.output, ...tokens(4)]
  const c1 = call("c1", s0, tokens(12), versions[1]!)
  const retry = call("c1r", s0, tokens(10), versions[2]!)
  const c2 = call("c2", [...c1.prompt, ...c1.output, ...tokens(4)], tokens(12), versions[3]!)
  return [c0, c1, retry, c2]
}

const encodeRecord = Schema.encodeSync(CallRecordJson)

/** Publishes an execution's calls as the gateway records them; returns its unique token count. */
export const publishExecution = (execution: string, task: string, calls: ReadonlyArray<ModelCall>) =>
  Effect.gen(function* () {
    const system = yield* ActorSystem
    yield* ensureTrajectoryStream(system)
    const names = rlLayout(system.run)
    const encoder = new DeltaEncoder({ run: system.run, task, execution })
    for (const c of calls) {
      const data = encodeRecord(encoder.encode(c))
      yield* Effect.promise(() => system.nats.js.publish(names.calls(execution), data, { msgID: `${execution}.${c.callId}` }))
    }
    return encoder.uniqueTokens
  })

export const scored = (run: string, task: string, execution: string, score: number | null): ExecutionOutcome => ({
  run,
  task,
  execution,
  ended: "finished",
  evaluation: score === null ? "failed" : "scored",
  score,
  attempts: 1,
  detail: ""
})

/**
 * Publishes the records of batch `step`'s executions (`groupSizes.length` groups of two, scores
 * alternating 0.2 / 0.9 within a group) and returns the `TrainExecution` payloads in telling order.
 */
export const batchExecutions = (run: string, step: number, groups: number, versions?: (n: number) => ReadonlyArray<number>) =>
  Effect.gen(function* () {
    const refs: Array<StepExecutionRef> = []
    for (let n = 0; n < groups * 2; n++) {
      const group = Math.floor(n / 2)
      const execution = executionName(step, step * groups * 2 + n)
      const task = `task-${group}`
      const tokens = yield* publishExecution(execution, task, agentCalls(1000 * step + n, versions?.(n)))
      refs.push({ step, execution, task, group, tokens, outcome: scored(run, task, execution, n % 2 === 0 ? 0.2 : 0.9) })
    }
    return refs
  })
