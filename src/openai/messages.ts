/**
 * The chat vocabulary, one definition for the whole of Gyre: OpenAI-style messages (one
 * Schema per role, so a decode error names the field of the role the message claims), their
 * tool calls, and the tool definitions a request offers. The gateway decodes requests with
 * these, the chat template (`chat.ts`) renders them, and the warm start reads its
 * demonstrations with them.
 */
import { Schema } from "effect"

export const TextPart = Schema.Struct({ type: Schema.Literal("text"), text: Schema.String })
export type TextPart = typeof TextPart.Type

export const MessageContent = Schema.Union([Schema.String, Schema.Array(TextPart)])
export type MessageContent = typeof MessageContent.Type

export const ToolCall = Schema.Struct({
  id: Schema.String,
  type: Schema.Literal("function"),
  function: Schema.Struct({ name: Schema.String, arguments: Schema.String })
})
export type ToolCall = typeof ToolCall.Type

export const ToolDefinition = Schema.Struct({
  type: Schema.Literal("function"),
  function: Schema.Struct({ name: Schema.NonEmptyString, description: Schema.optional(Schema.String), parameters: Schema.optional(Schema.Unknown) })
})
export type ToolDefinition = typeof ToolDefinition.Type

export const ChatRole = Schema.Literals(["system", "developer", "user", "assistant", "tool"])
export type ChatRole = typeof ChatRole.Type

const optionalOrNull = <S extends Schema.Top>(s: S) => Schema.optional(Schema.NullOr(s))

/** One schema per role. */
export const messageSchemas = {
  system: Schema.Struct({ role: Schema.Literal("system"), content: MessageContent }),
  developer: Schema.Struct({ role: Schema.Literal("developer"), content: MessageContent }),
  user: Schema.Struct({ role: Schema.Literal("user"), content: MessageContent }),
  assistant: Schema.Struct({
    role: Schema.Literal("assistant"),
    content: optionalOrNull(MessageContent),
    tool_calls: optionalOrNull(Schema.Array(ToolCall)),
    /** The turn's reasoning, as chat responses return it (`reasoning_content`; some clients send `reasoning`). */
    reasoning_content: optionalOrNull(Schema.String),
    reasoning: optionalOrNull(Schema.String)
  }),
  tool: Schema.Struct({ role: Schema.Literal("tool"), content: MessageContent, tool_call_id: Schema.String })
} as const satisfies Record<ChatRole, Schema.Top>

export const ChatMessage = Schema.Union([
  messageSchemas.system,
  messageSchemas.developer,
  messageSchemas.user,
  messageSchemas.assistant,
  messageSchemas.tool
])
export type ChatMessage = typeof ChatMessage.Type
