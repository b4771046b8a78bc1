/**
 * The scenario file of `gyre sim`: a cluster, a cost model and a stream of executions (a JSON
 * file; format and semantics in ARCHITECTURE.md, "Scheduling policies and simulator").
 *
 * `parseScenario` checks a parsed JSON value against the Schema and fails with a one-line
 * `ScenarioError` naming the field; `executionsOf` expands the executions a run uses, in run
 * order (batch k = executions k*B .. (k+1)*B - 1), from the list (cycled) or the generator.
 */
import { Schema, SchemaIssue } from "effect"
import type { PolicyConfig } from "../policy/vocabulary.ts"

const Int = (min: number) => Schema.Int.check(Schema.isGreaterThanOrEqualTo(min))
const NonNegative = Schema.Number.check(Schema.isFinite(), Schema.isGreaterThanOrEqualTo(0))
const Positive = Schema.Number.check(Schema.isFinite(), Schema.isGreaterThan(0))

export const Execution = Schema.Struct({ duration_s: Positive, tokens: Int(0) })
export type Execution = typeof Execution.Type

export const LognormalGenerator = Schema.Struct({
  kind: Schema.Literal("lognormal"),
  /** Median duration: exp(mu). */
  median_s: Positive,
  sigma: NonNegative,
  /** Durations are capped here (the harness's timeout). */
  max_s: Positive,
  /** tokens = round(duration_s * tokens_per_s). */
  tokens_per_s: NonNegative,
  seed: Schema.Int
})

export const Scenario = Schema.Struct({
  /** Free text: where the numbers come from. Ignored by the simulator. */
  notes: Schema.optionalKey(Schema.Union([Schema.String, Schema.Array(Schema.String)])),
  cells: Int(1),
  slots_per_cell: Int(1),
  train_tokens_per_s_per_cell: Positive,
  switch_to_train_s: NonNegative,
  switch_to_rollout_s: NonNegative,
  weight_sync_s: NonNegative,
  /**
   * The update that ends a step once its last token is trained (the optimizer, later PPO epochs,
   * saving and publishing the weights), on the step's core. Absent: 0.
   */
  step_update_s: Schema.optionalKey(NonNegative),
  /**
   * Tokens of one micro-batch, in the executions' token units: a step's training splits into
   * ceil(step tokens / micro_batch_tokens) micro-batches and no more cells than that train it at
   * once (a cell claims a whole micro-batch). Absent: training divides among any number of cells.
   */
  micro_batch_tokens: Schema.optionalKey(Positive),
  steps: Int(1),
  executions_per_step: Int(1),
  max_staleness: Int(0),
  executions: Schema.optionalKey(Schema.NonEmptyArray(Execution)),
  generator: Schema.optionalKey(LognormalGenerator)
})
export type Scenario = typeof Scenario.Type

export class ScenarioError extends Error {
  readonly _tag = "ScenarioError"
}

const formatPath = (path: ReadonlyArray<PropertyKey>): string =>
  path.map((p, i) => (typeof p === "number" ? `[${p}]` : i === 0 ? String(p) : `.${String(p)}`)).join("")

/** The path and innermost issue of the first problem Schema found. */
const firstProblem = (issue: SchemaIssue.Issue, path: Array<PropertyKey> = []): { path: Array<PropertyKey>; leaf: SchemaIssue.Issue } => {
  switch (issue._tag) {
    case "Pointer":
      return firstProblem(issue.issue, [...path, ...issue.path])
    case "Composite":
    case "AnyOf":
      return issue.issues.length > 0 ? firstProblem(issue.issues[0]!, path) : { path, leaf: issue }
    case "Filter":
    case "Encoding":
      return firstProblem(issue.issue, path)
    default:
      return { path, leaf: issue }
  }
}

const valueAt = (input: unknown, path: ReadonlyArray<PropertyKey>): unknown =>
  path.reduce<unknown>((v, k) => (v !== null && typeof v === "object" ? (v as Record<PropertyKey, unknown>)[k] : undefined), input)

const decode = Schema.decodeUnknownExit(Scenario)

/** Checks `input` (parsed JSON); throws a `ScenarioError` whose one-line message names the field. */
export const parseScenario = (input: unknown, source = "scenario"): Scenario => {
  const fail = (field: string, what: string) => new ScenarioError(`${source}: field ${field}: ${what}`)
  const exit = decode(input, { errors: "first", onExcessProperty: "error" })
  if (exit._tag === "Failure") {
    const error = exit.cause.reasons.find((r) => r._tag === "Fail")?.error
    if (!Schema.isSchemaError(error)) throw new ScenarioError(`${source}: not a scenario`)
    const { path, leaf } = firstProblem(error.issue)
    const field = path.length === 0 ? "(top level)" : formatPath(path)
    const message = error.message.split("\n")[0]!
    const what =
      leaf._tag === "UnexpectedKey"
        ? "unknown field"
        : leaf._tag === "MissingKey"
          ? "is required"
          : `${message}, got ${JSON.stringify(valueAt(input, path)) ?? "nothing"}`
    throw fail(field, what)
  }
  const scenario = exit.value
  if ((scenario.executions === undefined) === (scenario.generator === undefined)) {
    throw fail("executions", "give exactly one of executions or generator")
  }
  if (scenario.generator && scenario.generator.max_s < scenario.generator.median_s) {
    throw fail("generator.max_s", `must be at least median_s (${scenario.generator.median_s})`)
  }
  return scenario
}

/** Reads and checks a scenario file. */
export const loadScenario = async (file: string): Promise<Scenario> => {
  const { readFile } = await import("node:fs/promises")
  let text: string
  try {
    text = await readFile(file, "utf8")
  } catch (e) {
    throw new ScenarioError(`${file}: cannot read (${(e as NodeJS.ErrnoException).code ?? String(e)})`)
  }
  let json: unknown
  try {
    json = JSON.parse(text)
  } catch (e) {
    throw new ScenarioError(`${file}: not JSON (${(e as Error).message})`)
  }
  return parseScenario(json, file)
}

/** The executions a run uses, in run order: `steps * executions_per_step` of them. */
export interface Executions {
  readonly durations: Float64Array
  readonly tokens: Float64Array
}

/** A 32-bit seeded generator (mulberry32): uniform in (0, 1). */
const uniform = (seed: number) => {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return (((t ^ (t >>> 14)) >>> 0) + 0.5) / 4294967296
  }
}

export const executionsOf = (s: Scenario): Executions => {
  const n = s.steps * s.executions_per_step
  const durations = new Float64Array(n)
  const tokens = new Float64Array(n)
  if (s.executions) {
    const list = s.executions
    for (let i = 0; i < n; i++) {
      const e = list[i % list.length]!
      durations[i] = e.duration_s
      tokens[i] = e.tokens
    }
  } else {
    const g = s.generator!
    const u = uniform(g.seed)
    for (let i = 0; i < n; i++) {
      // Box-Muller: one standard normal from two uniforms.
      const z = Math.sqrt(-2 * Math.log(u())) * Math.cos(2 * Math.PI * u())
      durations[i] = Math.min(g.max_s, g.median_s * Math.exp(g.sigma * z))
      tokens[i] = Math.round(durations[i]! * g.tokens_per_s)
    }
  }
  return { durations, tokens }
}

/** What the policies are told of the scenario. */
export const policyConfigOf = (s: Scenario): PolicyConfig => ({
  slots_per_cell: s.slots_per_cell,
  executions_per_step: s.executions_per_step,
  steps: s.steps,
  max_staleness: s.max_staleness
})
