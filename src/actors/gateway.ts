/**
 * The gateway actor: Gyre's black-box model endpoint. It speaks `GatewayProtocol` to the
 * harness runner (OpenExecution registers an execution's bearer key, CloseExecution revokes
 * it) and to devices leaving rollout (ContextsMoved: where their executions' contexts went),
 * and serves on its port for the harnesses the OpenAI API (Chat Completions, completions,
 * models: `../gateway/endpoints.ts`), the Responses API (`../gateway/responses-route.ts`) and
 * the Anthropic Messages API (`../gateway/messages-route.ts`), each a conversion to and from
 * one chat turn (`../gateway/chat-turn.ts`).
 *
 * The bearer key names the execution (`../gateway/sessions.ts`), the `X-Gyre-Role` header the
 * call's role (default the execution's). A request is rendered to tokens, sent to a rollout
 * worker or a device in the rollout role (`../gateway/call-router.ts`: sticky, deltas, transparent retries), answered, and
 * recorded: one delta-encoded `CallRecord` per call on `gyre.<run>.calls.<execution>` of the
 * stream `GYRE_<run>_TRAJECTORIES`, acknowledged by JetStream before the response ends
 * (`../gateway/call-recorder.ts`). Errors use the OpenAI format (`../openai/openai.ts`), on the
 * Messages routes Anthropic's (`../openai/anthropic.ts`).
 */
import { Effect, Schema } from "effect"
import type { RpcGroup } from "effect/rpc"
import * as Actor from "../runtime/actor.ts"
import { makeCallRecorder } from "../gateway/call-recorder.ts"
import { CallRouter, type CallResult, type CallRouterShape } from "../gateway/call-router.ts"
import { ChatTurns, type Generate } from "../gateway/chat-turn.ts"
import { OpenAiRoutes } from "../gateway/endpoints.ts"
import { openAiErrors, serveHttp, type HttpLimits } from "../gateway/http.ts"
import { MessagesRoutes, messagesErrorFormat } from "../gateway/messages-route.ts"
import { ResponsesRoutes } from "../gateway/responses-route.ts"
import { recentCalls } from "../gateway/recent-calls.ts"
import { makeSessions, roleOf, type Sessions } from "../gateway/sessions.ts"
import { watchWorkers, type WorkerDirectory } from "../gateway/worker-directory.ts"
import { gyreChat, type ChatFormat } from "../openai/chat.ts"
import { GatewayProtocol, UnknownExecution, type CallTotals } from "../protocols/gateway.ts"
import { INLINE_TOKENS, openTransferStore } from "../protocols/transfer.ts"
import { readiness } from "../gateway/probes.ts"
import { ensureTrajectoryStream } from "../protocols/layout.ts"
import type { ActorSystemShape } from "../runtime/system.ts"
import type { Sampling } from "../tree/record.ts"

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
  /** Bounds of the HTTP face (`defaultHttpLimits` in `../gateway/http.ts` for each one left out). */
  readonly limits?: Partial<HttpLimits>
  /** Longest prompt the workers take, tokens: a longer one is a 400 at once (default: the workers decide). */
  readonly maxContextTokens?: number
  /** A worker whose registry entry has not changed for this long is given up (default 3000). */
  readonly workerDeadAfterMs?: number
  /** Workers tried per call before a 503 (default 5). */
  readonly maxAttempts?: number
  /** How long a call waits for a usable worker before a 503 (default 5000). */
  readonly workerWaitMs?: number
  /** Limit of one Generate ask (default 600,000). */
  readonly generateTimeoutMs?: number
  /** Prompt tokens sent inside a Generate at most; more go through the run's transfer store (default `INLINE_TOKENS`, 32,768). */
  readonly inlineTokens?: number
  /** The served model's tokenizer and chat template (default Gyre's; `chatFormatOf(checkpoint)`). */
  readonly chat?: ChatFormat
  /** A training run's sampling, replacing each request's temperature and top_p (default: the request's). */
  readonly sampling?: Sampling
}

/** What the gateway's handlers share: the run's system, its calls' router, the open executions, the recorder and the call figures. */
interface GatewayParts {
  readonly system: ActorSystemShape
  readonly router: CallRouterShape
  readonly sessions: Sessions
  readonly recorder: ReturnType<typeof makeCallRecorder>
  readonly recent: ReturnType<typeof recentCalls>
  readonly totals: { -readonly [K in keyof CallTotals]: number }
}

const addTotals = (totals: GatewayParts["totals"], result: CallResult) => {
  totals.calls++
  totals.promptTokens += result.promptTokens
  totals.cachedTokens += result.cachedTokens
  totals.reprefillTokens += result.reprefillTokens
  totals.fullResends += result.fullResends
}

/** A model call: its role, a worker's answer through the router, its record, its figures. */
const generate =
  (g: GatewayParts): Generate =>
  (call, callId, prompt, sampling, onTokens, finish) =>
    Effect.gen(function* () {
      const prepared = performance.now()
      const role = yield* roleOf(call.session, call.req)
      const result = yield* g.router.call({ execution: call.session.execution, route: call.session.route, prompt, sampling, onTokens, clientGone: call.clientGone })
      addTotals(g.totals, result)
      const { finishReason, toolCalls } = finish(result)
      const answered = performance.now()
      yield* g.recorder.record(call.session, {
        callId,
        role,
        prompt,
        output: result.output,
        logprobs: result.logprobs,
        versions: result.versions,
        sampling: { temperature: sampling.temperature, topP: sampling.topP },
        finishReason: result.finishReason === "cancelled" ? "cancelled" : finishReason,
        startedAt: call.startedAt,
        finishedAt: Date.now(),
        toolCalls
      })
      const recorded = performance.now()
      g.recent.add({ roundTripMs: recorded - call.receivedAt, preparedMs: prepared - call.receivedAt, recordMs: recorded - answered }, result)
      return result
    })

/** The HTTP face: the three APIs over one model's chat turns, served on the configured port (requests run as fibers of this incarnation, drained when it stops). */
const serveApis = (g: GatewayParts, config: GatewayConfig, directory: WorkerDirectory) =>
  Effect.gen(function* () {
    const model = config.model ?? "gyre"
    const chat = config.chat ?? gyreChat
    const gen = generate(g)
    const turns = ChatTurns.make({ chat, defaultMaxTokens: config.defaultMaxTokens ?? 512, maxContextTokens: config.maxContextTokens, generate: gen, sampling: config.sampling })
    const openAi = OpenAiRoutes.make({ model, servingSince: Math.floor(Date.now() / 1000), maxContextTokens: config.maxContextTokens, generate: gen, turns, chat })
    const responses = ResponsesRoutes.make({ model, turns })
    const messages = MessagesRoutes.make({ model, turns })
    const host = config.host ?? "127.0.0.1"
    const server = yield* serveHttp({
      host,
      port: config.port ?? 0,
      ...(config.limits === undefined ? {} : { limits: config.limits }),
      probes: readiness(g.system, directory),
      authenticate: g.sessions.authenticate,
      routeOf: (path) => openAi.route(path) ?? responses.route(path) ?? messages.route(path),
      errorFormatOf: messagesErrorFormat(openAiErrors)
    })
    return { server, baseUrl: `http://${config.advertiseHost ?? host}:${server.port}/v1`, model }
  })

const closeExecution = (g: GatewayParts) =>
  Effect.fn("Gateway.closeExecution")(function* ({ execution }: { readonly execution: string }) {
    const session = g.sessions.close(execution)
    if (session === undefined) return yield* Effect.fail(new UnknownExecution({ execution }))
    yield* g.router.release(execution, session.route)
    return { calls: session.calls }
  })

/**
 * Contexts a device moved (`ContextsMoved`) go on its executions' routes. A context that
 * arrives for an execution closed meanwhile (it ended while its device was leaving rollout) is
 * freed at its destination: no route will ever release it there.
 */
const contextsMoved = (g: GatewayParts) =>
  Effect.fn("Gateway.contextsMoved")(function* ({ from, to, moves }: { readonly from: string; readonly to: string; readonly moves: ReadonlyArray<{ readonly execution: string; readonly request: string }> }) {
    const byExecution = new Map<string, Set<string>>()
    for (const m of moves) byExecution.set(m.execution, (byExecution.get(m.execution) ?? new Set()).add(m.request))
    let routed = 0
    const closed: Array<string> = []
    for (const [execution, requests] of byExecution) {
      const session = g.sessions.get(execution)
      if (session === undefined) closed.push(execution)
      else if (g.router.contextsMoved(session.route, from, to, requests)) routed++
    }
    yield* Effect.forEach(closed, (execution) => g.router.releaseOn(to, execution), { concurrency: "unbounded", discard: true })
    return { routed }
  })

/** The router, sessions, recorder and figures of one incarnation. */
const gatewayParts = (system: ActorSystemShape, config: GatewayConfig) =>
  Effect.gen(function* () {
    yield* ensureTrajectoryStream(system)
    const directory = yield* watchWorkers(system, { deadAfterMs: config.workerDeadAfterMs ?? 3000 })
    const router = CallRouter.make(system, directory, yield* openTransferStore(system), {
      generateTimeoutMs: config.generateTimeoutMs ?? 600_000,
      maxAttempts: config.maxAttempts ?? 5,
      workerWaitMs: config.workerWaitMs ?? 5000,
      recentPerExecution: 4,
      inlineTokens: config.inlineTokens ?? INLINE_TOKENS
    })
    const totals = { calls: 0, promptTokens: 0, cachedTokens: 0, reprefillTokens: 0, fullResends: 0 }
    const parts: GatewayParts = { system, router, sessions: makeSessions(system.run), recorder: makeCallRecorder(system), recent: recentCalls(), totals }
    return { parts, directory }
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
        const { parts: g, directory } = yield* gatewayParts(ctx.system, config)
        const { server, baseUrl, model } = yield* serveApis(g, config, directory)
        yield* Effect.logInfo(`gateway ${ctx.address.id}: serving ${baseUrl} (model ${model})`)
        const handlers: Actor.Handlers<RpcGroup.Rpcs<typeof GatewayProtocol>> = {
          OpenExecution: (request) => g.sessions.open(request).pipe(Effect.as({ baseUrl })),
          CloseExecution: closeExecution(g),
          ContextsMoved: contextsMoved(g),
          Status: () =>
            Effect.sync(() => ({
              baseUrl,
              openExecutions: g.sessions.size,
              calls: g.recorder.calls,
              errors: server.errors,
              internalErrors: server.defects,
              recent: g.recent.figures(),
              totals: { ...g.totals }
            }))
        }
        return handlers
      })
  })
