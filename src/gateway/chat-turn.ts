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
import { Effect } from "effect"
import { type ChatFormat, gyreChat } from "../openai/chat.ts"
import { endsInReasoning } from "../openai/reasoning.ts"
import { TurnDeltas, readTurn, type ReadingDelta } from "../openai/turn-reader.ts"
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

/** Rendering and running turns over a model's chat format. */
export const chatTurns = (options: ChatTurnsOptions) => {
  const chatFormat = options.chat ?? gyreChat
  const { tokenizer } = chatFormat
  const endOfTurn = chatFormat.stopIds.map((id) => [id])

  /** The prompt ids of a request, within the context limit (counted without blocking the event loop for long: `../openai/prompt.ts`). */
  const render = (call: GatewayCall, req: TurnRequest): Effect.Effect<Int32Array, ApiError> =>
    chatFormat.prompt(req.messages, req.tools, call.session.turns, options.maxContextTokens).pipe(
      Effect.mapError((e) => contextLengthExceeded(e.limit, e.tokens, req.param, e.atLeast))
    )

  /** A request's sampling (the run's, else the request's, else the defaults), stopping at `stop` (token sequences). */
  const sampling = (
    req: Pick<TurnRequest, "maxTokens" | "temperature" | "topP" | "seed">,
    stop: ReadonlyArray<ArrayLike<number>>
  ): SamplingParams => ({
    maxTokens: req.maxTokens ?? options.defaultMaxTokens,
    temperature: options.sampling?.temperature ?? req.temperature ?? 1,
    topP: options.sampling?.topP ?? req.topP ?? 1,
    seed: req.seed ?? null,
    stop: stop.map((s) => Int32Array.from(s))
  })
  const samplingOf = (req: TurnRequest, more: ReadonlyArray<ArrayLike<number>> = []) =>
    sampling(req, [...(req.ignoreEos === true ? [] : endOfTurn), ...req.stops.map((s) => tokenizer.encode(s)), ...more])

  /** The text the turn must start with for its tool choice (a call's start; with a name, up to its arguments). */
  const forcedStart = (req: TurnRequest, withTools: boolean): string => {
    if (!withTools || chatFormat.callStart === undefined) return ""
    if (req.toolChoice === "required") return chatFormat.callStart()
    return typeof req.toolChoice === "object" ? chatFormat.callStart(req.toolChoice.name) : ""
  }

  /** The calls a turn answers with: only the named function's (a named tool choice), only the first without parallel calls. */
  const admitted = <C extends { readonly name: string }>(req: TurnRequest, calls: ReadonlyArray<C>): ReadonlyArray<C> => {
    const choice = req.toolChoice
    const named = typeof choice === "object" ? calls.filter((c) => c.name === choice.name) : calls
    return req.parallelToolCalls ? named : named.slice(0, 1)
  }

  /**
   * Generates, records and remembers one turn; `toolCallId` names each tool call it makes
   * (default: ids of the kind the model's chat template accepts).
   */
  const run = (
    call: GatewayCall,
    callId: string,
    req: TurnRequest,
    onDelta: ((delta: TurnDelta) => void) | undefined,
    toolCallId: () => string = chatFormat.toolFormat.newCallId
  ): Effect.Effect<TurnAnswer, ApiError> =>
    Effect.gen(function* () {
      const choice = req.toolChoice
      if (typeof choice === "object" && !req.tools.some((t) => t.function.name === choice.name)) {
        return yield* Effect.fail(apiError(400, `The tool choice names function '${choice.name}', which is not among the request's tools.`, { param: "tool_choice" }))
      }
      const withTools = req.tools.length > 0 && choice !== "none"
      const forced = forcedStart(req, withTools)
      const forcedIds = Int32Array.from(tokenizer.encode(forced))
      const rendered = yield* render(call, req)
      const prompt = new Int32Array(rendered.length + forcedIds.length)
      prompt.set(rendered)
      prompt.set(forcedIds, rendered.length)
      const format = withTools ? chatFormat.toolFormat : undefined
      const reader = {
        tokenizer,
        stops: req.stops,
        markers: chatFormat.markers,
        format,
        tools: req.tools,
        prefix: forced,
        inReasoning: endsInReasoning(tokenizer.decode(prompt.subarray(Math.max(0, prompt.length - 16))))
      }
      const read = (output: ArrayLike<number>, final: boolean) => {
        const r = readTurn(output, final, reader)
        return { ...r, calls: admitted(req, r.calls) }
      }
      const deltas = new TurnDeltas(toolCallId)
      const seen: Array<number> = []
      const onTokens =
        onDelta === undefined
          ? undefined
          : (step: StepTokens) => {
              seen.push(...step.tokens)
              const d = deltas.next(read(seen, false))
              onDelta({ content: d.content, reasoning: d.reasoning, toolCalls: d.calls, step, promptTokens: prompt.length })
            }
      // Without parallel calls, generation ends with the first call's closing text, where the format has one.
      const closer = withTools && !req.parallelToolCalls && format?.closer !== undefined ? [tokenizer.encode(format.closer)] : []
      let answer: Omit<TurnAnswer, "result"> | undefined
      let last: ReadingDelta | undefined
      const result = yield* options.generate(call, callId, prompt, samplingOf(req, closer), onTokens, (r) => {
        const reading = read(r.output, true)
        last = deltas.next(reading)
        const ids = deltas.ids
        const toolCalls = reading.calls.map((c, i) => ({ id: ids[i]!, name: c.name, arguments: c.arguments }))
        const finishReason: FinishReason = toolCalls.length > 0 ? "tool_calls" : r.finishReason === "length" ? "length" : "stop"
        const stopSequence = req.stops.length === 0 ? null : firstStop(tokenizer.decode(r.output, { skipSpecial: true }), req.stops)
        const content = toolCalls.length > 0 && reading.content.trim() === "" ? null : reading.content
        answer = { content, reasoning: reading.reasoning === "" ? null : reading.reasoning, toolCalls, finishReason, stopSequence }
        const turn = new Int32Array(forcedIds.length + r.output.length)
        turn.set(forcedIds)
        turn.set(r.output, forcedIds.length)
        call.session.turns.remember(turn, toolCalls.map((c) => c.id), content ?? "")
        return { finishReason, toolCalls: Object.fromEntries(toolCalls.map((c, i) => [c.id, reading.calls[i]!.raw])) }
      })
      // the last delta goes out once the call is recorded
      onDelta?.({ content: last!.content, reasoning: last!.reasoning, toolCalls: last!.calls, step: undefined, promptTokens: prompt.length })
      return { ...answer!, result }
    })

  return { render, run, sampling, tokenizer }
}

export type ChatTurns = ReturnType<typeof chatTurns>
