/**
 * Tool-call formats, reasoning and turn matching through a real gateway and rollout worker,
 * talked to by the official `openai` client. Scripted models (`./scripted-model.ts`: hand-set
 * bigram weights, so the real engine writes one fixed turn) under the chat templates of
 * Qwen3-Coder, Llama 3.1 and Mistral: the gateway picks each template's format, answers
 * `tool_calls` (streamed argument by argument), honours a named `tool_choice` and
 * `parallel_tool_calls: false`, and a conversation whose client re-serialises the arguments
 * stays one path of the trajectory. Under ChatML with Hermes calls and `<think>` reasoning: the
 * reasoning comes back as `reasoning_content`, and a client that drops it, moves it, leaves it
 * inline or trims the content still continues on the recorded tokens.
 */
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect } from "effect"
import OpenAI from "openai"
import { afterAll, describe, expect, it } from "vitest"
import { chatFormatOf } from "../../src/openai/hf-chat.ts"
import type { ActorSystem } from "../../src/runtime/system.ts"
import { withSystem } from "../runtime/harness.ts"
import { KEY, readRecords, serve } from "../rollout/fixtures.ts"
import { llama31Template, mistralTemplate, qwen3CoderTemplate } from "../openai/templates.ts"
import { expectOnePath } from "./apis.ts"
import { REASONING, writeScriptedModel, type Script } from "./scripted-model.ts"

const root = mkdtempSync(join(tmpdir(), "gyre-tool-formats-"))
afterAll(() => rmSync(root, { recursive: true, force: true }))

type Message = OpenAI.Chat.ChatCompletionMessageParam

const tools: Array<OpenAI.Chat.ChatCompletionTool> = [
  { type: "function", function: { name: "read_file", parameters: { type: "object", properties: { path: { type: "string" }, lines: { type: "integer" } } } } },
  { type: "function", function: { name: "list_dir", parameters: { type: "object", properties: { dir: { type: "string" } } } } }
]

const chatml = { specials: ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], bos: "<|endoftext|>", eos: "<|im_end|>" }

/** Qwen3-Coder: reasoning, then two calls (read_file, list_dir), the first's `</tool_call>` its own token. */
const qwen3Coder: Script = {
  ...chatml,
  template: qwen3CoderTemplate,
  turn: [
    "\n",
    "<think>",
    "Plan the read.",
    "</think>",
    "<tool_call>",
    "\n<function=read_file>\n<parameter=path>\n",
    "src/",
    "a.txt",
    "\n</parameter>\n<parameter=lines>\n",
    "40",
    "\n</parameter>\n</function>\n",
    "</tool_call>",
    "\n<tool_call>",
    "\n<function=list_dir>\n",
    "<parameter=dir>\n",
    "src",
    "\n</parameter>\n</function>\n</tool_call>",
    "<|im_end|>"
  ]
}

const llama3: Script = {
  template: llama31Template,
  specials: ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"],
  bos: "<|begin_of_text|>",
  eos: "<|eot_id|>",
  turn: ["\n", "<|python_tag|>", '{"name": "read_file", "parameters": {"path": "', "src/", "a.txt", '"}}', "<|eot_id|>"]
}

const mistral: Script = {
  template: mistralTemplate,
  specials: ["<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"],
  bos: "<s>",
  eos: "</s>",
  turn: ["[/INST]", "[TOOL_CALLS]", ' [{"name": "read_file", "arguments": {"path": "', "src/", "a.txt", '"}, "id": "', "abcdefghi", '"}]', "</s>"]
}

/** Serves a scripted model (default: ChatML with Hermes calls) with its own chat format; `f` talks to it with the openai client. */
const withScripted = <A>(name: string, script: Script | undefined, f: (client: OpenAI, execution: string) => Effect.Effect<A, unknown, ActorSystem>) =>
  withSystem(
    `tool-formats-${name}`,
    Effect.gen(function* () {
      const dir = writeScriptedModel(mkdtempSync(join(root, `${name}-`)), script)
      const chat = yield* Effect.promise(() => chatFormatOf(dir))
      const { baseUrl, execution } = yield* serve({ checkpoint: dir, workers: 1, gateway: { chat } })
      const client = new OpenAI({ baseURL: baseUrl, apiKey: KEY, maxRetries: 0, timeout: 60_000 })
      return { a: yield* f(client, execution), execution, format: chat.toolFormat.name }
    })
  )

const create = (client: OpenAI, body: Partial<OpenAI.Chat.ChatCompletionCreateParamsNonStreaming> & { messages: Array<Message> }) =>
  Effect.promise(() => client.chat.completions.create({ model: "gyre", tools, max_tokens: 24, ...body, stream: false }))

/** A streamed completion: the chunks' reasoning, content and tool calls, as the client assembles them, and how many argument deltas came. */
const streamed = (client: OpenAI, body: { messages: Array<Message> } & Partial<OpenAI.Chat.ChatCompletionCreateParamsStreaming>) =>
  Effect.promise(async () => {
    const stream = await client.chat.completions.create({ model: "gyre", tools, max_tokens: 24, ...body, stream: true })
    let reasoning = ""
    let content = ""
    let argumentDeltas = 0
    const calls: Array<{ id: string; name: string; arguments: string }> = []
    for await (const chunk of stream) {
      const delta = chunk.choices[0]?.delta as (typeof chunk.choices)[number]["delta"] & { reasoning_content?: string }
      reasoning += delta?.reasoning_content ?? ""
      content += delta?.content ?? ""
      for (const c of delta?.tool_calls ?? []) {
        if (c.id !== undefined) calls[c.index] = { id: c.id, name: c.function?.name ?? "", arguments: "" }
        if ((c.function?.arguments ?? "") !== "") argumentDeltas++
        calls[c.index]!.arguments += c.function?.arguments ?? ""
      }
    }
    return { reasoning, content, calls, argumentDeltas }
  })

/** The assistant message a client sends back: the calls with their arguments re-serialised (keys reversed, indented), no reasoning. */
const resent = (calls: ReadonlyArray<{ id: string; function: { name: string; arguments: string } }>): Message => ({
  role: "assistant",
  content: null,
  tool_calls: calls.map((c) => ({
    id: c.id,
    type: "function",
    function: { name: c.function.name, arguments: JSON.stringify(Object.fromEntries(Object.entries(JSON.parse(c.function.arguments) as object).reverse()), null, 2) }
  }))
})

const resultsOf = (calls: ReadonlyArray<{ id: string }>): Array<Message> => calls.map((c) => ({ role: "tool", tool_call_id: c.id, content: `result of ${c.id}` }))

describe("tool-call formats through the gateway", () => {
  it("Qwen3-Coder: XML calls typed by schema, streamed argument by argument; a named tool choice and parallel_tool_calls: false; one path", async () => {
    const out = await withScripted("qwen3-coder", qwen3Coder, (client, execution) =>
      Effect.gen(function* () {
        const messages: Array<Message> = [{ role: "user", content: "read a file and list src" }]
        const first = yield* create(client, { messages })
        const stream = yield* streamed(client, { messages })
        const named = yield* create(client, { messages, tool_choice: { type: "function", function: { name: "list_dir" } } })
        const single = yield* create(client, { messages, parallel_tool_calls: false })
        const calls = first.choices[0]!.message.tool_calls!.map((c) => c as OpenAI.Chat.ChatCompletionMessageFunctionToolCall)
        const next = yield* create(client, { messages: [...messages, resent(calls), ...resultsOf(calls)] })
        return { first, stream, named, single, next, records: yield* readRecords(execution, 5) }
      })
    )
    expect(out.format).toBe("qwen3-coder")
    const message = out.a.first.choices[0]!.message as OpenAI.Chat.ChatCompletionMessage & { reasoning_content?: string }
    expect(out.a.first.choices[0]!.finish_reason).toBe("tool_calls")
    expect(message.reasoning_content).toBe("Plan the read.")
    expect(message.content).toBeNull()
    const calls = message.tool_calls!.map((c) => c as OpenAI.Chat.ChatCompletionMessageFunctionToolCall)
    expect(calls.map((c) => [c.function.name, JSON.parse(c.function.arguments)])).toEqual([
      ["read_file", { path: "src/a.txt", lines: 40 }],
      ["list_dir", { dir: "src" }]
    ])
    // streamed: the same calls, the first's arguments in several deltas
    expect(out.a.stream.reasoning).toBe("Plan the read.")
    expect(out.a.stream.calls.map((c) => [c.name, c.arguments])).toEqual(calls.map((c) => [c.function.name, c.function.arguments]))
    expect(out.a.stream.argumentDeltas).toBeGreaterThan(2)
    // named: the turn starts with list_dir's call (forced), and answers that call only
    const named = out.a.named.choices[0]!.message.tool_calls!.map((c) => c as OpenAI.Chat.ChatCompletionMessageFunctionToolCall)
    expect(named.map((c) => [c.function.name, JSON.parse(c.function.arguments)])).toEqual([["list_dir", { dir: "src" }]])
    const namedRecord = out.a.records[2]!
    const forced = "<tool_call>\n<function=list_dir>\n"
    expect(namedRecord.toolCalls[named[0]!.id]).toBe(`${forced}<parameter=dir>\nsrc\n</parameter>\n</function>\n</tool_call>`)
    // without parallel calls: one call, and generation ended at its </tool_call>
    const single = out.a.single.choices[0]!.message.tool_calls!
    expect(single.map((c) => (c as OpenAI.Chat.ChatCompletionMessageFunctionToolCall).function.name)).toEqual(["read_file"])
    expect(out.a.single.usage!.completion_tokens).toBeLessThan(out.a.first.usage!.completion_tokens)
    // the client re-serialised the arguments: the next call still continues on the recorded tokens
    const [firstRecord, , , , nextRecord] = out.a.records
    expectOnePath(out.execution, out.a.records, [firstRecord!.callId, nextRecord!.callId])
  }, 120_000)

  for (const [name, script] of [
    ["llama3-json", llama3],
    ["mistral", mistral]
  ] as const) {
    it(`${name}: the template's format, calls streamed as they are written; a conversation stays one path`, async () => {
      const out = await withScripted(name, script, (client, execution) =>
        Effect.gen(function* () {
          const messages: Array<Message> = [{ role: "user", content: "read a.txt" }]
          const first = yield* create(client, { messages })
          const stream = yield* streamed(client, { messages })
          const calls = first.choices[0]!.message.tool_calls!.map((c) => c as OpenAI.Chat.ChatCompletionMessageFunctionToolCall)
          const next = yield* create(client, { messages: [...messages, resent(calls), ...resultsOf(calls)], max_tokens: 4 })
          return { first, stream, next, records: yield* readRecords(execution, 3) }
        })
      )
      expect(out.format).toBe(name)
      const calls = out.a.first.choices[0]!.message.tool_calls!.map((c) => c as OpenAI.Chat.ChatCompletionMessageFunctionToolCall)
      expect(calls.map((c) => [c.function.name, JSON.parse(c.function.arguments)])).toEqual([["read_file", { path: "src/a.txt" }]])
      expect(out.a.first.choices[0]!.message.content).toBeNull()
      if (name === "mistral") expect(calls[0]!.id).toMatch(/^[A-Za-z0-9]{9}$/) // what Mistral's template accepts
      expect(out.a.stream.calls.map((c) => [c.name, c.arguments])).toEqual(calls.map((c) => [c.function.name, c.function.arguments]))
      expect(out.a.stream.argumentDeltas).toBeGreaterThan(2)
      const [firstRecord, , nextRecord] = out.a.records
      expectOnePath(out.execution, out.a.records, [firstRecord!.callId, nextRecord!.callId])
    }, 120_000)
  }
})

describe("reasoning and turn matching through the gateway", () => {
  it("returns <think> text as reasoning_content; a client that drops, moves, inlines or trims it continues on the recorded tokens", async () => {
    const out = await withScripted("hermes", undefined, (client, execution) =>
      Effect.gen(function* () {
        const messages: Array<Message> = [{ role: "system", content: "You are careful." }, { role: "user", content: "read a.txt" }]
        // 1: a call; sent back re-serialised and without its reasoning
        const first = yield* create(client, { messages })
        const calls1 = first.choices[0]!.message.tool_calls!.map((c) => c as OpenAI.Chat.ChatCompletionMessageFunctionToolCall)
        messages.push(resent(calls1), ...resultsOf(calls1))
        // 2: streamed; sent back with the reasoning moved to reasoning_content
        const second = yield* streamed(client, { messages })
        const moved = { ...resent(second.calls.map((c) => ({ id: c.id, function: c }))), reasoning_content: second.reasoning } // vLLM's field, which the client passes through
        messages.push(moved as unknown as Message, ...resultsOf(second.calls))
        // 3: no tools read (tool_choice none): reasoning and plain content; sent back with the reasoning inline and the content padded
        const third = yield* create(client, { messages, tool_choice: "none" })
        const m3 = third.choices[0]!.message as OpenAI.Chat.ChatCompletionMessage & { reasoning_content?: string }
        messages.push({ role: "assistant", content: `<think>${m3.reasoning_content}</think>\n${m3.content}  \n` }, { role: "user", content: "and now?" })
        // 4: sent back as the plain content only, trimmed
        const fourth = yield* create(client, { messages, tool_choice: "none" })
        messages.push({ role: "assistant", content: (fourth.choices[0]!.message.content ?? "").trim() }, { role: "user", content: "thanks" })
        const fifth = yield* create(client, { messages, max_tokens: 4 })
        return { first, second, third: m3, fifth, records: yield* readRecords(execution, 5) }
      })
    )
    const m1 = out.a.first.choices[0]!.message as OpenAI.Chat.ChatCompletionMessage & { reasoning_content?: string }
    expect(m1.reasoning_content).toBe(REASONING)
    expect(out.a.second.reasoning).toBe(REASONING)
    expect(out.a.second.calls.map((c) => c.name)).toEqual(["read_file"])
    expect(out.a.third.reasoning_content).toBe(REASONING)
    expect(out.a.third.content).toContain("<tool_call>") // not read as a call under tool_choice none
    expect(out.a.third.tool_calls ?? []).toEqual([])
    // every call's prompt begins with the previous call's prompt and output: one path, no branch
    expectOnePath(out.execution, out.a.records)
  }, 120_000)
})

describe("what the chat endpoint does not do", () => {
  it("refuses n > 1, top_logprobs, a JSON response_format and a tool choice of an unknown function with 400s naming them", async () => {
    const out = await withScripted("refusals", undefined, (client) =>
      Effect.gen(function* () {
        const messages: Array<Message> = [{ role: "user", content: "hi" }]
        const refused = (body: Partial<OpenAI.Chat.ChatCompletionCreateParamsNonStreaming>) =>
          Effect.promise(() =>
            client.chat.completions
              .create({ model: "gyre", tools, messages, ...body, stream: false })
              .then(() => undefined, (e: InstanceType<typeof OpenAI.APIError>) => ({ status: e.status, param: e.param, code: e.code }))
          )
        return {
          n: yield* refused({ n: 2 }),
          topLogprobs: yield* refused({ logprobs: true, top_logprobs: 3 }),
          json: yield* refused({ response_format: { type: "json_object" } }),
          schema: yield* refused({ response_format: { type: "json_schema", json_schema: { name: "x", schema: {} } } }),
          unknownTool: yield* refused({ tool_choice: { type: "function", function: { name: "rm_rf" } } }),
          text: yield* create(client, { messages, response_format: { type: "text" }, max_tokens: 4 })
        }
      })
    )
    expect(out.a.n).toEqual({ status: 400, param: "n", code: "unsupported_parameter" })
    expect(out.a.topLogprobs).toEqual({ status: 400, param: "top_logprobs", code: "unsupported_parameter" })
    expect(out.a.json).toEqual({ status: 400, param: "response_format", code: "unsupported_parameter" })
    expect(out.a.schema).toEqual({ status: 400, param: "response_format", code: "unsupported_parameter" })
    expect(out.a.unknownTool).toMatchObject({ status: 400, param: "tool_choice" })
    expect(out.a.text.choices).toHaveLength(1)
  }, 60_000)
})
