/**
 * Hugging Face checkpoint directories written by an independent writer (python3's struct
 * module, `fixtures.ts`): BF16 in two shards with an index and F16 in one file load exactly as
 * the same rounded values in F32 and score within the 16-bit rounding of the F32 originals;
 * RoPE scaling (llama3 against a reference of transformers' formula, linear as scaled
 * positions); saves keep the dtype, shard, index and copy tokenizer files, and reload
 * bit-identically; bad fields, missing tensors and wrong dtypes fail with one line naming them;
 * a head_dim with head_dim x heads != hidden_size is read with HF's meaning, loads, saves and
 * reloads, and a q_proj shaped for hidden_size / heads is named.
 */
import { copyFileSync, mkdtempSync, readFileSync, readdirSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { CheckpointError, loadCheckpoint, readConfig, saveCheckpoint } from "../../src/engine/checkpoint.ts"
import { type LlamaConfig, headDim, parseConfigJson } from "../../src/engine/config.ts"
import { Engine, type Model } from "../../src/engine/engine.ts"
import { headerLength, parseHeader } from "../../src/engine/safetensors.ts"
import { chain, micro, packed, rng, runEngine } from "../engine/helpers.ts"
import { type Tensor, writeSafetensors } from "./fixtures.ts"

const tempDir = () => mkdtempSync(join(tmpdir(), "gyre-hf-"))

const config: LlamaConfig = { ...micro(false), vocab_size: 96, hidden_size: 32, intermediate_size: 48, max_position_embeddings: 128 }

/** config.json as the hub writes it (HF field set, lists for token ids). */
const configJson = (c: LlamaConfig, extra: Record<string, unknown> = {}) => ({
  architectures: ["LlamaForCausalLM"],
  model_type: "llama",
  hidden_act: "silu",
  attention_bias: false,
  mlp_bias: false,
  torch_dtype: "bfloat16",
  bos_token_id: 1,
  eos_token_id: [2, 3],
  ...c,
  head_dim: headDim(c),
  rope_scaling: c.rope_scaling ?? null,
  ...extra
})

/** Random weights for every tensor of the layout (norms near 1), by name. */
const randomTensors = async (c: LlamaConfig, seed: number): Promise<Array<Tensor>> => {
  const layout = await runEngine(Effect.gen(function* () { return yield* (yield* Engine).layout(c) }))
  const next = rng(seed)
  return layout.map((t) => {
    const n = t.shape.reduce((a, b) => a * b, 1)
    const norm = t.name.endsWith("norm.weight")
    return { name: t.name, shape: t.shape, values: Float32Array.from({ length: n }, () => (norm ? 1 + (next() - 0.5) * 0.2 : (next() - 0.5) * 0.3)) }
  })
}

const writeDir = (dir: string, c: LlamaConfig, shards: Parameters<typeof writeSafetensors>[1], extra: Record<string, unknown> = {}) => {
  writeSafetensors(dir, shards)
  writeFileSync(join(dir, "config.json"), JSON.stringify(configJson(c, extra)))
  if (shards.length > 1) {
    const weight_map = Object.fromEntries(shards.flatMap((s) => s.tensors.map((t) => [t.name, s.file])))
    writeFileSync(join(dir, "model.safetensors.index.json"), JSON.stringify({ metadata: { total_size: 0 }, weight_map }))
  }
}

const tokens = Array.from({ length: 24 }, (_, i) => (i * 37 + 5) % config.vocab_size)

/** Log-probs of `tokens` under a model (the trainer's forward). */
const score = (model: Model) =>
  Effect.gen(function* () {
    const trainer = yield* model.trainer({ maxTokens: tokens.length })
    return (yield* trainer.train(packed(tokens, chain(tokens.length)), { kind: "sft" }, { backward: false })).tokenLogprobs
  })

const load = (dir: string) =>
  runEngine(
    Effect.gen(function* () {
      const { model } = yield* loadCheckpoint(dir)
      return { weights: yield* model.getWeights(), logprobs: yield* score(model) }
    })
  )

const maxDiff = (a: ArrayLike<number>, b: ArrayLike<number>) => {
  let m = 0
  for (let i = 1; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!))
  return m
}

/** The values of a dtype, read back through python (its own rounding), as an F32 checkpoint. */
const roundedAsF32 = (dir: string, file: string, dtype: "F16" | "BF16", tensors: ReadonlyArray<Tensor>) => {
  const rounded = join(dir, "rounded")
  writeSafetensors(rounded, [{ file: "model.safetensors", dtype, tensors }])
  const bytes = readFileSync(join(rounded, "model.safetensors"))
  const entries = parseHeader(bytes.subarray(8, 8 + headerLength(bytes)), bytes.length)
  const f32 = entries.map((e) => {
    const raw = bytes.subarray(e.begin, e.end)
    const values = Float32Array.from({ length: raw.length / 2 }, (_, i) => {
      const h = raw.readUInt16LE(2 * i)
      return dtype === "BF16" ? new Float32Array(new Uint32Array([h << 16]).buffer)[0]! : halfToFloat(h)
    })
    return { name: e.name, shape: e.shape, values }
  })
  writeSafetensors(join(dir, file), [{ file: "model.safetensors", dtype: "F32", tensors: f32 }])
  writeFileSync(join(dir, file, "config.json"), JSON.stringify(configJson(config)))
  return join(dir, file)
}

/** IEEE half to number (the test's own decoding of python's "e" format). */
const halfToFloat = (h: number) => {
  const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, m = h & 0x3ff
  if (e === 0) return s * m * 2 ** -24
  if (e === 31) return m === 0 ? s * Infinity : NaN
  return s * (1 + m / 1024) * 2 ** (e - 15)
}

describe("Hugging Face checkpoints", () => {
  it("BF16 in two shards with an index, and F16: exact conversion, log-probs within the 16-bit rounding", async () => {
    const tensors = await randomTensors(config, 3)
    const root = tempDir()
    const f32 = join(root, "f32"), bf16 = join(root, "bf16"), f16 = join(root, "f16")
    writeDir(f32, config, [{ file: "model.safetensors", dtype: "F32", tensors }], { torch_dtype: "float32" })
    const half = Math.ceil(tensors.length / 2)
    writeDir(bf16, config, [
      { file: "model-00001-of-00002.safetensors", dtype: "BF16", tensors: tensors.slice(0, half) },
      { file: "model-00002-of-00002.safetensors", dtype: "BF16", tensors: tensors.slice(half) }
    ])
    writeDir(f16, config, [{ file: "model.safetensors", dtype: "F16", tensors }], { torch_dtype: "float16" })
    const [full, b, h] = [await load(f32), await load(bf16), await load(f16)]
    // the 16-bit values are F32 values: the same values written in F32 load bit-identically
    for (const [dir, dtype, got] of [[bf16, "BF16", b], [f16, "F16", h]] as const) {
      const exact = await load(roundedAsF32(root, `${dtype}-as-f32`, dtype, tensors))
      expect(Buffer.from(got.weights.buffer).equals(Buffer.from(exact.weights.buffer)), dir).toBe(true)
      expect(Array.from(got.logprobs)).toEqual(Array.from(exact.logprobs))
    }
    // against the F32 originals: BF16 keeps 8 bits of mantissa, F16 11
    expect(maxDiff(b.logprobs, full.logprobs)).toBeLessThan(5e-2)
    expect(maxDiff(h.logprobs, full.logprobs)).toBeLessThan(5e-3)
    expect(maxDiff(b.logprobs, full.logprobs)).toBeGreaterThan(maxDiff(h.logprobs, full.logprobs))
  })

  it("saves keep the dtype, shard with an index, copy tokenizer files, and reload bit-identically", async () => {
    const tensors = await randomTensors(config, 4)
    const root = tempDir()
    const src = join(root, "src"), out = join(root, "out"), f16 = join(root, "f16")
    writeDir(src, config, [{ file: "model.safetensors", dtype: "BF16", tensors }], { rope_scaling: null, custom_field: "kept" })
    writeFileSync(join(src, "tokenizer.json"), "{}")
    writeFileSync(join(src, "generation_config.json"), JSON.stringify({ eos_token_id: [2, 3] }))
    const original = readFileSync(join(src, "model.safetensors"))
    const before = await load(src)
    await runEngine(
      Effect.gen(function* () {
        const { model } = yield* loadCheckpoint(src)
        yield* saveCheckpoint(out, model, undefined, { maxShardBytes: 20_000 })
        yield* saveCheckpoint(f16, model, undefined, { dtype: "F16" })
      })
    )
    const files = readdirSync(out).sort()
    expect(files).toContain("model.safetensors.index.json")
    expect(files).toContain("tokenizer.json")
    expect(files).toContain("generation_config.json")
    const shards = files.filter((f) => /^model-\d{5}-of-\d{5}\.safetensors$/.test(f))
    expect(shards.length).toBeGreaterThan(2)
    expect(files).not.toContain("model.safetensors")
    // every tensor's bytes are the independent writer's bytes
    const index = JSON.parse(readFileSync(join(out, "model.safetensors.index.json"), "utf8"))
    const origEntries = parseHeader(original.subarray(8, 8 + headerLength(original)), original.length)
    for (const e of origEntries) {
      const shard = readFileSync(join(out, index.weight_map[e.name]))
      const entry = parseHeader(shard.subarray(8, 8 + headerLength(shard)), shard.length).find((x) => x.name === e.name)!
      expect(entry.dtype, e.name).toBe("BF16")
      expect(shard.subarray(entry.begin, entry.end).equals(original.subarray(e.begin, e.end)), e.name).toBe(true)
    }
    const json = JSON.parse(readFileSync(join(out, "config.json"), "utf8"))
    expect(json).toMatchObject({ torch_dtype: "bfloat16", custom_field: "kept", eos_token_id: [2, 3], architectures: ["LlamaForCausalLM"] })
    const after = await load(out)
    expect(Buffer.from(after.weights.buffer).equals(Buffer.from(before.weights.buffer))).toBe(true)
    // --dtype F16: one file, F16, the F16 rounding of the same values
    expect(readdirSync(f16)).toContain("model.safetensors")
    expect(JSON.parse(readFileSync(join(f16, "config.json"), "utf8")).torch_dtype).toBe("float16")
    const asF16 = await load(f16)
    expect(maxDiff(asF16.weights, before.weights)).toBeLessThan(1e-3)
    // saving again over a sharded directory with one file leaves no stale shards
    await runEngine(Effect.gen(function* () { yield* saveCheckpoint(out, (yield* loadCheckpoint(f16)).model) }))
    expect(readdirSync(out).filter((f) => f.startsWith("model"))).toEqual(["model.safetensors"])
  })

  it("rope_scaling llama3 matches transformers' formula; linear is scaled positions", async () => {
    const llama3 = { rope_type: "llama3", factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 32 } as const
    const c = parseConfigJson(configJson({ ...config, hidden_size: 128, num_attention_heads: 2, num_key_value_heads: 1 }, { rope_scaling: llama3, rope_theta: 500000 }))
    expect(c.rope_scaling).toEqual(llama3)
    const ours = await runEngine(Effect.gen(function* () { return yield* (yield* Engine).ropeInvFreq(c) }))
    // reference: transformers.modeling_rope_utils._compute_llama3_parameters, in float64
    const dim = 64, lowWave = 32 / 1, highWave = 32 / 4
    const reference = Array.from({ length: dim / 2 }, (_, j) => {
      const f = 1 / 500000 ** ((2 * j) / dim)
      const wavelen = (2 * Math.PI) / f
      if (wavelen > lowWave) return f / 8
      if (wavelen < highWave) return f
      const smooth = (32 / wavelen - 1) / (4 - 1)
      return (1 - smooth) * (f / 8) + smooth * f
    })
    const bands = { low: 0, medium: 0, high: 0 }
    reference.forEach((r, j) => {
      expect(Math.abs(ours[j]! - r) / r, `inv_freq[${j}]`).toBeLessThan(1e-5)
      const w = (2 * Math.PI) / (1 / 500000 ** ((2 * j) / dim))
      bands[w > lowWave ? "low" : w < highWave ? "high" : "medium"]++
    })
    expect(Math.min(bands.low, bands.medium, bands.high)).toBeGreaterThan(0) // every branch of the formula is exercised
    // linear factor 2 at positions 2p rotates as no scaling at positions p (angles bit-identical)
    const tensors = await randomTensors(config, 5)
    const root = tempDir()
    writeDir(join(root, "plain"), config, [{ file: "model.safetensors", dtype: "F32", tensors }])
    writeDir(join(root, "linear"), config, [{ file: "model.safetensors", dtype: "F32", tensors }], { rope_scaling: { type: "linear", factor: 2 } })
    const scoreAt = (dir: string, stride: number) =>
      runEngine(
        Effect.gen(function* () {
          const { model } = yield* loadCheckpoint(dir)
          const trainer = yield* model.trainer({ maxTokens: tokens.length })
          const batch = packed(tokens, chain(tokens.length))
          const positions = batch.positions.map((p) => p * stride)
          return (yield* trainer.train({ ...batch, positions }, { kind: "sft" }, { backward: false })).tokenLogprobs
        })
      )
    const [plain, linear, linearUnit] = [await scoreAt(join(root, "plain"), 1), await scoreAt(join(root, "linear"), 2), await scoreAt(join(root, "linear"), 1)]
    expect(Array.from(linear)).toEqual(Array.from(plain))
    expect(maxDiff(linearUnit, plain)).toBeGreaterThan(1e-4)
  })

  it("a bad config field, a missing tensor and a wrong dtype each fail with one line naming it", async () => {
    const tensors = await randomTensors(config, 6)
    const root = tempDir()
    const good = join(root, "good")
    writeDir(good, config, [{ file: "model.safetensors", dtype: "BF16", tensors }])
    const variant = (name: string, edit: (dir: string) => void) => {
      const dir = join(root, name)
      writeDir(dir, config, [{ file: "model.safetensors", dtype: "BF16", tensors }])
      edit(dir)
      return dir
    }
    const withConfig = (extra: Record<string, unknown>) => (dir: string) => writeFileSync(join(dir, "config.json"), JSON.stringify(configJson(config, extra)))
    const cases: Array<[string, string, RegExp]> = [
      ["dynamic", variant("dynamic", withConfig({ rope_scaling: { rope_type: "dynamic", factor: 4 } })), /config\.json: rope_scaling\.rope_type 'dynamic' is not supported/],
      ["llama3 field", variant("llama3", withConfig({ rope_scaling: { rope_type: "llama3", factor: 8 } })), /config\.json: rope_scaling \(llama3\).*low_freq_factor/],
      ["bias", variant("bias", withConfig({ attention_bias: true })), /config\.json: attention_bias true is not supported/],
      ["window", variant("window", withConfig({ sliding_window: 4096 })), /config\.json: sliding_window is not supported/],
      ["activation", variant("act", withConfig({ hidden_act: "gelu" })), /config\.json: hidden_act 'gelu' is not 'silu'/],
      ["field type", variant("type", withConfig({ hidden_size: "32" })), /config\.json: .*hidden_size/],
      ["odd head_dim", variant("odd", withConfig({ head_dim: 15 })), /config: head_dim 15 must be even/],
      ["missing", variant("missing", (dir) => writeSafetensors(dir, [{ file: "model.safetensors", dtype: "BF16", tensors: tensors.filter((t) => t.name !== "model.layers.1.mlp.up_proj.weight") }])), /missing tensor 'model\.layers\.1\.mlp\.up_proj\.weight'/],
      ["dtype", variant("dtype", (dir) => {
        const bytes = readFileSync(join(dir, "model.safetensors"))
        const n = headerLength(bytes)
        const header = bytes.subarray(8, 8 + n).toString("utf8").replace('"model.norm.weight": {"dtype": "BF16"', '"model.norm.weight": {"dtype": "I16"')
        writeFileSync(join(dir, "model.safetensors"), Buffer.concat([bytes.subarray(0, 8), Buffer.from(header.padEnd(n)), bytes.subarray(8 + n)]))
      }), /tensor 'model\.norm\.weight' has dtype I16; expected F32, F16 or BF16/],
      ["unexpected", variant("extra", (dir) => writeSafetensors(dir, [{ file: "model.safetensors", dtype: "BF16", tensors: [...tensors, { name: "model.layers.0.self_attn.q_proj.bias", shape: [32], values: new Float32Array(32) }] }])), /unexpected tensor 'model\.layers\.0\.self_attn\.q_proj\.bias'/],
      ["index", variant("index", (dir) => {
        copyFileSync(join(dir, "model.safetensors"), join(dir, "model-00001-of-00001.safetensors"))
        writeFileSync(join(dir, "model.safetensors.index.json"), JSON.stringify({ weight_map: { "model.norm.weight": "model-00001-of-00001.safetensors" } }))
      }), /not listed for this file/]
    ]
    for (const [name, dir, message] of cases) {
      const error = await runEngine(Effect.flip(loadCheckpoint(dir)))
      expect(error, name).toBeInstanceOf(CheckpointError)
      expect(error.message, name).toMatch(message)
      expect(error.message, name).not.toContain("\n")
    }
    expect((await runEngine(readConfig(good))).config).toEqual(config)
  })

  it("head_dim x heads != hidden_size: read with HF's meaning, loads, saves, reloads; a misshapen q_proj is named", async () => {
    const wide: LlamaConfig = { ...config, head_dim: 16 } // 4 heads x 16 = 64, hidden 32
    expect(parseConfigJson(configJson(wide))).toEqual(wide)
    expect(parseConfigJson({ ...configJson(config), head_dim: null })).toEqual(config) // null: hidden / heads, one form
    const tensors = await randomTensors(wide, 7)
    const shapes = Object.fromEntries(tensors.map((t) => [t.name, t.shape]))
    expect(shapes["model.layers.0.self_attn.q_proj.weight"]).toEqual([64, 32])
    expect(shapes["model.layers.0.self_attn.k_proj.weight"]).toEqual([32, 32])
    expect(shapes["model.layers.0.self_attn.o_proj.weight"]).toEqual([32, 64])
    const root = tempDir()
    const src = join(root, "src"), out = join(root, "out"), narrow = join(root, "narrow")
    writeDir(src, wide, [{ file: "model.safetensors", dtype: "F32", tensors }], { torch_dtype: "float32" })
    const loaded = await load(src)
    // the independent writer's values, in layout order, bit for bit
    const written = new Float32Array(tensors.reduce((n, t) => n + t.values.length, 0))
    tensors.reduce((at, t) => (written.set(t.values, at), at + t.values.length), 0)
    expect(Buffer.from(loaded.weights.buffer).equals(Buffer.from(written.buffer))).toBe(true)
    expect(loaded.logprobs.subarray(1).every(Number.isFinite)).toBe(true)
    await runEngine(Effect.gen(function* () { yield* saveCheckpoint(out, (yield* loadCheckpoint(src)).model) }))
    expect(JSON.parse(readFileSync(join(out, "config.json"), "utf8")).head_dim).toBe(16)
    expect((await runEngine(readConfig(out))).config).toEqual(wide)
    const again = await load(out)
    expect(Buffer.from(again.weights.buffer).equals(Buffer.from(loaded.weights.buffer))).toBe(true)
    expect(Array.from(again.logprobs)).toEqual(Array.from(loaded.logprobs))
    // q_proj as hidden_size / heads would shape it ([32, 32]) under head_dim 16
    const misshapen = tensors.map((t) => (t.name === "model.layers.1.self_attn.q_proj.weight" ? { ...t, shape: [32, 32], values: Array.from(t.values).slice(0, 32 * 32) } : t))
    writeDir(narrow, wide, [{ file: "model.safetensors", dtype: "BF16", tensors: misshapen }])
    const error = await runEngine(Effect.flip(loadCheckpoint(narrow)))
    expect(error).toBeInstanceOf(CheckpointError)
    expect(error.message).toMatch(/tensor 'model\.layers\.1\.self_attn\.q_proj\.weight' has shape \[32, 32\]; expected \[64, 32\]/)
    expect(error.message).not.toContain("\n")
  })
})
