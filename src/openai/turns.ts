/**
 * Exact prompts: the raw output tokens of the assistant turns the gateway produced for one
 * execution, found again when a harness sends a turn back.
 *
 * A harness sends its history back as text, maybe re-formatted: arguments JSON re-serialised
 * (other key order, spacing), reasoning dropped, moved to `reasoning_content` or left inline,
 * content trimmed, some of a turn's calls dropped, invalid UTF-8 replaced. Rendering that text
 * would give other tokens than the ones the model generated, and the execution's prefix tree
 * would branch at every turn. So each produced turn is remembered with its tokens, keyed
 *
 * - by its tool-call ids: a history message with calls matches the turn that made them, if
 *   every call id it carries is one of that turn's (in any order; dropped calls too);
 * - by its content without reasoning, trimmed (`withoutReasoning`): a message without calls
 *   (a turn whose calls the harness dropped, or a turn without) matches the latest turn with
 *   the same content, however its reasoning travels. A message with calls none of which this
 *   gateway made is not one of its turns.
 *
 * Bounded: the oldest turns are forgotten first.
 */
import type { ChatMessage } from "./messages.ts"
import { withoutReasoning } from "./reasoning.ts"

type Assistant = Extract<ChatMessage, { role: "assistant" }>

/** The text of a message's content (text parts joined). */
export const textOf = (content: ChatMessage["content"] | null | undefined): string =>
  content === null || content === undefined ? "" : typeof content === "string" ? content : content.map((p) => p.text).join("")

export class AssistantTurns {
  private readonly byToolCall = new Map<string, { readonly ids: ReadonlySet<string>; readonly tokens: Int32Array }>()
  private readonly byContent = new Map<string, Int32Array>()

  constructor(private readonly capacity = 4096) {}

  /** Remembers a turn: its tokens (as they follow the generation prompt), its calls' ids, the content returned (without reasoning). */
  remember(tokens: Int32Array, toolCallIds: ReadonlyArray<string>, content: string): void {
    const entry = { ids: new Set(toolCallIds), tokens }
    for (const id of toolCallIds) bounded(this.byToolCall, id, entry, this.capacity)
    bounded(this.byContent, withoutReasoning(content), tokens, this.capacity)
  }

  /** The raw tokens of a history message, when it is a turn this gateway produced. */
  lookup(message: Assistant): Int32Array | undefined {
    const calls = message.tool_calls ?? []
    if (calls.length === 0) return this.byContent.get(withoutReasoning(textOf(message.content)))
    const entry = this.byToolCall.get(calls[0]!.id)
    return entry !== undefined && calls.every((c) => entry.ids.has(c.id)) ? entry.tokens : undefined
  }
}

const bounded = <K, V>(map: Map<K, V>, key: K, value: V, capacity: number) => {
  map.delete(key)
  map.set(key, value)
  if (map.size > capacity) map.delete(map.keys().next().value as K)
}
