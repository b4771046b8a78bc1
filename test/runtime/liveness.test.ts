/**
 * Liveness judges others only while the monitor can see its own node beat: when its own entry
 * looks silent (every registry write failing for seconds, as while a cluster's registry stream
 * elects a new leader after a server's loss; found by test/chaos/cluster.test.ts, where the main
 * node then declared itself and every other node dead and the run stalled for good), nobody is
 * declared dead, and silence is counted again from its own next beat. The view is driven by
 * hand here (the entries' revisions are the registry's, so a death mark lands).
 */
import { Duration, Effect, Fiber } from "effect"
import { describe, expect, it } from "vitest"
import { encodeJson } from "../../src/runtime/protocol.ts"
import { monitorLiveness, type DeadEvent, type Observed, type RegistryEntry, type RegistryView } from "../../src/runtime/registry.ts"
import { ActorSystem, type ActorSystemShape } from "../../src/runtime/system.ts"
import { withSystem } from "./harness.ts"

const entryOf = (kind: string, id: string): RegistryEntry => ({ kind, id, node: id, incarnation: 1, status: "running", heartbeatAt: Date.now(), load: {} })

/** A view driven by hand: `beat` writes an entry to the registry and marks it seen now (its revision, for the death mark). */
const handView = (system: ActorSystemShape) => {
  const seen = new Map<string, Observed>()
  const beat = (key: string, entry: RegistryEntry) =>
    Effect.promise(() => system.registry.put(key, encodeJson(entry))).pipe(
      Effect.map((revision) => void seen.set(key, { entry, revision, at: performance.now() }))
    )
  const view: RegistryView = { get: (key) => seen.get(key), entries: () => seen.entries() }
  return { beat, view }
}

describe("liveness and the monitor's own sight", () => {
  it("declares no one dead while its own node looks silent too; counts silence again from its own next beat", { timeout: 30_000 }, async () => {
    const result = await withSystem("sight", Effect.gen(function* () {
      const system = yield* ActorSystem
      const { beat, view } = handView(system)
      const dead: Array<{ key: string; at: number }> = []
      yield* beat("node/self", entryOf("node", "self"))
      yield* beat("node/other", entryOf("node", "other"))
      const t0 = performance.now()
      yield* monitorLiveness(system, view, {
        deadAfterMs: 1000,
        self: "node/self",
        selfEveryMs: 100,
        checkEveryMs: 50,
        onDead: (e: DeadEvent) => Effect.sync(() => void dead.push({ key: `${e.kind}/${e.id}`, at: performance.now() - t0 }))
      })
      // Both silent for 2.5 s (no beat lands anywhere): nobody is declared dead.
      yield* Effect.sleep(Duration.millis(2500))
      const duringSilence = dead.length
      // Its own node beats again; the other stays silent: dead one dead-after later.
      const back = performance.now() - t0
      const selfBeats = yield* Effect.forkScoped(Effect.forever(beat("node/self", entryOf("node", "self")).pipe(Effect.andThen(Effect.sleep(Duration.millis(100))))))
      yield* Effect.sleep(Duration.millis(2000))
      yield* Fiber.interrupt(selfBeats)
      return { duringSilence, back, dead }
    }))
    expect(result.duringSilence).toBe(0)
    expect(result.dead.map((d) => d.key)).toEqual(["node/other"])
    // Silence counted from its own first beat after it looked silent, not from the other's last one.
    expect(result.dead[0]!.at - result.back).toBeGreaterThanOrEqual(900)
    expect(result.dead[0]!.at - result.back).toBeLessThan(1800)
  })

  it("declares a silent node dead after dead-after while its own node beats", { timeout: 30_000 }, async () => {
    const result = await withSystem("sight-ok", Effect.gen(function* () {
      const system = yield* ActorSystem
      const { beat, view } = handView(system)
      const dead: Array<number> = []
      yield* beat("node/self", entryOf("node", "self"))
      yield* beat("node/other", entryOf("node", "other"))
      const t0 = performance.now()
      yield* Effect.forkScoped(Effect.forever(beat("node/self", entryOf("node", "self")).pipe(Effect.andThen(Effect.sleep(Duration.millis(100))))))
      yield* monitorLiveness(system, view, {
        deadAfterMs: 1000,
        self: "node/self",
        selfEveryMs: 100,
        checkEveryMs: 50,
        onDead: () => Effect.sync(() => void dead.push(performance.now() - t0))
      })
      yield* Effect.sleep(Duration.millis(2000))
      return dead
    }))
    expect(result).toHaveLength(1)
    expect(result[0]).toBeGreaterThanOrEqual(950)
    expect(result[0]).toBeLessThan(1500)
  })
})
