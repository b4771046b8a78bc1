/**
 * `gyre serve`: an OpenAI- and Anthropic-compatible endpoint for a Gyre checkpoint (Chat
 * Completions, Responses, Messages), every call recorded.
 *
 * The embedded default: a private, supervised nats-server (its store in `--store`, else
 * `.gyre/nats/<run>.<node>`, kept across restarts; users from `.gyre/auth`, see `auth.ts`; or
 * NATS_URL), one node hosting `--devices`
 * rollout workers (`rollout-worker/<node>.<backend><i>`, worker i on engine device i modulo the
 * device count) and the gateway on `--port`. It
 * opens one execution, prints the base URLs (OpenAI's, and Anthropic's without `/v1`), the API
 * key and where the call records go, then
 * a JSON line `{"event":"ready",...}`, and serves until SIGINT or SIGTERM, on which it drains
 * (calls in flight finish) and prints `{"event":"drained"}`; it exits 1 with the reason when
 * NATS stays unreachable (`lifetime.ts`).
 */
import { nuid } from "@nats-io/transport-node"
import { Effect, Layer } from "effect"
import { gateway } from "../actors/gateway.ts"
import { GatewayProtocol, apiKeyDigest, newApiKey } from "../protocols/gateway.ts"
import { rlLayout } from "../protocols/layout.ts"
import { rolloutWorker } from "../actors/rollout-worker.ts"
import { workerDevice } from "../serving/rollout-role.ts"
import { readConfig } from "../engine/checkpoint.ts"
import { Engine } from "../engine/engine.ts"
import { anthropicBaseUrl } from "../harness/environment.ts"
import { Nats } from "../runtime/nats.ts"
import { address } from "../runtime/names.ts"
import { startNode } from "../runtime/node.ts"
import { ActorSystem, refOf } from "../runtime/system.ts"
import { UsageError, parseConfigured, type Command } from "./args.ts"
import { checkCheckpoint, checkPort } from "./checks.ts"
import { embeddedNats } from "./auth.ts"
import { checkKvFlags, kvFlags } from "./kv.ts"
import { serveUntilStopped } from "./lifetime.ts"
import { chatFormatFor, toolFormatFlag } from "./tool-format.ts"

const flags = {
  checkpoint: { kind: "string", doc: "checkpoint directory: Gyre's or a Hugging Face Llama one (config.json, safetensors, tokenizer.json)", required: true },
  port: { kind: "integer", doc: "HTTP port of the OpenAI API (0: any free port)", default: 8000 },
  host: { kind: "string", doc: "interface the HTTP server listens on", default: "127.0.0.1" },
  devices: { kind: "integer", doc: "rollout workers; worker i runs on device i mod the device count", default: 1 },
  model: { kind: "string", doc: "model id served", default: "gyre" },
  run: { kind: "string", doc: "run id (names the streams the calls are recorded on)", default: `serve-${Date.now().toString(36)}` },
  node: { kind: "string", doc: "node name", default: "serve" },
  store: { kind: "string", doc: "JetStream store directory of the embedded nats-server (default .gyre/nats/<run>.<node>, kept across restarts)" },
  ...kvFlags,
  "max-batch": { kind: "integer", doc: "generations batched at once per worker", default: 32 },
  "max-tokens": { kind: "integer", doc: "max_tokens of requests that give none", default: 512 },
  "tool-format": toolFormatFlag
} as const

export const command: Command<typeof flags> = {
  summary: "serve a checkpoint as an OpenAI-compatible endpoint, recording every call",
  configured: true,
  flags,
  run: async (argv) => {
    const f = parseConfigured("serve", flags, argv)
    const kv = checkKvFlags("serve", f)
    checkCheckpoint("serve", f.checkpoint)
    if (f.devices < 1) throw new UsageError("gyre serve: --devices must be at least 1")
    await checkPort("serve", f.host, f.port)
    const chat = await chatFormatFor("serve", f.checkpoint, f["tool-format"])
    const nats = await Effect.runPromise(embeddedNats({ name: "gyre-serve", run: f.run, node: f.node, kinds: ["rollout-worker", "gateway"], store: f.store }))
    const program = Effect.gen(function* () {
      const system = yield* ActorSystem
      const { backend, devices } = yield* Engine
      const workers = Array.from({ length: f.devices }, (_, i) => `${f.node}.${backend}${i}`)
      // The model's positions: a longer prompt is a 400 at the gateway before it is tokenised. The
      // workers' KV pool (--kv-blocks) bounds it further: the worker refuses, naming the flag.
      const maxContextTokens = (yield* readConfig(f.checkpoint)).config.max_position_embeddings
      const node = yield* startNode({
        name: f.node,
        types: [
          rolloutWorker({ checkpoint: f.checkpoint, numBlocks: kv.kvBlocks, kvDtype: kv.kvDtype, maxBatch: f["max-batch"] }),
          gateway({ host: f.host, port: f.port, model: f.model, defaultMaxTokens: f["max-tokens"], maxContextTokens, chat })
        ]
      })
      for (const id of workers) yield* node.spawn("rollout-worker", id) // each on workerDevice(id): i mod devices
      yield* node.spawn("gateway", "main")
      const key = newApiKey() // CSPRNG, unrelated to the execution id; only its digest leaves this process
      const execution = `serve-${nuid.next()}`
      const { baseUrl } = yield* system.ask(refOf(GatewayProtocol, address("gateway", "main")), "OpenExecution", {
        keyDigest: apiKeyDigest(key),
        task: "serve",
        execution,
        defaultRole: "main"
      })
      const names = rlLayout(system.run)
      console.log(`OpenAI base URL: ${baseUrl}`)
      console.log(`Anthropic base URL: ${anthropicBaseUrl(baseUrl)}`)
      console.log(`API key:         ${key}`)
      const onDevices = workers.map((id) => workerDevice(id, devices.length)).join(", ")
      console.log(`model:           ${f.model} (${f.checkpoint}, ${f.devices} ${backend} worker${f.devices === 1 ? "" : "s"} on device${f.devices === 1 ? "" : "s"} ${onDevices})`)
      const where = system.nats.server !== undefined ? ` (store ${system.nats.server.storeDir})` : ""
      console.log(`call records:    stream ${names.trajectoryStream}, subject ${names.calls(execution)} on ${system.nats.servers}${where}`)
      console.log(JSON.stringify({ event: "ready", baseUrl, key, model: f.model, run: system.run, execution, nats: system.nats.servers, records: names.calls(execution) }))
      yield* serveUntilStopped(system.nats, node.drain)
      console.log(JSON.stringify({ event: "drained" }))
    })
    // Last resort: an exception that escaped every handler is logged and the server goes on.
    process.on("uncaughtException", (e) => console.error(`gyre serve: uncaught exception (still serving): ${e instanceof Error ? (e.stack ?? e.message) : String(e)}`))
    process.on("unhandledRejection", (e) => console.error(`gyre serve: unhandled rejection (still serving): ${e instanceof Error ? (e.stack ?? e.message) : String(e)}`))
    const layer = Layer.merge(ActorSystem.layer({ run: f.run }), Engine.layer).pipe(Layer.provideMerge(Nats.layer(nats)))
    await Effect.runPromise(Effect.scoped(program).pipe(Effect.provide(layer)))
    return 0
  }
}
