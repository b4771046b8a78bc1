/**
 * Paced devices (`src/protocols/pace.ts`, `src/serving/pace.ts`): the `--pace` text form, and
 * on a real clock that paced work never completes before its paced time, that work whose real
 * compute took longer is counted as an overrun, that the event loop stays free while a device
 * waits out its pace; the batcher's steps and the trainer's micro-batches on the real CPU engine
 * paced the same way; a malformed `--pace` is one line and exit 2. (That `--pace` reaches the
 * devices of a run, through its journaled configuration to a joined node's device:
 * `join.test.ts`.)
 */
import { spawnSync } from "node:child_process"
import * as path from "node:path"
import { Effect, Layer, Logger, Metric, type Scope } from "effect"
import { describe, expect, it } from "vitest"
import { Engine } from "../../src/engine/engine.ts"
import { presets } from "../../src/engine/presets.ts"
import { special } from "../../src/engine/tokenizer.ts"
import { formatPace, parsePace } from "../../src/protocols/pace.ts"
import { makeBatcher } from "../../src/serving/batcher.ts"
import { makePacer, paceWorkCounter, pacedSeconds, pacedTrainer } from "../../src/serving/pace.ts"
import { repoRoot } from "../../src/runtime/nats-server.ts"
import { paceLine, paceSummary } from "../../src/cli/pace.ts"
import { chain, packed } from "../engine/helpers.ts"

const run = <A, E>(effect: Effect.Effect<A, E, Engine | Scope.Scope>): Promise<A> =>
  Effect.runPromise(effect.pipe(Effect.scoped, Effect.provide(Engine.layer.pipe(Layer.provide(Logger.layer([]))))))

/** `work` timed on the wall clock, in ms. */
const timed = <A, E, R>(work: Effect.Effect<A, E, R>) =>
  Effect.gen(function* () {
    const started = performance.now()
    const value = yield* work
    return { value, ms: performance.now() - started }
  })

/** Real compute of about `ms` on this thread (the event loop blocked, as a synchronous engine call would not be). */
const busy = (ms: number) =>
  Effect.sync(() => {
    const until = performance.now() + ms
    while (performance.now() < until);
  })

describe("--pace text", () => {
  it("parses any subset of the kinds and prints it back in a fixed order", () => {
    expect(parsePace("decode=40,prefill=2000,train=1500")).toEqual({ decode: 40, prefill: 2000, train: 1500 })
    expect(parsePace(" train = 0.5 ")).toEqual({ train: 0.5 })
    expect(parsePace("")).toBeUndefined()
    expect(formatPace({ train: 1500, decode: 40 })).toBe("decode=40,train=1500")
    expect(formatPace(undefined)).toBe("")
  })

  it("names what is wrong with a malformed pace", () => {
    expect(parsePace("decode")).toEqual({ error: expect.stringContaining("not kind=rate") })
    expect(parsePace("speed=3")).toEqual({ error: expect.stringContaining("unknown kind 'speed'") })
    expect(parsePace("decode=0")).toEqual({ error: expect.stringContaining("must be a number > 0") })
    expect(parsePace("decode=x")).toEqual({ error: expect.stringContaining("decode=x") })
    expect(parsePace("train=1,train=2")).toEqual({ error: "train given twice" })
  })

  it("gyre train --pace with a malformed value: one line, exit 2", () => {
    const r = spawnSync(process.execPath, [path.join(repoRoot, "bin", "gyre.js"), "train", "--pace", "decode=fast"], { encoding: "utf8" })
    expect(r.status).toBe(2)
    expect(r.stderr.trim().split("\n")).toHaveLength(1)
    expect(r.stderr).toContain("--pace decode=fast")
  })
})

describe("a paced run's summary", () => {
  it("sums the devices' counts and names a device that overran on more than 1% of its work", () => {
    const devices = [
      { device: "device/main.cpu0", pacedWork: 1000, paceOverruns: 10 },
      { device: "device/main.cpu1", pacedWork: 200, paceOverruns: 3 }
    ]
    const s = paceSummary({ decode: 8, train: 80 }, devices)
    expect(s).toMatchObject({ pace: "decode=8,train=80", paced_work: 1200, pace_overruns: 13, pace_overrun_devices: ["device/main.cpu1"] })
    expect(s.pace_by_device["device/main.cpu0"]).toEqual({ paced: 1000, overruns: 10 })
    expect(paceLine(s)).toContain("OVER 1% of their work on device/main.cpu1")
    expect(paceLine(paceSummary({ decode: 8 }, [devices[0]!]))).toContain("under 1% on every device")
    expect(paceSummary(undefined, []).pace).toBeNull()
  })
})

describe("a pacer on a real clock", () => {
  it("completes paced work of N tokens at R tokens/s no earlier than N/R, with the event loop free meanwhile", async () => {
    const pacer = makePacer({ prefill: 2000, decode: 50 })
    // 120 prompt tokens at 2000/s and one decode step at 50/s: 60 + 20 ms
    expect(pacedSeconds(pacer.pace, { prefill: 120, decode: 1 })).toBeCloseTo(0.08, 9)
    let ticks = 0
    const timer = setInterval(() => ticks++, 5)
    const runs = await Effect.runPromise(Effect.all(Array.from({ length: 5 }, () => timed(pacer.paced(Effect.succeed("done"), { prefill: 120, decode: 1 })))))
    clearInterval(timer)
    for (const r of runs) {
      expect(r.value).toBe("done")
      expect(r.ms).toBeGreaterThanOrEqual(80)
    }
    expect(ticks).toBeGreaterThan(5)
    expect(pacer.counts()).toEqual({ pacedWork: 5, paceOverruns: 0 })
  })

  it("counts work whose real compute took longer than its paced time as an overrun, and adds no wait to it", async () => {
    const pacer = makePacer({ train: 1000 }, "device/pace-test.0")
    const out = await Effect.runPromise(
      Effect.gen(function* () {
        // 100 tokens at 1000/s: 100 ms paced, 150 ms computed; done at once when the work is
        let computed = 0
        const slow = yield* timed(pacer.paced(busy(150).pipe(Effect.tap(() => Effect.sync(() => (computed = performance.now())))), { train: 100 }))
        const after = performance.now() - computed
        const fast = yield* timed(pacer.paced(busy(2), { train: 30 }))
        return { slow, after, fast, overrun: (yield* Metric.value(paceWorkCounter("device/pace-test.0", "overrun"))).count, inPace: (yield* Metric.value(paceWorkCounter("device/pace-test.0", "in_pace"))).count }
      })
    )
    expect(out.slow.ms).toBeGreaterThanOrEqual(150)
    // a wait of the paced time after the compute would be 100 ms here
    expect(out.after).toBeLessThan(50)
    expect(out.fast.ms).toBeGreaterThanOrEqual(30)
    expect(pacer.counts()).toEqual({ pacedWork: 2, paceOverruns: 1 })
    expect({ overrun: out.overrun, inPace: out.inPace }).toEqual({ overrun: 1, inPace: 1 })
  })

  it("leaves work no rate applies to, and failed work, unpaced", async () => {
    const pacer = makePacer({ train: 10 })
    const other = await Effect.runPromise(timed(pacer.paced(Effect.succeed(1), { decode: 1, prefill: 500 })))
    expect(other.ms).toBeLessThan(50)
    const failed = await Effect.runPromise(timed(Effect.flip(pacer.paced(Effect.fail("engine failed"), { train: 10 }))))
    expect(failed.value).toBe("engine failed")
    expect(failed.ms).toBeLessThan(500)
    expect(pacer.counts()).toEqual({ pacedWork: 0, paceOverruns: 0 })
    expect(makePacer(undefined).paced(Effect.succeed(1), { train: 1 })).toBeDefined()
  })
})

describe("paced engine work (CPU engine, tiny preset)", () => {
  it("a paced batcher takes at least a decode step's time per token it samples, and its load carries the counts", async () => {
    const decode = 100
    const out = await run(
      Effect.gen(function* () {
        const engine = yield* Engine
        const model = yield* engine.createModel(presets.tiny, { seed: 11, initStd: 0.2 })
        const cache = yield* model.cache({ blockTokens: 16, numBlocks: 64 })
        const pacer = makePacer({ decode, prefill: 5000 })
        const b = yield* makeBatcher(cache, { worker: "device/pace", maxContext: 1024, maxBatch: 4, prefillChunk: 64, contextsPerExecution: 4, version: 0, pacer })
        const prompt = Int32Array.from([special.bos, ...Buffer.from("a paced device walks the places")])
        const sampling = { maxTokens: 12, temperature: 1, topP: 1, seed: 5, stop: [] }
        const jobs = [0, 1].map((i) => b.generate({ execution: `x${i}`, request: `r${i}`, base: null, prompt, sampling }))
        const r = yield* timed(Effect.all(jobs, { concurrency: "unbounded" }))
        return { ms: r.ms, outputs: r.value.map((g) => g.output.length), load: b.load(), steps: b.counters().steps }
      })
    )
    expect(out.outputs).toEqual([12, 12])
    // both sequences decode together: 12 samples need at least 12 steps of 1/decode s each
    expect(out.ms).toBeGreaterThanOrEqual((12 * 1000) / decode)
    expect(out.load.pacedWork).toBe(out.steps)
    expect(out.load.paceOverruns).toBeLessThanOrEqual(out.steps)
  })

  it("a paced trainer's micro-batch of N tokens at R tokens/s takes at least N/R; an unpaced kind leaves the trainer as it is", async () => {
    const out = await run(
      Effect.gen(function* () {
        const engine = yield* Engine
        const model = yield* engine.createModel(presets.tiny, { seed: 1 })
        const trainer = yield* model.trainer({ maxTokens: 256 })
        const pacer = makePacer({ train: 1000 })
        const paced = pacedTrainer(trainer, pacer)
        const batch = packed(Array.from({ length: 200 }, (_, i) => i % 256), chain(200))
        const r = yield* timed(paced.train(batch, { kind: "sft" }))
        const grads = yield* paced.getGrads()
        return { ms: r.ms, loss: r.value.stats.loss, grads: grads.length, params: model.paramCount, counts: pacer.counts(), same: pacedTrainer(trainer, makePacer({ decode: 5 })) === trainer }
      })
    )
    expect(out.ms).toBeGreaterThanOrEqual(200)
    expect(Number.isFinite(out.loss)).toBe(true)
    expect(out.grads).toBe(out.params)
    expect(out.counts.pacedWork).toBe(1)
    expect(out.same).toBe(true)
  })
})
