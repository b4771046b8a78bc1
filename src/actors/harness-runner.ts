/**
 * The harness-runner actor: runs executions of suite tasks as black boxes and scores them.
 *
 * `RunExecution`: a fresh workspace (`<workspaceRoot>/<execution>/workspace`, copied from the
 * task's template); a random bearer key registered with the gateway (`OpenExecution`); the
 * suite's harness command in its own process group with `OPENAI_BASE_URL`, `OPENAI_API_KEY`,
 * `ANTHROPIC_BASE_URL`, `ANTHROPIC_API_KEY`, `ANTHROPIC_AUTH_TOKEN` (`gatewayEnv`), `GYRE_TASK_ID`, `GYRE_EXECUTION_ID`, `GYRE_WORKSPACE`, `GYRE_SUITE_DIR`, `GYRE_SEED` (the
 * request's seed, when it has one) (+ the suite's, task's and request's environment), killed at the wall-clock limit (SIGTERM, SIGKILL after a grace period); the
 * key revoked (`CloseExecution`); then the suite's scorer on the workspace, whatever state
 * it is in, retried within the budget (`src/harness/scorer.ts`: its output format; an execution
 * whose evaluation never succeeds is dropped, `failed`, counted in `Status`).
 * The `ExecutionOutcome` is published on `gyre.<run>.outcomes.<execution>` (acknowledged by
 * JetStream, message id `outcome-<execution>`) and answered. Harness and scorer output is
 * kept capped (`harness.log`, `scorer.log` beside the workspace); the execution's directory
 * is removed unless the keep policy says otherwise.
 *
 * The harness gets no NATS credentials and none of the runner's environment (`src/harness/
 * environment.ts`: `HOME` set to the execution's own `home`); a `RunExecution.env` naming a
 * loader, shell start-up or credential variable (`FORBIDDEN_ENV`) is refused with
 * `ForbiddenEnvironment`. Where the runner is root, harness and scorer run as another user
 * (`src/harness/harness-user.ts`), the execution directory is handed to that user and the
 * workspace root made traversable.
 *
 * At most `capacity` executions run at once (a semaphore); the actor's handler concurrency is
 * larger so that `Status` and a duplicate `RunExecution` (same execution id: it joins the
 * running one, or gets the recent outcome) are answered while the runner is full.
 */
import * as fs from "node:fs/promises"
import * as path from "node:path"
import { Deferred, Duration, Effect, Ref, Schedule, Schema, Semaphore } from "effect"
import { errorLine } from "../common/error-line.ts"
import * as Actor from "../runtime/actor.ts"
import { messageOf, TransportError } from "../runtime/errors.ts"
import { formatAddress, type ActorAddress } from "../runtime/names.ts"
import { refOf } from "../runtime/system.ts"
import { ExecutionOutcome } from "../tree/outcome.ts"
import { GatewayProtocol, apiKeyDigest, newApiKey } from "../protocols/gateway.ts"
import { ForbiddenEnvironment, HarnessRunnerProtocol, UnknownTask, type RunExecution } from "../protocols/harness.ts"
import { ensureTrajectoryStream, rlLayout } from "../protocols/layout.ts"
import { markExecutionStart } from "../protocols/trajectories.ts"
import { baseEnv, FORBIDDEN_ENV, gatewayEnv } from "../harness/environment.ts"
import { chownTree, harnessUser, runAsFromEnv } from "../harness/harness-user.ts"
import { describeEnd, runInGroup, tailOf, writeGroupLog, type GroupResult } from "../harness/process-group.ts"
import { evaluate, type Evaluation } from "../harness/scorer.ts"
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

const keepRank: Record<KeepPolicy, number> = { never: 0, "on-failure": 1, always: 2 }

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

        const writeLog = (file: string, title: string, r: GroupResult) => Effect.promise(() => writeGroupLog(file, title, r))
        const scoring = (dir: string) => ({
          run,
          log: (title: string, r: GroupResult) => writeLog(path.join(dir, "scorer.log"), title, r),
          retries: config.evaluationRetries,
          backoffMs
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
              const harness = yield* run(suite.harness, workspace, { ...env, ...gatewayEnv(opened.baseUrl, key) }, req.timeoutMs ?? suite.harness.timeoutMs)
              yield* system.ask(gateway, "CloseExecution", { execution: req.execution }, { timeoutMs: gatewayTimeoutMs }).pipe(
                Effect.catch((e) => Effect.logWarning(`CloseExecution ${req.execution}: ${errorLine(e)}`))
              )
              yield* writeLog(path.join(dir, "harness.log"), "harness", harness)
              ended = harness.timedOut ? "timed-out" : "finished"
              harnessFailed = harness.timedOut || harness.exitCode !== 0
              const scored = yield* evaluate(suite, workspace, env, scoring(dir))
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
