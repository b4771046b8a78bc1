#!/usr/bin/env node
/**
 * The long suite's scorer: replays the task's script (same id and LONG_* settings as the
 * harness; `expectedReplies`) and judges each decision in $GYRE_WORKSPACE/calls.jsonl against it.
 *
 * Prints `{"score": credit / decisions, "details": {...}, "rewards": {...}}`: every decision of
 * the script counts (main, subagent, summary; one never made or refused earns 0), each earns
 * `creditOf` its reply's first line. `rewards`: each answered call, keyed by its completion id,
 * earns its own credit. `details` also carries what the calls' usage says: prompt tokens,
 * cached ones (`cached_fraction` over the calls that continue a history, i.e. all but the
 * first of each new history), and the refusals with the first one's message.
 * No calls.jsonl or no line in it: `{"score": 0, "no_artifact": true}`.
 */
import * as fs from "node:fs"
import * as path from "node:path"
import { configFrom, creditOf, expectedReplies } from "./world.mjs"

const cfg = configFrom(process.env)
const file = path.join(process.env.GYRE_WORKSPACE, "calls.jsonl")
const lines = (fs.existsSync(file) ? fs.readFileSync(file, "utf8").split("\n") : []).filter((l) => l.trim() !== "").map((line) => {
  try {
    return JSON.parse(line)
  } catch {
    return undefined // cut short when the harness was killed
  }
})
if (lines.length === 0) {
  console.log(JSON.stringify({ score: 0, no_artifact: true, details: "no calls.jsonl or no call in it" }))
  process.exit(0)
}

const expected = await expectedReplies(process.env.GYRE_TASK_ID, cfg)
const seen = new Set()
const rewards = {}
const t = { right: 0, credit: 0, refused: 0, unreadable: 0, prompt: 0, cached: 0, continuedPrompt: 0, continuedCached: 0, uncached: 0 }
let firstRefusal
for (const line of lines) {
  if (line === undefined || typeof line.id !== "string") {
    t.unreadable++
    continue
  }
  const want = expected.get(line.id)
  if (line.refused !== undefined) {
    t.refused++
    firstRefusal ??= `${line.id}: ${line.refused.status} ${String(line.refused.message).slice(0, 200)}`
  }
  if (want === undefined || seen.has(line.id) || typeof line.reply !== "string") continue
  seen.add(line.id)
  const c = creditOf(line.reply, want)
  t.credit += c
  if (c === 1) t.right++
  if (typeof line.call === "string") rewards[line.call] = c
  const u = line.usage
  if (u === undefined || typeof u.prompt !== "number") continue
  t.prompt += u.prompt
  t.cached += u.cached
  if (!line.fresh) {
    t.continuedPrompt += u.prompt
    t.continuedCached += u.cached
    if (u.cached === 0) t.uncached++
  }
}
const round = (x) => Number(x.toFixed(4))
console.log(JSON.stringify({
  score: t.credit / expected.size,
  details: {
    decisions: expected.size,
    made: seen.size,
    right: t.right,
    credit: round(t.credit),
    refused: t.refused,
    ...(firstRefusal === undefined ? {} : { first_refusal: firstRefusal }),
    unreadable: t.unreadable,
    prompt_tokens: t.prompt,
    cached_tokens: t.cached,
    continued_prompt_tokens: t.continuedPrompt,
    continued_cached_tokens: t.continuedCached,
    cached_fraction: t.continuedPrompt === 0 ? null : round(t.continuedCached / t.continuedPrompt),
    uncached_calls: t.uncached
  },
  rewards
}))
