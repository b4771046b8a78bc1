/**
 * Test helpers for the harness runner and the suites: a chat-completions HTTP server that
 * answers with a given policy and records every request, a stand-in gateway actor that
 * hands out that server's URL, and a runner on a node of a fresh NATS system.
 */
import * as fs from "node:fs"
import * as http from "node:http"
import * as os from "node:os"
import * as path from "node:path"
import { Effect, Schema } from "effect"
import * as Actor from "../../src/runtime/actor.ts"
import { address } from "../../src/runtime/names.ts"
import { startNode } from "../../src/runtime/node.ts"
import { ActorSystem, refOf } from "../../src/runtime/system.ts"
import { GatewayProtocol, UnknownExecution } from "../../src/protocols/gateway.ts"
import { HarnessRunnerProtocol, type RunExecution } from "../../src/protocols/harness.ts"
import { makeHarnessRunner, type HarnessRunnerConfig } from "../../src/actors/harness-runner.ts"
import { repoRoot } from "../../src/runtime/nats-server.ts"
import type { ToyMessage } from "../../suites/toy/world.mjs"

export const suitesDir = path.join(repoRoot, "suites")
export const fixtureSuites = path.join(repoRoot, "test", "harness", "fixtures", "suites")

export const tempDir = (prefix: string) => fs.mkdtempSync(path.join(os.tmpdir(), `gyre-${prefix}-`))

/**
 * A temporary directory a harness may write into (sticky, writable by all): where the tests run
 * as root, harnesses run as nobody (`harnessUser` in src/actors/harness-runner.ts).
 */
export const sharedDir = (prefix: string) => {
  const dir = tempDir(prefix)
  fs.chmodSync(dir, 0o1777)
  return dir
}

export interface ChatRequest {
  readonly key: string
  readonly role: string
  readonly messages: ReadonlyArray<ToyMessage>
  readonly body: Record<string, unknown>
}

export interface ChatServer {
  /** OpenAI base URL (ends with /v1). */
  readonly url: string
  readonly requests: Array<ChatRequest>
  readonly close: () => Promise<void>
}

/** An OpenAI-style chat server answering each request with `answer(messages, request index)`. */
export const startChatServer = (answer: (messages: ReadonlyArray<ToyMessage>, index: number) => string): Promise<ChatServer> =>
  new Promise((resolve) => {
    const requests: Array<ChatRequest> = []
    const server = http.createServer((req, res) => {
      let data = ""
      req.on("data", (d: Buffer) => (data += d.toString()))
      req.on("end", () => {
        if (req.method !== "POST" || req.url !== "/v1/chat/completions") {
          res.writeHead(404).end()
          return
        }
        const body = JSON.parse(data) as { messages: ReadonlyArray<ToyMessage> }
        requests.push({
          key: (req.headers.authorization ?? "").replace(/^Bearer /, ""),
          role: String(req.headers["x-gyre-role"] ?? ""),
          messages: body.messages,
          body
        })
        const content = answer(body.messages, requests.length - 1)
        res.writeHead(200, { "content-type": "application/json" })
        res.end(JSON.stringify({ id: `call-${requests.length - 1}`, object: "chat.completion", choices: [{ index: 0, message: { role: "assistant", content }, finish_reason: "stop" }] }))
      })
    })
    server.listen(0, "127.0.0.1", () => {
      const port = (server.address() as { port: number }).port
      resolve({ url: `http://127.0.0.1:${port}/v1`, requests, close: () => new Promise((r) => server.close(() => r())) })
    })
  })

/** What the stand-in gateway saw. */
export interface GatewayLog {
  readonly opened: Array<{ keyDigest: string; task: string; execution: string; defaultRole: string }>
  readonly closed: Array<string>
}

/** A gateway actor that registers keys and answers `baseUrl` (the chat server's URL); no model behind it. */
export const fakeGateway = (baseUrl: string, log: GatewayLog) =>
  Actor.make({
    kind: "gateway",
    protocol: GatewayProtocol,
    state: { schema: Schema.Struct({}), initial: () => ({}) },
    concurrency: 16,
    behaviour: () =>
      Effect.succeed({
        OpenExecution: (p: GatewayLog["opened"][number]) =>
          Effect.sync(() => {
            log.opened.push({ ...p })
            return { baseUrl }
          }),
        CloseExecution: ({ execution }: { readonly execution: string }) =>
          Effect.gen(function* () {
            if (!log.opened.some((o) => o.execution === execution)) return yield* new UnknownExecution({ execution })
            log.closed.push(execution)
            return { calls: 0 }
          }),
        ContextsMoved: () => Effect.succeed({ routed: 0 }),
        Status: () =>
          Effect.succeed({
            baseUrl,
            openExecutions: log.opened.length - log.closed.length,
            calls: 0,
            errors: 0,
            internalErrors: 0,
            recent: { calls: 0, roundTripP50Ms: 0, computeP50Ms: 0, workerP50Ms: 0, overheadP50Ms: 0, overheadP99Ms: 0, preparedP50Ms: 0, preparedP99Ms: 0, askP50Ms: 0, askP99Ms: 0, recordP50Ms: 0, recordP99Ms: 0, promptTokens: 0, cachedTokens: 0, generatedTokens: 0 },
            totals: { calls: 0, promptTokens: 0, cachedTokens: 0, reprefillTokens: 0, fullResends: 0 }
          })
      })
  })

export const runnerRef = refOf(HarnessRunnerProtocol, address("harness-runner", "r1"))

/** Starts a node with the runner `harness-runner/r1` (and, unless `gateway: false`, the stand-in `gateway/g1`). */
export const startRunner = (config: Omit<Partial<HarnessRunnerConfig>, "gateway"> & { readonly baseUrl?: string; readonly gateway?: false }) =>
  Effect.gen(function* () {
    const log: GatewayLog = { opened: [], closed: [] }
    const workspaceRoot = config.workspaceRoot ?? tempDir("ws")
    const runner = makeHarnessRunner({
      suitesDir: fixtureSuites,
      capacity: 2,
      evaluationRetries: 2,
      graceMs: 300,
      evaluationBackoffMs: 20,
      ...config,
      gateway: address("gateway", "g1"),
      workspaceRoot
    })
    const node = yield* startNode({ name: "n1", types: [runner, fakeGateway(config.baseUrl ?? "http://127.0.0.1:9/v1", log)] })
    if (config.gateway !== false) yield* node.spawn("gateway", "g1")
    yield* node.spawn("harness-runner", "r1")
    return { log, workspaceRoot, node }
  })

let executions = 0
/** A RunExecution request with a fresh execution id. */
export const request = (task: { suite: string; task: string }, more: Partial<RunExecution> = {}): RunExecution => ({
  task,
  execution: `x${process.pid}-${executions++}`,
  timeoutMs: null,
  keepWorkspace: "never",
  env: {},
  ...more
})

/** Runs one execution through the runner and returns its outcome. */
export const runExecution = (req: RunExecution) =>
  Effect.gen(function* () {
    const system = yield* ActorSystem
    return yield* system.ask(runnerRef, "RunExecution", req, { timeoutMs: 60_000 })
  })

/** Whether a process runs (a zombie, killed but not yet reaped by its new parent, does not). */
const running = (pid: number): boolean => {
  try {
    return fs.readFileSync(`/proc/${pid}/stat`, "utf8").replace(/^.*\) /s, "")[0] !== "Z"
  } catch {
    return false
  }
}

/** Whether the process still runs after up to `withinMs` (signals are delivered asynchronously). */
export const stillRunning = async (pid: number, withinMs = 2000): Promise<boolean> => {
  const until = Date.now() + withinMs
  while (running(pid) && Date.now() < until) await new Promise((r) => setTimeout(r, 20))
  return running(pid)
}
