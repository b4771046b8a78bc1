/**
 * The harness-runner actor against a fresh nats-server with real child processes: the toy
 * oracle end to end, environment and templates, time limits, scorer failures, crashing and
 * flooding harnesses, workspaces, capacity, duplicates and unknown tasks.
 */
import * as fs from "node:fs"
import * as path from "node:path"
import { Effect, Exit, Fiber } from "effect"
import { describe, expect, it } from "vitest"
import { rlLayout } from "../../src/protocols/layout.ts"
import { apiKeyDigest } from "../../src/protocols/gateway.ts"
import { ActorSystem } from "../../src/runtime/system.ts"
import { oracleReply } from "../../suites/toy/world.mjs"
import { withSystem } from "../runtime/harness.ts"
import { request, runExecution, runnerRef, sharedDir, startChatServer, startRunner, stillRunning, suitesDir, tempDir } from "./helpers.ts"

const behaviours = { suite: "behaviours", task: "t" }

describe("harness runner", () => {
  it("runs the toy oracle end to end: key registered and revoked, outcome published, workspace removed", async () => {
    const server = await startChatServer(oracleReply)
    try {
      const result = await withSystem("toy", Effect.gen(function* () {
        const system = yield* ActorSystem
        const { log, workspaceRoot } = yield* startRunner({ suitesDir, baseUrl: server.url })
        const req = request({ suite: "toy", task: "train-5" }, { env: { TOY_STEPS: "24", TOY_FORK_EVERY: "8", TOY_SUB_STEPS: "2", TOY_TOOL_MS: "0" } })
        const outcome = yield* runExecution(req)
        const stored = yield* Effect.promise(() => system.nats.jsm.streams.getMessage(rlLayout("toy").trajectoryStream, { last_by_subj: rlLayout("toy").outcomes(req.execution) }))
        // A long walk with slow tools, stopped by its time limit: scored on the decisions made.
        const slow = { TOY_STEPS: "400", TOY_TOOL_MS: "20", TOY_TOOL_SIGMA: "0", TOY_TAIL_ALPHA: "0" }
        const partial = yield* runExecution(request({ suite: "toy", task: "heldout-1" }, { timeoutMs: 1500, env: slow }))
        return { outcome, partial, stored: stored!.json(), log, dirLeft: fs.existsSync(path.join(workspaceRoot, req.execution)), req }
      }))
      expect(result.outcome).toMatchObject({ run: "toy", task: "toy/train-5", execution: result.req.execution, ended: "finished", evaluation: "scored", score: 1, attempts: 1 })
      expect(result.stored).toEqual(result.outcome)
      expect(result.log.opened).toHaveLength(2)
      expect(result.log.opened[0]).toMatchObject({ task: "toy/train-5", execution: result.req.execution, defaultRole: "main" })
      const key = server.requests[0]!.key
      expect(key.length).toBeGreaterThanOrEqual(32)
      expect(server.requests.length).toBeGreaterThan(24)
      // The gateway is given each key's digest only; the harness got the key itself.
      expect(new Set(server.requests.map((r) => apiKeyDigest(r.key)))).toEqual(new Set(result.log.opened.map((o) => o.keyDigest)))
      expect(result.log.closed[0]).toBe(result.req.execution)
      expect(result.dirLeft).toBe(false)
      expect(result.partial).toMatchObject({ ended: "timed-out", evaluation: "scored" })
      expect(result.partial.score).toBeGreaterThan(0.02)
      expect(result.partial.score).toBeLessThan(0.5)
    } finally {
      await server.close()
    }
  })

  it("gives the harness a fresh workspace from the template and its environment, without NATS settings", async () => {
    const result = await withSystem("env", Effect.gen(function* () {
      const { log, workspaceRoot } = yield* startRunner({ baseUrl: "http://127.0.0.1:1/v1" })
      const req = request({ suite: "behaviours", task: "series-8" }, { keepWorkspace: "always", env: { MODE: "env", FROM_REQUEST: "yes" }, seed: 41 })
      const outcome = yield* runExecution(req)
      const dir = path.join(workspaceRoot, req.execution)
      return { outcome, log, dir, execution: req.execution, env: JSON.parse(fs.readFileSync(path.join(dir, "workspace", "env.json"), "utf8")) }
    }))
    const workspace = path.join(result.dir, "workspace")
    expect(apiKeyDigest(result.env.key)).toBe(result.log.opened[0]!.keyDigest)
    expect(result.env).toEqual({
      base: "http://127.0.0.1:1/v1",
      key: result.env.key,
      anthropicBase: "http://127.0.0.1:1",
      anthropicKey: result.env.key,
      anthropicToken: result.env.key,
      task: "series-8",
      execution: result.execution,
      seed: "41",
      workspace,
      suiteDir: expect.stringMatching(/fixtures\/suites\/behaviours$/),
      suite: "from-suite",
      number: "8",
      request: "yes",
      nats: null,
      cwd: workspace
    })
    expect(fs.readFileSync(path.join(workspace, "seed.txt"), "utf8")).toBe("from the template\n")
    expect(result.outcome).toMatchObject({ evaluation: "scored", score: 1, detail: expect.stringContaining("from the template") })
    expect(fs.readFileSync(path.join(result.dir, "harness.log"), "utf8")).toContain("exit 0")
  })

  it("kills a timed-out harness's whole process group (TERM, then KILL) and still scores it", async () => {
    const pids = path.join(sharedDir("pids"), "pids")
    const stubbornPids = `${pids}-stubborn`
    const result = await withSystem("timeout", Effect.gen(function* () {
      yield* startRunner({})
      const started = Date.now()
      const polite = yield* runExecution(request(behaviours, { timeoutMs: 1000, env: { MODE: "sleep", PIDS: pids } }))
      const politeMs = Date.now() - started
      const stubborn = yield* runExecution(request(behaviours, { timeoutMs: 800, env: { MODE: "stubborn", PIDS: stubbornPids } }))
      return { polite, politeMs, stubborn }
    }))
    expect(result.polite).toMatchObject({ ended: "timed-out", evaluation: "scored", score: 0.5 })
    expect(result.politeMs).toBeLessThan(10_000)
    const spawned = fs.readFileSync(pids, "utf8").trim().split("\n").map(Number)
    expect(spawned).toHaveLength(2)
    for (const pid of spawned) expect(await stillRunning(pid)).toBe(false)
    expect(result.stubborn).toMatchObject({ ended: "timed-out", evaluation: "scored", score: 0.25 })
    expect(result.stubborn.detail).toContain("SIGKILL")
    expect(await stillRunning(Number(fs.readFileSync(stubbornPids, "utf8").trim()))).toBe(false)
  })

  it("retries a failing scorer within the budget, then drops the execution and counts it; keeps valid per-call rewards", async () => {
    const counter = path.join(sharedDir("counter"), "n")
    const result = await withSystem("scorer", Effect.gen(function* () {
      const system = yield* ActorSystem
      yield* startRunner({ evaluationRetries: 2 })
      const crash = yield* runExecution(request(behaviours, { env: { SCORER: "crash" } }))
      const flaky = yield* runExecution(request(behaviours, { env: { SCORER: "flaky", FAILS: "2", COUNTER: counter } }))
      const garbage = yield* runExecution(request(behaviours, { env: { SCORER: "garbage" } }))
      const range = yield* runExecution(request(behaviours, { env: { SCORER: "range" } }))
      const rewards = yield* runExecution(request(behaviours, { env: { SCORER: "rewards" } }))
      const badRewards = yield* runExecution(request(behaviours, { env: { SCORER: "badrewards" } }))
      const status = yield* system.ask(runnerRef, "Status", undefined)
      return { crash, flaky, garbage, range, rewards, badRewards, status }
    }))
    expect(result.crash).toMatchObject({ ended: "finished", evaluation: "failed", score: null, attempts: 3 })
    expect(result.crash.detail).toContain("scorer broke")
    expect(result.flaky).toMatchObject({ evaluation: "scored", score: 0.5, attempts: 3 })
    expect(result.garbage).toMatchObject({ evaluation: "failed", attempts: 3, detail: expect.stringContaining("no JSON") })
    expect(result.range).toMatchObject({ evaluation: "failed", attempts: 3, detail: expect.stringContaining("invalid scorer output") })
    expect(result.rewards).toMatchObject({ evaluation: "scored", score: 0.5, rewards: { "chatcmpl-a": 1, "chatcmpl-b": 0 } })
    expect(result.flaky.rewards).toBeUndefined()
    expect(result.badRewards).toMatchObject({ evaluation: "failed", attempts: 3, detail: expect.stringContaining("invalid scorer output") })
    expect(result.status).toEqual({ running: 0, capacity: 2, finished: 2, dropped: 4 })
  })

  it("treats a scorer past its time limit as an evaluation failure", async () => {
    const result = await withSystem("slowscorer", Effect.gen(function* () {
      yield* startRunner({ evaluationRetries: 1 })
      return yield* runExecution(request(behaviours, { env: { SCORER: "slow" } }))
    }))
    expect(result).toMatchObject({ evaluation: "failed", attempts: 2, detail: expect.stringContaining("timed out") })
  })

  it("survives crashing and flooding harnesses: scored anyway, output capped", async () => {
    const result = await withSystem("flood", Effect.gen(function* () {
      const system = yield* ActorSystem
      const { workspaceRoot } = yield* startRunner({ outputCapBytes: 4096 })
      const crash = yield* runExecution(request(behaviours, { env: { MODE: "crash" } }))
      const floodReq = request(behaviours, { keepWorkspace: "always", env: { MODE: "flood" } })
      const flood = yield* runExecution(floodReq)
      const status = yield* system.ask(runnerRef, "Status", undefined)
      return { crash, flood, status, log: fs.readFileSync(path.join(workspaceRoot, floodReq.execution, "harness.log"), "utf8") }
    }))
    expect(result.crash).toMatchObject({ ended: "finished", evaluation: "scored", score: 0.5 })
    expect(result.crash.detail).toMatch(/exit 3.*harness blew up/)
    expect(result.flood).toMatchObject({ ended: "finished", evaluation: "scored", score: 1 })
    // Checked as booleans: a failure should not print megabytes.
    expect(result.log.length).toBeLessThan(2 * 4096 + 1000)
    expect(result.log.includes(`${2 * 64 * 1024 * 1024} bytes of output`)).toBe(true)
    expect(result.log.match(/\[\.\.\. \d+ bytes dropped \.\.\.\]/g)).toHaveLength(2)
    expect(result.status).toMatchObject({ running: 0, finished: 2, dropped: 0 })
  })

  it("removes workspaces, keeps them on failure when asked, and scores a missing artifact 0", async () => {
    const result = await withSystem("keep", Effect.gen(function* () {
      const { workspaceRoot } = yield* startRunner({})
      const run = (env: Record<string, string>, keepWorkspace: "never" | "on-failure" | "always") =>
        Effect.gen(function* () {
          const req = request(behaviours, { keepWorkspace, env })
          const outcome = yield* runExecution(req)
          return { outcome, kept: fs.existsSync(path.join(workspaceRoot, req.execution, "workspace")) }
        })
      return {
        okNever: yield* run({}, "never"),
        okOnFailure: yield* run({}, "on-failure"),
        crashOnFailure: yield* run({ MODE: "crash" }, "on-failure"),
        crashNever: yield* run({ MODE: "crash" }, "never"),
        scorerOnFailure: yield* run({ SCORER: "crash" }, "on-failure"),
        nothing: yield* run({ MODE: "nothing" }, "never"),
        rootLeft: fs.readdirSync(workspaceRoot).length
      }
    }))
    expect(result.okNever.kept).toBe(false)
    expect(result.okOnFailure.kept).toBe(false)
    expect(result.crashOnFailure.kept).toBe(true)
    expect(result.crashNever.kept).toBe(false)
    expect(result.scorerOnFailure.kept).toBe(true)
    expect(result.nothing).toMatchObject({ kept: false, outcome: { evaluation: "no-artifact", score: 0, detail: expect.stringContaining("no artifact.txt") } })
    expect(result.rootLeft).toBe(2)
  })

  it("applies the runner's own keep policy on top of the request's", async () => {
    const result = await withSystem("keepcfg", Effect.gen(function* () {
      const { workspaceRoot } = yield* startRunner({ keepWorkspace: "on-failure" })
      const req = request(behaviours, { env: { MODE: "crash" } })
      yield* runExecution(req)
      return fs.existsSync(path.join(workspaceRoot, req.execution))
    }))
    expect(result).toBe(true)
  })

  it("runs at most `capacity` executions at once and answers Status while full", async () => {
    const dir = sharedDir("cap")
    const result = await withSystem("capacity", Effect.gen(function* () {
      const system = yield* ActorSystem
      yield* startRunner({ capacity: 2 })
      const reqs = Array.from({ length: 5 }, (_, i) => request(behaviours, { env: { MODE: "sleep", PIDS: path.join(dir, `p${i}`) }, timeoutMs: 700 }))
      const fiber = yield* Effect.forkChild(Effect.forEach(reqs, runExecution, { concurrency: "unbounded" }))
      yield* Effect.sleep("300 millis")
      const during = yield* system.ask(runnerRef, "Status", undefined, { timeoutMs: 2000 })
      const outcomes = yield* Fiber.join(fiber)
      const after = yield* system.ask(runnerRef, "Status", undefined)
      return { during, outcomes, after }
    }))
    expect(result.during).toEqual({ running: 2, capacity: 2, finished: 0, dropped: 0 })
    expect(result.outcomes.map((o) => o.ended)).toEqual(Array(5).fill("timed-out"))
    expect(result.after).toEqual({ running: 0, capacity: 2, finished: 5, dropped: 0 })
    // Start times of the harnesses (each runs 700 ms): two, two more after the first two, then the last.
    const starts = Array.from({ length: 5 }, (_, i) => fs.statSync(path.join(dir, `p${i}`)).mtimeMs).sort((a, b) => a - b)
    expect(starts[1]! - starts[0]!).toBeLessThan(600)
    expect(starts[2]! - starts[0]!).toBeGreaterThan(600)
    expect(starts[4]! - starts[0]!).toBeGreaterThan(1200)
  })

  it("runs a repeated execution id once and answers both requests with its outcome", async () => {
    const result = await withSystem("dup", Effect.gen(function* () {
      const { log } = yield* startRunner({})
      const req = request(behaviours, { env: { MODE: "sleep", PIDS: path.join(sharedDir("dup"), "p") }, timeoutMs: 500 })
      const [a, b] = yield* Effect.all([runExecution(req), runExecution(req)], { concurrency: "unbounded" })
      const again = yield* runExecution(req)
      return { a, b, again, opened: log.opened.length }
    }))
    expect(result.b).toEqual(result.a)
    expect(result.again).toEqual(result.a)
    expect(result.opened).toBe(1)
  })

  it("answers UnknownTask for unknown suites, tasks and broken suite files, and drops executions it cannot open at the gateway", async () => {
    const broken = tempDir("suites")
    fs.mkdirSync(path.join(broken, "bad"))
    fs.writeFileSync(path.join(broken, "bad", "suite.json"), JSON.stringify({ description: "x", harness: { command: ["true"], timeoutMs: 1 }, scorer: { command: ["true"], timeoutMs: 1 }, tasks: [{ id: "a", split: "test" }] }))
    const result = await withSystem("unknown", Effect.gen(function* () {
      const system = yield* ActorSystem
      yield* startRunner({ suitesDir: broken, gateway: false, gatewayTimeoutMs: 300 })
      const ask = (suite: string, task: string) => Effect.exit(system.ask(runnerRef, "RunExecution", request({ suite, task }), { timeoutMs: 20_000 }))
      return { noSuite: yield* ask("nope", "a"), badFile: yield* ask("bad", "a") }
    }))
    const reasonOf = (exit: Exit.Exit<unknown, unknown>) => (Exit.isFailure(exit) ? (exit.cause.reasons[0] as any)?.error : undefined)
    expect(reasonOf(result.noSuite)).toMatchObject({ _tag: "UnknownTask", suite: "nope", reason: expect.stringContaining("cannot read") })
    expect(reasonOf(result.badFile)).toMatchObject({ _tag: "UnknownTask", reason: expect.stringContaining("tasks[0].split") })

    const noGateway = await withSystem("nogateway", Effect.gen(function* () {
      const system = yield* ActorSystem
      const { workspaceRoot } = yield* startRunner({ gateway: false, gatewayTimeoutMs: 300 })
      const unknown = yield* Effect.exit(system.ask(runnerRef, "RunExecution", request({ suite: "behaviours", task: "zzz" })))
      const req = request(behaviours, { env: { MODE: "env" } })
      const outcome = yield* runExecution(req)
      const status = yield* system.ask(runnerRef, "Status", undefined)
      return { unknown, outcome, status, left: fs.existsSync(path.join(workspaceRoot, req.execution)) }
    }))
    expect(reasonOf(noGateway.unknown)).toMatchObject({ _tag: "UnknownTask", reason: expect.stringContaining("no task 'zzz'") })
    expect(noGateway.outcome).toMatchObject({ evaluation: "failed", score: null, attempts: 0, detail: expect.stringContaining("gateway gateway/g1: ActorUnavailable") })
    expect(noGateway.status).toMatchObject({ finished: 0, dropped: 1 })
    expect(noGateway.left).toBe(false)
  })
})
