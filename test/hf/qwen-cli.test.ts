/**
 * `gyre engine generate | score | sft-step | convert` on Qwen model directories (Qwen3 BF16 in
 * two shards, Qwen2 F32 tied): the commands run the architecture, and what they write is a
 * Qwen directory again (architecture, tokenizer files, the trained biases and q/k norms).
 */
import { execFileSync } from "node:child_process"
import { mkdtempSync, readFileSync, readdirSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { describe, expect, it } from "vitest"
import { headerLength, parseHeader } from "../../src/engine/safetensors.ts"
import { qwenConfig, qwenIds, writeQwenModel } from "./qwen-fixtures.ts"

const gyre = new URL("../../bin/gyre.js", import.meta.url).pathname
const run = (...args: Array<string>) => execFileSync("node", [gyre, "engine", ...args], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] })

/** Every tensor of a single-file checkpoint as F32 values, by name. */
const tensorsOf = (file: string) => {
  const bytes = readFileSync(file)
  const entries = parseHeader(bytes.subarray(8, 8 + headerLength(bytes)), bytes.length)
  return new Map(entries.map((e) => [e.name, new Float32Array(bytes.buffer.slice(bytes.byteOffset + e.begin, bytes.byteOffset + e.end))]))
}

describe("gyre engine on Qwen model directories", () => {
  it("generates, converts, scores the same after a lossless convert, and trains a step of every tensor", async () => {
    const root = mkdtempSync(join(tmpdir(), "gyre-qwen-cli-"))
    const src = join(root, "qwen3")
    await writeQwenModel(src, qwenConfig("qwen3", qwenIds("qwen3").vocabSize), { dtype: "BF16", sharded: true, seed: 60 })
    expect(run("generate", "--checkpoint", src, "--prompt", "hello", "--max-tokens", "6", "--seed", "2").endsWith("\n")).toBe(true)
    const f32 = join(root, "f32")
    expect(JSON.parse(run("convert", "--checkpoint", src, "--out", f32, "--dtype", "F32")).dtype).toBe("F32")
    expect(JSON.parse(readFileSync(join(f32, "config.json"), "utf8"))).toMatchObject({ architectures: ["Qwen3ForCausalLM"], model_type: "qwen3", torch_dtype: "float32" })
    expect(readdirSync(f32)).toEqual(expect.arrayContaining(["tokenizer.json", "tokenizer_config.json", "generation_config.json", "model.safetensors"]))
    const tokens = "1,2,3,104,101,108,300"
    const scored = run("score", "--checkpoint", src, "--tokens", tokens)
    expect(JSON.parse(scored).token_logprobs.every(Number.isFinite)).toBe(true)
    expect(run("score", "--checkpoint", f32, "--tokens", tokens)).toBe(scored) // BF16 -> F32 is exact

    const qwen2 = join(root, "qwen2"), stepped = join(root, "stepped")
    await writeQwenModel(qwen2, qwenConfig("qwen2", qwenIds("qwen2").vocabSize), { dtype: "F32", sharded: false, seed: 61 })
    run("sft-step", "--checkpoint", qwen2, "--tokens", tokens, "--lr", "1e-2", "--out", stepped)
    expect(JSON.parse(readFileSync(join(stepped, "config.json"), "utf8"))).toMatchObject({ architectures: ["Qwen2ForCausalLM"], model_type: "qwen2", tie_word_embeddings: true })
    const [before, after] = [tensorsOf(join(qwen2, "model.safetensors")), tensorsOf(join(stepped, "model.safetensors"))]
    expect([...after.keys()].sort()).toEqual([...before.keys()].sort())
    for (const name of ["model.layers.0.self_attn.q_proj.bias", "model.layers.1.self_attn.v_proj.bias", "model.layers.0.self_attn.k_proj.weight"]) {
      const [a, b] = [before.get(name)!, after.get(name)!]
      expect(a.some((x, i) => x !== b[i]), name).toBe(true)
    }
    expect(readdirSync(stepped)).toContain("optimizer.safetensors")
  }, 180_000)
})
