/**
 * Tool-call formats (`src/openai/tool-formats.ts`): each reads back the calls it writes, JSON
 * calls take "arguments" or "parameters", what is not a call stays content, a turn read while
 * it is generated streams (every partial reading a prefix of the final one), and a
 * checkpoint's chat template picks the format whose parser reads the calls it renders.
 */
import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { hfTokenizer, type HfTokens } from "../../src/engine/hf-tokenizer.ts"
import { encode } from "../../src/engine/tokenizer.ts"
import { gyreChat, gyreChatWith } from "../../src/openai/chat.ts"
import { ToolFormatMismatch, hfChat } from "../../src/openai/hf-chat.ts"
import type { ChatMessage, ToolDefinition } from "../../src/openai/messages.ts"
import { TOOL_FORMATS, toolFormats, type CallText, type ToolFormatName } from "../../src/openai/tool-formats.ts"
import { readTurn, type TurnReading } from "../../src/openai/turn-reader.ts"
import { chatmlToolsTemplate, smollm2Template, trainedByteLevelTokenizer } from "../hf/fixtures.ts"
import { qwen25Template, qwen3Template } from "../hf/qwen-fixtures.ts"
import { llama31Template, mistralTemplate, qwen3CoderTemplate } from "./templates.ts"

const tools: Array<ToolDefinition> = [
  { type: "function", function: { name: "read_file", parameters: { type: "object", properties: { path: { type: "string" }, lines: { type: "integer" } } } } },
  { type: "function", function: { name: "write_file", parameters: { type: "object", properties: { path: { type: "string" }, content: { type: "string" }, opts: { type: "object" }, force: { type: "boolean" } } } } }
]

const calls: Array<CallText> = [
  { name: "read_file", arguments: JSON.stringify({ path: "src/a b.ts", lines: 40 }) },
  { name: "write_file", arguments: JSON.stringify({ path: "x.txt", content: 'line 1\n  "quoted" {braces} <tag>\n', opts: { mode: [6, 4, 4] }, force: true }) }
]

const json = (text: string) => JSON.parse(text) as unknown

describe("tool-call formats", () => {
  it("each format reads back the calls it writes, arguments typed as written", () => {
    for (const name of TOOL_FORMATS) {
      const format = toolFormats[name]
      // Llama 3's calls are the whole turn; the others may follow text
      const prose = name === "llama3-json" ? "" : "Let me see.\n"
      const read = format.scan(prose + format.render(calls), true, tools)
      expect(read.calls.map((c) => c.name), name).toEqual(["read_file", "write_file"])
      expect(read.calls.map((c) => json(c.arguments)), name).toEqual(calls.map((c) => json(c.arguments)))
      expect(read.content.trim(), name).toBe(prose.trim())
    }
  })

  it("JSON calls take their arguments from 'arguments' or 'parameters', a JSON string too; none at all is {}", () => {
    const hermes = toolFormats.hermes
    const args = (text: string) => hermes.scan(text, true, tools).calls.map((c) => c.arguments)
    expect(args('<tool_call>{"name": "read_file", "parameters": {"path": "a"}}</tool_call>')).toEqual(['{"path": "a"}'])
    expect(args('<tool_call>{"name": "read_file", "arguments": "{\\"path\\": \\"a\\"}"}</tool_call>')).toEqual(['{"path": "a"}'])
    expect(args('<tool_call>{"arguments": {"path": "a"}, "name": "read_file"}</tool_call>')).toEqual(['{"path": "a"}'])
    expect(args('<tool_call>{"name": "ls"}</tool_call>')).toEqual(["{}"])
    expect(toolFormats["llama3-json"].scan('<|python_tag|>{"name": "read_file", "parameters": {"path": "a"}}; {"name": "ls", "arguments": {}}', true, tools).calls.map((c) => [c.name, c.arguments])).toEqual([
      ["read_file", '{"path": "a"}'],
      ["ls", "{}"]
    ])
    expect(toolFormats.mistral.scan('[TOOL_CALLS]read_file[ARGS]{"path": "a"}', true, tools).calls.map((c) => [c.name, c.arguments])).toEqual([["read_file", '{"path": "a"}']])
  })

  it("what is not a call stays content", () => {
    const cases: Record<ToolFormatName, ReadonlyArray<string>> = {
      hermes: ["<tool_call>not json</tool_call>", '<tool_call>{"nam": "x"}</tool_call> after', "a <tool_call> b"],
      "qwen3-coder": ["<tool_call>\n{not xml}\n</tool_call>", "<tool_call><function>x</function></tool_call>"],
      "llama3-json": ['Use {"name": "read_file"} later', '{"title": "not a call"}', "plain text"],
      mistral: ["[TOOL_CALLS] nope", "[TOOL_CALLS][1, 2]"]
    }
    for (const name of TOOL_FORMATS) {
      for (const text of cases[name]) {
        const read = toolFormats[name].scan(text, true, tools)
        expect([read.calls, read.content], `${name}: ${text}`).toEqual([[], text])
      }
    }
  })

  it("streams: every partial reading is a prefix of the final one, arguments arrive as they are generated", () => {
    const value = fc.string({ unit: "grapheme", maxLength: 24 })
    for (const name of TOOL_FORMATS) {
      const format = toolFormats[name]
      const chat = gyreChatWith(format)
      fc.assert(
        fc.property(value, value, fc.boolean(), fc.boolean(), (path, content, reasoning, prose) => {
          const written: Array<CallText> = [
            { name: "read_file", arguments: JSON.stringify({ path, lines: 7 }) },
            { name: "write_file", arguments: JSON.stringify({ path: "p", content, force: false }) }
          ]
          const text = `${reasoning ? `<think>\nplan: ${path}\n</think>\n\n` : ""}${prose && name !== "llama3-json" ? `${content}\n` : ""}${format.render(written)}`
          const ids = encode(text)
          const options = { tokenizer: chat.tokenizer, stops: [], markers: chat.markers, format, tools, prefix: "", inReasoning: false }
          const final = readTurn(ids, true, options)
          expect(final.calls.map((c) => json(c.arguments))).toEqual(written.map((c) => json(c.arguments)))
          let previous: TurnReading = { reasoning: "", content: "", calls: [] }
          const argumentLengths = new Set<number>()
          for (let n = 0; n <= ids.length; n++) {
            const partial = readTurn(ids.slice(0, n), false, options)
            expect(final.reasoning.startsWith(partial.reasoning)).toBe(true)
            expect(final.content.startsWith(partial.content)).toBe(true)
            expect(partial.reasoning.startsWith(previous.reasoning) && partial.content.startsWith(previous.content)).toBe(true)
            expect(partial.calls.length).toBeGreaterThanOrEqual(previous.calls.length)
            partial.calls.forEach((c, i) => {
              expect(c.name).toBe(final.calls[i]!.name)
              expect(final.calls[i]!.arguments.startsWith(c.arguments)).toBe(true)
            })
            if (partial.calls.length === 2) argumentLengths.add(partial.calls[1]!.arguments.length)
            previous = partial
          }
          // the second call's arguments were read in several steps, not at its end only
          expect(argumentLengths.size).toBeGreaterThan(3)
        }),
        { numRuns: 12 }
      )
    }
  })

  it("Gyre's template starts a forced call the way it writes one", () => {
    expect(gyreChat.callStart!()).toBe('<tool_call>{"name":"')
    expect(gyreChat.callStart!("read_file")).toBe('<tool_call>{"name":"read_file","arguments":')
    expect(gyreChatWith(toolFormats["qwen3-coder"]).callStart!("read_file")).toBe("<tool_call>\n<function=read_file>\n")
    expect(gyreChatWith(toolFormats.mistral).callStart!("f")).toBe('[TOOL_CALLS][{"name": "f", "arguments": ')
  })
})

const specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]
const tokenizer = hfTokenizer(trainedByteLevelTokenizer({ style: "llama3", added: [...specials.map((content) => ({ content })), { content: "<tool_call>", special: false }, { content: "</tool_call>", special: false }] }), {})
const tokens = (eos: string, bos = ""): HfTokens => ({ tokenizer, tokenizerConfig: {}, bosToken: bos, eosToken: eos, eosIds: tokenizer.encode(eos) })

const templates: ReadonlyArray<{ readonly name: string; readonly template: string; readonly tokens: HfTokens; readonly format: ToolFormatName }> = [
  { name: "ChatML with tools", template: chatmlToolsTemplate, tokens: tokens("<|im_end|>"), format: "hermes" },
  { name: "Qwen2.5", template: qwen25Template, tokens: tokens("<|im_end|>"), format: "hermes" },
  { name: "Qwen3", template: qwen3Template, tokens: tokens("<|im_end|>"), format: "hermes" },
  { name: "Qwen3-Coder", template: qwen3CoderTemplate, tokens: tokens("<|im_end|>"), format: "qwen3-coder" },
  { name: "Llama 3.1", template: llama31Template, tokens: tokens("<|eot_id|>", "<|begin_of_text|>"), format: "llama3-json" },
  { name: "Mistral v3", template: mistralTemplate, tokens: tokens("</s>", "<s>"), format: "mistral" }
]

describe("the tool-call format of a checkpoint's chat template", () => {
  it("is the one whose parser reads the calls the template renders, and a forced call starts as the template writes it", () => {
    for (const t of templates) {
      const chat = hfChat(t.tokens, t.template)
      expect(chat.toolFormat.name, t.name).toBe(t.format)
      // a history turn with calls the gateway did not generate: the template writes them, the parser reads them back
      const one = t.format === "llama3-json" ? [calls[0]!] : calls
      const id = (i: number) => `abcdefgh${i}`
      const history: Array<ChatMessage> = [
        { role: "user", content: "do it" },
        { role: "assistant", content: null, tool_calls: one.map((c, i) => ({ id: id(i), type: "function" as const, function: { name: c.name, arguments: c.arguments } })) },
        ...one.map((_, i) => ({ role: "tool" as const, tool_call_id: id(i), content: "done" }))
      ]
      const text = tokenizer.decode(chat.render(history, tools, undefined))
      const before = tokenizer.decode(chat.render(history.slice(0, 1), tools, undefined))
      expect(text.startsWith(before), t.name).toBe(true)
      const read = chat.toolFormat.scan(text.slice(before.length), true, tools)
      expect(read.calls.map((c) => [c.name, json(c.arguments)]), t.name).toEqual(one.map((c) => [c.name, json(c.arguments)]))
      const start = chat.callStart!("read_file")
      expect(text, t.name).toContain(start.replace(/^<think>\n\n<\/think>\n\n/, ""))
      expect(chat.toolFormat.scan(`${start}{"path": "a"}`, false, tools).calls.map((c) => c.name), t.name).toEqual(["read_file"])
    }
  })

  it("refuses a tool format the template does not render; a template that renders no calls takes the one asked for", () => {
    expect(() => hfChat(tokens("<|im_end|>"), qwen3CoderTemplate, "hermes")).toThrow(ToolFormatMismatch)
    expect(hfChat(tokens("<|im_end|>"), qwen3CoderTemplate, "qwen3-coder").toolFormat.name).toBe("qwen3-coder")
    expect(hfChat(tokens("<|im_end|>"), smollm2Template, "mistral").toolFormat.name).toBe("mistral")
    expect(hfChat(tokens("<|im_end|>"), smollm2Template).toolFormat.name).toBe("hermes")
  })

  it("keeps the format's special tokens in the text it reads: Llama's <|python_tag|>, Mistral's [TOOL_CALLS]", () => {
    const llama = hfChat(tokens("<|eot_id|>", "<|begin_of_text|>"), llama31Template)
    const mistral = hfChat(tokens("</s>", "<s>"), mistralTemplate)
    const reading = (chat: typeof llama, text: string) =>
      readTurn(tokenizer.encode(text), true, { tokenizer, stops: [], markers: chat.markers, format: chat.toolFormat, tools, prefix: "", inReasoning: false })
    expect(reading(llama, '<|python_tag|>{"name": "read_file", "parameters": {"path": "a"}}<|eot_id|>').calls.map((c) => c.name)).toEqual(["read_file"])
    const m = reading(mistral, 'Sure. [TOOL_CALLS] [{"name": "read_file", "arguments": {"path": "a"}, "id": "abcdefghi"}]</s>')
    expect([m.content, m.calls.map((c) => c.arguments)]).toEqual(["Sure. ", ['{"path": "a"}']])
    expect(/^[A-Za-z0-9]{9}$/.test(mistral.toolFormat.newCallId())).toBe(true)
  })
})
