/**
 * The Anthropic Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`) against a
 * real rollout worker running the scripted model (`./scripted-model.ts`: every turn is
 * reasoning, then a read_file call), real NATS and real HTTP, through the official
 * `@anthropic-ai/sdk`: `messages.create` and `messages.stream().finalMessage()` with tools and
 * tool results on one path of the trajectory, `countTokens` as the call counts, the named
 * stream events in order, each stop reason, both ways of sending the key, the models list,
 * and every failure in Anthropic's error shape; then `gyre serve` as a user runs it.
 */
import * as path from "node:path"
import Anthropic from "@anthropic-ai/sdk"
import { Effect } from "effect"
import OpenAI from "openai"
import { afterEach, describe, expect, it } from "vitest"
import { anthropicBaseUrl } from "../../src/harness/environment.ts"
import { KEY, readRecords, serveChild, tempDir } from "../rollout/fixtures.ts"
import { withSystem } from "../runtime/harness.ts"
import { expectOnePath, failure, postEvents, promise, scriptedModel, serveScripted } from "./apis.ts"
import { CALL_ARGUMENTS, REASONING, readFileSchema } from "./scripted-model.ts"

const readFile = { name: "read_file", description: "Read a file of the workspace.", input_schema: readFileSchema as Anthropic.Tool.InputSchema }

/** What the client reads of a message: thinking and text together, and its tool calls. */
const shown = (m: Anthropic.Message) => ({
  text: m.content.map((b) => (b.type === "thinking" ? b.thinking : b.type === "text" ? b.text : "")).join(""),
  calls: m.content.flatMap((b) => (b.type === "tool_use" ? [b] : []))
})

const killAfter: Array<() => void> = []
afterEach(() => killAfter.splice(0).forEach((k) => k()))

describe("Anthropic Messages API", () => {
  it("serves messages.create and messages.stream with tools and tool results on one path; countTokens counts as the call does", async () => {
    const out = await withSystem("msg-turns", Effect.gen(function* () {
      const { anthropic, execution } = yield* serveScripted()
      const common = {
        model: "gyre",
        max_tokens: 64,
        system: [{ type: "text" as const, text: "You are a careful agent.", cache_control: { type: "ephemeral" as const } }],
        tools: [readFile, { type: "web_search_20250305" as const, name: "web_search" as const, max_uses: 2 }],
        tool_choice: { type: "auto" as const, disable_parallel_tool_use: true },
        metadata: { user_id: "tester" },
        thinking: { type: "enabled" as const, budget_tokens: 1024 },
        temperature: 1
      }
      const headers = { headers: { "anthropic-beta": "interleaved-thinking-2025-05-14" } }
      const messages: Array<Anthropic.MessageParam> = [{ role: "user", content: "Show me a.txt" }]
      const first = yield* promise(() => anthropic.messages.create({ ...common, messages }, headers))
      messages.push({ role: "assistant", content: first.content }, { role: "user", content: [{ type: "tool_result", tool_use_id: shown(first).calls[0]!.id, content: [{ type: "text", text: "hello from a.txt" }] }] })
      const counted = yield* promise(() => anthropic.messages.countTokens({ model: "gyre", system: common.system, tools: common.tools, tool_choice: common.tool_choice, thinking: common.thinking, messages }))
      const second = yield* promise(() => anthropic.messages.stream({ ...common, messages }).finalMessage())
      messages.push({ role: "assistant", content: second.content }, { role: "user", content: [{ type: "tool_result", tool_use_id: shown(second).calls[0]!.id, content: "done", is_error: false }] })
      // tool_choice none: the model's call stays text; the message goes back into the history as it is
      const third = yield* promise(() => anthropic.messages.create({ ...common, messages, tool_choice: { type: "none" } }))
      messages.push({ role: "assistant", content: third.content }, { role: "user", content: [{ type: "text", text: "Once more.", cache_control: { type: "ephemeral" } }] })
      const fourth = yield* promise(() => anthropic.messages.stream({ ...common, messages }).finalMessage())
      const records = yield* readRecords(execution, 4)
      return { messages: [first, second, third, fourth], counted, records, execution }
    }))
    const [first, second, third, fourth] = out.messages
    for (const m of [first!, second!, fourth!]) {
      expect([m.type, m.role, m.model, m.stop_reason, m.stop_sequence]).toEqual(["message", "assistant", "gyre", "tool_use", null])
      const { text, calls } = shown(m)
      expect(text).toContain(REASONING)
      expect(calls.map((c) => [c.name, c.input])).toEqual([["read_file", CALL_ARGUMENTS]])
      expect(calls[0]!.id).toMatch(/^toolu_/)
      expect(m.usage.output_tokens).toBe(7)
    }
    expect(third!.stop_reason).toBe("end_turn")
    expect(shown(third!).calls).toEqual([])
    expect(shown(third!).text).toContain('<tool_call>\n{"name": "read_file"')
    expect(out.records.map((r) => r.callId)).toEqual(out.messages.map((m) => m.id))
    expect(out.records.map((r) => r.finishReason)).toEqual(["tool_calls", "tool_calls", "stop", "tool_calls"])
    // usage: the prompt's tokens, those the worker had cached as cache reads
    out.messages.forEach((m, i) => expect(m.usage.input_tokens + (m.usage.cache_read_input_tokens ?? 0)).toBe(out.records[i]!.promptLength))
    expect(second!.usage.cache_read_input_tokens).toBeGreaterThan(0)
    expect(out.counted.input_tokens).toBe(out.records[1]!.promptLength)
    expectOnePath(out.execution, out.records)
  })

  it("streams the named events in order, and stops at stop sequences and max_tokens", async () => {
    const out = await withSystem("msg-stream", Effect.gen(function* () {
      const { anthropic, baseUrl } = yield* serveScripted()
      const body = { model: "gyre", max_tokens: 64, messages: [{ role: "user", content: "Show me a.txt" }], tools: [readFile], stream: true }
      const raw = yield* postEvents(`${anthropicBaseUrl(baseUrl)}/v1/messages`, { "x-api-key": KEY, "anthropic-version": "2023-06-01" }, body)
      const ask = (params: Partial<Anthropic.MessageCreateParamsNonStreaming>) =>
        promise(() => anthropic.messages.create({ model: "gyre", max_tokens: 64, messages: [{ role: "user", content: "Show me a.txt" }], ...params }))
      const stopped = yield* ask({ stop_sequences: ["</think>"], tools: [readFile] })
      const cut = yield* ask({ max_tokens: 2 })
      const streamedCut = yield* promise(() => anthropic.messages.stream({ model: "gyre", max_tokens: 2, messages: [{ role: "user", content: "Show me a.txt" }] }).finalMessage())
      // the key as a bearer token, as the SDK sends an auth token
      const bearer = new Anthropic({ baseURL: anthropicBaseUrl(baseUrl), authToken: KEY, apiKey: null, maxRetries: 0 })
      const withToken = yield* promise(() => bearer.messages.create({ model: "gyre", max_tokens: 8, messages: [{ role: "user", content: "hi" }] }))
      return { raw, stopped, cut, streamedCut, withToken }
    }))
    const names = out.raw.events.map((e) => e.name)
    expect(out.raw.contentType).toBe("text/event-stream")
    expect(out.raw.events.every((e) => typeof e.data === "object" && e.name === e.data.type)).toBe(true)
    expect(names.slice(0, 2)).toEqual(["message_start", "ping"])
    expect(names.slice(-2)).toEqual(["message_delta", "message_stop"])
    // blocks one after another: start, deltas, stop; the last a tool_use with its input as JSON
    const blocks = out.raw.events.filter((e) => e.name === "content_block_start").map((e) => (e.data as { index: number; content_block: { type: string } }))
    expect(blocks.map((b) => b.index)).toEqual(blocks.map((_, i) => i))
    expect(blocks.at(-1)!.content_block.type).toBe("tool_use")
    const order = out.raw.events.filter((e) => e.name?.startsWith("content_block_")).map((e) => `${e.name}:${(e.data as { index: number }).index}`)
    blocks.forEach((_, i) => {
      const at = order.indexOf(`content_block_start:${i}`)
      expect(order.indexOf(`content_block_stop:${i}`)).toBeGreaterThan(at)
      if (i > 0) expect(order.indexOf(`content_block_stop:${i - 1}`)).toBeLessThan(at)
    })
    const json = out.raw.events
      .filter((e) => e.name === "content_block_delta" && (e.data as { delta: { type: string } }).delta.type === "input_json_delta")
      .map((e) => (e.data as { delta: { partial_json: string } }).delta.partial_json)
      .join("")
    expect(JSON.parse(json)).toEqual(CALL_ARGUMENTS)
    const final = out.raw.events.at(-2)!.data as { delta: { stop_reason: string }; usage: { output_tokens: number } }
    expect([final.delta.stop_reason, final.usage.output_tokens]).toEqual(["tool_use", 7])
    expect([out.stopped.stop_reason, out.stopped.stop_sequence, shown(out.stopped).calls.length]).toEqual(["stop_sequence", "</think>", 0])
    expect(shown(out.stopped).text).not.toContain("</think>")
    expect([out.cut.stop_reason, out.cut.usage.output_tokens]).toEqual(["max_tokens", 2])
    expect([out.streamedCut.stop_reason, out.streamedCut.usage.output_tokens]).toEqual(["max_tokens", 2])
    expect(out.withToken.usage.output_tokens).toBeGreaterThan(0)
  })

  it("answers every failure in Anthropic's error shape, and lists the model for the Anthropic client", async () => {
    const out = await withSystem("msg-errors", Effect.gen(function* () {
      const { anthropic, baseUrl } = yield* serveScripted({ limits: { maxBodyBytes: 8192 } })
      const base = anthropicBaseUrl(baseUrl)
      const create = (body: Record<string, unknown>) => failure(() => anthropic.messages.create({ model: "gyre", max_tokens: 8, messages: [{ role: "user", content: "hi" }], ...body } as Anthropic.MessageCreateParamsNonStreaming))
      const raw = (method: string, url: string, headers: Record<string, string>, body?: string) =>
        promise(async () => {
          const res = await fetch(url, { method, headers: { "content-type": "application/json", ...headers }, ...(body === undefined ? {} : { body }) })
          return { status: res.status, body: (await res.json()) as unknown }
        })
      return {
        model: yield* create({ model: "claude-sonnet-4" }),
        image: yield* create({ messages: [{ role: "user", content: [{ type: "image", source: { type: "base64", media_type: "image/png", data: "AAAA" } }] }] }),
        block: yield* create({ messages: [{ role: "user", content: [{ type: "mystery" }] }] }),
        topK: yield* create({ top_k: 5 }),
        noMax: yield* create({ max_tokens: undefined }),
        choice: yield* create({ tools: [readFile], tool_choice: { type: "tool", name: "write_file" } }),
        tooBig: yield* create({ messages: [{ role: "user", content: "x".repeat(10_000) }] }),
        badKey: yield* failure(() => new Anthropic({ baseURL: base, apiKey: "not-a-key", maxRetries: 0 }).messages.create({ model: "gyre", max_tokens: 8, messages: [{ role: "user", content: "hi" }] })),
        noKey: yield* raw("POST", `${base}/v1/messages`, {}, "{}"),
        method: yield* raw("GET", `${base}/v1/messages`, { "x-api-key": KEY }),
        path: yield* raw("POST", `${base}/v1/messages/batches`, { "x-api-key": KEY }, "{}"),
        json: yield* raw("POST", `${base}/v1/messages`, { "x-api-key": KEY }, "{not json"),
        countModel: yield* failure(() => anthropic.messages.countTokens({ model: "other", messages: [{ role: "user", content: "hi" }] })),
        models: yield* promise(() => anthropic.models.list()),
        model1: yield* promise(() => anthropic.models.retrieve("gyre")),
        noModel: yield* failure(() => anthropic.models.retrieve("other")),
        // the same path for an OpenAI client keeps OpenAI's shape
        openAiModel: yield* raw("GET", `${baseUrl}/models/other`, { authorization: `Bearer ${KEY}` })
      }
    }))
    const shape = (f: { status: number; body: unknown }) => [f.status, (f.body as { type?: string }).type, (f.body as { error?: { type?: string } }).error?.type]
    expect(shape(out.model)).toEqual([404, "error", "not_found_error"])
    for (const f of [out.image, out.block, out.topK, out.noMax, out.choice, out.json]) expect(shape(f)).toEqual([400, "error", "invalid_request_error"])
    expect((out.image.body as { error: { message: string } }).error.message).toContain("text only")
    expect(shape(out.tooBig)).toEqual([413, "error", "request_too_large"])
    expect(shape(out.badKey)).toEqual([401, "error", "authentication_error"])
    expect(shape(out.noKey)).toEqual([401, "error", "authentication_error"])
    expect(shape(out.method)).toEqual([405, "error", "invalid_request_error"])
    expect(shape(out.path)).toEqual([404, "error", "not_found_error"])
    expect(shape(out.countModel)).toEqual([404, "error", "not_found_error"])
    expect(out.models.data.map((m) => [m.id, m.type])).toEqual([["gyre", "model"]])
    expect([out.model1.id, out.model1.display_name]).toEqual(["gyre", "gyre"])
    expect(shape(out.noModel)).toEqual([404, "error", "not_found_error"])
    expect([out.openAiModel.status, (out.openAiModel.body as { error: { code: string } }).error.code]).toEqual([404, "model_not_found"])
  })

  it("serves both official clients from `gyre serve` at the base URLs it prints", async () => {
    const authDir = path.join(tempDir("gyre-msg-auth-"), "auth")
    const served = serveChild(["--checkpoint", scriptedModel, "--port", "0", "--store", tempDir("gyre-msg-store-")], authDir)
    killAfter.push(() => served.child.exitCode === null && served.child.kill("SIGKILL"))
    const ready = await served.event("ready")
    const anthropicLine = served.lines.find((l) => l.startsWith("Anthropic base URL: "))!
    const anthropic = new Anthropic({ baseURL: anthropicLine.slice("Anthropic base URL: ".length), apiKey: ready.key!, maxRetries: 0 })
    const message = await anthropic.messages.create({ model: "gyre", max_tokens: 64, messages: [{ role: "user", content: "Show me a.txt" }], tools: [readFile] })
    const openai = new OpenAI({ baseURL: ready.baseUrl, apiKey: ready.key, maxRetries: 0 })
    const response = await openai.responses.create({ model: "gyre", input: "Show me a.txt", tools: [{ type: "function", name: "read_file", parameters: readFileSchema, strict: false }] })
    served.child.kill("SIGINT")
    await served.event("drained")
    expect(await served.exited).toBe(0)
    expect(anthropicLine).toBe(`Anthropic base URL: ${anthropicBaseUrl(ready.baseUrl!)}`)
    expect(shown(message).calls.map((c) => c.input)).toEqual([CALL_ARGUMENTS])
    expect(response.output.filter((o) => o.type === "function_call").map((o) => o.name)).toEqual(["read_file"])
  })
})
