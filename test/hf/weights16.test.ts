/**
 * 16-bit weights kept 16-bit (CPU backend): a BF16 or F16 checkpoint loads with its matrices
 * memory-mapped from the shards (they appear in /proc/self/maps) and computes from them: prefill
 * and decode logits have the bits of the same checkpoint converted to F32, for Llama (tied),
 * Qwen2 and Qwen3 shapes; weights written into a 16-bit model are rounded to it; a trainer
 * widens the model to F32 master weights and trains as on the F32 model. The GEMM's 16-bit
 * path alone: `make -C native cpu-gemm16-check` (the engine's flags and a portable build).
 */
import { mkdtempSync, readFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { type LoadOptions, loadCheckpoint } from "../../src/engine/checkpoint.ts"
import type { LlamaConfig } from "../../src/engine/config.ts"
import { Engine } from "../../src/engine/engine.ts"
import { adamwDefaults } from "../../src/engine/trainer.ts"
import { chain, micro, packed, runEngine, runMakeCheck } from "../engine/helpers.ts"
import { qwenConfig, writeQwenModel } from "./qwen-fixtures.ts"

const tempDir = () => mkdtempSync(join(tmpdir(), "gyre-w16-"))
const backend = await runEngine(Effect.gen(function* () { return (yield* Engine).backend }))
const cpuOnly = backend !== "cpu" ? " (skipped: 16-bit weights are the CPU backend's)" : ""

const llama: LlamaConfig = { ...micro(true), vocab_size: 300, hidden_size: 64, intermediate_size: 96, max_position_embeddings: 256 }
const tokens = Array.from({ length: 37 }, (_, i) => (i * 53 + 7) % 300)

/** Logits of a prefill of `tokens` (every row) and of 5 decode steps after it, and the model's weight dtype. */
const run = (dir: string, options: LoadOptions) =>
  runEngine(
    Effect.gen(function* () {
      const { model } = yield* loadCheckpoint(dir, options)
      const cache = yield* model.cache({ blockTokens: 16, numBlocks: 8 })
      const seq = yield* cache.create()
      const prefill = (yield* cache.forward([{ seq, tokens }], "all")).logits!
      const decode: Array<number> = []
      for (const t of [3, 1, 4, 1, 5]) decode.push(...(yield* cache.forward([{ seq, tokens: [t] }], "last")).logits!)
      return { dtype: yield* model.weightDtype(), prefill, decode: Float32Array.from(decode) }
    })
  )

const same = (a: Float32Array, b: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(Buffer.from(b.buffer, b.byteOffset, b.byteLength))

describe("16-bit weights", () => {
  it("the GEMM's 16-bit path has the F32 kernel's bits on the widened weights (native and portable builds)", () => {
    expect(runMakeCheck("cpu-gemm16-check").trim().split("\n")).toEqual(["150 cases, 0 off", "150 cases, 0 off"])
  }, 120_000)

  it.skipIf(backend !== "cpu")(`BF16 and F16 checkpoints stay 16-bit, mapped, and give the F32 conversion's logits bit for bit${cpuOnly}`, async () => {
    const root = tempDir()
    const cases: Array<{ name: string; config: LlamaConfig; dtype: "BF16" | "F16" }> = [
      { name: "llama-bf16", config: llama, dtype: "BF16" },
      { name: "llama-f16", config: llama, dtype: "F16" },
      { name: "qwen2-bf16", config: qwenConfig("qwen2", 300), dtype: "BF16" },
      { name: "qwen3-bf16", config: qwenConfig("qwen3", 300, { rope_scaling: { rope_type: "yarn", factor: 4, original_max_position_embeddings: 32 } }), dtype: "BF16" }
    ]
    for (const [k, c] of cases.entries()) {
      const dir = join(root, c.name)
      await writeQwenModel(dir, c.config, { dtype: c.dtype, sharded: true, seed: 80 + k })
      const kept = await run(dir, {})
      const converted = await run(dir, { weights: "f32" })
      expect([kept.dtype, converted.dtype], c.name).toEqual([c.dtype, "F32"])
      expect(same(kept.prefill, converted.prefill), `${c.name} prefill`).toBe(true)
      expect(same(kept.decode, converted.decode), `${c.name} decode`).toBe(true)
      expect(kept.prefill.some((x) => Math.abs(x) > 0.1), c.name).toBe(true)
    }
  }, 120_000)

  it.skipIf(backend !== "cpu")(`the matrices are the shards' pages; written weights are rounded; a trainer widens to F32 master weights${cpuOnly}`, async () => {
    const dir = join(tempDir(), "qwen3")
    await writeQwenModel(dir, qwenConfig("qwen3", 300), { dtype: "BF16", sharded: true, seed: 90 })
    const result = await runEngine(
      Effect.gen(function* () {
        const { model } = yield* loadCheckpoint(dir)
        const maps = readFileSync("/proc/self/maps", "utf8")
        const shardsMapped = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"].map((f) => maps.includes(join(dir, f)))
        const before = yield* model.weightDtype()
        // written weights: the matrices' rounded to BF16 (x + 2^-20 is no BF16 value), the vectors' (norms) kept F32
        const w = yield* model.getWeights()
        const nudged = w.map((x) => x + 2 ** -20)
        yield* model.setWeights(nudged)
        const back = yield* model.getWeights()
        const bits = new Uint32Array(back.buffer)
        const layout = yield* model.layout()
        const values = (rank: number) => layout.filter((t) => t.shape.length === rank).flatMap((t) => Array.from({ length: t.shape.reduce((a, b) => a * b, 1) }, (_, i) => t.offset + i))
        const bf16Exact = values(2).every((i) => (bits[i]! & 0xffff) === 0) && values(2).some((i) => back[i] !== nudged[i])
        const vectorsKept = values(1).every((i) => back[i] === nudged[i])
        // a trainer on the 16-bit model, and the same steps on the model converted to F32
        const steps = (m: typeof model) =>
          Effect.gen(function* () {
            const trainer = yield* m.trainer({ maxTokens: 24 })
            const logps: Array<number> = []
            for (let s = 0; s < 2; s++) {
              yield* trainer.zeroGrads()
              logps.push(...(yield* trainer.train(packed(tokens.slice(0, 24), chain(24)), { kind: "sft" })).tokenLogprobs.subarray(1))
              yield* trainer.step({ ...adamwDefaults, lr: 1e-3 })
            }
            return { logps, weights: yield* m.getWeights(), dtype: yield* m.weightDtype() }
          })
        yield* model.setWeights(w)
        const trained = yield* steps(model)
        const { model: f32 } = yield* loadCheckpoint(dir, { weights: "f32" })
        const reference = yield* steps(f32)
        return { shardsMapped, before, bf16Exact, vectorsKept, trained, reference }
      })
    )
    expect(result.shardsMapped).toEqual([true, true])
    expect(result.before).toBe("BF16")
    expect(result.bf16Exact).toBe(true)
    expect(result.vectorsKept).toBe(true)
    expect(result.trained.dtype).toBe("F32")
    expect(result.trained.logps).toEqual(result.reference.logps)
    expect(same(result.trained.weights, result.reference.weights)).toBe(true)
  }, 120_000)
})
