/**
 * `gyre demo`: the main job on the embedded default — a short elastic `gyre train` run of the
 * `tiny` policy on the `toy` suite that finishes in a few minutes on 2 cores.
 *
 * It is `gyre train` with the demo's defaults (flags are the same; `gyre demo --help` lists them):
 * the cached supervised warm start, the held-out score before (64 tasks), `--steps` elastic RL
 * steps on two CPU devices that move between rollout and training (executions in flight handed
 * over with their KV cache), the held-out score after with the gain and its 95% interval (paired
 * over the tasks), and the run's figures counted from its journal. The run's
 * JetStream store stays in `.gyre/runs/<run>` for `gyre replay --store`.
 */
import { Effect } from "effect"
import { parseConfigured, type Command } from "./args.ts"
import { runTraining, summaryLines, trainFlags } from "./train.ts"

const flags = {
  ...trainFlags,
  // train's batch (16 executions, 2 PPO epochs) and held-out tasks (64): the settings that learn
  // (ARCHITECTURE.md, "Learning"), for as many steps as fit the demo's few minutes; the warm-up
  // is 2 steps, not 4, so that most of them train at the full rate.
  steps: { ...trainFlags.steps, default: 20 },
  "lr-warmup": { ...trainFlags["lr-warmup"], default: 2 },
  // A shorter median tool latency (train's is 20 ms): the same heavy tail, a quarter as long to wait for.
  env: { ...trainFlags.env, default: "TOY_TOOL_MS=5" },
  run: { ...trainFlags.run, default: `demo-${Date.now().toString(36)}` }
} as const

export const command: Command<typeof flags> = {
  summary: "the main job: a short elastic RL run of the tiny policy on the toy suite (held-out score before and after)",
  configured: true,
  flags,
  run: async (argv) => {
    const f = parseConfigured("demo", flags, argv)
    const summary = await Effect.runPromise(Effect.scoped(runTraining(f, "demo")))
    for (const line of summaryLines(summary)) console.log(line)
    console.log(JSON.stringify(summary))
    return 0
  }
}
