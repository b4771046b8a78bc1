/**
 * The harness-runner actor: runs executions of suite tasks as black boxes and scores them.
 *
 * `RunExecution`: a fresh workspace (`<workspaceRoot>/<execution>/workspace`, copied from the
 * task's template); a random bearer key registered with the gateway (`OpenExecution`); the
 * suite's harness command in its own process group with `OPENAI_BASE_URL`, `OPENAI_API_KEY`,
 * `GYRE_TASK_ID`, `GYRE_EXECUTION_ID`, `GYRE_WORKSPACE`, `GYRE_SUITE_DIR`, `GYRE_SEED` (the
 * request's seed, when it has one) (+ the suite's, task's and request's environment), killed at the wall-clock limit (SIGTERM, SIGKILL after a grace period); the
 * key revoked (`CloseExecution`); then the suite's scorer on the workspace, whatever state
 * it is in. The scorer's last stdout line is `{"score": x, "details": ..., "no_artifact"?: true,
 * "rewards"?: {<call id>: r}}` (`rewards`: per-call rewards, kept on the outcome);
 * a crash, a timeout or another line is an evaluation failure, retried within the budget, and
 * an execution whose evaluation never succeeds is dropped (`failed`, counted in `Status`).
 * The `ExecutionOutcome` is published on `gyre.<run>.outcomes.<execution>` (acknowledged by
 * JetStream, message id `outcome-<execution>`) and answered. Harness and scorer output is
 * kept capped (`harness.log`, `scorer.log` beside the workspace); the execution's directory
 * is removed unless the keep policy says otherwise.
 *
 * The harness gets no NATS credentials and none of the runner's environment (only `INHERITED`,
 * `HOME` set to the execution's own `home`); a `RunExecution.env` naming a loader, shell
 * start-up or credential variable (`FORBIDDEN_ENV`: `LD_*`, `BASH_ENV`, `NODE_OPTIONS`, ...)
 * is refused with `ForbiddenEnvironment`. Harness and scorer run as another user where the
 * runner is root (`harnessUser`): `runAs`, else `GYRE_HARNESS_UID`/`GYRE_HARNESS_GID` (0 keeps
 * root), else `nobody` (65534) once a probe shows nobody can run node and reach the suites and
 * the workspaces (else a warning says why they run as root). The execution directory is handed
 * to that user and the workspace root made traversable, so a harness cannot read the runner's
 * `/proc/<pid>/environ` or its files.
 *
 * At most `capacity` executions run at once (a semaphore); the actor's handler concurrency is
 * larger so that `Status` and a duplicate `RunExecution` (same execution id: it joins the
 * running one, or gets the recent outcome) are answered while the runner is full.
 */
import * as fs from "node:fs/promises"
import * as path from "node:path"
import { Deferred, Duration, Effect, Exit, Ref, Schedule, Schema, Semaphore } from "effect"
import { errorLine } from "../common/error-line.ts"
import * as Actor from "../runtime/actor.ts"
import { messageOf, TransportError } from "../runtime/errors.ts"
import { formatAddress, type ActorAddress } from "../runtime/names.ts"
import { refOf } from "../runtime/system.ts"
import { CallRewards, ExecutionOutcome } from "../tree/outcome.ts"
import { GatewayProtocol, apiKeyDigest, newApiKey } from "../protocols/gateway.ts"
import { ForbiddenEnvironment, HarnessRunnerProtocol, UnknownTask, type RunExecution } from "../protocols/harness.ts"
import { ensureTrajectoryStream, rlLayout } from "../protocols/layout.ts"
import { markExecutionStart } from "../protocols/trajectories.ts"
import { describeEnd, runInGroup, type GroupResult } from "../harness/process-group.ts"
import { loadSuite, type Suite, type SuiteProgram, type Task } from "../harness/suites.ts"

export type KeepPolicy = RunExecution["keepWorkspace"]

export interface HarnessRunnerConfig {
  /** Directory holding the suites (`<suitesDir>/<suite>/suite.json`). */
  readonly suitesDir: string
  /** The gateway actor that issues base URLs for execution keys. */
  readonly gateway: ActorAddress
  /** Executions run at once. */
  readonly capacity: number
  /** Scorer attempts after a failed one before the execution is dropped. */
  readonly evaluationRetries: number
  /** Where execution directories are made. */
  readonly workspaceRoot: string
  /** Kept in addition to what each request asks (the more keeping of the two applies). */
  readonly keepWorkspace?: KeepPolicy
  /** SIGTERM to SIGKILL at a time limit (default 2000 ms). */
  readonly graceMs?: number
  /** Output kept per stream of each harness and scorer run (default 64 KiB). */
  readonly outputCapBytes?: number
  /** Executions that may wait for a slot beyond `capacity` while Status stays answerable (default 64). */
  readonly maxQueued?: number
  /** Ask timeout towards the gateway (default 10 s). */
  readonly gatewayTimeoutMs?: number
  /** Pause between scorer attempts (default 200 ms). */
  readonly evaluationBackoffMs?: number
  /** Run harnesses and scorers as this user (default GYRE_HARNESS_UID/GYRE_HARNESS_GID, else nobody where the runner is root: `harnessUser`). */
  readonly runAs?: { readonly uid: number; readonly gid: number }
}

const Counts = Schema.Struct({ running: Schema.Number, finished: Schema.Number, dropped: Schema.Number })

const ScorerReport = Schema.Struct({
  score: Schema.Number.check(Schema.isBetween({ minimum: 0, maximum: 1 })),
  details: Schema.optional(Schema.Unknown),
  no_artifact: Schema.optional(Schema.Boolean),
  rewards: Schema.optional(CallRewards)
}).check(
  Schema.makeFilter((r) => r.no_artifact !== true || r.score === 0 || "no_artifact needs score 0"),
  Schema.makeFilter((r) => r.no_artifact !== true || r.rewards === undefined || "no_artifact has no per-call rewards")
)

/** Environment variables a harness or scorer inherits from the runner (no NATS credentials). */
const INHERITED = ["PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "TMPDIR", "SHELL", "TERM"]

/** Variables a request may not set: dynamic loaders, shell and interpreter start-up, credentials, the runner's own. */
export const FORBIDDEN_ENV =
  /^(LD_.*|DYLD_.*|BASH_ENV|ENV|BASH_FUNC_.*|SHELLOPTS|BASHOPTS|PS4|PROMPT_COMMAND|IFS|NODE_OPTIONS|NODE_PATH|NODE_EXTRA_CA_CERTS|PYTHONSTARTUP|PYTHONPATH|PYTHONHOME|PERL5OPT|PERL5LIB|RUBYOPT|RUBYLIB|JAVA_TOOL_OPTIONS|GIT_.*|NATS_.*|GYRE_.*|OPENAI_.*|PATH|HOME)$/

interface HarnessUser {
  readonly uid: number
  readonly gid: number
}

/** `nobody`/`nogroup` on Debian, Ubuntu, Fedora and RHEL 8+. */
const NOBODY: HarnessUser = { uid: 65534, gid: 65534 }

/** A uid or gid variable: a non-negative integer, or a defect naming it. */
const idOf = (name: string, value: string): number => {
  const n = Number(value)
  if (value.trim() === "" || !Number.isInteger(n) || n < 0) throw new Error(`${name} must be a user or group id (an integer >= 0), got '${value}'`)
  return n
}

/** The user `GYRE_HARNESS_UID` (and `GYRE_HARNESS_GID`, default the uid) names, if set. */
const runAsFromEnv = (): HarnessUser | undefined => {
  const { GYRE_HARNESS_UID: uid, GYRE_HARNESS_GID: gid } = process.env
  if (uid === undefined) return undefined
  return { uid: idOf("GYRE_HARNESS_UID", uid), gid: idOf("GYRE_HARNESS_GID", gid ?? uid) }
}

/**
 * Whether `user` can run this node and reach `suitesDir` (read) and `workspaceRoot` (traverse):
 * undefined when it can, else why not.
 */
const probe = (user: HarnessUser, suitesDir: string, workspaceRoot: string) =>
  Effect.promise((signal) =>
    runInGroup(
      {
        command: [process.execPath, "-e", `const fs = require("fs"); fs.accessSync(${JSON.stringify(suitesDir)}, 5); fs.accessSync(${JSON.stringify(workspaceRoot)}, 1)`],
        cwd: "/",
        env: baseEnv(),
        timeoutMs: 10_000,
        graceMs: 500,
        outputCapBytes: 4096,
        uid: user.uid,
        gid: user.gid
      },
      signal
    )
  ).pipe(Effect.map((r) => (r.exitCode === 0 ? undefined : `${describeEnd(r)}: ${tailOf(r.stderr.trim().split("\n").find((l) => l.startsWith("Error")) ?? r.stderr.trim(), 300)}`)))

/**
 * Who harnesses and scorers run as: `runAs`, else GYRE_HARNESS_UID/GID, else nobody where the
 * runner is root and nobody passes the probe (a warning says why not), else the runner's user.
 */
const harnessUser = (config: HarnessRunnerConfig, fromEnv: HarnessUser | undefined) =>
  Effect.gen(function* () {
    const chosen = config.runAs ?? fromEnv
    if (chosen !== undefined || process.getuid?.() !== 0) return chosen
    const refused = yield* probe(NOBODY, config.suitesDir, config.workspaceRoot)
    if (refused === undefined) return NOBODY
    yield* Effect.logWarning(
      `harness runner: harnesses run as root and can read this process's environment: uid ${NOBODY.uid} cannot reach the suites or the workspaces (${refused}); make ${config.suitesDir} readable by others, or set GYRE_HARNESS_UID (0: root on purpose)`
    )
    return undefined
  })

/** Hands `dir` and everything in it to `user`. */
const chownTree = async (dir: string, user: { uid: number; gid: number }): Promise<void> => {
  await fs.chown(dir, user.uid, user.gid)
  for (const entry of await fs.readdir(dir, { withFileTypes: true })) {
    const p = path.join(dir, entry.name)
    if (entry.isDirectory()) await chownTree(p, user)
    else await fs.lchown(p, user.uid, user.gid)
  }
}

const baseEnv = (): Record<string, string> => {
  const env: Record<string, string> = {}
  for (const name of INHERITED) if (process.env[name] !== undefined) env[name] = process.env[name]!
  // The runner's own node is on PATH, so suites can use `node` for scripts and JSON.
  env.PATH = [path.dirname(process.execPath), env.PATH].filter((p) => p !== undefined && p !== "").join(":")
  return env
}

const keepRank: Record<KeepPolicy, number> = { never: 0, "on-failure": 1, always: 2 }


const clip = (text: string, max: number) => (text.length <= max ? text : `${text.slice(0, max)}...`)
const tailOf = (text: string, max: number) => (text.length <= max ? text : `...${text.slice(text.length - max)}`)

type Evaluation = Pick<ExecutionOutcome, "evaluation" | "score" | "rewards" | "attempts" | "detail">

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

/** The harness-runner actor type for `config` (kind `harness-runner`). */
export const makeHarnessRunner = (config: HarnessRunnerConfig) => {
  const capacity = Math.max(1, config.capacity)
  const graceMs = config.graceMs ?? 2000
  const outputCapBytes = config.outputCapBytes ?? 64 * 1024
  const gatewayTimeoutMs = config.gatewayTimeoutMs ?? 10_000
  const backoffMs = config.evaluationBackoffMs ?? 200
  const gateway = refOf(GatewayProtocol, config.gateway)
  const fromEnv = runAsFromEnv()

  return Actor.make({
    kind: "harness-runner",
    protocol: HarnessRunnerProtocol,
    state: { schema: Counts, initial: () => ({ running: 0, finished: 0, dropped: 0 }) },
    concurrency: capacity + (config.maxQueued ?? 64) + 1,
    behaviour: (ctx) =>
      Effect.gen(function* () {
        const system = ctx.system
        const names = rlLayout(system.run)
        yield* ensureTrajectoryStream(system)
        yield* Effect.promise(() => fs.mkdir(config.workspaceRoot, { recursive: true }))
        // Others may traverse the workspace root (not list it), to reach their own execution's directory.
        if (process.getuid?.() === 0) yield* Effect.promise(() => fs.chmod(config.workspaceRoot, 0o711))
        const runAs = yield* harnessUser(config, fromEnv)
        const slots = yield* Semaphore.make(capacity)
        const inFlight = new Map<string, Deferred.Deferred<ExecutionOutcome>>()
        const recent = new Map<string, ExecutionOutcome>()

        const report = Effect.gen(function* () {
          const c = yield* Ref.get(ctx.state)
          ctx.reportLoad({ ...c, capacity })
        })
        const count = (f: (c: typeof Counts.Type) => typeof Counts.Type) => Ref.update(ctx.state, f).pipe(Effect.andThen(report))

        const run = (program: SuiteProgram, cwd: string, env: Record<string, string>, timeoutMs: number) =>
          Effect.promise((signal) => runInGroup({ command: program.command, cwd, env, timeoutMs, graceMs, outputCapBytes, uid: runAs?.uid, gid: runAs?.gid }, signal))

        const writeLog = (file: string, title: string, r: GroupResult) =>
          Effect.promise(() =>
            fs.writeFile(file, `# ${title}: ${describeEnd(r)}, ${r.outputBytes} bytes of output\n## stdout\n${r.stdout}\n## stderr\n${r.stderr}\n`).catch(() => undefined)
          )

        const evaluate = (suite: Suite, dir: string, cwd: string, env: Record<string, string>) =>
          Effect.gen(function* () {
            let reason = ""
            const attempts = 1 + Math.max(0, config.evaluationRetries)
            for (let attempt = 1; attempt <= attempts; attempt++) {
              if (attempt > 1) yield* Effect.sleep(Duration.millis(backoffMs))
              const r = yield* run(suite.scorer, cwd, env, suite.scorer.timeoutMs)
              yield* writeLog(path.join(dir, "scorer.log"), `scorer attempt ${attempt}`, r)
              const verdict = judge(r)
              if (verdict.ok) {
                const details = verdict.report.details === undefined ? "" : `: ${clip(JSON.stringify(verdict.report.details), 1000)}`
                return verdict.report.no_artifact === true
                  ? ({ evaluation: "no-artifact", score: 0, attempts: attempt, detail: `no artifact${details}` } satisfies Evaluation)
                  : ({
                      evaluation: "scored",
                      score: verdict.report.score,
                      ...(verdict.report.rewards === undefined ? {} : { rewards: verdict.report.rewards }),
                      attempts: attempt,
                      detail: `score ${verdict.report.score}${details}`
                    } satisfies Evaluation)
              }
              reason = verdict.reason
              yield* Effect.logWarning(`evaluation attempt ${attempt}/${attempts} failed: ${reason}`)
            }
            return { evaluation: "failed", score: null, attempts, detail: `evaluation failed ${attempts} times; last: ${reason}` } satisfies Evaluation
          })

        /** Opens the execution at the gateway: its base URL, or why not. */
        const open = (key: string, taskName: string, execution: string) =>
          system.ask(gateway, "OpenExecution", { keyDigest: apiKeyDigest(key), task: taskName, execution, defaultRole: "main" }, { timeoutMs: gatewayTimeoutMs }).pipe(
            Effect.retry({ times: 2, schedule: Schedule.exponential(Duration.millis(200)) }),
            Effect.map((r) => ({ ok: true as const, baseUrl: r.baseUrl })),
            Effect.catch((e) => Effect.succeed({ ok: false as const, reason: `gateway ${formatAddress(config.gateway)}: ${errorLine(e)}` }))
          )

        const publish = (outcome: ExecutionOutcome) =>
          Effect.tryPromise({
            try: () =>
              system.nats.js.publish(names.outcomes(outcome.execution), JSON.stringify(Schema.encodeSync(ExecutionOutcome)(outcome)), {
                msgID: `outcome-${outcome.execution}`
              }),
            catch: (e) => new TransportError({ operation: `publish outcome of ${outcome.execution}`, message: messageOf(e) })
          }).pipe(
            // Stored or nothing: after a minute of failures the actor crashes and the request comes back.
            Effect.retry({ times: 9, schedule: Schedule.exponential(Duration.millis(100)) }),
            Effect.orDie
          )

        const execute = (req: RunExecution, suite: Suite, task: Task) =>
          Effect.gen(function* () {
            yield* count((c) => ({ ...c, running: c.running + 1 }))
            const taskName = `${suite.name}/${task.id}`
            const dir = path.join(config.workspaceRoot, req.execution)
            const workspace = path.join(dir, "workspace")
            yield* Effect.promise(async () => {
              await fs.rm(dir, { recursive: true, force: true })
              await fs.mkdir(dir, { recursive: true })
              if (task.template !== undefined) await fs.cp(task.template, workspace, { recursive: true })
              else await fs.mkdir(workspace)
              await fs.mkdir(path.join(dir, "home"))
              if (runAs !== undefined) await chownTree(dir, runAs)
            })
            const env = {
              ...baseEnv(),
              ...task.env,
              ...req.env,
              HOME: path.join(dir, "home"),
              GYRE_TASK_ID: task.id,
              GYRE_EXECUTION_ID: req.execution,
              GYRE_WORKSPACE: workspace,
              GYRE_SUITE_DIR: suite.dir,
              ...(req.seed !== undefined ? { GYRE_SEED: String(req.seed) } : {})
            }

            const key = newApiKey()
            // Before any call of this run of it is recorded (a run again after a runner died starts the execution afresh).
            yield* markExecutionStart(system, req.execution, `${formatAddress(ctx.address)}#${ctx.incarnation}`).pipe(
              Effect.retry({ times: 9, schedule: Schedule.exponential(Duration.millis(100)) }),
              Effect.orDie
            )
            const opened = yield* open(key, taskName, req.execution)
            let ended: ExecutionOutcome["ended"] = "finished"
            let harnessFailed = true
            let evaluation: Evaluation
            if (!opened.ok) {
              evaluation = { evaluation: "failed", score: null, attempts: 0, detail: `not run: ${opened.reason}` }
            } else {
              const harness = yield* run(suite.harness, workspace, { ...env, OPENAI_BASE_URL: opened.baseUrl, OPENAI_API_KEY: key }, req.timeoutMs ?? suite.harness.timeoutMs)
              yield* system.ask(gateway, "CloseExecution", { execution: req.execution }, { timeoutMs: gatewayTimeoutMs }).pipe(
                Effect.catch((e) => Effect.logWarning(`CloseExecution ${req.execution}: ${errorLine(e)}`))
              )
              yield* writeLog(path.join(dir, "harness.log"), "harness", harness)
              ended = harness.timedOut ? "timed-out" : "finished"
              harnessFailed = harness.timedOut || harness.exitCode !== 0
              const scored = yield* evaluate(suite, dir, workspace, env)
              const stderr = harness.stderr.trim()
              const note = harnessFailed ? `; harness ${describeEnd(harness)}${stderr !== "" ? `: ${tailOf(stderr, 300)}` : ""}` : ""
              evaluation = { ...scored, detail: scored.detail + note }
            }

            const outcome: ExecutionOutcome = { run: system.run, task: taskName, execution: req.execution, ended, ...evaluation }
            yield* publish(outcome)
            const failed = harnessFailed || evaluation.evaluation === "failed"
            const policy = keepRank[config.keepWorkspace ?? "never"] > keepRank[req.keepWorkspace] ? config.keepWorkspace! : req.keepWorkspace
            const keep = policy === "always" || (policy === "on-failure" && failed)
            if (!keep) yield* Effect.promise(() => fs.rm(dir, { recursive: true, force: true }))
            const dropped = evaluation.evaluation === "failed"
            yield* count((c) => ({ running: c.running - 1, finished: c.finished + (dropped ? 0 : 1), dropped: c.dropped + (dropped ? 1 : 0) }))
            return outcome
          })

        const RunExecution = (req: RunExecution) =>
          Effect.gen(function* () {
            const forbidden = Object.keys(req.env).filter((name) => FORBIDDEN_ENV.test(name))
            if (forbidden.length > 0) {
              return yield* new ForbiddenEnvironment({ names: forbidden, reason: `a request may not set ${forbidden.join(", ")} (loader, start-up, credential or runner variables)` })
            }
            const known = recent.get(req.execution)
            if (known !== undefined) return known
            const running = inFlight.get(req.execution)
            if (running !== undefined) return yield* Deferred.await(running)
            const suite = yield* loadSuite(config.suitesDir, req.task.suite).pipe(
              Effect.mapError((e) => new UnknownTask({ suite: req.task.suite, task: req.task.task, reason: e.message }))
            )
            const task = suite.task(req.task.task)
            if (task === undefined) {
              return yield* new UnknownTask({ suite: suite.name, task: req.task.task, reason: `no task '${req.task.task}' in suite ${suite.name} (${suite.tasks.length} tasks)` })
            }
            const done = yield* Deferred.make<ExecutionOutcome>()
            inFlight.set(req.execution, done)
            const outcome = yield* slots.withPermits(1)(execute(req, suite, task)).pipe(
              Effect.onExit((exit) => Effect.sync(() => inFlight.delete(req.execution)).pipe(Effect.andThen(Deferred.done(done, exit))))
            )
            recent.set(req.execution, outcome)
            if (recent.size > 1024) recent.delete(recent.keys().next().value!)
            return outcome
          })

        yield* report
        return {
          RunExecution,
          Status: () => Ref.get(ctx.state).pipe(Effect.map((c) => ({ ...c, capacity })))
        }
      })
  })
}
