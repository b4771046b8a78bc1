/**
 * Qwen2 (q/k/v biases, tied or untied) and Qwen3 (per-head q/k RMSNorm, head_dim x heads !=
 * hidden_size, YaRN) checkpoints written by an independent writer (python3's struct module),
 * BF16 in shards and F32: logits and three AdamW steps agree with a plain-PyTorch reference
 * (bench/llama_torch.py, written from the transformers definitions); YaRN's frequencies and
 * attention factor agree with a Python reimplementation of transformers' formula; saves are
 * complete Hugging Face directories of the right architecture that reload bit-identically;
 * what the engine cannot run is refused with one line naming the config field.
 * Needs Debian's python3-torch for /usr/bin/python3; without it the reference comparisons
 * are reported as skipped, never as passed.
 */
import { spawnSync } from "node:child_process"
import { mkdtempSync, readFileSync, readdirSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { CheckpointError, loadCheckpoint, readConfig, saveCheckpoint } from "../../src/engine/checkpoint.ts"
import { type LlamaConfig, parseConfigJson } from "../../src/engine/config.ts"
import { Engine } from "../../src/engine/engine.ts"
import { headerLength, parseHeader } from "../../src/engine/safetensors.ts"
import { adamwDefaults } from "../../src/engine/trainer.ts"
import { chain, packed, runEngine } from "../engine/helpers.ts"
import { qwenConfig, qwenConfigJson, qwenIds, writeQwenModel } from "./qwen-fixtures.ts"

const python = "/usr/bin/python3"
const torchMissing = spawnSync(python, ["-c", "import torch"], { stdio: "ignore" }).status !== 0
const skipReason = torchMissing ? " (skipped: /usr/bin/python3 cannot import torch; apt-get install python3-torch)" : ""
const script = new URL("../../bench/llama_torch.py", import.meta.url).pathname
const torch = (...args: Array<string>) => {
  const run = spawnSync(python, [script, ...args], { encoding: "utf8", maxBuffer: 1 << 28 })
  if (run.status !== 0) throw new Error(`llama_torch.py ${args[0]}: ${run.stderr}`)
  return JSON.parse(run.stdout)
}

const tempDir = () => mkdtempSync(join(tmpdir(), "gyre-qwen-"))
const yarn = { rope_type: "yarn", factor: 4, original_max_position_embeddings: 64 } as const

const models: ReadonlyArray<{ readonly name: string; readonly config: LlamaConfig; readonly dtype: "F32" | "BF16"; readonly sharded: boolean }> = [
  { name: "qwen2 tied BF16 sharded", config: qwenConfig("qwen2", qwenIds("qwen2").vocabSize), dtype: "BF16", sharded: true },
  { name: "qwen2 untied F32", config: qwenConfig("qwen2", qwenIds("qwen2").vocabSize, { tie_word_embeddings: false }), dtype: "F32", sharded: false },
  { name: "qwen3 yarn BF16 sharded", config: qwenConfig("qwen3", qwenIds("qwen3").vocabSize, { rope_scaling: yarn }), dtype: "BF16", sharded: true },
  { name: "qwen3 tied F32", config: qwenConfig("qwen3", qwenIds("qwen3").vocabSize, { tie_word_embeddings: true }), dtype: "F32", sharded: false }
]

const tokensFor = (c: LlamaConfig, n: number) => Array.from({ length: n }, (_, i) => (i * 37 + 11) % c.vocab_size)

const maxDiff = (a: ArrayLike<number>, b: ArrayLike<number>) => {
  let m = 0
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!))
  return m
}

/** The engine's logits of `tokens` (prefill through the KV cache). */
const engineLogits = (dir: string, tokens: ReadonlyArray<number>) =>
  runEngine(
    Effect.gen(function* () {
      const { model } = yield* loadCheckpoint(dir)
      const cache = yield* model.cache({ blockTokens: 16, numBlocks: Math.ceil(tokens.length / 16) })
      const seq = yield* cache.create()
      return (yield* cache.forward([{ seq, tokens }], "all")).logits!
    })
  )

const opt = { ...adamwDefaults, lr: 1e-3 }

/** `steps` AdamW steps of the summed SFT loss over the tokens: the losses before each step and the weights after. */
const engineTrain = (dir: string, tokens: ReadonlyArray<number>, steps: number) =>
  runEngine(
    Effect.gen(function* () {
      const { model } = yield* loadCheckpoint(dir)
      const trainer = yield* model.trainer({ maxTokens: tokens.length })
      const losses: Array<number> = []
      for (let s = 0; s < steps; s++) {
        yield* trainer.zeroGrads()
        losses.push((yield* trainer.train(packed(tokens, chain(tokens.length)), { kind: "sft" })).stats.loss)
        yield* trainer.step(opt)
      }
      const layout = yield* model.layout()
      const weights = yield* model.getWeights()
      return { losses, layout, weights }
    })
  )

describe("Qwen2 and Qwen3 checkpoints against a PyTorch reference", () => {
  it.skipIf(torchMissing)(`logits agree to 1e-4 (tied and untied, BF16 sharded and F32, YaRN)${skipReason}`, async () => {
    const root = tempDir()
    for (const [k, m] of models.entries()) {
      const dir = join(root, `m${k}`)
      await writeQwenModel(dir, m.config, { dtype: m.dtype, sharded: m.sharded, seed: 20 + k })
      const tokens = tokensFor(m.config, 40)
      const ours = await engineLogits(dir, tokens)
      const theirs: Array<Array<number>> = torch("logits", "--checkpoint", dir, "--tokens", tokens.join(",")).logits
      expect(theirs.length, m.name).toBe(tokens.length)
      const flat = theirs.flat()
      expect(Math.max(...flat.map(Math.abs)), m.name).toBeGreaterThan(0.5) // logits far from zero, so the bound means something
      expect(maxDiff(ours, flat), m.name).toBeLessThan(1e-4)
    }
  }, 120_000)

  it.skipIf(torchMissing)(`three AdamW steps give the reference's losses and weights (biases and q/k norms trained)${skipReason}`, async () => {
    const root = tempDir()
    for (const k of [0, 2]) {
      const m = models[k]!
      const dir = join(root, `m${k}`)
      const written = await writeQwenModel(dir, m.config, { dtype: m.dtype, sharded: m.sharded, seed: 30 + k })
      const tokens = tokensFor(m.config, 24)
      const ours = await engineTrain(dir, tokens, 3)
      const theirs = torch("train", "--checkpoint", dir, "--tokens", tokens.join(","), "--steps", "3", "--lr", String(opt.lr), "--weight-decay", String(opt.weightDecay), "--max-grad-norm", String(opt.maxGradNorm))
      ours.losses.forEach((l, s) => expect(Math.abs(l - theirs.losses[s]) / Math.abs(theirs.losses[s]), `${m.name} loss ${s}`).toBeLessThan(1e-5))
      for (const t of ours.layout) {
        const got = ours.weights.subarray(t.offset, t.offset + t.shape.reduce((a, b) => a * b, 1))
        expect(maxDiff(got, theirs.weights[t.name]), `${m.name} ${t.name}`).toBeLessThan(2e-5)
        // every tensor moved: gradients reached the biases and the q/k norms
        expect(maxDiff(got, written.find((w) => w.name === t.name)!.values), `${m.name} ${t.name} moved`).toBeGreaterThan(1e-3)
      }
      expect(ours.layout.some((t) => t.name.endsWith(k === 0 ? "q_proj.bias" : "k_norm.weight"))).toBe(true)
    }
  }, 120_000)

  it.skipIf(torchMissing)(`YaRN's frequencies and attention factor agree with transformers' formula${skipReason}`, async () => {
    const base = qwenConfig("qwen3", 64, { max_position_embeddings: 4096, head_dim: 64 })
    const variants: Array<Record<string, unknown>> = [
      { factor: 4, original_max_position_embeddings: 1024 },
      { factor: 8 }, // original: max_position_embeddings
      { factor: 4, original_max_position_embeddings: 512, beta_fast: 16, beta_slow: 2, truncate: false },
      { factor: 40, original_max_position_embeddings: 4096, mscale: 1, mscale_all_dim: 0.707 },
      { factor: 2, attention_factor: 1.25 },
      { factor: 0.5 } // factor <= 1: attention factor 1
    ]
    const jsons = [...variants, { factor: 4 }].map((v) => qwenConfigJson(base, { rope_scaling: { type: "yarn", ...v } }))
    const configs = jsons.map(parseConfigJson)
    configs.forEach((c) => expect(c.rope_scaling?.rope_type).toBe("yarn"))
    const ours = await runEngine(
      Effect.forEach(configs, (c) => Effect.gen(function* () {
        const engine = yield* Engine
        return { freq: yield* engine.ropeInvFreq(c), scaling: yield* engine.ropeAttentionScaling(c) }
      }))
    )
    const reference: Array<{ inv_freq: Array<number>; attention_scaling: number }> = torch("rope", "--configs", JSON.stringify(jsons))
    reference.forEach((r, k) => {
      const name = JSON.stringify(jsons[k]!.rope_scaling)
      r.inv_freq.forEach((f, j) => expect(Math.abs(ours[k]!.freq[j]! - f) / f, `${name} inv_freq[${j}]`).toBeLessThan(1e-6))
      expect(Math.abs(ours[k]!.scaling - r.attention_scaling), name).toBeLessThan(1e-6)
    })
    // the factor the paper suggests: 0.1 ln(4) + 1; factor <= 1: none; both ends of the ramp present
    expect(reference[variants.length]!.attention_scaling).toBeCloseTo(1.1386294, 6)
    expect(reference[5]!.attention_scaling).toBe(1)
    expect(ours[0]!.freq[0]).toBe(1) // extrapolated: theta^0
    expect(Math.abs(ours[0]!.freq[31]! * 4 - (1 / 1e6) ** (62 / 64)) / ours[0]!.freq[31]!).toBeLessThan(1e-5) // interpolated: / factor
  }, 60_000)
})

describe("Qwen checkpoints in and out", () => {
  it("saves complete Hugging Face directories of the architecture, which reload bit-identically", async () => {
    const root = tempDir()
    for (const k of [0, 2]) {
      const m = models[k]!
      const src = join(root, `src${k}`), out = join(root, `out${k}`)
      await writeQwenModel(src, m.config, { dtype: m.dtype, sharded: m.sharded, seed: 40 + k })
      const weights = await runEngine(
        Effect.gen(function* () {
          const { model } = yield* loadCheckpoint(src)
          yield* saveCheckpoint(out, model, undefined, { maxShardBytes: 20_000 })
          return yield* model.getWeights()
        })
      )
      const qwen3 = m.config.model_type === "qwen3"
      const json = JSON.parse(readFileSync(join(out, "config.json"), "utf8"))
      expect(json).toMatchObject({ architectures: [qwen3 ? "Qwen3ForCausalLM" : "Qwen2ForCausalLM"], model_type: m.config.model_type, torch_dtype: "bfloat16", use_sliding_window: false })
      if (qwen3) expect(json).toMatchObject({ head_dim: 16, attention_bias: false, rope_scaling: yarn })
      expect(readdirSync(out)).toEqual(expect.arrayContaining(["tokenizer.json", "tokenizer_config.json", "generation_config.json", "model.safetensors.index.json"]))
      expect(readFileSync(join(out, "tokenizer_config.json"), "utf8")).toBe(readFileSync(join(src, "tokenizer_config.json"), "utf8"))
      // the tensor names transformers' Qwen2/Qwen3 modules have, nothing else
      const index = JSON.parse(readFileSync(join(out, "model.safetensors.index.json"), "utf8"))
      const names = Object.keys(index.weight_map)
      const layer0 = names.filter((n) => n.startsWith("model.layers.0.")).map((n) => n.slice("model.layers.0.".length)).sort()
      const attention = qwen3 ? ["q_norm.weight", "k_norm.weight"] : ["q_proj.bias", "k_proj.bias", "v_proj.bias"]
      const expected = ["input_layernorm.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight", ...["q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", ...attention].map((n) => `self_attn.${n}`)]
      expect(layer0).toEqual(expected.sort())
      expect(names.includes("lm_head.weight")).toBe(!m.config.tie_word_embeddings)
      for (const file of new Set(Object.values(index.weight_map) as Array<string>)) {
        const bytes = readFileSync(join(out, file))
        for (const e of parseHeader(bytes.subarray(8, 8 + headerLength(bytes)), bytes.length)) expect(e.dtype, e.name).toBe("BF16")
      }
      expect((await runEngine(readConfig(out))).config).toEqual(m.config)
      const again = await runEngine(Effect.gen(function* () { return yield* (yield* loadCheckpoint(out)).model.getWeights() }))
      expect(Buffer.from(again.buffer).equals(Buffer.from(weights.buffer))).toBe(true)
    }
  }, 60_000)

  it("refuses what the engine cannot run with one line naming the field", () => {
    const c = qwenConfig("qwen3", 64)
    const cases: Array<[Record<string, unknown>, RegExp]> = [
      [qwenConfigJson(c, { use_sliding_window: true }), /use_sliding_window true is not supported/],
      [qwenConfigJson(c, { layer_types: ["full_attention", "sliding_attention"] }), /layer_types 'sliding_attention' is not supported/],
      [qwenConfigJson(c, { attention_bias: true }), /attention_bias true is not supported/],
      [qwenConfigJson(c, { hidden_act: "gelu" }), /hidden_act 'gelu' is not 'silu'/],
      [qwenConfigJson(c, { model_type: "qwen3_moe", architectures: ["Qwen3MoeForCausalLM"] }), /model_type 'qwen3_moe' is not supported/],
      [qwenConfigJson(c, { num_experts: 8 }), /num_experts 8 is not supported/],
      [qwenConfigJson(c, { partial_rotary_factor: 0.5 }), /partial_rotary_factor 0.5 is not supported/],
      [qwenConfigJson(c, { architectures: ["Qwen3ForSequenceClassification"] }), /architectures \['Qwen3ForSequenceClassification'\] is not Qwen3ForCausalLM/],
      [qwenConfigJson(c, { rope_scaling: { type: "yarn" } }), /rope_scaling \(yarn\).*factor/],
      [qwenConfigJson(c, { rope_scaling: { rope_type: "longrope", factor: 2 } }), /rope_scaling\.rope_type 'longrope' is not supported/]
    ]
    for (const [json, message] of cases) {
      expect(() => parseConfigJson(json), String(message)).toThrow(message)
      try {
        parseConfigJson(json)
      } catch (e) {
        expect((e as Error).message).not.toContain("\n")
      }
    }
    // Qwen2.5's shipped window fields are not a window when use_sliding_window is false; a Qwen2 without model_type is found by its architecture
    const q2 = qwenConfig("qwen2", 64)
    expect(parseConfigJson(qwenConfigJson(q2, { sliding_window: 32768, max_window_layers: 21 }))).toEqual(q2)
    const { model_type: _, ...byArchitecture } = qwenConfigJson(q2)
    expect(parseConfigJson(byArchitecture)).toEqual(q2)
  })

  it("a checkpoint whose tensors miss the architecture's biases is named", async () => {
    const root = tempDir()
    const c = qwenConfig("qwen2", qwenIds("qwen2").vocabSize)
    await writeQwenModel(join(root, "q"), c, { dtype: "BF16", sharded: false, seed: 50, configExtra: { model_type: "llama", architectures: ["LlamaForCausalLM"], sliding_window: null } })
    const error = await runEngine(Effect.flip(loadCheckpoint(join(root, "q"))))
    expect(error).toBeInstanceOf(CheckpointError)
    expect(error.message).toMatch(/unexpected tensor 'model\.layers\.0\.self_attn\.q_proj\.bias'/)
  })
})
