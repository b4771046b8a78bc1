/**
 * The gateway's HTTP plumbing, free of what it serves: a server whose requests run as fibers
 * of the caller's scope, dispatched by path and method, authenticated by a caller-given
 * function, failures answered in the error format of the path (`ErrorFormat`: OpenAI's unless
 * `errorFormatOf` says otherwise; an `ApiError` as is, anything else a 500); JSON bodies read
 * within bounds (`./body.ts`); JSON and server-sent-event responses (unnamed `data:` events
 * ending with `data: [DONE]` as Chat Completions streams them, or named events as the
 * Responses and Anthropic Messages APIs do).
 *
 * Every input is total: the request target is split and percent-decoded here (a malformed
 * one is a 400 `invalid_url`, never a throw), a request the parser rejects (bad request
 * line, oversized headers) is answered by `clientError`, and whatever a handler throws is a
 * 500 for that request only; a socket or response error is logged, never thrown.
 *
 * Order of checks, each with its own status: malformed URL 400, a probe (`/health`,
 * `/ready`: no key), unknown path 404, wrong method 405 (with `Allow`), no or bad key 401,
 * too many requests in flight for the key 429, then the handler. Bounded by `HttpLimits`
 * (each one from the caller, else its Config key `GYRE_HTTP_*`, else its default):
 * connections (beyond: refused), header time (408 by Node), body size, time and total bytes,
 * JSON complexity. On scope close the server stops accepting, lets calls in flight finish
 * (up to 30 s), then closes every connection.
 */
import * as http from "node:http"
import type { AddressInfo } from "node:net"
import { Config, Deferred, Effect, FiberSet } from "effect"
import { TransportError } from "../runtime/errors.ts"
import { ApiError, apiError, errorBody } from "../openai/openai.ts"
import { byteBudget, readJsonBody, type BodyLimits, type ByteBudget } from "./body.ts"

/** One authenticated request; `clientGone` completes when the client hangs up before the end. */
export interface HttpCall<S> {
  readonly session: S
  readonly req: http.IncomingMessage
  readonly res: http.ServerResponse
  readonly clientGone: Deferred.Deferred<void>
  /** `Date.now()` at arrival (for timestamps). */
  readonly startedAt: number
  /** `performance.now()` at arrival (for durations). */
  readonly receivedAt: number
  /** The request's body as JSON, within the server's limits. */
  readonly json: Effect.Effect<unknown, ApiError>
}

/** The handlers of one path, by HTTP method. */
export type Methods<S> = Partial<Record<string, (call: HttpCall<S>) => Effect.Effect<void, ApiError>>>

/** A handler of the request's JSON body. */
export const withBody =
  <S>(handler: (call: HttpCall<S>, body: unknown) => Effect.Effect<void, ApiError>) =>
  (call: HttpCall<S>) =>
    call.json.pipe(Effect.flatMap((body) => handler(call, body)))

/** An unauthenticated GET path answering a status and a JSON body (health and readiness). */
export type Probe = Effect.Effect<{ readonly status: number; readonly body: unknown }>

export interface HttpLimits extends BodyLimits {
  /** Bytes of request bodies held by all requests together. */
  readonly maxBufferedBytes: number
  /** Open connections; more are refused. */
  readonly maxConnections: number
  /** Requests in flight per session (API key); more are answered 429. */
  readonly maxRequestsPerSession: number
  /** How long the request line and headers may take to arrive. */
  readonly headersTimeoutMs: number
}

export const defaultHttpLimits: HttpLimits = {
  maxBodyBytes: 16 * 1024 * 1024,
  bodyTimeoutMs: 30_000,
  maxJsonDepth: 64,
  maxJsonContainers: 200_000,
  maxBufferedBytes: 256 * 1024 * 1024,
  maxConnections: 1024,
  maxRequestsPerSession: 64,
  headersTimeoutMs: 10_000
}

/** `HTTP_LIMIT_KEYS.maxBodyBytes` = "GYRE_HTTP_MAX_BODY_BYTES": each limit's Config key. */
export const HTTP_LIMIT_KEYS = Object.fromEntries(
  Object.keys(defaultHttpLimits).map((k) => [k, `GYRE_HTTP_${k.replace(/[A-Z]/g, (c) => `_${c}`).toUpperCase()}`])
) as Record<keyof HttpLimits, string>

/** `HttpLimits` as Config (`HTTP_LIMIT_KEYS`), each one its default when unset. */
export const HttpLimitsConfig = Config.all(
  Object.fromEntries(
    Object.entries(defaultHttpLimits).map(([k, v]) => [k, Config.Int(HTTP_LIMIT_KEYS[k as keyof HttpLimits]).pipe(Config.withDefault(v))])
  ) as { readonly [K in keyof HttpLimits]: Config.Config<number> }
)

/** How a path answers failures: the body of an error response, and the last event of a stream that fails once started. */
export interface ErrorFormat {
  readonly body: (e: ApiError) => unknown
  readonly event: (e: ApiError) => string
}

/** OpenAI's: `{"error": {...}}`, mid-stream as a last `data:` event. */
export const openAiErrors: ErrorFormat = { body: errorBody, event: (e) => `data: ${JSON.stringify(errorBody(e))}\n\n` }

export interface HttpServerOptions<S> {
  readonly host: string
  readonly port: number
  /** Over `HttpLimitsConfig` (the environment, else the defaults). */
  readonly limits?: Partial<HttpLimits>
  readonly probes?: Readonly<Record<string, Probe>>
  /** The handlers of a percent-decoded path. */
  readonly routeOf: (path: string) => Methods<S> | undefined
  readonly authenticate: (req: http.IncomingMessage) => Effect.Effect<S, ApiError>
  /** The error format of a percent-decoded path (default `openAiErrors`), known or not. */
  readonly errorFormatOf?: (path: string, req: http.IncomingMessage) => ErrorFormat
}

export const sendJson = (res: http.ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}) => {
  if (res.destroyed || res.writableEnded || res.headersSent) return
  const text = JSON.stringify(body)
  res.writeHead(status, { "content-type": "application/json", "content-length": String(Buffer.byteLength(text)), ...headers })
  res.end(text)
}

/**
 * A server-sent-event response, started on the first write so errors before it keep their
 * status. `send(data)` writes an unnamed event, `send(data, name)` an `event: <name>` one;
 * `end()` writes `data: [DONE]` first when `doneMarker` (Chat Completions' end of stream).
 */
export const eventStream = (res: http.ServerResponse, options: { readonly doneMarker: boolean } = { doneMarker: true }) => {
  let started = false
  return {
    get started() {
      return started
    },
    send(data: unknown, name?: string) {
      if (res.destroyed || res.writableEnded) return
      if (!started) {
        res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache", connection: "keep-alive" })
        started = true
      }
      res.write(`${name === undefined ? "" : `event: ${name}\n`}data: ${JSON.stringify(data)}\n\n`)
    },
    end() {
      if (!res.destroyed && !res.writableEnded) res.end(options.doneMarker ? "data: [DONE]\n\n" : undefined)
    }
  }
}

export type EventStream = ReturnType<typeof eventStream>

/** The path of a request target (`/a/b?q` -> `/a/b`, trailing slashes dropped), percent-decoded; undefined when malformed. */
export const pathOf = (target: string | undefined): string | undefined => {
  const raw = (target ?? "/").split(/[?#]/, 1)[0]!
  if (!raw.startsWith("/")) return undefined
  let path: string
  try {
    path = decodeURIComponent(raw)
  } catch {
    return undefined
  }
  return path.length > 1 ? path.replace(/\/+$/, "") || "/" : path
}

/** Statuses after which the connection is closed: the rest of the body is not read. */
const closing = new Set([408, 413, 503])

/** Answers a failed request in `format`: an `ApiError` as is, anything else as a 500; mid-stream as a last event. */
const answerFailure = (req: http.IncomingMessage, res: http.ServerResponse, error: ApiError, allowed: string, format: ErrorFormat) => {
  if (res.writableEnded || res.destroyed) return
  if (res.headersSent) {
    res.end(format.event(error))
    return
  }
  const close = closing.has(error.status) && !req.complete
  const headers: Record<string, string> = close ? { connection: "close" } : error.status === 405 ? { allow: allowed } : error.status === 429 ? { "retry-after": "1" } : {}
  if (close) res.once("finish", () => req.socket.destroy())
  sendJson(res, error.status, format.body(error), headers)
}

/** Requests in flight per session. */
const inFlightCounter = <S>(limit: number) => {
  const counts = new Map<S, number>()
  return {
    enter: (s: S) =>
      Effect.suspend(() => {
        const n = counts.get(s) ?? 0
        if (n >= limit) return Effect.fail(apiError(429, `This key has ${limit} requests in flight already; wait for one to finish.`, { code: "rate_limit_exceeded", type: "requests" }))
        counts.set(s, n + 1)
        return Effect.void
      }),
    leave: (s: S) =>
      Effect.sync(() => {
        const n = (counts.get(s) ?? 1) - 1
        if (n <= 0) counts.delete(s)
        else counts.set(s, n)
      })
  }
}

interface ServerState {
  errors: number
  defects: number
}

const dispatch = <S>(options: HttpServerOptions<S>, limits: HttpLimits, budget: ByteBudget, state: ServerState) => {
  const perSession = inFlightCounter<S>(limits.maxRequestsPerSession)
  return (req: http.IncomingMessage, res: http.ServerResponse) => {
    const startedAt = Date.now()
    const receivedAt = performance.now()
    const path = pathOf(req.url)
    let allowed = ""
    return Effect.gen(function* () {
      if (path === undefined) return yield* Effect.fail(apiError(400, "The request URL is malformed (bad percent-encoding or not a path).", { code: "invalid_url" }))
      const probe = options.probes !== undefined && Object.hasOwn(options.probes, path) ? options.probes[path] : undefined
      if (probe !== undefined && (req.method === "GET" || req.method === "HEAD")) {
        const { status, body } = yield* probe
        return sendJson(res, status, body)
      }
      const route = options.routeOf(path)
      if (route === undefined) return yield* Effect.fail(apiError(404, `Unknown request URL: ${req.method} ${path.slice(0, 200)}.`, { code: "unknown_url" }))
      allowed = Object.keys(route).join(", ")
      const handler = Object.hasOwn(route, req.method ?? "") ? route[req.method!] : undefined
      if (handler === undefined) {
        return yield* Effect.fail(apiError(405, `Method ${req.method} is not allowed on ${path}; use ${allowed}.`, { code: "method_not_allowed" }))
      }
      const session = yield* options.authenticate(req)
      yield* perSession.enter(session)
      const clientGone = yield* Deferred.make<void>()
      res.on("close", () => {
        if (!res.writableFinished) Deferred.doneUnsafe(clientGone, Effect.void)
      })
      const json = readJsonBody(req, res, limits, budget, startedAt)
      yield* handler({ session, req, res, clientGone, startedAt, receivedAt, json }).pipe(Effect.ensuring(perSession.leave(session)))
    }).pipe(
      Effect.catchCause((cause) => {
        const failure = cause.reasons.find((r) => r._tag === "Fail")
        const known = failure !== undefined && failure.error instanceof ApiError
        const error = known ? (failure.error as ApiError) : apiError(500, "Internal error while serving the request.", { code: "internal_error" })
        return Effect.gen(function* () {
          state.errors++
          if (!known && !cause.reasons.every((r) => r._tag === "Interrupt")) {
            state.defects++
            yield* Effect.logError(`gateway: ${req.method} ${String(req.url).slice(0, 200)} failed`, cause)
          }
          answerFailure(req, res, error, allowed, path === undefined || options.errorFormatOf === undefined ? openAiErrors : options.errorFormatOf(path, req))
        })
      })
    )
  }
}

/** The raw answer to a request the HTTP parser rejected (it never reaches `dispatch`). */
const clientErrorResponse = (code: string | undefined) => {
  const [status, text] = code === "HPE_HEADER_OVERFLOW" ? [431, "Request Header Fields Too Large"] : code === "ERR_HTTP_REQUEST_TIMEOUT" ? [408, "Request Timeout"] : [400, "Bad Request"]
  const body = JSON.stringify(errorBody(apiError(status, `${text}: the request could not be parsed.`, { code: "bad_request" })))
  return `HTTP/1.1 ${status} ${text}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`
}

/** Logs a socket, response or server error as a warning (never thrown). */
const logError = (what: string) => (e: unknown) => Effect.runFork(Effect.logWarning(`gateway http: ${what}: ${e instanceof Error ? e.message : String(e)}`))

/** The node server over `handle` (each request forked as a fiber); `open` counts the responses not yet closed. */
const nodeServer = (limits: HttpLimits, state: ServerState, handle: (req: http.IncomingMessage, res: http.ServerResponse) => Effect.Effect<void>, fork: (effect: Effect.Effect<void>) => unknown) => {
  const counts = { open: 0 }
  const server = http.createServer(
    {
      headersTimeout: limits.headersTimeoutMs,
      requestTimeout: Math.max(limits.headersTimeoutMs, limits.bodyTimeoutMs) + 5000, // a backstop: body.ts cuts bodies first
      connectionsCheckingInterval: 1000
    },
    (req, res) => {
      counts.open++
      res.once("close", () => counts.open--)
      req.on("error", () => {}) // reported to the body reader; never an uncaught 'error' event
      res.on("error", logError("response"))
      try {
        fork(handle(req, res))
      } catch (e) {
        // Last resort: whatever escaped is this request's 500, and the server goes on.
        state.defects++
        logError("request")(e)
        if (!res.headersSent && !res.destroyed) sendJson(res, 500, errorBody(apiError(500, "Internal error while serving the request.", { code: "internal_error" })))
        else res.destroy()
      }
    }
  )
  server.maxConnections = limits.maxConnections
  server.on("clientError", (err: NodeJS.ErrnoException, socket) => {
    if (socket.writable && !socket.destroyed) socket.end(clientErrorResponse(err.code))
    else socket.destroy()
  })
  server.on("connection", (socket) => socket.on("error", () => {}))
  return { server, counts }
}

/** Listens on `host:port` until the scope closes, then stops accepting, waits up to 30 s for the open responses and closes every connection; the port. */
const listen = (server: http.Server, counts: { readonly open: number }, host: string, port: number) =>
  Effect.acquireRelease(
    Effect.callback<number, TransportError>((resume) => {
      server.once("error", (e) => resume(Effect.fail(new TransportError({ operation: `listen on ${host}:${port}`, message: e.message }))))
      server.listen(port, host, () => {
        server.on("error", logError("server"))
        resume(Effect.succeed((server.address() as AddressInfo).port))
      })
    }),
    () =>
      Effect.gen(function* () {
        server.close()
        server.closeIdleConnections()
        const deadline = Date.now() + 30_000
        while (counts.open > 0 && Date.now() < deadline) yield* Effect.sleep("50 millis")
        server.closeAllConnections()
      })
  )

/** Listens until the scope closes; `errors` counts the requests answered with an error, `defects` those that hit a bug (500). */
export const serveHttp = Effect.fn("Gateway.serveHttp")(function* <S>(options: HttpServerOptions<S>) {
  const limits: HttpLimits = { ...(yield* HttpLimitsConfig), ...options.limits }
  const state: ServerState = { errors: 0, defects: 0 }
  const handle = dispatch(options, limits, byteBudget(limits.maxBufferedBytes), state)
  const fork = yield* FiberSet.makeRuntime<never, void, never>()
  const { server, counts } = nodeServer(limits, state, handle, fork)
  const port = yield* listen(server, counts, options.host, options.port)
  return {
    port,
    get errors() {
      return state.errors
    },
    get defects() {
      return state.defects
    }
  }
})
