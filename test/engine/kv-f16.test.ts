/**
 * F16 KV storage (`model.cache({ kvDtype: "f16" })`, gyre.h GYRE_KV_F16): the conversions of
 * native/src/half.h against an exact reference (both the F16C and the portable path), decode
 * against prefill within an F16 cache, F16 against F32 logits, half the bytes per token and in
 * the hand-off, hand-offs F16 -> F16 (another block size) and F16 -> F32 -> F16 continuing bit
 * for bit, and an F32 payload rounded into an F16 pool. The same on either backend
 * (`native/gpu-check.sh` runs these tests with GYRE_BACKEND=cuda).
 */
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { kvBytesPerToken } from "../../src/engine/config.ts"
import { Engine } from "../../src/engine/engine.ts"
import { presets } from "../../src/engine/presets.ts"
import { decodeEach, maxAbsDiff, rng, runEngine, runMakeCheck } from "./helpers.ts"

const config = presets.tiny
const V = config.vocab_size
const random = rng(11)
const prompt = Array.from({ length: 150 }, () => Math.floor(random() * 256))
const next = [7, 8, 9, 10, 11]

const sameBits = (a: ReadonlyArray<Float32Array>, b: ReadonlyArray<Float32Array>) =>
  a.length === b.length && a.every((row, i) => Buffer.from(row.buffer).equals(Buffer.from(b[i]!.buffer)))

describe("F16 KV storage", () => {
  it("half.h converts like an exact reference, with F16C and without", () => {
    const lines = runMakeCheck("cpu-half-check").trim().split("\n")
    expect(lines).toHaveLength(2)
    for (const line of lines) expect(line).toMatch(/^half-check \((F16C|portable)\): ok, 0 mismatches$/)
  }, 60_000)

  it("decodes like its own prefill, close to F32, in half the bytes", async () => {
    const out = await runEngine(
      Effect.gen(function* () {
        const engine = yield* Engine
        const model = yield* engine.createModel(config, { seed: 3, initStd: 0.1 })
        const half = yield* model.cache({ blockTokens: 16, numBlocks: 64, kvDtype: "f16" })
        const full = yield* model.cache({ blockTokens: 16, numBlocks: 64 })
        const all = (yield* half.forward([{ seq: yield* half.create(), tokens: [...prompt, ...next] }], "all")).logits!
        const a = yield* half.create()
        yield* half.forward([{ seq: a, tokens: prompt }], "none")
        const steps = yield* decodeEach(half, a, next)
        const b = yield* full.create()
        yield* full.forward([{ seq: b, tokens: prompt }], "none")
        const reference = yield* decodeEach(full, b, next)
        return { all, steps, reference, stats: yield* half.stats(), buffer: yield* half.export(a) }
      })
    )
    let selfWorst = 0
    let f32Worst = 0
    let scale = 0
    out.steps.forEach((row, i) => {
      const at = (prompt.length + i) * V
      selfWorst = Math.max(selfWorst, maxAbsDiff(row, out.all.subarray(at, at + V)))
      f32Worst = Math.max(f32Worst, maxAbsDiff(row, out.reference[i]!))
      scale = Math.max(scale, ...out.reference[i]!.map(Math.abs))
    })
    expect(selfWorst).toBeLessThan(1e-4) // the same stored values: only summation order differs
    expect(f32Worst).toBeGreaterThan(0) // K and V were rounded
    expect(f32Worst).toBeLessThan(2e-3 * scale)
    expect(out.stats.kvDtype).toBe("f16")
    expect(out.stats.bytesPerToken).toBe(kvBytesPerToken(config) / 2)
    expect(out.stats.bytesPerToken).toBe(kvBytesPerToken(config, "f16"))
    expect(out.stats.bytesTotal).toBe(out.stats.bytesPerToken * 16 * 64)
    const header = new DataView(out.buffer.buffer, out.buffer.byteOffset)
    expect(header.getUint32(20, true)).toBe(2)
    expect(out.buffer.length).toBe(48 + (prompt.length + next.length) * kvBytesPerToken(config, "f16"))
  })

  it("hands off F16 -> F16 and F16 -> F32 -> F16 bit for bit; F32 rounds into an F16 pool", async () => {
    const out = await runEngine(
      Effect.gen(function* () {
        const engine = yield* Engine
        const model = yield* engine.createModel(config, { seed: 3, initStd: 0.1 })
        const source = yield* model.cache({ blockTokens: 16, numBlocks: 32, kvDtype: "f16" })
        const odd = yield* model.cache({ blockTokens: 8, numBlocks: 64, kvDtype: "f16" }) // staged, not in place
        const wide = yield* model.cache({ blockTokens: 16, numBlocks: 32 })
        const seq = yield* source.create()
        yield* source.forward([{ seq, tokens: prompt }], "none")
        const buffer = yield* source.export(seq)
        const throughOdd = yield* odd.import(buffer)
        const widened = yield* wide.import(buffer)
        const wideBuffer = yield* wide.export(widened)
        const back = yield* source.import(wideBuffer)
        const fromF32 = yield* wide.create()
        yield* wide.forward([{ seq: fromF32, tokens: prompt }], "none")
        const f32Buffer = yield* wide.export(fromF32)
        const rounded = yield* odd.import(f32Buffer)
        return {
          f32: yield* decodeEach(wide, fromF32, next),
          uninterrupted: yield* decodeEach(source, seq, next),
          throughOdd: yield* decodeEach(odd, throughOdd, next),
          back: yield* decodeEach(source, back, next),
          rounded: yield* decodeEach(odd, rounded, next),
          wideBuffer,
          f32Buffer,
          buffer
        }
      })
    )
    expect(sameBits(out.throughOdd, out.uninterrupted)).toBe(true)
    expect(sameBits(out.back, out.uninterrupted)).toBe(true)
    expect(new DataView(out.wideBuffer.buffer, out.wideBuffer.byteOffset).getUint32(20, true)).toBe(4)
    expect(out.wideBuffer.length - 48).toBe(2 * (out.buffer.length - 48))
    // an F32 context rounded on import continues close to where it left F32
    expect(out.f32Buffer.length).toBe(out.wideBuffer.length)
    const scale = Math.max(...out.f32.flatMap((row) => [...row].map(Math.abs)))
    out.rounded.forEach((row, i) => expect(maxAbsDiff(row, out.f32[i]!)).toBeLessThan(2e-3 * scale))
    expect(sameBits(out.rounded, out.f32)).toBe(false)
  })
})
