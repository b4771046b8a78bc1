/**
 * The OpenAI-compatible HTTP API of the gateway: request schemas, the error format, and the
 * response and stream-chunk documents.
 *
 * Requests are validated with Schema; fields the gateway does not use are ignored, fields it
 * uses must have the documented type (`max_tokens: "abc"` is a 400 naming `max_tokens`).
 * Besides OpenAI's fields the gateway takes vLLM's `ignore_eos` (generate until `max_tokens`
 * or a stop string, for fixed-length benchmarks).
 * Errors are `{"error": {"message", "type", "param", "code"}}` with the HTTP status of the
 * `ApiError`.
 */
import { Effect, Schema, SchemaIssue } from "effect"
import { fieldPath } from "../common/schema-path.ts"
import { ChatRole, messageSchemas, ToolDefinition, type ChatMessage, type ToolCall } from "./messages.ts"

/** An HTTP error answered in the OpenAI error format. */
export class ApiError extends Schema.TaggedError<ApiError>()("ApiError", {
  status: Schema.Number,
  type: Schema.String,
  message: Schema.String,
  param: Schema.NullOr(Schema.String),
  code: Schema.NullOr(Schema.String)
}) {}

export const apiError = (status: number, message: string, options: { readonly param?: string; readonly code?: string; readonly type?: string } = {}) =>
  new ApiError({
    status,
    type: options.type ?? (status >= 500 ? "server_error" : "invalid_request_error"),
    message,
    param: options.param ?? null,
    code: options.code ?? null
  })

/** The 400 of a prompt at or over the context limit (OpenAI's wording and code). */
export const contextLengthExceeded = (limit: number, tokens: number, param: string, atLeast = false) =>
  apiError(400, `This model's maximum context length is ${limit} tokens. However, your request has ${atLeast ? "at least " : ""}${tokens} prompt tokens.`, {
    param,
    code: "context_length_exceeded"
  })

export const errorBody = (e: ApiError) => ({ error: { message: e.message, type: e.type, param: e.param, code: e.code } })

const NonNegativeInt = Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))
const PositiveInt = Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))
const opt = <S extends Schema.Top>(s: S) => Schema.optional(Schema.NullOr(s))

const Stop = opt(Schema.Union([Schema.String, Schema.Array(Schema.String).check(Schema.isMaxLength(4))]))

/** Sampling fields shared by both generation endpoints. */
const samplingFields = {
  model: Schema.String,
  max_tokens: opt(PositiveInt),
  temperature: opt(Schema.Number.check(Schema.isBetween({ minimum: 0, maximum: 2 }))),
  top_p: opt(Schema.Number.check(Schema.isBetween({ minimum: 0, maximum: 1, exclusiveMinimum: true }))),
  stop: Stop,
  seed: opt(Schema.Int),
  stream: opt(Schema.Boolean),
  stream_options: opt(Schema.Struct({ include_usage: opt(Schema.Boolean) })),
  n: opt(PositiveInt),
  /** vLLM's extension: do not end at the end-of-turn / end-of-text tokens (stop strings still apply). */
  ignore_eos: opt(Schema.Boolean)
}

export const ChatCompletionRequest = Schema.Struct({
  ...samplingFields,
  messages: Schema.Array(Schema.Struct({ role: ChatRole })).check(Schema.isMinLength(1)),
  max_completion_tokens: opt(PositiveInt),
  tools: opt(Schema.Array(ToolDefinition)),
  tool_choice: opt(Schema.Union([Schema.Literals(["none", "auto", "required"]), Schema.Struct({ type: Schema.Literal("function"), function: Schema.Struct({ name: Schema.String }) })])),
  parallel_tool_calls: opt(Schema.Boolean),
  response_format: opt(Schema.Struct({ type: Schema.String })),
  logprobs: opt(Schema.Boolean),
  top_logprobs: opt(NonNegativeInt)
})
export type ChatCompletionRequest = typeof ChatCompletionRequest.Type

export const CompletionRequest = Schema.Struct({
  ...samplingFields,
  prompt: Schema.Union([
    Schema.String,
    Schema.Array(Schema.String).check(Schema.isBetweenLength(1, 1)),
    Schema.Array(NonNegativeInt).check(Schema.isMinLength(1)),
    Schema.Array(Schema.Array(NonNegativeInt).check(Schema.isMinLength(1))).check(Schema.isBetweenLength(1, 1))
  ]),
  logprobs: opt(Schema.Int.check(Schema.isBetween({ minimum: 0, maximum: 0 }))),
  echo: opt(Schema.Literal(false))
})
export type CompletionRequest = typeof CompletionRequest.Type

const formatter = SchemaIssue.makeFormatterStandardSchemaV1()

/** `["messages", 0, "content"]` -> `messages[0].content` */
/** Decodes `value` with `schema`, or fails with a 400 naming the first offending field. */
export const decodeBody = <S extends Schema.Top>(schema: S, value: unknown, prefix: ReadonlyArray<PropertyKey> = []): Effect.Effect<S["Type"], ApiError> =>
  Schema.decodeUnknownEffect(schema as unknown as Schema.Codec<S["Type"], unknown>)(value, { errors: "first" }).pipe(
    Effect.mapError((error) => {
      const first = formatter(error.issue).issues[0]
      const param = first !== undefined ? fieldPath([...prefix, ...(first.path ?? [])]) : ""
      const message = first?.message ?? "invalid request body"
      return apiError(400, param === "" ? `Invalid request body: ${message}` : `Invalid value for '${param}': ${message}`, param === "" ? {} : { param })
    })
  )

/**
 * Decodes the messages of a chat request body that `ChatCompletionRequest` accepted (which
 * checked only their roles), each with its role's schema.
 */
export const decodeMessages = (body: unknown): Effect.Effect<Array<ChatMessage>, ApiError> =>
  Effect.forEach((body as { readonly messages: ReadonlyArray<{ readonly role: ChatRole }> }).messages, (m, i) =>
    decodeBody(messageSchemas[m.role], m, ["messages", i]) as Effect.Effect<ChatMessage, ApiError>
  )

/* ---- responses ---- */

export type FinishReason = "stop" | "length" | "tool_calls"

export interface Usage {
  readonly prompt_tokens: number
  readonly completion_tokens: number
  readonly total_tokens: number
  readonly prompt_tokens_details: { readonly cached_tokens: number }
}

export const usageOf = (promptTokens: number, completionTokens: number, cachedTokens: number): Usage => ({
  prompt_tokens: promptTokens,
  completion_tokens: completionTokens,
  total_tokens: promptTokens + completionTokens,
  prompt_tokens_details: { cached_tokens: cachedTokens }
})

export interface TokenLogprob {
  readonly token: string
  readonly logprob: number
  readonly bytes: ReadonlyArray<number>
  readonly top_logprobs: ReadonlyArray<never>
}

export interface ChatChoiceMessage {
  readonly role: "assistant"
  readonly content: string | null
  /** The turn's `<think>` text (vLLM's field), when it has any. */
  readonly reasoning_content?: string
  readonly tool_calls?: ReadonlyArray<ToolCall>
}

export const chatCompletion = (
  id: string,
  created: number,
  model: string,
  message: ChatChoiceMessage,
  finishReason: FinishReason,
  usage: Usage,
  logprobs: ReadonlyArray<TokenLogprob> | null
) => ({
  id,
  object: "chat.completion" as const,
  created,
  model,
  choices: [{ index: 0, message, logprobs: logprobs === null ? null : { content: logprobs }, finish_reason: finishReason }],
  usage
})

/** A streamed tool call: the first delta of a call has its id, type and name, the next ones more of its arguments. */
export interface ToolCallDelta {
  readonly index: number
  readonly id?: string
  readonly type?: "function"
  readonly function: { readonly name?: string; readonly arguments: string }
}

export interface ChunkDelta {
  readonly role?: "assistant"
  readonly content?: string
  readonly reasoning_content?: string
  readonly tool_calls?: ReadonlyArray<ToolCallDelta>
}

export const chatChunk = (
  id: string,
  created: number,
  model: string,
  delta: ChunkDelta,
  finishReason: FinishReason | null,
  logprobs: ReadonlyArray<TokenLogprob> | null
) => ({
  id,
  object: "chat.completion.chunk" as const,
  created,
  model,
  choices: [{ index: 0, delta, logprobs: logprobs === null ? null : { content: logprobs }, finish_reason: finishReason }]
})

export const completion = (id: string, created: number, model: string, text: string, finishReason: FinishReason | null, usage: Usage | undefined) => ({
  id,
  object: "text_completion" as const,
  created,
  model,
  choices: [{ index: 0, text, logprobs: null, finish_reason: finishReason }],
  ...(usage === undefined ? {} : { usage })
})

/** The last chunk of a stream with `stream_options.include_usage`: no choices, the usage. */
export const usageChunk = (id: string, created: number, model: string, object: "chat.completion.chunk" | "text_completion", usage: Usage) => ({
  id,
  object,
  created,
  model,
  choices: [],
  usage
})

/** The served model as both OpenAI's and Anthropic's clients read a model list (each ignores the other's fields). */
export const modelList = (model: string, created: number) => ({
  object: "list" as const,
  data: [{ id: model, object: "model" as const, created, owned_by: "gyre", type: "model" as const, display_name: model, created_at: new Date(created * 1000).toISOString() }],
  has_more: false,
  first_id: model,
  last_id: model
})
