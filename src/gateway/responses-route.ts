/**
 * `POST /v1/responses`: the OpenAI Responses API over a chat turn (`./chat-turn.ts`); the
 * request's conversion and the response documents are `../openai/responses.ts`.
 *
 * One writer builds the output items from a turn's deltas, in order (reasoning, message text,
 * then each tool call); a non-streamed call feeds it the whole answer at once, a streamed one
 * as it is generated, sending the named events (each with `sequence_number`):
 * `response.created`, `response.in_progress`, then per item `response.output_item.added`,
 * its content (`response.content_part.added`, `response.output_text.delta` / `.done`,
 * `response.content_part.done`; `response.reasoning_text.delta` / `.done`;
 * `response.function_call_arguments.delta` / `.done`; `response.custom_tool_call_input.delta`
 * / `.done`), `response.output_item.done`, and last `response.completed` (or
 * `response.incomplete` at `max_output_tokens`, `response.failed` when the call fails once
 * the stream has started). A custom tool's call is sent whole when the turn ends (its input
 * is read out of the arguments the model wrote).
 *
 * Also `GET`/`DELETE /v1/responses/<id>`: always a 404, nothing is stored.
 */
import { nuid } from "@nats-io/transport-node"
import { Context, Effect, Layer } from "effect"
import { apiError, decodeBody, type ApiError } from "../openai/openai.ts"
import {
  ResponsesRequest,
  customInput,
  inputMessages,
  modelTools,
  responseObject,
  responsesUsage,
  sealReasoning,
  toolChoiceOf,
  type OutputItem,
  type OutputText,
  type ResponseBase,
  type ResponseStatus
} from "../openai/responses.ts"
import type { ChatTurnsShape, GatewayCall, TurnAnswer, TurnDelta, TurnRequest, TurnToolCall } from "./chat-turn.ts"
import { withBody, type Methods } from "./http.ts"
import type { Session } from "./sessions.ts"
import { served, tokenLogprobs, turnOutput, writeTurn, type DeltaWriter, type Sink, type VisibleDelta } from "./turn-output.ts"

/** `include` values: the two that change the output, and those of built-in tools (never called here). */
const INCLUDES = new Set([
  "reasoning.encrypted_content",
  "message.output_text.logprobs",
  "web_search_call.action.sources",
  "web_search_call.results",
  "file_search_call.results",
  "code_interpreter_call.outputs",
  "computer_call_output.output.image_url",
  "message.input_image.image_url"
])

/** Fields that need stored state, refused with a 400 each. */
const checkStateless = (req: ResponsesRequest): ApiError | undefined => {
  const present = (v: unknown) => v !== null && v !== undefined
  if (present(req.previous_response_id)) return apiError(400, "previous_response_id needs stored responses; this gateway stores none: send the whole input each time.", { param: "previous_response_id" })
  if (present(req.conversation)) return apiError(400, "Conversations need stored state; this gateway stores none: send the whole input each time.", { param: "conversation" })
  if (req.background === true) return apiError(400, "Background responses need stored state; this gateway stores none.", { param: "background" })
  if (present(req.prompt)) return apiError(400, "Prompt templates are not supported: send instructions and input.", { param: "prompt" })
  if (req.truncation === "auto") return apiError(400, "truncation 'auto' is not supported: the input is never cut, an input over the context is a 400.", { param: "truncation" })
  const format = req.text?.format?.type
  if (format !== undefined && format !== "text") return apiError(400, `text.format '${format}' is not supported: the model answers in plain text.`, { param: "text.format.type" })
  const include = (req.include ?? []).find((v) => !INCLUDES.has(v))
  if (include !== undefined) return apiError(400, `include value '${include}' is not supported.`, { param: "include" })
  return undefined
}

type ItemKind = "message" | "reasoning"

/** Builds a response's output items from a turn's deltas, and sends their events to `sink` (streamed calls). */
class OutputWriter implements DeltaWriter {
  private readonly items: Array<OutputItem> = []
  /** The message or reasoning item whose text is being written. */
  private open: { kind: ItemKind; index: number; text: string } | undefined
  /** Each tool call's item (index -1: a custom tool's, added when the turn ends) and arguments so far, by the call's index. */
  private readonly calls = new Map<number, { index: number; name: string; arguments: string }>()

  constructor(
    private readonly sink: Sink | undefined,
    private readonly custom: ReadonlySet<string>,
    private readonly sealed: boolean
  ) {}

  private send(type: string, payload: Record<string, unknown>) {
    this.sink?.(type, payload)
  }

  private close(status: "completed" | "incomplete", logprobs?: ReadonlyArray<unknown>) {
    if (this.open === undefined) return
    const { kind, index, text } = this.open
    const id = this.items[index]!.id
    const at = { item_id: id, output_index: index, content_index: 0 }
    if (kind === "message") {
      const part: OutputText = { type: "output_text", text, annotations: [], ...(logprobs === undefined ? {} : { logprobs }) }
      this.send("response.output_text.done", { ...at, text, logprobs: logprobs ?? [] })
      this.send("response.content_part.done", { ...at, part })
      this.items[index] = { type: "message", id, status, role: "assistant", content: [part] }
    } else {
      this.send("response.reasoning_text.done", { ...at, text })
      const part = { type: "reasoning_text" as const, text }
      this.send("response.content_part.done", { ...at, part })
      this.items[index] = { type: "reasoning", id, summary: [], content: [part], ...(this.sealed ? { encrypted_content: sealReasoning(text) } : {}) }
    }
    this.send("response.output_item.done", { output_index: index, item: this.items[index] })
    this.open = undefined
  }

  private add(item: OutputItem) {
    this.items.push(item)
    this.send("response.output_item.added", { output_index: this.items.length - 1, item })
    return this.items.length - 1
  }

  /** Opens a `kind` item with its one empty content part. */
  private openItem(kind: ItemKind) {
    this.close("completed")
    const index =
      kind === "message"
        ? this.add({ type: "message", id: `msg_${nuid.next()}`, status: "in_progress", role: "assistant", content: [] })
        : this.add({ type: "reasoning", id: `rs_${nuid.next()}`, summary: [], content: [] })
    this.open = { kind, index, text: "" }
    const part = kind === "message" ? { type: "output_text", text: "", annotations: [] } : { type: "reasoning_text", text: "" }
    this.send("response.content_part.added", { item_id: this.items[index]!.id, output_index: index, content_index: 0, part })
    return this.open
  }

  private text(kind: ItemKind, delta: string) {
    if (delta === "") return
    const open = this.open?.kind === kind ? this.open : this.openItem(kind)
    open.text += delta
    const at = { item_id: this.items[open.index]!.id, output_index: open.index, content_index: 0 }
    this.send(kind === "message" ? "response.output_text.delta" : "response.reasoning_text.delta", { ...at, delta, ...(kind === "message" ? { logprobs: [] } : {}) })
  }

  private toolCall(d: TurnDelta["toolCalls"][number]) {
    let c = this.calls.get(d.index)
    if (c === undefined) {
      this.close("completed")
      const name = d.name ?? ""
      if (this.custom.has(name)) return void this.calls.set(d.index, { index: -1, name, arguments: d.arguments })
      c = { index: this.add({ type: "function_call", id: `fc_${nuid.next()}`, call_id: d.id ?? "", name, arguments: "", status: "in_progress" }), name, arguments: "" }
      this.calls.set(d.index, c)
    }
    c.arguments += d.arguments
    if (c.index >= 0 && d.arguments !== "") this.send("response.function_call_arguments.delta", { item_id: this.items[c.index]!.id, output_index: c.index, delta: d.arguments })
  }

  delta(d: VisibleDelta) {
    this.text("reasoning", d.reasoning)
    this.text("message", d.content)
    d.toolCalls.forEach((c) => this.toolCall(c))
  }

  /** Completes the `i`th call's item with the answer's final arguments; a custom tool's call is added whole. */
  private finishCall(call: TurnToolCall, i: number) {
    if (!this.calls.has(i)) this.toolCall({ index: i, id: call.id, name: call.name, arguments: call.arguments })
    const c = this.calls.get(i)
    if (c !== undefined && c.index >= 0) {
      const item = this.items[c.index]!
      this.send("response.function_call_arguments.done", { item_id: item.id, output_index: c.index, name: call.name, arguments: call.arguments })
      this.items[c.index] = { type: "function_call", id: item.id, call_id: call.id, name: call.name, arguments: call.arguments, status: "completed" }
      return this.send("response.output_item.done", { output_index: c.index, item: this.items[c.index] })
    }
    const input = customInput(call.arguments)
    const index = this.add({ type: "custom_tool_call", id: `ctc_${nuid.next()}`, call_id: call.id, name: call.name, input: "", status: "in_progress" })
    const id = this.items[index]!.id
    this.send("response.custom_tool_call_input.delta", { item_id: id, output_index: index, delta: input })
    this.send("response.custom_tool_call_input.done", { item_id: id, output_index: index, input })
    this.items[index] = { type: "custom_tool_call", id, call_id: call.id, name: call.name, input, status: "completed" }
    this.send("response.output_item.done", { output_index: index, item: this.items[index] })
  }

  /** Closes every item with the answer's final values; the output. */
  finish(answer: TurnAnswer, logprobs: ReadonlyArray<unknown> | undefined): ReadonlyArray<OutputItem> {
    this.close(answer.finishReason === "length" ? "incomplete" : "completed", logprobs)
    answer.toolCalls.forEach((call, i) => this.finishCall(call, i))
    return this.items
  }
}

/** What the Responses handlers share: the served model and its chat turns. */
interface ResponsesApi {
  readonly model: string
  readonly turns: ChatTurnsShape
}

/** A request as a chat turn, and the names of its custom tools. */
const turnOf = Effect.fn("Responses.turnOf")(function* (r: ResponsesApi, req: ResponsesRequest, body: unknown) {
  yield* served(r.model, req.model)
  const refused = checkStateless(req)
  if (refused !== undefined) return yield* Effect.fail(refused)
  const messages = yield* inputMessages(req, body)
  const tools = yield* modelTools(body, req)
  const { tools: shown, choice } = yield* toolChoiceOf(req.tool_choice, tools)
  const turn: TurnRequest = {
    messages,
    tools: shown,
    toolChoice: choice,
    parallelToolCalls: req.parallel_tool_calls ?? true,
    stops: [],
    maxTokens: req.max_output_tokens,
    temperature: req.temperature,
    topP: req.top_p,
    seed: req.seed,
    param: "input"
  }
  return { turn, custom: tools.custom }
})

/** The response of a call that failed once its stream started. */
const failedResponse = (base: ResponseBase, e: ApiError) =>
  responseObject(base, { status: "failed", output: [], usage: null, error: { code: e.code ?? (e.status >= 500 ? "server_error" : "invalid_request"), message: e.message } })

const create = (r: ResponsesApi) =>
  Effect.fn("Responses.create")(function* (call: GatewayCall, body: unknown) {
    const req = yield* decodeBody(ResponsesRequest, body)
    const { turn, custom } = yield* turnOf(r, req, body)
    const include = new Set(req.include ?? [])
    const base: ResponseBase = { id: `resp_${nuid.next()}`, createdAt: Math.floor(call.startedAt / 1000), model: r.model, req, tools: (body as { tools?: ReadonlyArray<unknown> }).tools ?? [] }
    let sequence = 0
    const out = turnOutput(
      call,
      req.stream === true,
      (type, payload) => ({ type, sequence_number: sequence++, ...payload }),
      () => ["response.created", "response.in_progress"].map((type) => [type, { response: responseObject(base, { status: "in_progress", output: [], usage: null }) }] as const)
    )
    const writer = new OutputWriter(out.sink, custom, include.has("reasoning.encrypted_content"))
    const answer = yield* writeTurn(r.turns, call, base.id, turn, writer, out.sink !== undefined).pipe(
      Effect.tapError((e) => Effect.sync(() => out.endStarted([["response.failed", { response: failedResponse(base, e) }]])))
    )
    const { result } = answer
    const logprobs = include.has("message.output_text.logprobs") ? tokenLogprobs(r.turns.tokenizer, result.output, result.logprobs) : undefined
    const output = writer.finish(answer, logprobs)
    const status: ResponseStatus = answer.finishReason === "length" ? "incomplete" : "completed"
    const done = responseObject(base, { status, output, usage: responsesUsage(result.promptTokens, result.output.length, result.cachedTokens) })
    out.end(done, [[status === "completed" ? "response.completed" : "response.incomplete", { response: done }]])
  })

/** The Responses API's routes: its handlers by path. */
export interface ResponsesRoutesShape {
  /** The handlers of `path` by HTTP method; undefined for a path this API does not have. */
  readonly route: (path: string) => Methods<Session> | undefined
  /** POST /v1/responses with its JSON body. */
  readonly create: (call: GatewayCall, body: unknown) => Effect.Effect<void, ApiError>
}

const notStored = (id: string) => () => Effect.fail(apiError(404, `No response with id '${id}': this gateway stores no responses.`, { param: "response_id", code: "not_found" }))

const makeResponsesRoutes = (options: ResponsesApi): ResponsesRoutesShape => {
  const handlers = { create: create(options) }
  const route = (path: string): Methods<Session> | undefined => {
    if (path === "/v1/responses") return { POST: withBody(handlers.create) }
    if (!path.startsWith("/v1/responses/")) return undefined
    const id = path.slice("/v1/responses/".length).slice(0, 200)
    return { GET: notStored(id), DELETE: notStored(id) }
  }
  return { route, ...handlers }
}

/** The Responses API's routes over one model's chat turns. */
export class ResponsesRoutes extends Context.Service<ResponsesRoutes, ResponsesRoutesShape>()("gyre/gateway/ResponsesRoutes") {
  static readonly make = makeResponsesRoutes
  static readonly layer = (options: ResponsesApi) => Layer.succeed(ResponsesRoutes, makeResponsesRoutes(options))
}
