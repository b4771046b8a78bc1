/**
 * The gateway's OpenAI endpoints over one `generate` function (route, record, answer):
 *
 *   POST /v1/chat/completions   messages, max_tokens, temperature, top_p, stop, seed, tools,
 *                               stream (server-sent events, `data: {...}` then `data: [DONE]`)
 *   POST /v1/completions        a text or token-id prompt (no chat template)
 *   GET  /v1/models, /v1/models/<id>
 *
 * A chat request is rendered to tokens with the model's chat format (`options.chat`: Gyre's
 * byte-level template, `../openai/chat.ts`, or a checkpoint's own, `../openai/hf-chat.ts`;
 * both use the execution's remembered assistant turns token-exact), counted with the model's
 * tokenizer against `maxContextTokens` without blocking the event loop (`../openai/prompt.ts`);
 * streamed text is only ever a prefix of the final text (stop strings and tool calls held back
 * until decided).
 */
import { nuid } from "@nats-io/transport-node"
import { Effect } from "effect"
import { type ChatFormat, gyreChat, parseToolCalls, tokenText, visibleText } from "../openai/chat.ts"
import {
  ChatCompletionRequest,
  CompletionRequest,
  apiError,
  chatChunk,
  contextLengthExceeded,
  chatCompletion,
  completion,
  decodeBody,
  decodeMessages,
  modelList,
  usageChunk,
  usageOf,
  type ApiError,
  type FinishReason,
  type TokenLogprob,
  type Usage
} from "../openai/openai.ts"
import { promptWithin, type PromptPiece } from "../openai/prompt.ts"
import type { SamplingParams, StepTokens } from "../protocols/rollout.ts"
import type { Sampling } from "../tree/record.ts"
import type { CallResult } from "./call-router.ts"
import { eventStream, sendJson, type HttpCall, type Methods } from "./http.ts"
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

export interface EndpointsOptions {
  readonly model: string
  /** Unix seconds the model has been served since (for /v1/models). */
  readonly servingSince: number
  readonly defaultMaxTokens: number
  /** Longest prompt the workers take (tokens); a longer one is a 400 before it is routed. Unknown: the worker decides. */
  readonly maxContextTokens?: number | undefined
  readonly generate: Generate
  /** The model's tokenizer and chat template (default Gyre's byte-level ones). */
  readonly chat?: ChatFormat
  /**
   * A training run's sampling: it replaces the request's `temperature` and `top_p`, so every
   * call's tokens come from the distribution the trainer corrects for. Unset (`gyre serve`):
   * the request's.
   */
  readonly sampling?: Sampling | undefined
}


const stopsOf = (stop: string | ReadonlyArray<string> | null | undefined): Array<string> =>
  (stop === null || stop === undefined ? [] : typeof stop === "string" ? [stop] : stop).filter((s) => s !== "")

/** The routes of the OpenAI API, by path. */
export const openAiRoutes = (options: EndpointsOptions) => {
  const { model, servingSince, generate } = options
  const chatFormat = options.chat ?? gyreChat
  const { tokenizer } = chatFormat
  const encode = (text: string) => tokenizer.encode(text)
  const endOfTurn = chatFormat.stopIds.map((id) => [id])
  const endOfText = chatFormat.eosIds.map((id) => [id])
  const logprobsOf = (tokens: ArrayLike<number>, logprobs: ArrayLike<number>): Array<TokenLogprob> =>
    Array.from(tokens, (t, i) => ({ token: tokenText(t, tokenizer), logprob: logprobs[i]!, bytes: tokenizer.tokenBytes(t), top_logprobs: [] }))

  const unknownModel = (name: string) =>
    apiError(404, `The model '${name}' does not exist. This gateway serves '${model}'.`, { param: "model", code: "model_not_found" })

  const samplingOf = (
    req: { readonly max_tokens?: number | null | undefined; readonly temperature?: number | null | undefined; readonly top_p?: number | null | undefined; readonly seed?: number | null | undefined },
    maxTokens: number | null | undefined,
    stops: ReadonlyArray<ReadonlyArray<number>>
  ): SamplingParams => ({
    maxTokens: maxTokens ?? req.max_tokens ?? options.defaultMaxTokens,
    temperature: options.sampling?.temperature ?? req.temperature ?? 1,
    topP: options.sampling?.topP ?? req.top_p ?? 1,
    seed: req.seed ?? null,
    stop: stops.map((s) => Int32Array.from(s))
  })

  const chat = (call: GatewayCall, body: unknown) =>
    Effect.gen(function* () {
      const req = yield* decodeBody(ChatCompletionRequest, body)
      if (req.model !== model) return yield* Effect.fail(unknownModel(req.model))
      const messages = yield* decodeMessages(body)
      const tools = req.tools ?? []
      const withTools = tools.length > 0 && req.tool_choice !== "none"
      const prompt = yield* chatFormat.prompt(messages, tools, call.session.turns, options.maxContextTokens).pipe(
        Effect.mapError((e) => contextLengthExceeded(e.limit, e.tokens, "messages", e.atLeast))
      )
      const stops = stopsOf(req.stop)
      const sampling = samplingOf(req, req.max_completion_tokens, [...(req.ignore_eos === true ? [] : endOfTurn), ...stops.map(encode)])
      const id = `chatcmpl-${nuid.next()}`
      const created = Math.floor(call.startedAt / 1000)
      const wantLogprobs = req.logprobs === true
      const stream = req.stream === true ? eventStream(call.res) : undefined
      const seen: Array<number> = []
      let emitted = ""
      const onTokens =
        stream === undefined
          ? undefined
          : (step: StepTokens) => {
              if (!stream.started) stream.send(chatChunk(id, created, model, { role: "assistant", content: "" }, null, null))
              seen.push(...step.tokens)
              const text = visibleText(seen, stops, { final: false, holdToolCalls: withTools }, tokenizer)
              const lp = wantLogprobs ? logprobsOf(step.tokens, step.logprobs) : null
              if (text.length > emitted.length || lp !== null) {
                stream.send(chatChunk(id, created, model, { content: text.slice(emitted.length) }, null, lp))
                emitted = text
              }
            }
      let message: { content: string | null; toolCalls: Array<{ id: string; type: "function"; function: { name: string; arguments: string } }> } = { content: null, toolCalls: [] }
      let finishReason: FinishReason = "stop"
      const result = yield* generate(call, id, prompt, sampling, onTokens, (r) => {
        const text = visibleText(r.output, stops, { final: true, holdToolCalls: false }, tokenizer)
        const parsed = withTools ? parseToolCalls(text) : { content: text, toolCalls: [] }
        const toolCalls = parsed.toolCalls.map((c) => ({ id: `call_${nuid.next()}`, type: "function" as const, function: { name: c.name, arguments: c.arguments } }))
        finishReason = toolCalls.length > 0 ? "tool_calls" : r.finishReason === "length" ? "length" : "stop"
        message = { content: toolCalls.length > 0 && parsed.content.trim() === "" ? null : parsed.content, toolCalls }
        call.session.turns.remember(r.output, toolCalls.map((c) => c.id), message.content ?? "")
        return { finishReason, toolCalls: Object.fromEntries(toolCalls.map((c, i) => [c.id, parsed.toolCalls[i]!.raw])) }
      })
      const usage = usageOf(result.promptTokens, result.output.length, result.cachedTokens)
      if (stream === undefined) {
        const choice = { role: "assistant" as const, content: message.content, ...(message.toolCalls.length > 0 ? { tool_calls: message.toolCalls } : {}) }
        return sendJson(call.res, 200, chatCompletion(id, created, model, choice, finishReason, usage, wantLogprobs ? logprobsOf(result.output, result.logprobs) : null))
      }
      if (!stream.started) stream.send(chatChunk(id, created, model, { role: "assistant", content: "" }, null, null))
      const content = message.content ?? ""
      if (content.length > emitted.length && content.startsWith(emitted)) stream.send(chatChunk(id, created, model, { content: content.slice(emitted.length) }, null, null))
      if (message.toolCalls.length > 0) stream.send(chatChunk(id, created, model, { tool_calls: message.toolCalls.map((c, index) => ({ index, ...c })) }, null, null))
      stream.send(chatChunk(id, created, model, {}, finishReason, null))
      if (req.stream_options?.include_usage === true) stream.send(usageChunk(id, created, model, "chat.completion.chunk", usage))
      stream.end()
    })

  const completions = (call: GatewayCall, body: unknown) =>
    Effect.gen(function* () {
      const req = yield* decodeBody(CompletionRequest, body)
      if (req.model !== model) return yield* Effect.fail(unknownModel(req.model))
      const p = req.prompt
      const first = Array.isArray(p) ? p[0] : p
      const pieces: Array<PromptPiece> =
        typeof first === "string"
          ? [chatFormat.bos === undefined ? [] : [chatFormat.bos], first]
          : [Array.isArray(first) ? (first as ReadonlyArray<number>) : (p as ReadonlyArray<number>)]
      const prompt = yield* promptWithin(tokenizer, pieces, options.maxContextTokens).pipe(
        Effect.mapError((e) => contextLengthExceeded(e.limit, e.tokens, "prompt", e.atLeast))
      )
      const bad = prompt.findIndex((t) => t >= tokenizer.vocabSize)
      if (bad >= 0) return yield* Effect.fail(apiError(400, `Invalid token id ${prompt[bad]} in 'prompt': ids are below ${tokenizer.vocabSize}.`, { param: "prompt" }))
      const stops = stopsOf(req.stop)
      const sampling = samplingOf(req, undefined, [...(req.ignore_eos === true ? [] : endOfText), ...stops.map(encode)])
      const id = `cmpl-${nuid.next()}`
      const created = Math.floor(call.startedAt / 1000)
      const stream = req.stream === true ? eventStream(call.res) : undefined
      const seen: Array<number> = []
      let emitted = ""
      const chunk = (text: string, finish: FinishReason | null) => completion(id, created, model, text, finish, undefined)
      const onTokens =
        stream === undefined
          ? undefined
          : (step: StepTokens) => {
              seen.push(...step.tokens)
              const text = visibleText(seen, stops, { final: false, holdToolCalls: false }, tokenizer)
              if (text.length > emitted.length) {
                stream.send(chunk(text.slice(emitted.length), null))
                emitted = text
              }
            }
      let finishReason: FinishReason = "stop"
      const result = yield* generate(call, id, prompt, sampling, onTokens, (r) => {
        finishReason = r.finishReason === "length" ? "length" : "stop"
        return { finishReason, toolCalls: {} }
      })
      const text = visibleText(result.output, stops, { final: true, holdToolCalls: false }, tokenizer)
      const usage: Usage = usageOf(result.promptTokens, result.output.length, result.cachedTokens)
      if (stream === undefined) return sendJson(call.res, 200, completion(id, created, model, text, finishReason, usage))
      if (text.length > emitted.length && text.startsWith(emitted)) stream.send(chunk(text.slice(emitted.length), null))
      stream.send(chunk("", finishReason))
      if (req.stream_options?.include_usage === true) stream.send(usageChunk(id, created, model, "text_completion", usage))
      stream.end()
    })

  const withBody = (handler: (call: GatewayCall, body: unknown) => Effect.Effect<void, ApiError>) => (call: GatewayCall) =>
    call.json.pipe(Effect.flatMap((body) => handler(call, body)))

  const routes: Record<string, Methods<Session>> = {
    "/v1/chat/completions": { POST: withBody(chat) },
    "/v1/completions": { POST: withBody(completions) },
    "/v1/models": { GET: (call) => Effect.sync(() => sendJson(call.res, 200, modelList(model, servingSince))) }
  }
  return (path: string): Methods<Session> | undefined => {
    if (Object.hasOwn(routes, path)) return routes[path]
    if (path.startsWith("/v1/models/")) {
      const name = path.slice("/v1/models/".length)
      return { GET: (call) => (name === model ? Effect.sync(() => sendJson(call.res, 200, modelList(model, servingSince).data[0])) : Effect.fail(unknownModel(name))) }
    }
    return undefined
  }
}
