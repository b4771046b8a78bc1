/**
 * Sampling belongs to the run: the trainer's log-probs are of the distribution the rollouts
 * sampled from.
 *
 * - The engine's loss at a temperature: its token log-probs are the sampler's at that
 *   temperature (and not the untempered ones), and its gradient is the derivative of the
 *   tempered loss (finite differences).
 * - A training run end to end on real parts (nats-server, rollout worker, gateway, the core
 *   trainer, the official `openai` client): the harness asks for `temperature: 0` and
 *   `top_p: 0.5`, the run samples at its own temperature 0.7, every record says so, and the
 *   step's behaviour/policy KL estimate is ~0; the same records under an untempered loss are
 *   far from it.
 * - `gyre serve`'s gateway (no run sampling) honours the request: temperature 0 is greedy and
 *   recorded as such.
 */
import { Effect, Layer, Logger, Ref } from "effect"
import OpenAI from "openai"
import { describe, expect, it } from "vitest"
import { Engine } from "../../src/engine/engine.ts"
import { loadCheckpoint } from "../../src/engine/checkpoint.ts"
import type { LossConfig } from "../../src/engine/trainer.ts"
import { TrainingProtocol, type StepExecutionRef, type StepPlan } from "../../src/protocols/device.ts"
import { apiKeyDigest } from "../../src/protocols/gateway.ts"
import { executionName, type RunConfig } from "../../src/protocols/run.ts"
import { address } from "../../src/runtime/names.ts"
import { startNode } from "../../src/runtime/node.ts"
import { ActorSystem, refOf } from "../../src/runtime/system.ts"
import { MetricsSum, PhaseClock, microBatchStats, summarize } from "../../src/training/step-metrics.ts"
import { stepLoss } from "../../src/training/step-planner.ts"
import { DeltaDecoder } from "../../src/tree/decoder.ts"
import { packMicroBatches } from "../../src/tree/pack.ts"
import type { CallRecord } from "../../src/tree/record.ts"
import { stepUnits } from "../../src/tree/units.ts"
import { chain, maxAbsDiff, micro, packed, rng, runEngine } from "../engine/helpers.ts"
import { withSystem } from "../runtime/harness.ts"
import { gatewayRef, readRecords, serve, tempDir, writeCheckpoint } from "../rollout/fixtures.ts"
import { isStepDone, runConfig, schedulerStandIn, scored, trainingDevice, waitForEvent, type SchedulerEvent } from "./fixtures.ts"

const checkpoint = await writeCheckpoint(tempDir("gyre-sampling-"), 5, 0.3)
const quiet = <A, E, R>(e: Effect.Effect<A, E, R>) => e.pipe(Effect.provide(Layer.mergeAll(Engine.layer, Logger.layer([]))))

const ppo = (temperature: number): LossConfig => ({ kind: "ppo", clipLow: 0.2, clipHigh: 0.28, isCap: 0, proximal: "current", temperature })

describe("the loss at the run's sampling temperature", () => {
  it("takes the sampler's log-probs at that temperature, and its gradient is the tempered loss's", async () => {
    const config = { ...micro(true), vocab_size: 48 }
    const r = await runEngine(
      Effect.gen(function* () {
        const model = yield* (yield* Engine).createModel(config, { seed: 3, initStd: 0.5 })
        const cache = yield* model.cache({ blockTokens: 16, numBlocks: 8 })
        const seq = yield* cache.create()
        // 40 tokens drawn at temperature 0.6 after a 4-token prompt, with their log-probs
        const tokens = [5, 9, 2, 30]
        const behaviour = [0, 0, 0, 0]
        let input: ReadonlyArray<number> = tokens
        for (let i = 0; i < 40; i++) {
          const out = yield* cache.forward([{ seq, tokens: input, sampling: { temperature: 0.6, topP: 1, seed: 11 } }], "none")
          tokens.push(out.sampled![0]!)
          behaviour.push(out.sampledLogprobs![0]!)
          input = [out.sampled![0]!]
        }
        const trainer = yield* model.trainer({ maxTokens: 64 })
        const batch = packed(tokens, chain(tokens.length), {
          weights: Float32Array.from(tokens, (_, i) => (i < 4 ? 0 : 1)), // the prompt is context
          behaviourLogprobs: Float32Array.from(behaviour),
          advantages: Float32Array.from(tokens, (_, i) => (i % 3) - 1)
        })
        const at = (t: number) => trainer.train(batch, ppo(t), { backward: false })
        const tempered = yield* at(0.6)
        const untempered = yield* at(1)
        // gradient of the tempered loss along a random direction against central differences
        yield* trainer.zeroGrads()
        yield* trainer.train(batch, ppo(0.6))
        const grads = yield* trainer.getGrads()
        const weights = yield* model.getWeights()
        const random = rng(5)
        const u = Float32Array.from(weights, () => random() - 0.5)
        const eps = 1e-3
        const lossAt = (sign: number) =>
          model.setWeights(Float32Array.from(weights, (w, i) => w + sign * eps * u[i]!)).pipe(Effect.andThen(at(0.6)), Effect.map((x) => x.stats.loss))
        const numeric = ((yield* lossAt(1)) - (yield* lossAt(-1))) / (2 * eps)
        const analytic = grads.reduce((s, g, i) => s + g * u[i]!, 0)
        return { behaviour, tempered, untempered, numeric, analytic }
      })
    )
    const generated = (x: ArrayLike<number>) => Array.from(x).slice(4)
    expect(maxAbsDiff(generated(r.tempered.tokenLogprobs), r.behaviour.slice(4))).toBeLessThan(2e-4)
    expect(r.tempered.stats.meanIsWeight).toBeCloseTo(1, 3)
    // the untempered policy is another distribution: its log-probs are far from the behaviour's
    const gap = generated(r.untempered.tokenLogprobs).reduce((s, x, i) => s + Math.abs(x - r.behaviour[i + 4]!), 0) / 40
    expect(gap).toBeGreaterThan(0.05)
    expect(Math.abs(r.analytic - r.numeric)).toBeLessThan(2e-3 * Math.max(1, Math.abs(r.numeric)))
    expect(Math.abs(r.analytic)).toBeGreaterThan(1e-3)
  })

  it("refuses a temperature that is not > 0", async () => {
    const error = await runEngine(
      Effect.gen(function* () {
        const model = yield* (yield* Engine).createModel(micro(true), { seed: 3 })
        const trainer = yield* model.trainer({ maxTokens: 8 })
        return yield* Effect.flip(trainer.train(packed([1, 2, 3], chain(3)), ppo(0)))
      })
    )
    expect(String(error)).toMatch(/temperature must be finite and > 0/)
  })
})

const RUN = "sampling"
const device = refOf(TrainingProtocol, address("device", "a.0"))

/** Two chained chat calls of one execution through the openai client, asking for greedy sampling. */
const harness = (baseUrl: string, key: string, n: number) =>
  Effect.promise(async () => {
    const client = new OpenAI({ baseURL: baseUrl, apiKey: key, maxRetries: 0 })
    const ask = (messages: Array<OpenAI.Chat.ChatCompletionMessageParam>, seed: number) =>
      client.chat.completions.create({ model: "gyre", messages, max_tokens: 12, temperature: 0, top_p: 0.5, seed })
    const messages: Array<OpenAI.Chat.ChatCompletionMessageParam> = [{ role: "user", content: `task ${n}: list the files` }]
    const first = await ask(messages, 100 + n)
    messages.push({ role: "assistant", content: first.choices[0]!.message.content ?? "" }, { role: "user", content: "and then?" })
    await ask(messages, 200 + n)
  })

/** The behaviour/policy KL estimate of the step over these executions' records, as the core computes it, under `temperature`. */
const klOf = (records: ReadonlyArray<CallRecord>, config: RunConfig) =>
  Effect.gen(function* () {
    const decoders = new Map<string, DeltaDecoder>()
    for (const r of records) {
      const d = decoders.get(r.execution) ?? new DeltaDecoder(r.execution)
      decoders.set(r.execution, d)
      expect(d.add(r).rejected).toEqual([])
    }
    const units = stepUnits([...decoders.values()].map((d, i) => ({ execution: d.execution, tree: d.tree, advantage: i % 2 === 0 ? 1 : -1 })), { _tag: "exact" })
    const packedBatches = packMicroBatches(units.units, config.training.microBatchTokens)
    const { model } = yield* loadCheckpoint(checkpoint)
    const trainer = yield* model.trainer({ maxTokens: config.training.microBatchTokens })
    const sum = new MetricsSum()
    for (const mb of packedBatches.microBatches) {
      const batch = mb.build()
      const result = yield* trainer.train(batch, stepLoss(config, 0), { backward: false })
      sum.add(microBatchStats(result, batch, 0, 1, config.training.isCap), summarize(batch, 0, 1), [])
    }
    const figures = { told: 0, dropped: 0, scored: 0, scoreSum: 0, callTokens: 0, uniqueTokens: 0, trees: [] }
    return sum.metrics({ step: 0, figures, microBatches: 0, batchDigests: [], devices: [], gradNorm: 0, clock: new PhaseClock(0), reduceMs: 0, publishMs: 0 }).behaviourKl
  })

describe("sampling in a training run", () => {
  it("the run's temperature replaces the harness's, every record says so, and the step's KL estimate is ~0", async () => {
    const config: RunConfig = { ...runConfig(RUN, tempDir("gyre-sampling-ckpt-"), { microBatchTokens: 512 }), sampling: { temperature: 0.7 } }
    const out = await withSystem(
      RUN,
      quiet(
        Effect.gen(function* () {
          const system = yield* ActorSystem
          const events = yield* Ref.make<ReadonlyArray<SchedulerEvent>>([])
          const node = yield* startNode({ name: "t", types: [trainingDevice({ checkpoint, config }), schedulerStandIn(events)], heartbeatMs: 250 })
          yield* node.spawn("scheduler", "main")
          yield* node.spawn("device", "a.0")
          const executions = [0, 1, 2, 3].map((n) => executionName(0, n))
          const { baseUrl } = yield* serve({ node: "s", checkpoint, workers: 1, execution: executions[0]!, gateway: { sampling: { temperature: 0.7, topP: 1 } } })
          for (const [n, execution] of executions.entries()) {
            if (n > 0) yield* system.ask(gatewayRef, "OpenExecution", { keyDigest: apiKeyDigest(`key-${n}`), task: `task-${n >> 1}`, execution, defaultRole: "main" })
            yield* harness(baseUrl, n === 0 ? "test-key-0123456789abcdef" : `key-${n}`, n)
          }
          const records = (yield* Effect.forEach(executions, (e) => readRecords(e, 2))).flat()
          const plan: StepPlan = { step: 0, attempt: 0, version: 0, executions: 4, groupSizes: [2, 2], cells: ["device/a.0"] }
          expect(yield* system.ask(device, "StartStep", plan)).toEqual({ started: true })
          for (const [n, execution] of executions.entries()) {
            const task = n === 0 ? "t1" : `task-${n >> 1}` // the fixture opens the first execution as task t1
            const ref: StepExecutionRef = { step: 0, execution, task, group: n >> 1, tokens: 1, outcome: scored(RUN, task, execution, n % 2 === 0 ? 0.2 : 0.9) }
            yield* system.tell(device, "TrainExecution", ref, { msgId: `train-${execution}` })
          }
          const done = yield* waitForEvent(events, isStepDone(0), 60_000)
          const untempered = yield* klOf(records, { ...config, sampling: { temperature: 1 } })
          const tempered = yield* klOf(records, config)
          return { records, done, untempered, tempered }
        })
      )
    )
    expect(out.records).toHaveLength(8)
    for (const r of out.records) expect(r.sampling).toEqual({ temperature: 0.7, topP: 1 })
    expect(out.done.metrics.tokensTrained).toBeGreaterThan(40)
    expect(Math.abs(out.done.metrics.behaviourKl)).toBeLessThan(2e-3)
    // the core's figure is the one computed here from the same records
    expect(out.tempered).toBeCloseTo(out.done.metrics.behaviourKl, 4)
    expect(Math.abs(out.untempered)).toBeGreaterThan(0.05)
  }, 120_000)

  it("gyre serve's gateway honours the request's sampling: temperature 0 is greedy and recorded so", async () => {
    const out = await withSystem(
      "sampling-serve",
      quiet(
        Effect.gen(function* () {
          const { baseUrl, execution } = yield* serve({ checkpoint, workers: 1 })
          const client = new OpenAI({ baseURL: baseUrl, apiKey: "test-key-0123456789abcdef", maxRetries: 0 })
          const ask = (seed: number, temperature: number) =>
            Effect.promise(() => client.chat.completions.create({ model: "gyre", messages: [{ role: "user", content: "hello" }], max_tokens: 10, temperature, seed }))
          const greedy = [yield* ask(1, 0), yield* ask(2, 0)]
          yield* ask(3, 1.3)
          return { greedy, records: yield* readRecords(execution, 3) }
        })
      )
    )
    expect(out.greedy[0]!.choices[0]!.message.content).toBe(out.greedy[1]!.choices[0]!.message.content)
    expect(out.records.map((r) => r.sampling)).toEqual([
      { temperature: 0, topP: 1 },
      { temperature: 0, topP: 1 },
      { temperature: 1.3, topP: 1 }
    ])
  }, 60_000)
})
