/**
 * The OpenAI Responses API (`POST /v1/responses`) as the gateway serves it: the request and
 * its input items as Schemas, their conversion to a chat turn (`ChatMessage`s and function
 * tools), and the response object and output items built from a turn's answer.
 *
 * Stateless: nothing is stored (`store` is answered as false), so `previous_response_id`,
 * `conversation`, `background`, `prompt` and `item_reference` items are refused with a 400.
 * Input: a string (one user message) or items: `message` (roles user, system, developer,
 * assistant; text parts), `function_call`, `function_call_output`, `custom_tool_call`,
 * `custom_tool_call_output`, `reasoning`. A maximal run of assistant-side items (reasoning,
 * assistant messages, calls) is one assistant turn, its calls keyed by `call_id`, so a turn
 * the gateway generated renders with its recorded tokens; its reasoning (the items' reasoning
 * text, else their summary, else what the gateway sealed in `encrypted_content`) is the turn's
 * `reasoning_content`. Items of built-in tools (web search,
 * file search, computer, code interpreter, local shell, MCP, image generation) are accepted and
 * left out of the prompt: the model never makes such calls.
 *
 * Tools: `function` (flat form: name, description, parameters) as chat function tools;
 * `custom` (free-form input) as a function with one string parameter `input`, its calls
 * answered as `custom_tool_call` items; built-in tool types are left out of what the model
 * sees (never a 400). `instructions` is a system message before the input.
 */
import { Effect, Schema } from "effect"
import type { ChatMessage, ToolDefinition } from "./messages.ts"
import { apiError, decodeBody, type ApiError } from "./openai.ts"

const opt = <S extends Schema.Top>(s: S) => Schema.optional(Schema.NullOr(s))
const PositiveInt = Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))

export const ResponsesRequest = Schema.Struct({
  model: Schema.String,
  input: Schema.Union([Schema.String, Schema.Array(Schema.Struct({ type: Schema.optional(Schema.String) }))]),
  instructions: opt(Schema.String),
  max_output_tokens: opt(PositiveInt),
  temperature: opt(Schema.Number.check(Schema.isBetween({ minimum: 0, maximum: 2 }))),
  top_p: opt(Schema.Number.check(Schema.isBetween({ minimum: 0, maximum: 1, exclusiveMinimum: true }))),
  tools: opt(Schema.Array(Schema.Struct({ type: Schema.String }))),
  tool_choice: opt(Schema.Unknown),
  parallel_tool_calls: opt(Schema.Boolean),
  stream: opt(Schema.Boolean),
  store: opt(Schema.Boolean),
  previous_response_id: opt(Schema.String),
  conversation: opt(Schema.Unknown),
  background: opt(Schema.Boolean),
  prompt: opt(Schema.Unknown),
  reasoning: opt(Schema.Struct({ effort: opt(Schema.String), summary: opt(Schema.String), generate_summary: opt(Schema.String) })),
  include: opt(Schema.Array(Schema.String)),
  text: opt(Schema.Struct({ format: opt(Schema.Struct({ type: Schema.String })), verbosity: opt(Schema.String) })),
  metadata: opt(Schema.Record(Schema.String, Schema.String)),
  user: opt(Schema.String),
  truncation: opt(Schema.Literals(["auto", "disabled"])),
  top_logprobs: opt(Schema.Int.check(Schema.isBetween({ minimum: 0, maximum: 0 }))),
  max_tool_calls: opt(PositiveInt),
  seed: opt(Schema.Int)
})
export type ResponsesRequest = typeof ResponsesRequest.Type

/** A content part of a message or a tool output: text parts are read, other kinds refused by name. */
const ContentPart = Schema.Struct({ type: Schema.String, text: Schema.optional(Schema.String), refusal: Schema.optional(Schema.String) })
const Content = Schema.Union([Schema.String, Schema.Array(ContentPart)])
type Content = typeof Content.Type
const TextPart = Schema.Struct({ type: Schema.String, text: Schema.String })

const itemSchemas = {
  message: Schema.Struct({ role: Schema.Literals(["user", "assistant", "system", "developer"]), content: Content }),
  function_call: Schema.Struct({ call_id: Schema.NonEmptyString, name: Schema.NonEmptyString, arguments: Schema.String }),
  function_call_output: Schema.Struct({ call_id: Schema.NonEmptyString, output: Content }),
  custom_tool_call: Schema.Struct({ call_id: Schema.NonEmptyString, name: Schema.NonEmptyString, input: Schema.String }),
  custom_tool_call_output: Schema.Struct({ call_id: Schema.NonEmptyString, output: Content }),
  reasoning: Schema.Struct({ summary: opt(Schema.Array(TextPart)), content: opt(Schema.Array(TextPart)), encrypted_content: opt(Schema.String) })
} as const

/** Items of built-in tools: accepted, left out of the prompt. */
const BUILT_IN_ITEMS = new Set([
  "web_search_call",
  "file_search_call",
  "computer_call",
  "computer_call_output",
  "code_interpreter_call",
  "image_generation_call",
  "local_shell_call",
  "local_shell_call_output",
  "shell_call",
  "shell_call_output",
  "apply_patch_call",
  "apply_patch_call_output",
  "mcp_list_tools",
  "mcp_approval_request",
  "mcp_approval_response",
  "mcp_call"
])

/** Text parts read from content (`input_text`, `output_text`, `refusal`); anything else is a 400 naming it. */
const textOfContent = (content: Content, param: string): Effect.Effect<string, ApiError> => {
  if (typeof content === "string") return Effect.succeed(content)
  const texts: Array<string> = []
  for (const [i, part] of content.entries()) {
    const text = part.type === "refusal" ? part.refusal : part.type === "input_text" || part.type === "output_text" || part.type === "text" ? part.text : undefined
    if (text === undefined) {
      const why = ["input_text", "output_text", "refusal", "text"].includes(part.type) ? "has no text" : "is not supported: the model reads text only"
      return Effect.fail(apiError(400, `Content part '${part.type}' ${why}.`, { param: `${param}[${i}]` }))
    }
    texts.push(text)
  }
  return Effect.succeed(texts.join(""))
}

/** The text of a reasoning item: its reasoning text, else its summary, else the text the gateway sealed in its `encrypted_content`. */
export const reasoningTextOf = (item: typeof itemSchemas.reasoning.Type): string => {
  const parts = item.content ?? []
  if (parts.length > 0) return parts.map((p) => p.text).join("")
  const summary = item.summary ?? []
  if (summary.length > 0) return summary.map((p) => p.text).join("\n\n")
  return unsealReasoning(item.encrypted_content ?? "") ?? ""
}

/** An assistant turn being gathered from consecutive items. */
interface PendingTurn {
  content: string
  reasoning: string
  toolCalls: Array<{ id: string; type: "function"; function: { name: string; arguments: string } }>
}

/** The arguments of a custom tool's call as the model sees them: `{"input": <text>}`. */
export const customArguments = (input: string) => JSON.stringify({ input })

/** Chat messages gathered from input items: a maximal run of assistant-side items is one assistant turn. */
class InputMessages {
  readonly messages: Array<ChatMessage> = []
  private turn: PendingTurn | undefined

  /** The assistant turn being gathered (a new one after any other message). */
  pending(): PendingTurn {
    return (this.turn ??= { content: "", reasoning: "", toolCalls: [] })
  }

  /** Ends the assistant turn being gathered, if any. */
  flush() {
    const turn = this.turn
    if (turn !== undefined) {
      this.messages.push({
        role: "assistant",
        content: turn.content === "" ? null : turn.content,
        ...(turn.reasoning === "" ? {} : { reasoning_content: turn.reasoning }),
        ...(turn.toolCalls.length > 0 ? { tool_calls: turn.toolCalls } : {})
      })
    }
    this.turn = undefined
  }

  /** A message of its own after the assistant turn being gathered. */
  push(message: ChatMessage) {
    this.flush()
    this.messages.push(message)
  }
}

/** Reads input item `i` (of type `type`, as sent: `raw`) into `into`. */
const readItem = (into: InputMessages, type: keyof typeof itemSchemas, raw: unknown, i: number): Effect.Effect<void, ApiError> =>
  Effect.gen(function* () {
    const param = `input[${i}]`
    const at = ["input", i]
    switch (type) {
      case "message": {
        const m = yield* decodeBody(itemSchemas.message, raw, at)
        const text = yield* textOfContent(m.content, `${param}.content`)
        if (m.role === "assistant") into.pending().content += text
        else into.push({ role: m.role, content: text })
        return
      }
      case "function_call": {
        const c = yield* decodeBody(itemSchemas.function_call, raw, at)
        return void into.pending().toolCalls.push({ id: c.call_id, type: "function", function: { name: c.name, arguments: c.arguments } })
      }
      case "custom_tool_call": {
        const c = yield* decodeBody(itemSchemas.custom_tool_call, raw, at)
        return void into.pending().toolCalls.push({ id: c.call_id, type: "function", function: { name: c.name, arguments: customArguments(c.input) } })
      }
      case "function_call_output":
      case "custom_tool_call_output": {
        const o = yield* decodeBody(itemSchemas.function_call_output, raw, at)
        return into.push({ role: "tool", content: yield* textOfContent(o.output, `${param}.output`), tool_call_id: o.call_id })
      }
      case "reasoning": {
        into.pending().reasoning += reasoningTextOf(yield* decodeBody(itemSchemas.reasoning, raw, at))
        return
      }
    }
  })

/** The chat messages of a request's instructions and input. */
export const inputMessages = (req: ResponsesRequest, body: unknown): Effect.Effect<Array<ChatMessage>, ApiError> =>
  Effect.gen(function* () {
    const into = new InputMessages()
    if (req.instructions !== null && req.instructions !== undefined && req.instructions !== "") into.messages.push({ role: "system", content: req.instructions })
    if (typeof req.input === "string") {
      into.messages.push({ role: "user", content: req.input })
      return into.messages
    }
    const raw = (body as { readonly input: ReadonlyArray<unknown> }).input
    for (const [i, item] of req.input.entries()) {
      const type = item.type ?? "message"
      if (BUILT_IN_ITEMS.has(type)) continue
      if (type === "item_reference") return yield* Effect.fail(apiError(400, "Item references need stored responses; this gateway stores none: send the items themselves.", { param: `input[${i}]` }))
      if (!Object.hasOwn(itemSchemas, type)) return yield* Effect.fail(apiError(400, `Unknown input item type '${type}'.`, { param: `input[${i}].type` }))
      yield* readItem(into, type as keyof typeof itemSchemas, raw[i], i)
    }
    into.flush()
    return into.messages
  })

/** The tools the model sees, and which of them are custom (free-form) tools. */
export interface ModelTools {
  readonly definitions: ReadonlyArray<ToolDefinition>
  readonly custom: ReadonlySet<string>
}

const FunctionTool = Schema.Struct({ name: Schema.NonEmptyString, description: opt(Schema.String), parameters: opt(Schema.Unknown) })
const CustomTool = Schema.Struct({
  name: Schema.NonEmptyString,
  description: opt(Schema.String),
  format: opt(Schema.Struct({ type: Schema.String, syntax: opt(Schema.String), definition: opt(Schema.String) }))
})

/** A custom tool's description for the model: its own, and the grammar its input follows, if any. */
const customDescription = (t: typeof CustomTool.Type) => {
  const grammar = t.format?.type === "grammar" && t.format.definition ? `\nThe input follows this ${t.format.syntax ?? ""} grammar:\n${t.format.definition}` : ""
  return `${t.description ?? ""}${grammar}\nCall it with one argument, "input": the free-form text input.`.trim()
}

/** Function and custom tools as chat function tools; other (built-in) tool types are left out. */
export const modelTools = (body: unknown, req: ResponsesRequest): Effect.Effect<ModelTools, ApiError> =>
  Effect.gen(function* () {
    const raw = (body as { readonly tools?: ReadonlyArray<unknown> }).tools ?? []
    const definitions: Array<ToolDefinition> = []
    const custom = new Set<string>()
    for (const [i, t] of (req.tools ?? []).entries()) {
      if (t.type === "function") {
        const f = yield* decodeBody(FunctionTool, raw[i], ["tools", i])
        definitions.push({ type: "function", function: { name: f.name, ...(f.description ? { description: f.description } : {}), parameters: f.parameters ?? { type: "object", properties: {} } } })
      } else if (t.type === "custom") {
        const c = yield* decodeBody(CustomTool, raw[i], ["tools", i])
        custom.add(c.name)
        definitions.push({
          type: "function",
          function: { name: c.name, description: customDescription(c), parameters: { type: "object", properties: { input: { type: "string" } }, required: ["input"] } }
        })
      }
    }
    return { definitions, custom }
  })

const ToolChoiceSchema = Schema.Union([
  Schema.Literals(["none", "auto", "required"]),
  Schema.Struct({ type: Schema.Literals(["function", "custom"]), name: Schema.NonEmptyString }),
  Schema.Struct({ type: Schema.Literal("allowed_tools"), mode: Schema.Literals(["auto", "required"]), tools: Schema.Array(Schema.Struct({ type: Schema.String, name: opt(Schema.String) })) }),
  Schema.Struct({ type: Schema.String })
])

/** The tool choice of a request over the tools the model sees: the tools it may call, and how. */
export const toolChoiceOf = (
  value: unknown,
  tools: ModelTools
): Effect.Effect<{ readonly tools: ReadonlyArray<ToolDefinition>; readonly choice: "auto" | "none" | "required" | { readonly name: string } }, ApiError> =>
  Effect.gen(function* () {
    if (value === null || value === undefined) return { tools: tools.definitions, choice: "auto" as const }
    const c = yield* decodeBody(ToolChoiceSchema, value, ["tool_choice"])
    if (typeof c === "string") return { tools: tools.definitions, choice: c }
    if (c.type === "allowed_tools" && "mode" in c) {
      const allowed = new Set(c.tools.flatMap((t) => (t.name === null || t.name === undefined ? [] : [t.name])))
      return { tools: tools.definitions.filter((d) => allowed.has(d.function.name)), choice: c.mode }
    }
    if ("name" in c && typeof c.name === "string") {
      if (!tools.definitions.some((d) => d.function.name === c.name)) {
        return yield* Effect.fail(apiError(400, `tool_choice names '${c.name}', which is not among the tools.`, { param: "tool_choice.name" }))
      }
      return { tools: tools.definitions, choice: { name: c.name } }
    }
    if (c.type === "function" || c.type === "custom") return yield* Effect.fail(apiError(400, `tool_choice of type '${c.type}' needs the tool's name.`, { param: "tool_choice.name" }))
    return yield* Effect.fail(apiError(400, `tool_choice '${c.type}' names a built-in tool the model cannot run; offer it function or custom tools.`, { param: "tool_choice.type" }))
  })

/* ---- output ---- */

export interface OutputText {
  readonly type: "output_text"
  readonly text: string
  readonly annotations: ReadonlyArray<never>
  readonly logprobs?: ReadonlyArray<unknown>
}

export type OutputItem =
  | { readonly type: "message"; readonly id: string; readonly status: "in_progress" | "completed" | "incomplete"; readonly role: "assistant"; readonly content: ReadonlyArray<OutputText> }
  | { readonly type: "function_call"; readonly id: string; readonly call_id: string; readonly name: string; readonly arguments: string; readonly status: "in_progress" | "completed" }
  | { readonly type: "custom_tool_call"; readonly id: string; readonly call_id: string; readonly name: string; readonly input: string; readonly status: "in_progress" | "completed" }
  | {
      readonly type: "reasoning"
      readonly id: string
      readonly summary: ReadonlyArray<never>
      readonly content: ReadonlyArray<{ readonly type: "reasoning_text"; readonly text: string }>
      readonly encrypted_content?: string
      readonly status?: "in_progress" | "completed"
    }

/** The input of a custom tool's call from the arguments the model wrote (`{"input": ...}`, else the arguments as they are). */
export const customInput = (args: string): string => {
  try {
    const value = JSON.parse(args) as unknown
    if (typeof value === "object" && value !== null && typeof (value as { input?: unknown }).input === "string") return (value as { input: string }).input
  } catch {
    // not JSON: the text is the input
  }
  return args
}

const SEALED = "gyre:"

/** Reasoning text sealed as the gateway's `encrypted_content` (`gyre:` and base64: not a secret, only opaque to clients). */
export const sealReasoning = (text: string) => SEALED + Buffer.from(text, "utf8").toString("base64")

/** The text of an `encrypted_content` the gateway sealed; undefined for another's (never read). */
const unsealReasoning = (sealed: string): string | undefined =>
  sealed.startsWith(SEALED) ? Buffer.from(sealed.slice(SEALED.length), "base64").toString("utf8") : undefined

export interface ResponsesUsage {
  readonly input_tokens: number
  readonly input_tokens_details: { readonly cached_tokens: number }
  readonly output_tokens: number
  readonly output_tokens_details: { readonly reasoning_tokens: number }
  readonly total_tokens: number
}

export const responsesUsage = (promptTokens: number, outputTokens: number, cachedTokens: number): ResponsesUsage => ({
  input_tokens: promptTokens,
  input_tokens_details: { cached_tokens: cachedTokens },
  output_tokens: outputTokens,
  output_tokens_details: { reasoning_tokens: 0 },
  total_tokens: promptTokens + outputTokens
})

export type ResponseStatus = "in_progress" | "completed" | "incomplete" | "failed"

/** What every response object of one request repeats: its id, creation time (Unix seconds), model, the request and its tools as sent. */
export interface ResponseBase {
  readonly id: string
  readonly createdAt: number
  readonly model: string
  readonly req: ResponsesRequest
  readonly tools: ReadonlyArray<unknown>
}

/** The response object: the request's settings as used, its output, status and usage. */
export const responseObject = (
  base: ResponseBase,
  state: {
    readonly status: ResponseStatus
    readonly output: ReadonlyArray<OutputItem>
    readonly usage: ResponsesUsage | null
    readonly error?: { readonly code: string; readonly message: string }
  }
) => {
  const { req } = base
  return {
    id: base.id,
    object: "response" as const,
    created_at: base.createdAt,
    status: state.status,
    background: false,
    error: state.error ?? null,
    incomplete_details: state.status === "incomplete" ? { reason: "max_output_tokens" as const } : null,
    instructions: req.instructions ?? null,
    max_output_tokens: req.max_output_tokens ?? null,
    metadata: req.metadata ?? {},
    model: base.model,
    output: state.output,
    parallel_tool_calls: req.parallel_tool_calls ?? true,
    previous_response_id: null,
    reasoning: { effort: req.reasoning?.effort ?? null, summary: req.reasoning?.summary ?? null },
    store: false,
    temperature: req.temperature ?? 1,
    text: { format: { type: "text" as const } },
    tool_choice: req.tool_choice ?? "auto",
    tools: base.tools,
    top_p: req.top_p ?? 1,
    truncation: "disabled" as const,
    usage: state.usage,
    user: req.user ?? null
  }
}
