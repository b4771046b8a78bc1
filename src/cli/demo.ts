/**
 * `gyre demo`: the main job on the embedded default. Until the training loop lands, it runs
 * a batch of `toy` executions through the whole rollout path with a freshly warm-started
 * `tiny` policy:
 *
 * 1. Warm start (cached in `.gyre/cache/warm-start-<key>`, the key a digest of everything
 *    that shapes it): the toy oracle's demonstrations on train tasks, then supervised steps
 *    of the engine's SFT loss on their prefix trees (`src/training/warm-start.ts`).
 * 2. A private nats-server (or NATS_URL), one node hosting a rollout worker on the warm-started
 *    checkpoint, the gateway and a harness runner.
 * 3. `--executions` held-out toy executions at once, each an unmodified harness process
 *    talking HTTP to the gateway; their outcomes, and the trees rebuilt from the call records.
 */
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Effect, Layer } from "effect"
import { gateway } from "../actors/gateway.ts"
import { HarnessRunnerProtocol } from "../protocols/harness.ts"
import { makeHarnessRunner } from "../actors/harness-runner.ts"
import { rlLayout } from "../protocols/layout.ts"
import { rolloutWorker } from "../actors/rollout-worker.ts"
import { loadSuite } from "../harness/suites.ts"
import { readTrajectories } from "../protocols/trajectories.ts"
import { Engine } from "../engine/engine.ts"
import { Nats, natsOptionsFromEnv } from "../runtime/nats.ts"
import { address } from "../runtime/names.ts"
import { repoRoot } from "../runtime/nats-server.ts"
import { startNode } from "../runtime/node.ts"
import { ActorSystem, refOf } from "../runtime/system.ts"
import { executionStats } from "../tree/stats.ts"
import { parseFlags, type Command } from "./args.ts"
import { warmStartedCheckpoint } from "./warm-start.ts"

const flags = {
  executions: { kind: "integer", doc: "toy executions to run at once", default: 8 },
  horizon: { kind: "integer", doc: "decisions per execution (TOY_STEPS)", default: 48 },
  "demo-tasks": { kind: "integer", doc: "train tasks the oracle demonstrates for the warm start", default: 60 },
  "sft-steps": { kind: "integer", doc: "supervised warm-start steps", default: 150 },
  "sft-lr": { kind: "number", doc: "peak learning rate of the warm start", default: 4e-3 },
  seed: { kind: "integer", doc: "initialisation and sampling seed", default: 1 },
  fresh: { kind: "boolean", doc: "ignore a cached warm start", default: false },
  run: { kind: "string", doc: "run id", default: `demo-${Date.now().toString(36)}` },
  store: { kind: "string", doc: "JetStream store of the embedded nats-server (keeps the records)", default: path.join(repoRoot, ".gyre", "demo-store") }
} as const

type Flags = ReturnType<typeof parseFlags<typeof flags>>

/** The knobs the demo gives the toy suite, for both the demonstrations and the executions. */
const toyEnv = (f: Flags) => ({ TOY_STEPS: String(f.horizon), TOY_TOOL_MS: "20", TOY_TEMPERATURE: "1" })

const pad = (s: string | number, n: number) => String(s).padStart(n)

export const command: Command<typeof flags> = {
  summary: "run a batch of toy executions through the rollout path with a warm-started tiny policy",
  flags,
  run: async (argv) => {
    const f = parseFlags("demo", flags, argv)
    const warm = { suite: "toy", env: toyEnv(f), tasks: f["demo-tasks"], steps: f["sft-steps"], lr: f["sft-lr"], seed: f.seed, fresh: f.fresh }
    const checkpoint = await Effect.runPromise(warmStartedCheckpoint(warm).pipe(Effect.provide(Engine.layer)))
    const program = Effect.gen(function* () {
      const system = yield* ActorSystem
      const workspaces = fs.mkdtempSync(path.join(os.tmpdir(), "gyre-demo-ws-"))
      yield* Effect.addFinalizer(() => Effect.sync(() => fs.rmSync(workspaces, { recursive: true, force: true })))
      const node = yield* startNode({
        name: "demo",
        types: [
          rolloutWorker({ checkpoint, maxBatch: 64 }),
          gateway({ port: 0 }),
          makeHarnessRunner({
            suitesDir: path.join(repoRoot, "suites"),
            gateway: address("gateway", "main"),
            capacity: f.executions,
            evaluationRetries: 2,
            workspaceRoot: workspaces
          })
        ]
      })
      yield* node.spawn("rollout-worker", "demo.0")
      yield* node.spawn("gateway", "main")
      yield* node.spawn("harness-runner", "demo")
      const names = rlLayout(system.run)
      console.log(`\nrun ${system.run}: nats ${system.nats.servers} (${system.nats.embedded ? "embedded" : "external"} nats-server ${system.nats.serverVersion})`)
      console.log(`${f.executions} held-out toy executions of ${f.horizon} decisions, at once...`)
      const runner = refOf(HarnessRunnerProtocol, address("harness-runner", "demo"))
      const started = Date.now()
      const heldout = (yield* loadSuite(path.join(repoRoot, "suites"), "toy")).tasks.filter((t) => t.split === "heldout")
      const runs = yield* Effect.forEach(
        heldout.slice(0, f.executions),
        (task, i) =>
          Effect.gen(function* () {
            const execution = `${system.run}-x${i}`
            const t0 = Date.now()
            const outcome = yield* system.ask(
              runner,
              "RunExecution",
              { task: { suite: "toy", task: task.id }, execution, timeoutMs: null, keepWorkspace: "on-failure", env: toyEnv(f) },
              { timeoutMs: 60 * 60_000 }
            )
            return { execution, outcome, seconds: (Date.now() - t0) / 1000 }
          }),
        { concurrency: "unbounded" }
      )
      const wall = (Date.now() - started) / 1000
      const trajectories = yield* readTrajectories(system, new Set(runs.map((r) => r.execution)))

      console.log(`\n${"execution".padEnd(22)} ${"task".padEnd(14)} score  ended     calls  tokens  unique  dedup  depth  leaves (main/summary/sub/sub-summary)   time`)
      let scoreSum = 0
      for (const r of runs) {
        const t = trajectories.executions.get(r.execution)
        const s = t === undefined ? undefined : executionStats(t.decoder.tree)
        const roles = s?.leavesByRole ?? {}
        const leaves = `${roles["main"] ?? 0}/${roles["main-summary"] ?? 0}/${roles["subagent"] ?? 0}/${roles["subagent-summary"] ?? 0}`
        scoreSum += r.outcome.score ?? 0
        console.log(
          `${r.execution.slice(-22).padEnd(22)} ${r.outcome.task.padEnd(14)} ${(r.outcome.score ?? NaN).toFixed(3)}  ${r.outcome.ended.padEnd(9)} ${pad(s?.calls ?? 0, 5)} ${pad(s?.totalTokens ?? 0, 7)} ${pad(s?.uniqueTokens ?? 0, 7)} ${pad((s?.dedupRatio ?? 0).toFixed(1), 6)} ${pad(s?.depth ?? 0, 6)}  ${leaves.padEnd(38)} ${pad(r.seconds.toFixed(1), 5)} s`
        )
      }
      const rejected = [...trajectories.executions.values()].reduce((a, t) => a + t.rejected.length, 0)
      console.log(`\nmean score ${(scoreSum / runs.length).toFixed(3)} (the oracle scores 1.000); ${runs.length} executions in ${wall.toFixed(1)} s`)
      console.log(`call records: stream ${names.trajectoryStream}, subjects ${names.allCalls} (${rejected} rejected, ${trajectories.malformed.length} malformed); outcomes: ${names.allOutcomes}`)
      console.log(`journal: stream ${system.layout.journalStream}; store: ${system.nats.embedded ? f.store : system.nats.servers}`)
      yield* node.drain
    })
    const env = natsOptionsFromEnv("gyre-demo")
    const layer = ActorSystem.layer({ run: f.run }).pipe(Layer.provideMerge(Nats.layer({ ...env, storeDir: env.storeDir ?? f.store })))
    await Effect.runPromise(Effect.scoped(program).pipe(Effect.provide(layer)))
    return 0
  }
}
