#!/usr/bin/env node
/**
 * The agent-cli suite's scorer: judges the workspace (`judge` in task.mjs) against the task's
 * file and line, with the model's replies in the CLI's last run (agent-cli.jsonl, joined). No agent-cli.jsonl (the CLI
 * never ran): `{"score": 0, "no_artifact": true}`.
 */
import * as fs from "node:fs"
import * as path from "node:path"
import { judge } from "./task.mjs"

const workspace = process.env.GYRE_WORKSPACE
const log = path.join(workspace, "agent-cli.jsonl")
const turns = fs.existsSync(log) ? fs.readFileSync(log, "utf8").split("\n").filter((l) => l.trim() !== "") : []
if (turns.length === 0) {
  console.log(JSON.stringify({ score: 0, no_artifact: true, details: "no agent-cli.jsonl: the CLI never ran" }))
} else {
  let last = {}
  try {
    last = JSON.parse(turns.at(-1))
  } catch {}
  const reply = (last.replies ?? []).map((r) => String(r.text ?? "")).join("")
  const verdict = judge(process.env.GYRE_TASK_ID, workspace, reply)
  console.log(JSON.stringify({ score: verdict.score, details: { file: verdict.file, turns: turns.length } }))
}
