/**
 * The long suite's script, harness and scorer without Gyre behind them: the script's shape
 * (calls, roles, retries that branch, forks, compactions, context sizes) does not depend on
 * the replies; full scale is 300+ calls and over 1,000,000 distinct tokens; every expected
 * reply can be read off its prompt's last line; the harness and scorer as child processes
 * score the oracle 1, planted mistakes exactly, and go on past a refused call.
 */
import { execFile } from "node:child_process"
import * as fs from "node:fs"
import * as http from "node:http"
import * as path from "node:path"
import { describe, expect, it } from "vitest"
import { configFrom, creditOf, generator, MESSAGE_OVERHEAD, oracleReply, runScript, type LongCall, type LongConfig, type LongMessage } from "../../suites/long/world.mjs"
import { suitesDir, tempDir } from "./helpers.ts"

const longDir = path.join(suitesDir, "long")

interface Seen extends LongCall {
  readonly messages: ReadonlyArray<LongMessage>
  readonly reply: string
}

/** A dry run of a task's script with `reply` answering each call; every call with its messages. */
const dryRun = async (task: string, cfg: LongConfig, reply: (c: LongCall) => string) => {
  const calls: Array<Seen> = []
  const stats = await runScript(task, cfg, async (messages, c) => {
    const r = reply(c)
    calls.push({ ...c, messages, reply: r })
    return r
  })
  return { calls, stats }
}

/** Replies a random model could write: any length, bytes that are not ASCII, chat markers, newlines. */
const garbage = (seed: number) => {
  const rand = generator(seed)
  const alphabet = ["a", "Z", " ", "\n", "<|end|>", "\u00e9", "\ufffd", "\u{1F600}", "fix", "{", "\\", '"']
  return () => Array.from({ length: Math.floor(rand() * 1500) }, () => alphabet[Math.floor(rand() * alphabet.length)]).join("")
}

const shapeOf = (calls: ReadonlyArray<Seen>) =>
  calls.map((c) => ({ id: c.id, role: c.role, fresh: c.fresh, expected: c.expected, messages: c.messages.map((m) => (m.role === "assistant" ? m.role : `${m.role}:${m.content.split("\n").pop()}`)) }))

/** Is `a` (an earlier call's messages, then its reply) a prefix of `b`'s messages? */
const extendsCall = (a: Seen, b: Seen) =>
  b.messages.length > a.messages.length && a.messages.every((m, i) => b.messages[i] === m) && b.messages[a.messages.length]!.role === "assistant" && b.messages[a.messages.length]!.content === a.reply

describe("long suite: the script", () => {
  it("has the same shape whatever the model writes, and every context stays under the window", async () => {
    const cfg = configFrom({ LONG_SCALE: "1/16" })
    const oracle = await dryRun("train-0", cfg, (c) => c.expected)
    const noise = await dryRun("train-0", cfg, garbage(7))
    expect(noise.stats).toEqual(oracle.stats)
    expect(shapeOf(noise.calls)).toEqual(shapeOf(oracle.calls))
    expect(oracle.stats).toMatchObject({ main: 19, retries: 3, subagents: 2, subagentCalls: 4 })
    expect(oracle.stats.compactions).toBeGreaterThanOrEqual(1)
    for (const c of noise.calls) {
      // Tokens as the gateway counts them: bytes of the text (assistant turns: the raw output, at most outputTokens) + markers.
      const tokens = c.messages.reduce((n, m) => n + MESSAGE_OVERHEAD + (m.role === "assistant" ? cfg.outputTokens + 1 : Buffer.byteLength(m.content)), 8)
      expect(tokens).toBeLessThanOrEqual(cfg.window)
      if (c.role !== "main-summary") expect(tokens).toBeLessThan(cfg.compactAt * cfg.window)
    }
  })

  it("branches, forks and compacts as scripted; the expected reply is on the prompt's last line", async () => {
    const cfg = configFrom({ LONG_SCALE: "1/8" })
    const { calls, stats } = await dryRun("heldout-4", cfg, (c) => `reply to ${c.id}`)
    expect(stats.calls).toBe(calls.length)
    for (const c of calls) expect(oracleReply(c.messages)).toBe(c.expected)
    const byId = new Map(calls.map((c) => [c.id, c]))
    const main = calls.filter((c) => c.role === "main")

    // Retries: a main call whose messages are those of the call `back` decisions earlier, plus a revert notice.
    const retries = main.filter((c) => c.messages.at(-1)!.content.startsWith("The last 2 changes broke the build"))
    expect(retries).toHaveLength(stats.retries)
    for (const r of retries) {
      const j = Number(r.id.slice(1))
      const earlier = byId.get(`m${j - cfg.back}`)!
      expect(r.messages.slice(0, -1)).toEqual(earlier.messages)
      expect(r.messages.at(-1)!.role).toBe("user")
    }

    // Forks: a subagent's first call extends its parent's call; the parent's next call extends it too, quoting the report.
    const firsts = calls.filter((c) => /^s\d+\.0$/.test(c.id))
    expect(firsts).toHaveLength(stats.subagents)
    for (const first of firsts) {
      const parent = main.filter((m) => extendsCall(m, first)).at(-1)!
      expect(parent).toBeDefined()
      const k = first.id.slice(1, first.id.indexOf("."))
      const report = byId.get(`s${k}.${cfg.subCalls - 1}`)!
      expect(report.role).toBe("subagent-summary")
      const next = main.find((m) => extendsCall(parent, m))!
      expect(next.messages.at(-1)!.content).toContain(`Subagent report:\n${report.reply}\n`)
    }

    // Compactions: a main-summary call, then a fresh main call on [system, summary + the latest output].
    const summaries = calls.filter((c) => c.role === "main-summary")
    expect(summaries).toHaveLength(stats.compactions)
    expect(stats.compactions).toBeGreaterThanOrEqual(2)
    for (const s of summaries) {
      const after = calls[calls.indexOf(s) + 1]!
      expect(after).toMatchObject({ role: "main", fresh: true })
      expect(after.messages).toHaveLength(2)
      expect(after.messages[0]).toBe(s.messages[0])
      expect(after.messages[1]!.content).toContain(`\n${s.reply}\n`)
      expect(after.messages[1]!.content.endsWith(s.messages.at(-2)!.content)).toBe(true)
    }
    // Every other main call extends the call before it in its chain (no history is rewritten).
    const plain = main.filter((c) => !c.fresh && !retries.includes(c))
    for (const c of plain) expect(calls.slice(0, calls.indexOf(c)).some((a) => extendsCall(a, c))).toBe(true)
  })

  it("full scale: 300+ calls, over a million distinct tokens, contexts up to ~430k tokens", async () => {
    const cfg = configFrom({})
    expect(cfg).toMatchObject({ calls: 300, systemTokens: 8192, window: 524288 })
    const seen = new Set<LongMessage>()
    let unique = 0
    let longest = 0
    const stats = await runScript("train-0", cfg, async (messages, c) => {
      for (const m of messages) if (m.role !== "assistant" && !seen.has(m) && seen.add(m)) unique += m.content.length
      unique += cfg.outputTokens
      longest = Math.max(longest, messages.reduce((n, m) => n + (m.role === "assistant" ? cfg.outputTokens : m.content.length), 0))
      return c.expected
    })
    expect(stats.calls).toBeGreaterThanOrEqual(300)
    expect(unique).toBeGreaterThan(1_000_000)
    expect(longest).toBeGreaterThan(300_000)
    expect(longest).toBeLessThan(cfg.compactAt * cfg.window)
  })

  it("refuses settings it cannot run, naming the variable", () => {
    expect(() => configFrom({ LONG_SCALE: "zero" })).toThrow(/LONG_SCALE=zero/)
    expect(() => configFrom({ LONG_CALLS: "2" })).toThrow(/LONG_CALLS=2: expected a number >= 4/)
    expect(() => configFrom({ LONG_WINDOW: "20000" })).toThrow(/LONG_WINDOW=20000: too small/)
    expect(() => configFrom({ LONG_POLICY: "human" })).toThrow(/LONG_POLICY=human/)
  })

  it("credit: the expected words in place on the reply's first line, and a little for its form", () => {
    expect(creditOf("fix parser", "fix parser")).toBe(1)
    expect(creditOf("fix parser\n\u00e9<|end|>garbage", "fix parser")).toBe(1)
    expect(creditOf("fix lexer", "fix parser")).toBeCloseTo(0.9 * 0.5 + 0.1 * 0.9, 12)
    expect(creditOf("fix parser now", "fix parser")).toBeCloseTo((0.9 * 2) / 3 + 0.1, 12)
    expect(creditOf("", "fix parser")).toBe(0)
    // Random bytes: no word, but their form differs from reply to reply.
    expect(creditOf("\u00e9Q{ab#z 1x", "fix parser")).toBeCloseTo(0.1 * 0.5, 12)
    expect(creditOf("<|end|>", "fix parser")).toBeCloseTo(0.1 * 0.3, 12)
  })
})

const run = (script: string, env: Record<string, string>) =>
  new Promise<{ code: number; stdout: string; stderr: string }>((resolve) => {
    execFile(process.execPath, [path.join(longDir, script)], { env: { PATH: process.env.PATH!, ...env } }, (error, stdout, stderr) =>
      resolve({ code: error === null ? 0 : typeof error.code === "number" ? error.code : 1, stdout, stderr })
    )
  })

/** An OpenAI-style server: `answer(messages, index)` is the reply, or a status and error message. */
const chatServer = (answer: (messages: ReadonlyArray<LongMessage>, index: number) => string | { status: number; message: string }) =>
  new Promise<{ url: string; bodies: Array<Record<string, unknown>>; close: () => Promise<void> }>((resolve) => {
    const bodies: Array<Record<string, unknown>> = []
    const server = http.createServer((req, res) => {
      const chunks: Array<Buffer> = []
      req.on("data", (c: Buffer) => chunks.push(c))
      req.on("end", () => {
        const body = JSON.parse(Buffer.concat(chunks).toString()) as { messages: ReadonlyArray<LongMessage> }
        bodies.push({ ...body, role: req.headers["x-gyre-role"] })
        const i = bodies.length - 1
        const a = answer(body.messages, i)
        if (typeof a !== "string") return void res.writeHead(a.status, { "content-type": "application/json" }).end(JSON.stringify({ error: { message: a.message, type: "invalid_request_error" } }))
        const usage = { prompt_tokens: 100 + i, completion_tokens: 5, prompt_tokens_details: { cached_tokens: i } }
        res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ id: `chatcmpl-${i}`, choices: [{ index: 0, message: { role: "assistant", content: a }, finish_reason: "length" }], usage }))
      })
    })
    server.listen(0, "127.0.0.1", () => {
      const port = (server.address() as { port: number }).port
      resolve({ url: `http://127.0.0.1:${port}/v1`, bodies, close: () => new Promise((r) => server.close(() => r())) })
    })
  })

/** Runs the harness then the scorer on a fresh workspace. */
const execute = async (task: string, env: Record<string, string>) => {
  const workspace = tempDir("long")
  const all = { GYRE_TASK_ID: task, GYRE_WORKSPACE: workspace, LONG_SCALE: "1/16", ...env }
  const harness = await run("harness.mjs", all)
  expect(harness.stderr).toBe("")
  expect(harness.code).toBe(0)
  const scorer = await run("score.mjs", all)
  expect(scorer.code).toBe(0)
  const lines: Array<unknown> = fs.readFileSync(path.join(workspace, "calls.jsonl"), "utf8").trim().split("\n").map((l) => JSON.parse(l))
  return { report: JSON.parse(scorer.stdout.trim().split("\n").at(-1)!), stats: JSON.parse(harness.stdout.trim().split("\n").at(-1)!), lines: lines as Array<{ readonly role: string; readonly fresh: boolean; readonly refused?: unknown }> }
}

describe("long suite: harness and scorer", () => {
  it("the oracle scores 1", async () => {
    const { report, stats } = await execute("train-2", { LONG_POLICY: "oracle" })
    expect(report.score).toBe(1)
    expect(report.details).toMatchObject({ decisions: stats.calls, made: stats.calls, right: stats.calls, refused: 0 })
  })

  it("over HTTP: the script's requests, exact partial credit, per-call rewards, a refused call skipped", async () => {
    // The module right on every call, the verb wrong on every third; call 2 refused.
    const server = await chatServer((messages, i) => {
      if (i === 2) return { status: 400, message: "context_length_exceeded: planted" }
      const right = oracleReply(messages)
      return i % 3 === 0 ? right.replace(/^\w+/, "inspect") : right
    })
    try {
      const { report, stats, lines } = await execute("heldout-1", { OPENAI_BASE_URL: server.url, OPENAI_API_KEY: "k" })
      const cfg = configFrom({ LONG_SCALE: "1/16" })
      expect(server.bodies).toHaveLength(stats.calls)
      expect(stats.refusals).toBe(1)
      for (const b of server.bodies) expect(b).toMatchObject({ model: "gyre", max_tokens: cfg.outputTokens, ignore_eos: true, temperature: 1 })
      expect(server.bodies.map((b) => b.role)).toEqual(lines.map((l) => l.role))
      const answered = server.bodies.length - 1
      const thirds = Array.from({ length: server.bodies.length }, (_, i) => i).filter((i) => i % 3 === 0).length
      expect(report.details).toMatchObject({ decisions: stats.calls, made: answered, right: answered - thirds, refused: 1, first_refusal: "m2: 400 context_length_exceeded: planted" })
      // A wrong verb: half the words, and the form of a command (every wrong reply is at least as long as the right one).
      const wrong = 0.9 * 0.5 + 0.1
      expect(report.score).toBeCloseTo((answered - thirds + thirds * wrong) / stats.calls, 12)
      expect(Object.keys(report.rewards)).toHaveLength(answered)
      expect(report.rewards["chatcmpl-0"]).toBeCloseTo(wrong, 12)
      expect(report.rewards["chatcmpl-1"]).toBe(1)
      // Usage as the calls reported it (call i: i of 100 + i prompt tokens cached); fresh calls are left out of cached_fraction.
      const answeredLines = lines.map((l, i) => ({ ...l, i })).filter((l) => l.refused === undefined)
      expect(report.details.prompt_tokens).toBe(answeredLines.reduce((n, l) => n + 100 + l.i, 0))
      const continued = answeredLines.filter((l) => !l.fresh)
      expect(continued.length).toBe(answeredLines.length - 1 - stats.compactions)
      expect(report.details.cached_fraction).toBeCloseTo(continued.reduce((n, l) => n + l.i, 0) / continued.reduce((n, l) => n + 100 + l.i, 0), 4)
      // The refused call's reply is empty in the next prompt, and the script goes on.
      expect(server.bodies[3]!.messages).toContainEqual({ role: "assistant", content: "" })
    } finally {
      await server.close()
    }
  })
})
