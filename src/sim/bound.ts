/**
 * `lower_bound_s`: a makespan no policy can beat on a scenario, the larger of two parts.
 *
 * - work: every execution holds one of `slots_per_cell` slots of a cell for its duration and
 *   every token costs 1 / `train_tokens_per_s_per_cell` of a cell's time, so the run needs at
 *   least (sum durations / slots + sum tokens / rate) / cells seconds;
 * - critical path: T_k = max(T_{k-1-s} + d_k + n_k / R, T_{k-1} + N_k / R), T_j = 0 for j < 0,
 *   with d_k, n_k the duration and tokens of batch k's longest execution, N_k batch k's tokens,
 *   R the whole cluster's training rate: batch k's longest execution cannot start before step
 *   k-1-s is trained and its tokens cannot train before it ends; step k cannot end before step
 *   k-1 does plus its own tokens at full rate. The bound is T of the last step.
 */
import type { Executions, Scenario } from "./scenario.ts"

export interface LowerBound {
  readonly lower_bound_s: number
  readonly work_s: number
  readonly critical_path_s: number
}

export const lowerBound = (s: Scenario, e: Executions): LowerBound => {
  const B = s.executions_per_step
  const rate = s.train_tokens_per_s_per_cell
  const R = rate * s.cells
  let duration = 0
  let tokens = 0
  const T = new Float64Array(s.steps)
  const at = (j: number) => (j < 0 ? 0 : T[j]!)
  for (let k = 0; k < s.steps; k++) {
    let longest = 0
    let longestTokens = 0
    let batchTokens = 0
    for (let i = k * B; i < (k + 1) * B; i++) {
      const d = e.durations[i]!
      const n = e.tokens[i]!
      duration += d
      tokens += n
      batchTokens += n
      if (d > longest || (d === longest && n > longestTokens)) {
        longest = d
        longestTokens = n
      }
    }
    T[k] = Math.max(at(k - 1 - s.max_staleness) + longest + longestTokens / R, at(k - 1) + batchTokens / R)
  }
  const work_s = (duration / s.slots_per_cell + tokens / rate) / s.cells
  const critical_path_s = T[s.steps - 1]!
  return { lower_bound_s: Math.max(work_s, critical_path_s), work_s, critical_path_s }
}
