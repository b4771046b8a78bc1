/**
 * Fuzzing of the gateway's HTTP face with fast-check: `gyre serve` runs as a child process
 * (tiny checkpoint, its own nats-server) and takes seeded hostile requests over raw sockets:
 * any method, request target (broken percent-encoding, absolute forms, control bytes), headers
 * (keys good and bad, as a bearer or in `x-api-key`, wrong or absurd content lengths, chunked
 * framing, odd roles, `anthropic-version`), and body (mutated chat, completion, Responses and
 * Anthropic Messages requests, arbitrary JSON, deep nesting, bytes that are not UTF-8), several
 * at once; most cases send a route's own kind of body to it.
 *
 * Invariants: the process never dies; every complete request gets an HTTP answer; no answer
 * is a 500 (a bug, where a 4xx or a clean 503 is due); every error answer that reached the
 * router is in its path's error shape (Anthropic's on `/v1/messages*`, and on `/v1/models*`
 * with `anthropic-version`; OpenAI's elsewhere); afterwards `/health` is 200 and a valid chat
 * call and a valid Messages call are answered. `fuzzHttp` returns the figures (cases, statuses, crashes) and the
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
import { pathOf } from "../../src/gateway/http.ts"
import { writeCheckpoint } from "../rollout/fixtures.ts"
import { httpRequest, jsonOf, rawRequest, type RawAnswer } from "../gateway/raw-http.ts"

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
  /** Statuses of the answers on each route of the Responses and Messages APIs. */
  readonly byRoute: Record<string, Record<string, number>>
  /** Error answers not in their path's error shape (target 0). */
  readonly wrongShape: number
  readonly healthyAfter: boolean
  readonly failures: ReadonlyArray<HttpFuzzFailure>
  readonly seconds: number
}

/** One generated request: its bytes, whether it is complete (its body fully sent), its target and method, whether it says `anthropic-version`. */
interface FuzzCase {
  readonly bytes: Buffer
  readonly complete: boolean
  readonly target: string
  readonly method: string
  readonly anthropic: boolean
}

const percentJunk = fc.constantFrom("%ZZ", "%", "%E0%A4%A", "%00", "%2F", "%C0%AF", "%FF%FE", "..", "//", "?x=%ZZ", "#frag", "%u0041")
const target = fc.oneof(
  fc.constantFrom(
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/models",
    "/v1/models/gyre",
    "/health",
    "/ready",
    "/",
    "/v1/models/__proto__",
    "/v1/constructor",
    "/v1/responses",
    "/v1/responses/resp_1",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/messages/batches",
    "/v1/messages?beta=true",
    "/v1/messages%2Fcount_tokens"
  ),
  fc
    .tuple(fc.constantFrom("/v1/models/", "/v1/", "/", "/v1/chat/completions", "/v1/messages", "/v1/responses/"), fc.array(fc.oneof(percentJunk, fc.string({ maxLength: 12 })), { maxLength: 4 }))
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
/** `valid` most of the time, else any JSON. */
const mostly = <T>(valid: fc.Arbitrary<T>): fc.Arbitrary<unknown> => fc.oneof({ weight: 12, arbitrary: valid as fc.Arbitrary<unknown> }, { weight: 1, arbitrary: anyJson as fc.Arbitrary<unknown> })
/** Absent (undefined: left out of the JSON) most of the time, else `value`. */
const rarely = <T>(value: fc.Arbitrary<T>): fc.Arbitrary<T | undefined> => fc.oneof({ weight: 7, arbitrary: fc.constant(undefined) }, { weight: 1, arbitrary: value })
/** A name the requests' tools use most of the time, else any short string. */
const toolName = fc.oneof({ weight: 3, arbitrary: fc.constant("read_file") }, { weight: 1, arbitrary: fc.string({ maxLength: 8 }) })
const textParts = (types: ReadonlyArray<string>) =>
  fc.array(fc.record({ type: fc.oneof({ weight: 6, arbitrary: fc.constantFrom(...types) }, { weight: 1, arbitrary: fc.string({ maxLength: 12 }) }), text: mostly(fc.string({ maxLength: 40 })) }, { requiredKeys: ["type"] }), { maxLength: 3 })
const item = fc.oneof(
  { weight: 4, arbitrary: fc.record({ type: fc.constant("message"), role: fc.oneof({ weight: 6, arbitrary: fc.constantFrom("user", "assistant", "system", "developer") }, { weight: 1, arbitrary: fc.string({ maxLength: 8 }) }), content: mostly(fc.oneof(fc.string({ maxLength: 80 }), textParts(["input_text", "output_text", "input_image", "refusal"]))) }, { requiredKeys: ["role", "content"] }) },
  { weight: 2, arbitrary: fc.record({ type: fc.constant("function_call"), call_id: mostly(fc.constantFrom("call_1", "call_2")), name: mostly(toolName), arguments: mostly(fc.oneof(fc.constant('{"path":"a"}'), fc.string({ maxLength: 30 }))) }, { requiredKeys: ["type", "call_id", "name", "arguments"] }) },
  { weight: 2, arbitrary: fc.record({ type: fc.constantFrom("function_call_output", "custom_tool_call_output"), call_id: mostly(fc.constantFrom("call_1", "call_2")), output: mostly(fc.oneof(fc.string({ maxLength: 40 }), textParts(["input_text"]))) }, { requiredKeys: ["type", "call_id", "output"] }) },
  { weight: 1, arbitrary: fc.record({ type: fc.constant("custom_tool_call"), call_id: fc.string({ maxLength: 8 }), name: toolName, input: mostly(fc.string({ maxLength: 30 })) }, { requiredKeys: ["type"] }) },
  { weight: 1, arbitrary: fc.record({ type: fc.constant("reasoning"), id: fc.string({ maxLength: 8 }), summary: mostly(textParts(["summary_text"])), encrypted_content: mostly(fc.base64String({ maxLength: 40 })) }, { requiredKeys: ["type"] }) },
  { weight: 1, arbitrary: fc.record({ type: fc.oneof(fc.constantFrom("item_reference", "web_search_call", "local_shell_call"), fc.string({ maxLength: 12 })), id: fc.string({ maxLength: 8 }) }) },
  { weight: 1, arbitrary: anyJson }
)
const responseTool = fc.oneof(
  { weight: 4, arbitrary: fc.record({ type: fc.constant("function"), name: toolName, parameters: mostly(fc.constant({ type: "object", properties: { path: { type: "string" } } })), strict: fc.boolean() }, { requiredKeys: ["type", "name"] }) },
  { weight: 2, arbitrary: fc.record({ type: fc.constant("custom"), name: toolName, format: mostly(fc.record({ type: fc.constantFrom("text", "grammar"), syntax: fc.constantFrom("lark", "regex"), definition: fc.string({ maxLength: 30 }) })) }, { requiredKeys: ["type", "name"] }) },
  { weight: 2, arbitrary: fc.record({ type: fc.oneof(fc.constantFrom("web_search", "file_search", "local_shell", "mcp"), fc.string({ maxLength: 10 })) }) },
  { weight: 1, arbitrary: anyJson }
)
/** Sampling fields of the Responses and Messages bodies, valid most of the time. */
const mostlySampling = {
  model: mostly(fc.constant("gyre")),
  max_tokens: mostly(fc.integer({ min: 1, max: 6 })),
  temperature: mostly(fc.double({ min: 0, max: 1, noNaN: true })),
  top_p: mostly(fc.double({ min: 0.05, max: 1, noNaN: true })),
  stream: mostly(fc.boolean())
}
const responsesBody = fc.record(
  {
    model: mostlySampling.model,
    input: mostly(fc.oneof(fc.string({ maxLength: 100 }), fc.array(item, { minLength: 1, maxLength: 5 }))),
    instructions: mostly(fc.string({ maxLength: 40 })),
    max_output_tokens: mostlySampling.max_tokens,
    temperature: mostlySampling.temperature,
    top_p: mostlySampling.top_p,
    stream: mostlySampling.stream,
    store: mostly(fc.boolean()),
    tools: mostly(fc.array(responseTool, { maxLength: 3 })),
    tool_choice: mostly(fc.oneof(fc.constantFrom("none", "auto", "required"), fc.record({ type: fc.constantFrom("function", "custom", "allowed_tools", "web_search"), name: toolName, mode: fc.constantFrom("auto", "required"), tools: fc.constant([{ type: "function", name: "read_file" }]) }, { requiredKeys: ["type"] }))),
    previous_response_id: rarely(fc.oneof(fc.string({ maxLength: 10 }), anyJson)),
    include: mostly(fc.array(fc.oneof({ weight: 6, arbitrary: fc.constantFrom("reasoning.encrypted_content", "message.output_text.logprobs") }, { weight: 1, arbitrary: fc.string({ maxLength: 10 }) }), { maxLength: 2 })),
    reasoning: mostly(fc.record({ effort: fc.constantFrom("low", "high"), summary: fc.constantFrom("auto", "detailed") })),
    text: mostly(fc.record({ format: fc.record({ type: fc.oneof({ weight: 6, arbitrary: fc.constant("text") }, { weight: 1, arbitrary: fc.constantFrom("json_object", "json_schema") }) }) })),
    parallel_tool_calls: mostly(fc.boolean()),
    metadata: mostly(fc.dictionary(fc.string({ maxLength: 6 }), fc.string({ maxLength: 6 }), { maxKeys: 2 }))
  },
  { requiredKeys: ["model", "input", "max_output_tokens"] }
)
const block = fc.oneof(
  { weight: 8, arbitrary: fc.record({ type: fc.constant("text"), text: mostly(fc.string({ maxLength: 60 })), cache_control: fc.record({ type: fc.constant("ephemeral") }) }, { requiredKeys: ["type", "text"] }) },
  { weight: 3, arbitrary: fc.record({ type: fc.constant("tool_use"), id: mostly(fc.constantFrom("toolu_1", "toolu_2")), name: mostly(toolName), input: mostly(fc.constant({ path: "a" })) }, { requiredKeys: ["type", "id", "name", "input"] }) },
  { weight: 3, arbitrary: fc.record({ type: fc.constant("tool_result"), tool_use_id: mostly(fc.constantFrom("toolu_1", "toolu_2")), content: mostly(fc.oneof(fc.string({ maxLength: 40 }), textParts(["text", "image"]))), is_error: mostly(fc.boolean()) }, { requiredKeys: ["type", "tool_use_id"] }) },
  { weight: 1, arbitrary: fc.record({ type: fc.constantFrom("thinking", "redacted_thinking"), thinking: fc.string({ maxLength: 30 }), signature: fc.string({ maxLength: 8 }), data: fc.string({ maxLength: 8 }) }, { requiredKeys: ["type"] }) },
  { weight: 1, arbitrary: fc.record({ type: fc.oneof(fc.constantFrom("image", "document", "server_tool_use", "web_search_tool_result"), fc.string({ maxLength: 10 })), source: anyJson }) },
  { weight: 1, arbitrary: anyJson }
)
const anthropicMessage = fc.record({ role: fc.oneof({ weight: 12, arbitrary: fc.constantFrom("user", "assistant") }, { weight: 1, arbitrary: fc.string({ maxLength: 8 }) }), content: mostly(fc.oneof(fc.string({ maxLength: 80 }), fc.array(block, { maxLength: 3 }))) }, { requiredKeys: ["role", "content"] })
const messagesBody = fc.record(
  {
    model: mostlySampling.model,
    max_tokens: mostlySampling.max_tokens,
    messages: mostly(fc.array(anthropicMessage, { minLength: 1, maxLength: 4 })),
    system: mostly(fc.oneof(fc.string({ maxLength: 40 }), textParts(["text"]))),
    tools: mostly(fc.array(fc.record({ name: toolName, description: fc.string({ maxLength: 20 }), input_schema: mostly(fc.constant({ type: "object" })), type: fc.oneof(fc.constantFrom("custom", "bash_20250124", "web_search_20250305"), fc.string({ maxLength: 6 })) }, { requiredKeys: ["name", "input_schema"] }), { maxLength: 2 })),
    tool_choice: mostly(fc.record({ type: fc.constantFrom("auto", "any", "none", "tool"), name: toolName, disable_parallel_tool_use: fc.boolean() }, { requiredKeys: ["type"] })),
    stop_sequences: mostly(fc.array(fc.string({ maxLength: 4 }), { maxLength: 3 })),
    stream: mostlySampling.stream,
    temperature: mostlySampling.temperature,
    top_p: mostlySampling.top_p,
    top_k: rarely(fc.oneof(fc.integer({ min: 1, max: 50 }), anyJson)),
    metadata: mostly(fc.record({ user_id: fc.string({ maxLength: 8 }) })),
    thinking: mostly(fc.record({ type: fc.constantFrom("enabled", "disabled", "adaptive"), budget_tokens: fc.integer({ min: 1, max: 4096 }) }))
  },
  { requiredKeys: ["model", "messages", "max_tokens"] }
)
const json = <T>(a: fc.Arbitrary<T>) => a.map((b) => Buffer.from(JSON.stringify(b) ?? "null"))
const body = fc.oneof(
  { weight: 5, arbitrary: json(chatBody) },
  { weight: 3, arbitrary: json(completionBody) },
  { weight: 3, arbitrary: json(responsesBody) },
  { weight: 3, arbitrary: json(messagesBody) },
  { weight: 1, arbitrary: fc.constant(Buffer.alloc(0)) },
  { weight: 1, arbitrary: json(anyJson) },
  { weight: 1, arbitrary: fc.string({ maxLength: 100 }).map((s) => Buffer.from(s)) },
  { weight: 1, arbitrary: fc.uint8Array({ maxLength: 200 }).map((b) => Buffer.from(b)) },
  { weight: 1, arbitrary: fc.tuple(fc.integer({ min: 1, max: 200_000 }), fc.constantFrom("[", "{\"a\":")).map(([n, open]) => Buffer.from(open.repeat(n) + (open === "[" ? "]" : "}").repeat(n))) },
  { weight: 1, arbitrary: fc.integer({ min: 1, max: 200_000 }).map((n) => Buffer.from(`{"model":"gyre","messages":[${'{"role":"user","content":"x"},'.repeat(n)}{}]}`)) }
)
/** A route with its own kind of body, mostly POSTed (most cases), else any method to any target with any body. */
const post = fc.oneof({ weight: 9, arbitrary: fc.constant("POST") }, { weight: 1, arbitrary: method })
const apiRoute = fc.oneof(
  { weight: 3, arbitrary: fc.record({ method: post, target: fc.constant("/v1/chat/completions"), body: json(chatBody) }) },
  { weight: 1, arbitrary: fc.record({ method: post, target: fc.constant("/v1/completions"), body: json(completionBody) }) },
  { weight: 3, arbitrary: fc.record({ method: post, target: fc.constant("/v1/responses"), body: json(responsesBody) }) },
  { weight: 3, arbitrary: fc.record({ method: post, target: fc.constantFrom("/v1/messages", "/v1/messages/count_tokens", "/v1/messages?beta=true"), body: json(messagesBody) }) }
)
const routed = fc.oneof({ weight: 5, arbitrary: apiRoute }, { weight: 2, arbitrary: fc.record({ method, target, body }) })

/** The Responses and Messages routes, whose answers the report counts apart. */
const NEW_ROUTES = ["/v1/responses", "/v1/messages", "/v1/messages/count_tokens"]

/** Whose error shape an answer to `c` must have: null where the request may not have reached the router. */
const expectedShape = (c: FuzzCase): "anthropic" | "openai" | null => {
  const path = pathOf(c.target)
  if (path === undefined || c.method === "HEAD") return null
  const messages = path === "/v1/messages" || path.startsWith("/v1/messages/") || (path.startsWith("/v1/models") && c.anthropic)
  return messages ? "anthropic" : "openai"
}

/** The JSON body of the first response of an answer (a pipelined request may have a second after it), or undefined. */
const firstBody = (answer: RawAnswer): any => {
  const end = answer.text.indexOf("\r\n\r\n")
  const length = /\r\ncontent-length: (\d+)\r\n/i.exec(answer.text.slice(0, end + 2))
  if (end < 0 || length === null) return undefined
  try {
    return JSON.parse(Buffer.from(answer.text.slice(end + 4), "latin1").subarray(0, Number(length[1])).toString("utf8"))
  } catch {
    return undefined
  }
}

/** The error shape of an answer's body; "parser" for the answer to a request Node's HTTP parser refused (before any route). */
const shapeOf = (answer: RawAnswer): "anthropic" | "openai" | "parser" | "none" => {
  const b = firstBody(answer)
  if (b === undefined || b === null || typeof b !== "object") return "none"
  if (b.type === "error" && typeof b.error?.type === "string" && typeof b.error?.message === "string" && Object.keys(b).length === 2) return "anthropic"
  if (typeof b.error?.message === "string" && typeof b.error?.type === "string" && "param" in b.error && "code" in b.error && Object.keys(b).length === 1) {
    return b.error.code === "bad_request" && / could not be parsed\.$/.test(b.error.message) ? "parser" : "openai"
  }
  return "none"
}

const hostileCase = (key: string) =>
  fc
    .record({
      route: routed,
      auth: fc.oneof(
        { weight: 3, arbitrary: fc.constant(`Bearer ${key}`) },
        { weight: 2, arbitrary: fc.constant(undefined) },
        { weight: 1, arbitrary: fc.string({ maxLength: 30 }) },
        { weight: 1, arbitrary: fc.string({ maxLength: 30 }).map((s) => `Bearer ${s}`) },
        { weight: 1, arbitrary: fc.constant(`Bearer ${"k".repeat(400)}`) }
      ),
      apiKey: fc.oneof({ weight: 4, arbitrary: fc.constant(undefined) }, { weight: 2, arbitrary: fc.constant(key) }, { weight: 1, arbitrary: fc.string({ maxLength: 30 }) }),
      anthropic: fc.oneof({ weight: 3, arbitrary: fc.constant(false) }, { weight: 1, arbitrary: fc.constant(true) }),
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
    .map(({ route: { method, target, body }, auth, apiKey, anthropic, contentType, length, chunked, role, extra }): FuzzCase => {
      const headers: Array<[string, string]> = [["host", "127.0.0.1"], ["connection", "close"], ...extra]
      if (auth !== undefined) headers.push(["authorization", auth])
      if (apiKey !== undefined) headers.push(["x-api-key", apiKey])
      if (anthropic) headers.push(["anthropic-version", "2023-06-01"], ["anthropic-beta", "tools-2024-04-04"])
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
      return { bytes: Buffer.concat([Buffer.from(head, "latin1"), payload]), complete, target, method, anthropic }
    })

/** A request as a client sends it (a route's own body, the key in either header, well-formed headers): its body alone is fuzzed. */
const cleanCase = (key: string) =>
  fc
    .record({ route: apiRoute, header: fc.constantFrom("authorization", "x-api-key"), anthropic: fc.boolean(), role: fc.option(fc.constantFrom("main", "subagent"), { nil: undefined }) })
    .map(({ route: { method, target, body }, header, anthropic, role }): FuzzCase => {
      const headers: Record<string, string> = { "content-type": "application/json", [header]: header === "authorization" ? `Bearer ${key}` : key }
      if (anthropic) headers["anthropic-version"] = "2023-06-01"
      if (role !== undefined) headers["x-gyre-role"] = role
      const head = httpRequest(method, target, { ...headers, "content-length": String(body.length) })
      return { bytes: Buffer.concat([Buffer.from(head, "latin1"), body]), complete: true, target, method, anthropic }
    })

const caseOf = (key: string) => fc.oneof({ weight: 2, arbitrary: hostileCase(key) }, { weight: 1, arbitrary: cleanCase(key) })

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
  const byRoute: Record<string, Record<string, number>> = Object.fromEntries(NEW_ROUTES.map((r) => [r, {}]))
  const failures: Array<HttpFuzzFailure> = []
  let internalErrors = 0
  let wrongShape = 0
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
        const path = pathOf(c.target)
        if (path !== undefined && Object.hasOwn(byRoute, path)) byRoute[path]![kind] = (byRoute[path]![kind] ?? 0) + 1
        const expected = answer.status >= 400 ? expectedShape(c) : null
        const shape = expected === null ? undefined : shapeOf(answer)
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
        } else if (shape !== undefined && shape !== expected && shape !== "parser") {
          wrongShape++
          fail(`status ${answer.status} in the ${shape} error shape where ${expected}'s is due: ${answer.text.slice(0, 500)}`)
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
    const message = served.alive()
      ? await rawRequest(served.port, httpRequest("POST", "/v1/messages", { "x-api-key": served.key, "content-type": "application/json" }, JSON.stringify({ model: "gyre", messages: [{ role: "user", content: "hi" }], max_tokens: 3 })))
      : undefined
    const healthyAfter = health?.status === 200 && call?.status === 200 && jsonOf(call)?.choices?.length === 1 && message?.status === 200 && jsonOf(message)?.type === "message"
    return { cases: cases.length, seed, crashes: crashed || !served.alive() ? 1 : 0, internalErrors, unanswered, statuses, byRoute, wrongShape, healthyAfter, failures, seconds: (performance.now() - started) / 1000 }
  } finally {
    await served.stop()
    rmSync(dir, { recursive: true, force: true })
  }
}
