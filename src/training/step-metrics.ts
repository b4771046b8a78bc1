/**
 * A step's metrics (`StepMetrics`, journaled as `gyre.<run>.sys.step` and sent with
 * `StepDone`): the engine's per-micro-batch statistics, weighted by trained tokens, plus what
 * the core knows of each micro-batch it planned (the behaviour log-probs and versions of the
 * tokens it trains) and the step's time split.
 *
 * A token is trained when it has a parent, a non-zero loss weight and is not stale
 * (`step - version > maxStaleness`), the engine's rule (src/engine/trainer.ts), so the
 * behaviour/policy mismatch mean(mu - logp) is (sum of mu - meanLogprob * trained) / trained.
 *
 * Time split, in wall-clock milliseconds from `StartStep` to `StepDone`: `waitMs` while no
 * micro-batch was outstanding (waiting for executions to finish), `computeMs` while some were,
 * `reduceMs` from the last gradient to the optimizer step done, `publishMs` saving and
 * publishing the new weights (and writing the checkpoint when one is due).
 *
 * Bounded whatever the trees' size: `batchDigests` holds the first `BATCH_DIGEST_LIMIT`
 * micro-batches' digests and `allBatchesDigest` covers every one; `errors` holds one entry per
 * execution that could not be trained in full, its first reason cut to `ERROR_REASON_CHARS`.
 */
import { createHash } from "node:crypto"
import type { PackedBatch } from "../common/packed-batch.ts"
import type { TrainResult } from "../engine/trainer.ts"
import type { TrainStatsJson } from "../protocols/device.ts"
import type { StepError, StepMetrics } from "../protocols/scheduler.ts"
import type { PlanFigures } from "./step-planner.ts"

export type MicroBatchStats = typeof TrainStatsJson.Type

/** The statistics a micro-batch that could not be trained reports: nothing trained. */
export const noStats: MicroBatchStats = {
  loss: 0,
  weightSum: 0,
  entropy: 0,
  meanLogprob: 0,
  meanRatio: 1,
  clipFraction: 0,
  meanIsWeight: 1,
  maxIsWeight: 1,
  truncatedFraction: 0,
  trainedTokens: 0,
  staleTokens: 0
}

/** Micro-batch digests a step's metrics list one by one (64 hex digits each: ~140 KB of JSON). */
export const BATCH_DIGEST_LIMIT = 2048

/** Characters of an error's reason kept in the metrics. */
export const ERROR_REASON_CHARS = 300

/** sha256 (hex) of the micro-batch digests in index order, the hex strings concatenated. */
export const allBatchesDigest = (digests: ReadonlyArray<string>): string => {
  const hash = createHash("sha256")
  for (const d of digests) hash.update(d)
  return hash.digest("hex")
}

/** Whether the engine trains term `i` of `batch` at `step` (see the module comment). */
const trained = (batch: PackedBatch, i: number, step: number, maxStaleness: number): boolean =>
  batch.parents[i]! >= 0 && batch.weights[i] !== 0 && !(batch.versions[i]! >= 0 && step - batch.versions[i]! > maxStaleness)

/** The engine's statistics of one micro-batch, with its largest importance weight. */
export const microBatchStats = (result: TrainResult, batch: PackedBatch, step: number, maxStaleness: number, isCap: number): MicroBatchStats => {
  let maxIsWeight = result.stats.trainedTokens > 0 ? 0 : 1
  for (let i = 0; i < batch.length; i++) {
    if (!trained(batch, i, step, maxStaleness)) continue
    const w = Math.exp(result.tokenLogprobs[i]! - batch.behaviourLogprobs[i]!)
    maxIsWeight = Math.max(maxIsWeight, isCap > 0 ? Math.min(w, isCap) : w)
  }
  return { ...result.stats, maxIsWeight }
}

/** What the core keeps of a micro-batch it planned: its trained tokens' behaviour log-prob sum and staleness counts. */
export interface BatchSummary {
  readonly behaviourSum: number
  readonly staleness: ReadonlyArray<number>
}

export const summarize = (batch: PackedBatch, step: number, maxStaleness: number): BatchSummary => {
  let behaviourSum = 0
  const staleness: Array<number> = []
  for (let i = 0; i < batch.length; i++) {
    if (!trained(batch, i, step, maxStaleness)) continue
    behaviourSum += batch.behaviourLogprobs[i]!
    const s = Math.max(0, step - batch.versions[i]!)
    while (staleness.length <= s) staleness.push(0)
    staleness[s]!++
  }
  return { behaviourSum, staleness }
}

/** Wall time split between waiting for data and computing, by the outstanding micro-batches. */
export class PhaseClock {
  waitMs = 0
  computeMs = 0
  private busy = false
  constructor(private since: number) {}

  /** Records whether micro-batches are outstanding from `now` on. */
  set(busy: boolean, now: number): void {
    if (busy === this.busy) return
    this.stop(now)
    this.busy = busy
  }

  stop(now: number): void {
    if (this.busy) this.computeMs += now - this.since
    else this.waitMs += now - this.since
    this.since = now
  }
}

/** Sums of the micro-batches' statistics. */
export class MetricsSum {
  private loss = 0
  private tokens = 0
  private stale = 0
  private entropy = 0
  private clip = 0
  private isWeight = 0
  private isWeightMax = 0
  private logpSum = 0
  private behaviourSum = 0
  private readonly staleness: Array<number> = []
  private readonly trained = new Set<string>()
  private readonly errors = new Map<string, string>()

  /** Records that `execution` could not be trained in full (its first reason is kept). */
  addError(execution: string, reason: string): void {
    if (!this.errors.has(execution)) this.errors.set(execution, reason.length > ERROR_REASON_CHARS ? `${reason.slice(0, ERROR_REASON_CHARS - 3)}...` : reason)
  }

  /** Executions with an error so far. */
  get errorCount(): number {
    return this.errors.size
  }

  /** One micro-batch's figures; `executions` are those with tokens in it. */
  add(stats: MicroBatchStats, summary: BatchSummary, executions: ReadonlyArray<string>): void {
    for (const e of executions) this.trained.add(e)
    const n = stats.trainedTokens
    this.loss += stats.loss
    this.tokens += n
    this.stale += stats.staleTokens
    this.entropy += stats.entropy * n
    this.clip += stats.clipFraction * n
    this.isWeight += stats.meanIsWeight * n
    this.isWeightMax = Math.max(this.isWeightMax, n > 0 ? stats.maxIsWeight : 0)
    this.logpSum += stats.meanLogprob * n
    this.behaviourSum += summary.behaviourSum
    summary.staleness.forEach((c, s) => {
      while (this.staleness.length <= s) this.staleness.push(0)
      this.staleness[s]! += c
    })
  }

  metrics(fields: {
    readonly step: number
    readonly figures: PlanFigures
    readonly microBatches: number
    /** `packedBatchDigest` of every planned micro-batch, by index. */
    readonly batchDigests: ReadonlyArray<string>
    readonly devices: ReadonlyArray<string>
    readonly gradNorm: number
    /** The later PPO epochs' clip fraction, which replaces the first pass's (always 0: r = 1). */
    readonly clipFraction?: number | undefined
    readonly clock: PhaseClock
    readonly reduceMs: number
    readonly publishMs: number
  }): StepMetrics {
    const { figures: f, clock } = fields
    const per = (x: number, otherwise: number) => (this.tokens > 0 ? x / this.tokens : otherwise)
    return {
      step: fields.step,
      version: fields.step + 1,
      executions: f.told,
      dropped: f.dropped,
      meanScore: f.scored > 0 ? f.scoreSum / f.scored : 0,
      tokensTrained: this.tokens,
      loss: this.loss,
      entropy: per(this.entropy, 0),
      clipFraction: fields.clipFraction ?? per(this.clip, 0),
      isWeightMean: per(this.isWeight, 1),
      isWeightMax: this.tokens > 0 ? this.isWeightMax : 1,
      behaviourKl: per(this.behaviourSum - this.logpSum, 0),
      staleness: [...this.staleness],
      staleTokens: this.stale,
      dedupRatio: f.uniqueTokens > 0 ? f.callTokens / f.uniqueTokens : 1,
      microBatches: fields.microBatches,
      trainedExecutions: [...this.trained].sort(),
      devices: [...fields.devices],
      gradNorm: fields.gradNorm,
      waitMs: clock.waitMs,
      computeMs: clock.computeMs,
      reduceMs: fields.reduceMs,
      publishMs: fields.publishMs,
      trees: [...f.trees],
      batchDigests: fields.batchDigests.slice(0, BATCH_DIGEST_LIMIT),
      allBatchesDigest: allBatchesDigest(fields.batchDigests),
      errors: [...this.errors].map(([execution, reason]): StepError => ({ execution, reason }))
    }
  }
}
