/**
 * Checkpoint directories: save -> load round trip (weights, optimizer state, config.json in
 * the Hugging Face form) and refusal of bad or truncated files with a clear error.
 */
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { CheckpointError, loadCheckpoint, readConfig, restoreOptimizer, saveCheckpoint } from "../../src/engine/checkpoint.ts"
import type { LlamaConfig } from "../../src/engine/config.ts"
import { Engine } from "../../src/engine/engine.ts"
import { presets } from "../../src/engine/presets.ts"
import { adamwDefaults } from "../../src/engine/trainer.ts"
import { chain, micro, packed, runEngine } from "./helpers.ts"

const tempDir = () => mkdtempSync(join(tmpdir(), "gyre-ckpt-"))

/** A checkpoint of `config` after one SFT step (so the optimizer state is not zero). */
const writeTrained = (dir: string, config: LlamaConfig = presets.tiny) =>
  runEngine(
    Effect.gen(function* () {
      const engine = yield* Engine
      const model = yield* engine.createModel(config, { seed: 8 })
      const trainer = yield* model.trainer({ maxTokens: 16 })
      yield* trainer.train(packed([1, 2, 3, 4, 5, 6], chain(6)), { kind: "sft" })
      yield* trainer.step({ ...adamwDefaults, lr: 1e-3 })
      yield* saveCheckpoint(dir, model, trainer)
      return { weights: yield* model.getWeights(), optimizer: yield* trainer.saveOptimizer() }
    })
  )

const loadError = (dir: string) =>
  runEngine(Effect.flip(loadCheckpoint(dir).pipe(Effect.flatMap(({ model }) => model.getWeights()))))

describe("checkpoints", () => {
  it("round-trips weights and optimizer state; config.json is a Hugging Face LlamaConfig", async () => {
    const dir = tempDir()
    const saved = await writeTrained(dir)
    const loaded = await runEngine(
      Effect.gen(function* () {
        const { model, optimizer } = yield* loadCheckpoint(dir)
        const trainer = yield* model.trainer({ maxTokens: 16 })
        yield* restoreOptimizer(dir, trainer, optimizer!)
        return { weights: yield* model.getWeights(), optimizer: yield* trainer.saveOptimizer(), steps: yield* trainer.stepCount() }
      })
    )
    expect(Buffer.from(loaded.weights.buffer).equals(Buffer.from(saved.weights.buffer))).toBe(true)
    expect(Buffer.from(loaded.optimizer).equals(Buffer.from(saved.optimizer))).toBe(true)
    expect(loaded.steps).toBe(1)
    const json = JSON.parse(readFileSync(join(dir, "config.json"), "utf8"))
    expect(json).toMatchObject({ model_type: "llama", architectures: ["LlamaForCausalLM"], hidden_act: "silu", torch_dtype: "float32", ...presets.tiny })
    // safetensors header: HF names, F32
    const st = readFileSync(join(dir, "model.safetensors"))
    const header = JSON.parse(st.subarray(8, 8 + Number(st.readBigUInt64LE(0))).toString("utf8"))
    expect(header["model.layers.3.mlp.down_proj.weight"]).toMatchObject({ dtype: "F32", shape: [128, 384] })
    expect(header["lm_head.weight"]).toBeUndefined() // tied
    expect((await runEngine(readConfig(dir))).config).toEqual(presets.tiny)
  })

  it("refuses truncated, mismatched and malformed checkpoints with a clear error", async () => {
    const dir = tempDir()
    await writeTrained(dir, micro(false))
    const model = readFileSync(join(dir, "model.safetensors"))
    const config = readFileSync(join(dir, "config.json"), "utf8")
    const cases: Array<[string, () => void, RegExp]> = [
      ["truncated", () => writeFileSync(join(dir, "model.safetensors"), model.subarray(0, model.length - 100)), /model\.safetensors.*truncated/],
      ["header cut", () => writeFileSync(join(dir, "model.safetensors"), model.subarray(0, 40)), /truncated: header claims/],
      ["wrong shape", () => writeFileSync(join(dir, "config.json"), config.replace('"intermediate_size": 24', '"intermediate_size": 28')), /has shape \[24, 16\]; expected \[28, 16\]/],
      ["missing tensor", () => writeFileSync(join(dir, "config.json"), config.replace('"num_hidden_layers": 2', '"num_hidden_layers": 3')), /missing tensor 'model.layers.2.input_layernorm.weight'/],
      ["extra tensor", () => writeFileSync(join(dir, "config.json"), config.replace('"num_hidden_layers": 2', '"num_hidden_layers": 1')), /unexpected tensor 'model.layers.1/],
      ["bad json", () => writeFileSync(join(dir, "config.json"), "{ not json"), /config\.json/],
      ["unsupported", () => writeFileSync(join(dir, "config.json"), config.replace('"hidden_act": "silu"', '"hidden_act": "gelu"')), /hidden_act 'gelu'/]
    ]
    for (const [name, corrupt, message] of cases) {
      writeFileSync(join(dir, "model.safetensors"), model)
      writeFileSync(join(dir, "config.json"), config)
      corrupt()
      const error = await loadError(dir)
      expect(error, name).toBeInstanceOf(CheckpointError)
      expect(`${(error as CheckpointError).path}: ${error.message}`, name).toMatch(message)
    }
  })
})
