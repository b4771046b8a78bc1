/**
 * A training run's configuration and its execution plan, shared by `gyre train`, the scheduler,
 * the core trainer and `gyre replay`: what was asked for, written once to the journal
 * (`gyre.<run>.sys.run-config`) so a run can be resumed, verified and audited from its log.
 *
 * Execution plan: batch `b` (trained by step `b`) holds executions `b * B .. b * B + B - 1`
 * (B = `executions_per_step`), the policy's own numbering. Execution `n` of batch `b` is named
 * `b<b>-x<n>`; the batch draws `B / group_size` tasks from the suite's `train` split, each run
 * `group_size` times (a GRPO group), tasks taken in order from a seeded permutation so that
 * consecutive batches see different tasks.
 */
import { Schema } from "effect"
import { mulberry32 } from "../tree/sample.ts"
import { AdvantageEstimator, Credit } from "../tree/advantage.ts"
import { PolicyConfig } from "../policy/vocabulary.ts"
import { Pace } from "./pace.ts"
import type { Sampling } from "../tree/record.ts"

const Positive = Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))
const NonNegative = Schema.Number.check(Schema.isGreaterThanOrEqualTo(0))

export const LossKind = Schema.Literals(["ppo", "is"])
export type LossKind = typeof LossKind.Type

export const TrainingSettings = Schema.Struct({
  advantage: AdvantageEstimator,
  /**
   * Whose reward a call trains with: its execution's score, or its own (the scorer's per-call
   * reward, pooled over the group: `src/tree/advantage.ts`). Absent (runs journaled before it): execution.
   */
  credit: Schema.optional(Credit),
  /** exact: whole trees; sampled: bounded dedup sampling of `maxPaths` paths per execution. */
  mode: Schema.Literals(["exact", "sampled"]),
  maxPaths: Positive,
  loss: LossKind,
  /** PPO clip range [1 - clipLow, 1 + clipHigh]. */
  clipLow: NonNegative,
  clipHigh: NonNegative,
  /** Cap of the importance weight pi_prox / mu (truncated IS); <= 0: no cap. */
  isCap: Schema.Number,
  lr: Schema.Number.check(Schema.isGreaterThan(0)),
  /**
   * Steps of linear learning-rate warm-up: step k updates at lr * min(1, (k + 1) / lrWarmup).
   * Absent (runs journaled before it existed) or 0: the full rate from the first step.
   */
  lrWarmup: Schema.optional(Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))),
  /**
   * PPO epochs: updates per step over the step's micro-batches, the first distributed, the
   * rest on the core (`src/training/update.ts`). Absent (runs journaled before it): 1.
   */
  ppoEpochs: Schema.optional(Positive),
  /** Tokens per micro-batch. */
  microBatchTokens: Positive,
  /** Checkpoint every this many steps (and after the last). */
  checkpointEvery: Positive
})
export type TrainingSettings = typeof TrainingSettings.Type

/** The learning rate of the update that ends step `step` (0-based), after the warm-up. */
export const stepLearningRate = (t: TrainingSettings, step: number): number => {
  const warmup = t.lrWarmup ?? 0
  return warmup <= 0 ? t.lr : t.lr * Math.min(1, (step + 1) / warmup)
}

/**
 * How a training run's rollouts sample, whatever the harness asks for: softmax(logits /
 * temperature) over the whole vocabulary (top-p 1). The trainer's loss takes the policy's
 * log-probs at the same temperature, so behaviour and policy are one distribution. Greedy
 * (0) and top-p truncation are not offered: the loss has no log-probs of either.
 */
export const RunSampling = Schema.Struct({
  temperature: Schema.Finite.check(Schema.isGreaterThan(0))
})
export type RunSampling = typeof RunSampling.Type

/** The sampling every rollout of the run uses (absent in the configuration: temperature 1). */
export const runSampling = (config: { readonly sampling?: RunSampling | undefined }): Sampling => ({ temperature: config.sampling?.temperature ?? 1, topP: 1 })

export const RunConfig = Schema.Struct({
  run: Schema.String,
  /** `src/policy` name: elastic, elastic-published, async, colocate. */
  policy: Schema.String,
  /** For `async`: rollout cells (the others train). */
  rolloutCells: Schema.optional(Positive),
  policyConfig: PolicyConfig,
  suite: Schema.String,
  /** Executions of one task in a batch (a group for group-relative advantages). */
  groupSize: Positive,
  /** Extra environment for every harness (the suite's knobs). */
  env: Schema.Record(Schema.String, Schema.String),
  seed: Schema.Int,
  training: TrainingSettings,
  /** The rollouts' sampling (absent: runs journaled before it, temperature 1). */
  sampling: Schema.optional(RunSampling),
  /** The model's tool-call format (`--tool-format`, a name of `src/openai/tool-formats.ts`); absent: its chat template's, else hermes. */
  toolFormat: Schema.optional(Schema.String),
  /** Directory of the initial weights (config.json + model.safetensors), policy version 0. */
  checkpoint: Schema.String,
  /** How the devices' KV caches store K and V (absent: f32; f16 halves the memory and the hand-off bytes). */
  kvDtype: Schema.optional(Schema.Literals(["f32", "f16"])),
  /** KV-cache blocks of 16 tokens per device (absent: 4096, 65,536 tokens): the longest context a device holds. */
  kvBlocks: Schema.optional(Positive),
  /** The devices' fixed rates (`--pace`, `pace.ts`; absent: unpaced): each device completes its work no earlier than they allow. */
  pace: Schema.optional(Pace),
  /** Where checkpoints are written (`<dir>/step-<k>`). */
  checkpointDir: Schema.String,
  /** Wall clock (ms since the epoch) of the run's start: the policy's `at` counts from it. */
  startedAt: Schema.Number
})
export type RunConfig = typeof RunConfig.Type

/** The execution id of execution `n` (batch `batch`). */
export const executionName = (batch: number, n: number): string => `b${batch}-x${n}`

/** Parses an id made by `executionName`; undefined for any other id. */
export const parseExecutionName = (id: string): { readonly batch: number; readonly n: number } | undefined => {
  const m = /^b(\d+)-x(\d+)$/.exec(id)
  return m === null ? undefined : { batch: Number(m[1]), n: Number(m[2]) }
}

export interface PlannedExecution {
  readonly execution: string
  readonly n: number
  readonly batch: number
  readonly task: string
  /** Index of its group within the batch (executions of one task). */
  readonly group: number
}

/** A seeded permutation of `0 .. count - 1` (Fisher-Yates over mulberry32). */
const permutation = (count: number, seed: number): Int32Array => {
  const out = Int32Array.from({ length: count }, (_, i) => i)
  const random = mulberry32(seed)
  for (let i = count - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1))
    const t = out[i]!
    out[i] = out[j]!
    out[j] = t
  }
  return out
}

/**
 * The executions of batch `batch`: `executions_per_step / groupSize` tasks of `trainTasks`
 * (the suite's train split, in suite order), each `groupSize` times.
 */
export const batchPlan = (config: RunConfig, trainTasks: ReadonlyArray<string>, batch: number): Array<PlannedExecution> => {
  const B = config.policyConfig.executions_per_step
  const groups = Math.max(1, Math.floor(B / config.groupSize))
  const order = permutation(trainTasks.length, config.seed)
  return Array.from({ length: B }, (_, i) => {
    const group = Math.min(groups - 1, Math.floor(i / config.groupSize))
    const task = trainTasks[order[(batch * groups + group) % trainTasks.length]!]!
    const n = batch * B + i
    return { execution: executionName(batch, n), n, batch, task, group }
  })
}
