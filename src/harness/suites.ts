/**
 * Task suites: loading and validating `suites/<name>/suite.json` (format in ARCHITECTURE.md,
 * "Harness runner and task suites").
 *
 * A suite names a harness command and a scorer command (argv arrays; `{suite}` stands for the
 * suite's directory), their time limits, an optional workspace template directory and
 * environment, and its tasks. A task entry with `count` is a series: `count` tasks whose id
 * and environment values have `{n}` replaced by `start`, `start + 1`, ... Every problem is
 * reported as a `SuiteError` naming the file and the field (`tasks[2].split: ...`).
 */
import * as fs from "node:fs"
import * as path from "node:path"
import { Effect, Exit, Schema, SchemaIssue } from "effect"
import { fieldPath } from "../common/schema-path.ts"
import { Split } from "../protocols/harness.ts"

const SUITE_NAME = /^[a-z0-9][a-z0-9_-]*$/
/** Task ids end up in file names and environment variables: letters, digits, `_`, `-`, `.`. */
const TASK_ID = /^[A-Za-z0-9_-][A-Za-z0-9_.-]*$/

export class SuiteError extends Schema.TaggedError<SuiteError>()("SuiteError", {
  suite: Schema.String,
  /** `suites/<name>/suite.json: <field>: <what is wrong>` */
  message: Schema.String
}) {}

const PositiveInt = Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))
const Env = Schema.Record(Schema.String, Schema.String)
const Command = Schema.Array(Schema.NonEmptyString).check(Schema.isMinLength(1))

const Program = Schema.Struct({
  /** argv; `{suite}` in any element is replaced by the suite's absolute directory. */
  command: Command,
  timeoutMs: PositiveInt
})

const TaskEntry = Schema.Struct({
  id: Schema.NonEmptyString,
  split: Split,
  /** Workspace template of this task (a directory relative to the suite), instead of the suite's. */
  template: Schema.optional(Schema.NonEmptyString),
  env: Schema.optional(Env),
  /** A series of this many tasks, `{n}` in the id and env values = start, start + 1, ... */
  count: Schema.optional(PositiveInt),
  start: Schema.optional(Schema.Int.check(Schema.isGreaterThanOrEqualTo(0)))
})

/** The JSON document `suites/<name>/suite.json`. */
export const SuiteFile = Schema.Struct({
  description: Schema.String,
  harness: Program,
  scorer: Program,
  template: Schema.optional(Schema.NonEmptyString),
  env: Schema.optional(Env),
  /** How the harness records the suite's oracle demonstrations (`src/training/demonstrations.ts`). */
  demonstrations: Schema.optional(
    Schema.Struct({
      /** Environment that makes the harness follow the oracle instead of calling a model. */
      env: Env,
      /** Variable naming the JSONL file the harness appends each call's messages and reply to. */
      fileVariable: Schema.NonEmptyString
    })
  ),
  tasks: Schema.Array(TaskEntry).check(Schema.isMinLength(1))
})
export type SuiteFile = typeof SuiteFile.Type

export interface SuiteProgram {
  readonly command: ReadonlyArray<string>
  readonly timeoutMs: number
}

export interface Task {
  readonly id: string
  readonly split: Split
  /** Absolute template directory copied into a fresh workspace, or none (empty workspace). */
  readonly template: string | undefined
  /** The suite's environment overlaid with the task's. */
  readonly env: Readonly<Record<string, string>>
}

export interface Suite {
  readonly name: string
  readonly dir: string
  readonly description: string
  readonly harness: SuiteProgram
  readonly scorer: SuiteProgram
  readonly tasks: ReadonlyArray<Task>
  readonly task: (id: string) => Task | undefined
  readonly demonstrations: SuiteFile["demonstrations"]
}

const formatter = SchemaIssue.makeFormatterStandardSchemaV1()


class Invalid extends Error {
  constructor(readonly field: string, readonly reason: string) {
    super(`${field}: ${reason}`)
  }
}

const substitute = (text: string, n: number) => text.replaceAll("{n}", String(n))

/** The suite's commands with `{suite}` substituted; a relative path to a program must exist. */
const programOf = (p: typeof Program.Type, dir: string, field: string): SuiteProgram => {
  const command = p.command.map((a) => a.replaceAll("{suite}", dir))
  const program = command[0]!
  if (program.includes("/") && !fs.existsSync(path.resolve(dir, program))) {
    throw new Invalid(`${field}.command[0]`, `program ${program} does not exist`)
  }
  return { command: program.includes("/") ? [path.resolve(dir, program), ...command.slice(1)] : command, timeoutMs: p.timeoutMs }
}

const templateOf = (dir: string, relative: string | undefined, field: string): string | undefined => {
  if (relative === undefined) return undefined
  const at = path.resolve(dir, relative)
  if (!fs.statSync(at, { throwIfNoEntry: false })?.isDirectory()) throw new Invalid(field, `template directory ${relative} does not exist in ${dir}`)
  return at
}

const expandTasks = (file: SuiteFile, dir: string): Array<Task> => {
  const suiteTemplate = templateOf(dir, file.template, "template")
  const tasks: Array<Task> = []
  const firstAt = new Map<string, number>()
  file.tasks.forEach((entry, i) => {
    const field = `tasks[${i}]`
    if (entry.count === undefined && entry.start !== undefined) throw new Invalid(`${field}.start`, "start without count")
    if (entry.count !== undefined && !entry.id.includes("{n}")) throw new Invalid(`${field}.id`, "a series (count) needs {n} in its id")
    const template = entry.template !== undefined ? templateOf(dir, entry.template, `${field}.template`) : suiteTemplate
    const start = entry.start ?? 0
    const numbers = entry.count === undefined ? [start] : Array.from({ length: entry.count }, (_, k) => start + k)
    for (const n of numbers) {
      const id = entry.count === undefined ? entry.id : substitute(entry.id, n)
      if (!TASK_ID.test(id)) throw new Invalid(`${field}.id`, `task id '${id}' must match ${TASK_ID.source}`)
      const earlier = firstAt.get(id)
      if (earlier !== undefined) throw new Invalid(`${field}.id`, `duplicate task id '${id}' (also tasks[${earlier}])`)
      firstAt.set(id, i)
      const own = Object.fromEntries(Object.entries(entry.env ?? {}).map(([k, v]) => [k, entry.count === undefined ? v : substitute(v, n)]))
      tasks.push({ id, split: entry.split, template, env: { ...file.env, ...own } })
    }
  })
  return tasks
}

/** Parses and validates a suite document found in `dir` (the suite's directory). */
export const parseSuite = (name: string, dir: string, text: string): Effect.Effect<Suite, SuiteError> =>
  Effect.suspend(() => {
    const where = path.join(dir, "suite.json")
    const fail = (message: string) => Effect.fail(new SuiteError({ suite: name, message: `${where}: ${message}` }))
    let json: unknown
    try {
      json = JSON.parse(text)
    } catch (e) {
      return fail(`not JSON: ${e instanceof Error ? e.message : String(e)}`)
    }
    const decoded = Schema.decodeUnknownExit(SuiteFile)(json, { errors: "all", onExcessProperty: "error" })
    if (Exit.isFailure(decoded)) {
      const error = decoded.cause.reasons.find((r) => r._tag === "Fail")?.error
      const issues = error instanceof Schema.SchemaError ? formatter(error.issue).issues : []
      return fail(issues.map((i) => `${fieldPath(i.path) || "(document)"}: ${i.message}`).join("; ") || "invalid suite document")
    }
    try {
      const file = decoded.value
      const tasks = expandTasks(file, dir)
      const byId = new Map(tasks.map((t) => [t.id, t]))
      return Effect.succeed({
        name,
        dir,
        description: file.description,
        harness: programOf(file.harness, dir, "harness"),
        scorer: programOf(file.scorer, dir, "scorer"),
        tasks,
        task: (id: string) => byId.get(id),
        demonstrations: file.demonstrations
      })
    } catch (e) {
      if (e instanceof Invalid) return fail(e.message)
      throw e
    }
  })

/** Loads `<suitesDir>/<name>/suite.json`. */
export const loadSuite = (suitesDir: string, name: string): Effect.Effect<Suite, SuiteError> =>
  Effect.suspend(() => {
    if (!SUITE_NAME.test(name)) return Effect.fail(new SuiteError({ suite: name, message: `suite name '${name}' must match ${SUITE_NAME.source}` }))
    const dir = path.resolve(suitesDir, name)
    const file = path.join(dir, "suite.json")
    let text: string
    try {
      text = fs.readFileSync(file, "utf8")
    } catch (e) {
      return Effect.fail(new SuiteError({ suite: name, message: `${file}: cannot read: ${e instanceof Error ? e.message : String(e)}` }))
    }
    return parseSuite(name, dir, text)
  })

/** The suite's `train` split, in suite order (the tasks a training run's plan draws from). */
export const trainTaskIds = (suite: Suite): ReadonlyArray<string> => suite.tasks.filter((t) => t.split === "train").map((t) => t.id)

/** The names of the suites in `suitesDir` (directories holding a suite.json). */
export const listSuites = (suitesDir: string): ReadonlyArray<string> =>
  fs
    .readdirSync(suitesDir, { withFileTypes: true })
    .filter((d) => d.isDirectory() && SUITE_NAME.test(d.name) && fs.existsSync(path.join(suitesDir, d.name, "suite.json")))
    .map((d) => d.name)
    .sort()
