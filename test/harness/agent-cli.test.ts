/**
 * An unmodified coding-agent CLI as a harness inside `gyre train`: the agent-cli suite runs
 * Claude Code (the pinned @anthropic-ai/claude-code devDependency; AGENT_CLI_CLAUDE=/path/to/claude
 * runs another copy) against the run's gateway over the Messages API, on a random tiny
 * checkpoint. Its calls are recorded on the trajectory stream (exported with `gyre replay
 * --export`): every call after the first continues the conversation (the CLI's own recovery
 * after max_tokens, then `--resume` with the check's feedback), so each prompt begins with the
 * previous call's prompt and output tokens (no spurious branch), and the step trains them.
 * Before that, the tool path on a scripted model (`../gateway/scripted-model.ts`) whose every
 * turn is reasoning and a Hermes call of Claude Code's Write tool: the CLI writes the file, and
 * its next call sends the call and the tool's result back on the recorded tokens.
 */
import { execFile, execFileSync, spawn } from "node:child_process"
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { anthropicBaseUrl } from "../../src/harness/environment.ts"
import { chatFormatOf } from "../../src/openai/hf-chat.ts"
import { judge, similarity, taskOf } from "../../suites/agent-cli/task.mjs"
import { expectOnePath } from "../gateway/apis.ts"
import { hermesScript, writeScriptedModel } from "../gateway/scripted-model.ts"
import { KEY, readRecords, serve } from "../rollout/fixtures.ts"
import { withSystem } from "../runtime/harness.ts"
import { suitesDir } from "./helpers.ts"

const gyre = new URL("../../bin/gyre.js", import.meta.url).pathname
const jsonLines = (out: string) => out.trim().split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l) as Record<string, any>)
const run = (...args: Array<string>) =>
  new Promise<string>((resolve, reject) =>
    execFile("node", [gyre, ...args], { encoding: "utf8", timeout: 240_000, maxBuffer: 64 << 20 }, (e, stdout, stderr) => (e ? reject(new Error(`${e.message}\n${stderr.slice(-3000)}`)) : resolve(stdout)))
  )

interface Call {
  readonly execution: string
  readonly task: string
  readonly role: string
  readonly prompt: ReadonlyArray<number>
  readonly output: ReadonlyArray<number>
  readonly finishReason: string
  readonly startedAt: number
}

/** Runs the suite's harness as the runner would, with `env` added, to its exit. */
const runHarness = (env: Record<string, string>) =>
  new Promise<void>((resolve, reject) => {
    const child = spawn(process.execPath, [join(suitesDir, "agent-cli", "harness.mjs")], { cwd: env.GYRE_WORKSPACE, env: { ...process.env, ...env }, stdio: "ignore" })
    child.on("error", reject)
    child.on("exit", () => resolve())
  })

/** The byte tokenizer's text of some tokens (specials left out). */
const text = (tokens: ReadonlyArray<number>) => Buffer.from(tokens.filter((t) => t < 256)).toString("utf8")

describe("agent-cli suite: Claude Code inside gyre train", () => {
  it("scores the exact file 1, another file by its likeness, and no file by the last reply's", () => {
    const { file, line, prompt } = taskOf("train-7")
    expect(prompt).toContain(`${file} `)
    expect(prompt.endsWith(line)).toBe(true)
    expect(taskOf("heldout-7")).not.toEqual(taskOf("train-7"))
    const ws = mkdtempSync(join(tmpdir(), "gyre-agent-cli-ws-"))
    expect(judge("train-7", ws, line)).toEqual({ score: 0.25, file: "missing" })
    expect(judge("train-7", ws, "").score).toBe(0)
    writeFileSync(join(ws, file), "zzz")
    expect(judge("train-7", ws, line)).toEqual({ score: 0.25 + 0.5 * similarity("zzz", line), file: "differs" })
    writeFileSync(join(ws, file), `${line}\n`)
    expect(judge("train-7", ws, "")).toEqual({ score: 1, file: "exact" })
    expect(similarity("ab", "ba")).toBe(1)
    expect(similarity("aab", "abc")).toBeCloseTo(2 / 3, 10)
  })

  it("runs the Write calls a model makes and sends each call and its result back on the recorded tokens", async () => {
    const ws = mkdtempSync(join(tmpdir(), "gyre-agent-cli-tools-"))
    const { file, line } = taskOf("train-0")
    const call = `\n${JSON.stringify({ name: "Write", arguments: { file_path: join(ws, file), content: line } })}\n`
    const model = writeScriptedModel(mkdtempSync(join(tmpdir(), "gyre-agent-cli-model-")), { ...hermesScript, turn: ["\n", "<think>", "I will write it.", "</think>", "<tool_call>", call, "</tool_call>", "<|im_end|>"] })
    const chat = await chatFormatOf(model)
    const out = await withSystem("agent-cli-tools", Effect.gen(function* () {
      const served = yield* serve({ checkpoint: model, workers: 1, gateway: { chat } })
      // Two model calls in one CLI run (--max-turns 2): the Write, then the turn after its result.
      yield* Effect.promise(() => runHarness({ GYRE_TASK_ID: "train-0", GYRE_WORKSPACE: ws, ANTHROPIC_BASE_URL: anthropicBaseUrl(served.baseUrl), ANTHROPIC_API_KEY: KEY, ANTHROPIC_AUTH_TOKEN: KEY, AGENT_CLI_MAX_TURNS: "2" }))
      const records = yield* readRecords(served.execution, 3)
      return { records, execution: served.execution }
    }))
    expect(readFileSync(join(ws, file), "utf8")).toBe(line)
    const score = JSON.parse(execFileSync(process.execPath, [join(suitesDir, "agent-cli", "score.mjs")], { cwd: ws, env: { ...process.env, GYRE_TASK_ID: "train-0", GYRE_WORKSPACE: ws }, encoding: "utf8" }).trim().split("\n").at(-1)!)
    expect(score).toMatchObject({ score: 1, details: { file: "exact", turns: 1 } })
    expect(out.records.map((r) => r.finishReason)).toEqual(["tool_calls", "tool_calls"])
    expectOnePath(out.execution, out.records)
  }, 60_000)

  it("records the CLI's calls as one continued conversation per execution and trains them", async () => {
    const dir = mkdtempSync(join(tmpdir(), "gyre-agent-cli-"))
    execFileSync("node", [gyre, "engine", "init", "--preset", "tiny", "--seed", "5", "--out", join(dir, "init")], { stdio: "ignore" })
    // 24 output tokens a call: the random model hits max_tokens, and Claude Code continues on its own.
    const env = ["AGENT_CLI_MAX_TOKENS=24", ...(process.env.AGENT_CLI_CLAUDE ? [`AGENT_CLI_CLAUDE=${process.env.AGENT_CLI_CLAUDE}`] : [])].join(",")
    const shape = ["--steps", "1", "--devices", "1", "--executions-per-step", "2", "--group-size", "2", "--slots", "2", "--ppo-epochs", "1", "--heldout", "heldout-0"]
    const store = join(dir, "store")
    const summary = jsonLines(await run("train", "--run", "ac", "--suite", "agent-cli", "--checkpoint", join(dir, "init"), ...shape, "--env", env, "--store", store, "--json", "--quiet")).at(-1)!
    expect(summary).toMatchObject({ steps: 1, executions_lost: 0, trained_twice: 0, training_errors: 0 })

    const calls = jsonLines(readFileSync(join((await run("replay", "ac", "--store", store, "--export", join(dir, "export")), dir), "export", "calls.jsonl"), "utf8")) as unknown as Array<Call>
    const executions = [...new Set(calls.map((c) => c.execution))]
    expect(executions).toHaveLength(2)
    let empty = 0
    for (const execution of executions) {
      const own = calls.filter((c) => c.execution === execution).sort((a, b) => a.startedAt - b.startedAt)
      // The CLI's calls: its Write tool and the task's prompt in the first, more than one call.
      expect(own.length, execution).toBeGreaterThan(1)
      const first = text(own[0]!.prompt)
      expect(first).toContain('"name":"Write"')
      expect(first).toContain(taskOf(own[0]!.task.replace(/^agent-cli\//, "")).prompt)
      for (const [i, call] of own.entries()) {
        expect(call.role).toBe("main")
        if (i === 0) continue
        // Each prompt begins with the previous prompt and its output as generated (less the
        // end-of-turn token that stopped it). An empty reply is the exception: Claude Code
        // drops it and asks again with a reminder added to the last user turn (a branch).
        const before = own[i - 1]!
        const output = before.finishReason === "stop" ? before.output.slice(0, -1) : before.output
        if (output.length === 0) {
          empty++
          continue
        }
        const sent = [...before.prompt, ...output]
        expect(call.prompt.slice(0, sent.length), `${execution} call ${i}`).toEqual(sent)
        expect(call.prompt.length).toBeGreaterThan(sent.length)
      }
    }

    // The step trained both executions' trees, one path each (and one more for each empty reply asked again).
    const [step] = jsonLines(await run("replay", "ac", "--store", store, "--type", "step", "--json")).map((e) => e.payload)
    expect(step).toMatchObject({ step: 0, executions: 2, dropped: 0, errors: [] })
    expect(step.tokensTrained).toBeGreaterThan(0)
    expect(step.trees.map((t: { execution: string; calls: number }) => [t.execution, t.calls]).sort()).toEqual(executions.map((e) => [e, calls.filter((c) => c.execution === e).length]).sort())
    expect(step.trees.reduce((n: number, t: { paths: number }) => n + t.paths, 0)).toBe(2 + empty)
    // The trees the trainer built are the ones the records give (exit 0, else it names the execution).
    await run("replay", "ac", "--store", store, "--trees")
  }, 300_000)
})
