/**
 * head_dim != hidden_size / num_attention_heads, as Hugging Face's LlamaConfig allows (q_proj
 * [H*hd, D], k/v_proj [KV*hd, D], o_proj [D, H*hd]), end to end on a small random model
 * (D 48, 4 query heads of 16 over 2 kv heads: H*hd = 64): the layout's shapes; log-probs,
 * logits and every tensor's gradient against PyTorch autograd (bench/llama_torch.py sft on the saved
 * checkpoint); KV-cached decode against the full forward; the hand-off buffer (its head_dim,
 * its size, a bit-exact continuation, refusal by a cache whose head_dim differs).
 * The PyTorch comparison needs Debian's python3-torch for /usr/bin/python3; without it that
 * test is reported as skipped, never as passed.
 */
import { spawnSync } from "node:child_process"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { saveCheckpoint } from "../../src/engine/checkpoint.ts"
import { type LlamaConfig, kvBytesPerToken } from "../../src/engine/config.ts"
import { Engine } from "../../src/engine/engine.ts"
import { EngineError } from "../../src/engine/native.ts"
import { chain, decodeEach, maxAbsDiff, micro, packed, relativeError, rng, runEngine } from "./helpers.ts"

const python = "/usr/bin/python3"
const torchMissing = spawnSync(python, ["-c", "import torch"], { stdio: "ignore" }).status !== 0
const skipReason = torchMissing ? " (skipped: /usr/bin/python3 cannot import torch; apt-get install python3-torch)" : ""
const peer = new URL("../../bench/llama_torch.py", import.meta.url).pathname

const config: LlamaConfig = { ...micro(false), vocab_size: 80, hidden_size: 48, intermediate_size: 72, max_position_embeddings: 128, head_dim: 16 }
const V = config.vocab_size
const next = rng(21)
const tokens = Array.from({ length: 37 }, () => Math.floor(next() * V))

const createModel = (c: LlamaConfig) => Effect.flatMap(Engine, (engine) => engine.createModel(c, { seed: 5, initStd: 0.1 }))

describe("head_dim != hidden_size / num_attention_heads", () => {
  it("the layout has Hugging Face's shapes and RoPE covers head_dim", async () => {
    const { layout, invFreq } = await runEngine(
      Effect.gen(function* () {
        const engine = yield* Engine
        return { layout: yield* engine.layout(config), invFreq: yield* engine.ropeInvFreq(config) }
      })
    )
    const shape = (name: string) => layout.find((t) => t.name === name)?.shape
    expect(shape("model.layers.1.self_attn.q_proj.weight")).toEqual([64, 48])
    expect(shape("model.layers.1.self_attn.k_proj.weight")).toEqual([32, 48])
    expect(shape("model.layers.1.self_attn.v_proj.weight")).toEqual([32, 48])
    expect(shape("model.layers.1.self_attn.o_proj.weight")).toEqual([48, 64])
    expect(invFreq.length).toBe(8)
    invFreq.forEach((f, j) => expect(Math.abs(f - 1 / 10000 ** ((2 * j) / 16)) / f).toBeLessThan(1e-6))
  })

  it.skipIf(torchMissing)(`log-probs, logits and every tensor's gradient match PyTorch autograd${skipReason}`, async () => {
    const dir = mkdtempSync(join(tmpdir(), "gyre-headdim-"))
    const ours = await runEngine(
      Effect.gen(function* () {
        const engine = yield* Engine
        const model = yield* createModel(config)
        yield* saveCheckpoint(dir, model)
        const trainer = yield* model.trainer({ maxTokens: tokens.length })
        yield* trainer.zeroGrads()
        const { tokenLogprobs } = yield* trainer.train(packed(tokens, chain(tokens.length)), { kind: "sft" })
        const cache = yield* model.cache({ blockTokens: 16, numBlocks: 4 })
        const logits = (yield* cache.forward([{ seq: yield* cache.create(), tokens }], "all")).logits!
        return { tokenLogprobs, logits, grads: yield* trainer.getGrads(), layout: yield* engine.layout(config) }
      })
    )
    const run = spawnSync(python, [peer, "sft", "--checkpoint", dir, "--tokens", tokens.join(",")], { encoding: "utf8", maxBuffer: 1 << 28 })
    expect(run.status, run.stderr).toBe(0)
    const theirs: { logits: Array<Array<number>>; logprobs: Array<number>; grads: Record<string, Array<number>> } = JSON.parse(run.stdout)
    expect(theirs.logprobs.length).toBe(tokens.length - 1)
    expect(maxAbsDiff(ours.tokenLogprobs.subarray(1), theirs.logprobs)).toBeLessThan(1e-4)
    expect(maxAbsDiff(ours.logits, theirs.logits.flat())).toBeLessThan(1e-4)
    expect(maxAbsDiff(theirs.logits.flat(), new Float32Array(tokens.length * V))).toBeGreaterThan(0.5) // far from zero
    expect(Object.keys(theirs.grads).sort()).toEqual(ours.layout.map((t) => t.name).sort())
    for (const t of ours.layout) {
      const size = t.shape.reduce((a, b) => a * b, 1)
      const mine = ours.grads.subarray(t.offset, t.offset + size)
      expect(theirs.grads[t.name]!.length, t.name).toBe(size)
      expect(maxAbsDiff(theirs.grads[t.name]!, new Float32Array(size)), `${t.name} has a gradient`).toBeGreaterThan(1e-4)
      expect(relativeError(mine, theirs.grads[t.name]!), t.name).toBeLessThan(1e-4)
    }
  })

  it("KV-cached decode equals the full forward; the hand-off carries head_dim and continues bit for bit", async () => {
    const { head_dim: _, ...sameDims } = config // head_dim 12 = 48 / 4: same layers and kv heads, other head_dim
    const out = await runEngine(
      Effect.gen(function* () {
        const model = yield* createModel(config)
        const cache = yield* model.cache({ blockTokens: 8, numBlocks: 32 })
        const a = yield* cache.create()
        const full = (yield* cache.forward([{ seq: a, tokens }], "all")).logits!
        const b = yield* cache.create()
        yield* cache.forward([{ seq: b, tokens: tokens.slice(0, 20) }], "none")
        const steps = yield* decodeEach(cache, b, tokens.slice(20))
        const buffer = yield* cache.export(b)
        const dest = yield* model.cache({ blockTokens: 16, numBlocks: 8 })
        const moved = yield* dest.import(buffer)
        const continued = yield* decodeEach(dest, moved, [3, 4, 5])
        const uninterrupted = yield* decodeEach(cache, b, [3, 4, 5])
        const other = yield* (yield* createModel(sameDims)).cache({ blockTokens: 16, numBlocks: 8 })
        const refused = yield* Effect.flip(other.import(buffer))
        return { full, steps, buffer, continued, uninterrupted, refused, stats: yield* cache.stats() }
      })
    )
    let worst = 0
    out.steps.forEach((row, k) => (worst = Math.max(worst, maxAbsDiff(row, out.full.subarray((20 + k) * V, (21 + k) * V)))))
    expect(worst).toBeLessThan(1e-4)
    expect(maxAbsDiff(out.full, new Float32Array(out.full.length))).toBeGreaterThan(0.05)
    // 2 x layers x kv_heads x head_dim x 4 bytes: 2 x 2 x 2 x 16 x 4 (not 12, hidden / heads)
    expect(kvBytesPerToken(config)).toBe(512)
    expect(out.stats.bytesPerToken).toBe(512)
    const header = new DataView(out.buffer.buffer, out.buffer.byteOffset)
    expect([header.getUint32(8, true), header.getUint32(12, true), header.getUint32(16, true)]).toEqual([2, 2, 16])
    expect(out.buffer.length).toBe(48 + tokens.length * 512)
    out.continued.forEach((row, i) => expect(Buffer.from(row.buffer).equals(Buffer.from(out.uninterrupted[i]!.buffer))).toBe(true))
    expect(out.refused).toBeInstanceOf(EngineError)
    expect((out.refused as EngineError).code).toBe("GYRE_ERR_BAD_HANDOFF")
    expect(out.refused.message).toContain("head_dim=16")
  })
})
