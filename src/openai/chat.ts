/**
 * Chat rendering and tool calls: OpenAI-style messages (`messages.ts`) -> prompt token ids,
 * and generated text -> content + tool calls.
 *
 * `ChatFormat` is what the gateway needs of a model: its tokenizer, how a request renders to
 * prompt ids, and the ids that end its turn. Two implement it: `gyreChat` below (the presets)
 * and a checkpoint's own tokenizer.json and Jinja chat_template (`hf-chat.ts`).
 *
 * Gyre's chat template (over the byte-level tokenizer's special tokens,
 * `src/engine/tokenizer.ts`): `<|bos|>`, then per message `<|role|>` content bytes `<|end|>`;
 * the prompt ends with `<|assistant|>`, and the model's turn ends at `<|end|>`. `developer`
 * messages render as `system`. When the request offers tools, a first `<|system|>` turn
 * lists them (one JSON object per line inside `<tools>...</tools>`) and says how to call one.
 *
 * Tool-call format: the model writes each call as text,
 *
 *   <tool_call>{"name": "read_file", "arguments": {"path": "a.txt"}}</tool_call>
 *
 * anywhere in its turn. A block whose JSON has a string `name` and an object (or string)
 * `arguments` becomes an OpenAI tool call (`arguments` as JSON text); other text, and blocks
 * that do not parse, stay content.
 *
 * Exact prompts (`AssistantTurns`): a harness sends its history back as text, maybe
 * re-formatted (arguments JSON re-serialised, content trimmed, invalid UTF-8 replaced), so
 * rendering that text would give other tokens than the ones the model generated and the
 * execution's prefix tree would branch at every turn. The gateway therefore remembers the
 * raw output tokens of each assistant turn it produced, keyed by its tool-call ids (a turn
 * with tool calls) or by the exact content string it returned (a turn without), and renders
 * a history message that matches a remembered turn with those tokens.
 */
import type { Effect } from "effect"
import { byteTokenizer, special, type Tokenizer } from "../engine/tokenizer.ts"
import type { ChatMessage, MessageContent, ToolCall, ToolDefinition } from "./messages.ts"
import { promptWithin, renderPieces, type PromptPiece, type PromptTooLong } from "./prompt.ts"

type Render<A> = (messages: ReadonlyArray<ChatMessage>, tools: ReadonlyArray<ToolDefinition>, turns: AssistantTurns | undefined) => A

/** A model's chat face: tokenizer, template, end-of-turn ids. */
export interface ChatFormat {
  readonly tokenizer: Tokenizer
  /** A chat request's prompt as pieces (`prompt.ts`), ending where the assistant's turn begins. */
  readonly pieces: Render<Array<PromptPiece>>
  /** The prompt's ids. */
  readonly render: Render<Int32Array>
  /** The prompt's ids when fewer than `limit` (undefined: no limit), counted without blocking the event loop for long. */
  readonly prompt: (
    messages: ReadonlyArray<ChatMessage>,
    tools: ReadonlyArray<ToolDefinition>,
    turns: AssistantTurns | undefined,
    limit: number | undefined
  ) => Effect.Effect<Int32Array, PromptTooLong>
  /** Ids that end the model's turn (chat generation stops at them unless ignore_eos). */
  readonly stopIds: ReadonlyArray<number>
  /** Ids that end a plain-text completion (its eos). */
  readonly eosIds: ReadonlyArray<number>
  /** The id a plain-text completion prompt starts with, if the model has one. */
  readonly bos: number | undefined
}

/** A chat format over its tokenizer and prompt pieces (`render` and `prompt` encode them). */
export const chatFormat = (fields: Omit<ChatFormat, "render" | "prompt">): ChatFormat => ({
  ...fields,
  render: (messages, tools, turns) => renderPieces(fields.tokenizer, fields.pieces(messages, tools, turns)),
  prompt: (messages, tools, turns, limit) => promptWithin(fields.tokenizer, fields.pieces(messages, tools, turns), limit)
})

export const TOOL_CALL_OPEN = "<tool_call>"
export const TOOL_CALL_CLOSE = "</tool_call>"

export const textOf = (content: MessageContent | null | undefined): string =>
  content === null || content === undefined ? "" : typeof content === "string" ? content : content.map((p) => p.text).join("")

/** The system turn that offers the tools. */
export const toolsPrompt = (tools: ReadonlyArray<ToolDefinition>): string =>
  [
    "# Tools",
    "",
    "You may call one or more of these functions. Their signatures (JSON):",
    "<tools>",
    ...tools.map((t) => JSON.stringify(t)),
    "</tools>",
    "",
    `To call a function, write ${TOOL_CALL_OPEN}{"name": <function name>, "arguments": <arguments as a JSON object>}${TOOL_CALL_CLOSE}.`
  ].join("\n")

/** The canonical text of a tool call the gateway did not generate itself. */
export const canonicalToolCall = (call: ToolCall): string => {
  let args: unknown = call.function.arguments
  try {
    args = JSON.parse(call.function.arguments)
  } catch {
    // not JSON: keep the string
  }
  return `${TOOL_CALL_OPEN}${JSON.stringify({ name: call.function.name, arguments: args })}${TOOL_CALL_CLOSE}`
}

/**
 * Raw output tokens of the assistant turns the gateway produced for one execution (see the
 * module comment). Bounded: the oldest turns are forgotten first.
 */
export class AssistantTurns {
  private readonly byToolCall = new Map<string, { readonly ids: ReadonlyArray<string>; readonly tokens: Int32Array }>()
  private readonly byContent = new Map<string, Int32Array>()

  constructor(private readonly capacity = 4096) {}

  /** Remembers a turn: its tool calls' ids (in order), or else the content string returned. */
  remember(tokens: Int32Array, toolCallIds: ReadonlyArray<string>, content: string): void {
    if (toolCallIds.length > 0) {
      const entry = { ids: toolCallIds, tokens }
      for (const id of toolCallIds) bounded(this.byToolCall, id, entry, this.capacity)
    } else {
      bounded(this.byContent, content, tokens, this.capacity)
    }
  }

  /** The raw tokens of a history message, when it is a turn this gateway produced. */
  lookup(message: Extract<ChatMessage, { role: "assistant" }>): Int32Array | undefined {
    const calls = message.tool_calls ?? []
    if (calls.length > 0) {
      const entry = this.byToolCall.get(calls[0]!.id)
      return entry !== undefined && entry.ids.length === calls.length && entry.ids.every((id, i) => calls[i]!.id === id) ? entry.tokens : undefined
    }
    return this.byContent.get(textOf(message.content))
  }
}

const bounded = <K, V>(map: Map<K, V>, key: K, value: V, capacity: number) => {
  map.delete(key)
  map.set(key, value)
  if (map.size > capacity) map.delete(map.keys().next().value as K)
}

/** The pieces of Gyre's template: special ids around each message's text, ending with `<|assistant|>`. */
const gyrePieces: Render<Array<PromptPiece>> = (messages, tools, turns) => {
  const pieces: Array<PromptPiece> = [[special.bos]]
  if (tools.length > 0) pieces.push([special.system], toolsPrompt(tools), [special.end])
  for (const m of messages) {
    if (m.role === "assistant") {
      pieces.push([special.assistant])
      const raw = turns?.lookup(m)
      if (raw !== undefined) pieces.push(raw)
      else pieces.push([textOf(m.content), ...(m.tool_calls ?? []).map(canonicalToolCall)].filter((p) => p !== "").join("\n"))
      if (raw === undefined || raw[raw.length - 1] !== special.end) pieces.push([special.end])
    } else {
      pieces.push([m.role === "developer" ? special.system : special[m.role]], textOf(m.content), [special.end])
    }
  }
  pieces.push([special.assistant])
  return pieces
}

export interface ParsedToolCall {
  readonly name: string
  readonly arguments: string
  /** The block as the model wrote it, `<tool_call>` to `</tool_call>`. */
  readonly raw: string
}

export interface ParsedTurn {
  /** Text outside the tool-call blocks. */
  readonly content: string
  readonly toolCalls: ReadonlyArray<ParsedToolCall>
}

const BLOCK = /<tool_call>([\s\S]*?)<\/tool_call>/g

/** Splits generated text into content and tool calls (format in the module comment). */
export const parseToolCalls = (text: string): ParsedTurn => {
  const toolCalls: Array<ParsedToolCall> = []
  let content = ""
  let at = 0
  for (const match of text.matchAll(BLOCK)) {
    const call = parseCall(match[1]!)
    if (call === undefined) continue
    content += text.slice(at, match.index)
    at = match.index + match[0].length
    toolCalls.push({ ...call, raw: match[0] })
  }
  return { content: content + text.slice(at), toolCalls }
}

const parseCall = (json: string): { name: string; arguments: string } | undefined => {
  let value: unknown
  try {
    value = JSON.parse(json)
  } catch {
    return undefined
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) return undefined
  const { name, arguments: args } = value as { name?: unknown; arguments?: unknown }
  if (typeof name !== "string" || name === "") return undefined
  if (typeof args === "string") return { name, arguments: args }
  if (args === undefined) return { name, arguments: "{}" }
  if (typeof args === "object" && args !== null && !Array.isArray(args)) return { name, arguments: JSON.stringify(args) }
  return undefined
}

/** Gyre's chat format: the byte-level tokenizer and the template above. */
export const gyreChat: ChatFormat = chatFormat({ tokenizer: byteTokenizer, pieces: gyrePieces, stopIds: [special.end, special.eos], eosIds: [special.eos], bos: special.bos })

/** Prompt token ids of a chat request in Gyre's template, ending with `<|assistant|>`. */
export const renderChat: Render<Int32Array> = gyreChat.render

/**
 * The text a client sees of generated tokens: special tokens dropped, and cut before the
 * first of the request's stop strings (as OpenAI returns it). With `final` false the text is
 * what may be streamed so far: a trailing partial UTF-8 character (decoded as U+FFFD), a
 * trailing prefix of a stop string, and (with `holdToolCalls`) everything from a possible
 * `<tool_call>` on are held back, so streamed pieces always concatenate to a prefix of the
 * final text.
 */
export const visibleText = (
  output: ArrayLike<number>,
  stops: ReadonlyArray<string>,
  options: { readonly final: boolean; readonly holdToolCalls: boolean },
  tokenizer: Tokenizer = byteTokenizer
): string => {
  let text = tokenizer.decode(output, { skipSpecial: true })
  if (!options.final) text = text.replace(/\uFFFD+$/u, "")
  let cut = text.length
  for (const stop of stops) {
    const at = text.indexOf(stop)
    if (at >= 0) cut = Math.min(cut, at)
  }
  const stopped = cut < text.length
  text = text.slice(0, cut)
  if (options.final) return text
  const held = [...(stopped ? [] : stops), ...(options.holdToolCalls ? [TOOL_CALL_OPEN] : [])]
  let keep = text.length
  if (options.holdToolCalls) {
    const open = text.indexOf(TOOL_CALL_OPEN)
    if (open >= 0) keep = open
  }
  // Hold back any tail that may still become a held string; holding one tail can expose another
  // ("S<" holds "<" for a tool call, then "S" for "STOP"), so repeat until nothing changes.
  for (let before = -1; before !== keep; ) {
    before = keep
    for (const s of held) {
      for (let k = Math.min(s.length - 1, keep); k > 0; k--) {
        if (text.slice(keep - k, keep) === s.slice(0, k)) {
          keep -= k
          break
        }
      }
    }
  }
  return text.slice(0, keep)
}

/** The text of one token for log-prob listings (a byte that is not UTF-8 on its own becomes U+FFFD). */
export const tokenText = (id: number, tokenizer: Tokenizer = byteTokenizer): string => tokenizer.decode([id])
