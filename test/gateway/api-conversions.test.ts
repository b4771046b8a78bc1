/**
 * The Responses and Messages requests as chat turns (pure): items and blocks grouped into
 * the messages a chat template renders, reasoning carried as the turn's `reasoning_content`
 * (the gateway's sealed `encrypted_content` read back, another's never), custom and built-in
 * tools, and the tool choices.
 */
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { CountTokensRequest, MessagesRequest, requestMessages, requestTools, toolChoiceOf as anthropicChoice } from "../../src/openai/anthropic.ts"
import { decodeBody } from "../../src/openai/openai.ts"
import { ResponsesRequest, customInput, inputMessages, modelTools, sealReasoning, toolChoiceOf } from "../../src/openai/responses.ts"

const run = <A, E>(e: Effect.Effect<A, E>) => Effect.runPromise(Effect.result(e))

describe("Responses requests as chat turns", () => {
  it("groups a run of assistant-side items into one turn with its reasoning, calls keyed by call_id", async () => {
    const body = {
      model: "gyre",
      instructions: "Be brief.",
      input: [
        { role: "user", content: "go" },
        { type: "reasoning", id: "rs_1", summary: [], encrypted_content: sealReasoning("I will read it.") },
        { type: "message", role: "assistant", content: [{ type: "output_text", text: "Reading." }] },
        { type: "function_call", call_id: "call_1", name: "read_file", arguments: '{"path":"a"}' },
        { type: "custom_tool_call", call_id: "call_2", name: "patch", input: "*** Begin" },
        { type: "function_call_output", call_id: "call_1", output: "A" },
        { type: "custom_tool_call_output", call_id: "call_2", output: [{ type: "input_text", text: "ok" }] },
        { type: "web_search_call", id: "ws_1" },
        { type: "reasoning", id: "rs_2", summary: [], encrypted_content: "b3BhcXVl" },
        { role: "assistant", content: "Done." }
      ]
    }
    const req = await Effect.runPromise(decodeBody(ResponsesRequest, body))
    const messages = await Effect.runPromise(inputMessages(req, body))
    expect(messages).toEqual([
      { role: "system", content: "Be brief." },
      { role: "user", content: "go" },
      {
        role: "assistant",
        content: "Reading.",
        reasoning_content: "I will read it.",
        tool_calls: [
          { id: "call_1", type: "function", function: { name: "read_file", arguments: '{"path":"a"}' } },
          { id: "call_2", type: "function", function: { name: "patch", arguments: '{"input":"*** Begin"}' } }
        ]
      },
      { role: "tool", content: "A", tool_call_id: "call_1" },
      { role: "tool", content: "ok", tool_call_id: "call_2" },
      // another's encrypted reasoning is never read
      { role: "assistant", content: "Done." }
    ])
    expect(customInput('{"input":"*** Begin"}')).toBe("*** Begin")
    expect(customInput("not json")).toBe("not json")
  })

  it("shows function and custom tools, leaves built-in ones out, and narrows or names the tool choice", async () => {
    const body = { model: "gyre", input: "x", tools: [{ type: "function", name: "f", parameters: { type: "object" } }, { type: "custom", name: "g", format: { type: "grammar", syntax: "lark", definition: "start: /.+/" } }, { type: "web_search" }, { type: "namespace", name: "ns", tools: [] }] }
    const req = await Effect.runPromise(decodeBody(ResponsesRequest, body))
    const tools = await Effect.runPromise(modelTools(body, req))
    expect(tools.definitions.map((t) => t.function.name)).toEqual(["f", "g"])
    expect([...tools.custom]).toEqual(["g"])
    expect(tools.definitions[1]!.function.description).toContain("start: /.+/")
    const allowed = await Effect.runPromise(toolChoiceOf({ type: "allowed_tools", mode: "required", tools: [{ type: "function", name: "g" }] }, tools))
    expect([allowed.choice, allowed.tools.map((t) => t.function.name)]).toEqual(["required", ["g"]])
    expect((await Effect.runPromise(toolChoiceOf({ type: "custom", name: "g" }, tools))).choice).toEqual({ name: "g" })
    const builtIn = await run(toolChoiceOf({ type: "web_search" }, tools))
    expect(builtIn._tag === "Failure" && builtIn.failure.param).toBe("tool_choice.type")
  })
})

describe("Messages requests as chat turns", () => {
  it("splits a user message into tool results and text, joins an assistant message's blocks into one turn with its thinking", async () => {
    const body = {
      model: "gyre",
      system: [{ type: "text", text: "Be brief.", cache_control: { type: "ephemeral" } }],
      messages: [
        { role: "user", content: "go" },
        {
          role: "assistant",
          content: [
            { type: "thinking", thinking: "I will read it.", signature: "x" },
            { type: "redacted_thinking", data: "opaque" },
            { type: "text", text: "Reading." },
            { type: "tool_use", id: "toolu_1", name: "read_file", input: { path: "a" } },
            { type: "server_tool_use", id: "srv_1", name: "web_search", input: {} }
          ]
        },
        { role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_1", content: [{ type: "text", text: "A" }], is_error: true }, { type: "text", text: "And now?" }] }
      ],
      tools: [{ name: "read_file", input_schema: { type: "object" } }, { type: "bash_20250124", name: "bash" }],
      tool_choice: { type: "any", disable_parallel_tool_use: true }
    }
    const req = await Effect.runPromise(decodeBody(CountTokensRequest, body))
    expect(await Effect.runPromise(requestMessages(req, body))).toEqual([
      { role: "system", content: "Be brief." },
      { role: "user", content: "go" },
      { role: "assistant", content: "Reading.", reasoning_content: "I will read it.", tool_calls: [{ id: "toolu_1", type: "function", function: { name: "read_file", arguments: '{"path":"a"}' } }] },
      { role: "tool", content: "Error: A", tool_call_id: "toolu_1" },
      { role: "user", content: "And now?" }
    ])
    const tools = await Effect.runPromise(requestTools(req, body))
    expect(tools.map((t) => t.function.name)).toEqual(["read_file"])
    expect(await Effect.runPromise(anthropicChoice(req, tools))).toEqual({ choice: "required", parallel: false })
  })

  it("takes Claude Code's requests as it sends them (2.1.337: a system message after the prompt, a deferred tool, adaptive thinking)", async () => {
    // The shape of `claude -p --tools Write` after a Write call (suites/agent-cli), trimmed.
    const ephemeral = { type: "ephemeral" }
    const body = {
      model: "gyre",
      messages: [
        { role: "user", content: "Create greeting.txt" },
        { role: "system", content: [{ type: "text", text: "# Environment\n - Primary working directory: /w", cache_control: ephemeral }] },
        { role: "assistant", content: [{ type: "tool_use", id: "toolu_01", name: "Write", input: { file_path: "/w/greeting.txt", content: "hi" } }] },
        { role: "user", content: [{ tool_use_id: "toolu_01", type: "tool_result", content: "File created successfully at: /w/greeting.txt", cache_control: ephemeral }] }
      ],
      system: [
        { type: "text", text: "x-anthropic-billing-header: cc_version=2.1.337.433; cc_entrypoint=sdk-cli;" },
        { type: "text", text: "You write files.", cache_control: ephemeral }
      ],
      tools: [
        { name: "DeferredToolPlaceholder", description: "never call this tool", input_schema: { type: "object", properties: {} }, defer_loading: true },
        { name: "Write", description: "Writes a file.", input_schema: { type: "object", properties: { file_path: { type: "string" }, content: { type: "string" } }, required: ["file_path", "content"], additionalProperties: false } }
      ],
      metadata: { user_id: '{"device_id":"d","account_uuid":"","session_id":"s"}' },
      max_tokens: 32000,
      thinking: { type: "adaptive", display: "omitted" },
      context_management: { edits: [{ type: "clear_thinking_20251015", keep: "all" }] },
      output_config: { effort: "high" },
      stream: true
    }
    const req = await Effect.runPromise(decodeBody(MessagesRequest, body))
    expect(await Effect.runPromise(requestMessages(req, body))).toEqual([
      { role: "system", content: "x-anthropic-billing-header: cc_version=2.1.337.433; cc_entrypoint=sdk-cli;\nYou write files." },
      { role: "user", content: "Create greeting.txt" },
      { role: "system", content: "# Environment\n - Primary working directory: /w" },
      { role: "assistant", content: null, tool_calls: [{ id: "toolu_01", type: "function", function: { name: "Write", arguments: '{"file_path":"/w/greeting.txt","content":"hi"}' } }] },
      { role: "tool", content: "File created successfully at: /w/greeting.txt", tool_call_id: "toolu_01" }
    ])
    expect((await Effect.runPromise(requestTools(req, body))).map((t) => t.function.name)).toEqual(["Write"])
  })

  it("refuses images and misplaced blocks by their place", async () => {
    const refused = async (messages: unknown) => {
      const body = { model: "gyre", messages }
      const req = await Effect.runPromise(decodeBody(CountTokensRequest, body))
      const r = await run(requestMessages(req, body))
      return r._tag === "Failure" ? [r.failure.status, r.failure.param] : ["ok"]
    }
    expect(await refused([{ role: "user", content: [{ type: "image", source: {} }] }])).toEqual([400, "messages[0].content[0].type"])
    expect(await refused([{ role: "user", content: [{ type: "tool_result", tool_use_id: "t", content: [{ type: "image" }] }] }])).toEqual([400, "messages[0].content[0].content[0].type"])
    expect(await refused([{ role: "assistant", content: [{ type: "tool_result", tool_use_id: "t" }] }])).toEqual([400, "messages[0].content[0].type"])
    expect(await refused([{ role: "user", content: [{ type: "tool_use", id: "t", name: "f", input: {} }] }])).toEqual([400, "messages[0].content[0].type"])
  })
})
