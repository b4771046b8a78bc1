/**
 * A checkpoint's own chat template (Jinja, rendered with @huggingface/jinja): exact renders of
 * system, multi-turn, tool and generation-prompt chats, and token-exact assistant turns (a
 * turn the gateway produced renders as the ids the model generated, an edited one as text).
 */
import { describe, expect, it } from "vitest"
import { hfTokenizer, type HfTokens } from "../../src/engine/hf-tokenizer.ts"
import { AssistantTurns } from "../../src/openai/turns.ts"
import { hfChat } from "../../src/openai/hf-chat.ts"
import type { ChatMessage } from "../../src/openai/messages.ts"
import { byteFallbackTokenizer, byteLevelTokenizer, chatmlToolsTemplate, llama2Template, smollm2Template } from "./fixtures.ts"

const chatml = (template = smollm2Template) => {
  const f = byteLevelTokenizer()
  const tokens: HfTokens = { tokenizer: hfTokenizer(f.json, {}), tokenizerConfig: {}, bosToken: "", eosToken: "<|im_end|>", eosIds: [f.ids.im_end] }
  return { f, tokens, chat: hfChat(tokens, template) }
}

const tool = { type: "function" as const, function: { name: "read_file", description: "Read a file", parameters: { type: "object", properties: { path: { type: "string" } } } } }

describe("chat templates", () => {
  it("renders system, multi-turn and the generation prompt exactly (ChatML)", () => {
    const { tokens, chat } = chatml()
    const messages: Array<ChatMessage> = [
      { role: "system", content: "Be brief." },
      { role: "user", content: "hello" },
      { role: "assistant", content: "hello world" },
      { role: "user", content: [{ type: "text", text: "to " }, { type: "text", text: "world" }] }
    ]
    const text =
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\nhello world<|im_end|>\n<|im_start|>user\nto world<|im_end|>\n<|im_start|>assistant\n"
    const ids = chat.render(messages, [], undefined)
    expect(tokens.tokenizer.decode(ids)).toBe(text)
    expect(Array.from(ids)).toEqual(tokens.tokenizer.encode(text))
    // no system message: the template's default one
    expect(tokens.tokenizer.decode(chat.render([{ role: "user", content: "hello" }], [], undefined))).toBe(
      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    )
    expect(chat.stopIds).toEqual([tokens.eosIds[0]])
  })

  it("renders tools, tool calls (arguments as objects) and tool results exactly", () => {
    const { tokens, chat } = chatml(chatmlToolsTemplate)
    const messages: Array<ChatMessage> = [
      { role: "developer", content: "Use tools." },
      { role: "user", content: "read a.txt" },
      { role: "assistant", content: null, tool_calls: [{ id: "c1", type: "function", function: { name: "read_file", arguments: '{"path": "a.txt"}' } }] },
      { role: "tool", tool_call_id: "c1", content: "hello" }
    ]
    const text = tokens.tokenizer.decode(chat.render(messages, [tool], undefined))
    expect(text).toBe(
      "<|im_start|>system\nUse tools.\n\n# Tools\n\n<tools>\n" +
        // tojson as Python's json.dumps writes it
        '{"type": "function", "function": {"name": "read_file", "description": "Read a file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}' +
        '\n</tools>\n\nCall a function as <tool_call>\n{"name": <name>, "arguments": <args>}\n</tool_call><|im_end|>\n' +
        '<|im_start|>user\nread a.txt<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call><|im_end|>\n' +
        "<|im_start|>user\n<tool_response>\nhello\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    // without tools the same template has no tools block
    expect(tokens.tokenizer.decode(chat.render([{ role: "user", content: "hello" }], [], undefined))).toBe("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
  })

  it("uses the generated ids of a turn it produced, and text for an edited one", () => {
    const { f, tokens, chat } = chatml()
    const turns = new AssistantTurns()
    const prompt1 = chat.render([{ role: "user", content: "hello" }], [], turns)
    // the model generated "hello" as single bytes (not the merged token) and then <|im_end|>
    const generated = Int32Array.from([...Buffer.from("hello")].map((b) => b).concat([f.ids.im_end]))
    turns.remember(generated, [], "hello")
    const history: Array<ChatMessage> = [{ role: "user", content: "hello" }, { role: "assistant", content: "hello" }, { role: "user", content: "to" }]
    const prompt2 = chat.render(history, [], turns)
    expect(Array.from(prompt2.subarray(0, prompt1.length + generated.length))).toEqual([...prompt1, ...generated])
    expect(tokens.tokenizer.decode(prompt2)).toBe(tokens.tokenizer.decode(chat.render(history, [], undefined)))
    // re-encoding the text would give the merged token instead
    expect(Array.from(chat.render(history, [], undefined).subarray(prompt1.length, prompt1.length + 1))).toEqual([f.ids.hello])
    const edited = chat.render([{ role: "user", content: "hello" }, { role: "assistant", content: "hello!" }, { role: "user", content: "to" }], [], turns)
    expect(Array.from(edited.subarray(prompt1.length, prompt1.length + 2))).toEqual([f.ids.hello, "!".charCodeAt(0)])
  })

  it("Llama 2's template over the byte-fallback tokenizer: bos and eos tokens as text", () => {
    const f = byteFallbackTokenizer()
    const tokens: HfTokens = { tokenizer: hfTokenizer(f.json, {}), tokenizerConfig: {}, bosToken: "<s>", eosToken: "</s>", eosIds: [f.ids.eos] }
    const chat = hfChat(tokens, llama2Template)
    const ids = chat.render([{ role: "user", content: "hello" }, { role: "assistant", content: "world" }, { role: "user", content: "hello" }], [], undefined)
    // as Llama 2's legacy sentencepiece: each text piece after a special token starts with ▁
    expect(tokens.tokenizer.decode(ids)).toBe("<s> [INST] hello [/INST] world </s><s> [INST] hello [/INST]")
    expect(ids[0]).toBe(f.ids.bos)
    expect(Array.from(ids).filter((id) => id === f.ids.eos)).toHaveLength(1)
    expect(chat.bos).toBe(f.ids.bos)
  })
})
