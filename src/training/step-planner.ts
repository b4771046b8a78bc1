/**
 * Step planning on the core trainer (pure: no NATS, no clock): the finished executions of a
 * step's batch, told one by one with their rebuilt trees, become numbered micro-batches,
 * group by group as each group completes.
 *
 * A group (the executions of one task in the batch, `group` of `StepExecutionRef`) is
 * complete when all `groupSizes[group]` of its executions are told; an execution whose
 * evaluation failed is told too and dropped. On completion the group's advantages are
 * computed (`groupAdvantages` over the rewards of its scored executions, or with call credit
 * `callAdvantages` over the rewards of their calls), its executions
 * become units (exact tree or sampled paths), scaled by E = the step's planned executions so
 * that no group needs renormalising when a later one arrives, and are packed into micro-batches
 * with consecutive indices. An execution with advantage 0 (e.g. a GRPO group of equal
 * rewards) is not packed: every one of its loss terms is exactly 0. An execution with a path
 * longer than the budget is packed too (`packMicroBatches`: its long parts are micro-batches
 * of their own, trained in chunks by the engine); nothing told is left out for its size.
 *
 * Memory: a group's trees are kept until the group is planned, then let go (the step keeps
 * each execution's figures only); its micro-batches are built one at a time by the caller
 * (`PlannedMicroBatch.build`), which holds the group's units until it has built them all.
 *
 * Progress: an execution is trained when the gradients of all its micro-batches are in (or
 * at once, when it has none); `gradientIn` returns the scheduler's tokens of the executions
 * it completes.
 */
import type { PackedBatch } from "../common/packed-batch.ts"
import type { StepExecutionRef, StepPlan } from "../protocols/device.ts"
import { parseExecutionName, runSampling, type RunConfig, type TrainingSettings } from "../protocols/run.ts"
import type { LossConfig } from "../engine/trainer.ts"
import { callAdvantages, groupAdvantages, stateAdvantages, type AdvantageConfig } from "../tree/advantage.ts"
import { digestOf } from "../tree/hash.ts"
import { callRewardOf, rewardOf } from "../tree/outcome.ts"
import { packMicroBatches, type PackedMicroBatch } from "../tree/pack.ts"
import { NODE_DIGEST_CHARS, nodeDigests, treeDigest } from "../tree/stats.ts"
import type { TreeFigures } from "../protocols/scheduler.ts"
import type { TrajectoryTree } from "../tree/tree.ts"
import { stepUnits, type StepExecution, type TrainingMode } from "../tree/units.ts"

/**
 * The run's loss for micro-batches of step `step` (see ARCHITECTURE.md, "Training": ppo and is
 * coincide while r = 1); `proximal` "given": the later PPO epochs (`src/training/update.ts`).
 * The policy's log-probs are taken at the run's sampling temperature, the behaviour's.
 */
export const stepLoss = (config: RunConfig, step: number, proximal: "current" | "given" = "current"): LossConfig => {
  const t = config.training
  const ppo = t.loss === "ppo"
  return {
    kind: "ppo",
    clipLow: ppo ? t.clipLow : 0,
    clipHigh: ppo ? t.clipHigh : 0,
    isCap: t.isCap,
    currentVersion: step,
    maxStaleness: config.policyConfig.max_staleness,
    proximal,
    temperature: runSampling(config).temperature
  }
}

/**
 * Dr. GRPO's constant normaliser: each execution's loss is divided by these many tokens,
 * whatever its length (GRPO and RLOO divide by the execution's own trained tokens).
 */
export const DR_GRPO_TOKENS = 1024

/** Added to GRPO's standard deviation (a group of equal rewards gets advantage 0). */
const ADVANTAGE_EPSILON = 1e-6

export interface PlannedMicroBatch {
  readonly index: number
  /** Its length in tokens. */
  readonly tokens: number
  readonly executions: ReadonlyArray<string>
  /** Scheduler tokens of the executions whose last micro-batch (by index) this is. */
  readonly completesTokens: number
  /** Builds its arrays (the same content on every call). */
  readonly build: () => PackedBatch
}

/** What telling one execution did. */
export type Told =
  | { readonly _tag: "Refused"; readonly reason: string }
  | { readonly _tag: "Duplicate" }
  | {
      readonly _tag: "Queued"
      /** Micro-batches of the group this execution completed (none while the group waits). */
      readonly microBatches: ReadonlyArray<PlannedMicroBatch>
      /** Scheduler tokens of the executions that completed without a micro-batch. */
      readonly consumedTokens: number
    }

interface Member {
  readonly ref: StepExecutionRef
  readonly tree: TrajectoryTree
}

/** Figures of the told executions, for the step's metrics. */
export interface PlanFigures {
  told: number
  /** Evaluation failed (no reward to train with). */
  dropped: number
  scored: number
  scoreSum: number
  /** Sum over executions of prompt + output tokens of every call, and of tree tokens. */
  callTokens: number
  uniqueTokens: number
  /** Each told execution's tree, in the order told. */
  readonly trees: Array<TreeFigures>
}

/**
 * Most characters of node digests one step's metrics carry (a tree's `nodes`: 8 per node), so
 * the metrics stay far below a message's `max_payload` (1 MiB) however long the trees; the trees
 * told after the budget is spent record their figures without `nodes`.
 */
export const NODE_DIGEST_BUDGET = 256 * 1024

export class StepPlanner {
  /** Per group: its executions told so far, and the members waiting for the rest of it. */
  private readonly groupTold: Array<number>
  private readonly waiting: Array<Array<Member>>
  private readonly told = new Set<string>()
  private readonly remaining = new Map<string, { count: number; readonly tokens: number }>()
  private readonly byIndex: Array<ReadonlyArray<string>> = []
  private readonly mode: TrainingMode
  private nodeDigestChars = 0
  readonly figures: PlanFigures = { told: 0, dropped: 0, scored: 0, scoreSum: 0, callTokens: 0, uniqueTokens: 0, trees: [] }

  constructor(
    readonly plan: StepPlan,
    readonly settings: TrainingSettings,
    seed: number
  ) {
    this.groupTold = plan.groupSizes.map(() => 0)
    this.waiting = plan.groupSizes.map(() => [])
    this.mode = settings.mode === "exact" ? { _tag: "exact" } : { _tag: "sampled", maxPaths: settings.maxPaths, seed: seed + plan.step }
  }

  /** Every planned execution has been told. */
  get complete(): boolean {
    return this.figures.told === this.plan.executions
  }

  /** Micro-batches planned so far. */
  get microBatches(): number {
    return this.byIndex.length
  }

  tell(ref: StepExecutionRef, tree: TrajectoryTree): Told {
    if (this.told.has(ref.execution)) return { _tag: "Duplicate" }
    const refused = this.check(ref)
    if (refused !== undefined) return { _tag: "Refused", reason: refused }
    this.told.add(ref.execution)
    const f = this.figures
    f.told++
    f.callTokens += tree.totalCallTokens
    f.uniqueTokens += tree.uniqueTokens
    f.trees.push({ execution: ref.execution, calls: tree.callCount, uniqueTokens: tree.uniqueTokens, paths: tree.leaves().length, digest: treeDigest(tree), ...this.nodesOf(tree) })
    const reward = rewardOf(ref.outcome)
    if (reward === undefined) f.dropped++
    else {
      f.scored++
      f.scoreSum += reward
    }
    const group = this.waiting[ref.group]!
    group.push({ ref, tree })
    if (++this.groupTold[ref.group]! < this.plan.groupSizes[ref.group]!) return { _tag: "Queued", microBatches: [], consumedTokens: 0 }
    this.waiting[ref.group] = []
    return this.planGroup(group)
  }

  /** Marks micro-batch `index`'s gradient in; returns the tokens of the executions it completes. */
  gradientIn(index: number): number {
    let tokens = 0
    for (const execution of this.byIndex[index] ?? []) {
      const r = this.remaining.get(execution)!
      if (--r.count === 0) tokens += r.tokens
    }
    return tokens
  }

  /** The tree's `nodes` while the step's budget lasts. */
  private nodesOf(tree: TrajectoryTree): { readonly nodes?: string } {
    const chars = (tree.nodeCount - 1) * NODE_DIGEST_CHARS
    if (this.nodeDigestChars + chars > NODE_DIGEST_BUDGET) return {}
    this.nodeDigestChars += chars
    return { nodes: nodeDigests(tree) }
  }

  private check(ref: StepExecutionRef): string | undefined {
    if (ref.step !== this.plan.step) return `execution of step ${ref.step}, not ${this.plan.step}`
    if (parseExecutionName(ref.execution)?.batch !== this.plan.step) return `${ref.execution} is not an execution of batch ${this.plan.step}`
    const size = this.plan.groupSizes[ref.group]
    if (size === undefined) return `group ${ref.group} is not in the plan (${this.plan.groupSizes.length} groups)`
    if (this.groupTold[ref.group]! >= size) return `group ${ref.group} already has its ${size} executions`
    if (this.figures.told >= this.plan.executions) return `the step already has its ${this.plan.executions} executions`
    return undefined
  }

  private planGroup(group: ReadonlyArray<Member>): Told {
    const training = this.advantaged(group.filter((m) => rewardOf(m.ref.outcome) !== undefined))
    const constant = this.settings.advantage === "dr-grpo" ? DR_GRPO_TOKENS : undefined
    const units = stepUnits(training, this.mode, this.plan.executions, constant).units
    return this.number(group, packMicroBatches(units, this.settings.microBatchTokens).microBatches)
  }

  /** The scored executions of a group with their advantages; those whose every advantage is 0 train nothing and are left out. */
  private advantaged(scored: ReadonlyArray<Member>): Array<StepExecution> {
    const config: AdvantageConfig = { estimator: this.settings.advantage, epsilon: ADVANTAGE_EPSILON }
    const credit = this.settings.credit ?? "execution"
    if (credit !== "execution") {
      const rewards = scored.map(({ ref, tree }) => Array.from({ length: tree.callCount }, (_, c) => callRewardOf(ref.outcome, tree.call(c).id)!))
      const inputsOf = (tree: TrajectoryTree) => Array.from({ length: tree.callCount }, (_, c) => digestOf(tree.newInput(c)))
      const perCall = credit === "state" ? stateAdvantages(rewards, scored.map((m) => inputsOf(m.tree)), config) : callAdvantages(rewards, config)
      return scored.flatMap((m, i) => (perCall[i]!.some((a) => a !== 0) ? [{ execution: m.ref.execution, tree: m.tree, advantage: 0, callAdvantages: perCall[i]! }] : []))
    }
    const advantages = groupAdvantages(scored.map((m) => rewardOf(m.ref.outcome)!), config)
    return scored.flatMap((m, i) => (advantages[i] !== 0 ? [{ execution: m.ref.execution, tree: m.tree, advantage: advantages[i]! }] : []))
  }

  private number(group: ReadonlyArray<Member>, packed: ReadonlyArray<PackedMicroBatch>): Told {
    const first = this.byIndex.length
    const tokensOf = new Map(group.map((m) => [m.ref.execution, m.ref.tokens]))
    const last = new Map<string, number>()
    const counts = new Map<string, number>()
    packed.forEach(({ executions }, k) => {
      this.byIndex.push(executions)
      for (const e of executions) {
        last.set(e, first + k)
        counts.set(e, (counts.get(e) ?? 0) + 1)
      }
    })
    let consumedTokens = 0
    for (const m of group) {
      const count = counts.get(m.ref.execution) ?? 0
      this.remaining.set(m.ref.execution, { count, tokens: m.ref.tokens })
      if (count === 0) consumedTokens += m.ref.tokens
    }
    const microBatches = packed.map(({ tokens, executions, build }, k) => {
      let completesTokens = 0
      for (const e of executions) if (last.get(e) === first + k) completesTokens += tokensOf.get(e)!
      return { index: first + k, tokens, executions, completesTokens, build }
    })
    return { _tag: "Queued", microBatches, consumedTokens }
  }
}
