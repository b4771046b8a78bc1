/**
 * `gyre serve`: an OpenAI-compatible endpoint for a Gyre checkpoint, every call recorded.
 *
 * The embedded default: a private nats-server (its store in `--store`, else a temporary
 * directory removed at exit; or NATS_URL), one node hosting `--devices`
 * rollout workers (`rollout-worker/<node>.<backend><i>`, worker i on engine device i modulo the
 * device count) and the gateway on `--port`. It
 * opens one execution, prints the base URL, the API key and where the call records go, then
 * a JSON line `{"event":"ready",...}`, and serves until SIGINT or SIGTERM, on which it drains
 * (calls in flight finish) and prints `{"event":"drained"}`.
 */
import { existsSync } from "node:fs"
import { join } from "node:path"
import { nuid } from "@nats-io/transport-node"
import { Deferred, Effect, Layer } from "effect"
import { gateway } from "../actors/gateway.ts"
import { GatewayProtocol } from "../protocols/gateway.ts"
import { rlLayout } from "../protocols/layout.ts"
import { rolloutWorker } from "../actors/rollout-worker.ts"
import { workerDevice } from "../serving/rollout-role.ts"
import { CONFIG_FILE, MODEL_FILE } from "../engine/checkpoint.ts"
import { loadNative } from "../engine/native.ts"
import { Nats, natsOptionsFromEnv } from "../runtime/nats.ts"
import { address } from "../runtime/names.ts"
import { startNode } from "../runtime/node.ts"
import { ActorSystem, refOf } from "../runtime/system.ts"
import { UsageError, parseConfigured, type Command } from "./args.ts"

const flags = {
  checkpoint: { kind: "string", doc: "checkpoint directory (config.json, model.safetensors)", required: true },
  port: { kind: "integer", doc: "HTTP port of the OpenAI API (0: any free port)", default: 8000 },
  host: { kind: "string", doc: "interface the HTTP server listens on", default: "127.0.0.1" },
  devices: { kind: "integer", doc: "rollout workers; worker i runs on device i mod the device count", default: 1 },
  model: { kind: "string", doc: "model id served", default: "gyre" },
  run: { kind: "string", doc: "run id (names the streams the calls are recorded on)", default: `serve-${Date.now().toString(36)}` },
  node: { kind: "string", doc: "node name", default: "serve" },
  store: { kind: "string", doc: "JetStream store directory of the embedded nats-server (keeps the records; default: a temporary one)" },
  "kv-blocks": { kind: "integer", doc: "KV-cache blocks of 16 tokens per worker", default: 4096 },
  "max-batch": { kind: "integer", doc: "generations batched at once per worker", default: 32 },
  "max-tokens": { kind: "integer", doc: "max_tokens of requests that give none", default: 512 }
} as const

export const command: Command<typeof flags> = {
  summary: "serve a checkpoint as an OpenAI-compatible endpoint, recording every call",
  configured: true,
  flags,
  run: async (argv) => {
    const f = parseConfigured("serve", flags, argv)
    for (const file of [CONFIG_FILE, MODEL_FILE]) {
      if (!existsSync(join(f.checkpoint, file))) throw new UsageError(`gyre serve: --checkpoint ${f.checkpoint} has no ${file}`)
    }
    if (f.devices < 1) throw new UsageError("gyre serve: --devices must be at least 1")
    const env = natsOptionsFromEnv("gyre-serve")
    const storeDir = f.store ?? env.storeDir
    const program = Effect.gen(function* () {
      const system = yield* ActorSystem
      const { backend, devices } = yield* loadNative()
      const workers = Array.from({ length: f.devices }, (_, i) => `${f.node}.${backend}${i}`)
      const node = yield* startNode({
        name: f.node,
        types: [
          rolloutWorker({ checkpoint: f.checkpoint, numBlocks: f["kv-blocks"], maxBatch: f["max-batch"] }),
          gateway({ host: f.host, port: f.port, model: f.model, defaultMaxTokens: f["max-tokens"] })
        ]
      })
      for (const id of workers) yield* node.spawn("rollout-worker", id) // each on workerDevice(id): i mod devices
      yield* node.spawn("gateway", "main")
      const key = `gyre-${nuid.next()}${nuid.next()}`
      const execution = `serve-${nuid.next()}`
      const { baseUrl } = yield* system.ask(refOf(GatewayProtocol, address("gateway", "main")), "OpenExecution", {
        key,
        task: "serve",
        execution,
        defaultRole: "main"
      })
      const names = rlLayout(system.run)
      console.log(`OpenAI base URL: ${baseUrl}`)
      console.log(`API key:         ${key}`)
      const onDevices = workers.map((id) => workerDevice(id, devices.length)).join(", ")
      console.log(`model:           ${f.model} (${f.checkpoint}, ${f.devices} ${backend} worker${f.devices === 1 ? "" : "s"} on device${f.devices === 1 ? "" : "s"} ${onDevices})`)
      const where = system.nats.embedded ? (storeDir === undefined ? " (temporary store: --store DIR keeps them)" : ` (store ${storeDir})`) : ""
      console.log(`call records:    stream ${names.trajectoryStream}, subject ${names.calls(execution)} on ${system.nats.servers}${where}`)
      console.log(JSON.stringify({ event: "ready", baseUrl, key, model: f.model, run: system.run, execution, nats: system.nats.servers, records: names.calls(execution) }))
      const stop = yield* Deferred.make<void>()
      const onSignal = () => Effect.runFork(Deferred.succeed(stop, undefined))
      process.once("SIGTERM", onSignal)
      process.once("SIGINT", onSignal)
      yield* Deferred.await(stop)
      yield* node.drain
      console.log(JSON.stringify({ event: "drained" }))
    })
    const layer = ActorSystem.layer({ run: f.run }).pipe(Layer.provideMerge(Nats.layer({ ...env, storeDir })))
    await Effect.runPromise(Effect.scoped(program).pipe(Effect.provide(layer)))
    return 0
  }
}
