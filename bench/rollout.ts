/**
 * `npm run bench:rollout`: N concurrent `toy` executions through the whole rollout path
 * (harness processes -> HTTP gateway -> NATS -> rollout worker -> engine, every call recorded),
 * against the same generation done by calling the engine's batcher directly in-process.
 *
 * The direct peer replays exactly what the actor path generated: each execution's calls in
 * order, the same prompts (rebuilt from the call records), the same number of output tokens,
 * the same concurrency, so both sides have the same prefix-cache opportunities. Tool latency
 * is 0 so the harnesses call back to back. Model: the `tiny` preset, randomly initialised.
 *
 * `actor_over_direct` is end-to-end generated tokens per second of the two paths: besides
 * the gateway and NATS it includes the harness processes' own time between calls (starting,
 * rendering history, parsing answers), which the direct peer does not have (it replays the
 * calls back to back); it is not the gateway's overhead. That is measured apart, first: the
 * gateway phase sends `BENCH_GATEWAY_CALLS` sequential chat calls over keep-alive HTTP to a
 * gateway in this process while the worker runs in a child `gyre node`, so this process's CPU
 * is the gateway's plus its HTTP client's: `gateway_overhead_p50_ms` / `_p99_ms` are round trip
 * minus time inside the worker (the gateway's own window: HTTP, rendering, routing, NATS both
 * ways, the record's JetStream ack; its three parts, p50 and p99 each: `gateway_prepare_*`
 * before the routing, `gateway_ask_*` to the worker and back, `gateway_record_*` the record),
 * `gateway_cpu_ms_per_call` this process's CPU per call, beside two peers on the same server:
 * `raw_nats_p50_ms` / `_p99_ms` / `raw_nats_cpu_ms_per_call`, a plain NATS request and reply of
 * the same sizes (the HTTP request and response bodies), and `raw_js_publish_p50_ms` / `_p99_ms`,
 * a lone JetStream publish of the phase's last call record to the same stream; each back to
 * back and again at the gateway's pace (`_paced_`: one started every `gateway_period_ms`, the
 * phase's time per call). `gateway_floor_p50_ms`, the paced request's p50 plus the paced
 * publish's, is what a call's transport and record cost at that pace with no work of the
 * gateway's or the worker's host on top.
 *
 * The APIs phase compares the three chat-shaped APIs on the same work: for each of Chat
 * Completions, the Responses API and the Anthropic Messages API, a gateway of its own (in this
 * process, the worker in a child `gyre node`) serves `BENCH_API_CONVERSATIONS` sequential
 * conversations of `BENCH_API_TURNS` tool-calling turns each (the APIs taking turns), every answer (its tool calls, or
 * its text) sent back as that API's clients do, with the tool's result. The model is the
 * scripted one of the gateway tests (`test/gateway/scripted-model.ts`: every turn is reasoning
 * and a read_file call), so every turn has a tool call to send back. Per API:
 * `api_<api>_overhead_p50_ms` / `_p99_ms` (round trip minus time in the worker, as above),
 * `api_<api>_cpu_ms_per_call` (this process: the gateway and its client) and, for Responses
 * and Messages, `api_<api>_overhead_over_chat` (p50 over Chat Completions'); and
 * `branch_rate_<api>`: calls whose prompt does not begin with the previous call of their
 * conversation (prompt and output tokens, read back from the call records) per call, i.e.
 * spurious branches of the trajectory tree where nothing branched.
 * Prints a table and, last, one JSON line. Not a test: nothing here is asserted.
 */
import { spawn } from "node:child_process"
import * as http from "node:http"
import * as readline from "node:readline"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Effect, Layer, Schedule } from "effect"
import { makeBatcher } from "../src/serving/batcher.ts"
import { gateway } from "../src/actors/gateway.ts"
import { GatewayProtocol, apiKeyDigest, newApiKey } from "../src/protocols/gateway.ts"
import { HarnessRunnerProtocol } from "../src/protocols/harness.ts"
import { makeHarnessRunner } from "../src/actors/harness-runner.ts"
import { rolloutWorker } from "../src/actors/rollout-worker.ts"
import { readTrajectories } from "../src/protocols/trajectories.ts"
import { loadCheckpoint, saveCheckpoint } from "../src/engine/checkpoint.ts"
import { Engine } from "../src/engine/engine.ts"
import { presets } from "../src/engine/presets.ts"
import { Nats, connectTo } from "../src/runtime/nats.ts"
import { rlLayout } from "../src/protocols/layout.ts"
import { address } from "../src/runtime/names.ts"
import { repoRoot } from "../src/runtime/nats-server.ts"
import { startNode } from "../src/runtime/node.ts"
import { ActorSystem, refOf } from "../src/runtime/system.ts"
import { anthropicBaseUrl } from "../src/harness/environment.ts"
import { chatFormatOf } from "../src/openai/hf-chat.ts"
import { writeScriptedModel } from "../test/gateway/scripted-model.ts"
import { atLeast, benchFlags } from "./flags.ts"
import { printResult } from "./results.ts"

// Each flag's default may come from its `BENCH_*` variable (`BENCH_GATEWAY_ONLY=1 npm run bench:rollout`).
const BENCH = "bench:rollout"
const f = benchFlags(BENCH, "the rollout path: the toy suite's calls through gateway and worker, replayed directly, and the gateway's own overhead", {
  executions: { kind: "integer", doc: "toy executions at once [BENCH_EXECUTIONS]", default: Number(process.env.BENCH_EXECUTIONS ?? 8) },
  horizon: { kind: "integer", doc: "turns of a toy task [BENCH_HORIZON]", default: Number(process.env.BENCH_HORIZON ?? 32) },
  "gateway-calls": { kind: "integer", doc: "sequential calls of the gateway phase [BENCH_GATEWAY_CALLS]", default: Number(process.env.BENCH_GATEWAY_CALLS ?? 400) },
  "gateway-only": { kind: "boolean", doc: "the gateway and APIs phases alone, their figures as the JSON line [BENCH_GATEWAY_ONLY=1]", default: process.env.BENCH_GATEWAY_ONLY === "1" },
  "api-conversations": { kind: "integer", doc: "sequential conversations per API in the APIs phase [BENCH_API_CONVERSATIONS]", default: Number(process.env.BENCH_API_CONVERSATIONS ?? 4) },
  "api-turns": { kind: "integer", doc: "tool-calling turns of each conversation of the APIs phase [BENCH_API_TURNS]", default: Number(process.env.BENCH_API_TURNS ?? 12) }
})
const EXECUTIONS = atLeast(BENCH, "executions", f.executions, 1)
const HORIZON = atLeast(BENCH, "horizon", f.horizon, 1)
const MAX_BATCH = 64
const toyEnv = { TOY_STEPS: String(HORIZON), TOY_TOOL_MS: "0", TOY_MAX_TOKENS: "24", TOY_TEMPERATURE: "1" }

const GATEWAY_CALLS = atLeast(BENCH, "gateway-calls", f["gateway-calls"], 1)
const GATEWAY_ONLY = f["gateway-only"]
const API_CONVERSATIONS = atLeast(BENCH, "api-conversations", f["api-conversations"], 1)
const API_TURNS = atLeast(BENCH, "api-turns", f["api-turns"], 2)

interface ReplayCall {
  readonly prompt: Int32Array
  readonly outputLength: number
}

const work = fs.mkdtempSync(path.join(os.tmpdir(), "gyre-bench-rollout-"))
const checkpoint = path.join(work, "tiny")

/** The actor path: returns its figures and, per execution, the calls to replay. */
const actorPath = Effect.gen(function* () {
  const system = yield* ActorSystem
  const node = yield* startNode({
    name: "bench",
    types: [
      rolloutWorker({ checkpoint, maxBatch: MAX_BATCH }),
      gateway({ port: 0 }),
      makeHarnessRunner({ suitesDir: path.join(repoRoot, "suites"), gateway: address("gateway", "main"), capacity: EXECUTIONS, evaluationRetries: 1, workspaceRoot: work })
    ]
  })
  yield* node.spawn("rollout-worker", "bench.0")
  yield* node.spawn("gateway", "main")
  yield* node.spawn("harness-runner", "bench")
  const runner = refOf(HarnessRunnerProtocol, address("harness-runner", "bench"))
  const started = performance.now()
  const executions = yield* Effect.forEach(
    Array.from({ length: EXECUTIONS }, (_, i) => i),
    (i) =>
      system
        .ask(runner, "RunExecution", { task: { suite: "toy", task: `heldout-${i}` }, execution: `bench-x${i}`, timeoutMs: null, keepWorkspace: "never", env: toyEnv }, { timeoutMs: 3_600_000 })
        .pipe(Effect.as(`bench-x${i}`)),
    { concurrency: "unbounded" }
  )
  const seconds = (performance.now() - started) / 1000
  const status = yield* system.ask(refOf(GatewayProtocol, address("gateway", "main")), "Status", undefined)
  const trajectories = yield* readTrajectories(system, new Set(executions))
  const replay = executions.map((execution) => {
    const tree = trajectories.executions.get(execution)!.decoder.tree
    return Array.from({ length: tree.callCount }, (_, c): ReplayCall => {
      const call = tree.call(c)
      return { prompt: tree.callSequence(c).slice(0, call.promptLength), outputLength: call.length - call.promptLength }
    })
  })
  yield* node.drain
  return { seconds, recent: status.recent, replay }
})

const quantile = (xs: ReadonlyArray<number>, q: number) => {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.round((s.length - 1) * q))] ?? 0
}
const cpuMs = (since: NodeJS.CpuUsage) => {
  const d = process.cpuUsage(since)
  return (d.user + d.system) / 1000
}

/** A worker of `checkpoint` in a child `gyre node` on this system's server; resolves once it serves. */
const childWorker = (servers: string, run: string, workerCheckpoint = checkpoint) =>
  Effect.acquireRelease(
    Effect.promise(
      () =>
        new Promise<ReturnType<typeof spawn>>((resolve, reject) => {
          const child = spawn(process.execPath, [path.join(repoRoot, "bin", "gyre.js"), "node", "--name", "w", "--run", run, "--load", path.join(repoRoot, "bench", "rollout-worker-node.ts"), "--spawn", "rollout-worker/w.0"], {
            env: { ...process.env, NATS_URL: servers, BENCH_CHECKPOINT: workerCheckpoint },
            stdio: ["ignore", "pipe", "inherit"]
          })
          readline.createInterface({ input: child.stdout! }).on("line", (line) => line.includes('"ready"') && resolve(child))
          child.once("exit", (code) => reject(new Error(`worker node exited with ${code}`)))
        })
    ),
    (child) => Effect.sync(() => child.kill("SIGKILL"))
  )

/** POSTs `body` to `path` (default chat completions, the key as a bearer) over a keep-alive connection; the answer's body. */
const post = (agent: http.Agent, port: number, key: string, body: string, path = "/v1/chat/completions", auth: Record<string, string> = { authorization: `Bearer ${key}` }) =>
  new Promise<string>((resolve, reject) => {
    const req = http.request({ host: "127.0.0.1", port, path, method: "POST", agent, headers: { ...auth, "content-type": "application/json", "content-length": Buffer.byteLength(body) } }, (res) => {
      let text = ""
      res.setEncoding("utf8")
      res.on("data", (d: string) => (text += d))
      res.on("end", () => (res.statusCode === 200 ? resolve(text) : reject(new Error(`status ${res.statusCode}: ${text}`))))
    })
    req.on("error", reject)
    req.end(body)
  })

/**
 * `GATEWAY_CALLS` sequential runs of `f`: p50 and p99 ms, and this process's CPU ms per run.
 * With `periodMs`, a run starts `periodMs` after the one before (at the gateway's own pace: a
 * publish acknowledged after an idle gap takes longer here than one right after another).
 */
const timed = (f: (i: number) => Promise<unknown>, periodMs = 0) =>
  Effect.promise(async () => {
    const ms: Array<number> = []
    const cpu0 = process.cpuUsage()
    let next = performance.now()
    for (let i = 0; i < GATEWAY_CALLS; i++) {
      const wait = next - performance.now()
      if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait))
      const t = performance.now()
      next = t + periodMs
      await f(i)
      ms.push(performance.now() - t)
    }
    return { p50: quantile(ms, 0.5), p99: quantile(ms, 0.99), cpu: cpuMs(cpu0) / GATEWAY_CALLS }
  })

/** The gateway's own cost per call, and beside it its peers: a raw NATS request of the same sizes, a lone publish of its record. */
const gatewayPhase = Effect.gen(function* () {
  const system = yield* ActorSystem
  yield* childWorker(system.nats.servers, system.run)
  const node = yield* startNode({ name: "gw", types: [gateway({ port: 0 })] })
  yield* node.spawn("gateway", "main")
  const gw = refOf(GatewayProtocol, address("gateway", "main"))
  const key = newApiKey()
  const { baseUrl } = yield* system.ask(gw, "OpenExecution", { keyDigest: apiKeyDigest(key), task: "bench", execution: "bench-gw", defaultRole: "main" })
  const port = Number(new URL(baseUrl).port)
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 })
  const body = JSON.stringify({ model: "gyre", messages: [{ role: "user", content: "Write the next step of the plan. ".repeat(8) }], max_tokens: 8, temperature: 0 })
  let answer = ""
  const calls = (n: number) =>
    Effect.promise(async () => {
      for (let i = 0; i < n; i++) answer = await post(agent, port, key, body)
    })
  yield* Effect.retry(calls(20), { times: 50, schedule: Schedule.spaced("200 millis") }) // warm-up: also waits for the worker to be routable
  const cpu0 = process.cpuUsage()
  const start = performance.now()
  yield* calls(GATEWAY_CALLS)
  const periodMs = (performance.now() - start) / GATEWAY_CALLS
  const gatewayCpu = cpuMs(cpu0) / GATEWAY_CALLS
  const { recent } = yield* system.ask(gw, "Status", undefined)
  agent.destroy()
  // A raw request and reply of the same sizes on the same server, the responder on its own connection.
  const responder = yield* connectTo(system.nats.servers, { name: "bench-responder" })
  const reply = new TextEncoder().encode(answer)
  responder.subscribe("bench.raw", { callback: (_e, m) => void m.respond(reply) })
  yield* Effect.promise(() => responder.flush())
  const request = new TextEncoder().encode(body)
  const rawRequest = () => system.nats.nc.request("bench.raw", request, { timeout: 5000 })
  const raw = yield* timed(rawRequest)
  const rawPaced = yield* timed(rawRequest, periodMs)
  // A lone publish of the last call record's bytes to the same stream, acknowledged as the gateway's are.
  const layout = rlLayout(system.run)
  const record = yield* Effect.promise(() => system.nats.jsm.streams.getMessage(layout.trajectoryStream, { last_by_subj: layout.calls("bench-gw") })).pipe(
    Effect.flatMap((m) => (m === null ? Effect.die(new Error("the gateway phase left no call record")) : Effect.succeed(m)))
  )
  const publish = (tag: string) => (i: number) => system.nats.js.publish(layout.calls("bench-raw"), record.data, { msgID: `bench-raw.${tag}.${i}` })
  const rawJs = yield* timed(publish("b"))
  const rawJsPaced = yield* timed(publish("p"), periodMs)
  return {
    gateway_overhead_p50_ms: +recent.overheadP50Ms.toFixed(3),
    gateway_overhead_p99_ms: +recent.overheadP99Ms.toFixed(3),
    gateway_prepare_p50_ms: +recent.preparedP50Ms.toFixed(3),
    gateway_prepare_p99_ms: +recent.preparedP99Ms.toFixed(3),
    gateway_ask_p50_ms: +recent.askP50Ms.toFixed(3),
    gateway_ask_p99_ms: +recent.askP99Ms.toFixed(3),
    gateway_record_p50_ms: +recent.recordP50Ms.toFixed(3),
    gateway_record_p99_ms: +recent.recordP99Ms.toFixed(3),
    gateway_cpu_ms_per_call: +gatewayCpu.toFixed(3),
    gateway_round_trip_p50_ms: +recent.roundTripP50Ms.toFixed(3),
    gateway_worker_p50_ms: +recent.workerP50Ms.toFixed(3),
    raw_nats_p50_ms: +raw.p50.toFixed(3),
    raw_nats_p99_ms: +raw.p99.toFixed(3),
    raw_nats_cpu_ms_per_call: +raw.cpu.toFixed(3),
    raw_nats_request_bytes: request.length,
    raw_nats_reply_bytes: reply.length,
    raw_nats_paced_p50_ms: +rawPaced.p50.toFixed(3),
    raw_nats_paced_p99_ms: +rawPaced.p99.toFixed(3),
    raw_js_publish_p50_ms: +rawJs.p50.toFixed(3),
    raw_js_publish_p99_ms: +rawJs.p99.toFixed(3),
    raw_js_publish_paced_p50_ms: +rawJsPaced.p50.toFixed(3),
    raw_js_publish_paced_p99_ms: +rawJsPaced.p99.toFixed(3),
    raw_js_publish_bytes: record.data.length,
    gateway_period_ms: +periodMs.toFixed(3),
    gateway_floor_p50_ms: +(rawPaced.p50 + rawJsPaced.p50).toFixed(3),
    gateway_overhead_over_raw_nats: +(recent.overheadP50Ms / raw.p50).toFixed(2)
  }
})


type Api = "chat" | "responses" | "messages"
const APIS: ReadonlyArray<Api> = ["chat", "responses", "messages"]

/**
 * One API's conversation as its clients hold it: the request body of the next turn, and how an
 * answer (with its id) goes back into the history with the tool's result.
 */
const conversation = (api: Api) => {
  const ask = "Read a.txt, then keep reading it."
  const schema = { type: "object", properties: { path: { type: "string" } }, required: ["path"] }
  const result = "the contents of a.txt: ".repeat(3)
  const history: Array<Record<string, unknown>> = [{ role: "user", content: ask }]
  const bodies: Record<Api, () => Record<string, unknown>> = {
    chat: () => ({ model: "gyre", messages: history, max_tokens: 32, tools: [{ type: "function", function: { name: "read_file", parameters: schema } }] }),
    responses: () => ({ model: "gyre", input: history, max_output_tokens: 32, store: false, tools: [{ type: "function", name: "read_file", parameters: schema, strict: false }] }),
    messages: () => ({ model: "gyre", messages: history, max_tokens: 32, tools: [{ name: "read_file", input_schema: schema }] })
  }
  type Answer = { id: string; choices?: Array<{ message: { content: string | null; tool_calls?: Array<{ id: string }> } }>; output?: Array<{ type: string; call_id?: string }>; content?: Array<{ type: string; id?: string }> }
  const answered: Record<Api, (a: Answer) => void> = {
    chat: (a) => {
      const message = a.choices![0]!.message
      history.push({ role: "assistant", ...message })
      const calls = message.tool_calls ?? []
      if (calls.length === 0) history.push({ role: "user", content: "Go on." })
      for (const c of calls) history.push({ role: "tool", tool_call_id: c.id, content: result })
    },
    responses: (a) => {
      history.push(...(a.output as Array<Record<string, unknown>>))
      const calls = a.output!.filter((o) => o.type === "function_call")
      if (calls.length === 0) history.push({ role: "user", content: "Go on." })
      for (const c of calls) history.push({ type: "function_call_output", call_id: c.call_id, output: result })
    },
    messages: (a) => {
      history.push({ role: "assistant", content: a.content })
      const calls = a.content!.filter((b) => b.type === "tool_use")
      history.push({ role: "user", content: calls.length === 0 ? "Go on." : calls.map((c) => ({ type: "tool_result", tool_use_id: c.id, content: result })) })
    }
  }
  return { body: () => JSON.stringify(bodies[api]()), answer: (text: string) => {
    const a = JSON.parse(text) as Answer
    answered[api](a)
    return a.id
  } }
}

/** Spurious branches: calls of a conversation whose prompt does not begin with the whole previous call. */
const branchesOf = (tree: { callIndex: (id: string) => number | undefined; callSequence: (i: number) => Int32Array; call: (i: number) => { promptLength: number } }, ids: ReadonlyArray<string>) => {
  let branches = 0
  for (let i = 1; i < ids.length; i++) {
    const before = tree.callSequence(tree.callIndex(ids[i - 1]!)!)
    const now = tree.callIndex(ids[i]!)!
    const prompt = tree.callSequence(now).subarray(0, tree.call(now).promptLength)
    if (prompt.length < before.length || before.some((t, k) => prompt[k] !== t)) branches++
  }
  return branches
}

/**
 * The same tool-calling conversations through each API, each API on a gateway of its own (one
 * node), the conversations taken in turn (chat, responses, messages, chat, ...) so that warm-up
 * and machine load fall on all three alike: overhead, CPU and spurious branches per call.
 */
const apisPhase = Effect.gen(function* () {
  const system = yield* ActorSystem
  const scripted = writeScriptedModel(path.join(work, "scripted"))
  const chat = yield* Effect.promise(() => chatFormatOf(scripted))
  yield* childWorker(system.nats.servers, system.run, scripted)
  const node = yield* startNode({ name: "apis", types: [gateway({ port: 0, chat })] })
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 })
  const per = new Map<Api, { calls: number; cpu: number; conversations: Array<{ execution: string; ids: Array<string> }> }>(APIS.map((api) => [api, { calls: 0, cpu: 0, conversations: [] }]))
  const gateways = new Map(APIS.map((api) => [api, refOf(GatewayProtocol, address("gateway", `api-${api}`))]))
  for (const api of APIS) yield* node.spawn("gateway", `api-${api}`)
  for (let c = 0; c < API_CONVERSATIONS; c++) {
    for (const api of APIS) {
      const key = newApiKey()
      const execution = `bench-api-${api}-${c}`
      const { baseUrl } = yield* system.ask(gateways.get(api)!, "OpenExecution", { keyDigest: apiKeyDigest(key), task: "bench", execution, defaultRole: "main" })
      const port = Number(new URL(baseUrl).port)
      const route = { chat: "/v1/chat/completions", responses: "/v1/responses", messages: `${new URL(anthropicBaseUrl(baseUrl)).pathname.replace(/\/$/, "")}/v1/messages` }[api]
      const auth: Record<string, string> = api === "messages" ? { "x-api-key": key, "anthropic-version": "2023-06-01" } : { authorization: `Bearer ${key}` }
      const talk = conversation(api)
      const send = () => post(agent, port, key, talk.body(), route, auth)
      const ids = [talk.answer(yield* Effect.retry(Effect.promise(send), { times: 50, schedule: Schedule.spaced("200 millis") }))] // also waits for the worker to be routable
      const cpu0 = process.cpuUsage()
      yield* Effect.promise(async () => {
        for (let t = 1; t < API_TURNS; t++) ids.push(talk.answer(await send()))
      })
      const of = per.get(api)!
      of.cpu += cpuMs(cpu0)
      of.calls += API_TURNS - 1
      of.conversations.push({ execution, ids })
    }
  }
  agent.destroy()
  const out: Record<string, number> = {}
  for (const api of APIS) {
    const { calls, cpu, conversations } = per.get(api)!
    const { recent } = yield* system.ask(gateways.get(api)!, "Status", undefined)
    const trajectories = yield* readTrajectories(system, new Set(conversations.map((c) => c.execution)))
    const branches = conversations.reduce((n, c) => n + branchesOf(trajectories.executions.get(c.execution)!.decoder.tree, c.ids), 0)
    out[`api_${api}_overhead_p50_ms`] = +recent.overheadP50Ms.toFixed(3)
    out[`api_${api}_overhead_p99_ms`] = +recent.overheadP99Ms.toFixed(3)
    out[`api_${api}_cpu_ms_per_call`] = +(cpu / calls).toFixed(3)
    if (api !== "chat") out[`api_${api}_overhead_over_chat`] = +(recent.overheadP50Ms / out.api_chat_overhead_p50_ms!).toFixed(3)
    out[`branch_rate_${api}`] = +(branches / (conversations.length * API_TURNS)).toFixed(4)
  }
  yield* node.drain
  return out
})

/** Prints the APIs phase's table. */
const apisTable = (r: Record<string, number>) => {
  console.log(`APIs (${API_CONVERSATIONS} conversations x ${API_TURNS} tool-calling turns each, scripted model, worker in a child node)`)
  console.log(["api".padEnd(10), "overhead p50 ms".padStart(16), "p99 ms".padStart(9), "CPU ms/call".padStart(12), "over chat".padStart(10), "branch rate".padStart(12)].join(" "))
  for (const api of APIS) {
    const cells = [r[`api_${api}_overhead_p50_ms`]!.toFixed(3), r[`api_${api}_overhead_p99_ms`]!.toFixed(3), r[`api_${api}_cpu_ms_per_call`]!.toFixed(3), api === "chat" ? "1" : r[`api_${api}_overhead_over_chat`]!.toFixed(3), r[`branch_rate_${api}`]!.toFixed(4)]
    console.log([api.padEnd(10), cells[0]!.padStart(16), cells[1]!.padStart(9), cells[2]!.padStart(12), cells[3]!.padStart(10), cells[4]!.padStart(12)].join(" "))
  }
}

/** The same calls through the engine's batcher in-process, one fiber per execution. */
const directPath = (replay: ReadonlyArray<ReadonlyArray<ReplayCall>>) =>
  Effect.gen(function* () {
    const { model } = yield* loadCheckpoint(checkpoint)
    const cache = yield* model.cache({ blockTokens: 16, numBlocks: 4096 })
    const batcher = yield* makeBatcher(cache, {
      worker: "direct",
      maxContext: model.config.max_position_embeddings,
      maxBatch: MAX_BATCH,
      prefillChunk: 256,
      contextsPerExecution: 16,
      version: 0,
      onLoad: () => undefined
    })
    let generated = 0
    const started = performance.now()
    yield* Effect.forEach(
      replay,
      (calls, e) =>
        Effect.forEach(
          calls,
          (call, c) =>
            batcher
              .generate({
                execution: `direct-${e}`,
                request: `direct-${e}-${c}`,
                base: null,
                prompt: call.prompt,
                sampling: { maxTokens: Math.max(1, call.outputLength), temperature: 1, topP: 1, seed: c, stop: [] }
              })
              .pipe(Effect.tap((r) => Effect.sync(() => (generated += r.output.length)))),
          { discard: true }
        ),
      { concurrency: "unbounded", discard: true }
    )
    return { seconds: (performance.now() - started) / 1000, generated }
  })

const program = Effect.gen(function* () {
  const engine = yield* Engine
  yield* saveCheckpoint(checkpoint, yield* engine.createModel(presets.tiny, { seed: 1 }))
  const systemOf = (run: string) => ActorSystem.layer({ run }).pipe(Layer.provideMerge(Nats.layer({})))
  const gw = yield* gatewayPhase.pipe(Effect.scoped, Effect.provide(systemOf("bench-gateway"))) // the worker child stops before its server
  const apis = yield* apisPhase.pipe(Effect.scoped, Effect.provide(systemOf("bench-apis")))
  apisTable(apis)
  if (GATEWAY_ONLY) return printResult(BENCH, { ...gw, ...apis })
  const actor = yield* actorPath.pipe(Effect.scoped, Effect.provide(systemOf("bench-rollout")))
  const direct = yield* Effect.scoped(directPath(actor.replay))
  const r = actor.recent
  const result = {
    executions: EXECUTIONS,
    horizon: HORIZON,
    calls: r.calls,
    calls_per_s: +(r.calls / actor.seconds).toFixed(2),
    gen_tokens_per_s: Math.round(r.generatedTokens / actor.seconds),
    ...gw,
    ...apis,
    rollout_overhead_p50_ms: +r.overheadP50Ms.toFixed(2),
    round_trip_p50_ms: +r.roundTripP50Ms.toFixed(2),
    worker_p50_ms: +r.workerP50Ms.toFixed(2),
    compute_p50_ms: +r.computeP50Ms.toFixed(2),
    prefill_tokens_saved_ratio: +(r.cachedTokens / Math.max(1, r.promptTokens)).toFixed(3),
    direct_gen_tokens_per_s: Math.round(direct.generated / direct.seconds),
    actor_over_direct: +((r.generatedTokens / actor.seconds) / (direct.generated / direct.seconds)).toFixed(3),
    actor_seconds: +actor.seconds.toFixed(2),
    direct_seconds: +direct.seconds.toFixed(2)
  }
  console.log(`${EXECUTIONS} toy executions x ${HORIZON} decisions, tiny preset, ${engine.backend} backend`)
  console.log(["path".padEnd(12), "seconds".padStart(8), "calls".padStart(6), "gen tok".padStart(8), "gen tok/s".padStart(10)].join(" "))
  console.log(["actors".padEnd(12), result.actor_seconds.toFixed(2).padStart(8), String(r.calls).padStart(6), String(r.generatedTokens).padStart(8), String(result.gen_tokens_per_s).padStart(10)].join(" "))
  console.log(["direct".padEnd(12), result.direct_seconds.toFixed(2).padStart(8), String(r.calls).padStart(6), String(direct.generated).padStart(8), String(result.direct_gen_tokens_per_s).padStart(10)].join(" "))
  console.log(`actors / direct: ${result.actor_over_direct} (end to end, harness time between calls included); prefill saved ${result.prefill_tokens_saved_ratio}`)
  console.log(
    `gateway alone (${GATEWAY_CALLS} sequential calls, worker in a child node): overhead p50 ${result.gateway_overhead_p50_ms} ms (preparing ${result.gateway_prepare_p50_ms}, to the worker and back ${result.gateway_ask_p50_ms}, record ${result.gateway_record_p50_ms}), p99 ${result.gateway_overhead_p99_ms} ms (${result.gateway_prepare_p99_ms}, ${result.gateway_ask_p99_ms}, ${result.gateway_record_p99_ms}), CPU ${result.gateway_cpu_ms_per_call} ms/call (gateway + client); raw NATS request of the same sizes: p50 ${result.raw_nats_p50_ms} ms, p99 ${result.raw_nats_p99_ms} ms, CPU ${result.raw_nats_cpu_ms_per_call} ms; a lone publish of the record: p50 ${result.raw_js_publish_p50_ms} ms, p99 ${result.raw_js_publish_p99_ms} ms; both at the gateway's pace (one every ${result.gateway_period_ms} ms): request p50 ${result.raw_nats_paced_p50_ms} ms, publish p50 ${result.raw_js_publish_paced_p50_ms} ms (floor ${result.gateway_floor_p50_ms} ms)`
  )
  printResult(BENCH, result)
})

await Effect.runPromise(Effect.scoped(program).pipe(Effect.provide(Engine.layer)))
fs.rmSync(work, { recursive: true, force: true })
process.exit(0)
