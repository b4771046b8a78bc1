/**
 * The trainer side: a packed forest against its root-to-leaf sequences, gradient
 * accumulation and exchange, AdamW against its formula, staleness, determinism, and
 * training logits against inference logits.
 */
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { Engine } from "../../src/engine/engine.ts"
import { presets } from "../../src/engine/presets.ts"
import { adamwDefaults, type LossConfig } from "../../src/engine/trainer.ts"
import { chain, micro, packed, relativeError, rng, runEngine } from "./helpers.ts"

const config = presets.tiny
const random = rng(17)
const randomTokens = (n: number) => Array.from({ length: n }, () => Math.floor(random() * 256))

// a prompt of 30 tokens, two sampled continuations (25 and 18 tokens), and a separate tree
const prompt = randomTokens(30)
const branchA = randomTokens(25)
const branchB = randomTokens(18)
const other = randomTokens(21)

/** The forest and its three root-to-leaf paths, with per-token weights and PPO inputs. */
const forestAndPaths = () => {
  const pathA = [...prompt, ...branchA]
  const pathB = [...prompt, ...branchB]
  const tokens = [...pathA, ...branchB, ...other]
  const parents = [
    ...chain(pathA.length),
    ...branchB.map((_, i) => (i === 0 ? prompt.length - 1 : pathA.length + i - 1)),
    ...chain(other.length).map((p) => (p < 0 ? -1 : p + pathA.length + branchB.length))
  ]
  const [wA, wB, wC] = [1 / 40, 1 / 30, 1 / 20]
  // context (the prompt) untrained except its last tokens; every path weight per token
  const pathWeight = (w: number, n: number, promptLen: number) => Array.from({ length: n }, (_, i) => (i === 0 || i < promptLen - 5 ? 0 : w))
  const weightsA = pathWeight(wA, pathA.length, prompt.length)
  const weightsB = pathWeight(wB, pathB.length, prompt.length)
  const weightsC = pathWeight(wC, other.length, 0)
  const weights = [
    ...weightsA.map((w, i) => (i < prompt.length ? w + weightsB[i]! : w)),
    ...weightsB.slice(prompt.length),
    ...weightsC
  ]
  const adv = (i: number) => Math.sin(i * 1.7)
  const mu = (i: number) => -5.5 + 0.3 * Math.cos(i)
  const advA = pathA.map((_, i) => adv(i))
  const advB = pathB.map((_, i) => (i < prompt.length ? adv(i) : adv(i + 100)))
  const advC = other.map((_, i) => adv(i + 200))
  const muA = pathA.map((_, i) => mu(i))
  const muB = pathB.map((_, i) => (i < prompt.length ? mu(i) : mu(i + 100)))
  const muC = other.map((_, i) => mu(i + 200))
  const forest = packed(tokens, parents, {
    weights: Float32Array.from(weights),
    advantages: Float32Array.from([...advA, ...advB.slice(prompt.length), ...advC]),
    behaviourLogprobs: Float32Array.from([...muA, ...muB.slice(prompt.length), ...muC])
  })
  const paths = [
    packed(pathA, chain(pathA.length), { weights: Float32Array.from(weightsA), advantages: Float32Array.from(advA), behaviourLogprobs: Float32Array.from(muA) }),
    packed(pathB, chain(pathB.length), { weights: Float32Array.from(weightsB), advantages: Float32Array.from(advB), behaviourLogprobs: Float32Array.from(muB) }),
    packed(other, chain(other.length), { weights: Float32Array.from(weightsC), advantages: Float32Array.from(advC), behaviourLogprobs: Float32Array.from(muC) })
  ]
  return { forest, paths }
}

const forestEqualsPaths = (loss: LossConfig) =>
  runEngine(
    Effect.gen(function* () {
      const engine = yield* Engine
      const model = yield* engine.createModel(config, { seed: 21, initStd: 0.05 })
      const trainer = yield* model.trainer({ maxTokens: 128 })
      const { forest, paths } = forestAndPaths()
      yield* trainer.zeroGrads()
      const packedResult = yield* trainer.train(forest, loss)
      const packedGrads = yield* trainer.getGrads()
      yield* trainer.zeroGrads()
      let separateLoss = 0
      for (const p of paths) separateLoss += (yield* trainer.train(p, loss)).stats.loss
      const separateGrads = yield* trainer.getGrads()
      return { packedLoss: packedResult.stats.loss, separateLoss, packedGrads, separateGrads, stats: packedResult.stats }
    })
  )

describe("training over packed forests", () => {
  it("a forest's SFT loss and gradients equal its root-to-leaf sequences run separately", async () => {
    const r = await forestEqualsPaths({ kind: "sft" })
    expect(Math.abs(r.packedLoss - r.separateLoss) / Math.abs(r.separateLoss)).toBeLessThan(1e-5)
    expect(relativeError(r.packedGrads, r.separateGrads)).toBeLessThan(1e-5)
    expect(r.stats.trainedTokens).toBeGreaterThan(50)
  })

  it("a forest's PPO loss and gradients equal its root-to-leaf sequences run separately", async () => {
    const r = await forestEqualsPaths({ kind: "ppo", clipLow: 0.2, clipHigh: 0.2, isCap: 5 })
    expect(Math.abs(r.packedLoss - r.separateLoss) / Math.abs(r.separateLoss)).toBeLessThan(1e-5)
    expect(relativeError(r.packedGrads, r.separateGrads)).toBeLessThan(1e-5)
    expect(r.stats.clipFraction).toBeGreaterThan(0)
  })

  it("training log-probs equal inference logits, and stale tokens are dropped", async () => {
    const tokens = randomTokens(40)
    const r = await runEngine(
      Effect.gen(function* () {
        const engine = yield* Engine
        const model = yield* engine.createModel(config, { seed: 2, initStd: 0.1 })
        const trainer = yield* model.trainer({ maxTokens: 64 })
        const cache = yield* model.cache({ blockTokens: 16, numBlocks: 8 })
        const seq = yield* cache.create()
        const logits = (yield* cache.forward([{ seq, tokens }], "all")).logits!
        const batch = packed(tokens, chain(40), { versions: Int32Array.from({ length: 40 }, (_, i) => (i < 10 ? 1 : 3)) })
        const loss = { kind: "ppo", clipLow: 0.2, clipHigh: 0.2, isCap: 0, currentVersion: 4, maxStaleness: 2 } as const
        const trained = yield* trainer.train(batch, loss, { backward: false })
        return { logits, trained }
      })
    )
    const V = config.vocab_size
    let worst = 0
    for (let i = 1; i < 40; i++) {
      const row = r.logits.subarray((i - 1) * V, i * V)
      const max = Math.max(...row)
      const lse = max + Math.log(row.reduce((s, x) => s + Math.exp(x - max), 0))
      worst = Math.max(worst, Math.abs(r.trained.tokenLogprobs[i]! - (row[tokens[i]!]! - lse)))
    }
    expect(Number.isNaN(r.trained.tokenLogprobs[0]!)).toBe(true)
    expect(worst).toBeLessThan(1e-5)
    expect(r.trained.stats.staleTokens).toBe(9) // tokens 1..9 carry version 1, two versions too old
    expect(r.trained.stats.trainedTokens).toBe(30)
  })
})

describe("the trained weights as proximal policy", () => {
  it("proximal 'current' equals a scoring pass's log-probs given as proximal, bit for bit", async () => {
    const r = await runEngine(
      Effect.gen(function* () {
        const engine = yield* Engine
        const model = yield* engine.createModel(config, { seed: 5, initStd: 0.1 })
        const trainer = yield* model.trainer({ maxTokens: 128 })
        const { forest } = forestAndPaths()
        const loss = { kind: "ppo", clipLow: 0.2, clipHigh: 0.2, isCap: 1.5 } as const
        const scored = yield* trainer.train(forest, loss, { backward: false })
        yield* trainer.zeroGrads()
        const given = yield* trainer.train({ ...forest, proximalLogprobs: scored.tokenLogprobs }, loss)
        const givenGrads = yield* trainer.getGrads()
        yield* trainer.zeroGrads()
        const current = yield* trainer.train(forest, { ...loss, proximal: "current" })
        const currentGrads = yield* trainer.getGrads()
        return { scored, given, givenGrads, current, currentGrads }
      })
    )
    expect(r.current.stats).toEqual(r.given.stats)
    // a training pass's log-probs are the scoring pass's (the later PPO epochs take pass 1's as proximal)
    expect(Buffer.from(r.given.tokenLogprobs.buffer).equals(Buffer.from(r.scored.tokenLogprobs.buffer))).toBe(true)
    expect(r.current.stats.meanRatio).toBe(1)
    expect(r.current.stats.clipFraction).toBe(0)
    // w = min(pi / mu, 1.5) per trained token, pi the policy's own log-probs
    const { forest } = forestAndPaths()
    const ws: Array<number> = []
    for (let i = 0; i < forest.length; i++) {
      if (forest.weights[i] !== 0) ws.push(Math.min(Math.exp(r.scored.tokenLogprobs[i]! - forest.behaviourLogprobs[i]!), 1.5))
    }
    expect(r.current.stats.meanIsWeight).toBeCloseTo(ws.reduce((a, b) => a + b, 0) / ws.length, 5)
    expect(r.current.stats.truncatedFraction).toBeCloseTo(ws.filter((w) => w === 1.5).length / ws.length, 6)
    expect(r.current.stats.truncatedFraction).toBeGreaterThan(0)
    expect(r.current.stats.truncatedFraction).toBeLessThan(1)
    expect(Buffer.from(r.currentGrads.buffer).equals(Buffer.from(r.givenGrads.buffer))).toBe(true)
    expect(r.currentGrads.some((g) => g !== 0)).toBe(true)
  })
})

describe("gradients and AdamW", () => {
  const batchOf = (n: number, seed: number) => {
    const next = rng(seed)
    return packed(Array.from({ length: n }, () => Math.floor(next() * 32)), chain(n), { weights: Float32Array.from({ length: n }, (_, i) => (i === 0 ? 0 : 1 / n)) })
  }

  it("accumulates across micro-batches and exchanges gradients between trainers", async () => {
    const r = await runEngine(
      Effect.gen(function* () {
        const engine = yield* Engine
        const model = yield* engine.createModel(micro(false), { seed: 4, initStd: 0.2 })
        const a = yield* model.trainer({ maxTokens: 32 })
        const b = yield* model.trainer({ maxTokens: 32 })
        const one = batchOf(20, 1)
        const two = batchOf(12, 2)
        yield* a.train(one, { kind: "sft" })
        const gOne = yield* a.getGrads()
        yield* a.train(two, { kind: "sft" })
        const accumulated = yield* a.getGrads()
        yield* b.train(two, { kind: "sft" })
        const gTwo = yield* b.getGrads()
        // reduce: b takes a's first micro-batch gradient, then is overwritten and zeroed
        yield* b.addGrads(gOne, 1)
        const reduced = yield* b.getGrads()
        yield* b.setGrads(gOne)
        const set = yield* b.getGrads()
        yield* b.zeroGrads()
        const zeroed = yield* b.getGrads()
        return { gOne, gTwo, accumulated, reduced, set, zeroed }
      })
    )
    const sum = r.gOne.map((g, i) => g + r.gTwo[i]!)
    expect(relativeError(r.accumulated, sum)).toBeLessThan(1e-6)
    expect(relativeError(r.reduced, sum)).toBeLessThan(1e-6)
    expect(r.set).toEqual(r.gOne)
    expect(r.zeroed.every((g) => g === 0)).toBe(true)
  })

  it("an AdamW step with clipping matches torch.optim.AdamW's formula", async () => {
    const opt = { ...adamwDefaults, lr: 0.01, weightDecay: 0.1, maxGradNorm: 0.5 }
    const r = await runEngine(
      Effect.gen(function* () {
        const engine = yield* Engine
        const model = yield* engine.createModel(micro(true), { seed: 5, initStd: 0.2 })
        const trainer = yield* model.trainer({ maxTokens: 32 })
        const w0 = yield* model.getWeights()
        yield* trainer.train(batchOf(24, 3), { kind: "sft" })
        const g = yield* trainer.getGrads()
        const norm = yield* trainer.step(opt)
        const w1 = yield* model.getWeights()
        const norm2 = yield* trainer.step(opt) // same gradient again: second moments accumulate
        const w2 = yield* model.getWeights()
        return { w0, g, norm, w1, norm2, w2, steps: yield* trainer.stepCount() }
      })
    )
    const n = Math.sqrt(r.g.reduce((s, x) => s + x * x, 0))
    expect(r.norm).toBeCloseTo(n, 4)
    expect(r.norm2).toBeCloseTo(n, 4)
    expect(r.steps).toBe(2)
    const clip = Math.min(1, opt.maxGradNorm / (n + 1e-6))
    const m = new Float64Array(r.g.length)
    const v = new Float64Array(r.g.length)
    const w = Float64Array.from(r.w0)
    for (let step = 1; step <= 2; step++) {
      for (let i = 0; i < w.length; i++) {
        const g = r.g[i]! * clip
        m[i] = opt.beta1 * m[i]! + (1 - opt.beta1) * g
        v[i] = opt.beta2 * v[i]! + (1 - opt.beta2) * g * g
        const denom = Math.sqrt(v[i]!) / Math.sqrt(1 - opt.beta2 ** step) + opt.eps
        w[i] = w[i]! * (1 - opt.lr * opt.weightDecay) - (opt.lr / (1 - opt.beta1 ** step)) * (m[i]! / denom)
      }
      expect(relativeError(step === 1 ? r.w1 : r.w2, w)).toBeLessThan(1e-6)
    }
    expect(relativeError(r.w1, r.w0)).toBeGreaterThan(1e-3)
  })

  it("is deterministic given a seed", async () => {
    const run = () =>
      runEngine(
        Effect.gen(function* () {
          const engine = yield* Engine
          const model = yield* engine.createModel(config, { seed: 99 })
          const trainer = yield* model.trainer({ maxTokens: 96 })
          const { forest } = forestAndPaths()
          for (let step = 0; step < 2; step++) {
            yield* trainer.zeroGrads()
            yield* trainer.train(forest, { kind: "ppo", clipLow: 0.2, clipHigh: 0.2, isCap: 2 })
            yield* trainer.step({ ...adamwDefaults, lr: 1e-3 })
          }
          return yield* model.getWeights()
        })
      )
    const [a, b] = [await run(), await run()]
    expect(Buffer.from(a.buffer).equals(Buffer.from(b.buffer))).toBe(true)
  })
})
