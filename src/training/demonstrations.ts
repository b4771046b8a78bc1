/**
 * Recording a suite's demonstrations: its harness runs each task with the suite's scripted
 * oracle as the policy (no model, no gateway) and appends every call it makes, messages and
 * wanted reply, to a JSONL file (the format `warm-start.ts` reads).
 *
 * A suite opts in with `"demonstrations": {"env": {...}, "fileVariable": "..."}` in its
 * suite.json: the environment that selects the oracle, and the variable that names the file.
 */
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Effect, Schema } from "effect"
import { describeEnd, runInGroup } from "../harness/process-group.ts"
import type { Suite } from "../harness/suites.ts"

export class DemonstrationsFailed extends Schema.TaggedError<DemonstrationsFailed>()("DemonstrationsFailed", {
  suite: Schema.String,
  task: Schema.String,
  message: Schema.String
}) {}

/** Runs the oracle on `tasks` of `suite`, `concurrency` at a time, appending to `file`. */
export const recordDemonstrations = (
  suite: Suite,
  tasks: ReadonlyArray<string>,
  file: string,
  options: { readonly env?: Readonly<Record<string, string>>; readonly concurrency?: number } = {}
): Effect.Effect<void, DemonstrationsFailed> =>
  Effect.forEach(
    tasks,
    (id) =>
      Effect.gen(function* () {
        const source = suite.demonstrations
        const task = suite.task(id)
        if (source === undefined || task === undefined) {
          return yield* Effect.fail(
            new DemonstrationsFailed({ suite: suite.name, task: id, message: source === undefined ? "the suite declares no demonstrations" : "no such task" })
          )
        }
        const workspace = fs.mkdtempSync(path.join(os.tmpdir(), `gyre-demo-${id}-`))
        // One file per task, appended to `file` afterwards, so concurrent harnesses never interleave lines.
        const own = path.join(workspace, "..", `${path.basename(workspace)}.jsonl`)
        const result = yield* Effect.promise(() =>
          runInGroup({
            command: suite.harness.command,
            cwd: workspace,
            env: {
              ...(process.env as Record<string, string>),
              ...task.env,
              ...options.env,
              ...source.env,
              [source.fileVariable]: own,
              GYRE_TASK_ID: id,
              GYRE_WORKSPACE: workspace
            },
            timeoutMs: suite.harness.timeoutMs,
            graceMs: 2000,
            outputCapBytes: 16 * 1024
          })
        ).pipe(Effect.ensuring(Effect.sync(() => fs.rmSync(workspace, { recursive: true, force: true }))))
        if (result.exitCode !== 0 || !fs.existsSync(own)) {
          fs.rmSync(own, { force: true })
          return yield* Effect.fail(new DemonstrationsFailed({ suite: suite.name, task: id, message: `${describeEnd(result)}: ${result.stderr.slice(-2000)}` }))
        }
        fs.appendFileSync(file, fs.readFileSync(own))
        fs.rmSync(own, { force: true })
      }),
    { concurrency: options.concurrency ?? 2, discard: true }
  )
