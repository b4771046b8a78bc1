/**
 * `npm run bench:rollout`: N concurrent `toy` executions through the whole rollout path
 * (harness processes -> HTTP gateway -> NATS -> rollout worker -> engine, every call recorded),
 * against the same generation done by calling the engine's batcher directly in-process.
 *
 * The direct peer replays exactly what the actor path generated: each execution's calls in
 * order, the same prompts (rebuilt from the call records), the same number of output tokens,
 * the same concurrency, so both sides have the same prefix-cache opportunities. Tool latency
 * is 0 so the harnesses call back to back. Model: the `tiny` preset, randomly initialised.
 * Prints a table and, last, one JSON line. Not a test: nothing here is asserted.
 */
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Effect, Layer } from "effect"
import { makeBatcher } from "../src/serving/batcher.ts"
import { gateway } from "../src/actors/gateway.ts"
import { GatewayProtocol } from "../src/protocols/gateway.ts"
import { HarnessRunnerProtocol } from "../src/protocols/harness.ts"
import { makeHarnessRunner } from "../src/actors/harness-runner.ts"
import { rolloutWorker } from "../src/actors/rollout-worker.ts"
import { readTrajectories } from "../src/protocols/trajectories.ts"
import { loadCheckpoint, saveCheckpoint } from "../src/engine/checkpoint.ts"
import { Engine } from "../src/engine/engine.ts"
import { presets } from "../src/engine/presets.ts"
import { Nats } from "../src/runtime/nats.ts"
import { address } from "../src/runtime/names.ts"
import { repoRoot } from "../src/runtime/nats-server.ts"
import { startNode } from "../src/runtime/node.ts"
import { ActorSystem, refOf } from "../src/runtime/system.ts"

const EXECUTIONS = Number(process.env.BENCH_EXECUTIONS ?? 8)
const HORIZON = Number(process.env.BENCH_HORIZON ?? 32)
const MAX_BATCH = 64
const toyEnv = { TOY_STEPS: String(HORIZON), TOY_TOOL_MS: "0", TOY_MAX_TOKENS: "24", TOY_TEMPERATURE: "1" }

interface ReplayCall {
  readonly prompt: Int32Array
  readonly outputLength: number
}

const work = fs.mkdtempSync(path.join(os.tmpdir(), "gyre-bench-rollout-"))
const checkpoint = path.join(work, "tiny")

/** The actor path: returns its figures and, per execution, the calls to replay. */
const actorPath = Effect.gen(function* () {
  const system = yield* ActorSystem
  const node = yield* startNode({
    name: "bench",
    types: [
      rolloutWorker({ checkpoint, maxBatch: MAX_BATCH }),
      gateway({ port: 0 }),
      makeHarnessRunner({ suitesDir: path.join(repoRoot, "suites"), gateway: address("gateway", "main"), capacity: EXECUTIONS, evaluationRetries: 1, workspaceRoot: work })
    ]
  })
  yield* node.spawn("rollout-worker", "bench.0")
  yield* node.spawn("gateway", "main")
  yield* node.spawn("harness-runner", "bench")
  const runner = refOf(HarnessRunnerProtocol, address("harness-runner", "bench"))
  const started = performance.now()
  const executions = yield* Effect.forEach(
    Array.from({ length: EXECUTIONS }, (_, i) => i),
    (i) =>
      system
        .ask(runner, "RunExecution", { task: { suite: "toy", task: `heldout-${i}` }, execution: `bench-x${i}`, timeoutMs: null, keepWorkspace: "never", env: toyEnv }, { timeoutMs: 3_600_000 })
        .pipe(Effect.as(`bench-x${i}`)),
    { concurrency: "unbounded" }
  )
  const seconds = (performance.now() - started) / 1000
  const status = yield* system.ask(refOf(GatewayProtocol, address("gateway", "main")), "Status", undefined)
  const trajectories = yield* readTrajectories(system, new Set(executions))
  const replay = executions.map((execution) => {
    const tree = trajectories.executions.get(execution)!.decoder.tree
    return Array.from({ length: tree.callCount }, (_, c): ReplayCall => {
      const call = tree.call(c)
      return { prompt: tree.callSequence(c).slice(0, call.promptLength), outputLength: call.length - call.promptLength }
    })
  })
  yield* node.drain
  return { seconds, recent: status.recent, replay }
})

/** The same calls through the engine's batcher in-process, one fiber per execution. */
const directPath = (replay: ReadonlyArray<ReadonlyArray<ReplayCall>>) =>
  Effect.gen(function* () {
    const { model } = yield* loadCheckpoint(checkpoint)
    const cache = yield* model.cache({ blockTokens: 16, numBlocks: 4096 })
    const batcher = yield* makeBatcher(cache, {
      worker: "direct",
      maxContext: model.config.max_position_embeddings,
      maxBatch: MAX_BATCH,
      prefillChunk: 256,
      contextsPerExecution: 16,
      version: 0,
      onLoad: () => undefined
    })
    let generated = 0
    const started = performance.now()
    yield* Effect.forEach(
      replay,
      (calls, e) =>
        Effect.forEach(
          calls,
          (call, c) =>
            batcher
              .generate({
                execution: `direct-${e}`,
                request: `direct-${e}-${c}`,
                base: null,
                prompt: call.prompt,
                sampling: { maxTokens: Math.max(1, call.outputLength), temperature: 1, topP: 1, seed: c, stop: [] }
              })
              .pipe(Effect.tap((r) => Effect.sync(() => (generated += r.output.length)))),
          { discard: true }
        ),
      { concurrency: "unbounded", discard: true }
    )
    return { seconds: (performance.now() - started) / 1000, generated }
  })

const program = Effect.gen(function* () {
  const engine = yield* Engine
  yield* saveCheckpoint(checkpoint, yield* engine.createModel(presets.tiny, { seed: 1 }))
  const actor = yield* Effect.scoped(actorPath.pipe(Effect.provide(ActorSystem.layer({ run: "bench-rollout" }).pipe(Layer.provideMerge(Nats.layer({}))))))
  const direct = yield* Effect.scoped(directPath(actor.replay))
  const r = actor.recent
  const result = {
    executions: EXECUTIONS,
    horizon: HORIZON,
    calls: r.calls,
    calls_per_s: +(r.calls / actor.seconds).toFixed(2),
    gen_tokens_per_s: Math.round(r.generatedTokens / actor.seconds),
    gateway_overhead_p50_ms: +r.overheadP50Ms.toFixed(2),
    round_trip_p50_ms: +r.roundTripP50Ms.toFixed(2),
    worker_p50_ms: +r.workerP50Ms.toFixed(2),
    compute_p50_ms: +r.computeP50Ms.toFixed(2),
    prefill_tokens_saved_ratio: +(r.cachedTokens / Math.max(1, r.promptTokens)).toFixed(3),
    direct_gen_tokens_per_s: Math.round(direct.generated / direct.seconds),
    actor_over_direct: +((r.generatedTokens / actor.seconds) / (direct.generated / direct.seconds)).toFixed(3),
    actor_seconds: +actor.seconds.toFixed(2),
    direct_seconds: +direct.seconds.toFixed(2)
  }
  console.log(`${EXECUTIONS} toy executions x ${HORIZON} decisions, tiny preset, ${engine.backend} backend`)
  console.log(["path".padEnd(12), "seconds".padStart(8), "calls".padStart(6), "gen tok".padStart(8), "gen tok/s".padStart(10)].join(" "))
  console.log(["actors".padEnd(12), result.actor_seconds.toFixed(2).padStart(8), String(r.calls).padStart(6), String(r.generatedTokens).padStart(8), String(result.gen_tokens_per_s).padStart(10)].join(" "))
  console.log(["direct".padEnd(12), result.direct_seconds.toFixed(2).padStart(8), String(r.calls).padStart(6), String(direct.generated).padStart(8), String(result.direct_gen_tokens_per_s).padStart(10)].join(" "))
  console.log(`actors / direct: ${result.actor_over_direct}; gateway overhead p50 ${result.gateway_overhead_p50_ms} ms (round trip ${result.round_trip_p50_ms} - in worker ${result.worker_p50_ms}); prefill saved ${result.prefill_tokens_saved_ratio}`)
  console.log(JSON.stringify(result))
})

await Effect.runPromise(Effect.scoped(program).pipe(Effect.provide(Engine.layer)))
fs.rmSync(work, { recursive: true, force: true })
process.exit(0)
