/**
 * `gyre eval`: scores a checkpoint on named tasks of a suite through the real rollout path
 * (`evaluate.ts`), prints one line per task and, last, one JSON object with `mean_score`, the
 * per-task scores and `failures` (task -> why it was not scored: its 0 is not the model's; `{}`
 * when every task was scored; `--json` prints only the JSON line).
 */
import * as path from "node:path"
import { Effect, Layer } from "effect"
import { Engine } from "../engine/engine.ts"
import { Nats, natsOptionsFromEnv } from "../runtime/nats.ts"
import { repoRoot } from "../runtime/nats-server.ts"
import { UsageError, parseFlags, type Command } from "./args.ts"
import { checkCheckpoint, checkSuite, checkTasks } from "./checks.ts"
import { evaluate, evaluationConcurrency, parseTaskList } from "./evaluate.ts"

const flags = {
  suite: { kind: "string", doc: "suite name (a folder of --suites)", default: "toy" },
  suites: { kind: "string", doc: "directory holding the suites", default: path.join(repoRoot, "suites") },
  checkpoint: { kind: "string", doc: "checkpoint directory (config.json, model.safetensors)", required: true },
  tasks: { kind: "string", doc: "tasks: heldout-0..heldout-15, or a comma-separated list", default: "heldout-0..heldout-15" },
  env: { kind: "string", doc: "suite knobs for every harness, KEY=VALUE,KEY=VALUE", default: "" },
  concurrency: { kind: "integer", doc: "executions at once", default: evaluationConcurrency },
  run: { kind: "string", doc: "run id of the evaluation", default: `eval-${Date.now().toString(36)}` },
  json: { kind: "boolean", doc: "print only the JSON line", default: false }
} as const

/** `KEY=VALUE,KEY=VALUE` as a record; a malformed pair is a UsageError. */
export const parseEnv = (command: string, spec: string): Record<string, string> => {
  const out: Record<string, string> = {}
  for (const pair of spec.split(",").filter((p) => p.trim() !== "")) {
    const eq = pair.indexOf("=")
    if (eq <= 0) throw new UsageError(`gyre ${command}: --env item '${pair}' must be KEY=VALUE`)
    out[pair.slice(0, eq).trim()] = pair.slice(eq + 1)
  }
  return out
}

export const command: Command<typeof flags> = {
  summary: "score a checkpoint on named tasks of a suite (last line: JSON with mean_score)",
  flags,
  run: async (argv) => {
    const f = parseFlags("eval", flags, argv)
    checkCheckpoint("eval", f.checkpoint)
    checkSuite("eval", f.suites, f.suite)
    const tasks = parseTaskList(f.tasks)
    if (tasks.length === 0) throw new UsageError("gyre eval: --tasks names no task")
    checkTasks("eval", "--tasks", f.suites, f.suite, tasks)
    if (f.concurrency < 1) throw new UsageError("gyre eval: --concurrency must be at least 1")
    const env = parseEnv("eval", f.env)
    const program = evaluate({ checkpoint: f.checkpoint, suitesDir: f.suites, suite: f.suite, tasks, env, run: f.run, concurrency: f.concurrency })
    const result = await Effect.runPromise(program.pipe(Effect.provide(Layer.merge(Nats.layer(natsOptionsFromEnv("gyre-eval")), Engine.layer))))
    if (!f.json) {
      for (const t of result.tasks) console.log(`${t.task.padEnd(16)} ${t.score.toFixed(3)}  ${t.ended.padEnd(17)} ${t.seconds.toFixed(1).padStart(6)} s`)
      console.log(`mean score ${result.meanScore.toFixed(3)} on ${result.tasks.length} tasks in ${result.seconds.toFixed(1)} s`)
    }
    const scores = Object.fromEntries(result.tasks.map((t) => [t.task, Number(t.score.toFixed(4))]))
    // Tasks that did not finish with a score (their 0 is not the model's): why, from their outcome.
    const failures = Object.fromEntries(result.tasks.filter((t) => t.ended !== "finished").map((t) => [t.task, `${t.ended}: ${t.detail}`]))
    if (!f.json) for (const [task, why] of Object.entries(failures)) console.log(`${task}: ${why}`)
    console.log(JSON.stringify({ run: f.run, suite: f.suite, checkpoint: f.checkpoint, mean_score: Number(result.meanScore.toFixed(4)), tasks: result.tasks.length, scores, failures, wall_s: Number(result.seconds.toFixed(1)) }))
    return 0
  }
}
