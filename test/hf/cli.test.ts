/** `gyre engine generate | convert | score` on a Hugging Face model directory; shard-size and dtype flags. */
import { execFileSync } from "node:child_process"
import { mkdtempSync, readFileSync, readdirSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { describe, expect, it } from "vitest"
import { parseShardSize } from "../../src/cli/engine.ts"
import { writeSmolModel } from "./fixtures.ts"

const gyre = new URL("../../bin/gyre.js", import.meta.url).pathname
const run = (...args: Array<string>) => execFileSync("node", [gyre, "engine", ...args], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] })

describe("gyre engine on a Hugging Face directory", () => {
  it("generates with the model's template, converts dtype and shards, scores the same after a lossless convert", async () => {
    const root = mkdtempSync(join(tmpdir(), "gyre-hf-cli-"))
    const src = await writeSmolModel(join(root, "src"))
    expect(run("generate", "--checkpoint", src, "--prompt", "hello", "--max-tokens", "6", "--seed", "2").endsWith("\n")).toBe(true)
    const f32 = JSON.parse(run("convert", "--checkpoint", src, "--out", join(root, "f32"), "--dtype", "F32", "--max-shard-size", "100KB"))
    expect(f32.dtype).toBe("F32")
    const files = readdirSync(join(root, "f32"))
    expect(files.filter((f) => /^model-\d{5}-of-\d{5}\.safetensors$/.test(f)).length).toBeGreaterThan(1)
    expect(files).toEqual(expect.arrayContaining(["tokenizer.json", "tokenizer_config.json", "generation_config.json", "model.safetensors.index.json"]))
    expect(JSON.parse(readFileSync(join(root, "f32", "config.json"), "utf8")).torch_dtype).toBe("float32")
    const tokens = "1,2,3,104,101,108"
    // BF16 -> F32 is exact, so both score the same
    expect(run("score", "--checkpoint", join(root, "f32"), "--tokens", tokens)).toBe(run("score", "--checkpoint", src, "--tokens", tokens))
  }, 120_000)

  it("reads HF max_shard_size spellings and refuses others", () => {
    expect(parseShardSize("5GB")).toBe(5e9)
    expect(parseShardSize("500MB")).toBe(5e8)
    expect(parseShardSize("2GiB")).toBe(2 * 1024 ** 3)
    expect(parseShardSize("123")).toBe(123)
    for (const bad of ["", "5XB", "-1GB", "0"]) expect(() => parseShardSize(bad), bad).toThrow(/--max-shard-size/)
  })
})
