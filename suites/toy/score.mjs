#!/usr/bin/env node
/**
 * The toy suite's scorer: replays the task's walk (same id and TOY_* settings as the harness)
 * and judges each decision in $GYRE_WORKSPACE/actions.jsonl against it. Prints
 * `{"score": credit / judged, "details": {...}}`: judged = the walk's decisions (main and
 * subagents; ones never made, e.g. after a timeout, count 0) plus the compaction notes made;
 * each earns the fraction of its expected words in place (`creditOf`; a note's expected words
 * are "note" and the next command). No actions at all: `{"score": 0, "no_artifact": true}`.
 */
import * as fs from "node:fs"
import * as path from "node:path"
import { configFrom, creditOf, expectedReplies, scriptOf } from "./world.mjs"

const cfg = configFrom(process.env)
const taskId = process.env.GYRE_TASK_ID
const file = path.join(process.env.GYRE_WORKSPACE, "actions.jsonl")
const lines = fs.existsSync(file) ? fs.readFileSync(file, "utf8").split("\n").filter((l) => l.trim() !== "") : []
if (lines.length === 0) {
  console.log(JSON.stringify({ score: 0, no_artifact: true, details: "no actions.jsonl or no decision in it" }))
  process.exit(0)
}

const script = scriptOf(taskId, cfg)
const expected = expectedReplies(script)
const seen = new Set()
let right = 0
let credit = 0
let notes = 0
let unreadable = 0
for (const line of lines) {
  let action
  try {
    action = JSON.parse(line)
  } catch {
    unreadable++ // a line cut short when the harness was killed
    continue
  }
  if (typeof action?.id !== "string" || typeof action.reply !== "string" || seen.has(action.id)) continue
  seen.add(action.id)
  const note = /^n(\d+)$/.exec(action.id)
  const want = note !== null && Number(note[1]) < script.length ? `note ${script[Number(note[1])].reply}` : expected.get(action.id)
  if (want === undefined) continue
  if (note !== null) notes++
  const c = creditOf(action.reply, want)
  credit += c
  if (c === 1) right++
}
const judged = expected.size + notes
const made = [...seen].filter((id) => expected.has(id)).length
console.log(JSON.stringify({
  score: credit / judged,
  details: { decisions: expected.size, made, notes, right, credit, unreadable }
}))
