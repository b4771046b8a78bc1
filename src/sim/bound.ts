/**
 * `lower_bound_s`: a makespan no policy can beat on a scenario, the larger of two parts. Both
 * rest on an earliest schedule that every run is at or behind, execution by execution.
 *
 * Earliest schedule. Every run starts executions in run order (start_i >= start_{i-1}) on at most
 * M = cells x slots_per_cell slots, and when execution i starts every earlier one has started and
 * at most M - 1 of them are still running; an execution of batch b waits for version b - s
 * (s = `max_staleness`), which arrives `weight_sync_s` after step b-1-s is trained. So with
 * T_k a lower bound on the end of step k, every run has start_i >= a_i and finish_i >= a_i + d_i
 * for a_i = max(gate_b, a_{i-1}, the (i-M+1)-th smallest of a_j + d_j, j < i), each term
 * monotone in earlier values (the greedy FIFO schedule on M slots that are never taken away).
 *
 * - critical path: step k trains its batch's tokens at most at R = cells x rate and not before
 *   step k-1 has ended or the tokens' execution has finished, then ends `step_update_s` (u) after
 *   its last token, so T_k = max(T_{k-1} + N_k / R, max_j f_j + (tokens of the batch's executions
 *   with f >= f_j) / R) + u, f the earliest finishes, N_k the batch's tokens; the part is T of the
 *   last step;
 * - work: at any time tau the cells still have to do every execution's rollout time left after
 *   tau (at least min(d_i, f_i - tau) of it on one slot of a cell) and to train every token not
 *   trainable before tau (its execution's earliest finish or its previous step's T is >= tau), so
 *   the run lasts at least tau + (rollout left / slots + tokens left / rate) / cells; the part is
 *   the largest over tau (tau = 0 is the plain sum of all work over cells).
 */
import { KeyHeap } from "../common/heap.ts"
import type { Executions, Scenario } from "./scenario.ts"

export interface LowerBound {
  readonly lower_bound_s: number
  readonly work_s: number
  readonly critical_path_s: number
}

/** Earliest starts and finishes of every execution, and each step's earliest end. */
interface Earliest {
  readonly start: Float64Array
  readonly finish: Float64Array
  readonly stepEnd: Float64Array
}

const earliest = (s: Scenario, e: Executions): Earliest => {
  const B = s.executions_per_step
  const M = s.cells * s.slots_per_cell
  const R = s.train_tokens_per_s_per_cell * s.cells
  const update = s.step_update_s ?? 0
  const n = s.steps * B
  const start = new Float64Array(n)
  const finish = new Float64Array(n)
  const T = new Float64Array(s.steps)
  const latest = new KeyHeap() // the M latest finishes so far
  const order: Array<number> = []
  let previous = 0
  for (let k = 0; k < s.steps; k++) {
    const g = k - 1 - s.max_staleness
    const gate = g < 0 ? 0 : T[g]! + s.weight_sync_s
    let batchTokens = 0
    order.length = 0
    for (let i = k * B; i < (k + 1) * B; i++) {
      let a = Math.max(gate, previous)
      if (latest.size === M) {
        a = Math.max(a, latest.peekKey())
        latest.pop()
      }
      start[i] = previous = a
      finish[i] = a + e.durations[i]!
      latest.push(finish[i]!, i)
      batchTokens += e.tokens[i]!
      order.push(i)
    }
    order.sort((x, y) => finish[y]! - finish[x]!)
    let t = (k > 0 ? T[k - 1]! : 0) + batchTokens / R
    let after = 0
    for (const i of order) {
      after += e.tokens[i]!
      t = Math.max(t, finish[i]! + after / R)
    }
    T[k] = t + update
  }
  return { start, finish, stepEnd: T }
}

/** Sum over x > tau of (x - tau), for ascending `xs`, swept by increasing tau. */
const excessAbove = (xs: Float64Array) => {
  let i = 0
  let rest = xs.reduce((a, b) => a + b, 0)
  return (tau: number) => {
    while (i < xs.length && xs[i]! <= tau) rest -= xs[i++]!
    return rest - tau * (xs.length - i)
  }
}

/** The work part: the largest tau + (work left after tau) / cells over tau. */
const tailWork = (s: Scenario, e: Executions, { start, finish, stepEnd }: Earliest): number => {
  const B = s.executions_per_step
  const n = start.length
  // The tokens of execution i are trainable from max(its finish, its previous step's end).
  const from = Array.from({ length: n }, (_, i) => i)
  const trainable = (i: number) => Math.max(finish[i]!, i < B ? 0 : stepEnd[((i / B) | 0) - 1]!)
  const at = from.map(trainable)
  from.sort((x, y) => at[x]! - at[y]!)
  const rolloutLeft = (() => {
    const finishes = excessAbove(Float64Array.from(finish).sort())
    const starts = excessAbove(Float64Array.from(start).sort())
    // Rollout left at tau: sum of (f - tau)+ minus sum of (start - tau)+.
    return (tau: number) => finishes(tau) - starts(tau)
  })()
  let tokensLeft = e.tokens.reduce((a, b) => a + b, 0)
  let best = 0
  // Between two trainable times tau + work left / cells cannot fall (at most M executions run in
  // the earliest schedule), so the largest value is at one, its tokens still left; the first is
  // at least the value at tau = 0, the plain sum of all work over cells.
  for (let j = 0; j < n; ) {
    const tau = at[from[j]!]!
    best = Math.max(best, tau + (rolloutLeft(tau) / s.slots_per_cell + tokensLeft / s.train_tokens_per_s_per_cell) / s.cells)
    while (j < n && at[from[j]!]! === tau) tokensLeft -= e.tokens[from[j++]!]!
  }
  return best
}

export const lowerBound = (s: Scenario, e: Executions): LowerBound => {
  const schedule = earliest(s, e)
  const critical_path_s = schedule.stepEnd[s.steps - 1]!
  const work_s = tailWork(s, e, schedule)
  return { lower_bound_s: Math.max(work_s, critical_path_s), work_s, critical_path_s }
}
