/**
 * A full KV pool through the real gateway and worker (tiny preset, CPU engine, real NATS and HTTP,
 * the official `openai` client): several executions whose contexts together exceed a pool of a few
 * blocks are all served, every call, with the very tokens a roomy pool gives them (cached contexts
 * evicted least recently used, generations preempted and resumed, evicted executions prefilled
 * again from the gateway's tokens and counted as `reprefillTokens`); a prompt over the whole pool
 * is a 400 naming `--kv-blocks`. The small-pool run sends every prompt and answer through the
 * run's transfer store (`inlineTokens` 8), so that path is checked token for token too.
 */
import { Effect } from "effect"
import OpenAI from "openai"
import { describe, expect, it } from "vitest"
import { RolloutWorkerProtocol, type WorkerLoad } from "../../src/protocols/rollout.ts"
import { GatewayProtocol, apiKeyDigest } from "../../src/protocols/gateway.ts"
import { address } from "../../src/runtime/names.ts"
import { ActorSystem, refOf } from "../../src/runtime/system.ts"
import { withSystem } from "../runtime/harness.ts"
import { KEY, gatewayRef, serve, tempDir, writeCheckpoint } from "./fixtures.ts"

const checkpoint = await writeCheckpoint(tempDir("gyre-kv-pool-"), 9)

const EXECUTIONS = 4
const CALLS = 3
const keyOf = (i: number) => `kv-pool-key-${i}-0123456789abcdef`

interface Run {
  readonly outputs: ReadonlyArray<ReadonlyArray<string>>
  readonly statuses: ReadonlyArray<number>
  readonly completions: ReadonlyArray<number>
  readonly worker: WorkerLoad
  readonly totals: { readonly promptTokens: number; readonly cachedTokens: number; readonly reprefillTokens: number; readonly fullResends: number }
  readonly overPool: { readonly status: number; readonly code: unknown; readonly message: unknown } | undefined
}

/** A chat call of 24 tokens (vLLM's `ignore_eos`: no early end) with a fixed seed. */
const chatRequest = (messages: Array<OpenAI.Chat.Completions.ChatCompletionMessageParam>, seed: number) =>
  ({ model: "gyre", messages, max_tokens: 24, temperature: 0.9, seed, ignore_eos: true }) as OpenAI.Chat.Completions.ChatCompletionCreateParamsNonStreaming

/** `EXECUTIONS` agent loops of `CALLS` chained calls each, the executions' calls of one round at once. */
const agentLoops = (numBlocks: number, inlineTokens?: number) =>
  withSystem(`kv-pool-${numBlocks}`, Effect.gen(function* () {
    const system = yield* ActorSystem
    const { baseUrl } = yield* serve({
      checkpoint,
      workers: 1,
      execution: "x0",
      worker: { numBlocks, maxBatch: 4, contextsPerExecution: 4, ...(inlineTokens === undefined ? {} : { inlineTokens }) },
      gateway: inlineTokens === undefined ? {} : { inlineTokens }
    })
    for (let i = 1; i < EXECUTIONS; i++) {
      yield* system.ask(gatewayRef, "OpenExecution", { keyDigest: apiKeyDigest(keyOf(i)), task: "t", execution: `x${i}`, defaultRole: "main" })
    }
    // serve() opened x0 under fixtures' KEY; the others under their own keys
    const clients = Array.from({ length: EXECUTIONS }, (_, i) => new OpenAI({ baseURL: baseUrl, apiKey: i === 0 ? KEY : keyOf(i), maxRetries: 0, timeout: 120_000 }))
    const histories = clients.map((_, i): Array<OpenAI.Chat.Completions.ChatCompletionMessageParam> => [
      { role: "system", content: `You are agent ${i}. Work through the task step by step.` },
      { role: "user", content: `Task ${i}: list the files.` }
    ])
    const outputs: Array<Array<string>> = clients.map(() => [])
    const statuses: Array<number> = []
    const completions: Array<number> = []
    for (let round = 0; round < CALLS; round++) {
      const answers = yield* Effect.promise(() =>
        Promise.all(clients.map((c, i) => c.chat.completions.create(chatRequest(histories[i]!, 100 * i + round)).then((r) => ({ r, status: 200 }), (e: { status?: number }) => ({ r: undefined, status: e.status ?? 0 }))))
      )
      answers.forEach(({ r, status }, i) => {
        statuses.push(status)
        completions.push(r?.usage?.completion_tokens ?? 0)
        const text = r?.choices[0]?.message.content ?? ""
        outputs[i]!.push(text)
        histories[i]!.push({ role: "assistant", content: text }, { role: "user", content: `Output of step ${round}: ${"ok ".repeat(8)}` })
      })
    }
    // A prompt longer than the whole pool (positions allow 8192): refused, naming the flag.
    const over = numBlocks * 16 < 4000
      ? yield* Effect.promise(() =>
          clients[0]!.completions.create({ model: "gyre", prompt: "y".repeat(numBlocks * 16 + 10), max_tokens: 2 }).then(
            () => ({ status: 200, code: undefined, message: undefined }),
            (e: { status?: number; code?: unknown; error?: { message?: unknown } }) => ({ status: e.status ?? 0, code: e.code, message: e.error?.message })
          )
        )
      : undefined
    const worker = yield* system.ask(refOf(RolloutWorkerProtocol, address("rollout-worker", "a.cpu0")), "Status", undefined)
    const status = yield* system.ask(refOf(GatewayProtocol, address("gateway", "main")), "Status", undefined)
    return { outputs, statuses, completions, worker, totals: status.totals, overPool: over } satisfies Run
  }))

describe("a full KV pool", () => {
  it("serves every call of executions that do not fit together, with the tokens of a roomy pool, counting what it prefills again", async () => {
    const roomy = await agentLoops(1024)
    // 24 blocks (384 tokens): each execution's context grows to ~250 tokens, four of them run at once
    const small = await agentLoops(24, 8)
    expect(small.statuses).toEqual(new Array(EXECUTIONS * CALLS).fill(200))
    expect(roomy.statuses).toEqual(new Array(EXECUTIONS * CALLS).fill(200))
    expect(small.outputs).toEqual(roomy.outputs)
    expect(small.completions).toEqual(new Array(EXECUTIONS * CALLS).fill(24))
    // the roomy pool evicted only what each execution's budget of 4 contexts pushed out (each call
    // leaves two: its prompt and its whole sequence), older prefixes of the latest: nothing prefilled again
    const budgetEvictions = EXECUTIONS * (2 * CALLS - 4)
    expect([roomy.worker.evictedContexts, roomy.worker.preemptions, roomy.totals.reprefillTokens, roomy.totals.fullResends]).toEqual([budgetEvictions, 0, 0, 0])
    // the small one evicted for room, prefilled again from the gateway's full prompts, and counted it the same on both sides
    expect(small.worker.evictedContexts).toBeGreaterThan(budgetEvictions)
    expect(small.worker.preemptions).toBeGreaterThan(0)
    expect(small.totals.fullResends).toBeGreaterThan(0)
    expect(small.totals.reprefillTokens).toBeGreaterThan(0)
    expect(small.totals.reprefillTokens).toBe(small.worker.reprefillTokens)
    expect(small.totals.promptTokens).toBe(roomy.totals.promptTokens)
    expect(small.totals.cachedTokens).toBeLessThan(roomy.totals.cachedTokens)
    expect(small.worker.promptTokens).toBe(small.totals.promptTokens)
    expect(small.overPool?.status).toBe(400)
    expect(small.overPool?.code).toBe("context_length_exceeded")
    expect(small.overPool?.message).toMatch(/maximum context length is 384 tokens\. However, your request has 395 prompt tokens\. The limit is the rollout devices' KV pool \(24 blocks of 16 tokens\); --kv-blocks raises it/)
  }, 120_000)
})
