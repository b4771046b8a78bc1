/**
 * The gateway actor: Gyre's black-box model endpoint. It speaks `GatewayProtocol` to the
 * harness runner (OpenExecution registers an execution's bearer key, CloseExecution revokes
 * it) and serves the OpenAI HTTP API on its port for the harnesses:
 *
 *   POST /v1/chat/completions   messages, max_tokens, temperature, top_p, stop, seed, tools,
 *                               stream (server-sent events, `data: {...}` then `data: [DONE]`)
 *   POST /v1/completions        a text or token-id prompt (no chat template)
 *   GET  /v1/models, /v1/models/<id>
 *
 * The bearer key names the execution, the `X-Gyre-Role` header the call's role (default the
 * execution's). A chat request is rendered to tokens (`chat.ts`), sent to a rollout worker
 * (`call-router.ts`: sticky, deltas, transparent retries), answered, and recorded: one
 * delta-encoded `CallRecord` per call (the execution's `DeltaEncoder`) on
 * `gyre.<run>.calls.<execution>` of the stream `GYRE_<run>_TRAJECTORIES`, acknowledged by
 * JetStream before the response ends. Errors use the OpenAI format (`openai.ts`).
 *
 * Sessions live in memory: a restarted gateway has no keys until the runner opens its
 * executions again.
 */
import * as http from "node:http"
import type { AddressInfo } from "node:net"
import { nuid } from "@nats-io/transport-node"
import { Deferred, Effect, FiberSet, Schema } from "effect"
import type { RpcGroup } from "effect/rpc"
import { encode, special, VOCAB_SIZE } from "../engine/tokenizer.ts"
import * as Actor from "../runtime/actor.ts"
import { TransportError, messageOf } from "../runtime/errors.ts"
import { DeltaEncoder } from "../tree/encoder.ts"
import { CallRecord, type ModelCall } from "../tree/record.ts"
import type { StepTokens } from "../serving/batcher.ts"
import { makeCallRouter, newRoute, type CallResult, type Route } from "../gateway/call-router.ts"
import { AssistantTurns, parseToolCalls, renderChat, tokenText, visibleText } from "../openai/chat.ts"
import { GatewayProtocol, UnknownExecution } from "../protocols/gateway.ts"
import { ensureTrajectoryStream, rlLayout } from "../protocols/layout.ts"
import {
  ApiError,
  ChatCompletionRequest,
  CompletionRequest,
  apiError,
  chatChunk,
  chatCompletion,
  completion,
  decodeBody,
  decodeMessages,
  errorBody,
  modelList,
  usageChunk,
  usageOf,
  type FinishReason,
  type TokenLogprob,
  type Usage
} from "../openai/openai.ts"
import { recentCalls } from "../gateway/recent-calls.ts"
import type { SamplingParams } from "../protocols/rollout.ts"
import { watchWorkers } from "../gateway/worker-directory.ts"

export interface GatewayConfig {
  /** Interface to listen on (default 127.0.0.1). */
  readonly host?: string
  /** Port (default 0: any free port; the base URL says which). */
  readonly port?: number
  /** Host name in the base URL handed to harnesses (default: `host`). */
  readonly advertiseHost?: string
  /** The model id served (default "gyre"). */
  readonly model?: string
  /** `max_tokens` when a request gives none (default 512). */
  readonly defaultMaxTokens?: number
  /** Largest request body (default 64 MiB). */
  readonly maxBodyBytes?: number
  /** A worker whose registry entry has not changed for this long is given up (default 3000). */
  readonly workerDeadAfterMs?: number
  /** Workers tried per call before a 503 (default 5). */
  readonly maxAttempts?: number
  /** How long a call waits for a usable worker before a 503 (default 5000). */
  readonly workerWaitMs?: number
  /** Limit of one Generate ask (default 600,000). */
  readonly generateTimeoutMs?: number
}

interface Session {
  key: string
  readonly task: string
  readonly execution: string
  readonly defaultRole: string
  readonly encoder: DeltaEncoder
  readonly turns: AssistantTurns
  readonly route: Route
  calls: number
}

const encodeRecord = Schema.encodeSync(CallRecord)

const logprobsOf = (tokens: ArrayLike<number>, logprobs: ArrayLike<number>): Array<TokenLogprob> =>
  Array.from(tokens, (t, i) => ({ token: tokenText(t), logprob: logprobs[i]!, bytes: t < 256 ? [t] : [], top_logprobs: [] }))

const stopsOf = (stop: string | ReadonlyArray<string> | null | undefined): Array<string> =>
  (stop === null || stop === undefined ? [] : typeof stop === "string" ? [stop] : stop).filter((s) => s !== "")

/** A server-sent-event response, started on the first write so errors before it keep their status. */
const eventStream = (res: http.ServerResponse) => {
  let started = false
  return {
    get started() {
      return started
    },
    send(event: unknown) {
      if (res.destroyed || res.writableEnded) return
      if (!started) {
        res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache", connection: "keep-alive" })
        started = true
      }
      res.write(`data: ${JSON.stringify(event)}\n\n`)
    },
    end() {
      if (!res.destroyed && !res.writableEnded) res.end("data: [DONE]\n\n")
    }
  }
}

const sendJson = (res: http.ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}) => {
  if (res.destroyed || res.writableEnded) return
  const text = JSON.stringify(body)
  res.writeHead(status, { "content-type": "application/json", "content-length": String(Buffer.byteLength(text)), ...headers })
  res.end(text)
}

const readBody = (req: http.IncomingMessage, limit: number) =>
  Effect.callback<Buffer, ApiError>((resume) => {
    const tooLarge = () => apiError(413, `Request body is larger than ${limit} bytes.`, { code: "request_too_large" })
    if (Number(req.headers["content-length"] ?? 0) > limit) return resume(Effect.fail(tooLarge()))
    const chunks: Array<Buffer> = []
    let size = 0
    let over = false
    req.on("data", (c: Buffer) => {
      size += c.length
      if (size > limit && !over) {
        over = true
        resume(Effect.fail(tooLarge()))
      } else if (!over) chunks.push(c)
    })
    req.on("end", () => {
      if (!over) resume(Effect.succeed(Buffer.concat(chunks)))
    })
    req.on("error", (e) => resume(Effect.fail(apiError(400, `Could not read the request body: ${e.message}`))))
  })

const parseJsonBody = (bytes: Buffer) =>
  Effect.try({
    try: () => JSON.parse(bytes.toString("utf8")) as unknown,
    catch: (e) =>
      apiError(400, `We could not parse the JSON body of your request (${e instanceof Error ? e.message : String(e)}). The body must be a JSON object.`, {
        code: "invalid_json"
      })
  })

/** The gateway actor type for a configuration. */
export const gateway = (config: GatewayConfig = {}) =>
  Actor.make({
    kind: "gateway",
    protocol: GatewayProtocol,
    state: { schema: Schema.Struct({}), initial: () => ({}) },
    concurrency: 64,
    behaviour: (ctx) =>
      Effect.gen(function* () {
        const system = ctx.system
        const layout = rlLayout(system.run)
        const model = config.model ?? "gyre"
        const servingSince = Math.floor(Date.now() / 1000)
        yield* ensureTrajectoryStream(system)
        const directory = yield* watchWorkers(system, { deadAfterMs: config.workerDeadAfterMs ?? 3000 })
        const router = makeCallRouter(system, directory, {
          generateTimeoutMs: config.generateTimeoutMs ?? 600_000,
          maxAttempts: config.maxAttempts ?? 5,
          workerWaitMs: config.workerWaitMs ?? 5000,
          recentPerExecution: 4
        })
        const byKey = new Map<string, Session>()
        const byExecution = new Map<string, Session>()
        const counters = { calls: 0, errors: 0 }
        const recent = recentCalls()

        const record = (session: Session, call: ModelCall) =>
          Effect.suspend(() => {
            const data = JSON.stringify(encodeRecord(session.encoder.encode(call)))
            return Effect.tryPromise({
              try: () => system.nats.js.publish(layout.calls(session.execution), data, { msgID: `${session.execution}.${call.callId}` }),
              catch: (e) => apiError(500, `The call could not be recorded: ${messageOf(e)}`, { code: "record_failed" })
            })
          }).pipe(
            Effect.tap(() =>
              Effect.sync(() => {
                session.calls++
                counters.calls++
              })
            )
          )

        const samplingOf = (
          req: { readonly max_tokens?: number | null | undefined; readonly temperature?: number | null | undefined; readonly top_p?: number | null | undefined; readonly seed?: number | null | undefined },
          maxTokens: number | null | undefined,
          stops: ReadonlyArray<ReadonlyArray<number>>
        ): SamplingParams => ({
          maxTokens: maxTokens ?? req.max_tokens ?? config.defaultMaxTokens ?? 512,
          temperature: req.temperature ?? 1,
          topP: req.top_p ?? 1,
          seed: req.seed ?? null,
          stop: stops.map((s) => Int32Array.from(s))
        })

        interface Call {
          readonly session: Session
          readonly req: http.IncomingMessage
          readonly res: http.ServerResponse
          readonly clientGone: Deferred.Deferred<void>
          readonly startedAt: number
        }

        const roleOf = (call: Call) => {
          const header = call.req.headers["x-gyre-role"]
          const value = (Array.isArray(header) ? header[0] : header)?.trim()
          if (value === undefined) return Effect.succeed(call.session.defaultRole)
          return value === "" ? Effect.fail(apiError(400, "The X-Gyre-Role header must be a non-empty role name.", { param: "X-Gyre-Role" })) : Effect.succeed(value)
        }

        /** Runs a call through the router and records it; `finish` renders the answer's finish reason and tool calls. */
        const generate = (
          call: Call,
          callId: string,
          prompt: Int32Array,
          sampling: SamplingParams,
          onTokens: ((step: StepTokens) => void) | undefined,
          finish: (result: CallResult) => { readonly finishReason: FinishReason; readonly toolCalls: Record<string, string> }
        ) =>
          Effect.gen(function* () {
            const role = yield* roleOf(call)
            const result = yield* router.call({ execution: call.session.execution, route: call.session.route, prompt, sampling, onTokens, clientGone: call.clientGone })
            const { finishReason, toolCalls } = finish(result)
            yield* record(call.session, {
              callId,
              role,
              prompt,
              output: result.output,
              logprobs: result.logprobs,
              versions: result.versions,
              finishReason: result.finishReason === "cancelled" ? "cancelled" : finishReason,
              startedAt: call.startedAt,
              finishedAt: Date.now(),
              toolCalls
            })
            recent.add(Date.now() - call.startedAt, result)
            return result
          })

        const chat = (call: Call, body: unknown) =>
          Effect.gen(function* () {
            const req = yield* decodeBody(ChatCompletionRequest, body)
            if (req.model !== model) return yield* Effect.fail(unknownModel(req.model))
            const messages = yield* decodeMessages(body)
            const tools = req.tools ?? []
            const withTools = tools.length > 0 && req.tool_choice !== "none"
            const prompt = renderChat(messages, tools, call.session.turns)
            const stops = stopsOf(req.stop)
            const sampling = samplingOf(req, req.max_completion_tokens, [...(req.ignore_eos === true ? [] : [[special.end], [special.eos]]), ...stops.map(encode)])
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
                    const text = visibleText(seen, stops, { final: false, holdToolCalls: withTools })
                    const lp = wantLogprobs ? logprobsOf(step.tokens, step.logprobs) : null
                    if (text.length > emitted.length || lp !== null) {
                      stream.send(chatChunk(id, created, model, { content: text.slice(emitted.length) }, null, lp))
                      emitted = text
                    }
                  }
            let message: { content: string | null; toolCalls: Array<{ id: string; type: "function"; function: { name: string; arguments: string } }> } = { content: null, toolCalls: [] }
            let finishReason: FinishReason = "stop"
            const result = yield* generate(call, id, prompt, sampling, onTokens, (r) => {
              const text = visibleText(r.output, stops, { final: true, holdToolCalls: false })
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

        const completions = (call: Call, body: unknown) =>
          Effect.gen(function* () {
            const req = yield* decodeBody(CompletionRequest, body)
            if (req.model !== model) return yield* Effect.fail(unknownModel(req.model))
            const p = req.prompt
            const first = Array.isArray(p) ? p[0] : p
            const prompt =
              typeof first === "string"
                ? Int32Array.from([special.bos, ...encode(first)])
                : Int32Array.from(Array.isArray(first) ? (first as ReadonlyArray<number>) : (p as ReadonlyArray<number>))
            const bad = prompt.findIndex((t) => t >= VOCAB_SIZE)
            if (bad >= 0) return yield* Effect.fail(apiError(400, `Invalid token id ${prompt[bad]} in 'prompt': ids are below ${VOCAB_SIZE}.`, { param: "prompt" }))
            const stops = stopsOf(req.stop)
            const sampling = samplingOf(req, undefined, [...(req.ignore_eos === true ? [] : [[special.eos]]), ...stops.map(encode)])
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
                    const text = visibleText(seen, stops, { final: false, holdToolCalls: false })
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
            const text = visibleText(result.output, stops, { final: true, holdToolCalls: false })
            const usage: Usage = usageOf(result.promptTokens, result.output.length, result.cachedTokens)
            if (stream === undefined) return sendJson(call.res, 200, completion(id, created, model, text, finishReason, usage))
            if (text.length > emitted.length && text.startsWith(emitted)) stream.send(chunk(text.slice(emitted.length), null))
            stream.send(chunk("", finishReason))
            if (req.stream_options?.include_usage === true) stream.send(usageChunk(id, created, model, "text_completion", usage))
            stream.end()
          })

        const unknownModel = (name: string) =>
          apiError(404, `The model '${name}' does not exist. This gateway serves '${model}'.`, { param: "model", code: "model_not_found" })

        const routes: Record<string, Partial<Record<string, (call: Call, url: URL) => Effect.Effect<void, ApiError>>>> = {
          "/v1/chat/completions": { POST: (call) => bodyOf(call).pipe(Effect.flatMap((b) => chat(call, b))) },
          "/v1/completions": { POST: (call) => bodyOf(call).pipe(Effect.flatMap((b) => completions(call, b))) },
          "/v1/models": { GET: (call) => Effect.sync(() => sendJson(call.res, 200, modelList(model, servingSince))) }
        }
        const routeOf = (path: string) => {
          if (routes[path] !== undefined) return routes[path]!
          if (path.startsWith("/v1/models/")) {
            const name = decodeURIComponent(path.slice("/v1/models/".length))
            return {
              GET: (call: Call) =>
                name === model ? Effect.sync(() => sendJson(call.res, 200, modelList(model, servingSince).data[0])) : Effect.fail(unknownModel(name))
            }
          }
          return undefined
        }
        const bodyOf = (call: Call) =>
          readBody(call.req, config.maxBodyBytes ?? 64 * 1024 * 1024).pipe(Effect.flatMap(parseJsonBody))

        const sessionOf = (req: http.IncomingMessage) => {
          const auth = req.headers.authorization
          const match = auth === undefined ? null : /^Bearer\s+(.+)$/i.exec(auth.trim())
          if (match === null) {
            return Effect.fail(apiError(401, "You didn't provide an API key. Send it in the Authorization header as 'Bearer <key>'.", { code: "missing_api_key" }))
          }
          const session = byKey.get(match[1]!.trim())
          return session === undefined ? Effect.fail(apiError(401, "Incorrect API key provided: it names no open execution.", { code: "invalid_api_key" })) : Effect.succeed(session)
        }

        const handle = (req: http.IncomingMessage, res: http.ServerResponse) => {
          const startedAt = Date.now()
          const url = new URL(req.url ?? "/", "http://gateway")
          const path = url.pathname.length > 1 ? url.pathname.replace(/\/+$/, "") : url.pathname
          const route = routeOf(path)
          const allowed = Object.keys(route ?? {}).join(", ")
          return Effect.gen(function* () {
            if (route === undefined) return yield* Effect.fail(apiError(404, `Unknown request URL: ${req.method} ${path}.`, { code: "unknown_url" }))
            const handler = route[req.method ?? ""]
            if (handler === undefined) {
              return yield* Effect.fail(apiError(405, `Method ${req.method} is not allowed on ${path}; use ${allowed}.`, { code: "method_not_allowed" }))
            }
            const session = yield* sessionOf(req)
            const clientGone = yield* Deferred.make<void>()
            res.on("close", () => {
              if (!res.writableFinished) Deferred.doneUnsafe(clientGone, Effect.void)
            })
            yield* handler({ session, req, res, clientGone, startedAt }, url)
          }).pipe(
            Effect.catchCause((cause) => {
              const failure = cause.reasons.find((r) => r._tag === "Fail")
              const error =
                failure !== undefined && failure.error instanceof ApiError ? failure.error : apiError(500, `Internal error: ${String(cause).slice(0, 500)}`)
              return Effect.sync(() => {
                counters.errors++
                if (res.writableEnded || res.destroyed) return
                if (res.headersSent) {
                  res.end(`data: ${JSON.stringify(errorBody(error))}\n\n`)
                  return
                }
                const headers: Record<string, string> = error.status === 413 ? { connection: "close" } : error.status === 405 ? { allow: allowed } : {}
                sendJson(res, error.status, errorBody(error), headers)
              })
            })
          )
        }

        // HTTP server: requests run as fibers of this incarnation; on close it stops accepting,
        // lets calls in flight finish (up to 30 s), then closes every connection.
        const fork = yield* FiberSet.makeRuntime<never, void, never>()
        let open = 0
        const server = http.createServer((req, res) => {
          open++
          res.on("close", () => open--)
          fork(handle(req, res))
        })
        const port = yield* Effect.acquireRelease(
          Effect.callback<number, TransportError>((resume) => {
            server.once("error", (e) => resume(Effect.fail(new TransportError({ operation: `listen on ${config.host ?? "127.0.0.1"}:${config.port ?? 0}`, message: e.message }))))
            server.listen(config.port ?? 0, config.host ?? "127.0.0.1", () => resume(Effect.succeed((server.address() as AddressInfo).port)))
          }),
          () =>
            Effect.gen(function* () {
              server.close()
              server.closeIdleConnections()
              const deadline = Date.now() + 30_000
              while (open > 0 && Date.now() < deadline) yield* Effect.sleep("50 millis")
              server.closeAllConnections()
            })
        )
        const baseUrl = `http://${config.advertiseHost ?? config.host ?? "127.0.0.1"}:${port}/v1`
        yield* Effect.logInfo(`gateway ${ctx.address.id}: serving ${baseUrl} (model ${model})`)

        const handlers: Actor.Handlers<RpcGroup.Rpcs<typeof GatewayProtocol>> = {
          OpenExecution: ({ key, task, execution, defaultRole }) =>
            Effect.sync(() => {
              const session: Session = byExecution.get(execution) ?? {
                key,
                task,
                execution,
                defaultRole,
                encoder: new DeltaEncoder({ run: system.run, task, execution }),
                turns: new AssistantTurns(),
                route: newRoute(),
                calls: 0
              }
              byKey.delete(session.key)
              session.key = key
              byKey.set(key, session)
              byExecution.set(execution, session)
              return { baseUrl }
            }),
          CloseExecution: ({ execution }) =>
            Effect.gen(function* () {
              const session = byExecution.get(execution)
              if (session === undefined) return yield* Effect.fail(new UnknownExecution({ execution }))
              byExecution.delete(execution)
              byKey.delete(session.key)
              yield* router.release(execution, session.route)
              return { calls: session.calls }
            }),
          Status: () => Effect.sync(() => ({ baseUrl, openExecutions: byExecution.size, calls: counters.calls, errors: counters.errors, recent: recent.figures() }))
        }
        return handlers
      })
  })
