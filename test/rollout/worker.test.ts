/**
 * The rollout-worker actor behind the gateway: weights of a new policy version from the
 * run's object store (every token records the version that sampled it), a drained worker
 * whose generation the gateway continues elsewhere without the client noticing, and the
 * full-prompt fallback when a worker no longer holds the execution's context.
 */
import { Objm } from "@nats-io/obj"
import { Effect, Fiber, Layer, Logger } from "effect"
import OpenAI from "openai"
import { describe, expect, it } from "vitest"
import { rlLayout } from "../../src/protocols/layout.ts"
import { RolloutWorkerProtocol } from "../../src/protocols/rollout.ts"
import { Engine } from "../../src/engine/engine.ts"
import { presets } from "../../src/engine/presets.ts"
import { address } from "../../src/runtime/names.ts"
import { ActorSystem, refOf } from "../../src/runtime/system.ts"
import { withSystem } from "../runtime/harness.ts"
import { KEY, readRecords, serve, tempDir, writeCheckpoint } from "./fixtures.ts"

const checkpoint = await writeCheckpoint(tempDir("gyre-worker-"), 21)
const promise = <A>(f: () => Promise<A>) => Effect.promise(f)
const worker = (id: string) => refOf(RolloutWorkerProtocol, address("rollout-worker", id))

/** The safetensors of another tiny model: the weights of "policy version 1". */
const otherWeights = () =>
  Effect.runPromise(
    Effect.gen(function* () {
      const model = yield* (yield* Engine).createModel(presets.tiny, { seed: 77, initStd: 0.2 })
      return yield* model.save()
    }).pipe(Effect.scoped, Effect.provide(Engine.layer.pipe(Layer.provide(Logger.layer([])))))
  )

describe("rollout worker actor", () => {
  it("loads a version's weights from the object store; a drained worker's generation continues on another, each token keeping its version", async () => {
    const weights = await otherWeights()
    const out = await withSystem("wk-drain", Effect.gen(function* () {
      const system = yield* ActorSystem
      const { baseUrl, execution } = yield* serve({ checkpoint, workers: 2 })
      const names = rlLayout(system.run)
      const store = yield* promise(() => new Objm(system.nats.nc).create(names.weightsBucket))
      yield* promise(() => store.putBlob({ name: names.weightsObject(1) }, weights))
      const loaded = yield* system.ask(worker("a.cpu1"), "LoadWeights", { version: 1 })
      // The version it holds is not read again: gone from the store, it still loads.
      yield* promise(() => store.delete(names.weightsObject(1)))
      const held = yield* system.ask(worker("a.cpu1"), "LoadWeights", { version: 1 })
      const missing = yield* Effect.flip(system.ask(worker("a.cpu1"), "LoadWeights", { version: 7 }))
      const client = new OpenAI({ baseURL: baseUrl, apiKey: KEY, maxRetries: 0 })
      const call = yield* Effect.forkChild(
        promise(() =>
          client.chat.completions.create({
            model: "gyre",
            messages: [{ role: "user", content: "Keep going." }],
            max_tokens: 500,
            ignore_eos: true,
            logprobs: true
          } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming)
        )
      )
      // find the worker generating, and drain it, cancelling its generation
      let busy: string | undefined
      while (busy === undefined) {
        yield* Effect.sleep("20 millis")
        for (const id of ["a.cpu0", "a.cpu1"]) if ((yield* system.ask(worker(id), "Status", undefined)).activeSequences > 0) busy = id
      }
      yield* Effect.sleep("100 millis")
      const drained = yield* system.ask(worker(busy), "Drain", { finish: false })
      const response = yield* Fiber.join(call)
      const [record] = yield* readRecords(execution, 1)
      const statuses = {
        busy: yield* system.ask(worker(busy), "Status", undefined),
        other: yield* system.ask(worker(busy === "a.cpu0" ? "a.cpu1" : "a.cpu0"), "Status", undefined)
      }
      return { loaded, held, missing, busy, drained, response, record: record!, statuses }
    }))
    expect(out.loaded.version).toBe(1)
    expect(out.held.version).toBe(1)
    expect(out.missing._tag).toBe("WeightsUnavailable")
    expect(out.drained.cancelled).toBe(1)
    expect(out.statuses.busy.draining).toBe(true)
    expect(out.response.usage!.completion_tokens).toBe(500)
    expect(out.response.choices[0]!.finish_reason).toBe("length")
    expect(out.record.outputLength).toBe(500)
    expect(Array.from(out.record.logprobs)).toEqual(out.response.choices[0]!.logprobs!.content!.map((l) => l.logprob))
    // versions: the drained worker's, then the other's
    const first = out.busy === "a.cpu1" ? 1 : 0
    const versions = Array.from(out.record.versions)
    const switchAt = versions.findIndex((v) => v !== first)
    expect(switchAt).toBeGreaterThan(0)
    expect(versions).toEqual([...new Array(switchAt).fill(first), ...new Array(500 - switchAt).fill(1 - first)])
    expect(out.statuses.other.version).toBe(1 - first)
  })

  it("falls back to the full prompt when the worker no longer holds the execution's context", async () => {
    const out = await withSystem("wk-miss", Effect.gen(function* () {
      const system = yield* ActorSystem
      const { baseUrl } = yield* serve({ checkpoint, workers: 1 })
      const client = new OpenAI({ baseURL: baseUrl, apiKey: KEY, maxRetries: 0 })
      const history = [{ role: "user" as const, content: "First question." }]
      const first = yield* promise(() => client.chat.completions.create({ model: "gyre", messages: history, max_tokens: 8 }))
      const next = [...history, { role: "assistant" as const, content: first.choices[0]!.message.content }, { role: "user" as const, content: "Second." }]
      const released = yield* system.ask(worker("a.cpu0"), "Release", { execution: "exec-1" })
      const second = yield* promise(() => client.chat.completions.create({ model: "gyre", messages: next, max_tokens: 8 }))
      const third = yield* promise(() =>
        client.chat.completions.create({ model: "gyre", messages: [...next, { role: "assistant", content: second.choices[0]!.message.content }, { role: "user", content: "Third." }], max_tokens: 8 })
      )
      return { first, released, second, third }
    }))
    expect(out.released.freedBlocks).toBeGreaterThan(0)
    expect(out.second.usage!.prompt_tokens_details!.cached_tokens).toBe(0)
    expect(out.third.usage!.prompt_tokens_details!.cached_tokens).toBe(out.second.usage!.prompt_tokens + out.second.usage!.completion_tokens - 1)
  })
})
