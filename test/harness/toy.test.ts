/**
 * The toy suite's harness and scorer as programs (child processes): the oracle scores 1.0
 * and writes demonstrations; over HTTP (a small server answering like the oracle, or with
 * planted mistakes) the calls show the configured retries, subagent forks and compactions
 * with their roles, and the score is the fraction of decisions right.
 */
import { execFile } from "node:child_process"
import * as fs from "node:fs"
import * as path from "node:path"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { readDemonstrations } from "../../src/training/warm-start.ts"
import { compactRequest, configFrom, creditOf, executionSeed, expectedReplies, generator, latencySampler, oracleReply, scriptOf, systemPrompt, wellFormed, type ToyMessage } from "../../suites/toy/world.mjs"
import { startChatServer, suitesDir, tempDir, type ChatRequest } from "./helpers.ts"

const toyDir = path.join(suitesDir, "toy")

const run = (script: string, env: Record<string, string>) =>
  new Promise<{ code: number; stdout: string; stderr: string }>((resolve) => {
    execFile(process.execPath, [path.join(toyDir, script)], { env: { PATH: process.env.PATH!, ...env } }, (error, stdout, stderr) =>
      resolve({ code: error === null ? 0 : typeof error.code === "number" ? error.code : 1, stdout, stderr })
    )
  })

/** Runs the harness then the scorer on a fresh workspace; returns the scorer's report and the harness's stats. */
const execute = async (task: string, env: Record<string, string>) => {
  const workspace = tempDir("toy")
  const all = { GYRE_TASK_ID: task, GYRE_WORKSPACE: workspace, TOY_TOOL_MS: "0", ...env }
  const harness = await run("harness.mjs", all)
  expect(harness.stderr).toBe("")
  expect(harness.code).toBe(0)
  const scorer = await run("score.mjs", all)
  expect(scorer.code).toBe(0)
  return { report: JSON.parse(scorer.stdout), stats: JSON.parse(harness.stdout), workspace }
}

const isPrefix = (prefix: ReadonlyArray<ToyMessage>, of: ReadonlyArray<ToyMessage>) =>
  prefix.length <= of.length && prefix.every((m, i) => JSON.stringify(m) === JSON.stringify(of[i]))

describe("toy suite", () => {
  it("oracle policy: scores 1.0 and writes one demonstration per call, each the oracle's reply to its messages", async () => {
    const demos = path.join(tempDir("demos"), "demos.jsonl")
    const { report, stats } = await execute("train-1", { TOY_POLICY: "oracle", TOY_DEMOS: demos, TOY_STEPS: "120", TOY_RANDOM_SEED: "3" })
    expect(report.score).toBe(1)
    expect(report.details).toMatchObject({ decisions: 120 + 7 * 4, made: 148, right: 148 + report.details.notes })
    expect(report.details.notes).toBeGreaterThanOrEqual(2)
    const lines = fs.readFileSync(demos, "utf8").trim().split("\n").map((l) => JSON.parse(l))
    expect(lines).toHaveLength(stats.calls)
    // The warm start reads them with the chat-message schema the gateway decodes requests with.
    const read = await Effect.runPromise(readDemonstrations([demos]))
    expect(read.map((d) => d.messages)).toEqual(lines.map((d) => d.messages))
    expect(stats.calls).toBe(148 + report.details.notes + stats.retries)
    expect(report.details.credit).toBe(148 + report.details.notes)
    for (const d of lines) {
      expect(d.task).toBe("train-1")
      expect(d.messages[0]).toEqual({ role: "system", content: systemPrompt })
      expect(d.reply).toBe(oracleReply(d.messages))
      expect(wellFormed(d.reply)).toBe(true)
      expect(d.reply.length).toBeLessThanOrEqual(24)
    }
    expect(new Set(lines.map((d) => d.role))).toEqual(new Set(["main", "main-summary", "subagent", "subagent-summary"]))
    // Every prompt stays within the compaction threshold plus a subagent's few steps.
    const longest = Math.max(...lines.map((d) => d.messages.reduce((n: number, m: ToyMessage) => n + m.content.length, 0)))
    expect(longest).toBeLessThan(1024 + 200)
  })

  it("over HTTP: retries from the same prompt, subagents forking the parent's context, compaction to a new prefix, with roles", async () => {
    const server = await startChatServer(oracleReply)
    try {
      const env = {
        OPENAI_BASE_URL: server.url,
        OPENAI_API_KEY: "test-key-0123456789",
        TOY_STEPS: "40",
        TOY_FORK_EVERY: "10",
        TOY_SUB_STEPS: "3",
        TOY_COMPACT_BYTES: "300",
        TOY_FAIL_RATE: "0.2",
        TOY_RANDOM_SEED: "7"
      }
      const { report, stats } = await execute("heldout-2", env)
      expect(report.score).toBe(1)
      const calls: Array<ChatRequest> = server.requests
      expect(calls).toHaveLength(stats.calls)
      expect(new Set(calls.map((c) => c.key))).toEqual(new Set(["test-key-0123456789"]))
      const byRole = (role: string) => calls.filter((c) => c.role === role)

      // Retries: a call whose messages and role repeat the previous call's.
      const repeats = calls.filter((c, i) => i > 0 && c.role === calls[i - 1]!.role && JSON.stringify(c.messages) === JSON.stringify(calls[i - 1]!.messages))
      expect(repeats.length).toBe(stats.retries)
      expect(stats.retries).toBeGreaterThan(3)

      // Subagents: 3 forks of 3 decisions (the last one is the summary).
      expect(stats.subagents).toBe(3)
      const firsts = calls.filter((c, i) => c.role === "subagent" && calls[i - 1]!.role === "main")
      expect(firsts).toHaveLength(3)
      for (const first of firsts) {
        const spawn = first.messages[first.messages.length - 2]!
        expect(spawn).toMatchObject({ role: "assistant", content: expect.stringMatching(/^spawn [a-z]+$/) })
        // The parent's call that produced the spawn is a prefix of the subagent's context.
        const parent = calls.find((c) => c.role === "main" && oracleReply(c.messages) === spawn.content && isPrefix(c.messages, first.messages))
        expect(parent).toBeDefined()
      }
      expect(new Set(byRole("subagent-summary").map((c) => oracleReply(c.messages).split(" ")[0]))).toEqual(new Set(["report"]))

      // Compaction: a main-summary call ending with the request, then a main call on [system, note].
      const summaries = byRole("main-summary")
      expect(summaries.length).toBeGreaterThanOrEqual(stats.compactions)
      expect(stats.compactions).toBeGreaterThanOrEqual(2)
      for (const s of summaries) {
        expect(s.messages[s.messages.length - 1]).toEqual({ role: "user", content: compactRequest })
        expect(s.messages.reduce((n, m) => n + m.content.length, 0) - compactRequest.length).toBeGreaterThan(300)
      }
      const afterCompaction = calls.filter((c, i) => i > 0 && c.role === "main" && calls[i - 1]!.role === "main-summary")
      expect(afterCompaction).toHaveLength(stats.compactions)
      for (const c of afterCompaction) {
        expect(c.messages).toHaveLength(2)
        expect(c.messages[0]).toEqual({ role: "system", content: systemPrompt })
        expect(c.messages[1]!.role).toBe("user")
      }
      // Tool results carry a tool_call_id (the OpenAI format requires one).
      expect(calls.at(-1)!.messages.filter((m) => m.role === "tool").every((m) => typeof m.tool_call_id === "string")).toBe(true)
    } finally {
      await server.close()
    }
  })

  it("partial credit: the fraction of words in place; malformed replies are retried", async () => {
    // The wrong verb on every item (get instead of take: half right); malformed on the first try of every 5th call.
    const server = await startChatServer((messages, i) => {
      if (i % 5 === 0) return "I think get"
      return oracleReply(messages).replace(/^take/, "get")
    })
    try {
      const env = { OPENAI_BASE_URL: server.url, OPENAI_API_KEY: "k", TOY_STEPS: "50", TOY_FAIL_RATE: "0", TOY_MAX_RETRIES: "1" }
      const { report, stats } = await execute("train-9", env)
      const expected = expectedReplies(scriptOf("train-9", configFrom(env)))
      const takes = [...expected.values()].filter((r) => r.startsWith("take")).length
      expect(takes).toBeGreaterThan(3)
      expect(report.details.right).toBe(expected.size - takes + report.details.notes)
      expect(report.details.credit).toBe(expected.size - takes / 2 + report.details.notes)
      expect(report.score).toBeCloseTo(report.details.credit / (expected.size + report.details.notes), 12)
      expect(stats.retries).toBeGreaterThan(5)
      // Per-call rewards, keyed by the completion id: each malformed try earns 0, each kept reply its credit.
      expect(Object.keys(report.rewards).sort()).toEqual(server.requests.map((_, i) => `call-${i}`).sort())
      const kept = server.requests.map((_, i) => i).filter((i) => i % 5 !== 0)
      for (let i = 0; i < server.requests.length; i += 5) expect(report.rewards[`call-${i}`]).toBe(0)
      expect(kept.reduce((a, i) => a + report.rewards[`call-${i}`], 0)).toBeCloseTo(report.details.credit, 12)
    } finally {
      await server.close()
    }
  })

  it("credits the fraction of words in place", () => {
    expect(creditOf("get oak", "get oak")).toBe(1)
    expect(creditOf("get elm", "get oak")).toBe(0.5)
    expect(creditOf("take oak", "get oak")).toBe(0.5)
    expect(creditOf("take gem", "get oak")).toBe(0)
    expect(creditOf("get oak now", "get oak")).toBeCloseTo(2 / 3, 12)
    expect(creditOf("note take gem", "note take gem")).toBe(1)
    expect(creditOf("take gem", "note take gem")).toBe(0)
    expect(creditOf("", "report jade")).toBe(0)
  })

  it("train and held-out tasks are different walks; the same task is the same walk", () => {
    const cfg = configFrom({})
    const text = (id: string) => scriptOf(id, cfg).map((s) => s.text).join("|")
    expect(text("train-0")).toBe(text("train-0"))
    expect(text("train-0")).not.toBe(text("heldout-0"))
    expect(text("train-0")).not.toBe(text("train-1"))
    expect(() => configFrom({ TOY_STEPS: "1" })).toThrow(/TOY_STEPS=1/)
    expect(() => configFrom({ TOY_POLICY: "human" })).toThrow(/TOY_POLICY/)
  })

  it("seeds an execution's draws from the run's seed and its id; TOY_RANDOM_SEED wins; neither: random", () => {
    const seedOf = (env: Record<string, string>) => configFrom(env).randomSeed
    const a = seedOf({ GYRE_SEED: "1", GYRE_EXECUTION_ID: "b0-x3" })
    expect(a).toBe(executionSeed("1", "b0-x3"))
    expect(seedOf({ GYRE_SEED: "1", GYRE_EXECUTION_ID: "b0-x3" })).toBe(a)
    const others = [seedOf({ GYRE_SEED: "1", GYRE_EXECUTION_ID: "b0-x4" }), seedOf({ GYRE_SEED: "2", GYRE_EXECUTION_ID: "b0-x3" })]
    expect(new Set([a, ...others]).size).toBe(3)
    expect(seedOf({ GYRE_SEED: "1", GYRE_EXECUTION_ID: "b0-x3", TOY_RANDOM_SEED: "9" })).toBe(9)
    expect(seedOf({ GYRE_EXECUTION_ID: "b0-x3" })).toBeUndefined()
    // The same execution of the same run is as slow again.
    const slowness = (seed: number) => latencySampler(generator(seed), configFrom({})).slowness
    expect(slowness(a!)).toBe(slowness(seedOf({ GYRE_SEED: "1", GYRE_EXECUTION_ID: "b0-x3" })!))
  })

  it("tool latency is heavy-tailed: a few executions are many times slower than the median", () => {
    const cfg = configFrom({ TOY_TOOL_MS: "10" })
    const perExecution = Array.from({ length: 2000 }, (_, seed) => {
      const sampler = latencySampler(generator(seed), cfg)
      let total = 0
      for (let k = 0; k < 64; k++) total += sampler.next()
      return total
    }).sort((a, b) => a - b)
    const median = perExecution[1000]!
    expect(median).toBeGreaterThan(64 * 10)
    expect(median).toBeLessThan(64 * 10 * 4)
    expect(perExecution[1979]! / median).toBeGreaterThan(5) // the slowest 1% take over 5x the median
  })
})
