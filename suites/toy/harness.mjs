#!/usr/bin/env node
/**
 * The toy suite's harness: an agent loop that talks to OPENAI_BASE_URL with plain chat
 * completions (no Gyre imports) and runs the walk of `world.mjs`.
 *
 * - Each decision is one call; the reply is a plain-text command in the message content.
 *   Tool results come back as `tool` messages (with a made-up `tool_call_id`, which the
 *   OpenAI format requires) after a heavy-tailed latency.
 * - Retries from the same prompt: a malformed reply, or a well-formed one whose tool call
 *   fails (probability TOY_FAIL_RATE), is asked again, at most TOY_MAX_RETRIES times.
 * - Subagents: a fork runs a subagent on a copy of the parent's context (role `subagent`,
 *   its final report `subagent-summary`), then the parent goes on.
 * - Compaction: past TOY_COMPACT_BYTES of context the agent asks for a note (role
 *   `main-summary`) and starts over from [system, the command the note holds].
 * Every decision is appended to $GYRE_WORKSPACE/actions.jsonl (what the scorer reads), and every
 * model call (retries too) to calls.jsonl with the chat completion's `id` (the scorer's per-call
 * rewards are keyed by it).
 * With TOY_POLICY=oracle the scripted oracle answers instead of the model (no HTTP), and
 * TOY_DEMOS=<file> appends each call's messages and reply as JSONL (demonstrations).
 * Draws (tool latency, failures) are seeded by TOY_RANDOM_SEED, else by the run's GYRE_SEED and
 * GYRE_EXECUTION_ID (`executionSeed`), else at random.
 */
import * as fs from "node:fs"
import * as path from "node:path"
import { compactRequest, configFrom, generator, latencySampler, oracleReply, scriptOf, systemPrompt, wellFormed } from "./world.mjs"

const env = process.env
const cfg = configFrom(env)
const taskId = env.GYRE_TASK_ID
const workspace = env.GYRE_WORKSPACE
if (!taskId || !workspace) throw new Error("GYRE_TASK_ID and GYRE_WORKSPACE must be set")
if (cfg.policy === "model" && !(env.OPENAI_BASE_URL && env.OPENAI_API_KEY)) throw new Error("OPENAI_BASE_URL and OPENAI_API_KEY must be set (or TOY_POLICY=oracle)")

const rand = generator(cfg.randomSeed ?? Math.floor(Math.random() * 2 ** 32))
const latency = latencySampler(rand, cfg)
const actions = path.join(workspace, "actions.jsonl")
const stats = { calls: 0, retries: 0, subagents: 0, compactions: 0, httpRetries: 0 }
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

/** One chat completion from the gateway (its content and id), retrying transport errors and 5xx/429 answers. */
const complete = async (messages, role) => {
  const url = `${env.OPENAI_BASE_URL.replace(/\/+$/, "")}/chat/completions`
  const body = JSON.stringify({ model: cfg.model, messages, max_tokens: cfg.maxTokens, temperature: cfg.temperature })
  for (let attempt = 0; ; attempt++) {
    let status = 0
    let text = ""
    try {
      const res = await fetch(url, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${env.OPENAI_API_KEY}`, "x-gyre-role": role },
        body
      })
      status = res.status
      text = await res.text()
    } catch (e) {
      text = String(e)
    }
    // The content goes back into the history exactly as returned, so the gateway recognises
    // its own turn (and its raw tokens) in the next prompt.
    if (status === 200) {
      const answer = JSON.parse(text)
      return { reply: answer.choices?.[0]?.message?.content ?? "", call: answer.id }
    }
    if ((status !== 0 && status !== 429 && status < 500) || attempt >= 5) throw new Error(`chat completion failed (${status}): ${text.slice(0, 500)}`)
    stats.httpRetries++
    await sleep(100 * 2 ** attempt)
  }
}

const policy = cfg.policy === "oracle" ? async (messages) => ({ reply: oracleReply(messages), call: undefined }) : complete
const calls = path.join(workspace, "calls.jsonl")

/** One decision: asks until the reply is kept (well-formed and its tool call did not fail, or out of retries). */
const decide = async (messages, role, id) => {
  for (let attempt = 0; ; attempt++) {
    const { reply, call } = await policy(messages, role)
    stats.calls++
    if (typeof call === "string") fs.appendFileSync(calls, JSON.stringify({ id, call, reply }) + "\n")
    if (cfg.demos) fs.appendFileSync(cfg.demos, JSON.stringify({ task: taskId, id, role, messages, reply }) + "\n")
    const failed = !wellFormed(reply) || rand() < cfg.failRate
    if (failed && attempt < cfg.maxRetries) {
      stats.retries++
      continue
    }
    fs.appendFileSync(actions, JSON.stringify({ id, reply }) + "\n")
    return reply
  }
}

let toolCalls = 0
const tool = async (content) => {
  const ms = latency.next()
  if (ms > 0) await sleep(ms)
  return { role: "tool", tool_call_id: `call_${toolCalls++}`, content }
}

const contextBytes = (messages) => messages.reduce((n, m) => n + Buffer.byteLength(m.content), 0)

let forks = 0

/** Runs a walk; `messages` ends with the first observation. Subagents do not fork or compact. */
const agent = async (messages, walk, main) => {
  const sub = main ? undefined : forks++
  for (let j = 0; j < walk.length; j++) {
    if (main && j > 0 && cfg.compactBytes > 0 && contextBytes(messages) > cfg.compactBytes) {
      stats.compactions++
      const note = await decide([...messages, { role: "user", content: compactRequest }], "main-summary", `n${j}`)
      messages = [{ role: "system", content: systemPrompt }, { role: "user", content: note.replace(/^note /, "") }]
    }
    const last = j === walk.length - 1
    const role = main ? "main" : last ? "subagent-summary" : "subagent"
    const reply = await decide(messages, role, main ? `m${j}` : `s${sub}.${j}`)
    messages = [...messages, { role: "assistant", content: reply }]
    if (walk[j].sub) {
      stats.subagents++
      await agent([...messages, await tool(walk[j].sub[0].text)], walk[j].sub, false)
    }
    if (!last) messages = [...messages, await tool(walk[j + 1].text)]
  }
}

const script = scriptOf(taskId, cfg)
fs.mkdirSync(workspace, { recursive: true })
fs.writeFileSync(actions, "")
fs.writeFileSync(calls, "")
const started = Date.now()
await agent([{ role: "system", content: systemPrompt }, { role: "user", content: script[0].text }], script, true)
console.log(JSON.stringify({ task: taskId, ...stats, slowness: Number(latency.slowness.toFixed(2)), ms: Date.now() - started }))
