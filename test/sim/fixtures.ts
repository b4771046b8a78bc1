/**
 * The tiny scenario the simulator tests share: 2 cells x 1 slot; 10 tokens/s per cell;
 * switches 1 s to training, 2 s back; weight sync 3 s; 2 steps of 2 executions (10 s and 20 s,
 * 100 tokens each), on-policy.
 */
export const tinyScenario = {
  cells: 2,
  slots_per_cell: 1,
  train_tokens_per_s_per_cell: 10,
  switch_to_train_s: 1,
  switch_to_rollout_s: 2,
  weight_sync_s: 3,
  steps: 2,
  executions_per_step: 2,
  max_staleness: 0,
  executions: [
    { duration_s: 10, tokens: 100 },
    { duration_s: 20, tokens: 100 }
  ]
}
