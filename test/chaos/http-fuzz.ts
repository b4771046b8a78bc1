/**
 * Fuzzing of the gateway's HTTP face with fast-check: `gyre serve` runs as a child process
 * (tiny checkpoint, its own nats-server) and takes seeded hostile requests over raw sockets:
 * any method, request target (broken percent-encoding, absolute forms, control bytes), headers
 * (keys good and bad, wrong or absurd content lengths, chunked framing, odd roles), and body
 * (mutated chat and completion requests, arbitrary JSON, deep nesting, bytes that are not
 * UTF-8), several at once.
 *
 * Invariants: the process never dies; every complete request gets an HTTP answer; no answer
 * is a 500 (a bug, where a 4xx or a clean 503 is due); afterwards `/health` is 200 and a
 * valid call is answered. `fuzzHttp` returns the figures (cases, statuses, crashes) and the
 * failing cases; the short form runs in `test/gateway/http-fuzz.test.ts`, the long one
 * (>= 10,000 cases) from `npm run test:chaos -- --long`.
 */
import { spawn } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import * as path from "node:path"
import * as readline from "node:readline"
import fc from "fast-check"
import { repoRoot } from "../../src/runtime/nats-server.ts"
import { writeCheckpoint } from "../rollout/fixtures.ts"
import { httpRequest, jsonOf, rawRequest } from "../gateway/raw-http.ts"

export interface HttpFuzzOptions {
  readonly cases: number
  readonly seed?: number
  /** Requests in flight at once (default 16). */
  readonly concurrency?: number
}

export interface HttpFuzzFailure {
  readonly index: number
  readonly reason: string
  /** The request as sent (latin1, cut at 2,000 characters). */
  readonly request: string
}

export interface HttpFuzzReport {
  readonly cases: number
  readonly seed: number
  /** Process deaths of `gyre serve` (target 0). */
  readonly crashes: number
  /** Answers with status 500 (target 0). */
  readonly internalErrors: number
  /** Complete requests the server did not answer (target 0). */
  readonly unanswered: number
  /** How many answers had each status (0: closed without one, for incomplete requests; `reset`: see the loop). */
  readonly statuses: Record<string, number>
  readonly healthyAfter: boolean
  readonly failures: ReadonlyArray<HttpFuzzFailure>
  readonly seconds: number
}

/** One generated request: its bytes, and whether it is complete (its body fully sent). */
interface FuzzCase {
  readonly bytes: Buffer
  readonly complete: boolean
}

const percentJunk = fc.constantFrom("%ZZ", "%", "%E0%A4%A", "%00", "%2F", "%C0%AF", "%FF%FE", "..", "//", "?x=%ZZ", "#frag", "%u0041")
const target = fc.oneof(
  fc.constantFrom("/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/models/gyre", "/health", "/ready", "/", "/v1/models/__proto__", "/v1/constructor"),
  fc
    .tuple(fc.constantFrom("/v1/models/", "/v1/", "/", "/v1/chat/completions"), fc.array(fc.oneof(percentJunk, fc.string({ maxLength: 12 })), { maxLength: 4 }))
    .map(([p, parts]) => p + parts.join("")),
  fc.constantFrom("*", "http://evil/v1/models", "v1/models", "/" + "a".repeat(9000)),
  fc.string({ maxLength: 40 })
)
const method = fc.oneof(fc.constantFrom("GET", "POST", "POST", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"), fc.stringMatching(/^[A-Za-z]{1,12}$/))

const anyJson = fc.jsonValue({ maxDepth: 4 })
const content = fc.oneof(fc.string({ maxLength: 200 }), fc.array(fc.record({ type: fc.constant("text"), text: fc.string({ maxLength: 50 }) }), { maxLength: 3 }), anyJson)
const message = fc.record(
  {
    role: fc.oneof(fc.constantFrom("system", "developer", "user", "assistant", "tool"), fc.string({ maxLength: 10 })),
    content,
    tool_call_id: fc.string({ maxLength: 10 }),
    tool_calls: fc.array(fc.record({ id: fc.string({ maxLength: 8 }), type: fc.constant("function"), function: fc.record({ name: fc.string({ maxLength: 8 }), arguments: fc.string({ maxLength: 30 }) }) }), { maxLength: 2 })
  },
  { requiredKeys: ["role"] }
)
const sampling = {
  model: fc.oneof(fc.constant("gyre"), fc.constant("gyre"), anyJson),
  max_tokens: fc.oneof(fc.integer({ min: 1, max: 6 }), fc.integer({ min: 1, max: 6 }), anyJson),
  temperature: fc.oneof(fc.double({ min: 0, max: 2, noNaN: true }), anyJson),
  top_p: fc.oneof(fc.double({ min: 0, max: 1, noNaN: true }), anyJson),
  stream: fc.oneof(fc.boolean(), anyJson),
  stop: fc.oneof(fc.string({ maxLength: 4 }), fc.array(fc.string({ maxLength: 4 }), { maxLength: 6 }), anyJson),
  seed: fc.oneof(fc.integer(), anyJson),
  n: fc.oneof(fc.constant(1), anyJson),
  logprobs: fc.oneof(fc.boolean(), fc.constant(0), anyJson),
  ignore_eos: fc.boolean(),
  stream_options: fc.oneof(fc.record({ include_usage: fc.boolean() }), anyJson)
}
const chatBody = fc.record(
  {
    ...sampling,
    messages: fc.oneof(fc.array(message, { minLength: 1, maxLength: 4 }), anyJson),
    tools: fc.oneof(fc.array(fc.record({ type: fc.constant("function"), function: fc.record({ name: fc.string({ maxLength: 8 }), parameters: anyJson }) }), { maxLength: 2 }), anyJson),
    tool_choice: fc.oneof(fc.constantFrom("none", "auto", "required"), anyJson),
    max_completion_tokens: fc.oneof(fc.integer({ min: 1, max: 6 }), anyJson)
  },
  { requiredKeys: ["model", "messages", "max_tokens"] }
)
const completionBody = fc.record(
  {
    ...sampling,
    prompt: fc.oneof(fc.string({ maxLength: 100 }), fc.array(fc.integer({ min: -5, max: 70_000 }), { minLength: 1, maxLength: 50 }), fc.array(fc.string({ maxLength: 20 }), { maxLength: 2 }), anyJson),
    echo: fc.oneof(fc.boolean(), anyJson)
  },
  { requiredKeys: ["model", "prompt", "max_tokens"] }
)
const body = fc.oneof(
  { weight: 5, arbitrary: chatBody.map((b) => Buffer.from(JSON.stringify(b))) },
  { weight: 3, arbitrary: completionBody.map((b) => Buffer.from(JSON.stringify(b))) },
  { weight: 1, arbitrary: fc.constant(Buffer.alloc(0)) },
  { weight: 1, arbitrary: anyJson.map((v) => Buffer.from(JSON.stringify(v) ?? "null")) },
  { weight: 1, arbitrary: fc.string({ maxLength: 100 }).map((s) => Buffer.from(s)) },
  { weight: 1, arbitrary: fc.uint8Array({ maxLength: 200 }).map((b) => Buffer.from(b)) },
  { weight: 1, arbitrary: fc.tuple(fc.integer({ min: 1, max: 200_000 }), fc.constantFrom("[", "{\"a\":")).map(([n, open]) => Buffer.from(open.repeat(n) + (open === "[" ? "]" : "}").repeat(n))) },
  { weight: 1, arbitrary: fc.integer({ min: 1, max: 200_000 }).map((n) => Buffer.from(`{"model":"gyre","messages":[${'{"role":"user","content":"x"},'.repeat(n)}{}]}`)) }
)

const caseOf = (key: string) =>
  fc
    .record({
      method,
      target,
      auth: fc.oneof(fc.constant(`Bearer ${key}`), fc.constant(`Bearer ${key}`), fc.constant(undefined), fc.string({ maxLength: 30 }), fc.string({ maxLength: 30 }).map((s) => `Bearer ${s}`), fc.constant(`Bearer ${"k".repeat(400)}`)),
      contentType: fc.oneof(fc.constant("application/json"), fc.constant(undefined), fc.string({ maxLength: 20 })),
      length: fc.oneof(
        { weight: 6, arbitrary: fc.constant<"right">("right") },
        { weight: 1, arbitrary: fc.constantFrom("-1", "abc", "99999999999999999999", "1e3", " 5", "0x10", "") },
        { weight: 1, arbitrary: fc.integer({ min: 0, max: 300 }).map(String) }
      ),
      chunked: fc.oneof({ weight: 8, arbitrary: fc.constant(false) }, { weight: 1, arbitrary: fc.constant(true) }),
      role: fc.option(fc.string({ maxLength: 200 }), { nil: undefined }),
      extra: fc.array(fc.tuple(fc.stringMatching(/^[A-Za-z0-9-]{1,20}$/), fc.string({ maxLength: 40 })), { maxLength: 3 }),
      body
    })
    .map(({ method, target, auth, contentType, length, chunked, role, extra, body }): FuzzCase => {
      const headers: Array<[string, string]> = [["host", "127.0.0.1"], ["connection", "close"], ...extra]
      if (auth !== undefined) headers.push(["authorization", auth])
      if (contentType !== undefined) headers.push(["content-type", contentType])
      if (role !== undefined) headers.push(["x-gyre-role", role])
      let payload = body
      let complete = true
      if (chunked) {
        headers.push(["transfer-encoding", "chunked"])
        payload = Buffer.concat([Buffer.from(`${body.length.toString(16)}\r\n`), body, Buffer.from("\r\n0\r\n\r\n")])
      } else if (length === "right") headers.push(["content-length", String(body.length)])
      else {
        headers.push(["content-length", length])
        // A declared length beyond the bytes sent leaves the request waiting for the rest.
        complete = !/^\d+$/.test(length) || Number(length) <= body.length
      }
      const head = `${method} ${target} HTTP/1.1\r\n${headers.map(([k, v]) => `${k}: ${v}`).join("\r\n")}\r\n\r\n`
      return { bytes: Buffer.concat([Buffer.from(head, "latin1"), payload]), complete }
    })

export interface Served {
  readonly pid: number
  readonly baseUrl: string
  readonly port: number
  readonly key: string
  readonly alive: () => boolean
  readonly stderr: () => string
  readonly stop: () => Promise<void>
}

/** `gyre serve` on a fresh tiny checkpoint in `dir`, short body and header deadlines (so incomplete cases end fast). */
export const startServe = async (dir: string): Promise<Served> => {
  const checkpoint = await writeCheckpoint(path.join(dir, "ckpt"), 13)
  const child = spawn(process.execPath, [path.join(repoRoot, "bin", "gyre.js"), "serve", "--checkpoint", checkpoint, "--port", "0", "--max-tokens", "6", "--kv-blocks", "512"], {
    cwd: repoRoot,
    env: { ...process.env, NATS_URL: "", GYRE_HTTP_BODY_TIMEOUT_MS: "1000", GYRE_HTTP_HEADERS_TIMEOUT_MS: "1000" },
    stdio: ["ignore", "pipe", "pipe"]
  })
  let stderr = ""
  child.stderr!.on("data", (d: Buffer) => (stderr = (stderr + d.toString()).slice(-20_000)))
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()))
  const ready = await new Promise<Record<string, string>>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`gyre serve did not get ready; stderr:\n${stderr}`)), 90_000)
    readline.createInterface({ input: child.stdout! }).on("line", (line) => {
      if (!line.startsWith("{")) return
      const event = JSON.parse(line) as Record<string, string>
      if (event.event === "ready") {
        clearTimeout(timer)
        resolve(event)
      }
    })
    child.once("exit", (code) => reject(new Error(`gyre serve exited (${code}) before ready; stderr:\n${stderr}`)))
  })
  return {
    pid: child.pid!,
    baseUrl: ready.baseUrl!,
    port: Number(new URL(ready.baseUrl!).port),
    key: ready.key!,
    alive: () => child.exitCode === null && child.signalCode === null,
    stderr: () => stderr,
    stop: async () => {
      if (child.exitCode === null) child.kill("SIGTERM")
      const killer = setTimeout(() => child.kill("SIGKILL"), 30_000)
      await exited
      clearTimeout(killer)
    }
  }
}

/** Runs `cases` seeded hostile requests against a fresh `gyre serve` and reports. */
export const fuzzHttp = async (options: HttpFuzzOptions): Promise<HttpFuzzReport> => {
  const seed = options.seed ?? 20261201
  const dir = mkdtempSync(path.join(tmpdir(), "gyre-http-fuzz-"))
  const started = performance.now()
  const served = await startServe(dir)
  const statuses: Record<string, number> = {}
  const failures: Array<HttpFuzzFailure> = []
  let internalErrors = 0
  let unanswered = 0
  let crashed = false
  try {
    const cases = fc.sample(caseOf(served.key), { numRuns: options.cases, seed })
    let next = 0
    const worker = async () => {
      while (next < cases.length && !crashed) {
        const index = next++
        const c = cases[index]!
        const answer = await rawRequest(served.port, c.bytes, { timeoutMs: 15_000 })
        // A reset while still writing: the server answered early and closed (a body it need not
        // read), and TCP dropped the answer on our side. Counted apart, not a failure.
        const reset = answer.status === 0 && answer.error !== undefined && /ECONNRESET|EPIPE/.test(answer.error)
        const kind = reset ? "reset" : String(answer.status)
        statuses[kind] = (statuses[kind] ?? 0) + 1
        const fail = (reason: string) => {
          if (failures.length < 50) failures.push({ index, reason, request: c.bytes.toString("latin1").slice(0, 2000) })
        }
        if (!served.alive()) {
          crashed = true
          fail(`gyre serve died; stderr tail:\n${served.stderr().slice(-2000)}`)
        } else if (answer.status >= 500 && answer.status !== 503) {
          internalErrors++
          fail(`status ${answer.status}: ${answer.text.slice(0, 500)}`)
        } else if (answer.status === 0 && c.complete && !reset) {
          unanswered++
          fail(`no answer (${answer.error ?? (answer.closed ? "closed" : "timed out")})`)
        }
      }
    }
    await Promise.all(Array.from({ length: options.concurrency ?? 16 }, worker))
    const health = served.alive() ? await rawRequest(served.port, httpRequest("GET", "/health", {})) : undefined
    const call = served.alive()
      ? await rawRequest(
          served.port,
          httpRequest("POST", "/v1/chat/completions", { authorization: `Bearer ${served.key}`, "content-type": "application/json" }, JSON.stringify({ model: "gyre", messages: [{ role: "user", content: "hi" }], max_tokens: 3 }))
        )
      : undefined
    const healthyAfter = health?.status === 200 && call?.status === 200 && jsonOf(call)?.choices?.length === 1
    return { cases: cases.length, seed, crashes: crashed || !served.alive() ? 1 : 0, internalErrors, unanswered, statuses, healthyAfter, failures, seconds: (performance.now() - started) / 1000 }
  } finally {
    await served.stop()
    rmSync(dir, { recursive: true, force: true })
  }
}
