/**
 * The OpenAI endpoints over a scripted `generate` (no worker, no HTTP server): what each route
 * asks the worker for, what it answers (JSON or server-sent events), and the 4xx it refuses with.
 */
import { Deferred, Effect, Exit } from "effect"
import { describe, expect, it } from "vitest"
import type { CallResult } from "../../src/gateway/call-router.ts"
import { ChatTurns, type GatewayCall, type Generate } from "../../src/gateway/chat-turn.ts"
import { OpenAiRoutes, type OpenAiRoutesShape } from "../../src/gateway/endpoints.ts"
import { makeSessions } from "../../src/gateway/sessions.ts"
import { gyreChat } from "../../src/openai/chat.ts"
import type { ApiError } from "../../src/openai/openai.ts"
import type { SamplingParams } from "../../src/protocols/rollout.ts"

const MODEL = "toy"
const tokenizer = gyreChat.tokenizer

/** A response that keeps what is written to it. */
const fakeResponse = () => {
  const out = { status: 0, headers: {} as Record<string, string>, body: "", ended: false }
  const res = {
    destroyed: false,
    get writableEnded() {
      return out.ended
    },
    get headersSent() {
      return out.status !== 0
    },
    writeHead(status: number, headers: Record<string, string>) {
      out.status = status
      out.headers = headers
    },
    write(text: string) {
      out.body += text
    },
    end(text?: string) {
      if (text !== undefined) out.body += text
      out.ended = true
    }
  }
  return { res, out }
}

interface Asked {
  readonly prompt: Int32Array
  readonly sampling: SamplingParams
}

/** A `generate` that answers `text` (then eos unless `finish` says otherwise), one token a step. */
const scripted = (text: string, finishReason: CallResult["finishReason"] = "stop") => {
  const asked: Array<Asked> = []
  const generate: Generate = (_call, _id, prompt, sampling, onTokens, finish) =>
    Effect.sync(() => {
      asked.push({ prompt, sampling })
      const ids = tokenizer.encode(text)
      const output = Int32Array.from(finishReason === "stop" ? [...ids, gyreChat.eosIds[0]!] : ids)
      const logprobs = Float32Array.from(output, (_, i) => -0.5 - i)
      for (let i = 0; i < output.length; i++) {
        onTokens?.({ tokens: output.subarray(i, i + 1), logprobs: logprobs.subarray(i, i + 1), versions: new Int32Array(1) })
      }
      const result: CallResult = {
        output,
        logprobs,
        versions: new Int32Array(output.length),
        finishReason,
        promptTokens: prompt.length,
        cachedTokens: 3,
        computeMs: 1,
        workerMs: 1,
        workers: ["rollout-worker/w1"],
        fullResends: 0,
        reprefillTokens: 0
      }
      finish(result)
      return result
    })
  return { asked, generate }
}

const setup = (text: string, finishReason?: CallResult["finishReason"], maxContextTokens?: number) => {
  const { asked, generate } = scripted(text, finishReason)
  const turns = ChatTurns.make({ chat: gyreChat, defaultMaxTokens: 32, maxContextTokens, generate })
  const route = OpenAiRoutes.make({ model: MODEL, servingSince: 1_700_000_000, maxContextTokens, generate, turns, chat: gyreChat })
  return { asked, route }
}

let executions = 0
/** Runs `path`'s `method` with `body`: the response written, or the error it failed with. */
const request = (routes: OpenAiRoutesShape, method: string, path: string, body?: unknown) =>
  Effect.gen(function* () {
    const sessions = makeSessions("run-1")
    const session = yield* sessions.open({ keyDigest: `k${++executions}`, task: "t", execution: `x${executions}`, defaultRole: "agent" })
    const { res, out } = fakeResponse()
    const call: GatewayCall = {
      session,
      req: {} as GatewayCall["req"],
      res: res as unknown as GatewayCall["res"],
      clientGone: yield* Deferred.make<void>(),
      startedAt: 1_700_000_123_456,
      receivedAt: performance.now(),
      json: Effect.succeed(body)
    }
    const handler = routes.route(path)?.[method]
    if (handler === undefined) return { out, error: undefined, routed: false }
    const exit = yield* Effect.exit(handler(call))
    const error = Exit.isFailure(exit) ? (exit.cause.reasons.find((r) => r._tag === "Fail")?.error as ApiError | undefined) : undefined
    if (Exit.isFailure(exit) && error === undefined) throw new Error(`died: ${String(exit.cause)}`)
    return { out, error, routed: true }
  }).pipe(Effect.runPromise)

const events = (body: string) =>
  body
    .split("\n\n")
    .filter((e) => e.startsWith("data: "))
    .map((e) => e.slice("data: ".length))

describe("OpenAiRoutes", () => {
  it("answers a chat completion with the generated text, its usage and finish reason", async () => {
    const { asked, route } = setup("Hello there")
    const { out, error } = await request(route, "POST", "/v1/chat/completions", { model: MODEL, messages: [{ role: "user", content: "hi" }], max_tokens: 7, seed: 5 })
    expect(error).toBeUndefined()
    expect(out.status).toBe(200)
    const json = JSON.parse(out.body)
    expect(json.choices[0].message).toEqual({ role: "assistant", content: "Hello there" })
    expect(json.choices[0].finish_reason).toBe("stop")
    expect(json.created).toBe(1_700_000_123)
    expect(json.model).toBe(MODEL)
    expect(json.id).toMatch(/^chatcmpl-/)
    expect(asked).toHaveLength(1)
    expect(asked[0]!.sampling.maxTokens).toBe(7)
    expect(asked[0]!.sampling.seed).toBe(5)
    expect(json.usage).toMatchObject({ prompt_tokens: asked[0]!.prompt.length, completion_tokens: tokenizer.encode("Hello there").length + 1 })
    expect(json.usage.prompt_tokens_details.cached_tokens).toBe(3)
    // The prompt is the rendered conversation: it holds the user's text.
    expect(tokenizer.decode(asked[0]!.prompt)).toContain("hi")
  })

  it("streams a chat completion: a role chunk, content deltas that add up to the answer, the finish, usage, [DONE]", async () => {
    const { route } = setup("Hello there")
    const { out } = await request(route, "POST", "/v1/chat/completions", {
      model: MODEL,
      messages: [{ role: "user", content: "hi" }],
      stream: true,
      stream_options: { include_usage: true },
      logprobs: true
    })
    expect(out.headers["content-type"]).toBe("text/event-stream")
    const data = events(out.body)
    expect(data.at(-1)).toBe("[DONE]")
    const chunks = data.slice(0, -1).map((d) => JSON.parse(d))
    expect(chunks[0].choices[0].delta).toEqual({ role: "assistant", content: "" })
    const text = chunks.flatMap((c) => c.choices.map((ch: { delta: { content?: string } }) => ch.delta.content ?? "")).join("")
    expect(text).toBe("Hello there")
    const finishes = chunks.flatMap((c) => c.choices.map((ch: { finish_reason: string | null }) => ch.finish_reason)).filter((f) => f !== null)
    expect(finishes).toEqual(["stop"])
    expect(chunks.at(-1).choices).toEqual([])
    expect(chunks.at(-1).usage.completion_tokens).toBe(tokenizer.encode("Hello there").length + 1)
    // Log-probs: one entry per streamed token, in order.
    const lps = chunks.flatMap((c) => c.choices.flatMap((ch: { logprobs: { content: Array<{ logprob: number }> } | null }) => ch.logprobs?.content ?? []))
    expect(lps.map((l: { logprob: number }) => l.logprob).slice(0, 2)).toEqual([-0.5, -1.5])
  })

  it("says length when the worker stopped at max_tokens", async () => {
    const { route } = setup("Hello", "length")
    const { out } = await request(route, "POST", "/v1/chat/completions", { model: MODEL, messages: [{ role: "user", content: "hi" }] })
    expect(JSON.parse(out.body).choices[0].finish_reason).toBe("length")
  })

  it("refuses another model with a 404 and what it does not do with a 400 naming the parameter", async () => {
    const { asked, route } = setup("x")
    const messages = [{ role: "user", content: "hi" }]
    const wrong = await request(route, "POST", "/v1/chat/completions", { model: "other", messages })
    expect(wrong.error).toMatchObject({ status: 404, code: "model_not_found", param: "model" })
    for (const [extra, param] of [
      [{ n: 2 }, "n"],
      [{ top_logprobs: 3, logprobs: true }, "top_logprobs"],
      [{ response_format: { type: "json_object" } }, "response_format"]
    ] as const) {
      const { error } = await request(route, "POST", "/v1/chat/completions", { model: MODEL, messages, ...extra })
      expect(error).toMatchObject({ status: 400, param, code: "unsupported_parameter" })
    }
    const bad = await request(route, "POST", "/v1/chat/completions", { model: MODEL, messages: "hi" })
    expect(bad.error?.status).toBe(400)
    expect(asked).toHaveLength(0)
  })

  it("completes a text prompt after bos, cutting the text at a stop string", async () => {
    const { asked, route } = setup("abc STOP def")
    const { out } = await request(route, "POST", "/v1/completions", { model: MODEL, prompt: "Once", stop: "STOP", max_tokens: 9 })
    const json = JSON.parse(out.body)
    expect(json.choices[0].text).toBe("abc ")
    expect(json.id).toMatch(/^cmpl-/)
    const prompt = [...asked[0]!.prompt]
    expect(prompt[0]).toBe(gyreChat.bos)
    expect(prompt.slice(1)).toEqual(tokenizer.encode("Once"))
    // The worker stops at eos and at the stop string's tokens.
    expect(asked[0]!.sampling.stop.map((s) => [...s])).toEqual([[gyreChat.eosIds[0]], tokenizer.encode("STOP")])
    expect(asked[0]!.sampling.maxTokens).toBe(9)
  })

  it("streams a completion whose chunks add up to the text, then the finish", async () => {
    const { route } = setup("streamed words")
    const { out } = await request(route, "POST", "/v1/completions", { model: MODEL, prompt: [1, 2, 3], stream: true })
    const data = events(out.body)
    expect(data.at(-1)).toBe("[DONE]")
    const chunks = data.slice(0, -1).map((d) => JSON.parse(d))
    expect(chunks.map((c) => c.choices[0].text).join("")).toBe("streamed words")
    expect(chunks.at(-1).choices[0].finish_reason).toBe("stop")
  })

  it("refuses token ids outside the vocabulary and prompts over the context limit", async () => {
    const { asked, route } = setup("x", "stop", 8)
    const bad = await request(route, "POST", "/v1/completions", { model: MODEL, prompt: [1, tokenizer.vocabSize] })
    expect(bad.error).toMatchObject({ status: 400, param: "prompt" })
    expect(bad.error?.message).toContain(`${tokenizer.vocabSize}`)
    const long = await request(route, "POST", "/v1/completions", { model: MODEL, prompt: Array.from({ length: 20 }, (_, i) => i + 1) })
    expect(long.error).toMatchObject({ status: 400, code: "context_length_exceeded" })
    expect(asked).toHaveLength(0)
  })

  it("lists the model, answers it by name, 404s another, and routes nothing else", async () => {
    const { route } = setup("x")
    const list = await request(route, "GET", "/v1/models")
    expect(JSON.parse(list.out.body).data).toEqual([expect.objectContaining({ id: MODEL, created: 1_700_000_000 })])
    const one = await request(route, "GET", `/v1/models/${MODEL}`)
    expect(JSON.parse(one.out.body)).toMatchObject({ id: MODEL })
    const other = await request(route, "GET", "/v1/models/nope")
    expect(other.error).toMatchObject({ status: 404, code: "model_not_found" })
    expect((await request(route, "GET", "/v1/other")).routed).toBe(false)
    expect((await request(route, "GET", "/v1/chat/completions")).routed).toBe(false)
  })
})
