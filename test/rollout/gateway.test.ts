/**
 * The gateway against a real rollout worker (tiny preset on the CPU engine), real NATS and
 * real HTTP, through the official `openai` client: chat, streaming, completions and models;
 * CallRecords on the stream match what the client saw token for token and rebuild into the
 * expected tree; an execution's next call prefills only its new suffix; bad requests get
 * OpenAI-format 4xx errors; the event loop and the worker's heartbeat keep going during
 * generation; closing an execution revokes its key and frees its cache.
 */
import { Effect } from "effect"
import OpenAI from "openai"
import { describe, expect, it } from "vitest"
import { RolloutWorkerProtocol } from "../../src/protocols/rollout.ts"
import { special } from "../../src/engine/tokenizer.ts"
import { address } from "../../src/runtime/names.ts"
import { ActorSystem, refOf } from "../../src/runtime/system.ts"
import { DeltaDecoder } from "../../src/tree/decoder.ts"
import { executionStats } from "../../src/tree/stats.ts"
import { withSystem } from "../runtime/harness.ts"
import { KEY, gatewayRef, readRecords, serve, tempDir, writeCheckpoint } from "./fixtures.ts"

const checkpoint = await writeCheckpoint(tempDir("gyre-gw-"), 5)

const clientOf = (baseURL: string, apiKey = KEY) => new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 })
const promise = <A>(f: () => Promise<A>) => Effect.promise(f)

const outputOf = (decoder: DeltaDecoder, callId: string) => {
  const tree = decoder.tree
  const index = tree.callIndex(callId)!
  return Array.from(tree.callSequence(index).subarray(tree.call(index).promptLength))
}

const bytesOf = (lp: OpenAI.Chat.Completions.ChatCompletionTokenLogprob) => lp.bytes ?? []

describe("gateway (OpenAI API) with a rollout worker", () => {
  it("serves chat, streaming, completions and models to the openai client", async () => {
    const out = await withSystem("gw-api", Effect.gen(function* () {
      const { baseUrl } = yield* serve({ checkpoint, workers: 1 })
      const client = clientOf(baseUrl)
      const models = yield* promise(() => client.models.list())
      const messages = [{ role: "system" as const, content: "You are terse." }, { role: "user" as const, content: "Say something." }]
      const plain = yield* promise(() => client.chat.completions.create({ model: "gyre", messages, max_tokens: 24, seed: 42, temperature: 0.8 }))
      const stream = yield* promise(() =>
        client.chat.completions.create({ model: "gyre", messages, max_tokens: 24, seed: 42, temperature: 0.8, stream: true, stream_options: { include_usage: true } })
      )
      const chunks: Array<OpenAI.Chat.Completions.ChatCompletionChunk> = []
      yield* promise(async () => {
        for await (const c of stream) chunks.push(c)
      })
      const text = yield* promise(() => client.completions.create({ model: "gyre", prompt: "Once upon", max_tokens: 8, seed: 1 }))
      const ids = yield* promise(() => client.completions.create({ model: "gyre", prompt: [special.bos, 72, 105], max_tokens: 4, temperature: 0 }))
      const status = yield* (yield* ActorSystem).ask(gatewayRef, "Status", undefined)
      return { models, plain, chunks, text, ids, status }
    }))
    expect(out.models.data.map((m) => m.id)).toEqual(["gyre"])
    const choice = out.plain.choices[0]!
    expect(choice.message.role).toBe("assistant")
    expect(["stop", "length"]).toContain(choice.finish_reason)
    expect(out.plain.usage!.completion_tokens).toBeGreaterThan(0)
    expect(out.plain.usage!.completion_tokens).toBeLessThanOrEqual(24)
    // The same seed samples the same tokens: the stream's deltas add up to the same text.
    const streamed = out.chunks.flatMap((c) => c.choices.map((ch) => ch.delta.content ?? "")).join("")
    expect(streamed).toBe(choice.message.content ?? "")
    expect(out.chunks[0]!.choices[0]!.delta.role).toBe("assistant")
    const finish = out.chunks.flatMap((c) => c.choices.map((ch) => ch.finish_reason)).filter((f) => f !== null)
    expect(finish).toEqual([choice.finish_reason])
    expect(out.chunks.at(-1)!.usage!.completion_tokens).toBe(out.plain.usage!.completion_tokens)
    expect(out.text.object).toBe("text_completion")
    expect(out.text.usage!.prompt_tokens).toBe(1 + "Once upon".length)
    expect(out.ids.usage!.prompt_tokens).toBe(3)
    expect(out.status.calls).toBe(4)
    expect(out.status.openExecutions).toBe(1)
  })

  it("records every call as a delta-encoded CallRecord that matches what the client saw and rebuilds the tree; a next call prefills only its suffix", async () => {
    const out = await withSystem("gw-rec", Effect.gen(function* () {
      const { baseUrl, execution } = yield* serve({ checkpoint, workers: 1 })
      const client = clientOf(baseUrl)
      const ask = (messages: Array<OpenAI.Chat.Completions.ChatCompletionMessageParam>, role?: string) =>
        promise(() =>
          client.chat.completions.create(
            { model: "gyre", messages, max_tokens: 16, logprobs: true, seed: messages.length },
            role === undefined ? {} : { headers: { "X-Gyre-Role": role } }
          )
        )
      const history: Array<OpenAI.Chat.Completions.ChatCompletionMessageParam> = [
        { role: "system", content: "You are an agent." },
        { role: "user", content: "Begin the task." }
      ]
      const first = yield* ask(history)
      const turn1 = { role: "assistant" as const, content: first.choices[0]!.message.content }
      const second = yield* ask([...history, turn1, { role: "user", content: "Go on." }])
      // a retry from after the first answer, and a subagent forking the first prompt
      const retry = yield* ask([...history, turn1, { role: "user", content: "Try again." }])
      const sub = yield* ask([...history, { role: "user", content: "Subtask: look around." }], "subagent")
      const records = yield* readRecords(execution, 4)
      return { responses: [first, second, retry, sub], records }
    }))
    const { responses, records } = out
    expect(records.map((r) => r.callId)).toEqual(responses.map((r) => r.id))
    const decoder = new DeltaDecoder("exec-1")
    for (const r of records) {
      const report = decoder.add(r)
      expect(report.rejected).toEqual([])
      expect(report.added).toEqual([r.callId])
    }
    // token for token: the ids, log-probs and versions the client saw
    responses.forEach((res, i) => {
      const record = records[i]!
      const seen = res.choices[0]!.logprobs!.content!
      const output = outputOf(decoder, record.callId)
      expect(output.length).toBe(res.usage!.completion_tokens)
      expect(seen.map(bytesOf)).toEqual(output.map((t) => (t < 256 ? [t] : [])))
      expect(seen.map((l) => l.logprob)).toEqual(Array.from(record.logprobs))
      expect(Array.from(record.versions)).toEqual(new Array(output.length).fill(0))
      expect(record.promptLength).toBe(res.usage!.prompt_tokens)
      expect(record.role).toBe(i === 3 ? "subagent" : "main")
      expect(record.finishReason).toBe(res.choices[0]!.finish_reason)
    })
    const [r1, r2, r3, r4] = records
    const seq1 = r1!.promptLength + r1!.outputLength
    // the second call extends the first exactly (the history's assistant turn renders as the generated tokens)
    expect(r2!.ref).toEqual({ callId: r1!.callId, shared: seq1 })
    expect(responses[1]!.usage!.prompt_tokens_details!.cached_tokens).toBe(seq1 - 1)
    expect(r3!.ref!.shared).toBeGreaterThanOrEqual(seq1)
    // a retry branching after the second call's turn header: a prefix fork of every token it shares
    expect(responses[2]!.usage!.prompt_tokens_details!.cached_tokens).toBe(r3!.ref!.shared)
    expect(r4!.ref!.shared).toBe(r1!.promptLength - 1)
    expect(responses[3]!.usage!.prompt_tokens_details!.cached_tokens).toBe(r1!.promptLength - 1)
    const stats = executionStats(decoder.tree)
    expect(stats.calls).toBe(4)
    expect(stats.leaves).toBe(3)
    expect(stats.leavesByRole).toEqual({ main: 2, subagent: 1 })
    expect(stats.generatedTokens).toBe(records.reduce((s, r) => s + r.outputLength, 0))
  })

  it("answers bad requests with OpenAI-format errors and the right status", async () => {
    const out = await withSystem("gw-err", Effect.gen(function* () {
      const { baseUrl } = yield* serve({ checkpoint, workers: 1, worker: { maxContext: 256 }, gateway: { limits: { maxBodyBytes: 4096 } } })
      const client = clientOf(baseUrl)
      const caught = (f: () => Promise<unknown>) =>
        promise(() => f().then(() => undefined, (e: unknown) => (e instanceof OpenAI.APIError ? { status: e.status, error: e.error as Record<string, unknown> } : { status: -1, error: { message: String(e) } })))
      const user = [{ role: "user" as const, content: "hi" }]
      const raw = (path: string, init: RequestInit) =>
        promise(async () => {
          const r = await fetch(`${baseUrl}${path}`, init)
          return { status: r.status, body: (await r.json()) as { error: Record<string, unknown> }, allow: r.headers.get("allow") }
        })
      const json = { authorization: `Bearer ${KEY}`, "content-type": "application/json" }
      return {
        badKey: yield* caught(() => clientOf(baseUrl, "not-a-key").chat.completions.create({ model: "gyre", messages: user })),
        noKey: yield* raw("/chat/completions", { method: "POST", headers: { "content-type": "application/json" }, body: "{}" }),
        unknownModel: yield* caught(() => client.chat.completions.create({ model: "gpt-9", messages: user })),
        wrongType: yield* caught(() => client.chat.completions.create({ model: "gyre", messages: user, max_tokens: "many" as unknown as number })),
        badRole: yield* caught(() => client.chat.completions.create({ model: "gyre", messages: [{ role: "wizard", content: "x" } as never] })),
        missingContent: yield* caught(() => client.chat.completions.create({ model: "gyre", messages: [{ role: "tool", content: "x" } as never] })),
        tooLong: yield* caught(() => client.chat.completions.create({ model: "gyre", messages: [{ role: "user", content: "x".repeat(400) }] })),
        malformed: yield* raw("/chat/completions", { method: "POST", headers: json, body: "{not json" }),
        tooLarge: yield* raw("/chat/completions", { method: "POST", headers: json, body: JSON.stringify({ model: "gyre", messages: [{ role: "user", content: "y".repeat(5000) }] }) }),
        unknownRoute: yield* raw("/embeddings", { method: "POST", headers: json, body: "{}" }),
        wrongMethod: yield* raw("/chat/completions", { method: "GET", headers: json }),
        badTokenId: yield* caught(() => client.completions.create({ model: "gyre", prompt: [1, 2, 999] }))
      }
    }))
    const expectError = (e: { status: number; error: Record<string, unknown> } | undefined, status: number, param?: string) => {
      expect(e?.status).toBe(status)
      expect(typeof e?.error.message).toBe("string")
      expect(typeof e?.error.type).toBe("string")
      if (param !== undefined) expect(e?.error.param).toBe(param)
    }
    expectError(out.badKey, 401)
    expect(out.badKey?.error.code).toBe("invalid_api_key")
    expect(out.noKey.status).toBe(401)
    expect(out.noKey.body.error.code).toBe("missing_api_key")
    expectError(out.unknownModel, 404, "model")
    expectError(out.wrongType, 400, "max_tokens")
    expectError(out.badRole, 400, "messages[0].role")
    expectError(out.missingContent, 400, "messages[0].tool_call_id")
    expectError(out.tooLong, 400)
    expect(out.tooLong?.error.code).toBe("context_length_exceeded")
    expect(out.malformed.status).toBe(400)
    expect(out.malformed.body.error.code).toBe("invalid_json")
    expect(out.tooLarge.status).toBe(413)
    expect(out.unknownRoute.status).toBe(404)
    expect(out.wrongMethod.status).toBe(405)
    expect(out.wrongMethod.allow).toBe("POST")
    expectError(out.badTokenId, 400, "prompt")
  })

  it("answers 503 when no rollout worker is available", async () => {
    const out = await withSystem("gw-none", Effect.gen(function* () {
      const { baseUrl } = yield* serve({ checkpoint, workers: 0, gateway: { workerWaitMs: 300 } })
      return yield* promise(() =>
        clientOf(baseUrl)
          .chat.completions.create({ model: "gyre", messages: [{ role: "user", content: "anyone?" }] })
          .then(() => undefined, (e: InstanceType<typeof OpenAI.APIError>) => ({ status: e.status, error: e.error as Record<string, unknown> }))
      )
    }))
    expect(out?.status).toBe(503)
    expect(out?.error.code).toBe("no_worker_available")
    expect(out?.error.type).toBe("server_error")
  })

  it("cancels the generation of a client that went away, and records it as cancelled", async () => {
    const out = await withSystem("gw-gone", Effect.gen(function* () {
      const system = yield* ActorSystem
      const { baseUrl, execution } = yield* serve({ checkpoint, workers: 1 })
      const worker = refOf(RolloutWorkerProtocol, address("rollout-worker", "a.cpu0"))
      const abort = new AbortController()
      const request = clientOf(baseUrl)
        .chat.completions.create(
          { model: "gyre", messages: [{ role: "user", content: "Never stop." }], max_tokens: 5000, ignore_eos: true } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming,
          { signal: abort.signal }
        )
        .then(() => "answered", () => "aborted")
      while ((yield* system.ask(worker, "Status", undefined)).activeSequences === 0) yield* Effect.sleep("20 millis")
      yield* Effect.sleep("200 millis")
      abort.abort()
      const client = yield* promise(() => request)
      const [record] = yield* readRecords(execution, 1)
      return { client, record: record!, status: yield* system.ask(worker, "Status", undefined) }
    }))
    expect(out.client).toBe("aborted")
    expect(out.record.finishReason).toBe("cancelled")
    expect(out.record.outputLength).toBeGreaterThan(0)
    expect(out.record.outputLength).toBeLessThan(5000)
    expect(out.status.activeSequences).toBe(0)
  })

  it("keeps the event loop and the worker's heartbeat going while it generates; closing the execution revokes the key and frees the cache", async () => {
    const out = await withSystem("gw-loop", Effect.gen(function* () {
      const system = yield* ActorSystem
      const { baseUrl, execution } = yield* serve({ checkpoint, workers: 1 })
      const client = clientOf(baseUrl)
      const key = system.layout.registryKey(address("rollout-worker", "a.cpu0"))
      const beats = new Set<number>()
      const watch = setInterval(() => {
        system.registry.get(key).then((e) => e && beats.add((e.json() as { heartbeatAt: number }).heartbeatAt), () => undefined)
      }, 100)
      let last = performance.now()
      let worstGap = 0
      const tick = setInterval(() => {
        const now = performance.now()
        worstGap = Math.max(worstGap, now - last)
        last = now
      }, 10)
      const started = performance.now()
      const long = yield* promise(() =>
        client.chat.completions.create({ model: "gyre", messages: [{ role: "user", content: "Talk at length." }], max_tokens: 1000, ignore_eos: true } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming)
      )
      const elapsed = performance.now() - started
      clearInterval(tick)
      clearInterval(watch)
      const worker = refOf(RolloutWorkerProtocol, address("rollout-worker", "a.cpu0"))
      const before = yield* system.ask(worker, "Status", undefined)
      const closed = yield* system.ask(gatewayRef, "CloseExecution", { execution })
      const after = yield* system.ask(worker, "Status", undefined)
      const revoked = yield* promise(() =>
        client.chat.completions.create({ model: "gyre", messages: [{ role: "user", content: "again" }] }).then(() => 200, (e: InstanceType<typeof OpenAI.APIError>) => e.status)
      )
      const unknown = yield* Effect.flip(system.ask(gatewayRef, "CloseExecution", { execution }))
      return { long, elapsed, worstGap, beats: beats.size, before, after, closed, revoked, unknown }
    }))
    expect(out.long.usage!.completion_tokens).toBe(1000)
    expect(out.worstGap).toBeLessThan(250)
    // the worker beats every 250 ms while it generates (at least every other beat seen)
    expect(out.beats).toBeGreaterThanOrEqual(Math.floor(out.elapsed / 500))
    expect(out.before.cachedExecutions).toBe(1)
    expect(out.closed.calls).toBe(1)
    expect(out.after.cachedExecutions).toBe(0)
    expect(out.after.usedBlocks).toBe(0)
    expect(out.revoked).toBe(401)
    expect(out.unknown._tag).toBe("UnknownExecution")
  })

  it("frees at its destination a context moved for an execution it has closed (it ended while its device left rollout)", async () => {
    const out = await withSystem("gw-orphan", Effect.gen(function* () {
      const system = yield* ActorSystem
      const { execution } = yield* serve({ checkpoint, workers: 1 })
      const worker = refOf(RolloutWorkerProtocol, address("rollout-worker", "a.cpu0"))
      const sampling = { maxTokens: 4, temperature: 0, topP: 1, seed: 1, stop: [] }
      const generate = (x: string, request: string) =>
        system.ask(worker, "Generate", { execution: x, request, base: null, prompt: Int32Array.from([special.bos, 72, 105]), sampling, stream: false })
      // Contexts on the worker the gateway has no open execution for (as a hand-off leaves them),
      // and one of the open execution.
      yield* generate("closed-x", "req-closed")
      yield* generate(execution, "req-open")
      const before = yield* system.ask(worker, "Status", undefined)
      const moves = [
        { execution: "closed-x", request: "req-closed", tokens: 7 },
        { execution, request: "req-open", tokens: 7 }
      ]
      const answer = yield* system.ask(gatewayRef, "ContextsMoved", { from: "device/elsewhere", to: "rollout-worker/a.cpu0", moves })
      const after = yield* system.ask(worker, "Status", undefined)
      return { before, answer, after }
    }))
    expect(out.before.cachedExecutions).toBe(2)
    // The open execution's route was not on `from`: not routed, and its context stays.
    expect(out.answer.routed).toBe(0)
    expect(out.after.cachedExecutions).toBe(1)
  })
})
