/**
 * The Responses API (`POST /v1/responses`) against a real rollout worker running the
 * scripted model (`./scripted-model.ts`: every turn is reasoning, then a read_file call),
 * real NATS and real HTTP, through the official `openai` client: `responses.create` and
 * `responses.stream` with tools, a multi-turn conversation on `function_call_output` whose
 * call records form one path (each prompt begins with the previous call's prompt and output),
 * the named stream events in order with their sequence numbers, custom tools, built-in tools
 * left out of the prompt, and refusals in OpenAI's error shape.
 */
import { Effect } from "effect"
import OpenAI from "openai"
import { describe, expect, it } from "vitest"
import { KEY, readRecords } from "../rollout/fixtures.ts"
import { withSystem } from "../runtime/harness.ts"
import { expectOnePath, failure, postEvents, promise, serveScripted } from "./apis.ts"
import { CALL_ARGUMENTS, REASONING, readFileSchema } from "./scripted-model.ts"

type Input = Array<OpenAI.Responses.ResponseInputItem>
const readFile = { type: "function" as const, name: "read_file", description: "Read a file of the workspace.", parameters: readFileSchema, strict: false }

/** What the client reads of a response: reasoning and message text together, and its calls. */
const shown = (r: OpenAI.Responses.Response) => ({
  text: r.output.map((o) => (o.type === "reasoning" ? (o.content ?? []).map((c) => c.text).join("") : o.type === "message" ? o.content.map((c) => (c.type === "output_text" ? c.text : "")).join("") : "")).join(""),
  calls: r.output.flatMap((o) => (o.type === "function_call" ? [o] : []))
})

describe("Responses API", () => {
  it("serves responses.create and responses.stream with tools; a conversation on function_call_output records one path", async () => {
    const out = await withSystem("resp-turns", Effect.gen(function* () {
      const { openai, execution } = yield* serveScripted()
      const tools = [readFile, { type: "web_search" as const }]
      const common = { model: "gyre", tools, max_output_tokens: 64, store: false, instructions: "You are a careful agent.", reasoning: { effort: "low" as const }, include: ["reasoning.encrypted_content" as const], parallel_tool_calls: true, metadata: { case: "turns" }, user: "tester", text: { format: { type: "text" as const }, verbosity: "low" as const }, temperature: 1, top_p: 1 }
      const first = yield* promise(() => openai.responses.create({ ...common, input: "Show me a.txt" }))
      const history: Input = [{ role: "user", content: "Show me a.txt" }, ...(first.output as Input)]
      const callOf = (r: OpenAI.Responses.Response) => shown(r).calls[0]!
      history.push({ type: "function_call_output", call_id: callOf(first).call_id, output: "hello from a.txt" })
      const events: Array<OpenAI.Responses.ResponseStreamEvent> = []
      const stream = openai.responses.stream({ ...common, input: history })
      stream.on("event", (e) => events.push(e))
      const second = yield* promise(() => stream.finalResponse())
      history.push(...(second.output as Input), { type: "function_call_output", call_id: callOf(second).call_id, output: [{ type: "input_text", text: "done" }] })
      // tool_choice none: the model's call stays text; the message goes back into the history as it is
      const third = yield* promise(() => openai.responses.create({ ...common, input: history, tool_choice: "none" }))
      history.push(...(third.output as Input), { role: "user", content: [{ type: "input_text", text: "Once more." }] })
      const fourth = yield* promise(() => openai.responses.stream({ ...common, input: history }).finalResponse())
      const records = yield* readRecords(execution, 4)
      return { responses: [first, second, third, fourth], events, records, execution }
    }))
    const [first, second, third, fourth] = out.responses
    for (const r of [first!, second!, fourth!]) {
      expect(r.status).toBe("completed")
      expect((r as { store?: boolean }).store).toBe(false)
      const { text, calls } = shown(r)
      expect(text).toContain(REASONING)
      expect(calls.map((c) => [c.name, JSON.parse(c.arguments), c.status])).toEqual([["read_file", CALL_ARGUMENTS, "completed"]])
      expect(calls[0]!.call_id).toMatch(/^call_/)
      expect(r.usage!.output_tokens).toBe(7)
    }
    // the model's <think> text is a reasoning item first, sealed for the way back as asked
    const reasoning = first!.output[0]!
    expect(reasoning.type).toBe("reasoning")
    if (reasoning.type === "reasoning") {
      expect(reasoning.content?.map((c) => c.text)).toEqual([REASONING])
      expect(reasoning.encrypted_content).toMatch(/^gyre:/)
    }
    expect(third!.output.map((o) => o.type)).not.toContain("function_call")
    expect(shown(third!).text).toContain('<tool_call>\n{"name": "read_file"')
    expect(out.records.map((r) => r.callId)).toEqual(out.responses.map((r) => r.id))
    expect(out.records.map((r) => r.finishReason)).toEqual(["tool_calls", "tool_calls", "stop", "tool_calls"])
    out.responses.forEach((r, i) => expect(r.usage!.input_tokens).toBe(out.records[i]!.promptLength))
    expectOnePath(out.execution, out.records)
    // the stream's events: named, numbered in order, the response's items opened and closed
    const types = out.events.map((e) => e.type)
    expect(types.slice(0, 2)).toEqual(["response.created", "response.in_progress"])
    expect(types.at(-1)).toBe("response.completed")
    expect(out.events.map((e) => e.sequence_number)).toEqual(out.events.map((_, i) => i))
    for (const t of ["response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.done", "response.output_item.done"]) expect(types).toContain(t)
    expect(types.filter((t) => t === "response.output_item.added").length).toBe(second!.output.length)
    expect(types.filter((t) => t === "response.output_item.done").length).toBe(second!.output.length)
  })

  it("streams named events that match their data, answers custom tools, leaves built-in tools out, and stops at max_output_tokens", async () => {
    const out = await withSystem("resp-tools", Effect.gen(function* () {
      const { openai, baseUrl, execution } = yield* serveScripted()
      const input = "Show me a.txt"
      const plain = yield* promise(() => openai.responses.create({ model: "gyre", input, tools: [readFile] }))
      const builtIns = [{ type: "web_search" as const }, { type: "file_search" as const, vector_store_ids: ["vs_1"] }, { type: "code_interpreter" as const, container: { type: "auto" as const } }, { type: "local_shell" as const }]
      const withBuiltIns = yield* promise(() => openai.responses.create({ model: "gyre", input, tools: [readFile, ...builtIns] }))
      const raw = yield* postEvents(`${baseUrl}/responses`, { authorization: `Bearer ${KEY}` }, { model: "gyre", input, tools: [readFile], stream: true })
      const custom = { type: "custom" as const, name: "read_file", description: "Read a file; the input is its path." }
      const customCall = yield* promise(() => openai.responses.create({ model: "gyre", input, tools: [custom] }))
      const call = customCall.output.find((o) => o.type === "custom_tool_call")!
      const followUp = yield* promise(() =>
        openai.responses.stream({ model: "gyre", tools: [custom], input: [{ role: "user", content: input }, ...(customCall.output as Input), { type: "custom_tool_call_output", call_id: call.call_id, output: "hello" }] }).finalResponse()
      )
      const cut = yield* promise(() => openai.responses.create({ model: "gyre", input, tools: [readFile], max_output_tokens: 2 }))
      const cutEvents = yield* postEvents(`${baseUrl}/responses`, { authorization: `Bearer ${KEY}` }, { model: "gyre", input, max_output_tokens: 2, stream: true })
      const records = yield* readRecords(execution, 7)
      return { plain, withBuiltIns, raw, customCall, followUp, cut, cutEvents, records, execution }
    }))
    expect(out.withBuiltIns.status).toBe("completed")
    expect(out.withBuiltIns.usage!.input_tokens).toBe(out.plain.usage!.input_tokens)
    // every event is named as its data's type; no [DONE]
    expect(out.raw.status).toBe(200)
    expect(out.raw.contentType).toBe("text/event-stream")
    expect(out.raw.events.every((e) => typeof e.data === "object" && e.name === e.data.type)).toBe(true)
    expect(out.raw.events.at(-1)!.name).toBe("response.completed")
    const completed = out.raw.events.at(-1)!.data as { response: OpenAI.Responses.Response }
    expect(shown(completed.response).calls.map((c) => c.name)).toEqual(["read_file"])
    // a custom tool's call: its input is what the model wrote
    expect(out.customCall.output.map((o) => o.type)).toContain("custom_tool_call")
    const call = out.customCall.output.find((o) => o.type === "custom_tool_call")!
    expect([call.name, JSON.parse(call.input)]).toEqual(["read_file", CALL_ARGUMENTS])
    expect(out.followUp.output.map((o) => o.type)).toContain("custom_tool_call")
    expect(out.records[4]!.callId).toBe(out.followUp.id)
    expectOnePath(out.execution, out.records, [out.customCall.id, out.followUp.id])
    // max_output_tokens: incomplete, in the object and as the stream's last event
    expect([out.cut.status, out.cut.incomplete_details?.reason, out.cut.usage!.output_tokens]).toEqual(["incomplete", "max_output_tokens", 2])
    expect(out.cutEvents.events.at(-1)!.name).toBe("response.incomplete")
  })

  it("refuses what needs stored state or cannot be served, in OpenAI's error shape", async () => {
    const out = await withSystem("resp-errors", Effect.gen(function* () {
      const { openai, baseUrl } = yield* serveScripted()
      const create = (body: Record<string, unknown>) => failure(() => openai.responses.create({ model: "gyre", input: "hi", ...body } as OpenAI.Responses.ResponseCreateParamsNonStreaming))
      return {
        previous: yield* create({ previous_response_id: "resp_123" }),
        model: yield* create({ model: "other" }),
        itemType: yield* create({ input: [{ type: "mystery_item" }] }),
        reference: yield* create({ input: [{ type: "item_reference", id: "msg_1" }] }),
        image: yield* create({ input: [{ role: "user", content: [{ type: "input_image", image_url: "http://x/y.png", detail: "auto" }] }] }),
        format: yield* create({ text: { format: { type: "json_object" } } }),
        choice: yield* create({ tools: [readFile], tool_choice: { type: "function", name: "write_file" } }),
        badCall: yield* create({ input: [{ type: "function_call", call_id: "c1", name: "f" }] }),
        key: yield* failure(() => new OpenAI({ baseURL: baseUrl, apiKey: "not-a-key", maxRetries: 0 }).responses.create({ model: "gyre", input: "hi" })),
        stored: yield* failure(() => openai.responses.retrieve("resp_123"))
      }
    }))
    const shape = (f: { status: number; body: unknown }) => [f.status, (f.body as { type?: string; param?: string | null }).type, (f.body as { param?: string | null }).param]
    expect(shape(out.previous)).toEqual([400, "invalid_request_error", "previous_response_id"])
    expect(shape(out.model)).toEqual([404, "invalid_request_error", "model"])
    expect(shape(out.itemType)).toEqual([400, "invalid_request_error", "input[0].type"])
    expect(shape(out.reference)).toEqual([400, "invalid_request_error", "input[0]"])
    expect(shape(out.image)).toEqual([400, "invalid_request_error", "input[0].content[0]"])
    expect(shape(out.format)).toEqual([400, "invalid_request_error", "text.format.type"])
    expect(shape(out.choice)).toEqual([400, "invalid_request_error", "tool_choice.name"])
    expect(shape(out.badCall)).toEqual([400, "invalid_request_error", "input[0].arguments"])
    expect(out.stored.status).toBe(404)
    expect([out.key.status, (out.key.body as { code?: string }).code]).toEqual([401, "invalid_api_key"])
  })
})
