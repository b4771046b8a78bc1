/**
 * A short `gyre train` run with a fault injected, for the run-level chaos tests
 * (`train-faults.chaos.ts`, `cluster.test.ts`, `proxy.test.ts`): tiny knobs (STEPS steps of EXECUTIONS
 * executions, group size 2, tiny preset), on a NATS of the test's choosing (an embedded
 * server of its own by default), with `gyre node` processes joined (by default `other`,
 * one device). After step 0's progress line and a seeded delay (`GYRE_CHAOS_SEED`, default 13)
 * the test's `inject` runs; then the journal is read and checked (`expectIntact`):
 * `run-done` journaled; steps 0..N-1 each `StepDone` once; versions strictly increasing
 * (weights published, step metrics); no record gap or conflict; `executions_lost` 0 and
 * `trained_twice` 0 (`auditRun`); every acknowledged outcome of a trained batch told to its
 * step exactly once (trained, or dropped by a failed evaluation whose outcome says why) and
 * trained in at most one step; every told execution's tree, rebuilt from the stored call
 * records, is the one the trainer journaled (`checkTrees`: no acknowledged call record
 * missing). Each fault's figures go to `recordFault`: recovery (the fault to the next
 * `StepDone` on the journal's clock), executions re-dispatched (running at a `CellLost`) and,
 * of those, duplicates suppressed (not run again by the runner).
 */
import { spawn, execFileSync, type ChildProcess } from "node:child_process"
import { join } from "node:path"
import * as readline from "node:readline"
import { Effect, Scope, Stream } from "effect"
import { expect } from "vitest"
import { executionName, parseExecutionName, type RunConfig } from "../../src/protocols/run.ts"
import type { PolicyRecord } from "../../src/protocols/scheduler.ts"
import { readTrajectories } from "../../src/protocols/trajectories.ts"
import { checkTrees } from "../../src/replay/trees.ts"
import { startEmbeddedServer, type EmbeddedServer } from "../../src/runtime/nats-server.ts"
import { ActorSystem } from "../../src/runtime/system.ts"
import { auditRun } from "../../src/scheduling/audit.ts"
import { readStored } from "../../src/runtime/stream-reader.ts"
import { readRecords, readRunConfig, runDoneJournaled, type StoredRecord } from "../../src/scheduling/records.ts"
import { mulberry32 } from "../../src/tree/sample.ts"
import { rewardOf } from "../../src/tree/outcome.ts"
import { eventually, startNodeProcess, type NodeProcess } from "../runtime/harness.ts"
import { asClient, executionStarts, recordFault, sleep, tempDir } from "./helpers.ts"

const gyre = new URL("../../bin/gyre.js", import.meta.url).pathname
export const STEPS = 3
export const EXECUTIONS = 4
/** How long a faulted run may take before it is killed (the test then fails). */
const TRAIN_LIMIT_MS = 220_000
export const SEED = Number(process.env.GYRE_CHAOS_SEED ?? 13)
/** The second node's device, as the run names it. */
export const OTHER_DEVICE = "device/other.cpu0"

let checkpoint = ""
/** Writes the runs' initial checkpoint (tiny, seed 6); call it in `beforeAll`. */
export const initCheckpoint = () => {
  checkpoint = join(tempDir("train-init"), "init")
  execFileSync("node", [gyre, "engine", "init", "--preset", "tiny", "--seed", "6", "--out", checkpoint], { stdio: "ignore" })
}

const children: Array<ChildProcess> = []
/** Kills what a test left running; call it in `afterEach`. */
export const killChildren = () => {
  for (const c of children.splice(0)) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL")
}

interface TrainProcess {
  /** Resolves with the wall-clock time of step `step`'s progress line. */
  readonly stepLine: (step: number, timeoutMs: number) => Promise<number>
  /** The summary (the last stdout line) once the process exits 0. */
  readonly summary: Promise<Record<string, unknown>>
}

/** The last 5 lines of a run's output, after its last 30 warnings and errors (what a failure shows). */
const lastLines = (lines: ReadonlyArray<string>) => {
  const tail = lines.slice(-5)
  const said = lines.slice(0, -5).filter((l) => / (WARN|ERROR) /.test(l)).slice(-30)
  return [...said, ...tail]
}

/** `gyre train` of run `run` on `url` (progress lines on stdout, the JSON summary last). */
const startTrain = (run: string, url: string, env: Record<string, string>, stepCount: number, extra: ReadonlyArray<string>): TrainProcess => {
  const args = ["train", "--run", run, "--checkpoint", checkpoint, "--steps", String(stepCount), "--devices", "1", "--executions-per-step", String(EXECUTIONS), "--group-size", "2", ...extra]
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
      else reject(new Error(`gyre train exited ${code ?? signal}:\n${lastLines(lines).join("\n")}\n${err}`))
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
export const readRun = (run: string, url: string) =>
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
export type RunJournal = Awaited<ReturnType<typeof readRun>>

/** The last policy records of a run that did not finish (what it stalled on), one line each. */
const journalTail = (run: string, url: string) =>
  asClient(run, url, undefined, Effect.gen(function* () {
    const records = yield* readRecords(yield* ActorSystem)
    const lines = records.slice(-20).map(({ record: r }) => `#${r.index} term ${r.term} ${JSON.stringify(r.event)} -> ${JSON.stringify(r.actions)}`)
    return `the journal's last policy records (${records.length} in all):\n${lines.join("\n")}`
  })).catch((e) => `the journal could not be read: ${String(e)}`)

/** Wall-clock ms of a record (the policy clock is seconds since the run's start). */
export const wallOf = (config: RunConfig, r: StoredRecord) => config.startedAt + r.record.event.at * 1000

/** The role of `device`'s cell in the records up to wall time `at`: rollout, switching, or training as the step's core or a satellite. */
export const roleAt = (j: Pick<RunJournal, "config" | "records">, device: string, at: number): string => {
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
export const expectIntact = (j: RunJournal) => {
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

export interface Injected {
  /** Wall-clock ms of the kill. */
  readonly at: number
  /** What was hit, once the journal is read. */
  readonly detail: (j: RunJournal) => string
}

/** How a faulted run is set up; every field has a default. */
export interface RunSetup<S extends { readonly url: string }> {
  /** The NATS the run uses (default: an embedded server of the test's own, supervised). */
  readonly nats?: Effect.Effect<S, unknown, Scope.Scope>
  /** `gyre node` processes besides `gyre train`, by name, with their flags (default: `other`, one device). */
  readonly nodes?: Readonly<Record<string, ReadonlyArray<string>>>
  /** The NATS URL the node `name` connects to (default: the server's `url`, which `gyre train` always uses), e.g. a proxy's. */
  readonly nodeUrl?: (server: S, name: string) => string
  /** More `gyre train` flags. */
  readonly trainArgs?: ReadonlyArray<string>
  /** Whether `inject` waits for step 0's line and the seeded delay (else it is called once every process runs). */
  readonly afterStep0?: boolean
  readonly steps?: number
  /** Told each phase of the run as it begins (for a test's watchdog to name where it is stuck). */
  readonly onPhase?: (phase: string) => void
}

const defaultNats = startEmbeddedServer({}) as Effect.Effect<never, unknown, Scope.Scope>

/**
 * A run with its nodes joined; `inject` is called `delayMs` (seeded) after step 0's line, with
 * the server and the node processes; then the journal is read, the fault recorded and the
 * invariants checked.
 */
export const faultedRun = <S extends { readonly url: string } = EmbeddedServer>(
  fault: string,
  run: string,
  salt: number,
  env: Record<string, string>,
  inject: (server: S, nodes: Readonly<Record<string, NodeProcess>>) => Effect.Effect<Injected, unknown, Scope.Scope>,
  setup: RunSetup<S> = {}
) =>
  Effect.runPromise(
    Effect.scoped(
      Effect.gen(function* () {
        const delayMs = Math.floor(mulberry32(SEED * 31 + salt)() * 3000)
        const { afterStep0 = true, steps = STEPS, trainArgs = [], nodes: flags = { other: ["--devices", "1"] }, nodeUrl = (s: S) => s.url, onPhase = () => undefined } = setup
        onPhase("starting the NATS")
        const server = yield* (setup.nats ?? (defaultNats as Effect.Effect<S, unknown, Scope.Scope>))
        const nodes = Object.fromEntries(Object.entries(flags).map(([name, f]) => [name, startNodeProcess(nodeUrl(server, name), ["--name", name, "--run", run, ...f], env)]))
        for (const n of Object.values(nodes)) children.push(n.child)
        const train = startTrain(run, server.url, env, steps, trainArgs)
        onPhase("waiting for the nodes' ready lines")
        for (const n of Object.values(nodes)) yield* Effect.promise(() => n.waitFor("ready", 200_000))
        if (afterStep0) {
          onPhase("waiting for step 0's line")
          yield* Effect.promise(() => train.stepLine(0, 200_000))
          yield* sleep(delayMs)
        }
        onPhase("injecting the fault")
        const injected = yield* inject(server, nodes)
        onPhase("waiting for gyre train to finish")
        const summary = yield* Effect.tryPromise(() => train.summary).pipe(
          Effect.catch((e) =>
            Effect.flatMap(Effect.promise(() => journalTail(run, server.url)), (tail) =>
              Effect.die(new Error([String(e.cause), tail, ...Object.entries(nodes).map(([name, n]) => `node ${name}'s stderr (last 4000 characters):\n${n.stderr().slice(-4000)}`)].join("\n")))
            )
          )
        )
        onPhase("reading the journal")
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

/** kill -9 of a node now (by default the second one); the detail names its device's role then and when its cell was lost. */
export const killOther = (other: NodeProcess, device = OTHER_DEVICE) =>
  Effect.gen(function* () {
    const at = Date.now()
    other.child.kill("SIGKILL")
    yield* Effect.promise(() => other.exited)
    const lostAfter = (j: RunJournal) => {
      const lost = j.records.find((r) => r.record.event._tag === "CellLost" && r.record.device === device)
      return lost === undefined ? "never" : `${((wallOf(j.config, lost) - at) / 1000).toFixed(1)} s`
    }
    return { at, device, detail: (j: RunJournal) => `${device} a ${roleAt(j, device, at)} when killed, its cell lost after ${lostAfter(j)}` }
  })

/**
 * The scheduler heard the loss of the killed device's cell, unless the run's last step was done
 * before liveness could declare it dead (GYRE_DEAD_AFTER_MS, 5 s, plus a check interval).
 */
export const expectCellLost = (j: RunJournal, killedAt: number, device = OTHER_DEVICE) => {
  const lost = j.records.filter((r) => r.record.event._tag === "CellLost" && r.record.device === device)
  const lastStep = j.records.filter((r) => r.record.event._tag === "StepDone").at(-1)!
  const endedWithinDeadAfter = wallOf(j.config, lastStep) - killedAt < 5_000 + 2_000
  expect(lost.length >= 1 || endedWithinDeadAfter, `no CellLost of ${device}, and the run went on ${wallOf(j.config, lastStep) - killedAt} ms after the kill`).toBe(true)
}

/**
 * Follows the run's policy records from the first (an ordered consumer that waits for new ones)
 * and kills a node the moment a record makes its device (`device/<node>.cpu0`, one of `nodes`)
 * the core of a step (`StartStep` with its cell as the core) or a satellite (`JoinStep` of its cell).
 */
export const killWhen = (role: "core" | "satellite", run: string, url: string, nodes: Readonly<Record<string, NodeProcess>>) =>
  Effect.promise(() =>
    asClient(run, url, undefined, Effect.gen(function* () {
      const system = yield* ActorSystem
      const config = (yield* eventually(readRunConfig(system), 150_000, 100)) as RunConfig
      const cells = new Map<number, string>()
      let stepsDone = 0
      let hit: string | undefined
      const aimed = (r: PolicyRecord) => {
        if (r.event._tag === "CellJoined" && r.device !== undefined) cells.set(r.event.cell, r.device)
        if (r.event._tag === "StepDone") stepsDone++
        // a core starts a step; a satellite joins a running one or starts with it (colocate)
        const aimedCells = r.actions.flatMap((a) =>
          a._tag === "StartStep" ? (role === "core" ? [a.core] : a.cells.filter((c) => c !== a.core)) : a._tag === "JoinStep" && role === "satellite" ? [a.cell] : []
        )
        hit = aimedCells.map((c) => cells.get(c)).find((d) => d !== undefined && nodes[nodeOf(d)] !== undefined)
        return stepsDone < config.policyConfig.steps && hit !== undefined
      }
      yield* readStored(system.nats, system.layout.journalStream, { seq: 1 }, system.layout.sys("policy"), true).pipe(
        Stream.map((m) => m.json() as PolicyRecord),
        Stream.takeUntil(aimed),
        Stream.runDrain,
        Effect.timeout("150 seconds")
      )
      return hit!
    }))
  ).pipe(Effect.flatMap((device) => killOther(nodes[nodeOf(device)]!, device)))

/** The node of a device `device/<node>.<backend><i>`. */
const nodeOf = (device: string) => device.slice("device/".length).split(".")[0]!
