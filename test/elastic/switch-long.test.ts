/**
 * The KV hand-off of a long context: a device leaving rollout moves an execution's 200,000-token
 * context to another device through the run's transfer store (one object: the tokens, then the
 * GYKV buffer, in chunks under `max_payload`; the `ImportContexts` ask names it), and the
 * destination continues the execution token for token as the source would have, with nothing
 * prefilled again. A one-layer model with the tiny preset's vocabulary and 262,144 positions
 * (`microLong`), CPU engine, real NATS with the default 1 MiB `max_payload`; the context's K/V is
 * imported, not prefilled (its values do not matter to a transfer, and continuations are exact
 * functions of them). Before, the ask alone carried the tokens inline: 1.07 MB at this length.
 */
import { Effect, Layer, Logger } from "effect"
import { describe, expect, it } from "vitest"
import { device } from "../../src/actors/device.ts"
import { gateway } from "../../src/actors/gateway.ts"
import { Engine } from "../../src/engine/engine.ts"
import { special } from "../../src/engine/tokenizer.ts"
import { DeviceProtocol } from "../../src/protocols/device.ts"
import { apiKeyDigest } from "../../src/protocols/gateway.ts"
import type { GenerateResult } from "../../src/protocols/rollout.ts"
import { bytesOf, openTransferStore, putParts } from "../../src/protocols/transfer.ts"
import { address } from "../../src/runtime/names.ts"
import { startNode } from "../../src/runtime/node.ts"
import { ActorSystem, refOf } from "../../src/runtime/system.ts"
import { digestOf } from "../../src/tree/hash.ts"
import { withSystem } from "../runtime/harness.ts"
import { craftedKv, gatewayRef, microLong, tempDir, writeCheckpoint } from "../rollout/fixtures.ts"

const LENGTH = 200_000
const config = microLong(262_144)
const checkpoint = await writeCheckpoint(tempDir("gyre-switch-long-"), 17, 0.2, config)
const source = refOf(DeviceProtocol, address("device", "a.0"))
const destination = refOf(DeviceProtocol, address("device", "a.1"))

const sampling = (seed: number) => ({ maxTokens: 6, temperature: 0.9, topP: 1, seed, stop: [] })
const suffix = (s: string) => Int32Array.from(Buffer.from(s))
const concat = (...xs: ReadonlyArray<ArrayLike<number>>) => Int32Array.from(xs.flatMap((x) => Array.from(x)))

describe("role switch with a long context", () => {
  it("hands a 200k-token context to the destination through the transfer store: the same continuation, nothing prefilled again, no message over max_payload", async () => {
    let x = 5
    const tokens = Int32Array.from({ length: LENGTH }, (_, i) => (i === 0 ? special.bos : 97 + ((x = (x * 1103515245 + 12345) & 0x7fffffff) % 26)))
    const kv = await craftedKv(config, LENGTH, 11)
    const out = await withSystem("switch-long", Effect.gen(function* () {
      const system = yield* ActorSystem
      const node = yield* startNode({
        name: "a",
        types: [device({ checkpoint, numBlocks: 32_768, kvDtype: "f16", maxBatch: 4 }), gateway({})],
        heartbeatMs: 250
      })
      for (const id of ["a.0", "a.1"]) yield* node.spawn("device", id)
      yield* node.spawn("gateway", "main")
      // x is open at the gateway (a moved context of a closed execution would be freed at its destination)
      yield* system.ask(gatewayRef, "OpenExecution", { keyDigest: apiKeyDigest("switch-long-key-0123456789"), task: "t", execution: "x", defaultRole: "main" })
      // the source holds the long context for two executions: x moves, y is the unmoved reference
      const store = yield* openTransferStore(system)
      const object = yield* putParts(store, "h.test", [bytesOf(tokens), kv])
      const imported = yield* system.ask(source, "ImportContexts", {
        from: "test",
        contexts: ["x", "y"].map((execution) => ({ execution, request: `${execution}0`, object: object.name, length: LENGTH, kvLength: LENGTH, inFlight: false }))
      }, { timeoutMs: 120_000 })
      const generate = (to: typeof source, execution: string, request: string, base: { tokens: Int32Array; request: string }, prompt: Int32Array, seed: number) =>
        system.ask(to, "Generate", {
          execution,
          request,
          base: { length: base.tokens.length, digest: digestOf(base.tokens), request: base.request },
          prompt,
          sampling: sampling(seed),
          stream: false
        }, { timeoutMs: 120_000 })
      const sequence = (base: Int32Array, prompt: Int32Array, r: GenerateResult) => concat(base, prompt, r.output)
      // two calls of each execution on the source, then the reference's third
      const calls: Record<string, Array<{ sequence: Int32Array; result: GenerateResult }>> = { x: [], y: [] }
      for (const execution of ["x", "y"]) {
        let base: { tokens: Int32Array; request: string } = { tokens, request: `${execution}0` }
        for (const [n, text] of [" Step one?", " Step two?"].entries()) {
          const request = `${execution}${n + 1}`
          const result = yield* generate(source, execution, request, base, suffix(text), n + 1)
          calls[execution]!.push({ sequence: sequence(base.tokens, suffix(text), result), result })
          base = { tokens: calls[execution]!.at(-1)!.sequence, request }
        }
      }
      const reference = yield* generate(source, "y", "y3", { tokens: calls.y![1]!.sequence, request: "y2" }, suffix(" Step three?"), 3)
      yield* system.ask(source, "Release", { execution: "y" })
      let largest = 0
      const watch = system.nats.nc.subscribe(">", { callback: (_e, m) => void (largest = Math.max(largest, m.data.length)) })
      const switched = yield* system.ask(source, "SwitchRole", { role: "training", destinations: ["device/a.1"] }, { timeoutMs: 120_000 })
      const moved = yield* generate(destination, "x", "x3", { tokens: calls.x![1]!.sequence, request: "x2" }, suffix(" Step three?"), 3)
      watch.unsubscribe()
      return { imported, calls, reference, switched, moved, largest, load: yield* system.ask(destination, "Status", undefined) }
    }).pipe(Effect.provide(Layer.merge(Engine.layer, Logger.layer([])))))
    expect(out.imported).toEqual({ imported: 2, failed: [] })
    // the imported context was used as is: only the suffix prefilled
    expect(out.calls.x![0]!.result.cachedTokens).toBe(LENGTH)
    expect(Array.from(out.calls.x![1]!.result.output)).toEqual(Array.from(out.calls.y![1]!.result.output))
    expect(out.switched).toMatchObject({ role: "training", contextsMoved: 1, generationsMoved: 0, reprefillTokens: 0 })
    expect(out.switched.bytesMoved).toBeGreaterThan(LENGTH * 16) // F16 K and V of one 8-wide head on one layer: 32 bytes a token
    // the destination continues x from the moved context exactly as the source continued y
    const movedSequence = out.calls.x![1]!.sequence
    expect(out.moved.cachedTokens).toBe(movedSequence.length - 1)
    expect(out.moved.worker).toBe("device/a.1")
    expect(Array.from(out.moved.output)).toEqual(Array.from(out.reference.output))
    expect(out.load.reprefillTokens).toBe(0)
    expect(out.largest).toBeGreaterThan(256 * 1024) // the watch saw the hand-off's chunks
    expect(out.largest).toBeLessThanOrEqual(1024 * 1024)
  }, 120_000)
})
