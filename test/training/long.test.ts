/**
 * Executions longer than the micro-batch budget through the training role, on a real
 * nats-server and the CPU engine: a step whose paths are longer than its budget (and than the
 * trainer's `maxTokens`, which trains them in chunks) trains every token, nothing dropped, with
 * the gradient of the same step packed in one micro-batch; a
 * micro-batch the engine refuses is acknowledged as failed and is an error of the step's record
 * (execution and reason), while the rest of the step trains and the step completes.
 */
import { join } from "node:path"
import { Effect, Layer, Logger, Ref } from "effect"
import { describe, expect, it } from "vitest"
import { cannotTrain } from "../../src/actors/trainer.ts"
import { Engine } from "../../src/engine/engine.ts"
import { EngineError } from "../../src/engine/native.ts"
import { TrainingProtocol, type StepExecutionRef, type StepPlan } from "../../src/protocols/device.ts"
import { executionName } from "../../src/protocols/run.ts"
import { address } from "../../src/runtime/names.ts"
import { startNode } from "../../src/runtime/node.ts"
import { ActorSystem, refOf } from "../../src/runtime/system.ts"
import { MicroBatchUnreadable } from "../../src/training/microbatch-store.ts"
import { plainCall } from "../../src/tree/record.ts"
import { tempDir, writeCheckpoint } from "../rollout/fixtures.ts"
import { withSystem } from "../runtime/harness.ts"
import { agentCalls, isStepDone, publishExecution, runConfig, schedulerStandIn, scored, trainingDevice, waitForEvent, type SchedulerEvent } from "./fixtures.ts"

const RUN = "long"
const dir = tempDir("gyre-training-long-")
const initial = join(dir, "init")
const ready = writeCheckpoint(initial, 21, 0.02)

const device = refOf(TrainingProtocol, address("device", "a.0"))
const plan: StepPlan = { step: 0, attempt: 0, version: 0, executions: 4, groupSizes: [2, 2], cells: ["device/a.0"] }
const quiet = <A, E, R>(e: Effect.Effect<A, E, R>) => e.pipe(Effect.provide(Layer.mergeAll(Engine.layer, Logger.layer([]))))

/** An execution of agent calls, longer paths than 16 tokens; with `outOfVocabulary`, its last call's output ends with a token no model has. */
const callsOf = (n: number, outOfVocabulary: boolean) => {
  const calls = agentCalls(7000 + n)
  if (!outOfVocabulary) return calls
  const last = calls.at(-1)!
  return [...calls.slice(0, -1), plainCall(last.callId, "main", last.prompt, [...last.output, 5000], { logprobs: Float32Array.from([...last.logprobs, -3]), versions: Int32Array.from([...last.versions, 0]) })]
}

/** Step 0 of four executions (two groups of two) on core a.0 with the given budget and trainer size; its StepDone. */
const trainStep = (name: string, budget: number, trainerTokens: number, bad: ReadonlySet<number> = new Set()) =>
  withSystem(
    `${RUN}-${name}`,
    quiet(
      Effect.gen(function* () {
        const system = yield* ActorSystem
        const events = yield* Ref.make<ReadonlyArray<SchedulerEvent>>([])
        const config = runConfig(system.run, join(dir, name), { microBatchTokens: budget })
        const node = yield* startNode({ name: "a", types: [trainingDevice({ checkpoint: initial, config, trainerTokens }), schedulerStandIn(events)], heartbeatMs: 250 })
        yield* node.spawn("scheduler", "main")
        yield* node.spawn("device", "a.0")
        const refs: Array<StepExecutionRef> = []
        for (let n = 0; n < 4; n++) {
          const execution = executionName(0, n)
          const task = `task-${n >> 1}`
          const tokens = yield* publishExecution(execution, task, callsOf(n, bad.has(n)))
          refs.push({ step: 0, execution, task, group: n >> 1, tokens, outcome: scored(system.run, task, execution, n % 2 === 0 ? 0.2 : 0.9) })
        }
        expect(yield* system.ask(device, "StartStep", plan)).toEqual({ started: true })
        for (const ref of refs) yield* system.tell(device, "TrainExecution", ref, { msgId: `train-${ref.execution}` })
        return { refs, done: yield* waitForEvent(events, isStepDone(0), 50_000) }
      })
    )
  )

describe("long executions in the training role", () => {
  it("trains paths longer than the budget: every token, the gradient of the step packed whole", async () => {
    await ready
    const whole = await trainStep("whole", 4096, 4096)
    // A budget of 16 tokens, the trainer's size as `gyre train` makes it: every path is longer,
    // and the engine trains each long micro-batch in chunks of 16 rows.
    const tight = await trainStep("tight", 16, 16)
    const [w, t] = [whole.done.metrics, tight.done.metrics]
    expect(t.errors).toEqual([])
    expect(t.microBatches).toBeGreaterThan(w.microBatches)
    expect(t.tokensTrained).toBe(w.tokensTrained)
    expect(t.tokensTrained).toBeGreaterThan(0)
    expect(t.trainedExecutions).toEqual(w.trainedExecutions)
    expect(t.dropped).toBe(0)
    expect(Math.abs(t.gradNorm - w.gradNorm) / w.gradNorm).toBeLessThan(1e-4)
    expect(t.loss).toBeCloseTo(w.loss, 4)
  }, 120_000)

  it("a micro-batch the engine refuses is an error of the step's record; the rest trains and the step completes", async () => {
    await ready
    const clean = await trainStep("clean", 4096, 4096)
    const r = await trainStep("refused", 4096, 4096, new Set([2]))
    const m = r.done.metrics
    // Group 1 (executions 2 and 3) is one micro-batch: both named, with the engine's reason.
    expect(m.errors?.map((e) => e.execution).sort()).toEqual([r.refs[2]!.execution, r.refs[3]!.execution].sort())
    for (const e of m.errors ?? []) expect(e.reason).toMatch(/outside the vocabulary/)
    expect(m.trainedExecutions).toEqual([r.refs[0]!.execution, r.refs[1]!.execution])
    expect(m.tokensTrained).toBeGreaterThan(0)
    expect(m.tokensTrained).toBeLessThan(clean.done.metrics.tokensTrained)
    expect(m.gradNorm).toBeGreaterThan(0)
    expect(r.done.version).toBe(1)
  }, 120_000)

  it("tells a failure that may pass from one that will not", () => {
    const engine = (code: string) => new EngineError({ op: "gyre_train_batch", code, message: "m" })
    expect(cannotTrain(engine("GYRE_ERR_INVALID_ARGUMENT"), 1)).toMatch(/GYRE_ERR_INVALID_ARGUMENT/)
    expect(cannotTrain(engine("GYRE_ERR_UNSUPPORTED"), 1)).toBeDefined()
    expect(cannotTrain(engine("GYRE_ERR_OUT_OF_MEMORY"), 1)).toBeUndefined()
    expect(cannotTrain(engine("GYRE_ERR_OUT_OF_MEMORY"), 3)).toMatch(/OUT_OF_MEMORY/)
    expect(cannotTrain(new MicroBatchUnreadable({ object: "s0.a0.m1", reason: "not in the bucket" }), 1)).toMatch(/s0.a0.m1: not in the bucket/)
    expect(cannotTrain(new Error("connection closed"), 5)).toBeUndefined()
  })
})
