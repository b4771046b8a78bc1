/**
 * Qwen2.5's and Qwen3's own chat templates (qwen-fixtures.ts) through the gateway's chat format
 * (`readHfChat` of a generated Qwen directory: its tokenizer.json and tokenizer_config.json):
 * the default system turn, tools in the system turn, `<tool_call>` blocks, consecutive tool
 * results in one user turn, Qwen3's `<think>` blocks (dropped before the last user query, kept
 * in the tool loop after it). Each render is the text written out here, the same text
 * @huggingface/jinja renders from the template directly, and its ids are the model tokenizer's
 * encoding of that text, with each ChatML and tool-call marker one added token. The tool-call
 * format the gateway picks for them (src/openai/tool-formats.ts, probed from the template) is
 * Hermes JSON, and its parser reads a call written as these models write one.
 */
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Template } from "@huggingface/jinja"
import { describe, expect, it } from "vitest"
import type { ChatFormat } from "../../src/openai/chat.ts"
import { readHfChat } from "../../src/openai/hf-chat.ts"
import type { ChatMessage, ToolDefinition } from "../../src/openai/messages.ts"
import { qwen25Template, qwen3Template, qwenConfig, qwenIds, qwenTokenizer, writeQwenModel } from "./qwen-fixtures.ts"

const tool: ToolDefinition = { type: "function", function: { name: "read_file", description: "Read a file", parameters: { type: "object", properties: { path: { type: "string" } } } } }
const toolJson = '{"type": "function", "function": {"name": "read_file", "description": "Read a file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}'
const call = (id: string, path: string) => ({ id, type: "function" as const, function: { name: "read_file", arguments: JSON.stringify({ path }) } })

const toolsBlock = (intro: string) =>
  `${intro}# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n${toolJson}\n</tools>\n\n` +
  'For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'

const formatOf = async (type: "qwen2" | "qwen3"): Promise<ChatFormat> => {
  const dir = join(mkdtempSync(join(tmpdir(), "gyre-qwen-template-")), type)
  await writeQwenModel(dir, qwenConfig(type, qwenIds(type).vocabSize), { dtype: "F32", sharded: false, seed: 70 })
  return (await readHfChat(dir))!
}

/** The messages as transformers passes them to the template (tool-call arguments as objects). */
const asTemplateInput = (messages: ReadonlyArray<ChatMessage>) =>
  messages.map((m) =>
    m.role === "assistant" && m.tool_calls
      ? { role: "assistant", content: m.content, tool_calls: m.tool_calls.map((c) => ({ ...c, function: { name: c.function.name, arguments: JSON.parse(c.function.arguments) } })) }
      : m
  )

/** Renders through the chat format and checks it against `expected` and the template rendered directly. */
const expectRender = (type: "qwen2" | "qwen3", format: ChatFormat, messages: Array<ChatMessage>, tools: Array<ToolDefinition>, expected: string) => {
  const direct = new Template(type === "qwen3" ? qwen3Template : qwen25Template).render({
    messages: asTemplateInput(messages),
    ...(tools.length > 0 ? { tools } : {}),
    add_generation_prompt: true,
    bos_token: "",
    eos_token: "<|im_end|>"
  })
  expect(direct).toBe(expected)
  const ids = Array.from(format.render(messages, tools, undefined))
  expect(ids).toEqual(format.tokenizer.encode(expected))
  expect(format.tokenizer.decode(ids)).toBe(expected)
  // every marker is its one added token
  const added = qwenTokenizer(type).added_tokens
  for (const t of added) {
    const count = expected.split(t.content).length - 1
    expect(ids.filter((id) => id === t.id).length, t.content).toBe(count)
  }
  return ids
}

/** The chosen tool format reads back a call as the model writes it; a call starts as the template writes one. */
const expectHermes = (format: ChatFormat, callStart: string) => {
  const modelText = '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call>'
  expect(format.toolFormat.name).toBe("hermes")
  const read = format.toolFormat.scan(modelText, true, [tool])
  expect(read.calls.map((c) => [c.name, JSON.parse(c.arguments)])).toEqual([["read_file", { path: "a.txt" }]])
  expect(read.content.trim()).toBe("")
  expect(format.callStart?.("read_file")).toBe(`${callStart}<tool_call>\n{"name": "read_file", "arguments": `)
}

describe("Qwen chat templates with the model's own tokenizer", () => {
  it("Qwen2.5: the default system turn; tools, calls and grouped tool results", async () => {
    const format = await formatOf("qwen2")
    expectRender("qwen2", format, [{ role: "user", content: "hello world" }], [],
      "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n")
    const ids = expectRender("qwen2", format, [
      { role: "system", content: "You are a bot." },
      { role: "user", content: "read a.txt and b.txt" },
      { role: "assistant", content: null, tool_calls: [call("c1", "a.txt"), call("c2", "b.txt")] },
      { role: "tool", tool_call_id: "c1", content: "hello" },
      { role: "tool", tool_call_id: "c2", content: "world" },
      { role: "assistant", content: "hello world" },
      { role: "user", content: "thanks" }
    ], [tool],
      toolsBlock("<|im_start|>system\nYou are a bot.\n\n") +
        "<|im_start|>user\nread a.txt and b.txt<|im_end|>\n" +
        '<|im_start|>assistant\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call>\n<tool_call>\n{"name": "read_file", "arguments": {"path": "b.txt"}}\n</tool_call><|im_end|>\n' +
        "<|im_start|>user\n<tool_response>\nhello\n</tool_response>\n<tool_response>\nworld\n</tool_response><|im_end|>\n" +
        "<|im_start|>assistant\nhello world<|im_end|>\n<|im_start|>user\nthanks<|im_end|>\n<|im_start|>assistant\n")
    expect(ids[0]).toBe(qwenIds("qwen2").imStart)
    expectHermes(format, "")
    // tools without a system message: Qwen's default one leads the tools block
    expectRender("qwen2", format, [{ role: "user", content: "hi" }], [tool],
      toolsBlock("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n") + "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
  })

  it("Qwen3: reasoning dropped before the last user query, kept in the tool loop after it; tools after the system prompt", async () => {
    const format = await formatOf("qwen3")
    expectRender("qwen3", format, [
      { role: "user", content: "hello" },
      { role: "assistant", content: "<think>\nI should greet.\n</think>\n\nhello world" },
      { role: "user", content: "to" }
    ], [], "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\nhello world<|im_end|>\n<|im_start|>user\nto<|im_end|>\n<|im_start|>assistant\n")
    expectRender("qwen3", format, [
      { role: "system", content: "Use tools." },
      { role: "user", content: "read a.txt" },
      { role: "assistant", content: "<think>\nI need the file.\n</think>\n\n", tool_calls: [call("c1", "a.txt")] },
      { role: "tool", tool_call_id: "c1", content: "hello" }
    ], [tool],
      toolsBlock("<|im_start|>system\nUse tools.\n\n") +
        "<|im_start|>user\nread a.txt<|im_end|>\n" +
        '<|im_start|>assistant\n<think>\nI need the file.\n</think>\n\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call><|im_end|>\n' +
        "<|im_start|>user\n<tool_response>\nhello\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    expectHermes(format, "<think>\n\n</think>\n\n") // the template writes an empty think block before a call after the query
    // no system message and no tools: no system turn at all
    expectRender("qwen3", format, [{ role: "user", content: "hi" }], [], "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
  })
})
