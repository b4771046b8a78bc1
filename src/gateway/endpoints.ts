/**
 * The gateway's OpenAI endpoints over one `generate` function (route, record, answer):
 *
 *   POST /v1/chat/completions   messages, max_tokens, temperature, top_p, stop, seed, tools,
 *                               stream (server-sent events, `data: {...}` then `data: [DONE]`)
 *   POST /v1/completions        a text or token-id prompt (no chat template)
 *   GET  /v1/models, /v1/models/<id>
 *
 * A chat request is a turn (`./chat-turn.ts`: rendered to tokens with the model's chat format,
 * `../openai/chat.ts` or a checkpoint's own, `../openai/hf-chat.ts`, using the execution's
 * remembered assistant turns token-exact); streamed text is only ever a prefix of the final
 * text (stop strings and tool calls held back until decided).
 */
import { nuid } from "@nats-io/transport-node"
import { Effect } from "effect"
import { tokenText, visibleText } from "../openai/chat.ts"
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
import type { ChatTurns, GatewayCall, Generate, TurnDelta } from "./chat-turn.ts"
import { eventStream, sendJson, withBody, type Methods } from "./http.ts"
import type { Session } from "./sessions.ts"

export interface EndpointsOptions {
  readonly model: string
  /** Unix seconds the model has been served since (for /v1/models). */
  readonly servingSince: number
  /** Longest prompt the workers take (tokens); a longer one is a 400 before it is routed. Unknown: the worker decides. */
  readonly maxContextTokens?: number | undefined
  readonly generate: Generate
  /** Chat turns over the model's tokenizer and chat template. */
  readonly turns: ChatTurns
  /** The model's chat format (its eos ids and bos for plain completions). */
  readonly chat: { readonly eosIds: ReadonlyArray<number>; readonly bos: number | undefined }
}

export const stopsOf = (stop: string | ReadonlyArray<string> | null | undefined): Array<string> =>
  (stop === null || stop === undefined ? [] : typeof stop === "string" ? [stop] : stop).filter((s) => s !== "")

/** The 404 of a model this gateway does not serve. */
export const unknownModel = (name: string, model: string) =>
  apiError(404, `The model '${name}' does not exist. This gateway serves '${model}'.`, { param: "model", code: "model_not_found" })

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

/** The routes of the OpenAI API, by path. */
export const openAiRoutes = (options: EndpointsOptions) => {
  const { model, servingSince, generate, turns } = options
  const { tokenizer } = turns
  const encode = (text: string) => tokenizer.encode(text)
  const endOfText = options.chat.eosIds.map((id) => [id])
  const logprobsOf = (tokens: ArrayLike<number>, logprobs: ArrayLike<number>): Array<TokenLogprob> =>
    Array.from(tokens, (t, i) => ({ token: tokenText(t, tokenizer), logprob: logprobs[i]!, bytes: tokenizer.tokenBytes(t), top_logprobs: [] }))

  const chat = (call: GatewayCall, body: unknown) =>
    Effect.gen(function* () {
      const req = yield* decodeBody(ChatCompletionRequest, body)
      if (req.model !== model) return yield* Effect.fail(unknownModel(req.model, model))
      yield* unsupported(req)
      const messages = yield* decodeMessages(body)
      const toolChoice = req.tool_choice ?? "auto"
      const turn = {
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
      } as const
      const id = `chatcmpl-${nuid.next()}`
      const created = Math.floor(call.startedAt / 1000)
      const wantLogprobs = req.logprobs === true
      const stream = req.stream === true ? eventStream(call.res) : undefined
      const first = () => {
        if (stream !== undefined && !stream.started) stream.send(chatChunk(id, created, model, { role: "assistant", content: "" }, null, null))
      }
      const answer = yield* turns.run(
        call,
        id,
        turn,
        stream === undefined
          ? undefined
          : (delta) => {
              first()
              const lp = wantLogprobs && delta.step !== undefined ? logprobsOf(delta.step.tokens, delta.step.logprobs) : null
              if (delta.reasoning !== "") stream.send(chatChunk(id, created, model, { reasoning_content: delta.reasoning }, null, null))
              if (delta.content !== "" || lp !== null) stream.send(chatChunk(id, created, model, { content: delta.content }, null, lp))
              if (delta.toolCalls.length > 0) stream.send(chatChunk(id, created, model, { tool_calls: delta.toolCalls.map(toolCallDelta) }, null, null))
            }
      )
      const { result, finishReason } = answer
      const toolCalls = answer.toolCalls.map((c) => ({ id: c.id, type: "function" as const, function: { name: c.name, arguments: c.arguments } }))
      const usage = usageOf(result.promptTokens, result.output.length, result.cachedTokens)
      if (stream === undefined) {
        const choice = {
          role: "assistant" as const,
          content: answer.content,
          ...(answer.reasoning === null ? {} : { reasoning_content: answer.reasoning }),
          ...(toolCalls.length > 0 ? { tool_calls: toolCalls } : {})
        }
        return sendJson(call.res, 200, chatCompletion(id, created, model, choice, finishReason, usage, wantLogprobs ? logprobsOf(result.output, result.logprobs) : null))
      }
      first()
      stream.send(chatChunk(id, created, model, {}, finishReason, null))
      if (req.stream_options?.include_usage === true) stream.send(usageChunk(id, created, model, "chat.completion.chunk", usage))
      stream.end()
    })

  const completions = (call: GatewayCall, body: unknown) =>
    Effect.gen(function* () {
      const req = yield* decodeBody(CompletionRequest, body)
      if (req.model !== model) return yield* Effect.fail(unknownModel(req.model, model))
      const p = req.prompt
      const first = Array.isArray(p) ? p[0] : p
      const pieces: Array<PromptPiece> =
        typeof first === "string"
          ? [options.chat.bos === undefined ? [] : [options.chat.bos], first]
          : [Array.isArray(first) ? (first as ReadonlyArray<number>) : (p as ReadonlyArray<number>)]
      const prompt = yield* promptWithin(tokenizer, pieces, options.maxContextTokens).pipe(
        Effect.mapError((e) => contextLengthExceeded(e.limit, e.tokens, "prompt", e.atLeast))
      )
      const bad = prompt.findIndex((t) => t >= tokenizer.vocabSize)
      if (bad >= 0) return yield* Effect.fail(apiError(400, `Invalid token id ${prompt[bad]} in 'prompt': ids are below ${tokenizer.vocabSize}.`, { param: "prompt" }))
      const stops = stopsOf(req.stop)
      const sampling = turns.sampling({ maxTokens: req.max_tokens, temperature: req.temperature, topP: req.top_p, seed: req.seed }, [
        ...(req.ignore_eos === true ? [] : endOfText),
        ...stops.map(encode)
      ])
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
              const text = visibleText(seen, stops, { final: false }, tokenizer)
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
      const text = visibleText(result.output, stops, { final: true }, tokenizer)
      const usage: Usage = usageOf(result.promptTokens, result.output.length, result.cachedTokens)
      if (stream === undefined) return sendJson(call.res, 200, completion(id, created, model, text, finishReason, usage))
      if (text.length > emitted.length && text.startsWith(emitted)) stream.send(chunk(text.slice(emitted.length), null))
      stream.send(chunk("", finishReason))
      if (req.stream_options?.include_usage === true) stream.send(usageChunk(id, created, model, "text_completion", usage))
      stream.end()
    })

  const routes: Record<string, Methods<Session>> = {
    "/v1/chat/completions": { POST: withBody(chat) },
    "/v1/completions": { POST: withBody(completions) },
    "/v1/models": { GET: (call) => Effect.sync(() => sendJson(call.res, 200, modelList(model, servingSince))) }
  }
  return (path: string): Methods<Session> | undefined => {
    if (Object.hasOwn(routes, path)) return routes[path]
    if (path.startsWith("/v1/models/")) {
      const name = path.slice("/v1/models/".length)
      return { GET: (call) => (name === model ? Effect.sync(() => sendJson(call.res, 200, modelList(model, servingSince).data[0])) : Effect.fail(unknownModel(name, model))) }
    }
    return undefined
  }
}
