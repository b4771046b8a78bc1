#!/usr/bin/env node
/**
 * The long suite's harness: a scripted coding agent (`world.mjs`) that talks to
 * OPENAI_BASE_URL with plain chat completions over node:http (no Gyre imports, no client
 * timeout: a call deep into a long context may compute for minutes).
 *
 * Each call is `POST /chat/completions` with the script's messages, `max_tokens` =
 * LONG_OUTPUT_TOKENS, `ignore_eos` (LONG_IGNORE_EOS, default on: every reply has exactly
 * that many tokens, so the execution's token counts do not depend on the model either) and
 * the header `X-Gyre-Role`. Replies go back into the history exactly as returned, so the
 * gateway recognises its own turns. Transport errors, 429 and 5xx are retried (5 times, with
 * backoff); any other answer is a refusal: it is logged, the reply counts as empty, and the
 * script goes on (so a refused call costs its decision, not the execution).
 *
 * Every call is appended to $GYRE_WORKSPACE/calls.jsonl as it is made: `{id, role, call,
 * reply, fresh, usage: {prompt, cached, completion}}` (`call`: the completion's `id`, which the
 * scorer keys per-call rewards by; `fresh`: the first call of a new history), or `{id, role,
 * refused: {status, message}}`. The last stdout line is the script's counts as JSON.
 * With LONG_POLICY=oracle the script's expected reply answers instead (no HTTP).
 */
import * as fs from "node:fs"
import * as http from "node:http"
import * as https from "node:https"
import * as path from "node:path"
import { configFrom, runScript } from "./world.mjs"

const env = process.env
const cfg = configFrom(env)
const taskId = env.GYRE_TASK_ID
const workspace = env.GYRE_WORKSPACE
if (!taskId || !workspace) throw new Error("GYRE_TASK_ID and GYRE_WORKSPACE must be set")
if (cfg.policy === "model" && !(env.OPENAI_BASE_URL && env.OPENAI_API_KEY)) throw new Error("OPENAI_BASE_URL and OPENAI_API_KEY must be set (or LONG_POLICY=oracle)")

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
const log = path.join(workspace, "calls.jsonl")
const counts = { httpRetries: 0, refusals: 0 }

/** One POST: the status and body text (status 0 and the error's text when the request failed). */
const post = (url, body, headers) =>
  new Promise((resolve) => {
    const target = new URL(url)
    const req = (target.protocol === "https:" ? https : http).request(target, { method: "POST", headers: { ...headers, "content-length": Buffer.byteLength(body) } }, (res) => {
      const chunks = []
      res.on("data", (c) => chunks.push(c))
      res.on("end", () => resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString("utf8") }))
      res.on("error", (e) => resolve({ status: 0, text: String(e) }))
    })
    req.on("error", (e) => resolve({ status: 0, text: String(e) }))
    req.end(body)
  })

/** One chat completion: its reply and log line, retrying transport errors, 429 and 5xx. */
const complete = async (messages, role) => {
  const url = `${env.OPENAI_BASE_URL.replace(/\/+$/, "")}/chat/completions`
  const body = JSON.stringify({ model: cfg.model, messages, max_tokens: cfg.outputTokens, temperature: cfg.temperature, ...(cfg.ignoreEos ? { ignore_eos: true } : {}) })
  const headers = { "content-type": "application/json", authorization: `Bearer ${env.OPENAI_API_KEY}`, "x-gyre-role": role }
  for (let attempt = 0; ; attempt++) {
    const { status, text } = await post(url, body, headers)
    if (status === 200) {
      const answer = JSON.parse(text)
      const usage = answer.usage ?? {}
      const reply = answer.choices?.[0]?.message?.content ?? ""
      return { reply, line: { call: answer.id, reply, usage: { prompt: usage.prompt_tokens, cached: usage.prompt_tokens_details?.cached_tokens ?? 0, completion: usage.completion_tokens } } }
    }
    if ((status === 0 || status === 429 || status >= 500) && attempt < 5) {
      counts.httpRetries++
      await sleep(200 * 2 ** attempt)
      continue
    }
    counts.refusals++
    let message = text.slice(0, 500)
    try {
      message = JSON.parse(text).error?.message ?? message
    } catch {
      // not JSON: the raw text
    }
    return { reply: "", line: { refused: { status, message } } }
  }
}

const answer = cfg.policy === "oracle" ? async (_, c) => ({ reply: c.expected, line: { reply: c.expected } }) : (messages, c) => complete(messages, c.role)

fs.mkdirSync(workspace, { recursive: true })
fs.writeFileSync(log, "")
const started = Date.now()
const stats = await runScript(taskId, cfg, async (messages, c) => {
  const { reply, line } = await answer(messages, c)
  fs.appendFileSync(log, JSON.stringify({ id: c.id, role: c.role, fresh: c.fresh, ...line }) + "\n")
  return reply
})
console.log(JSON.stringify({ task: taskId, ...stats, ...counts, ms: Date.now() - started }))
