/**
 * The gateway's HTTP face under hostile input, against a real rollout worker (tiny preset),
 * real NATS and raw sockets: malformed URLs, request lines and headers, over-complex JSON,
 * prompts over the context, slow clients, too many bytes, requests and connections. Each is
 * answered with its OpenAI-format error (or the connection is cut) and the gateway goes on
 * serving; /health and /ready tell whether a worker is there.
 */
import { monitorEventLoopDelay } from "node:perf_hooks"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import type { HttpLimits } from "../../src/gateway/http.ts"
import { ActorSystem } from "../../src/runtime/system.ts"
import { eventually, withSystem } from "../runtime/harness.ts"
import { KEY, gatewayRef, serve, tempDir, writeCheckpoint } from "../rollout/fixtures.ts"
import { httpRequest, jsonOf, rawRequest, type RawAnswer } from "./raw-http.ts"

const checkpoint = await writeCheckpoint(tempDir("gyre-gw-limits-"), 7)

const limits: Partial<HttpLimits> = {
  maxBodyBytes: 64 * 1024,
  bodyTimeoutMs: 1500,
  headersTimeoutMs: 1500,
  maxJsonDepth: 16,
  maxJsonContainers: 1000,
  maxBufferedBytes: 100_000,
  maxRequestsPerSession: 2,
  maxConnections: 24
}

const portOf = (baseUrl: string) => Number(new URL(baseUrl).port)
const auth = { authorization: `Bearer ${KEY}`, "content-type": "application/json" }
const chat = (content: string, extra: Record<string, unknown> = {}) => JSON.stringify({ model: "gyre", messages: [{ role: "user", content }], max_tokens: 4, ...extra })
const send = (port: number, request: string | Uint8Array, timeoutMs = 10_000) => Effect.promise(() => rawRequest(port, request, { timeoutMs }))
const code = (a: RawAnswer) => jsonOf(a)?.error?.code as string | undefined

describe("gateway HTTP limits", () => {
  it("answers malformed URLs, requests, headers and JSON with their errors, and prompts over the context at once", async () => {
    const out = await withSystem("gw-hostile", Effect.gen(function* () {
      const { baseUrl } = yield* serve({ checkpoint, workers: 1, worker: { maxContext: 256 }, gateway: { limits, maxContextTokens: 256 } })
      const port = portOf(baseUrl)
      const get = (target: string) => send(port, httpRequest("GET", target, auth))
      const post = (body: string | Buffer, headers: Record<string, string> = {}) =>
        send(port, Buffer.concat([Buffer.from(httpRequest("POST", "/v1/chat/completions", { ...auth, "content-length": String(body.length), ...headers })), Buffer.from(body)]))
      const started = Date.now()
      const overContext = yield* post(chat("x".repeat(50_000)))
      const overContextMs = Date.now() - started
      return {
        badPercent: yield* get("/v1/models/%ZZ"),
        truncatedPercent: yield* get("/v1/models/%E0%A4%A"),
        notAPath: yield* get("*"),
        absolute: yield* get("http://evil/v1/models"),
        garbage: yield* send(port, "\u0000\u0001 junk\r\n\r\n"),
        hugeHeader: yield* send(port, httpRequest("GET", "/v1/models", { ...auth, "x-big": "a".repeat(20_000) })),
        badLength: yield* send(port, httpRequest("POST", "/v1/chat/completions", { ...auth, "content-length": "-5" }, "{}")),
        deep: yield* post("[".repeat(5000) + "]".repeat(5000)),
        wide: yield* post(`{"model":"gyre","messages":[${Array.from({ length: 2000 }, () => "{}").join(",")}]}`),
        badUtf8: yield* post(Buffer.from([0x7b, 0x22, 0xff, 0xfe, 0x22, 0x3a, 0x31, 0x7d])),
        longRole: yield* send(port, httpRequest("POST", "/v1/chat/completions", { ...auth, "x-gyre-role": "r".repeat(500) }, chat("hi"))),
        overContext,
        overContextMs,
        overContextText: yield* send(port, httpRequest("POST", "/v1/completions", auth, JSON.stringify({ model: "gyre", prompt: "y".repeat(300), max_tokens: 2 }))),
        overContextIds: yield* send(port, httpRequest("POST", "/v1/completions", auth, JSON.stringify({ model: "gyre", prompt: Array.from({ length: 300 }, () => 65), max_tokens: 2 }))),
        protoPath: yield* send(port, httpRequest("GET", "/v1/models/__proto__", auth)),
        afterwards: yield* post(chat("hello")),
        health: yield* get("/health"),
        ready: yield* get("/ready"),
        status: yield* (yield* ActorSystem).ask(gatewayRef, "Status", undefined)
      }
    }))
    expect([out.badPercent.status, code(out.badPercent)]).toEqual([400, "invalid_url"])
    expect([out.truncatedPercent.status, code(out.truncatedPercent)]).toEqual([400, "invalid_url"])
    expect([out.notAPath.status, code(out.notAPath)]).toEqual([400, "invalid_url"])
    expect([out.absolute.status, code(out.absolute)]).toEqual([400, "invalid_url"])
    expect([out.garbage.status, code(out.garbage)]).toEqual([400, "bad_request"])
    expect(out.hugeHeader.status).toBe(431)
    expect(out.badLength.status).toBe(400)
    expect([out.deep.status, code(out.deep)]).toEqual([400, "json_too_complex"])
    expect([out.wide.status, code(out.wide)]).toEqual([400, "json_too_complex"])
    expect(out.badUtf8.status).toBe(400)
    expect([out.longRole.status, jsonOf(out.longRole)?.error?.param]).toEqual([400, "X-Gyre-Role"])
    expect([out.overContext.status, code(out.overContext)]).toEqual([400, "context_length_exceeded"])
    expect(out.overContextMs).toBeLessThan(3000) // at once, not after retries on five workers
    expect([out.overContextText.status, code(out.overContextText)]).toEqual([400, "context_length_exceeded"])
    expect([out.overContextIds.status, code(out.overContextIds)]).toEqual([400, "context_length_exceeded"])
    expect([out.protoPath.status, code(out.protoPath)]).toEqual([404, "model_not_found"])
    expect(out.afterwards.status).toBe(200)
    expect(jsonOf(out.afterwards)?.choices?.[0]?.message?.role).toBe("assistant")
    expect(out.health.status).toBe(200)
    expect(jsonOf(out.ready)).toMatchObject({ status: "ready", nats: true, workers: 1 })
    expect(out.status.errors).toBeGreaterThanOrEqual(10)
    expect(out.status.internalErrors).toBe(0)
  })

  it("sends a prompt over NATS's max_payload to the worker through the transfer store: its limit answers, naming the tokens and what bounds them", async () => {
    const out = await withSystem("gw-payload", Effect.gen(function* () {
      const { baseUrl } = yield* serve({ checkpoint, workers: 2 })
      const port = portOf(baseUrl)
      const started = Date.now()
      // 400,001 tokens: 1.6 MB of int32, 2.1 MB inline, over the server's default 1 MiB max_payload
      const big = yield* send(port, httpRequest("POST", "/v1/completions", auth, JSON.stringify({ model: "gyre", prompt: "z".repeat(400_000), max_tokens: 2 })), 60_000)
      return { big, ms: Date.now() - started, afterwards: yield* send(port, httpRequest("POST", "/v1/chat/completions", auth, chat("hello"))) }
    }))
    expect([out.big.status, code(out.big)]).toEqual([400, "context_length_exceeded"])
    expect(jsonOf(out.big)?.error?.message).toMatch(/maximum context length is 8192 tokens\. However, your request has 400001 prompt tokens\. The limit is the model's/)
    expect(out.ms).toBeLessThan(10_000) // not retried on the other worker
    expect(out.afterwards.status).toBe(200)
  })

  it("keeps the event loop going while it refuses concurrent 12 MB prompts over the context", async () => {
    const out = await withSystem("gw-big", Effect.gen(function* () {
      const { baseUrl } = yield* serve({ checkpoint, workers: 1, gateway: { maxContextTokens: 4096 } })
      const port = portOf(baseUrl)
      const body = chat("w".repeat(12 * 1024 * 1024))
      const lag = monitorEventLoopDelay({ resolution: 10 })
      lag.enable()
      const started = Date.now()
      const answers = yield* Effect.promise(() => Promise.all(Array.from({ length: 4 }, () => rawRequest(port, httpRequest("POST", "/v1/chat/completions", auth, body), { timeoutMs: 60_000 }))))
      lag.disable()
      return { answers, ms: Date.now() - started, maxLagMs: lag.max / 1e6 }
    }))
    expect(out.answers.map((a) => [a.status, code(a)])).toEqual(Array.from({ length: 4 }, () => [400, "context_length_exceeded"]))
    expect(out.maxLagMs).toBeLessThan(2000) // was ~16 s for one 60 MB prompt before the bounds
  })

  it("cuts slow bodies and headers, and bounds buffered bytes, requests per key and connections", async () => {
    const out = await withSystem("gw-slow", Effect.gen(function* () {
      const { baseUrl } = yield* serve({ checkpoint, workers: 1, gateway: { limits } })
      const port = portOf(baseUrl)
      const head = (length: number) => httpRequest("POST", "/v1/chat/completions", { ...auth, "content-length": String(length) })
      // A body that dribbles 10 bytes every 200 ms would take 20 s: cut at the 1.5 s body deadline.
      const dribble = rawRequest(port, head(1000), { timeoutMs: 10_000, dribble: { pieces: Array.from({ length: 100 }, () => "x".repeat(10)), everyMs: 200 } })
      // Headers that never end: cut by the headers timeout.
      const slowHeaders = rawRequest(port, "GET /v1/models HTTP/1.1\r\nhost: x\r\n", { timeoutMs: 10_000, dribble: { pieces: Array.from({ length: 100 }, (_, i) => `x-${i}: y\r\n`), everyMs: 300 } })
      const [dribbled, slowHead] = yield* Effect.promise(() => Promise.all([dribble, slowHeaders]))
      // Two bodies of 60 kB in progress do not fit the 100 kB budget: the second is refused.
      const holding = rawRequest(port, head(60_000) + "z".repeat(55_000), { timeoutMs: 10_000 })
      yield* Effect.sleep("300 millis")
      const overBudget = yield* send(port, head(60_000) + "z".repeat(55_000))
      const held = yield* Effect.promise(() => holding)
      // Two requests of the key in flight (bodies not sent yet): the third gets 429.
      const pending = [rawRequest(port, head(100), { timeoutMs: 10_000 }), rawRequest(port, head(100), { timeoutMs: 10_000 })]
      yield* Effect.sleep("300 millis")
      const third = yield* send(port, httpRequest("POST", "/v1/chat/completions", auth, chat("hi")))
      const waited = yield* Effect.promise(() => Promise.all(pending))
      // More connections than the cap: the excess is closed at once; the cap frees as they go.
      const sockets = yield* Effect.promise(() => Promise.all(Array.from({ length: 40 }, () => rawRequest(port, "", { timeoutMs: 1000 }))))
      // The cap frees as the gateway sees those sockets close (later on a loaded machine): a refused
      // connection (closed, no status) is tried again; any answer ends the wait.
      const afterwards = yield* eventually(send(port, httpRequest("POST", "/v1/chat/completions", auth, chat("hello"))).pipe(
        Effect.map((a) => (a.status === 0 && a.closed ? undefined : a))
      ), 15_000, 200)
      return { dribbled, slowHead, overBudget, held, third, waited, sockets, afterwards }
    }))
    expect([out.dribbled.status, code(out.dribbled), out.dribbled.closed]).toEqual([408, "request_timeout", true])
    expect(out.dribbled.ms).toBeLessThan(5000)
    expect(out.slowHead.closed).toBe(true)
    expect(out.slowHead.ms).toBeLessThan(6000)
    expect([out.overBudget.status, code(out.overBudget)]).toEqual([503, "server_busy"])
    expect(out.held.status).toBe(408) // its body never completed
    expect([out.third.status, code(out.third)]).toEqual([429, "rate_limit_exceeded"])
    expect(out.waited.map((w) => w.status)).toEqual([408, 408])
    const refused = out.sockets.filter((s) => s.closed && s.ms < 900).length
    expect(refused).toBeGreaterThanOrEqual(40 - 24)
    expect(out.afterwards.status).toBe(200)
  })

  it("says not ready while no worker is there, and ready once one is", async () => {
    const out = await withSystem("gw-ready", Effect.gen(function* () {
      const { baseUrl, node } = yield* serve({ checkpoint, workers: 0, gateway: { limits } })
      const port = portOf(baseUrl)
      const probe = (path: string) => send(port, httpRequest("GET", path, {}))
      const before = { health: yield* probe("/health"), ready: yield* probe("/ready") }
      yield* node.spawn("rollout-worker", "a.cpu0")
      const after = yield* eventually(probe("/ready").pipe(Effect.map((r) => (r.status === 200 ? r : undefined))), 20_000, 100)
      return { before, after }
    }))
    expect(out.before.health.status).toBe(200)
    expect(jsonOf(out.before.health)).toMatchObject({ status: "ok", ready: false, nats: true, workers: 0 })
    expect(out.before.ready.status).toBe(503)
    expect(jsonOf(out.before.ready)).toMatchObject({ status: "not_ready", reasons: ["no usable rollout worker"] })
    expect(jsonOf(out.after)).toMatchObject({ status: "ready", workers: 1 })
  })
})
