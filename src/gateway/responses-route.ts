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
import { Effect } from "effect"
import { tokenText } from "../openai/chat.ts"
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
  type ResponseStatus
} from "../openai/responses.ts"
import type { ChatTurnsShape, GatewayCall, TurnAnswer, TurnDelta } from "./chat-turn.ts"
import { unknownModel } from "./endpoints.ts"
import { eventStream, sendJson, withBody, type Methods } from "./http.ts"
import type { Session } from "./sessions.ts"

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

type Sink = ((type: string, payload: Record<string, unknown>) => void) | undefined

/** Builds a response's output items from a turn's deltas, and sends their events to `sink` (streamed calls). */
const outputWriter = (sink: Sink, custom: ReadonlySet<string>, sealed: boolean) => {
  const items: Array<OutputItem> = []
  let open: { kind: "message" | "reasoning"; index: number; text: string } | undefined
  const calls = new Map<number, { index: number; name: string; arguments: string }>()
  const send = (type: string, payload: Record<string, unknown>) => sink?.(type, payload)

  const close = (status: "completed" | "incomplete", logprobs?: ReadonlyArray<unknown>) => {
    if (open === undefined) return
    const { kind, index, text } = open
    const id = items[index]!.id
    const at = { item_id: id, output_index: index, content_index: 0 }
    if (kind === "message") {
      const part: OutputText = { type: "output_text", text, annotations: [], ...(logprobs === undefined ? {} : { logprobs }) }
      send("response.output_text.done", { ...at, text, logprobs: logprobs ?? [] })
      send("response.content_part.done", { ...at, part })
      items[index] = { type: "message", id, status, role: "assistant", content: [part] }
    } else {
      send("response.reasoning_text.done", { ...at, text })
      const part = { type: "reasoning_text" as const, text }
      send("response.content_part.done", { ...at, part })
      items[index] = { type: "reasoning", id, summary: [], content: [part], ...(sealed ? { encrypted_content: sealReasoning(text) } : {}) }
    }
    send("response.output_item.done", { output_index: index, item: items[index] })
    open = undefined
  }
  const add = (item: OutputItem) => {
    items.push(item)
    send("response.output_item.added", { output_index: items.length - 1, item })
    return items.length - 1
  }
  const text = (kind: "message" | "reasoning", delta: string) => {
    if (delta === "") return
    if (open?.kind !== kind) {
      close("completed")
      const index =
        kind === "message"
          ? add({ type: "message", id: `msg_${nuid.next()}`, status: "in_progress", role: "assistant", content: [] })
          : add({ type: "reasoning", id: `rs_${nuid.next()}`, summary: [], content: [] })
      open = { kind, index, text: "" }
      const part = kind === "message" ? { type: "output_text", text: "", annotations: [] } : { type: "reasoning_text", text: "" }
      send("response.content_part.added", { item_id: items[index]!.id, output_index: index, content_index: 0, part })
    }
    open!.text += delta
    const at = { item_id: items[open!.index]!.id, output_index: open!.index, content_index: 0 }
    send(kind === "message" ? "response.output_text.delta" : "response.reasoning_text.delta", { ...at, delta, ...(kind === "message" ? { logprobs: [] } : {}) })
  }
  const toolCall = (d: TurnDelta["toolCalls"][number]) => {
    let c = calls.get(d.index)
    if (c === undefined) {
      close("completed")
      const name = d.name ?? ""
      if (custom.has(name)) return void calls.set(d.index, { index: -1, name, arguments: d.arguments })
      c = { index: add({ type: "function_call", id: `fc_${nuid.next()}`, call_id: d.id ?? "", name, arguments: "", status: "in_progress" }), name, arguments: "" }
      calls.set(d.index, c)
    }
    c.arguments += d.arguments
    if (c.index >= 0 && d.arguments !== "") send("response.function_call_arguments.delta", { item_id: items[c.index]!.id, output_index: c.index, delta: d.arguments })
  }

  return {
    delta: (d: Pick<TurnDelta, "content" | "reasoning" | "toolCalls">) => {
      text("reasoning", d.reasoning)
      text("message", d.content)
      d.toolCalls.forEach(toolCall)
    },
    /** Closes every item with the answer's final values; the output. */
    finish: (answer: TurnAnswer, logprobs: ReadonlyArray<unknown> | undefined): ReadonlyArray<OutputItem> => {
      close(answer.finishReason === "length" ? "incomplete" : "completed", logprobs)
      answer.toolCalls.forEach((call, i) => {
        if (!calls.has(i)) toolCall({ index: i, id: call.id, name: call.name, arguments: call.arguments })
        const c = calls.get(i)
        if (c !== undefined && c.index >= 0) {
          const item = items[c.index]!
          send("response.function_call_arguments.done", { item_id: item.id, output_index: c.index, name: call.name, arguments: call.arguments })
          items[c.index] = { type: "function_call", id: item.id, call_id: call.id, name: call.name, arguments: call.arguments, status: "completed" }
          return send("response.output_item.done", { output_index: c.index, item: items[c.index] })
        }
        const input = customInput(call.arguments)
        const index = add({ type: "custom_tool_call", id: `ctc_${nuid.next()}`, call_id: call.id, name: call.name, input: "", status: "in_progress" })
        const id = items[index]!.id
        send("response.custom_tool_call_input.delta", { item_id: id, output_index: index, delta: input })
        send("response.custom_tool_call_input.done", { item_id: id, output_index: index, input })
        items[index] = { type: "custom_tool_call", id, call_id: call.id, name: call.name, input, status: "completed" }
        send("response.output_item.done", { output_index: index, item: items[index] })
      })
      return items
    }
  }
}

/** The routes of the Responses API. */
export const responsesRoutes = (options: { readonly model: string; readonly turns: ChatTurnsShape }) => {
  const { model, turns } = options
  const { tokenizer } = turns

  const create = (call: GatewayCall, body: unknown) =>
    Effect.gen(function* () {
      const req = yield* decodeBody(ResponsesRequest, body)
      if (req.model !== model) return yield* Effect.fail(unknownModel(req.model, model))
      const refused = checkStateless(req)
      if (refused !== undefined) return yield* Effect.fail(refused)
      const messages = yield* inputMessages(req, body)
      const tools = yield* modelTools(body, req)
      const { tools: shown, choice } = yield* toolChoiceOf(req.tool_choice, tools)
      const turn = {
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
      const include = new Set(req.include ?? [])
      const base = { id: `resp_${nuid.next()}`, createdAt: Math.floor(call.startedAt / 1000), model, req, tools: (body as { tools?: ReadonlyArray<unknown> }).tools ?? [] }
      const stream = req.stream === true ? eventStream(call.res, { doneMarker: false }) : undefined
      let sequence = 0
      const sink: Sink =
        stream === undefined
          ? undefined
          : (type, payload) => {
              if (!stream.started) {
                for (const first of ["response.created", "response.in_progress"]) {
                  stream.send({ type: first, sequence_number: sequence++, response: responseObject(base, { status: "in_progress", output: [], usage: null }) }, first)
                }
              }
              stream.send({ type, sequence_number: sequence++, ...payload }, type)
            }
      const writer = outputWriter(sink, tools.custom, include.has("reasoning.encrypted_content"))
      const answer = yield* turns.run(call, base.id, turn, stream === undefined ? undefined : writer.delta).pipe(
        Effect.tapError((e) =>
          Effect.sync(() => {
            if (stream === undefined || !stream.started) return
            const failed = responseObject(base, { status: "failed", output: [], usage: null, error: { code: e.code ?? (e.status >= 500 ? "server_error" : "invalid_request"), message: e.message } })
            sink!("response.failed", { response: failed })
            stream.end()
          })
        )
      )
      if (stream === undefined) writer.delta({ content: answer.content ?? "", reasoning: answer.reasoning ?? "", toolCalls: answer.toolCalls.map((c, index) => ({ index, ...c })) })
      const { result } = answer
      const logprobs = include.has("message.output_text.logprobs")
        ? Array.from(result.output, (t, i) => ({ token: tokenText(t, tokenizer), logprob: result.logprobs[i]!, bytes: tokenizer.tokenBytes(t), top_logprobs: [] }))
        : undefined
      const output = writer.finish(answer, logprobs)
      const status: ResponseStatus = answer.finishReason === "length" ? "incomplete" : "completed"
      const done = responseObject(base, { status, output, usage: responsesUsage(result.promptTokens, result.output.length, result.cachedTokens) })
      if (stream === undefined) return sendJson(call.res, 200, done)
      sink!(status === "completed" ? "response.completed" : "response.incomplete", { response: done })
      stream.end()
    })

  const notStored = (id: string) => () => Effect.fail(apiError(404, `No response with id '${id}': this gateway stores no responses.`, { param: "response_id", code: "not_found" }))
  return (path: string): Methods<Session> | undefined => {
    if (path === "/v1/responses") return { POST: withBody(create) }
    if (path.startsWith("/v1/responses/")) {
      const id = path.slice("/v1/responses/".length).slice(0, 200)
      return { GET: notStored(id), DELETE: notStored(id) }
    }
    return undefined
  }
}
