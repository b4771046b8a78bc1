/**
 * The update that ends a step, shared by the core trainer (`src/actors/trainer.ts`) and the
 * offline `gyre train --from-export` (`src/replay/from-export.ts`), so both make the same weights.
 *
 * Pass 1 is the step's distributed pass: every micro-batch's gradient on the step's weights
 * (proximal policy = those weights, so r = 1), summed in index order by the caller; AdamW on
 * that sum. With `ppoEpochs` E > 1, E - 1 more passes follow on the core alone, each over the
 * same micro-batches in index order on the weights the previous pass left, with the step's
 * weights as the proximal policy (their log-probs, which pass 1 computed with each gradient),
 * then AdamW:
 * PPO's epochs, where the clip range bounds how far the later passes move each token's
 * probability. The later passes depend only on the first pass's sum and the batches, so the
 * update stays the same whoever computed the first pass. The batches are loaded one at a time
 * (the core reads them back from the run's micro-batch store), and a micro-batch that failed in
 * the first pass is left out of the later ones.
 */
import { Effect } from "effect"
import type { PackedBatch } from "../common/packed-batch.ts"
import { adamwDefaults, type Trainer } from "../engine/trainer.ts"
import { stepLearningRate, type RunConfig } from "../protocols/run.ts"
import type { InOrderSum } from "./gradients.ts"
import { stepLoss } from "./step-planner.ts"

export interface StepUpdate {
  /** The first pass's gradient norm before clipping. */
  readonly gradNorm: number
  /** The later passes' fraction of trained tokens whose ratio was clipped (undefined with one pass). */
  readonly clipFraction: number | undefined
}

/** PPO epochs of the run (absent in runs journaled before the setting: 1). */
export const ppoEpochs = (config: RunConfig): number => config.training.ppoEpochs ?? 1

/** The step's micro-batches by index, loaded on demand. */
export interface StepBatches<E> {
  readonly count: number
  readonly load: (index: number) => Effect.Effect<PackedBatch, E>
}

/**
 * AdamW on the step's summed first-pass gradients `sum`, then the later passes (see the module
 * comment) with each batch's token log-probs from pass 1, in index order (`InOrderSum`).
 */
export const stepUpdate = Effect.fn("stepUpdate")(function* <E>(
  trainer: Trainer,
  config: RunConfig,
  step: number,
  batches: StepBatches<E>,
  first: Pick<InOrderSum, "sum" | "logprobs" | "failed">
) {
  const epochs = ppoEpochs(config)
  const adamw = { ...adamwDefaults, lr: stepLearningRate(config.training, step) }
  const given = stepLoss(config, step, "given")
  const { sum, logprobs: proximal } = first
  yield* trainer.setGrads(sum)
  const gradNorm = yield* trainer.step(adamw)
  let clipped = 0
  let tokens = 0
  for (let pass = 1; pass < epochs; pass++) {
    yield* trainer.zeroGrads()
    for (let i = 0; i < batches.count; i++) {
      if (first.failed.has(i)) continue
      const batch = yield* batches.load(i)
      const { stats } = yield* trainer.train({ ...batch, proximalLogprobs: proximal[i]! }, given)
      clipped += stats.clipFraction * stats.trainedTokens
      tokens += stats.trainedTokens
    }
    yield* trainer.step(adamw)
  }
  return { gradNorm, clipFraction: epochs > 1 ? (tokens > 0 ? clipped / tokens : 0) : undefined } satisfies StepUpdate
})
