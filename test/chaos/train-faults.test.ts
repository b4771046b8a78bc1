/**
 * Run-level faults during `gyre train` (issue 13, "Chaos suite"). Each test runs a short
 * training run (STEPS steps, or as the test says; tiny knobs) on a nats-server it starts itself (loopback,
 * temporary store, supervised by the test process), with the main node (`gyre train
 * --devices 1`: core device, scheduler, gateway, harness runner) and a second node
 * (`gyre node --devices 1`) joining it. After step 0's progress line and a seeded delay
 * (`GYRE_CHAOS_SEED`, default 13) it injects one fault:
 *
 * - kill -9 of the second node; its device's role at that moment (rollout cell, training core
 *   or satellite, switching) is read from the policy records: the run finishes without it;
 * - kill -9 of the second node at the first moment the live journal shows its device training
 *   as a satellite of the running step (a fault aimed at a role): the step finishes on the core;
 * - kill -9 of the nats-server, restarted by its supervisor on the same store and port: the
 *   run finishes (with the default GYRE_DEAD_AFTER_MS; see NATS_DEAD_AFTER_MS).
 *
 * Then the journal is read and checked: `run-done` journaled; steps 0..N-1 each `StepDone`
 * once; versions strictly increasing (weights published, step metrics); no record gap or
 * conflict; `executions_lost` 0 and `trained_twice` 0 (`auditRun`); every acknowledged outcome
 * of a trained batch told to its step exactly once (trained, or dropped by a failed evaluation
 * whose outcome says why) and trained in at most one step; every told execution's tree, rebuilt
 * from the stored call records, is the one the trainer journaled (`checkTrees`: no acknowledged
 * call record missing). Each fault's figures go to `recordFault`: recovery (kill to the next
 * `StepDone` on the journal's clock), executions re-dispatched (running at a `CellLost`) and,
 * of those, duplicates suppressed (not run again by the runner).
 *
 * Not here: a scheduler killed on its own (`gyre node` hosts no scheduler candidate; the
 * scheduler lives in the `gyre train` process), nor the core's node (it is the main node: killing
 * it stops the run, which `--resume` continues). The file takes about 2 min alone; all three
 * tests run in the normal suite.
 */
import { spawn, execFileSync, type ChildProcess } from "node:child_process"
import { join } from "node:path"
import * as readline from "node:readline"
import { Effect, Scope, Stream } from "effect"
import { afterEach, beforeAll, describe, expect, it } from "vitest"
import { executionName, parseExecutionName, type RunConfig } from "../../src/protocols/run.ts"
import { readTrajectories } from "../../src/protocols/trajectories.ts"
import { checkTrees } from "../../src/replay/trees.ts"
import { startEmbeddedServer, type EmbeddedServer } from "../../src/runtime/nats-server.ts"
import { ActorSystem } from "../../src/runtime/system.ts"
import { readStored } from "../../src/runtime/stream-reader.ts"
import type { PolicyRecord } from "../../src/protocols/scheduler.ts"
import { auditRun } from "../../src/scheduling/audit.ts"
import { readRecords, readRunConfig, runDoneJournaled, type StoredRecord } from "../../src/scheduling/records.ts"
import { mulberry32 } from "../../src/tree/sample.ts"
import { rewardOf } from "../../src/tree/outcome.ts"
import { eventually, startNodeProcess, type NodeProcess } from "../runtime/harness.ts"
import { asClient, executionStarts, recordFault, sleep, tempDir } from "./helpers.ts"

const gyre = new URL("../../bin/gyre.js", import.meta.url).pathname
const STEPS = 3
const EXECUTIONS = 4
/** How long a faulted run may take before it is killed (the test then fails). */
const TRAIN_LIMIT_MS = 220_000
const SEED = Number(process.env.GYRE_CHAOS_SEED ?? 13)
/**
 * GYRE_DEAD_AFTER_MS of the processes of the nats-server fault: the runtime's default (5 s)
 * unless GYRE_CHAOS_DEAD_AFTER_MS says otherwise. For about 5 s after the server is back the
 * clients' requests still time out; liveness must not take that for death (ARCHITECTURE.md).
 */
const NATS_DEAD_AFTER_MS = Number(process.env.GYRE_CHAOS_DEAD_AFTER_MS ?? 5_000)
/** The second node's device, as the run names it. */
const OTHER_DEVICE = "device/other.cpu0"

let checkpoint = ""
beforeAll(() => {
  checkpoint = join(tempDir("train-init"), "init")
  execFileSync("node", [gyre, "engine", "init", "--preset", "tiny", "--seed", "6", "--out", checkpoint], { stdio: "ignore" })
})

const children: Array<ChildProcess> = []
afterEach(() => {
  for (const c of children.splice(0)) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL")
})

interface TrainProcess {
  /** Resolves with the wall-clock time of step `step`'s progress line. */
  readonly stepLine: (step: number, timeoutMs: number) => Promise<number>
  /** The summary (the last stdout line) once the process exits 0. */
  readonly summary: Promise<Record<string, unknown>>
}

/** `gyre train` of run `run` on `url` (progress lines on stdout, the JSON summary last). */
const startTrain = (run: string, url: string, env: Record<string, string>, stepCount: number): TrainProcess => {
  const args = ["train", "--run", run, "--checkpoint", checkpoint, "--steps", String(stepCount), "--devices", "1", "--executions-per-step", String(EXECUTIONS), "--group-size", "2"]
  const more = ["--slots", "2", "--horizon", "3", "--env", "TOY_TOOL_MS=30,TOY_MAX_TOKENS=16", "--heldout", "heldout-0"]
  const child = spawn("node", [gyre, ...args, ...more], { env: { ...process.env, NATS_URL: url, ...env }, stdio: ["ignore", "pipe", "pipe"] })
  children.push(child)
  const lines: Array<string> = []
  const steps = new Map<number, number>()
  const waiters: Array<() => void> = []
  let err = ""
  child.stderr!.on("data", (b: Buffer) => void (err = (err + b.toString()).slice(-4000)))
  readline.createInterface({ input: child.stdout! }).on("line", (line) => {
    lines.push(line)
    const step = /^step +(\d+) /.exec(line)
    if (step !== null && !steps.has(Number(step[1]))) steps.set(Number(step[1]), Date.now())
    waiters.splice(0).forEach((w) => w())
  })
  // A run that does not finish is killed, so the test fails with what it printed.
  const limit = setTimeout(() => child.kill("SIGKILL"), TRAIN_LIMIT_MS)
  const summary = new Promise<Record<string, unknown>>((resolve, reject) =>
    child.once("exit", (code, signal) => {
      clearTimeout(limit)
      if (code === 0) resolve(JSON.parse(lines.at(-1)!))
      else reject(new Error(`gyre train exited ${code ?? signal}:\n${lines.slice(-5).join("\n")}\n${err}`))
    })
  )
  const stepLine = (step: number, timeoutMs: number) =>
    new Promise<number>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no line of step ${step} in ${timeoutMs} ms:\n${lines.join("\n")}\n${err}`)), timeoutMs)
      const check = () => {
        if (!steps.has(step)) return void waiters.push(check)
        clearTimeout(timer)
        resolve(steps.get(step)!)
      }
      check()
      summary.catch((e) => reject(e))
    })
  return { stepLine, summary }
}

/** What the journal of a finished run says, as the invariants need it. */
const readRun = (run: string, url: string) =>
  asClient(run, url, undefined, Effect.gen(function* () {
    const system = yield* ActorSystem
    const config = (yield* readRunConfig(system)) as RunConfig
    return {
      config,
      done: yield* runDoneJournaled(system),
      audit: yield* auditRun(system, config.policyConfig.executions_per_step),
      records: yield* readRecords(system),
      trees: yield* checkTrees(system, config),
      trajectories: (yield* readTrajectories(system)).executions,
      starts: yield* executionStarts(system)
    }
  }))
type RunJournal = Awaited<ReturnType<typeof readRun>>

/** Wall-clock ms of a record (the policy clock is seconds since the run's start). */
const wallOf = (config: RunConfig, r: StoredRecord) => config.startedAt + r.record.event.at * 1000

/** The role of `device`'s cell in the records up to wall time `at`: rollout, switching, or training as the step's core or a satellite. */
const roleAt = (j: Pick<RunJournal, "config" | "records">, device: string, at: number): string => {
  let cell: number | undefined
  let role: string | undefined
  let step: { core: number; cells: Array<number> } | undefined
  for (const r of j.records) {
    if (wallOf(j.config, r) > at) break
    const e = r.record.event
    if (e._tag === "CellJoined" && r.record.device === device) [cell, role] = [e.cell, "rollout cell"]
    else if (e._tag === "CellLost" && e.cell === cell) [cell, role] = [undefined, "lost"]
    else if (e._tag === "SwitchDone" && e.cell === cell) role = e.role
    else if (e._tag === "StepDone") step = undefined
    for (const a of r.record.actions) {
      if (a._tag === "SwitchRole" && a.cell === cell) role = `switching to ${a.role}`
      else if (a._tag === "StartStep") step = { core: a.core, cells: [...a.cells] }
      else if (a._tag === "JoinStep") step?.cells.push(a.cell)
    }
  }
  if (role !== "training") return role ?? "not joined"
  return step?.core === cell ? "training core" : step?.cells.includes(cell!) ? "training satellite" : "training, between steps"
}

/** Running executions asked for again at each `CellLost`, and how many of them the runner ran again. */
const redispatches = (j: RunJournal) => {
  const running = new Map<number, string>()
  const asked = new Set<string>()
  let redispatched = 0
  for (const { record: { event: e } } of j.records) {
    if (e._tag === "ExecutionStarted") running.set(e.execution, executionName(e.batch, e.execution))
    else if (e._tag === "ExecutionFinished") running.delete(e.execution)
    else if (e._tag === "CellLost") {
      redispatched += running.size
      for (const x of running.values()) asked.add(x)
    }
  }
  const ranAgain = [...asked].filter((x) => (j.starts.get(x) ?? 0) > 1).length
  return { redispatched, suppressed: redispatched - ranAgain }
}

/** Seconds from `at` (wall clock, ms) to the first `StepDone` journaled after it. */
const recoveryOf = (j: RunJournal, at: number) => {
  const next = j.records.find((r) => r.record.event._tag === "StepDone" && wallOf(j.config, r) > at)
  return next === undefined ? Number.NaN : (wallOf(j.config, next) - at) / 1000
}

/** The invariants every run-level fault must leave intact (see the module comment). */
const expectIntact = (j: RunJournal) => {
  const STEPS = j.config.policyConfig.steps
  expect(j.done).toBe(true)
  const steps = j.records.flatMap((r) => (r.record.event._tag === "StepDone" ? [r.record.event.step] : []))
  expect(steps).toEqual([...Array(STEPS).keys()])
  const published = j.records.flatMap((r) => (r.record.event._tag === "WeightsPublished" ? [r.record.event.version] : []))
  for (let i = 1; i < published.length; i++) expect(published[i]).toBeGreaterThan(published[i - 1]!)
  expect(j.audit.steps.map((s) => s.version)).toEqual([...Array(STEPS).keys()].map((s) => s + 1))
  expect(j.audit.recordGaps).toEqual([])
  expect(j.audit.conflictingRecords).toEqual([])
  expect(j.audit.malformed).toEqual([])
  expect(j.audit.executionsLost).toBe(0)
  expect(j.audit.trainedTwice).toBe(0)
  expect(j.trees.mismatches).toEqual([])
  expect(j.trees.unrecorded).toEqual([])
  // Every acknowledged outcome of a trained batch: told to its step once, trained at most once.
  const told = new Map<string, number>()
  const trained = new Map<string, number>()
  for (const s of j.audit.steps) {
    for (const t of s.trees ?? []) told.set(t.execution, (told.get(t.execution) ?? 0) + 1)
    for (const x of s.trainedExecutions) trained.set(x, (trained.get(x) ?? 0) + 1)
  }
  const acknowledged = [...j.trajectories.values()].filter((t) => t.outcome !== undefined && (parseExecutionName(t.execution)?.batch ?? STEPS) < STEPS)
  expect(acknowledged).toHaveLength(STEPS * EXECUTIONS)
  for (const t of acknowledged) {
    expect(told.get(t.execution), t.execution).toBe(1)
    expect(trained.get(t.execution) ?? 0, t.execution).toBeLessThanOrEqual(1)
    // A dropped execution says why in its outcome.
    if (rewardOf(t.outcome!) === undefined) expect(t.outcome!.detail, t.execution).not.toBe("")
  }
  expect([...told.keys()].every((x) => acknowledged.some((t) => t.execution === x))).toBe(true)
  for (const s of j.audit.steps) {
    const failed = acknowledged.filter((t) => parseExecutionName(t.execution)?.batch === s.step && rewardOf(t.outcome!) === undefined).length
    expect(s.dropped).toBeGreaterThanOrEqual(failed)
  }
}

interface Injected {
  /** Wall-clock ms of the kill. */
  readonly at: number
  /** What was hit, once the journal is read. */
  readonly detail: (j: RunJournal) => string
}

/**
 * A run on a server of the test's own with a second node joined; `inject` is called `delayMs`
 * (seeded) after step 0's line; then the journal is read, the fault recorded and the invariants checked.
 */
const faultedRun = (
  fault: string,
  run: string,
  salt: number,
  env: Record<string, string>,
  inject: (server: EmbeddedServer, other: NodeProcess) => Effect.Effect<Injected, unknown, Scope.Scope>,
  options: {
    /** Whether `inject` waits for step 0's line and the seeded delay (else it is called once both processes run). */
    readonly afterStep0?: boolean
    readonly steps?: number
  } = {}
) =>
  Effect.runPromise(
    Effect.scoped(
      Effect.gen(function* () {
        const delayMs = Math.floor(mulberry32(SEED * 31 + salt)() * 3000)
        const server = yield* startEmbeddedServer({})
        const other = startNodeProcess(server.url, ["--name", "other", "--run", run, "--devices", "1"], env)
        children.push(other.child)
        const { afterStep0 = true, steps = STEPS } = options
        const train = startTrain(run, server.url, env, steps)
        yield* Effect.promise(() => other.waitFor("ready", 200_000))
        if (afterStep0) {
          yield* Effect.promise(() => train.stepLine(0, 200_000))
          yield* sleep(delayMs)
        }
        const injected = yield* inject(server, other)
        const summary = yield* Effect.promise(() => train.summary)
        const j = yield* Effect.promise(() => readRun(run, server.url))
        const { redispatched, suppressed } = redispatches(j)
        const when = afterStep0 ? `seed ${SEED}, ${delayMs} ms after step 0` : "at the role's first sight"
        const detail = `${injected.detail(j)}; scheduler terms ${j.audit.terms.join(",")}; ${when}`
        recordFault({
          fault,
          recovered: j.done && j.audit.stepsDone === steps,
          recoveryS: recoveryOf(j, injected.at),
          executionsLost: j.audit.executionsLost,
          trainedTwice: j.audit.trainedTwice,
          executionsRedispatched: redispatched,
          duplicatesSuppressed: suppressed,
          detail
        })
        yield* Effect.logInfo(`${fault}: ${detail}; recovery ${recoveryOf(j, injected.at).toFixed(1)} s, re-dispatched ${redispatched}, suppressed ${suppressed}`)
        expect(summary.steps).toBe(steps)
        expect(summary.executions_lost).toBe(0)
        expect(summary.trained_twice).toBe(0)
        expectIntact(j)
        return j
      })
    )
  )

/** kill -9 of the second node now; the detail names its device's role then and when its cell was lost. */
const killOther = (other: NodeProcess) =>
  Effect.gen(function* () {
    const at = Date.now()
    other.child.kill("SIGKILL")
    yield* Effect.promise(() => other.exited)
    const lostAfter = (j: RunJournal) => {
      const lost = j.records.find((r) => r.record.event._tag === "CellLost" && r.record.device === OTHER_DEVICE)
      return lost === undefined ? "never" : `${((wallOf(j.config, lost) - at) / 1000).toFixed(1)} s`
    }
    return { at, detail: (j: RunJournal) => `its device a ${roleAt(j, OTHER_DEVICE, at)} when killed, its cell lost after ${lostAfter(j)}` }
  })

/**
 * The scheduler heard the loss of the killed device's cell, unless the run's last step was done
 * before liveness could declare it dead (GYRE_DEAD_AFTER_MS, 5 s, plus a check interval).
 */
const expectCellLost = (j: RunJournal, killedAt: number) => {
  const lost = j.records.filter((r) => r.record.event._tag === "CellLost" && r.record.device === OTHER_DEVICE)
  const lastStep = j.records.filter((r) => r.record.event._tag === "StepDone").at(-1)!
  const endedWithinDeadAfter = wallOf(j.config, lastStep) - killedAt < 5_000 + 2_000
  expect(lost.length >= 1 || endedWithinDeadAfter, `no CellLost of ${OTHER_DEVICE}, and the run went on ${wallOf(j.config, lastStep) - killedAt} ms after the kill`).toBe(true)
}

/**
 * Follows the run's policy records from the first (an ordered consumer that waits for new ones)
 * and kills the second node the moment a record makes its device a satellite of a step
 * (`JoinStep` of its cell).
 */
const killOtherAsSatellite = (run: string, url: string, other: NodeProcess) =>
  Effect.promise(() =>
    asClient(run, url, undefined, Effect.gen(function* () {
      const system = yield* ActorSystem
      const config = (yield* eventually(readRunConfig(system), 150_000, 100)) as RunConfig
      let cell: number | undefined
      let stepsDone = 0
      const satellite = (r: PolicyRecord) => {
        if (r.event._tag === "CellJoined" && r.device === OTHER_DEVICE) cell = r.event.cell
        if (r.event._tag === "StepDone") stepsDone++
        return stepsDone < config.policyConfig.steps && r.actions.some((a) => a._tag === "JoinStep" && a.cell === cell)
      }
      yield* readStored(system.nats, system.layout.journalStream, { seq: 1 }, system.layout.sys("policy"), true).pipe(
        Stream.map((m) => m.json() as PolicyRecord),
        Stream.takeUntil(satellite),
        Stream.runDrain,
        Effect.timeout("150 seconds")
      )
    }))
  ).pipe(Effect.andThen(killOther(other)))

describe("run-level faults during gyre train", () => {
  it("kill -9 of the second node (a device of the run): the run finishes on the main node, nothing lost or trained twice", { timeout: 300_000 }, async () => {
    let killedAt = 0
    const j = await faultedRun("train: second node kill -9", "chaos-node", 1, {}, (_server, other) =>
      killOther(other).pipe(Effect.tap((k) => Effect.sync(() => (killedAt = k.at))))
    )
    expectCellLost(j, killedAt)
  })

  // Only in `npm run test:chaos` (GYRE_CHAOS_FAULTS set): whether the second cell joins a step
  // at all depends on the run's timing (in 1 of 3 CI runs it never did), so in the plain suite
  // it is skipped, not counted as passing.
  it.runIf(process.env.GYRE_CHAOS_FAULTS !== undefined)("kill -9 of the second node while its device trains as a satellite of the step: the step and the run finish, nothing lost or trained twice", { timeout: 300_000 }, async () => {
    let killedAt = 0
    const j = await faultedRun(
      "train: second node kill -9 as a training satellite",
      "chaos-satellite",
      3,
      {},
      (server, other) => killOtherAsSatellite("chaos-satellite", server.url, other).pipe(Effect.tap((k) => Effect.sync(() => (killedAt = k.at)))),
      { afterStep0: false, steps: 5 }
    )
    expect(roleAt(j, OTHER_DEVICE, killedAt)).toBe("training satellite")
    expectCellLost(j, killedAt)
  })

  it("kill -9 of the nats-server (restarted on the same store and port): the run finishes, nothing lost or trained twice", { timeout: 300_000 }, async () => {
    await faultedRun("train: nats-server kill -9 (restarted)", "chaos-nats", 2, { GYRE_DEAD_AFTER_MS: String(NATS_DEAD_AFTER_MS) }, (server) =>
      Effect.gen(function* () {
        const at = Date.now()
        const restarts = server.restarts
        process.kill(server.pid, "SIGKILL")
        yield* eventually(Effect.sync(() => (server.restarts > restarts ? true : undefined)), 30_000)
        const restartedS = ((Date.now() - at) / 1000).toFixed(1)
        return { at, detail: () => `server back after ${restartedS} s` }
      })
    )
  })
})
