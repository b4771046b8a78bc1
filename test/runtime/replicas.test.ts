/**
 * `GYRE_REPLICAS`: the replicas of every stream, KV bucket and object store the runtime creates.
 * On one server and with the variable unset they are all R1; a wrong value is refused when the
 * Nats layer is built, naming the variable. (R3 on a 3-server cluster: test/chaos/cluster.test.ts.)
 */
import type { JetStreamManager } from "@nats-io/jetstream"
import { ConfigProvider, Effect, Exit, Layer } from "effect"
import { describe, expect, it } from "vitest"
import { publishWeights } from "../../src/protocols/weights.ts"
import { ensureTrajectoryStream, rlLayout } from "../../src/protocols/layout.ts"
import { openTransferStore } from "../../src/protocols/transfer.ts"
import { openGradientStore } from "../../src/training/gradients.ts"
import { ensureMicroBatchStream } from "../../src/training/microbatch-queue.ts"
import { layout } from "../../src/runtime/names.ts"
import { Nats, NatsSettings } from "../../src/runtime/nats.ts"
import { startEmbeddedServer } from "../../src/runtime/nats-server.ts"
import { ActorSystem } from "../../src/runtime/system.ts"
import { startNodeProcess } from "./harness.ts"

const RUN = "replicas"

/** `env` as the only configuration source. */
const envOf = (env: Record<string, string>) => ConfigProvider.layer(ConfigProvider.fromEnvRecord(env))

/** Every stream on the server, by name, with its replicas. */
const replicasOf = async (jsm: JetStreamManager) => {
  const out: Record<string, number> = {}
  for await (const si of jsm.streams.list()) out[si.config.name] = si.config.num_replicas
  return out
}

const settingsOf = Effect.gen(function* () {
  return yield* NatsSettings
})

describe("GYRE_REPLICAS", () => {
  it("unset on one server: every stream, bucket and object store of a run is R1", { timeout: 60_000 }, async () => {
    const replicas = await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const server = yield* startEmbeddedServer({})
          return yield* Effect.gen(function* () {
            const system = yield* ActorSystem
            yield* ensureTrajectoryStream(system)
            yield* ensureMicroBatchStream(system)
            yield* openGradientStore(system, 4)
            yield* openTransferStore(system)
            yield* publishWeights(system, 1, new Uint8Array([1, 2, 3]))
            return { setting: system.nats.replicas, streams: yield* Effect.promise(() => replicasOf(system.nats.jsm)) }
          }).pipe(Effect.provide(ActorSystem.layer({ run: RUN }).pipe(Layer.provideMerge(Nats.layer({ url: server.url })))))
        })
      ).pipe(Effect.provide(envOf({})))
    )
    const names = layout(RUN)
    const rl = rlLayout(RUN)
    expect(replicas.setting).toBe(1)
    expect(replicas.streams).toEqual({
      [names.journalStream]: 1,
      [names.deadStream]: 1,
      [`KV_${names.registryBucket}`]: 1,
      [`KV_${names.stateBucket}`]: 1,
      [rl.trajectoryStream]: 1,
      [rl.microBatchStream]: 1,
      [`OBJ_${rl.gradsBucket}`]: 1,
      [`OBJ_${rl.kvBucket}`]: 1,
      [`OBJ_${rl.weightsBucket}`]: 1
    })
  })

  it("a value outside 1..5 or not an integer is refused when the Nats layer is built, naming the variable", async () => {
    for (const value of ["0", "6", "x", "2.5"]) {
      const exit = await Effect.runPromiseExit(Effect.scoped(Layer.build(Nats.layer({ url: "nats://127.0.0.1:1" }))).pipe(Effect.provide(envOf({ GYRE_REPLICAS: value }))))
      expect(Exit.isFailure(exit), value).toBe(true)
      expect(String(exit), value).toMatch(/GYRE_REPLICAS/)
      expect(String(exit), value).toMatch(/an integer from 1 to 5/)
      // The same from the settings every command reads (natsOptionsFromEnv).
      const settings = String(await Effect.runPromiseExit(Effect.provide(settingsOf, envOf({ GYRE_REPLICAS: value }))))
      expect(settings, value).toMatch(/GYRE_REPLICAS/)
      expect(settings, value).toMatch(/an integer from 1 to 5/)
    }
    // The values it takes, and the default (empty counts as unset).
    for (const [value, want] of [["1", 1], ["3", 3], ["5", 5], ["", 1]] as const) {
      const settings = await Effect.runPromise(Effect.provide(settingsOf, envOf({ GYRE_REPLICAS: value })))
      expect(settings.replicas, value).toBe(want)
    }
  })

  it("GYRE_REPLICAS=3 against one external server: JetStream refuses the journal, the error names the setting", { timeout: 60_000 }, async () => {
    const exit = await Effect.runPromiseExit(
      Effect.scoped(
        Effect.gen(function* () {
          const server = yield* startEmbeddedServer({})
          return yield* Layer.build(ActorSystem.layer({ run: RUN }).pipe(Layer.provideMerge(Nats.layer({ url: server.url }))))
        })
      ).pipe(Effect.provide(envOf({ GYRE_REPLICAS: "3" })))
    )
    expect(String(exit)).toMatch(/create stream GYRE_replicas_JOURNAL|non-clustered/)
    expect(String(exit)).toMatch(/GYRE_REPLICAS=3: needs a JetStream cluster of at least 3 servers/)
  })

  it("more than one replica on the embedded (single) server is refused before it starts", async () => {
    const exit = await Effect.runPromiseExit(Effect.scoped(Layer.build(Nats.layer({ replicas: 3 }))))
    expect(String(exit)).toMatch(/GYRE_REPLICAS=3 needs a JetStream cluster of at least 3 servers/)
  })

  it("gyre node with GYRE_REPLICAS=x exits non-zero with a line naming it", { timeout: 60_000 }, async () => {
    const node = startNodeProcess("nats://127.0.0.1:1", ["--name", "bad", "--run", RUN], { GYRE_REPLICAS: "x" })
    const code = await node.exited
    expect(code).not.toBe(0)
    expect(node.stderr()).toMatch(/GYRE_REPLICAS/)
  })
})
