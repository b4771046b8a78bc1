/**
 * The gateway's context check counts tokens with the model's own tokenizer: against a Hugging
 * Face model directory (byte-level BPE with merges, ChatML template) served by a real rollout
 * worker, a chat whose text is longer than the context in bytes but not in tokens is answered,
 * one over it in tokens is a 400 `context_length_exceeded` naming its token count.
 */
import { Effect } from "effect"
import OpenAI from "openai"
import { describe, expect, it } from "vitest"
import { chatFormatOf } from "../../src/openai/hf-chat.ts"
import { withSystem } from "../runtime/harness.ts"
import { KEY, serve, tempDir } from "../rollout/fixtures.ts"
import { writeSmolModel } from "../hf/fixtures.ts"

const dir = await writeSmolModel(tempDir("gyre-gw-context-"))
const chat = await chatFormatOf(dir)
const LIMIT = 512

describe("the context check with the model's tokenizer", () => {
  it("answers a chat longer than the context in bytes but not in tokens, and refuses one over it in tokens", async () => {
    const fits = "hello world ".repeat(100) // 1,200 bytes, ~300 tokens
    const over = "hello world ".repeat(400)
    const tokensOf = (content: string) => chat.render([{ role: "user", content }], [], undefined).length
    expect(Buffer.byteLength(fits)).toBeGreaterThan(LIMIT)
    expect(tokensOf(fits)).toBeLessThan(LIMIT)
    expect(tokensOf(over)).toBeGreaterThan(LIMIT)
    const out = await withSystem(
      "gw-context-tokens",
      Effect.gen(function* () {
        const { baseUrl } = yield* serve({ checkpoint: dir, workers: 1, worker: { maxContext: LIMIT }, gateway: { chat, maxContextTokens: LIMIT, model: "smol" } })
        const client = new OpenAI({ baseURL: baseUrl, apiKey: KEY, maxRetries: 0 })
        const ask = (content: string) => client.chat.completions.create({ model: "smol", messages: [{ role: "user", content }], max_tokens: 4 })
        const answered = yield* Effect.promise(() => ask(fits))
        const refused = yield* Effect.promise(() => ask(over).then(() => undefined, (e: unknown) => e as InstanceType<typeof OpenAI.APIError>))
        return { answered, refused }
      })
    )
    expect(out.answered.usage!.prompt_tokens).toBe(tokensOf(fits))
    expect(out.refused?.status).toBe(400)
    expect(out.refused?.code).toBe("context_length_exceeded")
    expect(out.refused?.message).toContain(`maximum context length is ${LIMIT} tokens`)
  }, 60_000)
})
