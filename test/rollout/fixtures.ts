/**
 * Shared pieces of the rollout tests: a tiny-preset checkpoint on disk, and a served model
 * (a node with rollout workers and the gateway on a fresh nats-server, an open execution).
 */
import { spawn } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as readline from "node:readline"
import { Effect, Layer, Logger, Schema, type Scope } from "effect"
import { afterAll } from "vitest"
import { saveCheckpoint } from "../../src/engine/checkpoint.ts"
import { Engine } from "../../src/engine/engine.ts"
import type { LlamaConfig } from "../../src/engine/config.ts"
import { presets } from "../../src/engine/presets.ts"
import { gateway, type GatewayConfig } from "../../src/actors/gateway.ts"
import { GatewayProtocol, apiKeyDigest } from "../../src/protocols/gateway.ts"
import { rlLayout } from "../../src/protocols/layout.ts"
import { rolloutWorker } from "../../src/actors/rollout-worker.ts"
import type { RolloutConfig } from "../../src/serving/rollout-role.ts"
import { address } from "../../src/runtime/names.ts"
import { startNode, type NodeHandle } from "../../src/runtime/node.ts"
import { repoRoot } from "../../src/runtime/nats-server.ts"
import { ActorSystem, refOf } from "../../src/runtime/system.ts"
import { CallRecordJson, type CallRecord } from "../../src/tree/record.ts"

/** A temporary directory removed after the test file. */
export const tempDir = (prefix: string): string => {
  const dir = mkdtempSync(join(tmpdir(), prefix))
  afterAll(() => rmSync(dir, { recursive: true, force: true }))
  return dir
}

/** Writes a randomly initialised checkpoint of `config` (default the tiny preset) through the engine's TS API. */
export const writeCheckpoint = (dir: string, seed: number, initStd = 0.2, config: LlamaConfig = presets.tiny): Promise<string> =>
  Effect.runPromise(
    Effect.gen(function* () {
      const engine = yield* Engine
      const model = yield* engine.createModel(config, { seed, initStd })
      yield* saveCheckpoint(dir, model)
      return dir
    }).pipe(Effect.scoped, Effect.provide(Engine.layer.pipe(Layer.provide(Logger.layer([])))))
  )

/**
 * A model for long contexts in tests: the tiny preset's vocabulary and shape of parts, one layer of
 * two heads of 8 (16 bytes of F16 K/V a token), `positions` positions: a decode step at 300k tokens
 * is a few milliseconds on a CPU.
 */
export const microLong = (positions: number): LlamaConfig => ({
  ...presets.tiny,
  hidden_size: 16,
  intermediate_size: 32,
  num_hidden_layers: 1,
  num_attention_heads: 2,
  num_key_value_heads: 1,
  max_position_embeddings: positions
})

/**
 * A context of `length` tokens without prefilling it: the engine's GYKV hand-off buffer (gyre.h)
 * of `config`'s layout in F16, with random K/V of moderate size. A long context's K/V costs ~T^2
 * to compute on a CPU; what a transfer or a cache does with it does not depend on the values, and
 * continuations from it are still exact functions of them.
 */
export const craftedKv = (config: LlamaConfig, length: number, seed: number): Promise<Uint8Array> => {
  const { num_hidden_layers: L, num_key_value_heads: KV } = config
  const hd = config.hidden_size / config.num_attention_heads
  const payload = L * 2 * length * KV * hd * 2
  const buffer = new Uint8Array(48 + payload)
  const halves = new Uint16Array(buffer.buffer, 48, payload / 2)
  let x = seed >>> 0 || 1
  for (let i = 0; i < halves.length; i++) {
    x ^= x << 13
    x ^= x >>> 17
    x ^= x << 5
    halves[i] = (x & 0x83ff) | 0x3000 // sign and mantissa random, exponent 12: |v| in [0.125, 0.25)
  }
  const header = new DataView(buffer.buffer)
  buffer.set(Buffer.from("GYKV"), 0)
  ;[1, L, KV, hd, 2, length, 0].forEach((v, i) => header.setUint32(4 + 4 * i, v, true))
  header.setBigUint64(32, BigInt(payload), true)
  return Effect.runPromise(
    Effect.gen(function* () {
      const engine = yield* Engine
      header.setBigUint64(40, yield* engine.checksum(buffer.subarray(48)), true)
      return buffer
    }).pipe(Effect.provide(Engine.layer.pipe(Layer.provide(Logger.layer([])))))
  )
}

export const gatewayRef = refOf(GatewayProtocol, address("gateway", "main"))

export const KEY = "test-key-0123456789abcdef"

export interface Served {
  readonly node: NodeHandle
  readonly baseUrl: string
  readonly execution: string
}

/**
 * Starts a node hosting `workers` rollout workers (`rollout-worker/<node>.cpu<i>`) and the
 * gateway, and opens execution `execution` with key `KEY`.
 */
export const serve = (options: {
  readonly node?: string
  readonly checkpoint: string
  readonly workers: number
  readonly worker?: Omit<RolloutConfig, "checkpoint">
  readonly gateway?: GatewayConfig
  readonly execution?: string
  readonly heartbeatMs?: number
}): Effect.Effect<Served, unknown, ActorSystem | Scope.Scope> =>
  Effect.gen(function* () {
    const system = yield* ActorSystem
    const name = options.node ?? "a"
    const node = yield* startNode({
      name,
      types: [rolloutWorker({ checkpoint: options.checkpoint, ...options.worker }), gateway(options.gateway)],
      heartbeatMs: options.heartbeatMs ?? 250
    })
    for (let i = 0; i < options.workers; i++) yield* node.spawn("rollout-worker", `${name}.cpu${i}`)
    yield* node.spawn("gateway", "main")
    const execution = options.execution ?? "exec-1"
    const { baseUrl } = yield* system.ask(gatewayRef, "OpenExecution", { keyDigest: apiKeyDigest(KEY), task: "t1", execution, defaultRole: "main" })
    return { node, baseUrl, execution }
  }).pipe(Effect.provide(Layer.merge(Engine.layer, Logger.layer([]))))

const decodeRecord = Schema.decodeUnknownSync(CallRecordJson)

/** The first `count` CallRecords of an execution on the trajectory stream, in stream order. */
export const readRecords = (execution: string, count: number) =>
  Effect.gen(function* () {
    const system = yield* ActorSystem
    const names = rlLayout(system.run)
    return yield* Effect.promise(async () => {
      const consumer = await system.nats.js.consumers.get(names.trajectoryStream, { filter_subjects: [names.calls(execution)] })
      const out: Array<CallRecord> = []
      const batch = await consumer.fetch({ max_messages: count, expires: 5000 })
      for await (const m of batch) {
        out.push(decodeRecord(m.string()))
        if (out.length === count) break
      }
      return out
    })
  })

/**
 * `gyre serve <args>` as a child process on its own embedded server, whose users come from
 * `authDir`: its stdout lines, its exit, and its JSON events by name (rejected after `timeoutMs`
 * with its stderr).
 */
export const serveChild = (args: ReadonlyArray<string>, authDir: string, timeoutMs = 90_000) => {
  const child = spawn(process.execPath, [join(repoRoot, "bin", "gyre.js"), "serve", ...args], {
    cwd: repoRoot,
    env: { ...process.env, NATS_URL: "", GYRE_AUTH_DIR: authDir },
    stdio: ["ignore", "pipe", "pipe"]
  })
  let stderr = ""
  child.stderr!.on("data", (d: Buffer) => (stderr += d.toString()))
  const lines: Array<string> = []
  const events: Array<Record<string, string>> = []
  const waiters: Array<() => void> = []
  readline.createInterface({ input: child.stdout! }).on("line", (line) => {
    lines.push(line)
    if (line.startsWith("{")) events.push(JSON.parse(line) as Record<string, string>)
    waiters.splice(0).forEach((w) => w())
  })
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)))
  const event = (name: string) =>
    new Promise<Record<string, string>>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no ${name} event; stderr:\n${stderr}`)), timeoutMs)
      const check = () => {
        const e = events.find((x) => x.event === name)
        if (e === undefined) return void waiters.push(check)
        clearTimeout(timer)
        resolve(e)
      }
      check()
    })
  return { child, lines, exited, event, stderr: () => stderr }
}
