/**
 * Group-relative advantages across the executions of one task, by one of three estimators
 * (rewards r_1..r_n of the group's executions, mean m):
 *   grpo     A_i = (r_i - m) / (s + eps), s the sample standard deviation (n - 1), 0 if n = 1
 *   dr-grpo  A_i = r_i - m                 (Dr. GRPO: no division by s; its loss is also
 *                                          a token sum, not a per-execution mean: units.ts)
 *   rloo     A_i = r_i - mean_{j != i} r_j = n / (n - 1) * (r_i - m), 0 if n = 1
 * Executions whose evaluation failed are dropped before grouping and reported.
 *
 * Credit (`credit`): with `execution`, every call of an execution shares its advantage; with
 * `call`, each call has a reward of its own (the scorer's per-call reward, else the
 * execution's score) and the same estimator runs over the pooled rewards of every call of the
 * group's executions (process supervision as in DeepSeekMath's GRPO), so a call is judged
 * against the group's other calls; with `state`, a call is judged against the calls of the
 * group's other executions that answered the same input (the same observation: `newInput` of
 * the tree), the estimator running over each such set of calls, and only a call whose input no
 * other call of the group answered against the pooled calls, as with `call`.
 */
import { Schema } from "effect"
import { rewardOf, type ExecutionOutcome } from "./outcome.ts"

export const AdvantageEstimator = Schema.Literals(["grpo", "dr-grpo", "rloo"])
export type AdvantageEstimator = typeof AdvantageEstimator.Type

export const AdvantageConfig = Schema.Struct({
  estimator: AdvantageEstimator,
  /** Added to GRPO's standard deviation (a group of equal rewards gets advantage 0). */
  epsilon: Schema.Number.check(Schema.isGreaterThanOrEqualTo(0))
})
export type AdvantageConfig = typeof AdvantageConfig.Type

export const Credit = Schema.Literals(["execution", "call", "state"])
export type Credit = typeof Credit.Type

/** Advantages of one group's rewards, in the same order. */
export const groupAdvantages = (rewards: ReadonlyArray<number>, config: AdvantageConfig): Array<number> => {
  const n = rewards.length
  if (n === 0) return []
  const mean = rewards.reduce((a, b) => a + b, 0) / n
  switch (config.estimator) {
    case "grpo": {
      const std = n > 1 ? Math.sqrt(rewards.reduce((a, r) => a + (r - mean) ** 2, 0) / (n - 1)) : 0
      return rewards.map((r) => (r - mean) / (std + config.epsilon))
    }
    case "dr-grpo":
      return rewards.map((r) => r - mean)
    case "rloo":
      return rewards.map((r) => (n > 1 ? (n / (n - 1)) * (r - mean) : 0))
  }
}

/** Call credit: per execution, its calls' advantages (by call index), from per-call rewards pooled over the group. */
export const callAdvantages = (rewards: ReadonlyArray<ArrayLike<number>>, config: AdvantageConfig): Array<Float64Array> => {
  const pooled = groupAdvantages(rewards.flatMap((r) => Array.from(r)), config)
  let k = 0
  return rewards.map((r) => Float64Array.from(pooled.slice(k, (k += r.length))))
}

/**
 * State credit: per execution, its calls' advantages (by call index), each call judged among
 * the group's calls with the same input key (`keys`, parallel to `rewards`); a call alone with
 * its key keeps its pooled advantage (`callAdvantages`).
 */
export const stateAdvantages = (
  rewards: ReadonlyArray<ArrayLike<number>>,
  keys: ReadonlyArray<ReadonlyArray<string>>,
  config: AdvantageConfig
): Array<Float64Array> => {
  const out = callAdvantages(rewards, config)
  const sets = new Map<string, Array<readonly [number, number]>>()
  keys.forEach((ks, e) =>
    ks.forEach((k, c) => {
      const calls = sets.get(k)
      if (calls === undefined) sets.set(k, [[e, c]])
      else calls.push([e, c])
    })
  )
  for (const calls of sets.values()) {
    if (calls.length < 2) continue
    const values = groupAdvantages(calls.map(([e, c]) => rewards[e]![c]!), config)
    calls.forEach(([e, c], i) => (out[e]![c] = values[i]!))
  }
  return out
}

/** Advantages of a step's executions, grouped by (run, task). */
export interface StepAdvantages {
  /** Execution id -> advantage, for every execution that trains. */
  readonly advantages: ReadonlyMap<string, number>
  /** Executions dropped because their evaluation never succeeded. */
  readonly dropped: ReadonlyArray<string>
}

export const stepAdvantages = (outcomes: ReadonlyArray<ExecutionOutcome>, config: AdvantageConfig): StepAdvantages => {
  const groups = new Map<string, Array<{ readonly execution: string; readonly reward: number }>>()
  const dropped: Array<string> = []
  for (const outcome of outcomes) {
    const reward = rewardOf(outcome)
    if (reward === undefined) {
      dropped.push(outcome.execution)
      continue
    }
    const key = JSON.stringify([outcome.run, outcome.task])
    const group = groups.get(key) ?? []
    group.push({ execution: outcome.execution, reward })
    groups.set(key, group)
  }
  const advantages = new Map<string, number>()
  for (const group of groups.values()) {
    const values = groupAdvantages(group.map((g) => g.reward), config)
    group.forEach((g, i) => advantages.set(g.execution, values[i]!))
  }
  return { advantages, dropped }
}
