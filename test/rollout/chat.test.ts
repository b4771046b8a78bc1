/**
 * Chat rendering and tool calls (pure): the template, tool-call parsing, the raw-turn cache
 * that keeps a re-formatted history on the generated tokens, and the text that may be
 * streamed before a generation ends.
 */
import { describe, expect, it } from "vitest"
import fc from "fast-check"
import { renderChat, visibleText } from "../../src/openai/chat.ts"
import { toolFormats, toolsPrompt } from "../../src/openai/tool-formats.ts"
import { AssistantTurns } from "../../src/openai/turns.ts"
import type { ChatMessage, ToolDefinition } from "../../src/openai/messages.ts"
import { decode, encode, special } from "../../src/engine/tokenizer.ts"

const tools: Array<ToolDefinition> = [{ type: "function", function: { name: "read_file", parameters: { type: "object", properties: { path: { type: "string" } } } } }]
const startsWith = (a: Int32Array, prefix: ArrayLike<number>) => Array.from(a.subarray(0, prefix.length)).every((t, i) => t === prefix[i])

describe("chat rendering", () => {
  it("renders the byte-level chat template, tools as a first system turn, developer as system", () => {
    const messages: Array<ChatMessage> = [
      { role: "developer", content: "Be brief." },
      { role: "user", content: [{ type: "text", text: "Hi " }, { type: "text", text: "there" }] },
      { role: "assistant", content: "Hello." },
      { role: "tool", content: "42", tool_call_id: "call_1" }
    ]
    const ids = renderChat(messages, [], undefined)
    expect(decode(Array.from(ids))).toBe("<|bos|><|system|>Be brief.<|end|><|user|>Hi there<|end|><|assistant|>Hello.<|end|><|tool|>42<|end|><|assistant|>")
    expect(Array.from(ids).slice(0, 3 + "Be brief.".length)).toEqual([special.bos, special.system, ...encode("Be brief."), special.end])
    const withTools = renderChat([{ role: "user", content: "go" }], tools, undefined)
    expect(Array.from(withTools)).toEqual([special.bos, special.system, ...encode(toolsPrompt(tools)), special.end, special.user, ...encode("go"), special.end, special.assistant])
  })

  it("parses tool calls written as <tool_call> blocks; malformed blocks stay content", () => {
    const text = 'Let me look.\n<tool_call>{"name": "read_file", "arguments": {"path": "a.txt"}}</tool_call>\n<tool_call>{"name": "ls"}</tool_call><tool_call>not json</tool_call>'
    const parsed = toolFormats.hermes.scan(text, true, tools)
    expect(parsed.calls.map((c) => [c.name, c.arguments])).toEqual([
      ["read_file", '{"path": "a.txt"}'], // as written
      ["ls", "{}"]
    ])
    expect(parsed.calls[0]!.raw).toBe('<tool_call>{"name": "read_file", "arguments": {"path": "a.txt"}}</tool_call>')
    expect(parsed.content).toBe("Let me look.\n\n<tool_call>not json</tool_call>")
    expect(toolFormats.hermes.scan("no calls", true, tools).calls).toEqual([])
  })

  it("renders a re-formatted history with the tokens the model generated, so the next prompt extends the last sequence", () => {
    const turns = new AssistantTurns()
    const first = renderChat([{ role: "user", content: "read a.txt" }], tools, turns)
    // the model's raw turn: odd spacing in the JSON, an invalid UTF-8 byte in the content, the end token
    const raw = Int32Array.from([...encode("ok "), 0xff, ...encode('<tool_call>{ "name":"read_file",  "arguments":{"path":"a.txt"} }</tool_call>'), special.end])
    turns.remember(raw, ["call_abc"], "ok \ufffd")
    const plain = Int32Array.from([...encode("done"), 0xc3])
    turns.remember(plain, [], "done\ufffd")
    const history: Array<ChatMessage> = [
      { role: "user", content: "read a.txt" },
      // the harness re-serialised the arguments and dropped the content
      { role: "assistant", content: null, tool_calls: [{ id: "call_abc", type: "function", function: { name: "read_file", arguments: '{\n  "path": "a.txt"\n}' } }] },
      { role: "tool", content: "hello", tool_call_id: "call_abc" }
    ]
    const second = renderChat(history, tools, turns)
    expect(startsWith(second, [...first, ...raw])).toBe(true)
    expect(Array.from(second.subarray(first.length + raw.length))).toEqual([special.tool, ...encode("hello"), special.end, special.assistant])
    const third = renderChat([...history, { role: "assistant", content: "done\ufffd" }, { role: "user", content: "thanks" }], tools, turns)
    expect(startsWith(third, [...second, ...plain, special.end])).toBe(true)
    // a tool call this gateway did not generate renders canonically
    const foreign = renderChat([{ role: "assistant", content: "x", tool_calls: [{ id: "other", type: "function", function: { name: "f", arguments: '{"a": 1}' } }] }], [], turns)
    expect(Array.from(foreign)).toEqual([special.bos, special.assistant, ...encode('x\n<tool_call>{"name":"f","arguments":{"a":1}}</tool_call>'), special.end, special.assistant])
  })

  it("streams only text that stays a prefix of the final text (stop strings, tool calls, split characters)", () => {
    const stops = ["STOP"]
    fc.assert(
      fc.property(fc.string({ unit: "binary", maxLength: 40 }), fc.boolean(), (s, holdToolCalls) => {
        const ids = encode(`${s}<tool_call>{"name":"f"}</tool_call>ST${s}STOP tail`)
        const final = visibleText(ids, stops, { final: true })
        const hold = holdToolCalls ? ["<tool_call>"] : []
        let previous = ""
        for (let n = 0; n <= ids.length; n++) {
          const partial = visibleText(ids.slice(0, n), stops, { final: false, hold })
          expect(final.startsWith(partial)).toBe(true)
          expect(partial.startsWith(previous)).toBe(true)
          // a trailing start of a held string is not streamed
          if (holdToolCalls) for (let k = 1; k < "<tool_call>".length; k++) expect(partial.endsWith("<tool_call>".slice(0, k))).toBe(false)
          previous = partial
        }
        expect(final).not.toContain("STOP")
      }),
      // held "<" of a tool call exposed "S" of "STOP": streamed "S", then took it back
      { examples: [["S", true]] }
    )
    expect(visibleText([...encode("ab"), special.end], [], { final: true })).toBe("ab")
  })
})
