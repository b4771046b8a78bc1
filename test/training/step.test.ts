/**
 * The training role end to end on a real nats-server and the CPU engine: a step trained by the
 * core alone against the same step with a satellite joining mid-step (bit-identical update), a
 * satellite killed mid-micro-batch (redelivered, same update), streaming (micro-batches trained
 * before the last execution is told), checkpoints, and stale tokens dropped and counted.
 */
import { readFile } from "node:fs/promises"
import { join } from "node:path"
import { Effect, Layer, Logger, Ref, Schema, type Scope } from "effect"
import { describe, expect, it } from "vitest"
import type { TrainingRole } from "../../src/actors/trainer.ts"
import { Engine } from "../../src/engine/engine.ts"
import { presets } from "../../src/engine/presets.ts"
import { TrainingProtocol, type StepExecutionRef, type StepPlan } from "../../src/protocols/device.ts"
import { RunConfig } from "../../src/protocols/run.ts"
import { fetchWeights, publishWeights } from "../../src/protocols/weights.ts"
import { address } from "../../src/runtime/names.ts"
import { startNode } from "../../src/runtime/node.ts"
import { ActorSystem, refOf } from "../../src/runtime/system.ts"
import { latestCheckpoint, restoreTrainingCheckpoint } from "../../src/training/checkpoints.ts"
import { tempDir, writeCheckpoint } from "../rollout/fixtures.ts"
import { build, wireRecords } from "../tree/simulate.ts"
import { startNodeProcess, withSystem } from "../runtime/harness.ts"
import {
  agentCalls,
  batchExecutions,
  isStepDone,
  runConfig,
  schedulerStandIn,
  trainingDevice,
  waitForEvent,
  type DeviceFixture,
  type SchedulerEvent
} from "./fixtures.ts"

const RUN = "train"
const dir = tempDir("gyre-training-")
const initial = join(dir, "init")
const other = join(dir, "other")
const checkpoints = Promise.all([writeCheckpoint(initial, 11, 0.02), writeCheckpoint(other, 12, 0.02)])

const device = (id: string) => refOf(TrainingProtocol, address("device", id))
const plan = (step: number, groups: number): StepPlan => ({ step, attempt: 0, version: step, executions: groups * 2, groupSizes: Array(groups).fill(2), cells: ["device/a.0"] })
const quiet = <A, E, R>(e: Effect.Effect<A, E, R>) => e.pipe(Effect.provide(Layer.mergeAll(Engine.layer, Logger.layer([])).pipe(Layer.provideMerge(Logger.layer([])))))

const tellAll = (refs: ReadonlyArray<StepExecutionRef>, to = "a.0", attempt = 0) =>
  Effect.gen(function* () {
    const system = yield* ActorSystem
    for (const ref of refs) yield* system.tell(device(to), "TrainExecution", ref, { msgId: `train-${ref.execution}-a${attempt}` })
  })

const isProgress = (e: SchedulerEvent): e is Extract<SchedulerEvent, { _tag: "StepProgress" }> => e._tag === "StepProgress" && e.trainedTokens > 0

/** Published weights `v<version>` as the flat parameter vector. */
const published = (version: number) =>
  Effect.gen(function* () {
    const blob = yield* fetchWeights(yield* ActorSystem, version)
    return yield* Effect.scoped((yield* Engine).loadModel(presets.tiny, blob).pipe(Effect.flatMap((m) => m.getWeights())))
  })

/** Starts a node with the scheduler stand-in and the core `device/a.0`. */
const coreNode = (core: Partial<DeviceFixture>, checkpointDir: string, over: Parameters<typeof runConfig>[2] = {}) =>
  Effect.gen(function* () {
    const events = yield* Ref.make<ReadonlyArray<SchedulerEvent>>([])
    const config = runConfig(RUN, checkpointDir, over)
    const satellite = trainingDevice({ checkpoint: other, config, version: 99 })
    const node = yield* startNode({
      name: "a",
      types: [trainingDevice({ checkpoint: initial, config, ...core }), schedulerStandIn(events)],
      heartbeatMs: 250
    })
    yield* node.spawn("scheduler", "main")
    yield* node.spawn("device", "a.0")
    return { events, config, satellite }
  })

/**
 * Step 0 (two groups of two executions): group 0 told, its micro-batches trained (streaming),
 * then `between` (a satellite joining), then group 1 (then what `between` returned); returns
 * the StepDone and the weights v1.
 */
const stepZero = (
  core: Partial<DeviceFixture>,
  checkpointDir: string,
  between: (satellite: ReturnType<typeof trainingDevice>) => Effect.Effect<Effect.Effect<void> | void, unknown, ActorSystem | Engine | Scope.Scope>,
  over: Parameters<typeof runConfig>[2] = {}
) =>
  withSystem(
    RUN,
    quiet(
      Effect.gen(function* () {
        const system = yield* ActorSystem
        const { events, satellite } = yield* coreNode(core, checkpointDir, over)
        // v0 is published so a satellite on other weights can load it
        yield* publishWeights(system, 0, yield* Effect.promise(() => readFile(join(initial, "model.safetensors"))))
        const refs = yield* batchExecutions(RUN, 0, 2)
        expect(yield* system.ask(device("a.0"), "StartStep", plan(0, 2))).toEqual({ started: true })
        yield* tellAll(refs.slice(0, 2))
        const progress = yield* waitForEvent(events, isProgress)
        const after = yield* between(satellite)
        const lastTold = Date.now()
        yield* tellAll(refs.slice(2))
        if (after !== undefined) yield* after
        // a duplicate tell (another message id) is deduplicated by execution
        yield* system.tell(device("a.0"), "TrainExecution", refs[3]!, { msgId: "again" })
        const done = yield* waitForEvent(events, isStepDone(0))
        return { refs, done, weights: yield* published(1), progress, lastTold, events: yield* Ref.get(events) }
      })
    )
  )

/** Starts `satellite` as `device/b.0` on its own node and has it join step 0. */
const joinSatellite = (satellite: ReturnType<typeof trainingDevice>) =>
  Effect.gen(function* () {
    const system = yield* ActorSystem
    const node = yield* startNode({ name: "b", types: [satellite], heartbeatMs: 250 })
    yield* node.spawn("device", "b.0")
    expect(yield* system.ask(device("b.0"), "JoinStep", { step: 0, attempt: 0, version: 0, core: "device/a.0" })).toEqual({ joined: true })
  })

let reference: ReturnType<typeof stepZero> | undefined
/**
 * Step 0 on core a.0 with satellite b.0 joined, and b.0's training role leaving: "in hand", once
 * it claimed its first micro-batch (held 400 ms); "waiting", before any execution is told, its
 * pull having waited since it joined (the queue empty): first in line for the micro-batches told
 * after it left, which it must hand back. The satellite's claims, its `step()` after, `StepDone`.
 */
const leaveDuring = async (when: "in hand" | "waiting") => {
  await checkpoints
  const claims: Array<number> = []
  let role: TrainingRole | undefined
  const done = await withSystem(
    RUN,
    quiet(
      Effect.gen(function* () {
        const system = yield* ActorSystem
        const { events, config } = yield* coreNode(when === "in hand" ? { onClaim: () => Effect.sleep(100) } : {}, join(dir, `leave-${when.replace(" ", "-")}`))
        yield* publishWeights(system, 0, yield* Effect.promise(() => readFile(join(initial, "model.safetensors"))))
        const satellite = trainingDevice({
          checkpoint: other,
          config,
          version: 99,
          onClaim: (c) => Effect.sync(() => claims.push(c.index)).pipe(Effect.andThen(Effect.sleep(when === "in hand" ? 400 : 0))),
          onRole: (r) => (role = r)
        })
        const node = yield* startNode({ name: "b", types: [satellite], heartbeatMs: 250 })
        yield* node.spawn("device", "b.0")
        const refs = yield* batchExecutions(RUN, 0, 1)
        expect(yield* system.ask(device("a.0"), "StartStep", plan(0, 1))).toEqual({ started: true })
        yield* system.ask(device("b.0"), "JoinStep", { step: 0, attempt: 0, version: 0, core: "device/a.0" })
        expect(role!.step()).toBe(0)
        if (when === "waiting") {
          yield* Effect.sleep(200)
          yield* role!.leave
          yield* tellAll(refs)
        } else {
          yield* tellAll(refs)
          while (claims.length === 0) yield* Effect.sleep(10)
          yield* role!.leave
        }
        return yield* waitForEvent(events, isStepDone(0))
      })
    )
  )
  return { claims, step: role!.step(), done }
}

const coreAlone = () => {
  reference ??= stepZero({}, join(dir, "alone"), () => Effect.void)
  return reference
}

describe("a step of the training role", () => {
  it("streams micro-batches as groups complete, and a satellite joining mid-step leaves the update bit-identical", async () => {
    await checkpoints
    const alone = await coreAlone()
    // streaming: group 0 was trained before group 1 was told (the same millisecond may hold both;
    // the tokens say which executions the progress counted)
    expect(alone.progress.at).toBeLessThanOrEqual(alone.lastTold)
    const groupZero = alone.refs.slice(0, 2).reduce((a, r) => a + r.tokens, 0)
    expect(alone.progress.trainedTokens).toBeLessThanOrEqual(groupZero)
    const m = alone.done.metrics
    expect(m.executions).toBe(4)
    expect(m.dropped).toBe(0)
    expect(m.microBatches).toBeGreaterThanOrEqual(4)
    expect(m.devices).toEqual(["device/a.0"])
    expect(m.tokensTrained).toBeGreaterThan(150)
    expect(m.staleTokens).toBe(0)
    expect(m.staleness).toEqual([m.tokensTrained])
    expect(m.meanScore).toBeCloseTo(0.55, 10)
    expect(m.isWeightMean).toBeGreaterThan(0)
    expect(m.isWeightMax).toBeLessThanOrEqual(2)
    expect(m.clipFraction).toBe(0)
    expect(Number.isFinite(m.behaviourKl) && Math.abs(m.behaviourKl) < 1).toBe(true)
    expect(m.dedupRatio).toBeGreaterThan(1.5)
    expect(m.gradNorm).toBeGreaterThan(0)
    // progress ends at the scheduler's tokens of every execution, and StepDone follows it
    const progress = alone.events.filter((e) => e._tag === "StepProgress").map((e) => e.trainedTokens)
    expect(progress.at(-1)).toBe(alone.refs.reduce((a, r) => a + r.tokens, 0))
    expect([...progress].sort((a, b) => a - b)).toEqual(progress)
    expect(alone.events.at(-1)?._tag).toBe("StepDone")

    const withSatellite = await stepZero(
      // the core dawdles over each claim so the satellite gets some of group 1's micro-batches
      { onClaim: () => Effect.sleep(150) },
      join(dir, "joined"),
      joinSatellite
    )
    expect(withSatellite.done.metrics.devices).toEqual(["device/a.0", "device/b.0"])
    expect(withSatellite.done.metrics.microBatches).toBe(m.microBatches)
    expect(withSatellite.done.metrics.tokensTrained).toBe(m.tokensTrained)
    expect(Buffer.from(withSatellite.weights.buffer).equals(Buffer.from(alone.weights.buffer))).toBe(true)
    // the update changed the weights
    const before = await Effect.runPromise(
      quiet(Effect.scoped(Effect.gen(function* () {
        const engine = yield* Engine
        const model = yield* engine.loadModel(presets.tiny, yield* Effect.promise(() => readFile(join(initial, "model.safetensors"))))
        return yield* model.getWeights()
      })))
    )
    expect(Buffer.from(before.buffer).equals(Buffer.from(alone.weights.buffer))).toBe(false)
  }, 60_000)

  it("PPO epochs: the core's later passes clip against the step's weights, and a satellite joining leaves the update bit-identical", async () => {
    await checkpoints
    const alone = await coreAlone()
    const epochs = { ppoEpochs: 3 }
    const core = await stepZero({}, join(dir, "epochs-alone"), () => Effect.void, epochs)
    const joined = await stepZero(
      { onClaim: () => Effect.sleep(150) },
      join(dir, "epochs-joined"),
      joinSatellite,
      epochs
    )
    expect(joined.done.metrics.devices).toEqual(["device/a.0", "device/b.0"])
    expect(Buffer.from(joined.weights.buffer).equals(Buffer.from(core.weights.buffer))).toBe(true)
    // the later passes moved the weights past the one-pass update, and their ratios left 1
    expect(Buffer.from(core.weights.buffer).equals(Buffer.from(alone.weights.buffer))).toBe(false)
    expect(core.done.metrics.tokensTrained).toBe(alone.done.metrics.tokensTrained)
    expect(core.done.metrics.gradNorm).toBe(alone.done.metrics.gradNorm)
    expect(core.done.metrics.clipFraction).toBeGreaterThan(0)
    expect(core.done.metrics.clipFraction).toBeLessThan(1)
  }, 90_000)

  it("a satellite killed mid-micro-batch: the micro-batch is redelivered and the update is the same", async () => {
    await checkpoints
    const alone = await coreAlone()
    const claims: Array<{ readonly index: number; readonly deliveryCount: number }> = []
    const killed = await stepZero(
      {
        ackWaitMs: 1500,
        // the core holds each first delivery a while, so the satellite claims one meanwhile
        onClaim: (c) => Effect.sync(() => claims.push(c)).pipe(Effect.andThen(Effect.sleep(c.deliveryCount === 1 ? 300 : 0)))
      },
      join(dir, "killed"),
      () =>
        Effect.gen(function* () {
          const system = yield* ActorSystem
          const config = Schema.encodeSync(RunConfig)(runConfig(RUN, join(dir, "killed-satellite")))
          const child = startNodeProcess(
            system.nats.servers,
            ["--name", "c", "--run", RUN, "--load", "test/training/device-node.ts", "--spawn", "device/c.0", "--heartbeat-ms", "250"],
            { GYRE_TEST_DEVICE: JSON.stringify({ checkpoint: other, config }), GYRE_TEST_HOLD_MS: "60000" }
          )
          yield* Effect.addFinalizer(() => Effect.sync(() => child.child.kill("SIGKILL")))
          yield* Effect.promise(() => child.waitFor("ready"))
          expect(yield* system.ask(device("c.0"), "JoinStep", { step: 0, attempt: 0, version: 0, core: "device/a.0" })).toEqual({ joined: true })
          return Effect.promise(async () => {
            const claimed = await child.waitFor("claimed")
            child.child.kill("SIGKILL")
            await child.exited
            return claimed
          }).pipe(Effect.tap((claimed) => Effect.sync(() => claims.push({ index: Number(claimed.index), deliveryCount: -1 }))))
        })
    )
    // the micro-batch the satellite died holding came back to the core, delivered a second time
    const lost = claims.find((c) => c.deliveryCount === -1)!
    expect(claims.some((c) => c.index === lost.index && c.deliveryCount >= 2)).toBe(true)
    expect(killed.done.metrics.devices).toEqual(["device/a.0"])
    expect(killed.done.metrics.microBatches).toBe(alone.done.metrics.microBatches)
    expect(Buffer.from(killed.weights.buffer).equals(Buffer.from(alone.weights.buffer))).toBe(true)
  }, 60_000)

  it("recomputes a gradient whose object cannot be read, with the same update", async () => {
    await checkpoints
    const alone = await coreAlone()
    const last = alone.done.metrics.microBatches - 1
    const stats = { loss: 0, weightSum: 0, entropy: 0, meanLogprob: 0, meanRatio: 1, clipFraction: 0, meanIsWeight: 1, maxIsWeight: 1, truncatedFraction: 0, trainedTokens: 0, staleTokens: 0 }
    const ghost = await stepZero(
      { onClaim: () => Effect.sleep(100) }, // the core is slower than the ghost's report
      join(dir, "ghost"),
      () =>
        Effect.service(ActorSystem).pipe(
          Effect.map((system) =>
            // a device says it stored the last micro-batch's gradient, and never did
            system.ask(device("a.0"), "GradientReady", { step: 0, attempt: 0, index: last, device: "device/ghost", stats }).pipe(
              Effect.tap((answer) => Effect.sync(() => expect(answer).toEqual({ accepted: true }))),
              Effect.asVoid,
              Effect.orDie
            )
          )
        )
    )
    expect(ghost.done.metrics.devices).toContain("device/ghost")
    expect(Buffer.from(ghost.weights.buffer).equals(Buffer.from(alone.weights.buffer))).toBe(true)
  }, 60_000)

  it("writes a checkpoint that restores the weights and the optimizer", async () => {
    await checkpoints
    const alone = await coreAlone()
    const restored = await Effect.runPromise(
      quiet(
        Effect.scoped(
          Effect.gen(function* () {
            const found = yield* latestCheckpoint(join(dir, "alone"))
            const engine = yield* Engine
            const model = yield* engine.createModel(presets.tiny, { seed: 3 })
            const trainer = yield* model.trainer({ maxTokens: 16 })
            const state = yield* restoreTrainingCheckpoint(found!.dir, model, trainer)
            return { found, state, weights: yield* model.getWeights(), steps: yield* trainer.stepCount() }
          })
        )
      )
    )
    expect(restored.found?.state.version).toBe(1)
    expect(restored.state).toMatchObject({ run: RUN, version: 1, optimizerSteps: 1 })
    expect(restored.steps).toBe(1)
    expect(Buffer.from(restored.weights.buffer).equals(Buffer.from(alone.weights.buffer))).toBe(true)
  }, 60_000)

  it("a core lost mid-step: a device that never trained starts a new attempt from the store's weights and optimizer state, and makes the uninterrupted update", async () => {
    await checkpoints
    const twoSteps = (name: string, loseCore: boolean) =>
      withSystem(
        RUN,
        quiet(
          Effect.gen(function* () {
            const system = yield* ActorSystem
            const { events, config } = yield* coreNode({}, join(dir, name))
            yield* publishWeights(system, 0, yield* Effect.promise(() => readFile(join(initial, "model.safetensors"))))
            const first = yield* batchExecutions(RUN, 0, 2)
            yield* system.ask(device("a.0"), "StartStep", plan(0, 2))
            yield* tellAll(first)
            yield* waitForEvent(events, isStepDone(0))
            const second = yield* batchExecutions(RUN, 1, 2)
            expect(yield* system.ask(device("a.0"), "StartStep", plan(1, 2))).toEqual({ started: true })
            if (!loseCore) {
              yield* tellAll(second)
              return { done: yield* waitForEvent(events, isStepDone(1)), weights: yield* published(2) }
            }
            // half the batch reaches a.0, then a.0 counts as lost: b.0 (other weights, a fresh optimizer) takes attempt 7
            yield* tellAll(second.slice(0, 2))
            yield* waitForEvent(events, (e): e is Extract<SchedulerEvent, { _tag: "StepProgress" }> => e._tag === "StepProgress" && e.step === 1)
            const node = yield* startNode({ name: "b", types: [trainingDevice({ checkpoint: other, config })], heartbeatMs: 250 })
            yield* node.spawn("device", "b.0")
            expect(yield* system.ask(device("b.0"), "StartStep", { ...plan(1, 2), attempt: 7 })).toEqual({ started: true })
            yield* tellAll(second, "b.0", 7)
            return { done: yield* waitForEvent(events, isStepDone(1)), weights: yield* published(2) }
          })
        )
      )
    const kept = await twoSteps("core-kept", false)
    const lost = await twoSteps("core-lost", true)
    expect(kept.done.metrics.devices).toEqual(["device/a.0"])
    // b.0 planned and finished the step (a.0, counted lost but alive here, may still have computed some of the new attempt's micro-batches for b.0)
    expect(lost.done.metrics.devices[0]).toBe("device/b.0")
    expect(lost.done.metrics.microBatches).toBe(kept.done.metrics.microBatches)
    expect(Buffer.from(lost.weights.buffer).equals(Buffer.from(kept.weights.buffer))).toBe(true)
  }, 120_000)

  it("drops and counts tokens older than step - max_staleness; buffers executions told before their step; refuses wrong steps (truncated IS loss)", async () => {
    await checkpoints
    const versions = () => [1, 2, 3, 3] // step 3 with max_staleness 1: the first call's output is too old
    const result = await withSystem(
      RUN,
      quiet(
        Effect.gen(function* () {
          const system = yield* ActorSystem
          const { events } = yield* coreNode({ version: 3 }, join(dir, "stale"), { loss: "is" })
          const refs = yield* batchExecutions(RUN, 3, 1, versions)
          yield* tellAll(refs.slice(0, 1)) // before its step starts: kept for it
          const core = device("a.0")
          expect(yield* system.ask(core, "TrainExecution", { ...refs[1]!, step: 2 })).toEqual({ queued: false })
          expect(yield* Effect.flip(system.ask(core, "StartStep", plan(4, 1)))).toMatchObject({ _tag: "DeviceRefused" })
          expect(yield* system.ask(core, "StartStep", plan(3, 1))).toEqual({ started: true })
          expect(yield* system.ask(core, "StartStep", plan(3, 1))).toEqual({ started: true })
          expect(yield* system.ask(core, "StartStep", plan(2, 1))).toEqual({ started: false })
          expect(yield* Effect.flip(system.ask(core, "StartStep", plan(4, 1)))).toMatchObject({ _tag: "DeviceRefused" })
          yield* tellAll(refs.slice(1))
          return { refs, done: yield* waitForEvent(events, isStepDone(3)) }
        })
      )
    )
    // expected counts from the executions' own trees: generated tokens by version
    const byVersion = new Map<number, number>()
    result.refs.forEach((_, n) => {
      const tree = build(wireRecords(agentCalls(3000 + n, versions()))).tree
      for (const node of tree.preorder()) {
        tree.versionsOf(node).forEach((v, j) => {
          if (v >= 0 && tree.depthOf(node) + j > 0) byVersion.set(v, (byVersion.get(v) ?? 0) + 1)
        })
      }
    })
    const m = result.done.metrics
    expect(byVersion.get(1)).toBeGreaterThan(0)
    expect(m.staleTokens).toBe(byVersion.get(1))
    expect(m.staleness).toEqual([byVersion.get(3), byVersion.get(2)])
    expect(m.tokensTrained).toBe(byVersion.get(3)! + byVersion.get(2)!)
    expect(m.executions).toBe(2)
    expect(m.clipFraction).toBe(0)
    expect(m.gradNorm).toBeGreaterThan(0)
    expect(result.done.version).toBe(4)
  }, 60_000)

  it("leave: a satellite stops claiming after the micro-batch in hand", async () => {
    const r = await leaveDuring("in hand")
    // the micro-batch in hand was delivered (the satellite counts among the step's devices), no other was claimed
    expect(r.claims).toHaveLength(1)
    expect(r.step).toBe(-1)
    expect(r.done.metrics.devices).toEqual(["device/a.0", "device/b.0"])
    expect(r.done.metrics.microBatches).toBeGreaterThan(1)
  }, 60_000)

  it("leave while waiting for a claim: what the pending pull brings is handed back and the core trains it", async () => {
    const r = await leaveDuring("waiting")
    expect(r.claims).toEqual([])
    expect(r.step).toBe(-1)
    expect(r.done.metrics.devices).toEqual(["device/a.0"])
    expect(r.done.metrics.microBatches).toBeGreaterThan(1)
  }, 60_000)
})
