/**
 * Reading an assistant turn's generated tokens as a client sees them: the visible text (stop
 * strings cut, special tokens dropped but the format's markers, `chat.ts`), its reasoning
 * (`reasoning.ts`), then its content and tool calls (the model's tool format,
 * `tool-formats.ts`).
 *
 * `readTurn(output, false)` reads a turn still being generated: each field of a partial
 * reading (reasoning, content, each call's arguments) is a prefix of the final reading's, and
 * calls only come after those already read, so successive readings stream as deltas
 * (`TurnDeltas`).
 */
import type { Tokenizer } from "../engine/tokenizer.ts"
import { visibleText } from "./chat.ts"
import type { ToolDefinition } from "./messages.ts"
import { splitReasoning } from "./reasoning.ts"
import type { ScannedCall, ToolFormat } from "./tool-formats.ts"

export interface TurnReading {
  readonly reasoning: string
  readonly content: string
  readonly calls: ReadonlyArray<ScannedCall>
}

export interface TurnReaderOptions {
  readonly tokenizer: Tokenizer
  readonly stops: ReadonlyArray<string>
  /** Special tokens kept as text (id -> text). */
  readonly markers: ReadonlyMap<number, string>
  /** How calls are read; undefined: none are (no tools, or `tool_choice: none`). */
  readonly format: ToolFormat | undefined
  readonly tools: ReadonlyArray<ToolDefinition>
  /** Text the turn starts with before its generated tokens (a call's start forced by `tool_choice`). */
  readonly prefix: string
  /** The prompt ended inside `<think>`: the turn starts in its reasoning. */
  readonly inReasoning: boolean
}

/** The reading of a turn's output so far (`final` false) or in full. */
export const readTurn = (output: ArrayLike<number>, final: boolean, o: TurnReaderOptions): TurnReading => {
  const text = o.prefix + visibleText(output, o.stops, { final, hold: o.format?.openers ?? [], markers: o.markers }, o.tokenizer)
  const split = splitReasoning(text, { final, open: o.inReasoning })
  if (o.format === undefined) return { reasoning: split.reasoning, content: split.content, calls: [] }
  const scanned = o.format.scan(split.content, final, o.tools)
  return { reasoning: split.reasoning, content: scanned.content, calls: scanned.calls }
}

/** One call's part of a delta: its id and name the first time, then more of its arguments. */
export interface CallDelta {
  readonly index: number
  readonly id?: string
  readonly name?: string
  readonly arguments: string
}

export interface ReadingDelta {
  readonly reasoning: string
  readonly content: string
  readonly calls: ReadonlyArray<CallDelta>
}

/** What is new in each reading since the last one; names each call with `newId` when it first appears. */
export class TurnDeltas {
  private reasoning = ""
  private content = ""
  private readonly sent: Array<{ readonly id: string; arguments: string }> = []

  constructor(private readonly newId: () => string) {}

  /** The ids of the calls read so far, in order. */
  get ids(): ReadonlyArray<string> {
    return this.sent.map((c) => c.id)
  }

  next(reading: TurnReading): ReadingDelta {
    const more = (sent: string, now: string) => (now.length > sent.length && now.startsWith(sent) ? now.slice(sent.length) : "")
    const reasoning = more(this.reasoning, reading.reasoning)
    const content = more(this.content, reading.content)
    this.reasoning += reasoning
    this.content += content
    const calls: Array<CallDelta> = []
    reading.calls.forEach((c, index) => {
      const sent = this.sent[index]
      if (sent === undefined) {
        const id = this.newId()
        this.sent.push({ id, arguments: c.arguments })
        calls.push({ index, id, name: c.name, arguments: c.arguments })
        return
      }
      const args = more(sent.arguments, c.arguments)
      if (args === "") return
      sent.arguments += args
      calls.push({ index, arguments: args })
    })
    return { reasoning, content, calls }
  }
}
