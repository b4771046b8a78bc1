/**
 * A context of 300,000 tokens through the real gateway and a device (a one-layer model with the
 * tiny preset's vocabulary and 327,680 positions, F16 KV pool of as many tokens, CPU engine, a nats-server with the default
 * 1 MiB `max_payload`, real HTTP): the device holds the context (imported, not prefilled: its
 * K/V would take a CPU ~T^2), the harness sends the whole 300,010-token prompt (1.2 MB of int32,
 * more than one message can carry) and the gateway hands it to the device through the run's
 * transfer store; the device prefills only the new suffix, the next call sends only its delta,
 * no NATS message of the whole exchange is larger than `max_payload` (the first call's record goes in
 * parts, which the trajectory reader joins back).
 */
import { Effect, Layer, Logger } from "effect"
import OpenAI from "openai"
import { describe, expect, it } from "vitest"
import { device } from "../../src/actors/device.ts"
import { gateway } from "../../src/actors/gateway.ts"
import { Engine } from "../../src/engine/engine.ts"
import { special } from "../../src/engine/tokenizer.ts"
import { DeviceProtocol } from "../../src/protocols/device.ts"
import { GatewayProtocol, apiKeyDigest } from "../../src/protocols/gateway.ts"
import { rlLayout } from "../../src/protocols/layout.ts"
import { readExecution } from "../../src/protocols/trajectories.ts"
import { bytesOf, openTransferStore, putParts } from "../../src/protocols/transfer.ts"
import { address } from "../../src/runtime/names.ts"
import { startNode } from "../../src/runtime/node.ts"
import { ActorSystem, refOf } from "../../src/runtime/system.ts"
import { withSystem } from "../runtime/harness.ts"
import { KEY, craftedKv, gatewayRef, microLong, tempDir, writeCheckpoint } from "./fixtures.ts"

const LENGTH = 300_000
const config = microLong(327_680)
const checkpoint = await writeCheckpoint(tempDir("gyre-long-"), 13, 0.2, config)

/** `n` letters of a fixed pseudo-random text (one byte-level token each). */
const textOf = (n: number) => {
  let x = 7
  return Array.from({ length: n }, () => {
    x = (x * 1103515245 + 12345) & 0x7fffffff
    return String.fromCharCode(97 + (x % 26))
  }).join("")
}

describe("a long context", () => {
  it("serves a 300k-token prompt that a device holds: the gateway sends it through the transfer store, the device prefills only the new tokens, no message exceeds max_payload", async () => {
    const text = textOf(LENGTH - 1)
    const tokens = Int32Array.from([special.bos, ...Buffer.from(text)])
    const kv = await craftedKv(config, LENGTH, 3)
    const out = await withSystem("long-ctx", Effect.gen(function* () {
      const system = yield* ActorSystem
      const node = yield* startNode({
        name: "a",
        types: [device({ checkpoint, numBlocks: 20_480, kvDtype: "f16", maxBatch: 4 }), gateway({})],
        heartbeatMs: 250
      })
      yield* node.spawn("device", "a.0")
      yield* node.spawn("gateway", "main")
      const { baseUrl } = yield* system.ask(gatewayRef, "OpenExecution", { keyDigest: apiKeyDigest(KEY), task: "t", execution: "x", defaultRole: "main" })
      // the device holds the 300k-token context of execution x (a hand-off's import)
      const store = yield* openTransferStore(system)
      const object = yield* putParts(store, "h.long", [bytesOf(tokens), kv])
      const imported = yield* system.ask(
        refOf(DeviceProtocol, address("device", "a.0")),
        "ImportContexts",
        { from: "test", contexts: [{ execution: "x", request: "r0", object: object.name, length: LENGTH, kvLength: LENGTH, inFlight: false }] },
        { timeoutMs: 120_000 }
      )
      // every message of the calls, from here on
      let largest = 0
      let recordMessages = 0
      const watch = system.nats.nc.subscribe(">", {
        callback: (_e, m) => {
          largest = Math.max(largest, m.data.length)
          if (m.subject === rlLayout(system.run).calls("x")) recordMessages++
        }
      })
      yield* Effect.sleep("600 millis") // the gateway sees the device's registry entry
      const client = new OpenAI({ baseURL: baseUrl, apiKey: KEY, maxRetries: 0, timeout: 300_000 })
      const first = yield* Effect.promise(() => client.completions.create({ model: "gyre", prompt: `${text} and then?`, max_tokens: 8, temperature: 0, ...{ ignore_eos: true } }))
      // a branch from the first prompt: it starts from the K/V of every token it shares with the first call
      const second = yield* Effect.promise(() => client.completions.create({ model: "gyre", prompt: `${text} and then? Go on.`, max_tokens: 8, temperature: 0, ...{ ignore_eos: true } }))
      const status = yield* system.ask(refOf(GatewayProtocol, address("gateway", "main")), "Status", undefined)
      watch.unsubscribe()
      const records = yield* readExecution(system, "x")
      const tree = records.trajectory.decoder.tree
      return { imported, first, second, totals: status.totals, largest, recordMessages, malformed: records.malformed, rejected: records.trajectory.rejected, sequences: Array.from({ length: tree.callCount }, (_, i) => tree.callSequence(i).length) }
    }).pipe(Effect.provide(Layer.merge(Engine.layer, Logger.layer([])))))
    expect(out.imported).toEqual({ imported: 1, failed: [] })
    const usage = (r: OpenAI.Completions.Completion) => [r.usage!.prompt_tokens, r.usage!.prompt_tokens_details?.cached_tokens, r.usage!.completion_tokens]
    const firstPrompt = LENGTH + " and then?".length
    expect(usage(out.first)).toEqual([firstPrompt, LENGTH, 8])
    // the second prompt shares the first's, and any first characters of its answer (a prefix fork)
    const answer = out.first.choices[0]!.text
    let shared = 0
    while (shared < " Go on.".length - 1 && answer[shared] === " Go on."[shared]) shared++ // the last prompt token goes through the model
    expect(usage(out.second)).toEqual([firstPrompt + " Go on.".length, firstPrompt + shared, 8])
    expect(out.totals.promptTokens).toBe(out.first.usage!.prompt_tokens + out.second.usage!.prompt_tokens)
    expect([out.totals.reprefillTokens, out.totals.fullResends]).toEqual([0, 0])
    expect(out.largest).toBeGreaterThan(64 * 1024) // the watch saw the object chunks
    expect(out.largest).toBeLessThanOrEqual(1024 * 1024)
    // the first call's record (a 300k-token suffix, 1.6 MB of JSON) went in parts of at most 60 KiB,
    // the second as one delta; the trajectory reader joined them back into the tree
    expect(out.recordMessages).toBeGreaterThan(20)
    expect([out.malformed, out.rejected]).toEqual([[], []])
    expect(out.sequences).toEqual([firstPrompt + 8, firstPrompt + " Go on.".length + 8])
  }, 180_000)
})
