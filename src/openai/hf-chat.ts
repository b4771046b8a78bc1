/**
 * A checkpoint's own chat format: its tokenizer (`src/engine/hf-tokenizer.ts`) and its Jinja
 * `chat_template` (from `chat_template.jinja`, else `tokenizer_config.json`; a list of named
 * templates uses "default"), rendered with `@huggingface/jinja` as `transformers`'
 * `apply_chat_template` does: `messages`, `tools` (OpenAI function definitions),
 * `add_generation_prompt: true`, `bos_token`, `eos_token`.
 *
 * Messages reach the template in the transformers form: text content as a string, assistant
 * `tool_calls` with `arguments` parsed to an object (kept as a string when not JSON),
 * `developer` as `system`.
 *
 * Token-exact turns: an assistant message the gateway produced (`AssistantTurns`) is rendered
 * as a placeholder, and the placeholder's place in the rendered text takes the ids the model
 * generated (without the trailing end-of-turn id, which the template writes itself); only the
 * text between placeholders is encoded. An assistant message the harness edited (or the
 * gateway never produced) is rendered and encoded as text.
 */
import { readFile } from "node:fs/promises"
import { join } from "node:path"
import { Template } from "@huggingface/jinja"
import { type HfTokens, readHfTokens } from "../engine/hf-tokenizer.ts"
import { type AssistantTurns, type ChatFormat, chatFormat, gyreChat, textOf } from "./chat.ts"
import type { ChatMessage, ToolDefinition } from "./messages.ts"
import type { PromptPiece } from "./prompt.ts"

export const CHAT_TEMPLATE_FILE = "chat_template.jinja"

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
    return {
      role: "assistant",
      content: m.content === null || m.content === undefined ? (calls.length > 0 ? null : "") : textOf(m.content),
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

/** A ChatFormat over parsed tokens and a template source. */
export const hfChat = (tokens: HfTokens, source: string): ChatFormat => {
  const template = new Template(source)
  const { tokenizer, eosIds } = tokens
  const stop = new Set(eosIds)
  const pieces = (messages: ReadonlyArray<ChatMessage>, tools: ReadonlyArray<ToolDefinition>, turns: AssistantTurns | undefined): Array<PromptPiece> => {
    const raw: Array<Int32Array> = []
    const shown = messages.map((m) => {
      const ids = m.role === "assistant" ? turns?.lookup(m) : undefined
      if (ids === undefined) return templateMessage(m)
      raw.push(ids.length > 0 && stop.has(ids[ids.length - 1]!) ? ids.subarray(0, ids.length - 1) : ids)
      return { role: "assistant", content: placeholder(raw.length - 1) }
    })
    const text = template.render({
      messages: shown,
      ...(tools.length > 0 ? { tools } : {}),
      add_generation_prompt: true,
      bos_token: tokens.bosToken,
      eos_token: tokens.eosToken
    })
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
  return chatFormat({ tokenizer, pieces, stopIds: eosIds, eosIds, bos: bos?.length === 1 ? bos[0] : undefined })
}

/** The chat format of a checkpoint directory with a tokenizer.json, or undefined without one. */
export const readHfChat = async (dir: string): Promise<ChatFormat | undefined> => {
  const tokens = await readHfTokens(dir)
  if (tokens === undefined) return undefined
  const source = await templateSource(dir, tokens.tokenizerConfig)
  if (source === undefined) throw new Error(`${dir}: tokenizer.json without a chat_template (tokenizer_config.json or ${CHAT_TEMPLATE_FILE})`)
  return hfChat(tokens, source)
}

/** The chat format a checkpoint is served with: its own (tokenizer.json), else Gyre's. */
export const chatFormatOf = async (dir: string): Promise<ChatFormat> => (await readHfChat(dir)) ?? gyreChat
