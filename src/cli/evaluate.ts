/**
 * Scoring a checkpoint on named suite tasks through the real rollout path: a run of its own
 * (`<run>`), one node hosting a rollout worker on the checkpoint, the gateway on a free port and
 * a harness runner; every task runs once as an unmodified harness process, all at once up to
 * `concurrency`. Serves `gyre eval` and `gyre train`'s held-out scores before and after training,
 * so both measure the same way.
 *
 * Task lists: `heldout-0..heldout-15` (a range of one prefix), `a,b,c`, or a mix of both.
 */
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Effect } from "effect"
import type { Engine } from "../engine/engine.ts"
import { gateway } from "../actors/gateway.ts"
import { makeHarnessRunner } from "../actors/harness-runner.ts"
import { rolloutWorker } from "../actors/rollout-worker.ts"
import { chatFormatOf } from "../openai/hf-chat.ts"
import { HarnessRunnerProtocol } from "../protocols/harness.ts"
import { address } from "../runtime/names.ts"
import type { Nats } from "../runtime/nats.ts"
import { startNode } from "../runtime/node.ts"
import { ActorSystem, refOf } from "../runtime/system.ts"
import { UsageError } from "./args.ts"

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
      const chat = yield* Effect.promise(() => chatFormatOf(options.checkpoint))
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
