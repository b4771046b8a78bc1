/**
 * The rollout side: KV-cached decode against a full forward, the hand-off (export -> import
 * -> decode, bit for bit), forks (whole and prefix) sharing blocks with copy-on-write,
 * out-of-blocks and pin errors, and sampling.
 */
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { kvBytesPerToken } from "../../src/engine/config.ts"
import { Engine } from "../../src/engine/engine.ts"
import type { KvCache } from "../../src/engine/kvcache.ts"
import { EngineError, OutOfKvBlocks } from "../../src/engine/native.ts"
import { presets } from "../../src/engine/presets.ts"
import { decodeEach, maxAbsDiff, rng, runEngine } from "./helpers.ts"

const config = presets.tiny
const V = config.vocab_size
const random = rng(5)
const prompt = Array.from({ length: 45 }, () => Math.floor(random() * 256))


const withCache = <A, E>(blockTokens: number, numBlocks: number, use: (cache: KvCache) => Effect.Effect<A, E>) =>
  runEngine(
    Effect.gen(function* () {
      const engine = yield* Engine
      const model = yield* engine.createModel(config, { seed: 3, initStd: 0.1 })
      return yield* use(yield* model.cache({ blockTokens, numBlocks }))
    })
  )

describe("KV-cached inference", () => {
  it("decoding token by token equals one full forward over the sequence", async () => {
    const { full, steps, batched } = await withCache(16, 64, (cache) =>
      Effect.gen(function* () {
        const a = yield* cache.create()
        const full = (yield* cache.forward([{ seq: a, tokens: prompt }], "all")).logits!
        const b = yield* cache.create()
        const steps = yield* decodeEach(cache, b, prompt)
        // prefill of 20 then batched decode with another sequence in the batch
        const c = yield* cache.create()
        const d = yield* cache.create()
        yield* cache.forward([{ seq: c, tokens: prompt.slice(0, 20) }, { seq: d, tokens: [1, 2, 3] }], "none")
        const batched = (yield* cache.forward([{ seq: d, tokens: [4] }, { seq: c, tokens: prompt.slice(20, 21) }], "last")).logits!
        return { full, steps, batched }
      })
    )
    expect(full.length).toBe(prompt.length * V)
    let worst = 0
    steps.forEach((row, t) => (worst = Math.max(worst, maxAbsDiff(row, full.subarray(t * V, (t + 1) * V)))))
    // the same math; only F32 summation order differs (decode's few-row matmul sums by lanes)
    expect(worst).toBeLessThan(1e-4)
    expect(maxAbsDiff(batched.subarray(V, 2 * V), full.subarray(20 * V, 21 * V))).toBeLessThan(1e-4)
  })

  it("export -> import into another cache -> decode continues bit for bit; pins hold freed blocks", async () => {
    const out = await runEngine(
      Effect.gen(function* () {
        const engine = yield* Engine
        const model = yield* engine.createModel(config, { seed: 3, initStd: 0.1 })
        const source = yield* model.cache({ blockTokens: 16, numBlocks: 32 })
        const dest = yield* model.cache({ blockTokens: 8, numBlocks: 64 })
        const seq = yield* source.create()
        yield* source.forward([{ seq, tokens: prompt }], "none")
        yield* source.pin(seq)
        const appendWhilePinned = yield* Effect.flip(source.forward([{ seq, tokens: [1] }]))
        const buffer = yield* source.export(seq)
        const checksum = yield* engine.checksum(buffer.subarray(48))
        const header = new DataView(buffer.buffer, buffer.byteOffset)
        const moved = yield* dest.import(buffer)
        const length = yield* dest.length(moved)
        // the continuation on the destination, and a fork of the source left uninterrupted
        const copy = yield* source.fork(seq)
        yield* source.free(seq) // cancelled at the source: blocks stay until the ack
        const continued = yield* decodeEach(dest, moved, [7, 8, 9])
        const uninterrupted = yield* decodeEach(source, copy, [7, 8, 9])
        yield* source.free(copy)
        const usedWhilePinned = (yield* source.stats()).usedBlocks // only the freed, pinned sequence's
        yield* source.unpin(seq) // acknowledged
        const afterAck = yield* source.stats()
        const corrupt = Uint8Array.from(buffer)
        corrupt[1000] = corrupt[1000]! ^ 1
        const bad = yield* Effect.flip(dest.import(corrupt))
        const truncated = yield* Effect.flip(dest.import(buffer.subarray(0, buffer.length - 4)))
        return { appendWhilePinned, buffer, checksum, header, usedWhilePinned, continued, uninterrupted, afterAck, bad, truncated, length }
      })
    )
    expect(out.appendWhilePinned).toBeInstanceOf(EngineError)
    expect((out.appendWhilePinned as EngineError).code).toBe("GYRE_ERR_STATE")
    expect(new TextDecoder().decode(out.buffer.subarray(0, 4))).toBe("GYKV")
    expect(out.header.getUint32(24, true)).toBe(prompt.length)
    expect(out.header.getBigUint64(40, true)).toBe(out.checksum)
    expect(out.buffer.length).toBe(48 + prompt.length * kvBytesPerToken(config))
    expect(out.length).toBe(prompt.length)
    expect(out.usedWhilePinned).toBe(Math.ceil(prompt.length / 16))
    out.continued.forEach((row, i) => expect(Buffer.from(row.buffer).equals(Buffer.from(out.uninterrupted[i]!.buffer))).toBe(true))
    expect(out.afterAck.usedBlocks).toBe(0)
    expect(out.afterAck.numSequences).toBe(0)
    expect((out.bad as EngineError).code).toBe("GYRE_ERR_BAD_HANDOFF")
    expect(out.bad.message).toContain("checksum")
    expect(out.truncated.message).toContain("truncated")
  })

  it("a fork shares its parent's blocks and copies only the partly filled one when it diverges", async () => {
    const out = await withCache(16, 64, (cache) =>
      Effect.gen(function* () {
        const parent = yield* cache.create()
        yield* cache.forward([{ seq: parent, tokens: prompt }], "none") // 45 tokens: 3 blocks, the last partly filled
        const before = yield* cache.stats()
        const child = yield* cache.fork(parent)
        const afterFork = yield* cache.stats()
        const childLogits = (yield* cache.forward([{ seq: child, tokens: [200, 201] }], "all")).logits!
        const afterDiverge = yield* cache.stats()
        const parentLogits = (yield* cache.forward([{ seq: parent, tokens: [100] }], "last")).logits!
        const fresh = yield* cache.create()
        const freshChild = (yield* cache.forward([{ seq: fresh, tokens: [...prompt, 200, 201] }], "all")).logits!
        const freshParent = yield* cache.create()
        const freshParentLogits = (yield* cache.forward([{ seq: freshParent, tokens: [...prompt, 100] }], "last")).logits!
        return { before, afterFork, afterDiverge, childLogits, parentLogits, freshChild, freshParentLogits, childBlocks: yield* cache.blocks(child) }
      })
    )
    expect(out.before.usedBlocks).toBe(3)
    expect(out.afterFork.usedBlocks).toBe(3)
    expect(out.afterFork.numSequences).toBe(2)
    expect(out.afterDiverge.usedBlocks).toBe(4) // the shared third block copied, the first two still shared
    expect(out.childBlocks).toBe(3)
    const tail = out.freshChild.subarray((prompt.length) * V)
    expect(maxAbsDiff(out.childLogits, tail)).toBeLessThan(1e-4)
    expect(maxAbsDiff(out.parentLogits, out.freshParentLogits)).toBeLessThan(1e-4)
  })

  it("a prefix fork shares the blocks of the parent's first tokens; appending inside the shared block leaves the parent intact", async () => {
    const out = await withCache(16, 64, (cache) =>
      Effect.gen(function* () {
        const parent = yield* cache.create()
        yield* cache.forward([{ seq: parent, tokens: prompt }], "none") // 45 tokens: 3 blocks
        const child = yield* cache.forkPrefix(parent, 37) // inside the third block, which the parent fills to 45
        const afterFork = yield* cache.stats()
        const shape = { length: yield* cache.length(child), blocks: yield* cache.blocks(child) }
        const childLogits = (yield* cache.forward([{ seq: child, tokens: [200, 201] }], "all")).logits!
        const afterDiverge = yield* cache.stats()
        const parentLogits = (yield* cache.forward([{ seq: parent, tokens: [100] }], "last")).logits!
        const aligned = yield* cache.forkPrefix(parent, 32) // a block boundary: two blocks, nothing to copy
        const alignedBlocks = yield* cache.blocks(aligned)
        const fresh = yield* cache.create()
        const freshChild = (yield* cache.forward([{ seq: fresh, tokens: [...prompt.slice(0, 37), 200, 201] }], "all")).logits!
        const freshParent = yield* cache.create()
        const freshParentLogits = (yield* cache.forward([{ seq: freshParent, tokens: [...prompt, 100] }], "last")).logits!
        const errors = yield* Effect.forEach([0, 47], (n) => Effect.flip(cache.forkPrefix(parent, n)))
        return { afterFork, shape, childLogits, afterDiverge, parentLogits, alignedBlocks, freshChild, freshParentLogits, errors }
      })
    )
    expect(out.shape).toEqual({ length: 37, blocks: 3 })
    expect(out.afterFork.usedBlocks).toBe(3)
    expect(out.afterDiverge.usedBlocks).toBe(4) // the shared third block copied before the child wrote into it
    expect(out.alignedBlocks).toBe(2)
    expect(maxAbsDiff(out.childLogits, out.freshChild.subarray(37 * V))).toBeLessThan(1e-4)
    expect(maxAbsDiff(out.parentLogits, out.freshParentLogits)).toBeLessThan(1e-4)
    for (const e of out.errors) {
      expect((e as EngineError).code).toBe("GYRE_ERR_INVALID_ARGUMENT")
      expect(e.message).toContain("length must be in [1, 46]")
    }
  })

  it("running out of blocks is an error that changes nothing; freeing makes room", async () => {
    const out = await withCache(16, 4, (cache) =>
      Effect.gen(function* () {
        const a = yield* cache.create()
        const b = yield* cache.create()
        yield* cache.forward([{ seq: a, tokens: prompt.slice(0, 40) }], "none") // 3 blocks
        const before = yield* cache.stats()
        const error = yield* Effect.flip(cache.forward([{ seq: a, tokens: [1] }, { seq: b, tokens: prompt.slice(0, 20) }]))
        const after = yield* cache.stats()
        const lengths = [yield* cache.length(a), yield* cache.length(b)]
        yield* cache.free(a)
        yield* cache.forward([{ seq: b, tokens: prompt.slice(0, 20) }])
        return { before, error, after, lengths, final: yield* cache.stats() }
      })
    )
    expect(out.error).toBeInstanceOf(OutOfKvBlocks)
    expect(out.error.message).toMatch(/needs 2 free KV blocks but 1 of 4 are free/)
    expect(out.after).toEqual(out.before)
    expect(out.lengths).toEqual([40, 0])
    expect(out.final.usedBlocks).toBe(2)
    expect(out.before.bytesPerToken).toBe(kvBytesPerToken(config))
  })

  it("samples reproducibly from a seed and returns each token's log-probability", async () => {
    const out = await withCache(16, 64, (cache) =>
      Effect.gen(function* () {
        const run = (seed: number, temperature: number, topP: number) =>
          Effect.gen(function* () {
            const s = yield* cache.create()
            return yield* cache.forward([{ seq: s, tokens: prompt.slice(0, 10), sampling: { temperature, topP, seed } }], "last")
          })
        return { a: yield* run(1, 1, 1), b: yield* run(1, 1, 1), greedy: yield* run(9, 0, 1), nucleus: yield* run(4, 0.8, 0.5) }
      })
    )
    const logSoftmax = (row: Float32Array, t: number) => {
      const max = Math.max(...row)
      const lse = max + Math.log(row.reduce((s, x) => s + Math.exp(x - max), 0))
      return row[t]! - lse
    }
    expect(out.a.sampled).toEqual(out.b.sampled)
    expect(out.a.sampledLogprobs![0]).toBeCloseTo(logSoftmax(out.a.logits!, out.a.sampled![0]!), 5)
    const argmax = out.greedy.logits!.indexOf(Math.max(...out.greedy.logits!))
    expect(out.greedy.sampled![0]).toBe(argmax)
    expect(out.nucleus.sampledLogprobs![0]!).toBeLessThanOrEqual(0)
    expect(out.nucleus.sampledLogprobs![0]!).toBeGreaterThan(logSoftmax(out.nucleus.logits!.map((x) => x / 0.8), out.nucleus.sampled![0]!))
  })
})
