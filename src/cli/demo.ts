/**
 * `gyre demo`: the main job on the embedded default — a short elastic `gyre train` run of the
 * `tiny` policy on the `toy` suite that finishes in a few minutes on 2 cores.
 *
 * It is `gyre train` with the demo's defaults (flags are the same; `gyre demo --help` lists them):
 * the cached supervised warm start, the held-out score before, `--steps` elastic RL steps on two
 * CPU devices that move between rollout and training (executions in flight handed over with their
 * KV cache), the held-out score after, and the run's figures counted from its journal. The run's
 * JetStream store stays in `.gyre/runs/<run>` for `gyre replay --store`.
 */
import { Effect } from "effect"
import { parseConfigured, type Command } from "./args.ts"
import { runTraining, summaryLines, trainFlags } from "./train.ts"

const flags = {
  ...trainFlags,
  steps: { ...trainFlags.steps, default: 8 },
  // Half of train's batch, one epoch and 16 held-out tasks: the demo shows the loop in a few minutes, not the most learning.
  "executions-per-step": { ...trainFlags["executions-per-step"], default: 8 },
  "ppo-epochs": { ...trainFlags["ppo-epochs"], default: 1 },
  heldout: { ...trainFlags.heldout, default: "heldout-0..heldout-15" },
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
