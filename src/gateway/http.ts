/**
 * The gateway's HTTP plumbing, free of what it serves: a server whose requests run as fibers
 * of the caller's scope, dispatched by path and method, authenticated by a caller-given
 * function, failures answered in the OpenAI error format (an `ApiError`, anything else a 500);
 * JSON bodies read within a size limit; JSON and server-sent-event responses.
 *
 * Order of checks, each with its own status: unknown path 404, wrong method 405 (with
 * `Allow`), no or bad key 401, then the handler. On scope close the server stops accepting,
 * lets calls in flight finish (up to 30 s), then closes every connection.
 */
import * as http from "node:http"
import type { AddressInfo } from "node:net"
import { Deferred, Effect, FiberSet } from "effect"
import { TransportError } from "../runtime/errors.ts"
import { ApiError, apiError, errorBody } from "../openai/openai.ts"

/** One authenticated request; `clientGone` completes when the client hangs up before the end. */
export interface HttpCall<S> {
  readonly session: S
  readonly req: http.IncomingMessage
  readonly res: http.ServerResponse
  readonly clientGone: Deferred.Deferred<void>
  readonly startedAt: number
}

/** The handlers of one path, by HTTP method. */
export type Methods<S> = Partial<Record<string, (call: HttpCall<S>) => Effect.Effect<void, ApiError>>>

export interface HttpServerOptions<S> {
  readonly host: string
  readonly port: number
  readonly routeOf: (path: string) => Methods<S> | undefined
  readonly authenticate: (req: http.IncomingMessage) => Effect.Effect<S, ApiError>
}

export const sendJson = (res: http.ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}) => {
  if (res.destroyed || res.writableEnded) return
  const text = JSON.stringify(body)
  res.writeHead(status, { "content-type": "application/json", "content-length": String(Buffer.byteLength(text)), ...headers })
  res.end(text)
}

/** A server-sent-event response, started on the first write so errors before it keep their status. */
export const eventStream = (res: http.ServerResponse) => {
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

const parseJson = (bytes: Buffer) =>
  Effect.try({
    try: () => JSON.parse(bytes.toString("utf8")) as unknown,
    catch: (e) =>
      apiError(400, `We could not parse the JSON body of your request (${e instanceof Error ? e.message : String(e)}). The body must be a JSON object.`, {
        code: "invalid_json"
      })
  })

/** The request's body parsed as JSON, at most `limit` bytes (413 beyond). */
export const readJsonBody = (req: http.IncomingMessage, limit: number) => readBody(req, limit).pipe(Effect.flatMap(parseJson))

/** Answers a failed request: an `ApiError` as is, anything else as a 500; mid-stream as a last event. */
const answerFailure = (res: http.ServerResponse, error: ApiError, allowed: string) => {
  if (res.writableEnded || res.destroyed) return
  if (res.headersSent) {
    res.end(`data: ${JSON.stringify(errorBody(error))}\n\n`)
    return
  }
  const headers: Record<string, string> = error.status === 413 ? { connection: "close" } : error.status === 405 ? { allow: allowed } : {}
  sendJson(res, error.status, errorBody(error), headers)
}

const dispatch = <S>(options: HttpServerOptions<S>, counts: { errors: number }) => (req: http.IncomingMessage, res: http.ServerResponse) => {
  const startedAt = Date.now()
  const url = new URL(req.url ?? "/", "http://gateway")
  const path = url.pathname.length > 1 ? url.pathname.replace(/\/+$/, "") : url.pathname
  const route = options.routeOf(path)
  const allowed = Object.keys(route ?? {}).join(", ")
  return Effect.gen(function* () {
    if (route === undefined) return yield* Effect.fail(apiError(404, `Unknown request URL: ${req.method} ${path}.`, { code: "unknown_url" }))
    const handler = route[req.method ?? ""]
    if (handler === undefined) {
      return yield* Effect.fail(apiError(405, `Method ${req.method} is not allowed on ${path}; use ${allowed}.`, { code: "method_not_allowed" }))
    }
    const session = yield* options.authenticate(req)
    const clientGone = yield* Deferred.make<void>()
    res.on("close", () => {
      if (!res.writableFinished) Deferred.doneUnsafe(clientGone, Effect.void)
    })
    yield* handler({ session, req, res, clientGone, startedAt })
  }).pipe(
    Effect.catchCause((cause) => {
      const failure = cause.reasons.find((r) => r._tag === "Fail")
      const error = failure !== undefined && failure.error instanceof ApiError ? failure.error : apiError(500, `Internal error: ${String(cause).slice(0, 500)}`)
      return Effect.sync(() => {
        counts.errors++
        answerFailure(res, error, allowed)
      })
    })
  )
}

/** Listens until the scope closes; `errors` counts the requests answered with an error. */
export const serveHttp = Effect.fn("Gateway.serveHttp")(function* <S>(options: HttpServerOptions<S>) {
  const counts = { errors: 0 }
  const handle = dispatch(options, counts)
  const fork = yield* FiberSet.makeRuntime<never, void, never>()
  let open = 0
  const server = http.createServer((req, res) => {
    open++
    res.on("close", () => open--)
    fork(handle(req, res))
  })
  const port = yield* Effect.acquireRelease(
    Effect.callback<number, TransportError>((resume) => {
      server.once("error", (e) => resume(Effect.fail(new TransportError({ operation: `listen on ${options.host}:${options.port}`, message: e.message }))))
      server.listen(options.port, options.host, () => resume(Effect.succeed((server.address() as AddressInfo).port)))
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
  return {
    port,
    get errors() {
      return counts.errors
    }
  }
})
