/**
 * The recorded-run scenario the policy-replay tests share: 4 cells x 8 slots, 6 steps of 40
 * lognormal executions (median 10 min), off-policy by 1, slow training (2,000 tokens/s per cell).
 */
import { parseScenario } from "../../src/sim/scenario.ts"

export const recordedScenario = parseScenario({
  cells: 4,
  slots_per_cell: 8,
  train_tokens_per_s_per_cell: 2000,
  switch_to_train_s: 8.52,
  switch_to_rollout_s: 3.46,
  weight_sync_s: 20,
  steps: 6,
  executions_per_step: 40,
  max_staleness: 1,
  generator: { kind: "lognormal", median_s: 600, sigma: 1.2, max_s: 7200, tokens_per_s: 30, seed: 11 }
})
