/** `gyre engine init | score | sft-step | generate` end to end on the tiny preset. */
import { execFileSync } from "node:child_process"
import { existsSync, mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { describe, expect, it } from "vitest"
import { presets } from "../../src/engine/presets.ts"

const gyre = new URL("../../bin/gyre.js", import.meta.url).pathname
const run = (...args: Array<string>) => execFileSync("node", [gyre, "engine", ...args], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] })
const json = (...args: Array<string>) => JSON.parse(run(...args))

describe("gyre engine", () => {
  it("inits, scores, takes SFT steps and generates", () => {
    const dir = mkdtempSync(join(tmpdir(), "gyre-cli-"))
    const init = json("init", "--preset", "tiny", "--seed", "5", "--out", join(dir, "a"))
    expect(init.params).toBeGreaterThan(300_000)
    const tokens = [72, 101, 108, 108, 111, 33]
    const score = json("score", "--checkpoint", join(dir, "a"), "--tokens", tokens.join(","))
    expect(score.token_logprobs).toHaveLength(tokens.length - 1)
    expect(score.last_logprobs).toHaveLength(presets.tiny.vocab_size)
    expect(score.last_logprobs.reduce((s: number, lp: number) => s + Math.exp(lp), 0)).toBeCloseTo(1, 5)
    const first = json("sft-step", "--checkpoint", join(dir, "a"), "--tokens", tokens.join(","), "--lr", "0.01", "--out", join(dir, "b"))
    const second = json("sft-step", "--checkpoint", join(dir, "b"), "--tokens", tokens.join(","), "--lr", "0.01", "--out", join(dir, "c"))
    expect(first.step).toBe(1)
    expect(second.step).toBe(2) // continued the saved optimizer state
    expect(second.loss).toBeLessThan(first.loss)
    expect(existsSync(join(dir, "c", "optimizer.safetensors"))).toBe(true)
    const mean = -score.token_logprobs.reduce((a: number, b: number) => a + b, 0) / score.token_logprobs.length
    expect(first.loss).toBeCloseTo(mean, 4)
    const text = run("generate", "--checkpoint", join(dir, "c"), "--prompt", "Hello", "--max-tokens", "8", "--seed", "1")
    expect(text.endsWith("\n")).toBe(true)
  })

  it("rejects a bad flag with a usage error (exit 2)", () => {
    for (const args of [["score", "--checkpoint", "x", "--tokens", "1,a"]]) {
      try {
        run(...args)
        expect.unreachable()
      } catch (e) {
        expect((e as { status: number }).status).toBe(2)
      }
    }
  })
})
