/**
 * A checkpoint's own chat format: its tokenizer (`src/engine/hf-tokenizer.ts`) and its Jinja
 * `chat_template` (from `chat_template.jinja`, else `tokenizer_config.json`; a list of named
 * templates uses "default"), rendered with `@huggingface/jinja` as `transformers`'
 * `apply_chat_template` does: `messages`, `tools` (OpenAI function definitions),
 * `add_generation_prompt: true`, `bos_token`, `eos_token`.
 *
 * Messages reach the template in the transformers form: text content as a string, assistant
 * `tool_calls` with `arguments` parsed to an object (kept as a string when not JSON) and
 * their `reasoning_content`, `developer` as `system`.
 *
 * Token-exact turns: an assistant message the gateway produced (`AssistantTurns`) is rendered
 * as a placeholder, and the placeholder's place in the rendered text takes the ids the model
 * generated (without the trailing end-of-turn id, which the template writes itself); only the
 * text between placeholders is encoded. An assistant message the harness edited (or the
 * gateway never produced) is rendered and encoded as text.
 *
 * Tool-call format: the template is asked to render one probe call (`PROBE`), and the format
 * whose parser reads that call back from the rendered text is the model's (so the template
 * that renders calls and the parser that reads them agree); the same rendering gives the text
 * a call starts with (`callStart`, for `tool_choice`). A template that renders no call the
 * parsers know takes the format asked for, else Hermes'; asking for another format than the
 * one a template renders is refused (`ToolFormatMismatch`).
 */
import { readFile } from "node:fs/promises"
import { join } from "node:path"
import { Template } from "@huggingface/jinja"
import { Schema } from "effect"
import { type HfTokens, readHfTokens } from "../engine/hf-tokenizer.ts"
import { type ChatFormat, PROBE, callStartOf, chatFormat, gyreChatWith, markerIds, markerTexts } from "./chat.ts"
import type { ChatMessage, ToolDefinition } from "./messages.ts"
import type { PromptPiece } from "./prompt.ts"
import { TOOL_FORMATS, toolFormats, type ToolFormat, type ToolFormatName } from "./tool-formats.ts"
import { textOf, type AssistantTurns } from "./turns.ts"

export const CHAT_TEMPLATE_FILE = "chat_template.jinja"

/** A tool-call format asked for that the checkpoint's chat template does not render. */
export class ToolFormatMismatch extends Schema.TaggedError<ToolFormatMismatch>()("ToolFormatMismatch", {
  asked: Schema.String,
  rendered: Schema.String
}) {
  override get message() {
    return `the checkpoint's chat template renders ${this.rendered} tool calls, not ${this.asked}: the parser must read what the template writes`
  }
}

/** A placeholder no template or text produces (private-use code points around a number). */
const placeholder = (k: number) => `\u{F0000}gyre-turn-${k}\u{F0001}`
const PLACEHOLDER = /\u{F0000}gyre-turn-(\d+)\u{F0001}/gu

const parsedArguments = (json: string): unknown => {
  try {
    return JSON.parse(json)
  } catch {
    return json
  }
}

/** The message as transformers' chat templates expect it. */
const templateMessage = (m: ChatMessage): Record<string, unknown> => {
  if (m.role === "assistant") {
    const calls = m.tool_calls ?? []
    const reasoning = m.reasoning_content ?? m.reasoning
    return {
      role: "assistant",
      content: m.content === null || m.content === undefined ? (calls.length > 0 ? null : "") : textOf(m.content),
      ...(reasoning ? { reasoning_content: reasoning } : {}),
      ...(calls.length > 0
        ? { tool_calls: calls.map((c) => ({ id: c.id, type: "function", function: { name: c.function.name, arguments: parsedArguments(c.function.arguments) } })) }
        : {})
    }
  }
  if (m.role === "tool") return { role: "tool", content: textOf(m.content), tool_call_id: m.tool_call_id }
  return { role: m.role === "developer" ? "system" : m.role, content: textOf(m.content) }
}

/** The chat template source of a directory's tokenizer files, or undefined. */
const templateSource = async (dir: string, tokenizerConfig: Record<string, unknown>): Promise<string | undefined> => {
  const file = await readFile(join(dir, CHAT_TEMPLATE_FILE), "utf8").catch(() => undefined)
  if (file !== undefined) return file
  const t = tokenizerConfig.chat_template
  if (typeof t === "string") return t
  if (Array.isArray(t)) {
    const named = t as Array<{ name?: unknown; template?: unknown }>
    const chosen = named.find((x) => x.name === "default") ?? named[0]
    return typeof chosen?.template === "string" ? chosen.template : undefined
  }
  return undefined
}

const probeTool: ToolDefinition = {
  type: "function",
  function: { name: PROBE.name, description: "probe", parameters: { type: "object", properties: { [PROBE.argument]: { type: "string" } } } }
}

/** The assistant turn the template renders for the probe call, or undefined (the template fails, or its text is not after the generation prompt). */
const probeTurn = (renderText: (messages: ReadonlyArray<Record<string, unknown>>, generationPrompt: boolean) => string): string | undefined => {
  const user = { role: "user", content: "gyre probe" }
  const call = { id: PROBE.id, type: "function", function: { name: PROBE.name, arguments: { [PROBE.argument]: PROBE.value } } }
  try {
    const before = renderText([user], true)
    const after = renderText([user, { role: "assistant", content: "", tool_calls: [call] }], false)
    return after.startsWith(before) ? after.slice(before.length) : undefined
  } catch {
    return undefined
  }
}

/** The format whose parser reads the probe call back from the template's rendering. */
const renderedFormat = (turn: string | undefined): ToolFormat | undefined =>
  turn === undefined
    ? undefined
    : TOOL_FORMATS.map((n) => toolFormats[n]).find((f) => {
        const calls = f.scan(turn, true, [probeTool]).calls
        return calls.length === 1 && calls[0]!.name === PROBE.name && JSON.stringify(parsedArguments(calls[0]!.arguments)) === JSON.stringify({ [PROBE.argument]: PROBE.value })
      })

/** A ChatFormat over parsed tokens and a template source; `toolFormat` asks for a tool-call format. */
export const hfChat = (tokens: HfTokens, source: string, toolFormat?: ToolFormatName): ChatFormat => {
  const template = new Template(source)
  const { tokenizer, eosIds } = tokens
  const stop = new Set(eosIds)
  const renderText = (messages: ReadonlyArray<Record<string, unknown>>, generationPrompt: boolean, tools: ReadonlyArray<ToolDefinition> = []) =>
    template.render({
      messages,
      ...(tools.length > 0 ? { tools } : {}),
      add_generation_prompt: generationPrompt,
      bos_token: tokens.bosToken,
      eos_token: tokens.eosToken
    })
  const turn = probeTurn((messages, generationPrompt) => renderText(messages, generationPrompt, [probeTool]))
  const rendered = renderedFormat(turn)
  if (rendered !== undefined && toolFormat !== undefined && rendered.name !== toolFormat) throw new ToolFormatMismatch({ asked: toolFormat, rendered: rendered.name })
  const format = rendered ?? toolFormats[toolFormat ?? "hermes"]
  const pieces = (messages: ReadonlyArray<ChatMessage>, tools: ReadonlyArray<ToolDefinition>, turns: AssistantTurns | undefined): Array<PromptPiece> => {
    const raw: Array<Int32Array> = []
    const shown = messages.map((m) => {
      const ids = m.role === "assistant" ? turns?.lookup(m) : undefined
      if (ids === undefined) return templateMessage(m)
      raw.push(ids.length > 0 && stop.has(ids[ids.length - 1]!) ? ids.subarray(0, ids.length - 1) : ids)
      return { role: "assistant", content: placeholder(raw.length - 1) }
    })
    const text = renderText(shown, true, tools)
    const out: Array<PromptPiece> = []
    let at = 0
    for (const match of text.matchAll(PLACEHOLDER)) {
      out.push(text.slice(at, match.index), raw[Number(match[1])]!)
      at = match.index + match[0].length
    }
    out.push(text.slice(at))
    return out
  }
  const bos = tokens.bosToken === "" ? undefined : tokenizer.encode(tokens.bosToken)
  return chatFormat({
    tokenizer,
    pieces,
    stopIds: eosIds,
    eosIds,
    bos: bos?.length === 1 ? bos[0] : undefined,
    toolFormat: format,
    callStart: rendered === undefined ? callStartOf(format.render([{ name: PROBE.name, arguments: JSON.stringify({ [PROBE.argument]: PROBE.value }) }])) : callStartOf(turn!),
    markers: markerIds(tokenizer, markerTexts(format))
  })
}

/** The chat format of a checkpoint directory with a tokenizer.json, or undefined without one. */
export const readHfChat = async (dir: string, toolFormat?: ToolFormatName): Promise<ChatFormat | undefined> => {
  const tokens = await readHfTokens(dir)
  if (tokens === undefined) return undefined
  const source = await templateSource(dir, tokens.tokenizerConfig)
  if (source === undefined) throw new Error(`${dir}: tokenizer.json without a chat_template (tokenizer_config.json or ${CHAT_TEMPLATE_FILE})`)
  return hfChat(tokens, source, toolFormat)
}

/**
 * The chat format a checkpoint is served with: its own (tokenizer.json), else Gyre's, with
 * `toolFormat` (`--tool-format`) where the template leaves it open; rejects with
 * ToolFormatMismatch when the template renders another.
 */
export const chatFormatOf = async (dir: string, toolFormat?: ToolFormatName): Promise<ChatFormat> =>
  (await readHfChat(dir, toolFormat)) ?? gyreChatWith(toolFormats[toolFormat ?? "hermes"])
