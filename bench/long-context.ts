/**
 * `npm run bench:long-context`: one agent execution at a long context through the real gateway
 * and a device, each in a `gyre node` child process of its own on an embedded nats-server (the
 * default 1 MiB `max_payload`), the harness being this process's `openai` client.
 *
 * The device (`--preset`, default `tiny-long`) first holds a context of `--context` tokens: a
 * system message of that many byte-level tokens, its K/V imported through a KV hand-off rather
 * than prefilled (on a CPU that prefill costs ~T^2: hours at 200k tokens; the K/V values do not
 * matter to memory or transfers). Then the execution makes `--calls` chat calls, each adding a user message of
 * `--suffix` tokens and generating `--output` tokens (the agent loop: the whole history every
 * call, the gateway rendering its earlier answers token-exact). The first call's prompt is the
 * whole context (it goes to the device through the run's transfer store); the others send a delta.
 *
 * Printed: a row per call (prompt and cached tokens, seconds), then peak and final RSS of the
 * gateway and the device processes (VmHWM and VmRSS from /proc), the KV pool's bytes, the
 * gateway's totals (cached fraction: the share of prompt tokens served from the device's KV
 * cache), and one JSON line. Not a test: nothing is asserted.
 */
import { spawn, type ChildProcess } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import * as readline from "node:readline"
import { Effect, Layer, Logger, Schedule } from "effect"
import OpenAI from "openai"
import { saveCheckpoint } from "../src/engine/checkpoint.ts"
import { Engine } from "../src/engine/engine.ts"
import type { LlamaConfig } from "../src/engine/config.ts"
import { presets, type PresetName } from "../src/engine/presets.ts"
import { gyreChat } from "../src/openai/chat.ts"
import { DeviceProtocol } from "../src/protocols/device.ts"
import { GatewayProtocol, apiKeyDigest, newApiKey } from "../src/protocols/gateway.ts"
import { bytesOf, deleteObject, openTransferStore, putParts } from "../src/protocols/transfer.ts"
import { Nats } from "../src/runtime/nats.ts"
import { repoRoot } from "../src/runtime/nats-server.ts"
import { address } from "../src/runtime/names.ts"
import { ActorSystem, refOf } from "../src/runtime/system.ts"
import { KV_BLOCK_TOKENS } from "../src/serving/rollout-role.ts"
import { atLeast, benchFlags } from "./flags.ts"
import { printResult } from "./results.ts"

const BENCH = "bench:long-context"
const f = benchFlags(BENCH, "one execution at a long context through gateway and device processes: RSS, cached fraction", {
  context: { kind: "integer", doc: "tokens of the context the device holds before the first call", default: 200_000 },
  calls: { kind: "integer", doc: "chat calls of the execution", default: 6 },
  suffix: { kind: "integer", doc: "tokens each call adds (a user message)", default: 256 },
  output: { kind: "integer", doc: "tokens each call generates", default: 32 },
  "kv-dtype": { kind: "string", doc: "the device's KV storage", default: "f32", choices: ["f32", "f16"] },
  preset: { kind: "string", doc: "the model (its positions raised to fit when fewer)", default: "tiny-long", choices: Object.keys(presets) }
})
const CONTEXT = atLeast(BENCH, "context", f.context, 16)
const CALLS = atLeast(BENCH, "calls", f.calls, 1)
const TOTAL = CONTEXT + CALLS * (f.suffix + f.output + 8) + 64
const POSITIONS = Math.ceil(TOTAL / 4096) * 4096
const BLOCKS = Math.ceil(TOTAL / KV_BLOCK_TOKENS) + 64
const preset: LlamaConfig = presets[f.preset as PresetName]
const config: LlamaConfig = { ...preset, max_position_embeddings: Math.max(preset.max_position_embeddings, POSITIONS) }
const KV_BYTES_PER_TOKEN = config.num_hidden_layers * 2 * config.num_key_value_heads * (config.head_dim ?? config.hidden_size / config.num_attention_heads) * (f["kv-dtype"] === "f16" ? 2 : 4)

const quiet = Layer.merge(Engine.layer, Logger.layer([]))

/** Letters of a fixed pseudo-random text, one byte-level token each. */
const letters = (n: number, seed: number) => {
  let x = seed
  return Array.from({ length: n }, () => String.fromCharCode(97 + ((x = (x * 1103515245 + 12345) & 0x7fffffff) % 26))).join("")
}

/** The engine's GYKV buffer (gyre.h) of `length` tokens of `config`'s layout in F16, random K/V of moderate size. */
const craftedKv = (length: number) =>
  Effect.gen(function* () {
    const hd = config.head_dim ?? config.hidden_size / config.num_attention_heads
    const payload = config.num_hidden_layers * 2 * length * config.num_key_value_heads * hd * 2
    const buffer = new Uint8Array(48 + payload)
    const halves = new Uint16Array(buffer.buffer, 48, payload / 2)
    let x = 12345
    for (let i = 0; i < halves.length; i++) {
      x ^= x << 13
      x ^= x >>> 17
      x ^= x << 5
      halves[i] = (x & 0x83ff) | 0x3000
    }
    const header = new DataView(buffer.buffer)
    buffer.set(Buffer.from("GYKV"), 0)
    ;[1, config.num_hidden_layers, config.num_key_value_heads, hd, 2, length, 0].forEach((v, i) => header.setUint32(4 + 4 * i, v, true))
    header.setBigUint64(32, BigInt(payload), true)
    header.setBigUint64(40, yield* (yield* Engine).checksum(buffer.subarray(48)), true)
    return buffer
  })

/** VmRSS and VmHWM of a process, MB. */
const memory = (pid: number) => {
  const status = fs.readFileSync(`/proc/${pid}/status`, "utf8")
  const mb = (key: string) => Number(new RegExp(`${key}:\\s+(\\d+) kB`).exec(status)?.[1] ?? 0) / 1024
  return { rss: Math.round(mb("VmRSS")), peak: Math.round(mb("VmHWM")) }
}

/** A `gyre node` child on this system's server; resolves once it serves. */
const child = (servers: string, run: string, name: string, args: ReadonlyArray<string>, env: Record<string, string>) =>
  Effect.acquireRelease(
    Effect.promise(
      () =>
        new Promise<ChildProcess>((resolve, reject) => {
          const p = spawn(process.execPath, [path.join(repoRoot, "bin", "gyre.js"), "node", "--name", name, "--run", run, ...args], {
            env: { ...process.env, NATS_URL: servers, ...env },
            stdio: ["ignore", "pipe", "inherit"]
          })
          readline.createInterface({ input: p.stdout! }).on("line", (line) => line.includes('"ready"') && resolve(p))
          p.once("exit", (code) => reject(new Error(`${name} exited with ${code}`)))
        })
    ),
    (p) => Effect.sync(() => p.kill("SIGKILL"))
  )

const main = Effect.gen(function* () {
  const system = yield* ActorSystem
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gyre-long-context-"))
  yield* Effect.addFinalizer(() => Effect.sync(() => fs.rmSync(dir, { recursive: true, force: true })))
  yield* Effect.scoped(Effect.gen(function* () {
    const engine = yield* Engine
    yield* saveCheckpoint(dir, yield* engine.createModel(config, { seed: 1, initStd: 0.2 }))
  }))
  const gatewayProcess = yield* child(system.nats.servers, system.run, "gw", ["--load", path.join(repoRoot, "bench", "gateway-node.ts"), "--spawn", "gateway/main"], {})
  const deviceProcess = yield* child(system.nats.servers, system.run, "dev", ["--load", path.join(repoRoot, "src", "actors", "device.ts"), "--spawn", "device/dev.0"], {
    GYRE_CHECKPOINT: dir,
    GYRE_KV_BLOCKS: String(BLOCKS),
    GYRE_KV_DTYPE: f["kv-dtype"],
    GYRE_MAX_BATCH: "4"
  })
  const device = refOf(DeviceProtocol, address("device", "dev.0"))
  yield* system.ask(device, "Status", undefined, { timeoutMs: 2000 }).pipe(Effect.retry({ times: 100, schedule: Schedule.spaced("300 millis") }))
  const idle = { gateway: memory(gatewayProcess.pid!), device: memory(deviceProcess.pid!) }
  // the context: <|bos|><|system|> CONTEXT - 3 letters <|end|>, what every call's prompt starts with
  const system0 = { role: "system" as const, content: letters(CONTEXT - 3, 7) }
  const contextTokens = gyreChat.render([system0], [], undefined).slice(0, -1)
  const imported = yield* Effect.gen(function* () {
    const store = yield* openTransferStore(system)
    const object = yield* putParts(store, "h.bench", [bytesOf(contextTokens), yield* craftedKv(contextTokens.length)])
    const started = performance.now()
    const answer = yield* system.ask(device, "ImportContexts", {
      from: "bench",
      contexts: [{ execution: "x", request: "ctx", object: object.name, length: contextTokens.length, kvLength: contextTokens.length, inFlight: false }]
    }, { timeoutMs: 600_000 })
    yield* deleteObject(store, object.name)
    return { ...answer, seconds: (performance.now() - started) / 1000 }
  })
  const held = { gateway: memory(gatewayProcess.pid!), device: memory(deviceProcess.pid!) }
  const gateway = refOf(GatewayProtocol, address("gateway", "main"))
  const key = newApiKey()
  const { baseUrl } = yield* system.ask(gateway, "OpenExecution", { keyDigest: apiKeyDigest(key), task: "bench", execution: "x", defaultRole: "main" })
  yield* Effect.sleep("1 second") // the gateway sees the device's registry entry
  const client = new OpenAI({ baseURL: baseUrl, apiKey: key, maxRetries: 0, timeout: 3_600_000 })
  const messages: Array<OpenAI.Chat.Completions.ChatCompletionMessageParam> = [system0]
  const rows: Array<{ call: number; prompt: number; cached: number; seconds: number }> = []
  for (let call = 0; call < CALLS; call++) {
    messages.push({ role: "user", content: letters(f.suffix - 2, 100 + call) })
    const started = performance.now()
    const r = yield* Effect.promise(() =>
      client.chat.completions.create({ model: "gyre", messages, max_tokens: f.output, temperature: 0.9, seed: call, ignore_eos: true } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming)
    )
    rows.push({ call, prompt: r.usage!.prompt_tokens, cached: r.usage!.prompt_tokens_details?.cached_tokens ?? 0, seconds: (performance.now() - started) / 1000 })
    console.log(`call ${call}: ${rows.at(-1)!.prompt} prompt tokens, ${rows.at(-1)!.cached} cached, ${rows.at(-1)!.seconds.toFixed(1)} s`)
    messages.push({ role: "assistant", content: r.choices[0]!.message.content ?? "" })
  }
  const status = yield* system.ask(gateway, "Status", undefined)
  const load = yield* system.ask(device, "Status", undefined)
  const end = { gateway: memory(gatewayProcess.pid!), device: memory(deviceProcess.pid!) }
  return { imported, idle, held, end, rows, totals: status.totals, load }
})

const r = await Effect.runPromise(
  Effect.scoped(main).pipe(Effect.provide(ActorSystem.layer({ run: `long-ctx-${Date.now().toString(36)}` }).pipe(Layer.provideMerge(Nats.layer({})))), Effect.provide(quiet))
)
const kvPoolMb = Math.round((BLOCKS * KV_BLOCK_TOKENS * KV_BYTES_PER_TOKEN) / 2 ** 20)
const contextKvMb = Math.round((CONTEXT * KV_BYTES_PER_TOKEN) / 2 ** 20)
console.log("")
console.log(`context ${CONTEXT} tokens (${f.preset}, ${f["kv-dtype"]} KV: ${KV_BYTES_PER_TOKEN} bytes a token, ${contextKvMb} MB), pool ${BLOCKS} blocks (${kvPoolMb} MB), imported in ${r.imported.seconds.toFixed(1)} s`)
console.log("process   idle MB   holding the context MB   after the calls MB (peak)")
for (const p of ["gateway", "device"] as const) console.log(`${p.padEnd(9)} ${String(r.idle[p].rss).padStart(7)}   ${String(r.held[p].rss).padStart(22)}   ${String(r.end[p].rss).padStart(9)} (${r.end[p].peak})`)
const cachedFraction = r.totals.promptTokens === 0 ? 0 : r.totals.cachedTokens / r.totals.promptTokens
console.log(`gateway totals: ${r.totals.calls} calls, ${r.totals.promptTokens} prompt tokens, ${r.totals.cachedTokens} cached (fraction ${cachedFraction.toFixed(4)}), ${r.totals.reprefillTokens} prefilled again, ${r.totals.fullResends} full resends`)
printResult(BENCH, {
  context_tokens: CONTEXT,
  calls: CALLS,
  preset: f.preset,
  kv_dtype: f["kv-dtype"],
  kv_pool_mb: kvPoolMb,
  context_kv_mb: contextKvMb,
  import_s: Number(r.imported.seconds.toFixed(2)),
  gateway_rss_mb: r.end.gateway.rss,
  gateway_peak_rss_mb: r.end.gateway.peak,
  gateway_idle_rss_mb: r.idle.gateway.rss,
  device_rss_mb: r.end.device.rss,
  device_peak_rss_mb: r.end.device.peak,
  device_idle_rss_mb: r.idle.device.rss,
  cached_fraction: Number(cachedFraction.toFixed(4)),
  reprefill_tokens: r.totals.reprefillTokens,
  full_resends: r.totals.fullResends,
  call_s: r.rows.map((row) => Number(row.seconds.toFixed(2)))
})
process.exit(0)
