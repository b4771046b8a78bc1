/**
 * The Anthropic Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`) as the
 * gateway serves it: the request and its content blocks as Schemas, their conversion to a chat
 * turn (`ChatMessage`s and function tools), the message documents built from a turn's answer,
 * and Anthropic's error shape.
 *
 * Requests: `system` as a string or text blocks (a system message); `messages` of roles user
 * and assistant (and system: a system message where it stands, text only) with a string or blocks: `text`, `tool_use` (an assistant tool call, keyed by
 * its `id`, so a turn the gateway generated renders with its recorded tokens), `tool_result`
 * (a tool message, its content a string or text blocks; `is_error` prefixes "Error: "),
 * `thinking` (the assistant turn's `reasoning_content`) and `redacted_thinking` (accepted; its
 * data is opaque). A turn the gateway generated renders from its recorded tokens. Server-tool blocks (`server_tool_use`,
 * `web_search_tool_result`, ...) are accepted and left out of the prompt; images and documents
 * are refused (the model reads text only). Tools with `input_schema` are function tools;
 * Anthropic-defined tool types (bash, text editor, web search, computer, ...) and tools marked
 * `defer_loading` (loaded on demand by a tool search the gateway does not run) are left out of
 * what the model sees. `tool_choice` auto / any / tool / none (and `disable_parallel_tool_use`),
 * `stop_sequences`, `temperature`, `top_p`, `metadata`, `thinking`, `cache_control`, the
 * `anthropic-version` and `anthropic-beta` headers are accepted; `top_k` is refused (the
 * workers sample with temperature and top-p only).
 *
 * Errors: `{"type": "error", "error": {"type", "message"}}`, the type from the HTTP status
 * (400 invalid_request_error, 401 authentication_error, 403 permission_error, 404
 * not_found_error, 413 request_too_large, 429 rate_limit_error, 503 overloaded_error, other
 * 5xx api_error); mid-stream as an `error` event.
 */
import { Effect, Schema } from "effect"
import { fieldPath } from "../common/schema-path.ts"
import type { ChatMessage, ToolDefinition } from "./messages.ts"
import { apiError, decodeBody, type ApiError } from "./openai.ts"

const opt = <S extends Schema.Top>(s: S) => Schema.optional(Schema.NullOr(s))
const PositiveInt = Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))

const Block = Schema.Struct({ type: Schema.String })
const Content = Schema.Union([Schema.String, Schema.Array(Block)])
const TextBlock = Schema.Struct({ type: Schema.Literal("text"), text: Schema.String })

const ToolChoice = Schema.Union([
  Schema.Struct({ type: Schema.Literals(["auto", "any", "none"]), disable_parallel_tool_use: opt(Schema.Boolean) }),
  Schema.Struct({ type: Schema.Literal("tool"), name: Schema.NonEmptyString, disable_parallel_tool_use: opt(Schema.Boolean) })
])

/** The fields of a Messages request that render the prompt (all a count_tokens request has). */
const promptFields = {
  model: Schema.String,
  messages: Schema.Array(Schema.Struct({ role: Schema.Literals(["user", "assistant", "system"]), content: Content })).check(Schema.isMinLength(1)),
  system: opt(Schema.Union([Schema.String, Schema.Array(TextBlock)])),
  tools: opt(Schema.Array(Schema.Struct({ name: Schema.String, type: opt(Schema.String), defer_loading: opt(Schema.Boolean) }))),
  tool_choice: opt(ToolChoice),
  thinking: opt(Schema.Struct({ type: Schema.Literals(["enabled", "disabled", "adaptive"]), budget_tokens: opt(PositiveInt) }))
}

export const CountTokensRequest = Schema.Struct(promptFields)
export type CountTokensRequest = typeof CountTokensRequest.Type

export const MessagesRequest = Schema.Struct({
  ...promptFields,
  max_tokens: PositiveInt,
  stop_sequences: opt(Schema.Array(Schema.String)),
  stream: opt(Schema.Boolean),
  temperature: opt(Schema.Number.check(Schema.isBetween({ minimum: 0, maximum: 1 }))),
  top_p: opt(Schema.Number.check(Schema.isBetween({ minimum: 0, maximum: 1, exclusiveMinimum: true }))),
  top_k: opt(Schema.Int),
  metadata: opt(Schema.Struct({ user_id: opt(Schema.String) })),
  service_tier: opt(Schema.String)
})
export type MessagesRequest = typeof MessagesRequest.Type

const blockSchemas = {
  text: TextBlock,
  tool_use: Schema.Struct({ id: Schema.NonEmptyString, name: Schema.NonEmptyString, input: Schema.Unknown }),
  tool_result: Schema.Struct({
    tool_use_id: Schema.NonEmptyString,
    content: Schema.optional(Schema.Union([Schema.String, Schema.Array(Schema.Struct({ type: Schema.String, text: Schema.optional(Schema.String) }))])),
    is_error: opt(Schema.Boolean)
  }),
  thinking: Schema.Struct({ thinking: Schema.String, signature: opt(Schema.String) }),
  redacted_thinking: Schema.Struct({ data: Schema.String })
} as const

/** Blocks of server tools: accepted, left out of the prompt (the model never makes such calls). */
const SERVER_BLOCKS = new Set(["server_tool_use", "web_search_tool_result", "web_fetch_tool_result", "code_execution_tool_result", "bash_code_execution_tool_result", "text_editor_code_execution_tool_result", "mcp_tool_use", "mcp_tool_result", "container_upload"])

type BlockType = keyof typeof blockSchemas

/** Decodes block `j` of message `i` as its type's schema; undefined for server-tool blocks; a 400 for other kinds. */
const decodeBlock = (raw: unknown, type: string, at: ReadonlyArray<PropertyKey>) => {
  if (SERVER_BLOCKS.has(type)) return Effect.succeed(undefined)
  const param = fieldPath(at)
  if (type === "image" || type === "document" || type === "search_result") return Effect.fail(apiError(400, `Content block '${type}' is not supported: the model reads text only.`, { param: `${param}.type` }))
  if (!Object.hasOwn(blockSchemas, type)) return Effect.fail(apiError(400, `Unknown content block type '${type}'.`, { param: `${param}.type` }))
  return Effect.map(decodeBody(blockSchemas[type as BlockType], raw, at), (b) => ({ type: type as BlockType, block: b }) as { readonly type: BlockType; readonly block: Record<string, unknown> })
}

/** The text of a tool result's or a system message's content: a string, or its text blocks (other kinds are a 400). */
const textBlocks = (content: unknown, at: ReadonlyArray<PropertyKey>): Effect.Effect<string, ApiError> => {
  if (content === undefined) return Effect.succeed("")
  if (typeof content === "string") return Effect.succeed(content)
  const parts = content as ReadonlyArray<{ readonly type: string; readonly text?: string }>
  const bad = parts.findIndex((p) => p.type !== "text" || p.text === undefined)
  if (bad >= 0) {
    const kind = parts[bad]!.type
    const why = kind === "text" ? "A text block needs its text." : `Only text blocks are read here; '${kind}' is not supported: the model reads text only.`
    return Effect.fail(apiError(400, why, { param: fieldPath([...at, bad, kind === "text" ? "text" : "type"]) }))
  }
  return Effect.succeed(parts.map((p) => p.text!).join("\n"))
}

/** One user message's blocks: its text as user messages, its tool results as tool messages, in order. */
const userMessages = (blocks: ReadonlyArray<{ readonly type: string }>, i: number): Effect.Effect<Array<ChatMessage>, ApiError> =>
  Effect.gen(function* () {
    const out: Array<ChatMessage> = []
    let text: Array<string> = []
    const flush = () => {
      if (text.length > 0) out.push({ role: "user", content: text.join("") })
      text = []
    }
    for (const [j, raw] of blocks.entries()) {
      const at = ["messages", i, "content", j]
      const d = yield* decodeBlock(raw, raw.type, at)
      if (d === undefined) continue
      if (d.type === "text") text.push(d.block.text as string)
      else if (d.type === "tool_result") {
        flush()
        const content = yield* textBlocks(d.block.content, [...at, "content"])
        out.push({ role: "tool", content: d.block.is_error === true ? `Error: ${content}` : content, tool_call_id: d.block.tool_use_id as string })
      } else return yield* Effect.fail(apiError(400, `A user message cannot hold a '${d.type}' block.`, { param: `messages[${i}].content[${j}].type` }))
    }
    flush()
    return out
  })

/** One assistant message's blocks as one assistant turn: its text, its thinking (`reasoning_content`) and its tool calls. */
const assistantMessage = (blocks: ReadonlyArray<{ readonly type: string }>, i: number): Effect.Effect<ChatMessage, ApiError> =>
  Effect.gen(function* () {
    let content = ""
    let reasoning = ""
    const toolCalls: Array<{ id: string; type: "function"; function: { name: string; arguments: string } }> = []
    for (const [j, raw] of blocks.entries()) {
      const d = yield* decodeBlock(raw, raw.type, ["messages", i, "content", j])
      if (d === undefined) continue
      if (d.type === "text") content += d.block.text as string
      else if (d.type === "thinking") reasoning += d.block.thinking as string
      else if (d.type === "tool_use") toolCalls.push({ id: d.block.id as string, type: "function", function: { name: d.block.name as string, arguments: JSON.stringify(d.block.input ?? {}) } })
      else if (d.type === "tool_result") return yield* Effect.fail(apiError(400, "An assistant message cannot hold a 'tool_result' block.", { param: `messages[${i}].content[${j}].type` }))
    }
    return {
      role: "assistant",
      content: content === "" ? null : content,
      ...(reasoning === "" ? {} : { reasoning_content: reasoning }),
      ...(toolCalls.length > 0 ? { tool_calls: toolCalls } : {})
    }
  })

/** The chat messages of a request's system prompt and messages (`body`: the request as sent, its blocks undecoded). */
export const requestMessages = (req: CountTokensRequest, body: unknown): Effect.Effect<Array<ChatMessage>, ApiError> =>
  Effect.gen(function* () {
    const raw = (body as { readonly messages: ReadonlyArray<{ readonly content: ReadonlyArray<{ readonly type: string }> }> }).messages
    const out: Array<ChatMessage> = []
    const system = req.system === null || req.system === undefined ? "" : typeof req.system === "string" ? req.system : req.system.map((b) => b.text).join("\n")
    if (system !== "") out.push({ role: "system", content: system })
    for (const [i, m] of req.messages.entries()) {
      if (typeof m.content === "string") out.push({ role: m.role, content: m.content })
      else if (m.role === "user") out.push(...(yield* userMessages(raw[i]!.content, i)))
      else if (m.role === "system") out.push({ role: "system", content: yield* textBlocks(raw[i]!.content, ["messages", i, "content"]) })
      else out.push(yield* assistantMessage(raw[i]!.content, i))
    }
    return out
  })

const CustomTool = Schema.Struct({ name: Schema.NonEmptyString, description: opt(Schema.String), input_schema: Schema.Unknown })

/** Tools with an `input_schema` (type absent or "custom") as function tools; Anthropic-defined tool types and deferred tools (`defer_loading`) are left out. */
export const requestTools = (req: CountTokensRequest, body: unknown): Effect.Effect<Array<ToolDefinition>, ApiError> =>
  Effect.gen(function* () {
    const raw = (body as { readonly tools?: ReadonlyArray<unknown> }).tools ?? []
    const out: Array<ToolDefinition> = []
    for (const [i, t] of (req.tools ?? []).entries()) {
      if ((t.type !== null && t.type !== undefined && t.type !== "custom") || t.defer_loading === true) continue
      const tool = yield* decodeBody(CustomTool, raw[i], ["tools", i])
      out.push({ type: "function", function: { name: tool.name, ...(tool.description ? { description: tool.description } : {}), parameters: tool.input_schema } })
    }
    return out
  })

/** The request's tool choice: how the model may call tools, and whether several calls at once. */
export const toolChoiceOf = (
  req: CountTokensRequest,
  tools: ReadonlyArray<ToolDefinition>
): Effect.Effect<{ readonly choice: "auto" | "none" | "required" | { readonly name: string }; readonly parallel: boolean }, ApiError> => {
  const c = req.tool_choice
  const parallel = c?.disable_parallel_tool_use !== true
  if (c === null || c === undefined || c.type === "auto") return Effect.succeed({ choice: "auto" as const, parallel })
  if (c.type === "none") return Effect.succeed({ choice: "none" as const, parallel })
  if (c.type === "any" || !("name" in c)) return Effect.succeed({ choice: "required" as const, parallel })
  if (!tools.some((t) => t.function.name === c.name)) return Effect.fail(apiError(400, `tool_choice names '${c.name}', which is not among the tools.`, { param: "tool_choice.name" }))
  return Effect.succeed({ choice: { name: c.name }, parallel })
}

/* ---- output ---- */

export type ContentBlock =
  | { readonly type: "thinking"; readonly thinking: string; readonly signature: string }
  | { readonly type: "text"; readonly text: string }
  | { readonly type: "tool_use"; readonly id: string; readonly name: string; readonly input: unknown }

export type StopReason = "end_turn" | "max_tokens" | "stop_sequence" | "tool_use"

/** The signature of a thinking block the gateway wrote (nothing is signed: it marks the block as Gyre's). */
export const THINKING_SIGNATURE = "gyre"

/** A tool call's input: the arguments object the model wrote, else `{"arguments": <text>}`. */
export const toolInput = (args: string): unknown => {
  try {
    const value = JSON.parse(args) as unknown
    if (typeof value === "object" && value !== null && !Array.isArray(value)) return value
  } catch {
    // not JSON: kept as text below
  }
  return { arguments: args }
}

export interface MessagesUsage {
  readonly input_tokens: number
  readonly cache_creation_input_tokens: number
  readonly cache_read_input_tokens: number
  readonly output_tokens: number
}

/** Usage as Anthropic counts it: prompt tokens found in the worker's cache are cache reads, the rest input. */
export const messagesUsage = (promptTokens: number, outputTokens: number, cachedTokens: number): MessagesUsage => ({
  input_tokens: promptTokens - cachedTokens,
  cache_creation_input_tokens: 0,
  cache_read_input_tokens: cachedTokens,
  output_tokens: outputTokens
})

export const message = (
  id: string,
  model: string,
  content: ReadonlyArray<ContentBlock>,
  stop: { readonly reason: StopReason | null; readonly sequence: string | null },
  usage: MessagesUsage
) => ({ id, type: "message" as const, role: "assistant" as const, model, content, stop_reason: stop.reason, stop_sequence: stop.sequence, usage })

/* ---- errors ---- */

const errorTypeOf = (status: number): string =>
  ({ 400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error" })[status] ??
  (status >= 500 ? "api_error" : "invalid_request_error")

export const anthropicErrorBody = (e: ApiError) => ({ type: "error" as const, error: { type: errorTypeOf(e.status), message: e.message } })
