#!/usr/bin/env node
/**
 * The agent-cli suite's harness: Claude Code, unmodified, in print mode (`claude -p`) in the
 * workspace, pointed at the gateway by the runner's ANTHROPIC_* variables. It is asked for the
 * task's file with only its Write tool and a short system prompt (a small prompt for a small
 * model); when the file is not right it is told so and the same session resumed
 * (`--resume`), up to AGENT_CLI_TURNS times. Each run's model replies (read from its
 * stream-json events) and final result go to agent-cli.jsonl, a line a run (the scorer reads
 * the last run's replies there). Claude Code keeps its session under
 * a private HOME, removed at the end.
 *
 * Knobs: AGENT_CLI_CLAUDE (the `claude` executable; default: the repository's pinned
 * @anthropic-ai/claude-code), AGENT_CLI_TURNS (2), AGENT_CLI_MAX_TOKENS (output tokens per
 * call, 256), AGENT_CLI_MAX_TURNS (model calls per CLI run, its --max-turns, 8),
 * AGENT_CLI_MODEL (gyre), AGENT_CLI_TIMEOUT_MS (per CLI run, 300000).
 */
import { spawn } from "node:child_process"
import { randomUUID } from "node:crypto"
import * as fs from "node:fs"
import { createRequire } from "node:module"
import * as os from "node:os"
import * as path from "node:path"
import { judge, taskOf } from "./task.mjs"

const SYSTEM = "You are a coding agent. Make the change the user asks for with the Write tool, in the working directory."

/**
 * The command that starts Claude Code: AGENT_CLI_CLAUDE (an executable), else the pinned
 * package's own launcher (`cli-wrapper.cjs`, which runs the platform's native binary whether
 * or not npm ran the package's postinstall).
 */
const claudeCommand = () => {
  if (process.env.AGENT_CLI_CLAUDE) return [process.env.AGENT_CLI_CLAUDE]
  try {
    const pkg = createRequire(import.meta.url).resolve("@anthropic-ai/claude-code/package.json")
    return [process.execPath, path.join(path.dirname(pkg), "cli-wrapper.cjs")]
  } catch {
    throw new Error("agent-cli: @anthropic-ai/claude-code is not installed (npm install), and AGENT_CLI_CLAUDE names no claude executable")
  }
}

/** The JSON lines of `claude -p --output-format stream-json` (a line that is not JSON is left out). */
const jsonLines = (out) =>
  out.split("\n").flatMap((line) => {
    try {
      return line.trim() === "" ? [] : [JSON.parse(line)]
    } catch {
      return []
    }
  })

/**
 * One `claude -p` run, to its exit: the model's replies (the text of each assistant message
 * the gateway answered, by its model name; not the CLI's own error messages) and the run's
 * final `result` event.
 */
const runClaude = (args, env, model, timeoutMs) =>
  new Promise((resolve, reject) => {
    const [program, ...first] = claudeCommand()
    const child = spawn(program, [...first, ...args], { cwd: process.env.GYRE_WORKSPACE, env, stdio: ["ignore", "pipe", "inherit"] })
    let out = ""
    child.stdout.on("data", (d) => (out += d))
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs)
    child.on("error", reject)
    child.on("close", (code, signal) => {
      clearTimeout(timer)
      const events = jsonLines(out)
      const replies = events
        .filter((e) => e.type === "assistant" && e.message?.model === model)
        .map((e) => ({ id: e.message.id, text: (e.message.content ?? []).flatMap((b) => (b.type === "text" ? [b.text] : [])).join("") }))
      const { subtype, is_error, num_turns, stop_reason, terminal_reason, result } = events.findLast((e) => e.type === "result") ?? {}
      resolve({ exit: code ?? signal, replies, result: { subtype, is_error, num_turns, stop_reason, terminal_reason, result } })
    })
  })

const main = async () => {
  const workspace = process.env.GYRE_WORKSPACE
  const taskId = process.env.GYRE_TASK_ID
  const task = taskOf(taskId)
  const turns = Number(process.env.AGENT_CLI_TURNS ?? 2)
  const timeoutMs = Number(process.env.AGENT_CLI_TIMEOUT_MS ?? 300_000)
  const model = process.env.AGENT_CLI_MODEL ?? "gyre"
  const home = fs.mkdtempSync(path.join(os.tmpdir(), "agent-cli-home-"))
  const env = {
    ...process.env,
    HOME: home,
    ANTHROPIC_MODEL: model,
    ANTHROPIC_SMALL_FAST_MODEL: model,
    CLAUDE_CODE_MAX_OUTPUT_TOKENS: process.env.AGENT_CLI_MAX_TOKENS ?? "256",
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "1",
    DISABLE_TELEMETRY: "1",
    DISABLE_AUTOUPDATER: "1"
  }
  const flags = ["-p", "--output-format", "stream-json", "--verbose", "--system-prompt", SYSTEM, "--tools", "Write", "--permission-mode", "acceptEdits", "--max-turns", process.env.AGENT_CLI_MAX_TURNS ?? "8"]
  const session = randomUUID()
  try {
    let prompt = task.prompt
    for (let turn = 1; turn <= turns; turn++) {
      const resume = turn === 1 ? ["--session-id", session] : ["--resume", session]
      const run = await runClaude([...flags, ...resume, prompt], env, model, timeoutMs)
      fs.appendFileSync(path.join(workspace, "agent-cli.jsonl"), JSON.stringify({ turn, ...run }) + "\n")
      const verdict = judge(taskId, workspace, run.replies.map((r) => r.text).join(""))
      console.log(`turn ${turn}: claude exited ${run.exit} (${run.result.subtype ?? "no result"}), ${run.replies.length} model calls, ${task.file} ${verdict.file}`)
      if (verdict.score === 1) break
      prompt = `${task.file} ${verdict.file === "missing" ? "does not exist" : "does not hold exactly the line"}. Write it with exactly this line: ${task.line}`
    }
  } finally {
    fs.rmSync(home, { recursive: true, force: true })
  }
}

await main()
