/**
 * `POST /v1/messages` and `POST /v1/messages/count_tokens`: the Anthropic Messages API over a
 * chat turn (`./chat-turn.ts`); the request's conversion, the documents and the error shape
 * are `../openai/anthropic.ts`.
 *
 * One writer builds the content blocks from a turn's deltas, in order (thinking, text, then
 * each tool_use); a non-streamed call feeds it the whole answer at once, a streamed one as it
 * is generated, sending named events: `message_start`, `ping`, per block
 * `content_block_start`, `content_block_delta` (`thinking_delta` then `signature_delta`,
 * `text_delta`, `input_json_delta`), `content_block_stop`, then `message_delta` (stop reason,
 * final usage) and `message_stop`. A failure once the stream has started is an `error` event
 * (`anthropicErrors`, through the HTTP layer). `count_tokens` renders the prompt as a call
 * would (the same tokens the context check counts) and answers `{"input_tokens": n}`.
 */
import { nuid } from "@nats-io/transport-node"
import { Context, Effect, Layer } from "effect"
import type * as http from "node:http"
import {
  CountTokensRequest,
  MessagesRequest,
  THINKING_SIGNATURE,
  anthropicErrorBody,
  message,
  messagesUsage,
  requestMessages,
  requestTools,
  toolChoiceOf,
  toolInput,
  type ContentBlock,
  type StopReason
} from "../openai/anthropic.ts"
import { apiError, decodeBody, type ApiError } from "../openai/openai.ts"
import type { ChatTurnsShape, GatewayCall, TurnAnswer, TurnDelta, TurnRequest } from "./chat-turn.ts"
import { sendJson, withBody, type ErrorFormat, type Methods } from "./http.ts"
import type { Session } from "./sessions.ts"
import { served, turnOutput, writeTurn, type DeltaWriter, type Sink, type VisibleDelta } from "./turn-output.ts"

/** Anthropic's error shape, mid-stream as an `error` event. */
export const anthropicErrors: ErrorFormat = {
  body: anthropicErrorBody,
  event: (e) => `event: error\ndata: ${JSON.stringify(anthropicErrorBody(e))}\n\n`
}

/** The error format of a path: Anthropic's on the Messages routes, and on the models routes for a request with `anthropic-version`. */
export const messagesErrorFormat =
  (fallback: ErrorFormat) =>
  (path: string, req: http.IncomingMessage): ErrorFormat =>
    path === "/v1/messages" || path.startsWith("/v1/messages/") || (path.startsWith("/v1/models") && req.headers["anthropic-version"] !== undefined) ? anthropicErrors : fallback

/**
 * Builds a message's content blocks from a turn's deltas, and sends their events to `sink`
 * (streamed calls); a block is stopped when the next one starts, the last when the turn ends.
 */
const contentWriter = (sink: Sink | undefined): DeltaWriter & { readonly finish: (answer: TurnAnswer) => ReadonlyArray<ContentBlock> } => {
  const blocks: Array<ContentBlock> = []
  let open: { readonly kind: ContentBlock["type"]; readonly index: number } | undefined
  const calls = new Map<number, number>()
  const send = (type: string, data: Record<string, unknown>) => sink?.(type, data)
  const close = () => {
    if (open === undefined) return
    if (open.kind === "thinking") send("content_block_delta", { index: open.index, delta: { type: "signature_delta", signature: THINKING_SIGNATURE } })
    send("content_block_stop", { index: open.index })
    open = undefined
  }
  const start = (block: ContentBlock) => {
    close()
    blocks.push(block)
    open = { kind: block.type, index: blocks.length - 1 }
    send("content_block_start", { index: open.index, content_block: block })
    return open.index
  }
  const text = (kind: "thinking" | "text", delta: string) => {
    if (delta === "") return
    const index = open?.kind === kind ? open.index : start(kind === "thinking" ? { type: "thinking", thinking: "", signature: "" } : { type: "text", text: "" })
    const block = blocks[index]!
    if (block.type === "thinking") blocks[index] = { ...block, thinking: block.thinking + delta, signature: THINKING_SIGNATURE }
    else if (block.type === "text") blocks[index] = { ...block, text: block.text + delta }
    send("content_block_delta", { index, delta: kind === "thinking" ? { type: "thinking_delta", thinking: delta } : { type: "text_delta", text: delta } })
  }
  const toolUse = (d: TurnDelta["toolCalls"][number]) => {
    let index = calls.get(d.index)
    if (index === undefined) {
      index = start({ type: "tool_use", id: d.id ?? "", name: d.name ?? "", input: {} })
      calls.set(d.index, index)
    }
    if (d.arguments !== "") send("content_block_delta", { index, delta: { type: "input_json_delta", partial_json: d.arguments } })
  }
  return {
    delta: (d: VisibleDelta) => {
      text("thinking", d.reasoning)
      text("text", d.content)
      d.toolCalls.forEach(toolUse)
    },
    /** Stops the last block and gives each tool_use the answer's final input; the content. */
    finish: (answer: TurnAnswer): ReadonlyArray<ContentBlock> => {
      answer.toolCalls.forEach((call, i) => {
        if (!calls.has(i)) toolUse({ index: i, id: call.id, name: call.name, arguments: call.arguments })
        blocks[calls.get(i)!] = { type: "tool_use", id: call.id, name: call.name, input: toolInput(call.arguments) }
      })
      close()
      return blocks
    }
  }
}

const stopReasonOf = (answer: TurnAnswer): StopReason =>
  answer.toolCalls.length > 0 ? "tool_use" : answer.stopSequence !== null ? "stop_sequence" : answer.finishReason === "length" ? "max_tokens" : "end_turn"

/** What the Messages handlers share: the served model and its chat turns. */
interface MessagesApi {
  readonly model: string
  readonly turns: ChatTurnsShape
}

/** The chat turn of a request (its prompt fields). */
const turnOf = Effect.fn("Messages.turnOf")(function* (m: MessagesApi, req: CountTokensRequest, body: unknown) {
  yield* served(m.model, req.model)
  const messages = yield* requestMessages(req, body)
  const tools = yield* requestTools(req, body)
  const { choice, parallel } = yield* toolChoiceOf(req, tools)
  return { messages, tools, toolChoice: choice, parallelToolCalls: parallel, stops: [], param: "messages" } satisfies TurnRequest
})

const create = (m: MessagesApi) =>
  Effect.fn("Messages.create")(function* (call: GatewayCall, body: unknown) {
    const { model } = m
    const req = yield* decodeBody(MessagesRequest, body)
    if (req.top_k !== null && req.top_k !== undefined) return yield* Effect.fail(apiError(400, "top_k is not supported: the workers sample with temperature and top_p.", { param: "top_k" }))
    const base = yield* turnOf(m, req, body)
    const turn: TurnRequest = { ...base, stops: (req.stop_sequences ?? []).filter((s) => s !== ""), maxTokens: req.max_tokens, temperature: req.temperature, topP: req.top_p }
    const id = `msg_${nuid.next()}`
    const prompt = { tokens: 0 }
    const out = turnOutput(
      call,
      req.stream === true,
      (type, data) => ({ type, ...data }),
      () => [
        ["message_start", { message: message(id, model, [], { reason: null, sequence: null }, messagesUsage(prompt.tokens, 0, 0)) }],
        ["ping", {}]
      ]
    )
    const writer = contentWriter(out.sink)
    const answer = yield* writeTurn(m.turns, call, id, turn, writer, out.sink !== undefined, (d) => {
      prompt.tokens = d.promptTokens
    })
    const content = writer.finish(answer)
    const { result } = answer
    const usage = messagesUsage(result.promptTokens, result.output.length, result.cachedTokens)
    const stop = { reason: stopReasonOf(answer), sequence: answer.stopSequence }
    out.end(message(id, model, content, stop, usage), [
      ["message_delta", { delta: { stop_reason: stop.reason, stop_sequence: stop.sequence }, usage }],
      ["message_stop", {}]
    ])
  })

const countTokens = (m: MessagesApi) =>
  Effect.fn("Messages.countTokens")(function* (call: GatewayCall, body: unknown) {
    const req = yield* decodeBody(CountTokensRequest, body)
    const prompt = yield* m.turns.render(call, yield* turnOf(m, req, body))
    sendJson(call.res, 200, { input_tokens: prompt.length })
  })

/** The Messages API's routes: its handlers by path. */
export interface MessagesRoutesShape {
  /** The handlers of `path` by HTTP method; undefined for a path this API does not have. */
  readonly route: (path: string) => Methods<Session> | undefined
  /** POST /v1/messages with its JSON body. */
  readonly create: (call: GatewayCall, body: unknown) => Effect.Effect<void, ApiError>
  /** POST /v1/messages/count_tokens with its JSON body. */
  readonly countTokens: (call: GatewayCall, body: unknown) => Effect.Effect<void, ApiError>
}

const makeMessagesRoutes = (options: MessagesApi): MessagesRoutesShape => {
  const handlers = { create: create(options), countTokens: countTokens(options) }
  const routes: Record<string, Methods<Session>> = {
    "/v1/messages": { POST: withBody(handlers.create) },
    "/v1/messages/count_tokens": { POST: withBody(handlers.countTokens) }
  }
  return { route: (path) => (Object.hasOwn(routes, path) ? routes[path] : undefined), ...handlers }
}

/** The Messages API's routes over one model's chat turns. */
export class MessagesRoutes extends Context.Service<MessagesRoutes, MessagesRoutesShape>()("gyre/gateway/MessagesRoutes") {
  static readonly make = makeMessagesRoutes
  static readonly layer = (options: MessagesApi) => Layer.succeed(MessagesRoutes, makeMessagesRoutes(options))
}
