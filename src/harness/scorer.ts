/**
 * Scoring an execution: the suite's scorer runs on the workspace, whatever state it is in. Its
 * last stdout line is `{"score": x, "details": ..., "no_artifact"?: true, "rewards"?: {<call id>:
 * r}}` (`rewards`: per-call rewards, kept on the outcome); a crash, a timeout or another line is
 * an evaluation failure, retried within the budget, and an execution whose evaluation never
 * succeeds is `failed` (score null: dropped from training).
 */
import { Duration, Effect, Exit, Schema } from "effect"
import { CallRewards, type ExecutionOutcome } from "../tree/outcome.ts"
import { clip, describeEnd, tailOf, type GroupResult } from "./process-group.ts"
import type { Suite, SuiteProgram } from "./suites.ts"

const ScorerReport = Schema.Struct({
  score: Schema.Number.check(Schema.isBetween({ minimum: 0, maximum: 1 })),
  details: Schema.optional(Schema.Unknown),
  no_artifact: Schema.optional(Schema.Boolean),
  rewards: Schema.optional(CallRewards)
}).check(
  Schema.makeFilter((r) => r.no_artifact !== true || r.score === 0 || "no_artifact needs score 0"),
  Schema.makeFilter((r) => r.no_artifact !== true || r.rewards === undefined || "no_artifact has no per-call rewards")
)

/** What scoring adds to an execution's outcome. */
export type Evaluation = Pick<ExecutionOutcome, "evaluation" | "score" | "rewards" | "attempts" | "detail">

/** One scorer run's verdict: a report, or why this attempt is an evaluation failure. */
const judge = (r: GroupResult): { ok: true; report: typeof ScorerReport.Type } | { ok: false; reason: string } => {
  if (r.startError !== undefined || r.timedOut || r.exitCode !== 0) {
    return { ok: false, reason: `scorer ${describeEnd(r)}${r.stderr.trim() !== "" ? `: ${tailOf(r.stderr.trim(), 300)}` : ""}` }
  }
  const last = r.stdout.trim().split("\n").pop() ?? ""
  let json: unknown
  try {
    json = JSON.parse(last)
  } catch {
    return { ok: false, reason: `scorer printed no JSON on its last line: ${clip(JSON.stringify(last), 200)}` }
  }
  const report = Schema.decodeUnknownExit(ScorerReport)(json)
  return Exit.isSuccess(report) ? { ok: true, report: report.value } : { ok: false, reason: `invalid scorer output ${clip(last, 200)}: ${clip(String(report.cause), 300)}` }
}

const evaluationOf = (report: typeof ScorerReport.Type, attempts: number): Evaluation => {
  const details = report.details === undefined ? "" : `: ${clip(JSON.stringify(report.details), 1000)}`
  return report.no_artifact === true
    ? { evaluation: "no-artifact", score: 0, attempts, detail: `no artifact${details}` }
    : {
        evaluation: "scored",
        score: report.score,
        ...(report.rewards === undefined ? {} : { rewards: report.rewards }),
        attempts,
        detail: `score ${report.score}${details}`
      }
}

export interface ScoringOptions {
  /** Runs a suite program in `cwd` with `env` and a time limit. */
  readonly run: (program: SuiteProgram, cwd: string, env: Record<string, string>, timeoutMs: number) => Effect.Effect<GroupResult>
  /** Keeps one attempt's output (the runner's `scorer.log`). */
  readonly log: (title: string, r: GroupResult) => Effect.Effect<void>
  /** Attempts after a failed one. */
  readonly retries: number
  /** Pause between attempts. */
  readonly backoffMs: number
}

/** Scores the workspace `cwd` with the suite's scorer, retrying a failed evaluation within the budget. */
export const evaluate = (suite: Suite, cwd: string, env: Record<string, string>, options: ScoringOptions) =>
  Effect.gen(function* () {
    let reason = ""
    const attempts = 1 + Math.max(0, options.retries)
    for (let attempt = 1; attempt <= attempts; attempt++) {
      if (attempt > 1) yield* Effect.sleep(Duration.millis(options.backoffMs))
      const r = yield* options.run(suite.scorer, cwd, env, suite.scorer.timeoutMs)
      yield* options.log(`scorer attempt ${attempt}`, r)
      const verdict = judge(r)
      if (verdict.ok) return evaluationOf(verdict.report, attempt)
      reason = verdict.reason
      yield* Effect.logWarning(`evaluation attempt ${attempt}/${attempts} failed: ${reason}`)
    }
    return { evaluation: "failed", score: null, attempts, detail: `evaluation failed ${attempts} times; last: ${reason}` } satisfies Evaluation
  })
