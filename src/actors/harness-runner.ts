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
import { Context, Deferred, Duration, Effect, Layer, Ref, Schema, Semaphore } from "effect"
import type { RpcGroup } from "effect/rpc"
import { errorLine } from "../common/error-line.ts"
import { cappedBackoff } from "../common/retry.ts"
import * as Actor from "../runtime/actor.ts"
import { publish } from "../runtime/channel-io.ts"
import { formatAddress, type ActorAddress } from "../runtime/names.ts"
import { refOf, type ActorRef } from "../runtime/system.ts"
import { ExecutionOutcome } from "../tree/outcome.ts"
import { GatewayProtocol, apiKeyDigest, newApiKey } from "../protocols/gateway.ts"
import { ForbiddenEnvironment, HarnessRunnerProtocol, UnknownTask, type RunExecution } from "../protocols/harness.ts"
import { ensureTrajectoryStream } from "../protocols/layout.ts"
import { Outcomes } from "../protocols/topology.ts"
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

type Counts = typeof Counts.Type

/** One incarnation's runner: its handlers. */
export interface HarnessRunnerShape {
  readonly runExecution: (req: RunExecution) => Effect.Effect<ExecutionOutcome, ForbiddenEnvironment | UnknownTask>
  readonly status: Effect.Effect<Counts & { readonly capacity: number }>
}

/** The runner's settings with their defaults applied. */
interface Settings {
  readonly config: HarnessRunnerConfig
  readonly capacity: number
  readonly graceMs: number
  readonly outputCapBytes: number
  readonly gatewayTimeoutMs: number
  readonly backoffMs: number
  readonly gateway: ActorRef<RpcGroup.Rpcs<typeof GatewayProtocol>>
  readonly fromEnv: ReturnType<typeof runAsFromEnv>
}

const settingsOf = (config: HarnessRunnerConfig): Settings => ({
  config,
  capacity: Math.max(1, config.capacity),
  graceMs: config.graceMs ?? 2000,
  outputCapBytes: config.outputCapBytes ?? 64 * 1024,
  gatewayTimeoutMs: config.gatewayTimeoutMs ?? 10_000,
  backoffMs: config.evaluationBackoffMs ?? 200,
  gateway: refOf(GatewayProtocol, config.gateway),
  fromEnv: runAsFromEnv()
})

/** One incarnation's runner: its settings, actor context and state. */
interface Runner {
  readonly s: Settings
  readonly ctx: Actor.ActorContext<Counts>
  readonly runAs: { readonly uid: number; readonly gid: number } | undefined
  readonly slots: Semaphore.Semaphore
  /** Executions running, by id (a duplicate request joins them). */
  readonly inFlight: Map<string, Deferred.Deferred<ExecutionOutcome>>
  /** Outcomes of recent executions, by id (a duplicate request gets them). */
  readonly recent: Map<string, ExecutionOutcome>
}

const report = (r: Runner) =>
  Effect.gen(function* () {
    const c = yield* Ref.get(r.ctx.state)
    r.ctx.reportLoad({ ...c, capacity: r.s.capacity })
  })

const count = (r: Runner, f: (c: Counts) => Counts) => Ref.update(r.ctx.state, f).pipe(Effect.andThen(report(r)))

const runProgram = (r: Runner) => (program: SuiteProgram, cwd: string, env: Record<string, string>, timeoutMs: number) =>
  Effect.promise((signal) =>
    runInGroup({ command: program.command, cwd, env, timeoutMs, graceMs: r.s.graceMs, outputCapBytes: r.s.outputCapBytes, uid: r.runAs?.uid, gid: r.runAs?.gid }, signal)
  )

const writeLog = (file: string, title: string, result: GroupResult) => Effect.promise(() => writeGroupLog(file, title, result))

/** Opens the execution at the gateway: its base URL, or why not. */
const open = (r: Runner, key: string, taskName: string, execution: string) =>
  r.ctx.system
    .ask(r.s.gateway, "OpenExecution", { keyDigest: apiKeyDigest(key), task: taskName, execution, defaultRole: "main" }, { timeoutMs: r.s.gatewayTimeoutMs })
    .pipe(
      Effect.retry({ times: 2, schedule: cappedBackoff(Duration.millis(200), Duration.seconds(1)) }),
      Effect.map((a) => ({ ok: true as const, baseUrl: a.baseUrl })),
      Effect.catch((e) => Effect.succeed({ ok: false as const, reason: `gateway ${formatAddress(r.s.config.gateway)}: ${errorLine(e)}` }))
    )

/** Stored or nothing: after about a minute of failures (100 ms doubling, 9 tries) the actor crashes and the request comes back. */
const storedOrDie = <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, never, R> =>
  effect.pipe(Effect.retry({ times: 9, schedule: cappedBackoff(Duration.millis(100), Duration.seconds(30)) }), Effect.orDie)

const publishOutcome = (r: Runner, outcome: ExecutionOutcome) =>
  publish(r.ctx.system, Outcomes, outcome.execution, outcome, { msgId: `outcome-${outcome.execution}` }).pipe(storedOrDie)

/** The execution's directory, afresh: the task's workspace template and an empty home, owned by the harness user. */
const prepareDirectory = (r: Runner, dir: string, workspace: string, task: Task) =>
  Effect.promise(async () => {
    await fs.rm(dir, { recursive: true, force: true })
    await fs.mkdir(dir, { recursive: true })
    if (task.template !== undefined) await fs.cp(task.template, workspace, { recursive: true })
    else await fs.mkdir(workspace)
    await fs.mkdir(path.join(dir, "home"))
    if (r.runAs !== undefined) await chownTree(dir, r.runAs)
  })

/** The environment of the harness and the scorer (the gateway's variables are added for the harness). */
const environmentOf = (req: RunExecution, suite: Suite, task: Task, dir: string, workspace: string): Record<string, string> => ({
  ...baseEnv(),
  ...task.env,
  ...req.env,
  HOME: path.join(dir, "home"),
  GYRE_TASK_ID: task.id,
  GYRE_EXECUTION_ID: req.execution,
  GYRE_WORKSPACE: workspace,
  GYRE_SUITE_DIR: suite.dir,
  ...(req.seed !== undefined ? { GYRE_SEED: String(req.seed) } : {})
})

/** Runs the harness with the gateway's base URL and key, closes the execution there, scores the workspace. */
const runAndScore = Effect.fnUntraced(function* (r: Runner, req: RunExecution, suite: Suite, dir: string, workspace: string, env: Record<string, string>, access: { baseUrl: string; key: string }) {
  const run = runProgram(r)
  const harness = yield* run(suite.harness, workspace, { ...env, ...gatewayEnv(access.baseUrl, access.key) }, req.timeoutMs ?? suite.harness.timeoutMs)
  yield* r.ctx.system.ask(r.s.gateway, "CloseExecution", { execution: req.execution }, { timeoutMs: r.s.gatewayTimeoutMs }).pipe(
    Effect.catch((e) => Effect.logWarning(`CloseExecution ${req.execution}: ${errorLine(e)}`))
  )
  yield* writeLog(path.join(dir, "harness.log"), "harness", harness)
  const harnessFailed = harness.timedOut || harness.exitCode !== 0
  const scoring = { run, log: (title: string, g: GroupResult) => writeLog(path.join(dir, "scorer.log"), title, g), retries: r.s.config.evaluationRetries, backoffMs: r.s.backoffMs }
  const scored = yield* evaluate(suite, workspace, env, scoring)
  const stderr = harness.stderr.trim()
  const note = harnessFailed ? `; harness ${describeEnd(harness)}${stderr !== "" ? `: ${tailOf(stderr, 300)}` : ""}` : ""
  const evaluation: Evaluation = { ...scored, detail: scored.detail + note }
  return { ended: harness.timedOut ? ("timed-out" as const) : ("finished" as const), harnessFailed, evaluation }
})

/** Whether the execution's directory stays: the more keeping of the runner's and the request's policies. */
const keeps = (config: HarnessRunnerConfig, req: RunExecution, failed: boolean) => {
  const policy = keepRank[config.keepWorkspace ?? "never"] > keepRank[req.keepWorkspace] ? config.keepWorkspace! : req.keepWorkspace
  return policy === "always" || (policy === "on-failure" && failed)
}

/** One execution in a slot: workspace, harness, scorer, outcome published, directory kept or removed. */
const execute = Effect.fnUntraced(function* (r: Runner, req: RunExecution, suite: Suite, task: Task) {
  yield* count(r, (c) => ({ ...c, running: c.running + 1 }))
  const taskName = `${suite.name}/${task.id}`
  const dir = path.join(r.s.config.workspaceRoot, req.execution)
  const workspace = path.join(dir, "workspace")
  yield* prepareDirectory(r, dir, workspace, task)
  const env = environmentOf(req, suite, task, dir, workspace)
  const key = newApiKey()
  // Before any call of this run of it is recorded (a run again after a runner died starts the execution afresh).
  yield* markExecutionStart(r.ctx.system, req.execution, `${formatAddress(r.ctx.address)}#${r.ctx.incarnation}`).pipe(storedOrDie)
  const opened = yield* open(r, key, taskName, req.execution)
  const ran = opened.ok
    ? yield* runAndScore(r, req, suite, dir, workspace, env, { baseUrl: opened.baseUrl, key })
    : { ended: "finished" as const, harnessFailed: true, evaluation: { evaluation: "failed", score: null, attempts: 0, detail: `not run: ${opened.reason}` } satisfies Evaluation }
  const { evaluation } = ran
  const outcome: ExecutionOutcome = { run: r.ctx.system.run, task: taskName, execution: req.execution, ended: ran.ended, ...evaluation }
  yield* publishOutcome(r, outcome)
  if (!keeps(r.s.config, req, ran.harnessFailed || evaluation.evaluation === "failed")) yield* Effect.promise(() => fs.rm(dir, { recursive: true, force: true }))
  const dropped = evaluation.evaluation === "failed"
  yield* count(r, (c) => ({ running: c.running - 1, finished: c.finished + (dropped ? 0 : 1), dropped: c.dropped + (dropped ? 1 : 0) }))
  return outcome
})

/** The suite and task a request names, or why not. */
const taskOf = Effect.fnUntraced(function* (r: Runner, req: RunExecution) {
  const suite = yield* loadSuite(r.s.config.suitesDir, req.task.suite).pipe(
    Effect.mapError((e) => new UnknownTask({ suite: req.task.suite, task: req.task.task, reason: e.message }))
  )
  const task = suite.task(req.task.task)
  if (task === undefined) {
    return yield* new UnknownTask({ suite: suite.name, task: req.task.task, reason: `no task '${req.task.task}' in suite ${suite.name} (${suite.tasks.length} tasks)` })
  }
  return { suite, task }
})

const runExecution = (r: Runner) =>
  Effect.fn("HarnessRunner.runExecution")(function* (req: RunExecution) {
    const forbidden = Object.keys(req.env).filter((name) => FORBIDDEN_ENV.test(name))
    if (forbidden.length > 0) {
      return yield* new ForbiddenEnvironment({ names: forbidden, reason: `a request may not set ${forbidden.join(", ")} (loader, start-up, credential or runner variables)` })
    }
    const known = r.recent.get(req.execution)
    if (known !== undefined) return known
    const running = r.inFlight.get(req.execution)
    if (running !== undefined) return yield* Deferred.await(running)
    const { suite, task } = yield* taskOf(r, req)
    const done = yield* Deferred.make<ExecutionOutcome>()
    r.inFlight.set(req.execution, done)
    const outcome = yield* r.slots.withPermits(1)(execute(r, req, suite, task)).pipe(
      Effect.onExit((exit) => Effect.sync(() => r.inFlight.delete(req.execution)).pipe(Effect.andThen(Deferred.done(done, exit))))
    )
    r.recent.set(req.execution, outcome)
    if (r.recent.size > 1024) r.recent.delete(r.recent.keys().next().value!)
    return outcome
  })

/** The runner of one incarnation: its workspace root ready, its load reported. */
const makeRunner = Effect.fn("HarnessRunner.make")(function* (s: Settings, ctx: Actor.ActorContext<Counts>) {
  yield* ensureTrajectoryStream(ctx.system)
  yield* Effect.promise(() => fs.mkdir(s.config.workspaceRoot, { recursive: true }))
  // Others may traverse the workspace root (not list it), to reach their own execution's directory.
  if (process.getuid?.() === 0) yield* Effect.promise(() => fs.chmod(s.config.workspaceRoot, 0o711))
  const r: Runner = { s, ctx, runAs: yield* harnessUser(s.config, s.fromEnv), slots: yield* Semaphore.make(s.capacity), inFlight: new Map(), recent: new Map() }
  yield* report(r)
  return { runExecution: runExecution(r), status: Ref.get(ctx.state).pipe(Effect.map((c) => ({ ...c, capacity: s.capacity }))) } satisfies HarnessRunnerShape
})

/** The runner of one harness-runner incarnation (the module comment). */
export class HarnessRunner extends Context.Service<HarnessRunner, HarnessRunnerShape>()("gyre/actors/HarnessRunner") {
  static readonly make = (config: HarnessRunnerConfig, ctx: Actor.ActorContext<Counts>) => makeRunner(settingsOf(config), ctx)
  static readonly layer = (config: HarnessRunnerConfig, ctx: Actor.ActorContext<Counts>) => Layer.effect(HarnessRunner, HarnessRunner.make(config, ctx))
}

/** The harness-runner actor type for `config` (kind `harness-runner`). */
export const makeHarnessRunner = (config: HarnessRunnerConfig) => {
  const s = settingsOf(config)
  return Actor.make({
    kind: "harness-runner",
    protocol: HarnessRunnerProtocol,
    state: { schema: Counts, initial: () => ({ running: 0, finished: 0, dropped: 0 }) },
    concurrency: s.capacity + (config.maxQueued ?? 64) + 1,
    behaviour: (ctx) => makeRunner(s, ctx).pipe(Effect.map((runner) => ({ RunExecution: runner.runExecution, Status: () => runner.status })))
  })
}
