/**
 * The `tail` suite's one addition to the toy suite: each execution's horizon (main decisions)
 * drawn from a heavy tail, so that executions differ in length by the generation they need,
 * not by their tools' sleeps. horizon = max(2, round(TOY_STEPS x min(TAIL_MAX, Pareto(1,
 * TAIL_ALPHA)))), drawn from the execution's seed (the run's GYRE_SEED and GYRE_EXECUTION_ID,
 * as the toy suite's other draws: every policy of a benchmark gets the same horizons), else from
 * the task id. The harness and the scorer both set TOY_STEPS from it before loading the toy
 * suite's, so the scorer replays the walk the harness made.
 */
import { executionSeed, generator } from "../toy/world.mjs"

const num = (env, name, fallback, min) => {
  const text = env[name]
  if (text === undefined || text === "") return fallback
  const v = Number(text)
  if (!Number.isFinite(v) || v < min) throw new Error(`${name}=${text}: expected a number >= ${min}`)
  return v
}

/** The main decisions of this execution (the environment's GYRE_* and TOY_STEPS, TAIL_ALPHA, TAIL_MAX). */
export const horizonOf = (env) => {
  const base = Math.floor(num(env, "TOY_STEPS", 8, 2))
  const alpha = num(env, "TAIL_ALPHA", 1.2, 0.1)
  const max = num(env, "TAIL_MAX", 8, 1)
  const seed = env.GYRE_SEED && env.GYRE_EXECUTION_ID ? executionSeed(env.GYRE_SEED, env.GYRE_EXECUTION_ID) : executionSeed("task", env.GYRE_TASK_ID ?? "")
  const factor = Math.min(max, Math.pow(1 - generator(seed ^ 0x9e3779b9)(), -1 / alpha))
  return Math.max(2, Math.round(base * factor))
}
