/**
 * Prompt length with the model's own tokenizer (`src/openai/prompt.ts`): the bound known
 * before encoding, the exact count part by part, early stops past the limit, and other work
 * running between parts of a long prompt.
 */
import { Effect, Exit } from "effect"
import { describe, expect, it } from "vitest"
import { hfTokenizer, type HfTokens } from "../../src/engine/hf-tokenizer.ts"
import { byteTokenizer } from "../../src/engine/tokenizer.ts"
import { gyreChat } from "../../src/openai/chat.ts"
import { hfChat } from "../../src/openai/hf-chat.ts"
import type { ChatMessage } from "../../src/openai/messages.ts"
import { countPromptTokens, tokensAtLeast } from "../../src/openai/prompt.ts"
import { chatmlToolsTemplate, trainedByteLevelTokenizer } from "../hf/fixtures.ts"

const tokenizer = hfTokenizer(trainedByteLevelTokenizer({ style: "qwen2", added: [{ content: "<|im_start|>" }, { content: "<|im_end|>" }] }), {})
const tokens: HfTokens = { tokenizer, tokenizerConfig: {}, bosToken: "", eosToken: "<|im_end|>", eosIds: tokenizer.encode("<|im_end|>") }
const chat = hfChat(tokens, chatmlToolsTemplate)
const english = "The quick brown fox jumps over the lazy dog. It's here; they'll say we'd won. "
const history = (messages: number, text: (i: number) => string): Array<ChatMessage> =>
  Array.from({ length: messages }, (_, i) => ({ role: i % 2 === 0 ? "user" : "assistant", content: text(i) }))

describe("prompt length with the model's tokenizer", () => {
  it("counts a chat prompt's tokens, not its bytes: a prompt over the limit in bytes fits in tokens", async () => {
    const messages = history(4, () => english.repeat(10))
    const ids = chat.render(messages, [], undefined)
    const bytes = Buffer.byteLength(tokenizer.decode(ids))
    expect(ids.length).toBeLessThan(bytes / 2) // the merges apply
    const limit = Math.floor(bytes * 0.6)
    expect(Array.from(await Effect.runPromise(chat.prompt(messages, [], undefined, limit)))).toEqual(Array.from(ids))
    expect(await Effect.runPromise(countPromptTokens(tokenizer, chat.pieces(messages, [], undefined)))).toBe(ids.length)
    // at the exact length it is too long (the limit is exclusive), one more fits
    const over = await Effect.runPromiseExit(chat.prompt(messages, [], undefined, ids.length))
    expect(Exit.isFailure(over) && JSON.stringify(over.cause)).toContain("PromptTooLong")
    expect(Exit.isSuccess(await Effect.runPromiseExit(chat.prompt(messages, [], undefined, ids.length + 1)))).toBe(true)
  })

  it("knows a bound before encoding: the longest token's bytes", () => {
    expect(byteTokenizer.maxTokenBytes).toBe(1)
    const longest = Math.max(...Array.from({ length: tokenizer.vocabSize }, (_, id) => tokenizer.tokenBytes(id).length), "<|im_start|>".length)
    expect(tokenizer.maxTokenBytes).toBeGreaterThanOrEqual(longest)
    for (const text of [english, "   xyzzy unreachable", "\u00e9\u00e8 \u4e2d\u6587 12345", "<|im_start|>a<|im_end|>"]) {
      expect(tokensAtLeast(tokenizer, [text])).toBeLessThanOrEqual(tokenizer.encode(text).length)
    }
    // Gyre's byte-level template: the bound is the count
    const messages = history(3, () => "h\u00e9llo")
    expect(tokensAtLeast(byteTokenizer, gyreChat.pieces(messages, [], undefined))).toBe(gyreChat.render(messages, [], undefined).length)
  })

  it("refuses a huge prompt from its bound without encoding, and stops encoding a long one at the limit", async () => {
    const huge = history(2, () => "w".repeat(4 * 1024 * 1024))
    const refused = await Effect.runPromise(Effect.flip(chat.prompt(huge, [], undefined, 4096)))
    expect(refused).toMatchObject({ _tag: "PromptTooLong", limit: 4096, atLeast: true })
    expect(refused.tokens).toBeGreaterThanOrEqual(4096)
    // 400 messages of ~20 tokens, a limit between the bound and the count: encoding stops at
    // the first part (a message) that reaches it
    const long = history(400, () => english)
    const bound = tokensAtLeast(tokenizer, chat.pieces(long, [], undefined))
    const count = chat.render(long, [], undefined).length
    const limit = Math.floor((bound + count) / 2)
    expect(bound).toBeLessThan(limit)
    const stopped = await Effect.runPromise(Effect.flip(chat.prompt(long, [], undefined, limit)))
    expect(stopped.atLeast).toBe(true)
    expect(stopped.tokens).toBeGreaterThanOrEqual(limit)
    expect(stopped.tokens).toBeLessThan(limit + 40)
  })

  it("lets other work run between the parts of a long prompt", async () => {
    const messages = history(3000, (i) => `${english.repeat(3)} ${i}`) // distinct sections: each encoded, none from the cache
    let ticks = 0
    let running = true
    const tick = () => {
      ticks++
      if (running) setImmediate(tick)
    }
    setImmediate(tick)
    const before = ticks
    const ids = await Effect.runPromise(chat.prompt(messages, [], undefined, undefined))
    running = false
    expect(ids.length).toBe(chat.render(messages, [], undefined).length)
    expect(ticks - before).toBeGreaterThan(2)
  })
})
