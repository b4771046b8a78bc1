/**
 * Scoring a checkpoint on named suite tasks through the real rollout path: a run of its own
 * (`<run>`), one node hosting a rollout worker on the checkpoint, the gateway on a free port and
 * a harness runner; every task runs once as an unmodified harness process, all at once up to
 * `concurrency`. Serves `gyre eval` and `gyre train`'s held-out scores before and after training,
 * so both measure the same way.
 *
 * Task lists: `heldout-0..heldout-15` (a range of one prefix), `a,b,c`, or a mix of both.
 *
 * `heldoutGain` compares two evaluations of the same tasks (before and after training): the mean
 * of the per-task differences and the half-width of its 95% interval, paired over the tasks.
 */
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Effect } from "effect"
import type { Engine } from "../engine/engine.ts"
import { gateway } from "../actors/gateway.ts"
import { makeHarnessRunner } from "../actors/harness-runner.ts"
import { rolloutWorker } from "../actors/rollout-worker.ts"
import { HarnessRunnerProtocol } from "../protocols/harness.ts"
import { address } from "../runtime/names.ts"
import type { Nats } from "../runtime/nats.ts"
import { startNode } from "../runtime/node.ts"
import { ActorSystem, refOf } from "../runtime/system.ts"
import { UsageError } from "./args.ts"
import { chatFormatFor } from "./tool-format.ts"

export interface EvaluationOptions {
  readonly checkpoint: string
  readonly suitesDir: string
  readonly suite: string
  readonly tasks: ReadonlyArray<string>
  /** The suite's knobs for every harness (e.g. TOY_STEPS). */
  readonly env: Readonly<Record<string, string>>
  /** Run id of the evaluation (its own streams). */
  readonly run: string
  readonly concurrency: number
  /** The model's tool-call format where its chat template leaves it open (`--tool-format`). */
  readonly toolFormat?: string | undefined
}

/** Executions at once by default: `gyre eval`'s `--concurrency`, `gyre train`'s held-out runs. */
export const evaluationConcurrency = 16

export interface TaskScore {
  readonly task: string
  readonly execution: string
  /** 0 for an execution whose evaluation failed (reported in `ended`). */
  readonly score: number
  readonly ended: string
  /** The outcome's detail: the scorer's details, or why the execution was not scored. */
  readonly detail: string
  readonly seconds: number
}

export interface Evaluation {
  readonly meanScore: number
  readonly tasks: ReadonlyArray<TaskScore>
  readonly seconds: number
}

/** Expands `heldout-0..heldout-3,train-7` into task ids; a malformed item is a UsageError. */
export const parseTaskList = (spec: string): Array<string> =>
  spec
    .split(",")
    .map((s) => s.trim())
    .filter((s) => s !== "")
    .flatMap((item) => {
      const range = /^(.*?)(\d+)\.\.(.*?)(\d+)$/.exec(item)
      if (range === null) {
        if (item.includes("..")) throw new UsageError(`gyre: task range '${item}' must look like heldout-0..heldout-15`)
        return [item]
      }
      const [, prefix, from, prefix2, to] = range
      if (prefix !== prefix2 || Number(to) < Number(from)) throw new UsageError(`gyre: task range '${item}' must be one prefix, ascending (heldout-0..heldout-15)`)
      return Array.from({ length: Number(to) - Number(from) + 1 }, (_, i) => `${prefix}${Number(from) + i}`)
    })

/** Runs the tasks on the checkpoint; requires the `Nats` connection (embedded or external) and the node's `Engine`. */
export const evaluate = (options: EvaluationOptions): Effect.Effect<Evaluation, unknown, Nats | Engine> =>
  Effect.scoped(
    Effect.gen(function* () {
      const system = yield* ActorSystem
      const workspaces = fs.mkdtempSync(path.join(os.tmpdir(), "gyre-eval-ws-"))
      yield* Effect.addFinalizer(() => Effect.sync(() => fs.rmSync(workspaces, { recursive: true, force: true })))
      const chat = yield* Effect.promise(() => chatFormatFor("eval", options.checkpoint, options.toolFormat))
      const node = yield* startNode({
        name: "eval",
        types: [
          rolloutWorker({ checkpoint: options.checkpoint, maxBatch: 64 }),
          gateway({ port: 0, chat }),
          makeHarnessRunner({
            suitesDir: options.suitesDir,
            gateway: address("gateway", "main"),
            capacity: options.concurrency,
            maxQueued: options.tasks.length,
            evaluationRetries: 2,
            workspaceRoot: workspaces
          })
        ]
      })
      yield* node.spawn("rollout-worker", "eval.0")
      yield* node.spawn("gateway", "main")
      yield* node.spawn("harness-runner", "eval")
      const runner = refOf(HarnessRunnerProtocol, address("harness-runner", "eval"))
      const started = Date.now()
      const tasks = yield* Effect.forEach(
        options.tasks,
        (task, i) =>
          Effect.gen(function* () {
            const execution = `eval-x${i}`
            const t0 = Date.now()
            const outcome = yield* system.ask(
              runner,
              "RunExecution",
              { task: { suite: options.suite, task }, execution, timeoutMs: null, keepWorkspace: "on-failure", env: { ...options.env } },
              { timeoutMs: 60 * 60_000 }
            )
            const ended = outcome.evaluation === "failed" ? "evaluation-failed" : outcome.ended
            return { task, execution, score: outcome.score ?? 0, ended, detail: outcome.detail, seconds: (Date.now() - t0) / 1000 }
          }),
        { concurrency: "unbounded" }
      )
      yield* node.drain
      const meanScore = tasks.reduce((a, t) => a + t.score, 0) / Math.max(1, tasks.length)
      return { meanScore, tasks, seconds: (Date.now() - started) / 1000 }
    }).pipe(Effect.provide(ActorSystem.layer({ run: options.run })))
  )

/** The gain between two evaluations of the same tasks (`heldoutGain`). */
export interface HeldoutGain {
  /** Tasks scored by both evaluations (the pairs). */
  readonly tasks: number
  /** Mean of after - before over the pairs. */
  readonly gain: number
  /** Half-width of the gain's 95% interval (Student's t over the pairs); null under 2 pairs. */
  readonly ci95: number | null
}

/** The 0.975 quantile of Student's t with `df` degrees of freedom: exact for 1 and 2, Cornish-Fisher beyond (within 0.004 under 10, 1e-5 from 10). */
export const tQuantile975 = (df: number): number => {
  if (df === 1) return 12.706204736174705
  if (df === 2) return 4.302652729749464
  const z = 1.959963984540054
  const g = [
    (z ** 3 + z) / 4,
    (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96,
    (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384,
    (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160
  ]
  return g.reduce((t, gi, i) => t + gi / df ** (i + 1), z)
}

/**
 * The held-out gain of `after` over `before`, paired over the tasks both scored: each task's
 * difference (after - before: one execution each, so the difference carries both runs' sampling
 * noise and nothing of how hard the task is), their mean, and t(0.975, n - 1) x sd / sqrt(n) for
 * the half-width of its 95% interval.
 */
export const heldoutGain = (before: ReadonlyArray<Pick<TaskScore, "task" | "score">>, after: ReadonlyArray<Pick<TaskScore, "task" | "score">>): HeldoutGain => {
  const first = new Map(before.map((t) => [t.task, t.score]))
  const diffs = after.flatMap((t) => (first.has(t.task) ? [t.score - first.get(t.task)!] : []))
  const n = diffs.length
  const gain = n === 0 ? 0 : diffs.reduce((a, d) => a + d, 0) / n
  if (n < 2) return { tasks: n, gain, ci95: null }
  const variance = diffs.reduce((a, d) => a + (d - gain) ** 2, 0) / (n - 1)
  return { tasks: n, gain, ci95: tQuantile975(n - 1) * Math.sqrt(variance / n) }
}
