/**
 * One assistant turn of a chat-shaped call, whichever API it came in by: the internal chat
 * request (`TurnRequest`: OpenAI-style messages and tools, tool choice, stop strings,
 * sampling) is rendered to prompt ids with the model's chat format and the execution's
 * remembered turns, checked against the context limit, generated and recorded through the
 * gateway's one `Generate`, and read back as a `TurnAnswer` (content, reasoning, tool calls,
 * finish reason, the stop string that ended it); the turn is remembered for the execution so
 * a later request that sends it back renders with the generated tokens.
 *
 * Chat Completions (`./endpoints.ts`), the Responses API (`./responses-route.ts`) and the
 * Anthropic Messages API (`./messages-route.ts`) are conversions to and from these types.
 *
 * Streaming: `onDelta` gets the text that may be shown so far as deltas (content, reasoning,
 * tool calls by index), one per generated step, and a last one when the turn ends; the deltas
 * of each field concatenate to the answer's (a streamed tool call: its first delta has its id
 * and name, the rest only arguments). Text that may still become a stop string or a tool call
 * is held back until decided (`visibleText`).
 */
import { Context, Effect, Layer } from "effect"
import { type ChatFormat, gyreChat } from "../openai/chat.ts"
import { endsInReasoning } from "../openai/reasoning.ts"
import { TurnDeltas, readTurn, type ReadingDelta, type TurnReaderOptions } from "../openai/turn-reader.ts"
import type { ChatMessage, ToolDefinition } from "../openai/messages.ts"
import { apiError, contextLengthExceeded, type ApiError, type FinishReason } from "../openai/openai.ts"
import type { SamplingParams, StepTokens } from "../protocols/rollout.ts"
import type { Sampling } from "../tree/record.ts"
import type { CallResult } from "./call-router.ts"
import type { HttpCall } from "./http.ts"
import type { Session } from "./sessions.ts"

export type GatewayCall = HttpCall<Session>

/** How the call's answer is recorded: its finish reason and its tool calls (id -> raw text). */
export type Finish = (result: CallResult) => { readonly finishReason: FinishReason; readonly toolCalls: Record<string, string> }

/** Runs a call on a worker and records it; `onTokens` streams, `finish` renders the answer. */
export type Generate = (
  call: GatewayCall,
  callId: string,
  prompt: Int32Array,
  sampling: SamplingParams,
  onTokens: ((step: StepTokens) => void) | undefined,
  finish: Finish
) => Effect.Effect<CallResult, ApiError>

/** `auto`: the model decides; `none`: no calls are read; `required`: at least one; `{name}`: that function. */
export type ToolChoice = "auto" | "none" | "required" | { readonly name: string }

/** What a chat-shaped call asks for. */
export interface TurnRequest {
  readonly messages: ReadonlyArray<ChatMessage>
  readonly tools: ReadonlyArray<ToolDefinition>
  readonly toolChoice: ToolChoice
  readonly parallelToolCalls: boolean
  /** Stop strings (the text is cut before the first; `TurnAnswer.stopSequence` names it). */
  readonly stops: ReadonlyArray<string>
  readonly maxTokens?: number | null | undefined
  readonly temperature?: number | null | undefined
  readonly topP?: number | null | undefined
  readonly seed?: number | null | undefined
  /** Go on past the end-of-turn ids (stop strings still apply). */
  readonly ignoreEos?: boolean
  /** The request field that holds the messages, named by a context-length error. */
  readonly param: string
}

export interface TurnToolCall {
  readonly id: string
  readonly name: string
  readonly arguments: string
}

/** A piece of a streamed turn: what became visible since the last delta. */
export interface TurnDelta {
  readonly content: string
  readonly reasoning: string
  readonly toolCalls: ReadonlyArray<{ readonly index: number; readonly id?: string; readonly name?: string; readonly arguments: string }>
  /** The generated step this delta comes from; undefined for the last delta. */
  readonly step: StepTokens | undefined
  /** Tokens of the prompt. */
  readonly promptTokens: number
}

export interface TurnAnswer {
  /** Text outside reasoning and tool calls; null when there is none besides tool calls. */
  readonly content: string | null
  readonly reasoning: string | null
  readonly toolCalls: ReadonlyArray<TurnToolCall>
  readonly finishReason: FinishReason
  /** The request's stop string the text was cut at, if any. */
  readonly stopSequence: string | null
  readonly result: CallResult
}

export interface ChatTurnsOptions {
  readonly chat?: ChatFormat
  readonly defaultMaxTokens: number
  /** Longest prompt the workers take (tokens); unknown: the worker decides. */
  readonly maxContextTokens?: number | undefined
  readonly generate: Generate
  /**
   * A training run's sampling: it replaces the request's temperature and top-p, so every
   * call's tokens come from the distribution the trainer corrects for. Unset (`gyre serve`):
   * the request's.
   */
  readonly sampling?: Sampling | undefined
}

/** The first of `stops` in `text` (earliest position), if any. */
const firstStop = (text: string, stops: ReadonlyArray<string>): string | null => {
  let best: { at: number; stop: string } | undefined
  for (const stop of stops) {
    const at = text.indexOf(stop)
    if (at >= 0 && (best === undefined || at < best.at)) best = { at, stop }
  }
  return best?.stop ?? null
}

/** What a model's turns share: the options, the chat format, its tokenizer and end-of-turn ids. */
interface Turns {
  readonly options: ChatTurnsOptions
  readonly chat: ChatFormat
  readonly tokenizer: ChatFormat["tokenizer"]
  readonly endOfTurn: ReadonlyArray<ReadonlyArray<number>>
}

/** The prompt ids of a request, within the context limit (counted without blocking the event loop for long: `../openai/prompt.ts`). */
const render = (t: Turns, call: GatewayCall, req: TurnRequest): Effect.Effect<Int32Array, ApiError> =>
  t.chat.prompt(req.messages, req.tools, call.session.turns, t.options.maxContextTokens).pipe(
    Effect.mapError((e) => contextLengthExceeded(e.limit, e.tokens, req.param, e.atLeast))
  )

/** A request's sampling (the run's, else the request's, else the defaults), stopping at `stop` (token sequences). */
const sampling = (
  t: Turns,
  req: Pick<TurnRequest, "maxTokens" | "temperature" | "topP" | "seed">,
  stop: ReadonlyArray<ArrayLike<number>>
): SamplingParams => ({
  maxTokens: req.maxTokens ?? t.options.defaultMaxTokens,
  temperature: t.options.sampling?.temperature ?? req.temperature ?? 1,
  topP: t.options.sampling?.topP ?? req.topP ?? 1,
  seed: req.seed ?? null,
  stop: stop.map((s) => Int32Array.from(s))
})

/** A turn's sampling: it stops at the end of the turn (unless `ignoreEos`), the request's stop strings and `more`. */
const turnSampling = (t: Turns, req: TurnRequest, more: ReadonlyArray<ArrayLike<number>>) =>
  sampling(t, req, [...(req.ignoreEos === true ? [] : t.endOfTurn), ...req.stops.map((s) => t.tokenizer.encode(s)), ...more])

/** The text the turn must start with for its tool choice (a call's start; with a name, up to its arguments). */
const forcedStart = (chat: ChatFormat, req: TurnRequest, withTools: boolean): string => {
  if (!withTools || chat.callStart === undefined) return ""
  if (req.toolChoice === "required") return chat.callStart()
  return typeof req.toolChoice === "object" ? chat.callStart(req.toolChoice.name) : ""
}

/** The calls a turn answers with: only the named function's (a named tool choice), only the first without parallel calls. */
const admitted = <C extends { readonly name: string }>(req: TurnRequest, calls: ReadonlyArray<C>): ReadonlyArray<C> => {
  const choice = req.toolChoice
  const named = typeof choice === "object" ? calls.filter((c) => c.name === choice.name) : calls
  return req.parallelToolCalls ? named : named.slice(0, 1)
}

/** A turn's prompt: the rendered request, then the start its tool choice forces (`forcedIds`, the text `forced`). */
interface TurnPrompt {
  readonly prompt: Int32Array
  readonly forced: string
  readonly forcedIds: Int32Array
  /** Tools are offered and calls read (there are tools, and the choice is not `none`). */
  readonly withTools: boolean
}

const promptOf = Effect.fn("ChatTurns.prompt")(function* (t: Turns, call: GatewayCall, req: TurnRequest) {
  const choice = req.toolChoice
  if (typeof choice === "object" && !req.tools.some((tool) => tool.function.name === choice.name)) {
    return yield* Effect.fail(apiError(400, `The tool choice names function '${choice.name}', which is not among the request's tools.`, { param: "tool_choice" }))
  }
  const withTools = req.tools.length > 0 && choice !== "none"
  const forced = forcedStart(t.chat, req, withTools)
  const forcedIds = Int32Array.from(t.tokenizer.encode(forced))
  const rendered = yield* render(t, call, req)
  const prompt = new Int32Array(rendered.length + forcedIds.length)
  prompt.set(rendered)
  prompt.set(forcedIds, rendered.length)
  return { prompt, forced, forcedIds, withTools } satisfies TurnPrompt
})

/** One turn being generated: its readings as deltas, then its answer, recorded and remembered for the execution. */
class TurnInProgress {
  private readonly reader: TurnReaderOptions
  private readonly deltas: TurnDeltas
  private readonly seen: Array<number> = []
  private last: ReadingDelta | undefined
  answer: Omit<TurnAnswer, "result"> | undefined

  constructor(
    private readonly t: Turns,
    private readonly call: GatewayCall,
    private readonly req: TurnRequest,
    private readonly p: TurnPrompt,
    toolCallId: () => string
  ) {
    const { tokenizer } = t
    this.reader = {
      tokenizer,
      stops: req.stops,
      markers: t.chat.markers,
      format: p.withTools ? t.chat.toolFormat : undefined,
      tools: req.tools,
      prefix: p.forced,
      inReasoning: endsInReasoning(tokenizer.decode(p.prompt.subarray(Math.max(0, p.prompt.length - 16))))
    }
    this.deltas = new TurnDeltas(toolCallId)
  }

  /** Without parallel calls, generation ends with the first call's closing text, where the format has one. */
  get closer(): ReadonlyArray<ArrayLike<number>> {
    const format = this.reader.format
    return this.p.withTools && !this.req.parallelToolCalls && format?.closer !== undefined ? [this.t.tokenizer.encode(format.closer)] : []
  }

  private read(output: ArrayLike<number>, final: boolean) {
    const r = readTurn(output, final, this.reader)
    return { ...r, calls: admitted(this.req, r.calls) }
  }

  /** Each generated step's delta to `onDelta`. */
  streamTo(onDelta: (delta: TurnDelta) => void) {
    return (step: StepTokens) => {
      this.seen.push(...step.tokens)
      const d = this.deltas.next(this.read(this.seen, false))
      onDelta({ content: d.content, reasoning: d.reasoning, toolCalls: d.calls, step, promptTokens: this.p.prompt.length })
    }
  }

  /** The turn's answer from the call's result (`Finish`): it is remembered for the execution, and recorded with what this returns. */
  finish(r: CallResult): ReturnType<Finish> {
    const { tokenizer } = this.t
    const reading = this.read(r.output, true)
    this.last = this.deltas.next(reading)
    const ids = this.deltas.ids
    const toolCalls = reading.calls.map((c, i) => ({ id: ids[i]!, name: c.name, arguments: c.arguments }))
    const finishReason: FinishReason = toolCalls.length > 0 ? "tool_calls" : r.finishReason === "length" ? "length" : "stop"
    const stopSequence = this.req.stops.length === 0 ? null : firstStop(tokenizer.decode(r.output, { skipSpecial: true }), this.req.stops)
    const content = toolCalls.length > 0 && reading.content.trim() === "" ? null : reading.content
    this.answer = { content, reasoning: reading.reasoning === "" ? null : reading.reasoning, toolCalls, finishReason, stopSequence }
    const turn = new Int32Array(this.p.forcedIds.length + r.output.length)
    turn.set(this.p.forcedIds)
    turn.set(r.output, this.p.forcedIds.length)
    this.call.session.turns.remember(turn, toolCalls.map((c) => c.id), content ?? "")
    return { finishReason, toolCalls: Object.fromEntries(toolCalls.map((c, i) => [c.id, reading.calls[i]!.raw])) }
  }

  /** The last delta: what the final reading shows beyond the streamed ones. */
  lastDelta(): TurnDelta {
    const last = this.last!
    return { content: last.content, reasoning: last.reasoning, toolCalls: last.calls, step: undefined, promptTokens: this.p.prompt.length }
  }
}

const run = Effect.fn("ChatTurns.run")(function* (
  t: Turns,
  call: GatewayCall,
  callId: string,
  req: TurnRequest,
  onDelta: ((delta: TurnDelta) => void) | undefined,
  toolCallId: () => string
) {
  const p = yield* promptOf(t, call, req)
  const turn = new TurnInProgress(t, call, req, p, toolCallId)
  const onTokens = onDelta === undefined ? undefined : turn.streamTo(onDelta)
  const result = yield* t.options.generate(call, callId, p.prompt, turnSampling(t, req, turn.closer), onTokens, (r) => turn.finish(r))
  // the last delta goes out once the call is recorded
  onDelta?.(turn.lastDelta())
  return { ...turn.answer!, result } satisfies TurnAnswer
})

/** Rendering and running turns over a model's chat format. */
export interface ChatTurnsShape {
  /** The prompt ids of a request, within the context limit. */
  readonly render: (call: GatewayCall, req: TurnRequest) => Effect.Effect<Int32Array, ApiError>
  /**
   * Generates, records and remembers one turn; `toolCallId` names each tool call it makes
   * (default: ids of the kind the model's chat template accepts).
   */
  readonly run: (
    call: GatewayCall,
    callId: string,
    req: TurnRequest,
    onDelta: ((delta: TurnDelta) => void) | undefined,
    toolCallId?: () => string
  ) => Effect.Effect<TurnAnswer, ApiError>
  /** A request's sampling (the run's, else the request's, else the defaults), stopping at `stop` (token sequences). */
  readonly sampling: (req: Pick<TurnRequest, "maxTokens" | "temperature" | "topP" | "seed">, stop: ReadonlyArray<ArrayLike<number>>) => SamplingParams
  readonly tokenizer: ChatFormat["tokenizer"]
}

const makeChatTurns = (options: ChatTurnsOptions): ChatTurnsShape => {
  const chat = options.chat ?? gyreChat
  const t: Turns = { options, chat, tokenizer: chat.tokenizer, endOfTurn: chat.stopIds.map((id) => [id]) }
  return {
    render: (call, req) => render(t, call, req),
    run: (call, callId, req, onDelta, toolCallId = chat.toolFormat.newCallId) => run(t, call, callId, req, onDelta, toolCallId),
    sampling: (req, stop) => sampling(t, req, stop),
    tokenizer: t.tokenizer
  }
}

/** The chat turns of one model (its chat format, the gateway's `generate`). */
export class ChatTurns extends Context.Service<ChatTurns, ChatTurnsShape>()("gyre/gateway/ChatTurns") {
  static readonly make = makeChatTurns
  static readonly layer = (options: ChatTurnsOptions) => Layer.succeed(ChatTurns, makeChatTurns(options))
}
