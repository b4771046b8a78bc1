#!/usr/bin/env node
/**
 * The toy suite's scorer: replays the task's walk (same id and TOY_* settings as the harness)
 * and judges each decision in $GYRE_WORKSPACE/actions.jsonl against it. Prints
 * `{"score": credit / judged, "details": {...}}`: judged = the walk's decisions (main and
 * subagents; ones never made, e.g. after a timeout, count 0) plus the compaction notes made;
 * each earns the fraction of its expected words in place (`creditOf`; a note's expected words
 * are "note" and the next command). No actions at all: `{"score": 0, "no_artifact": true}`.
 * `rewards`: each model call of $GYRE_WORKSPACE/calls.jsonl (retries too), keyed by its chat
 * completion id, earns the credit of its own reply against its decision's expected reply.
 */
import * as fs from "node:fs"
import * as path from "node:path"
import { configFrom, creditOf, expectedReplies, scriptOf } from "./world.mjs"

const cfg = configFrom(process.env)
const taskId = process.env.GYRE_TASK_ID
/** The JSON lines of a workspace file (none if it is missing); a line cut short when the harness was killed is `undefined`. */
const jsonLines = (name) => {
  const file = path.join(process.env.GYRE_WORKSPACE, name)
  const lines = fs.existsSync(file) ? fs.readFileSync(file, "utf8").split("\n").filter((l) => l.trim() !== "") : []
  return lines.map((line) => {
    try {
      return JSON.parse(line)
    } catch {
      return undefined
    }
  })
}
const lines = jsonLines("actions.jsonl")
if (lines.length === 0) {
  console.log(JSON.stringify({ score: 0, no_artifact: true, details: "no actions.jsonl or no decision in it" }))
  process.exit(0)
}

const script = scriptOf(taskId, cfg)
const expected = expectedReplies(script)
/** The reply decision `id` should have been (a compaction note holds the next command), or undefined. */
const wanted = (id) => {
  const note = /^n(\d+)$/.exec(id)
  return note !== null ? (Number(note[1]) < script.length ? `note ${script[Number(note[1])].reply}` : undefined) : expected.get(id)
}
const seen = new Set()
let right = 0
let credit = 0
let notes = 0
let unreadable = 0
for (const action of lines) {
  if (action === undefined) unreadable++
  if (typeof action?.id !== "string" || typeof action.reply !== "string" || seen.has(action.id)) continue
  seen.add(action.id)
  const want = wanted(action.id)
  if (want === undefined) continue
  if (action.id.startsWith("n")) notes++
  const c = creditOf(action.reply, want)
  credit += c
  if (c === 1) right++
}
const rewards = {}
for (const c of jsonLines("calls.jsonl")) {
  const want = typeof c?.id === "string" && typeof c.call === "string" && typeof c.reply === "string" ? wanted(c.id) : undefined
  if (want !== undefined) rewards[c.call] = creditOf(c.reply, want)
}
const judged = expected.size + notes
const made = [...seen].filter((id) => expected.has(id)).length
console.log(JSON.stringify({
  score: credit / judged,
  details: { decisions: expected.size, made, notes, right, credit, unreadable },
  rewards
}))
