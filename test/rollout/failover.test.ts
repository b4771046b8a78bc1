/**
 * A rollout worker killed mid-request: a second node process hosts the worker the execution
 * is routed to (`gyre node --load src/actors/rollout-worker.ts`), it is SIGKILLed while it
 * streams an answer, and the client still gets the whole answer (one response, every token
 * once) because the gateway continues the generation on the worker left.
 */
import { Effect } from "effect"
import OpenAI from "openai"
import { afterEach, describe, expect, it } from "vitest"
import { RolloutWorkerProtocol } from "../../src/protocols/rollout.ts"
import { address } from "../../src/runtime/names.ts"
import { ActorSystem, refOf } from "../../src/runtime/system.ts"
import { startNodeProcess, withSystem, type NodeProcess } from "../runtime/harness.ts"
import { KEY, readRecords, serve, tempDir, writeCheckpoint } from "./fixtures.ts"

const checkpoint = await writeCheckpoint(tempDir("gyre-kill-"), 9)
const promise = <A>(f: () => Promise<A>) => Effect.promise(f)

const children: Array<NodeProcess> = []
afterEach(() => {
  for (const p of children.splice(0)) if (p.child.exitCode === null) p.child.kill("SIGKILL")
})

describe("worker failure", () => {
  it("a worker killed mid-request: the streaming client still gets its whole answer from another worker", async () => {
    const out = await withSystem("gw-kill", Effect.gen(function* () {
      const system = yield* ActorSystem
      const b = startNodeProcess(
        system.nats.servers,
        ["--name", "b", "--run", "gw-kill", "--load", "src/actors/rollout-worker.ts", "--spawn", "rollout-worker/b.cpu0", "--heartbeat-ms", "250"],
        { GYRE_CHECKPOINT: checkpoint }
      )
      children.push(b)
      yield* promise(() => b.waitFor("ready", 60_000))
      // This process: the gateway, and no worker yet, so the execution goes to b.
      const { node, baseUrl, execution } = yield* serve({ checkpoint, workers: 0, gateway: { workerDeadAfterMs: 1500 } })
      const client = new OpenAI({ baseURL: baseUrl, apiKey: KEY, maxRetries: 0 })
      const messages = [{ role: "user" as const, content: "Write a long story." }]
      const warm = yield* promise(() => client.chat.completions.create({ model: "gyre", messages, max_tokens: 4 }))
      yield* node.spawn("rollout-worker", "a.cpu0")

      const stream = yield* promise(() =>
        client.chat.completions.create({
          model: "gyre",
          messages: [...messages, { role: "assistant", content: warm.choices[0]!.message.content }, { role: "user", content: "Go on." }],
          max_tokens: 400,
          ignore_eos: true,
          seed: 3,
          logprobs: true,
          stream: true,
          stream_options: { include_usage: true }
        } as OpenAI.Chat.ChatCompletionCreateParamsStreaming)
      )
      const seen: Array<number> = []
      const finish: Array<string> = []
      let usage: OpenAI.CompletionUsage | undefined
      let seenAtKill = -1
      yield* promise(async () => {
        for await (const chunk of stream) {
          for (const choice of chunk.choices) {
            seen.push(...(choice.logprobs?.content ?? []).map((l) => l.logprob))
            if (choice.finish_reason !== null) finish.push(choice.finish_reason)
          }
          if (chunk.usage) usage = chunk.usage
          if (seenAtKill < 0 && seen.length >= 20) {
            seenAtKill = seen.length
            b.child.kill("SIGKILL")
          }
        }
      })
      const records = yield* readRecords(execution, 2)
      const survivor = yield* system.ask(refOf(RolloutWorkerProtocol, address("rollout-worker", "a.cpu0")), "Status", undefined)
      return { seen, finish, usage, seenAtKill, records, survivor, exit: yield* promise(() => b.exited) }
    }))
    expect(out.seenAtKill).toBeGreaterThanOrEqual(20)
    expect(out.exit).toBe(null) // killed by the signal
    expect(out.finish).toEqual(["length"])
    expect(out.usage!.completion_tokens).toBe(400)
    expect(out.seen.length).toBe(400)
    // the record holds every token once, with the log-probs the client saw
    const record = out.records[1]!
    expect(record.outputLength).toBe(400)
    expect(Array.from(record.logprobs)).toEqual(out.seen)
    expect(Array.from(record.versions)).toEqual(new Array(400).fill(0))
    // the continuation ran on the worker left, which now holds the execution's context
    expect(out.survivor.cachedExecutions).toBe(1)
  })
})
