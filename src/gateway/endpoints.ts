/**
 * The gateway's OpenAI endpoints over one `generate` function (route, record, answer):
 *
 *   POST /v1/chat/completions   messages, max_tokens, temperature, top_p, stop, seed, tools,
 *                               tool_choice, parallel_tool_calls, stream (server-sent events,
 *                               `data: {...}` then `data: [DONE]`); answers reasoning_content
 *                               and tool calls (arguments streamed as generated); n > 1,
 *                               top_logprobs and a JSON response_format are 400s
 *   POST /v1/completions        a text or token-id prompt (no chat template)
 *   GET  /v1/models, /v1/models/<id>
 *
 * A chat request is a turn (`./chat-turn.ts`: rendered to tokens with the model's chat format,
 * `../openai/chat.ts` or a checkpoint's own, `../openai/hf-chat.ts`, using the execution's
 * remembered assistant turns token-exact, read back as reasoning, content and tool calls in the
 * model's format); each streamed field is only ever a prefix of the final one.
 */
import { nuid } from "@nats-io/transport-node"
import { Context, Effect, Layer } from "effect"
import { visibleText } from "../openai/chat.ts"
import {
  ChatCompletionRequest,
  CompletionRequest,
  apiError,
  chatChunk,
  chatCompletion,
  completion,
  contextLengthExceeded,
  decodeBody,
  decodeMessages,
  modelList,
  usageChunk,
  usageOf,
  type ApiError,
  type FinishReason,
  type ToolCallDelta,
  type TokenLogprob,
  type Usage
} from "../openai/openai.ts"
import { promptWithin, type PromptPiece } from "../openai/prompt.ts"
import type { StepTokens } from "../protocols/rollout.ts"
import type { ChatTurnsShape, GatewayCall, Generate, TurnAnswer, TurnDelta, TurnRequest } from "./chat-turn.ts"
import { eventStream, sendJson, withBody, type EventStream, type Methods } from "./http.ts"
import type { Session } from "./sessions.ts"
import { served, tokenLogprobs } from "./turn-output.ts"

export interface EndpointsOptions {
  readonly model: string
  /** Unix seconds the model has been served since (for /v1/models). */
  readonly servingSince: number
  /** Longest prompt the workers take (tokens); a longer one is a 400 before it is routed. Unknown: the worker decides. */
  readonly maxContextTokens?: number | undefined
  readonly generate: Generate
  /** Chat turns over the model's tokenizer and chat template. */
  readonly turns: ChatTurnsShape
  /** The model's chat format (its eos ids and bos for plain completions). */
  readonly chat: { readonly eosIds: ReadonlyArray<number>; readonly bos: number | undefined }
}

export const stopsOf = (stop: string | ReadonlyArray<string> | null | undefined): Array<string> =>
  (stop === null || stop === undefined ? [] : typeof stop === "string" ? [stop] : stop).filter((s) => s !== "")

/** A streamed tool call in chat's form: id, type and name in its first delta, arguments in each. */
const toolCallDelta = (c: TurnDelta["toolCalls"][number]): ToolCallDelta => ({
  index: c.index,
  ...(c.id === undefined ? {} : { id: c.id, type: "function" as const }),
  function: { ...(c.name === undefined ? {} : { name: c.name }), arguments: c.arguments }
})

/** What a chat request may ask that the gateway does not do: a 400 naming it, never ignored. */
const unsupported = (req: ChatCompletionRequest): Effect.Effect<void, ApiError> => {
  const refuse = (param: string, message: string) => Effect.fail(apiError(400, message, { param, code: "unsupported_parameter" }))
  if ((req.n ?? 1) > 1) return refuse("n", "Only n = 1 is supported: one choice per request (send the request n times for n samples).")
  if ((req.top_logprobs ?? 0) > 0) return refuse("top_logprobs", "top_logprobs is not supported: the gateway returns the log-prob of each sampled token only (top_logprobs 0).")
  const format = req.response_format?.type ?? "text"
  if (format !== "text") {
    return refuse("response_format", `response_format '${format}' is not supported: generation is not constrained to JSON, so only 'text' is accepted.`)
  }
  return Effect.void
}

/** The OpenAI API's routes: its handlers by path. */
export interface OpenAiRoutesShape {
  /** The handlers of `path` by HTTP method; undefined for a path this API does not have. */
  readonly route: (path: string) => Methods<Session> | undefined
  /** POST /v1/chat/completions with its JSON body. */
  readonly chat: (call: GatewayCall, body: unknown) => Effect.Effect<void, ApiError>
  /** POST /v1/completions with its JSON body. */
  readonly completions: (call: GatewayCall, body: unknown) => Effect.Effect<void, ApiError>
}

/** A chat request as a turn (`./chat-turn.ts`). */
const turnOf = (req: ChatCompletionRequest, messages: TurnRequest["messages"]): TurnRequest => {
  const toolChoice = req.tool_choice ?? "auto"
  return {
    messages,
    tools: req.tools ?? [],
    toolChoice: typeof toolChoice === "string" ? toolChoice : { name: toolChoice.function.name },
    parallelToolCalls: req.parallel_tool_calls ?? true,
    stops: stopsOf(req.stop),
    maxTokens: req.max_completion_tokens ?? req.max_tokens,
    temperature: req.temperature,
    topP: req.top_p,
    seed: req.seed,
    ignoreEos: req.ignore_eos === true,
    param: "messages"
  }
}

/** What every response of one request names: its id, creation time (Unix seconds) and model. */
interface Answering {
  readonly id: string
  readonly created: number
  readonly model: string
}

/**
 * A streamed chat answer: the role chunk first (once), then per delta its reasoning, content
 * (with the step's log-probs when asked) and tool calls.
 */
const chatStream = (stream: EventStream, a: Answering, logprobsOf: ((step: StepTokens) => Array<TokenLogprob>) | undefined) => {
  const first = () => {
    if (!stream.started) stream.send(chatChunk(a.id, a.created, a.model, { role: "assistant", content: "" }, null, null))
  }
  const onDelta = (delta: TurnDelta) => {
    first()
    const lp = logprobsOf !== undefined && delta.step !== undefined ? logprobsOf(delta.step) : null
    if (delta.reasoning !== "") stream.send(chatChunk(a.id, a.created, a.model, { reasoning_content: delta.reasoning }, null, null))
    if (delta.content !== "" || lp !== null) stream.send(chatChunk(a.id, a.created, a.model, { content: delta.content }, null, lp))
    if (delta.toolCalls.length > 0) stream.send(chatChunk(a.id, a.created, a.model, { tool_calls: delta.toolCalls.map(toolCallDelta) }, null, null))
  }
  /** The finish chunk, the usage when asked, the end. */
  const end = (finishReason: FinishReason, usage: Usage | undefined) => {
    first()
    stream.send(chatChunk(a.id, a.created, a.model, {}, finishReason, null))
    if (usage !== undefined) stream.send(usageChunk(a.id, a.created, a.model, "chat.completion.chunk", usage))
    stream.end()
  }
  return { onDelta, end }
}

/** The text a streamed completion has shown so far, and the chunks that show more. */
const completionStream = (stream: EventStream, a: Answering, stops: ReadonlyArray<string>, tokenizer: ChatTurnsShape["tokenizer"]) => {
  const seen: Array<number> = []
  const shown = { text: "" }
  const chunk = (text: string, finish: FinishReason | null) => completion(a.id, a.created, a.model, text, finish, undefined)
  const onTokens = (step: StepTokens) => {
    seen.push(...step.tokens)
    const text = visibleText(seen, stops, { final: false }, tokenizer)
    if (text.length > shown.text.length) {
      stream.send(chunk(text.slice(shown.text.length), null))
      shown.text = text
    }
  }
  /** The rest of the final text, the finish, the usage when asked, the end. */
  const end = (text: string, finishReason: FinishReason, usage: Usage | undefined) => {
    if (text.length > shown.text.length && text.startsWith(shown.text)) stream.send(chunk(text.slice(shown.text.length), null))
    stream.send(chunk("", finishReason))
    if (usage !== undefined) stream.send(usageChunk(a.id, a.created, a.model, "text_completion", usage))
    stream.end()
  }
  return { onTokens, end }
}

/** What the handlers share: the options and the model's tokenizer. */
interface Endpoints {
  readonly options: EndpointsOptions
  readonly tokenizer: ChatTurnsShape["tokenizer"]
}

const answering = (e: Endpoints, call: GatewayCall, prefix: string): Answering => ({ id: `${prefix}-${nuid.next()}`, created: Math.floor(call.startedAt / 1000), model: e.options.model })

/** A chat answer as one completion object. */
const chatAnswer = (e: Endpoints, a: Answering, answer: TurnAnswer, usage: Usage, wantLogprobs: boolean) => {
  const toolCalls = answer.toolCalls.map((c) => ({ id: c.id, type: "function" as const, function: { name: c.name, arguments: c.arguments } }))
  const choice = {
    role: "assistant" as const,
    content: answer.content,
    ...(answer.reasoning === null ? {} : { reasoning_content: answer.reasoning }),
    ...(toolCalls.length > 0 ? { tool_calls: toolCalls } : {})
  }
  const { result } = answer
  return chatCompletion(a.id, a.created, a.model, choice, answer.finishReason, usage, wantLogprobs ? tokenLogprobs(e.tokenizer, result.output, result.logprobs) : null)
}

const chat = (e: Endpoints) =>
  Effect.fn("OpenAi.chat")(function* (call: GatewayCall, body: unknown) {
    const req = yield* decodeBody(ChatCompletionRequest, body)
    yield* served(e.options.model, req.model)
    yield* unsupported(req)
    const turn = turnOf(req, yield* decodeMessages(body))
    const a = answering(e, call, "chatcmpl")
    const wantLogprobs = req.logprobs === true
    const stream = req.stream === true ? chatStream(eventStream(call.res), a, wantLogprobs ? (s) => tokenLogprobs(e.tokenizer, s.tokens, s.logprobs) : undefined) : undefined
    const answer = yield* e.options.turns.run(call, a.id, turn, stream?.onDelta)
    const { result, finishReason } = answer
    const usage = usageOf(result.promptTokens, result.output.length, result.cachedTokens)
    if (stream === undefined) return sendJson(call.res, 200, chatAnswer(e, a, answer, usage, wantLogprobs))
    stream.end(finishReason, req.stream_options?.include_usage === true ? usage : undefined)
  })

/** A completion's prompt ids: a text prompt after bos, or token ids; within the context limit and the vocabulary. */
const completionPrompt = (e: Endpoints) =>
  Effect.fn("OpenAi.completionPrompt")(function* (p: CompletionRequest["prompt"]) {
    const { tokenizer, options } = e
    const first = Array.isArray(p) ? p[0] : p
    const pieces: Array<PromptPiece> =
      typeof first === "string"
        ? [options.chat.bos === undefined ? [] : [options.chat.bos], first]
        : [Array.isArray(first) ? (first as ReadonlyArray<number>) : (p as ReadonlyArray<number>)]
    const prompt = yield* promptWithin(tokenizer, pieces, options.maxContextTokens).pipe(
      Effect.mapError((err) => contextLengthExceeded(err.limit, err.tokens, "prompt", err.atLeast))
    )
    const bad = prompt.findIndex((t) => t >= tokenizer.vocabSize)
    if (bad >= 0) return yield* Effect.fail(apiError(400, `Invalid token id ${prompt[bad]} in 'prompt': ids are below ${tokenizer.vocabSize}.`, { param: "prompt" }))
    return prompt
  })

const completions = (e: Endpoints) => {
  const promptOf = completionPrompt(e)
  const endOfText = e.options.chat.eosIds.map((id) => [id])
  return Effect.fn("OpenAi.completions")(function* (call: GatewayCall, body: unknown) {
    const { tokenizer, options } = e
    const req = yield* decodeBody(CompletionRequest, body)
    yield* served(e.options.model, req.model)
    const prompt = yield* promptOf(req.prompt)
    const stops = stopsOf(req.stop)
    const sampling = options.turns.sampling({ maxTokens: req.max_tokens, temperature: req.temperature, topP: req.top_p, seed: req.seed }, [
      ...(req.ignore_eos === true ? [] : endOfText),
      ...stops.map((s) => tokenizer.encode(s))
    ])
    const a = answering(e, call, "cmpl")
    const stream = req.stream === true ? completionStream(eventStream(call.res), a, stops, tokenizer) : undefined
    const finished = { reason: "stop" as FinishReason }
    const result = yield* options.generate(call, a.id, prompt, sampling, stream?.onTokens, (r) => {
      finished.reason = r.finishReason === "length" ? "length" : "stop"
      return { finishReason: finished.reason, toolCalls: {} }
    })
    const text = visibleText(result.output, stops, { final: true }, tokenizer)
    const usage: Usage = usageOf(result.promptTokens, result.output.length, result.cachedTokens)
    if (stream === undefined) return sendJson(call.res, 200, completion(a.id, a.created, a.model, text, finished.reason, usage))
    stream.end(text, finished.reason, req.stream_options?.include_usage === true ? usage : undefined)
  })
}

const makeOpenAiRoutes = (options: EndpointsOptions): OpenAiRoutesShape => {
  const { model, servingSince } = options
  const e: Endpoints = { options, tokenizer: options.turns.tokenizer }
  const handlers = { chat: chat(e), completions: completions(e) }
  const models = (call: GatewayCall) => Effect.sync(() => sendJson(call.res, 200, modelList(model, servingSince)))
  const routes: Record<string, Methods<Session>> = {
    "/v1/chat/completions": { POST: withBody(handlers.chat) },
    "/v1/completions": { POST: withBody(handlers.completions) },
    "/v1/models": { GET: models }
  }
  const route = (path: string): Methods<Session> | undefined => {
    if (Object.hasOwn(routes, path)) return routes[path]
    if (!path.startsWith("/v1/models/")) return undefined
    const name = path.slice("/v1/models/".length)
    return { GET: (call) => served(e.options.model, name).pipe(Effect.andThen(Effect.sync(() => sendJson(call.res, 200, modelList(model, servingSince).data[0])))) }
  }
  return { route, ...handlers }
}

/** The OpenAI API's routes over one model's `generate` and chat turns. */
export class OpenAiRoutes extends Context.Service<OpenAiRoutes, OpenAiRoutesShape>()("gyre/gateway/OpenAiRoutes") {
  static readonly make = makeOpenAiRoutes
  static readonly layer = (options: EndpointsOptions) => Layer.succeed(OpenAiRoutes, makeOpenAiRoutes(options))
}
