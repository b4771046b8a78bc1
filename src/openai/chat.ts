/**
 * Chat rendering: OpenAI-style messages (`messages.ts`) -> prompt token ids, and generated
 * tokens -> the text a client may see.
 *
 * `ChatFormat` is what the gateway needs of a model: its tokenizer, how a request renders to
 * prompt pieces (`prompt.ts`), the ids that end its turn, and how it writes tool calls
 * (`tool-formats.ts`: which format, and the text a call starts with, for `tool_choice`). Two
 * implement it: `gyreChat` below (the presets) and a checkpoint's own tokenizer.json and
 * Jinja chat_template (`hf-chat.ts`).
 *
 * Gyre's chat template (over the byte-level tokenizer's special tokens,
 * `src/engine/tokenizer.ts`): `<|bos|>`, then per message `<|role|>` content bytes `<|end|>`;
 * the prompt ends with `<|assistant|>`, and the model's turn ends at `<|end|>`. `developer`
 * messages render as `system`. When the request offers tools, a first `<|system|>` turn
 * lists them (one JSON object per line inside `<tools>...</tools>`) and says how to call one
 * in the chosen tool format (Hermes' by default). An assistant turn the gateway produced
 * renders as its generated tokens (`turns.ts`); any other as its reasoning (`<think>` block),
 * content and calls in the tool format, joined by newlines.
 */
import type { Effect } from "effect"
import { byteTokenizer, special, type Tokenizer } from "../engine/tokenizer.ts"
import type { ChatMessage, ToolDefinition } from "./messages.ts"
import { promptWithin, renderPieces, type PromptPiece, type PromptTooLong } from "./prompt.ts"
import { THINK_CLOSE, THINK_OPEN } from "./reasoning.ts"
import { toolFormats, toolsPrompt, type ToolFormat } from "./tool-formats.ts"
import { textOf, type AssistantTurns } from "./turns.ts"

type Render<A> = (messages: ReadonlyArray<ChatMessage>, tools: ReadonlyArray<ToolDefinition>, turns: AssistantTurns | undefined) => A

/** A model's chat face: tokenizer, template, end-of-turn ids, tool-call format. */
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
  /** How the model writes tool calls (the template renders them so, the parser reads them so). */
  readonly toolFormat: ToolFormat
  /**
   * The text an assistant turn starts with to make a call (`tool_choice: required`), or to
   * call function `name` (up to its arguments), as the template writes a call; undefined when
   * it cannot tell.
   */
  readonly callStart: ((name?: string) => string) | undefined
  /** Special tokens the tool format and reasoning need to see in the text (id -> text). */
  readonly markers: ReadonlyMap<number, string>
}

/** The call the templates are probed with: its rendering shows where a call's name and arguments go. */
export const PROBE = { id: "gyreprobe", name: "gyre_probe", argument: "gyre_arg", value: "gyre_value" } as const

/**
 * `callStart` from a rendered assistant turn holding the probe call: the text before its
 * name, and with a name the text up to where its arguments start (a JSON object, or
 * Qwen3-Coder's first `<parameter=`).
 */
export const callStartOf = (rendered: string): ((name?: string) => string) | undefined => {
  const nameAt = rendered.indexOf(PROBE.name)
  const argAt = rendered.indexOf(PROBE.argument, nameAt + PROBE.name.length)
  if (nameAt < 0 || argAt < 0) return undefined
  const parameter = rendered.lastIndexOf("<parameter=", argAt)
  const argsAt = parameter >= 0 && parameter + "<parameter=".length === argAt ? parameter : rendered.lastIndexOf("{", argAt)
  if (argsAt < nameAt) return undefined
  const before = rendered.slice(0, nameAt)
  const between = rendered.slice(nameAt + PROBE.name.length, argsAt)
  return (name) => (name === undefined ? before : before + name + between)
}

/** The special tokens among `texts` that encode to one special id, by id. */
export const markerIds = (tokenizer: Tokenizer, texts: ReadonlyArray<string>): ReadonlyMap<number, string> => {
  const out = new Map<number, string>()
  for (const text of texts) {
    const ids = tokenizer.encode(text)
    if (ids.length === 1 && tokenizer.isSpecial(ids[0]!)) out.set(ids[0]!, text)
  }
  return out
}

/** The texts a chat format keeps when decoding: its tool format's markers and the reasoning tags. */
export const markerTexts = (format: ToolFormat): ReadonlyArray<string> => [...format.markers, ...format.openers, THINK_OPEN, THINK_CLOSE]

/** A chat format over its tokenizer and prompt pieces (`render` and `prompt` encode them). */
export const chatFormat = (fields: Omit<ChatFormat, "render" | "prompt">): ChatFormat => ({
  ...fields,
  render: (messages, tools, turns) => renderPieces(fields.tokenizer, fields.pieces(messages, tools, turns)),
  prompt: (messages, tools, turns, limit) => promptWithin(fields.tokenizer, fields.pieces(messages, tools, turns), limit)
})

/** An assistant message as text: its reasoning (`<think>` block), content and calls in `format`, joined by newlines. */
export const assistantText = (m: Extract<ChatMessage, { role: "assistant" }>, format: ToolFormat): string => {
  const reasoning = m.reasoning_content ?? m.reasoning
  const calls = (m.tool_calls ?? []).map((c) => ({ name: c.function.name, arguments: c.function.arguments }))
  return [reasoning ? `${THINK_OPEN}\n${reasoning}\n${THINK_CLOSE}` : "", textOf(m.content), format.render(calls)].filter((p) => p !== "").join("\n")
}

/** The pieces of Gyre's template: special ids around each message's text, ending with `<|assistant|>`. */
const gyrePieces =
  (format: ToolFormat): Render<Array<PromptPiece>> =>
  (messages, tools, turns) => {
    const pieces: Array<PromptPiece> = [[special.bos]]
    if (tools.length > 0) pieces.push([special.system], toolsPrompt(tools, format), [special.end])
    for (const m of messages) {
      if (m.role === "assistant") {
        pieces.push([special.assistant])
        const raw = turns?.lookup(m)
        pieces.push(raw ?? assistantText(m, format))
        if (raw === undefined || raw[raw.length - 1] !== special.end) pieces.push([special.end])
      } else {
        pieces.push([m.role === "developer" ? special.system : special[m.role]], textOf(m.content), [special.end])
      }
    }
    pieces.push([special.assistant])
    return pieces
  }

/** Gyre's chat format with the tool-call format `format`: the byte-level tokenizer and the template above. */
export const gyreChatWith = (format: ToolFormat): ChatFormat =>
  chatFormat({
    tokenizer: byteTokenizer,
    pieces: gyrePieces(format),
    stopIds: [special.end, special.eos],
    eosIds: [special.eos],
    bos: special.bos,
    toolFormat: format,
    callStart: callStartOf(format.render([{ name: PROBE.name, arguments: JSON.stringify({ [PROBE.argument]: PROBE.value }) }])),
    markers: new Map()
  })

/** Gyre's chat format (Hermes tool calls). */
export const gyreChat: ChatFormat = gyreChatWith(toolFormats.hermes)

/** Prompt token ids of a chat request in Gyre's template, ending with `<|assistant|>`. */
export const renderChat: Render<Int32Array> = gyreChat.render

/** The ids' text with special tokens dropped, except `markers` (id -> text), which stay as their text. */
const decodeKeeping = (tokenizer: Tokenizer, ids: ArrayLike<number>, markers: ReadonlyMap<number, string>): string => {
  if (markers.size === 0) return tokenizer.decode(ids, { skipSpecial: true })
  let out = ""
  let from = 0
  for (let i = 0; i < ids.length; i++) {
    const marker = markers.get(ids[i]!)
    if (marker === undefined) continue
    out += tokenizer.decode(Array.prototype.slice.call(ids, from, i) as Array<number>, { skipSpecial: true }) + marker
    from = i + 1
  }
  return out + tokenizer.decode(Array.prototype.slice.call(ids, from) as Array<number>, { skipSpecial: true })
}

/**
 * The text a client sees of generated tokens: special tokens dropped (but `markers`, which
 * stay as their text), and cut before the first of the request's stop strings (as OpenAI
 * returns it). With `final` false the text is what may be streamed so far: a trailing
 * partial UTF-8 character (decoded as U+FFFD), and a trailing prefix of a stop string or of
 * one of `hold` (a tool call's opener) are held back, so the text is always a prefix of the
 * final text.
 */
export const visibleText = (
  output: ArrayLike<number>,
  stops: ReadonlyArray<string>,
  options: { readonly final: boolean; readonly hold?: ReadonlyArray<string>; readonly markers?: ReadonlyMap<number, string> },
  tokenizer: Tokenizer = byteTokenizer
): string => {
  let text = decodeKeeping(tokenizer, output, options.markers ?? new Map())
  if (!options.final) text = text.replace(/\uFFFD+$/u, "")
  let cut = text.length
  for (const stop of stops) {
    const at = text.indexOf(stop)
    if (at >= 0) cut = Math.min(cut, at)
  }
  const stopped = cut < text.length
  text = text.slice(0, cut)
  if (options.final) return text
  const held = [...(stopped ? [] : stops), ...(options.hold ?? [])]
  let keep = text.length
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
