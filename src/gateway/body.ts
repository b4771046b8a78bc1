/**
 * Reading a request body within bounds, so that no client can exhaust the gateway's memory
 * or hold its event loop: a size limit per request (413), a budget of bytes buffered by all
 * requests together (503 `server_busy` once it is spent), a deadline for the whole body (408:
 * a body that dribbles is cut), and, before `JSON.parse`, one pass over the bytes that bounds
 * the nesting depth and the number of objects and arrays (400 `json_too_complex`), so parsing
 * and decoding stay linear in the bytes and cannot blow the stack or the heap.
 */
import type * as http from "node:http"
import { Effect } from "effect"
import { apiError, type ApiError } from "../openai/openai.ts"

export interface BodyLimits {
  /** Largest body of one request, bytes. */
  readonly maxBodyBytes: number
  /** How long the whole body may take to arrive, from the request's start. */
  readonly bodyTimeoutMs: number
  /** Deepest nesting of objects and arrays in a JSON body. */
  readonly maxJsonDepth: number
  /** Most objects and arrays in a JSON body. */
  readonly maxJsonContainers: number
}

/** Bytes held by request bodies of the whole server, against a fixed budget. */
export interface ByteBudget {
  /** Takes `n` bytes; false (nothing taken) when that would go over the budget. */
  readonly take: (n: number) => boolean
  readonly give: (n: number) => void
}

export const byteBudget = (limit: number): ByteBudget => {
  let used = 0
  return {
    take: (n) => {
      if (used + n > limit) return false
      used += n
      return true
    },
    give: (n) => {
      used = Math.max(0, used - n)
    }
  }
}

const tooLarge = (limit: number) => apiError(413, `Request body is larger than ${limit} bytes.`, { code: "request_too_large" })
const busy = () => apiError(503, "The server is holding too many request bodies; retry shortly.", { code: "server_busy" })
const timedOut = (ms: number) => apiError(408, `The request body did not arrive within ${ms} ms.`, { code: "request_timeout" })

/**
 * The body's bytes, counted against `budget` until the response closes. Fails at once when
 * `content-length` says too much; a body still arriving at the deadline fails with 408.
 */
export const readBody = (req: http.IncomingMessage, res: http.ServerResponse, limits: BodyLimits, budget: ByteBudget, startedAt: number) =>
  Effect.callback<Buffer, ApiError>((resume) => {
    const declared = Number(req.headers["content-length"] ?? 0)
    if (!(declared <= limits.maxBodyBytes)) return resume(Effect.fail(tooLarge(limits.maxBodyBytes)))
    let held = 0
    res.once("close", () => budget.give(held))
    const chunks: Array<Buffer> = []
    let done = false
    const finish = (outcome?: Effect.Effect<Buffer, ApiError>) => {
      if (done) return
      done = true
      clearTimeout(timer)
      req.removeListener("data", onData)
      if (outcome !== undefined) resume(outcome)
    }
    const timer = setTimeout(() => finish(Effect.fail(timedOut(limits.bodyTimeoutMs))), Math.max(0, startedAt + limits.bodyTimeoutMs - Date.now()))
    const onData = (c: Buffer) => {
      if (held + c.length > limits.maxBodyBytes) return finish(Effect.fail(tooLarge(limits.maxBodyBytes)))
      if (!budget.take(c.length)) return finish(Effect.fail(busy()))
      held += c.length
      chunks.push(c)
    }
    req.on("data", onData)
    req.once("end", () => finish(Effect.succeed(Buffer.concat(chunks, held))))
    req.once("error", (e) => finish(Effect.fail(apiError(400, `Could not read the request body: ${e.message}`))))
    req.once("aborted", () => finish(Effect.fail(apiError(400, "The client closed the connection before the body ended."))))
    return Effect.sync(() => finish())
  })

/**
 * One pass over JSON text (strings skipped): the deepest nesting and the number of objects
 * and arrays, stopping as soon as either passes its limit. Undefined when within both.
 */
export const jsonComplexity = (bytes: Uint8Array, maxDepth: number, maxContainers: number): string | undefined => {
  let depth = 0
  let containers = 0
  let inString = false
  for (let i = 0; i < bytes.length; i++) {
    const b = bytes[i]!
    if (inString) {
      if (b === 0x5c) i++ // backslash: skip the escaped byte
      else if (b === 0x22) inString = false
    } else if (b === 0x22) inString = true
    else if (b === 0x7b || b === 0x5b) {
      if (++depth > maxDepth) return `nesting deeper than ${maxDepth}`
      if (++containers > maxContainers) return `more than ${maxContainers} objects and arrays`
    } else if (b === 0x7d || b === 0x5d) depth--
  }
  return undefined
}

const parseJson = (bytes: Buffer, limits: BodyLimits) =>
  Effect.suspend(() => {
    const complex = jsonComplexity(bytes, limits.maxJsonDepth, limits.maxJsonContainers)
    if (complex !== undefined) return Effect.fail(apiError(400, `The JSON body is too complex: ${complex}.`, { code: "json_too_complex" }))
    return Effect.try({
      try: () => JSON.parse(bytes.toString("utf8")) as unknown,
      catch: (e) =>
        apiError(400, `We could not parse the JSON body of your request (${e instanceof Error ? e.message : String(e)}). The body must be a JSON object.`, {
          code: "invalid_json"
        })
    })
  })

/** The request's body parsed as JSON within `limits` and `budget`. */
export const readJsonBody = (req: http.IncomingMessage, res: http.ServerResponse, limits: BodyLimits, budget: ByteBudget, startedAt: number) =>
  readBody(req, res, limits, budget, startedAt).pipe(Effect.flatMap((bytes) => parseJson(bytes, limits)))
