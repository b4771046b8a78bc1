/**
 * What one engine step feeds the model: a decode token for every generation whose prompt is
 * in, then prompt chunks for those still prefilling, in admission order, at most
 * `prefillChunk` prompt tokens in all (so a long prefill never stalls the decoders for long).
 * A generation that still has to anchor its prompt stops one token short of it, so the K/V
 * of the prompt without its last token can be forked off before that token goes in.
 */
import type { Generation } from "./generation.ts"

export interface StepInput {
  readonly g: Generation
  /** Tokens of `g.pending` fed this step, from `g.appended`. */
  readonly take: number
}

export const planStep = (running: ReadonlyArray<Generation>, prefillChunk: number): Array<StepInput> => {
  const inputs: Array<StepInput> = []
  let budget = prefillChunk
  for (const g of running) if (g.pending.length - g.appended === 1) inputs.push({ g, take: 1 })
  for (const g of running) {
    const left = g.pending.length - g.appended
    if (left > 1 && budget > 0) {
      const take = Math.min(g.anchorPrompt ? left - 1 : left, budget)
      budget -= take
      inputs.push({ g, take })
    }
  }
  return inputs
}
