/**
 * Reasoning text: `<think>...</think>` at the start of an assistant turn (Qwen3, DeepSeek-R1
 * and the like), split from the rest of the turn, as each API returns it (chat's
 * `reasoning_content`, Responses' reasoning items, Messages' `thinking` blocks, all from the
 * gateway's one chat turn) and strips it from a turn a harness sends back.
 *
 * A turn has reasoning when its text starts (after whitespace) with `<think>`, or when its
 * prompt ended inside an open `<think>` (templates that open it in the generation prompt);
 * the reasoning runs to `</think>` (to the end while there is none). As the chat templates
 * that render reasoning do, the newlines around it are not part of it and the newlines after
 * `</think>` are not part of the content. While generating, a trailing text that may still
 * become `</think>` (or the newlines before it) is held back, so each partial split's reasoning
 * and content are prefixes of the final ones.
 */

export const THINK_OPEN = "<think>"
export const THINK_CLOSE = "</think>"

export interface ReasoningSplit {
  readonly reasoning: string
  readonly content: string
}

/** Length of the longest tail of `text` that is a proper prefix of `word`. */
const partialTail = (text: string, word: string): number => {
  for (let k = Math.min(word.length - 1, text.length); k > 0; k--) if (text.endsWith(word.slice(0, k))) return k
  return 0
}

/**
 * Splits a turn's text (see the module comment); `open`: the prompt ended inside `<think>`;
 * `final` false: the text so far of a turn still being generated.
 */
export const splitReasoning = (text: string, options: { readonly final: boolean; readonly open?: boolean }): ReasoningSplit => {
  const { final } = options
  let start = 0
  if (options.open !== true) {
    const i = text.length - text.trimStart().length
    if (!text.startsWith(THINK_OPEN, i)) {
      const undecided = !final && (i === text.length || THINK_OPEN.startsWith(text.slice(i)))
      return undecided ? { reasoning: "", content: "" } : { reasoning: "", content: text }
    }
    start = i + THINK_OPEN.length
  }
  const end = text.indexOf(THINK_CLOSE, start)
  if (end >= 0) return { reasoning: text.slice(start, end).replace(/^\n+/, "").replace(/\n+$/, ""), content: text.slice(end + THINK_CLOSE.length).replace(/^\n+/, "") }
  let reasoning = text.slice(start).replace(/^\n+/, "")
  if (!final) reasoning = reasoning.slice(0, reasoning.length - partialTail(reasoning, THINK_CLOSE))
  return { reasoning: reasoning.replace(/\n+$/, ""), content: "" }
}

/** The text of an assistant message without its inline reasoning blocks, trimmed: what two renderings of one turn share. */
export const withoutReasoning = (text: string): string => text.replace(/<think>[\s\S]*?<\/think>/g, "").replace(/^[\s\S]*?<\/think>/, "").trim()

/** Whether a prompt's text ends inside an open `<think>` (its generation prompt opened it). */
export const endsInReasoning = (promptTail: string): boolean => {
  const open = promptTail.lastIndexOf(THINK_OPEN)
  return open >= 0 && promptTail.indexOf(THINK_CLOSE, open) < 0
}
