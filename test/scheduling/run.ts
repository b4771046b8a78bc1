/**
 * Shared pieces of the live scheduler tests: a short run's configuration and script, and the
 * checks every run must pass, read from the journal alone.
 */
import { Duration, Effect } from "effect"
import { expect } from "vitest"
import { replay } from "../../src/policy/policy.ts"
import type { RunConfig } from "../../src/protocols/run.ts"
import { Book } from "../../src/scheduling/book.ts"
import { actionsJson, policyOf, stateDigest } from "../../src/scheduling/driver.ts"
import { readRecords, type RunSummary, type StoredRecord } from "../../src/scheduling/records.ts"
import { auditRun } from "../../src/scheduling/audit.ts"
import { replayRecords } from "../../src/scheduling/takeover.ts"
import { makeScheduler, type SchedulerOptions } from "../../src/actors/scheduler.ts"
import { startNode } from "../../src/runtime/node.ts"
import { readLast } from "../../src/runtime/stream-reader.ts"
import { ActorSystem, type ActorSystemShape } from "../../src/runtime/system.ts"
import { fakeDevice, fakeRunner, type Observed, type Script } from "./fakes.ts"
import { HarnessRunner } from "../../src/protocols/topology.ts"

export const trainTasks = Array.from({ length: 8 }, (_, i) => `t${i}`)

export const runConfig = (run: string, steps = 3): RunConfig => ({
  run,
  policy: "elastic",
  policyConfig: { slots_per_cell: 2, executions_per_step: 4, steps, max_staleness: 1 },
  suite: "fake",
  groupSize: 2,
  env: {},
  seed: 7,
  training: {
    advantage: "grpo",
    mode: "exact",
    maxPaths: 5,
    loss: "ppo",
    clipLow: 0.2,
    clipHigh: 0.2,
    isCap: 0,
    lr: 1e-5,
    microBatchTokens: 4096,
    checkpointEvery: 10
  },
  checkpoint: "/nonexistent",
  checkpointDir: "/nonexistent",
  startedAt: Date.now()
})

/** Heavy-tailed enough that steps overlap the next batch's rollouts. */
export const script: Script = {
  executionMs: (n) => 150 + ((n * 7919) % 5) * 120,
  switchMs: 60,
  trainMs: 40,
  updateMs: 20,
  calls: (n) => 1 + (n % 3)
}

/** Waits until the journal holds the run's end; its summary. */
/** The fakes on a node `fakes` of their own: `harness-runner/r0` and `devices` devices `device/fakes.<i>`. */
export const startFakes = (seen: Observed, options: { readonly devices?: number; readonly heartbeatMs?: number } = {}) =>
  Effect.gen(function* () {
    const fakes = yield* startNode({ name: "fakes", types: [fakeDevice(script, seen), fakeRunner(script, seen)], ...(options.heartbeatMs === undefined ? {} : { heartbeatMs: options.heartbeatMs }) })
    yield* fakes.spawn("harness-runner", "r0")
    for (let i = 0; i < (options.devices ?? 3); i++) yield* fakes.spawn("device", `fakes.${i}`)
    return fakes
  })

/** The schedulers' options of a run on the fakes: runner r0, lease 1.5 s. */
export const schedulerOptions = (config: RunConfig): SchedulerOptions => ({ config, trainTasks, runners: [HarnessRunner.ref("r0")], leaseTtlMs: 1500 })

/** A scheduler candidate standing by on a node of its own (in the current scope); its node. */
export const standingBy = (options: SchedulerOptions, node = "s1") =>
  Effect.gen(function* () {
    const system = yield* ActorSystem
    const scheduler = makeScheduler(options)
    const host = yield* startNode({ name: node, types: [scheduler.type] })
    yield* Effect.forkScoped(scheduler.standBy(host, system))
    return host
  })

export const runDone = (system: ActorSystemShape, timeoutMs = 40_000) =>
  Effect.gen(function* () {
    const deadline = Date.now() + timeoutMs
    while (Date.now() < deadline) {
      const m = yield* readLast(system.nats, system.layout.journalStream, system.layout.sys("run-done"))
      if (m !== undefined) return m.json<RunSummary>()
      yield* Effect.sleep(Duration.millis(200))
    }
    return yield* Effect.die(new Error("the run did not finish in time"))
  })

/** Waits until every journaled `SwitchRole` has its `SwitchDone` (switches asked for near the end). */
export const switchesSettled = (system: ActorSystemShape) =>
  Effect.gen(function* () {
    for (let i = 0; i < 100; i++) {
      const records = (yield* readRecords(system)).map((s) => s.record)
      const asked = records.flatMap((r) => r.actions).filter((a) => a._tag === "SwitchRole").length
      if (records.filter((r) => r.event._tag === "SwitchDone").length === asked) return
      yield* Effect.sleep(Duration.millis(100))
    }
  })

const count = <A>(xs: ReadonlyArray<A>, key: (x: A) => number) => {
  const m = new Map<number, number>()
  for (const x of xs) m.set(key(x), (m.get(key(x)) ?? 0) + 1)
  return m
}

/**
 * The journal's checks: consecutive indices; the events replayed through the policy give the
 * recorded actions (`replay`) and digests; a standby's replay accepts it; every execution of
 * the run started once and finished once with its tree's tokens; every step done once.
 */
export const checkJournal = (system: ActorSystemShape, config: RunConfig, seen: Observed) =>
  Effect.gen(function* () {
    const stored: Array<StoredRecord> = yield* readRecords(system)
    const records = stored.map((s) => s.record)
    expect(records.map((r) => r.index)).toEqual(records.map((_, i) => i))
    const policy = yield* policyOf(config)
    const replayed = replay(policy, config.policyConfig, records.map((r) => r.event))
    expect(replayed.map(actionsJson)).toEqual(records.map((r) => actionsJson(r.actions)))
    let state = policy.initial(config.policyConfig)
    const digests = records.map((r) => {
      state = policy.step(state, r.event).state
      return stateDigest(policy, state)
    })
    expect(digests).toEqual(records.map((r) => r.digest))
    const rebuilt = yield* replayRecords(policy, config, new Book(config, trainTasks), stored, Number.MAX_SAFE_INTEGER)
    expect(rebuilt.index).toBe(records.length)

    const total = config.policyConfig.steps * config.policyConfig.executions_per_step
    const all = Array.from({ length: total }, (_, n) => n)
    const events = records.map((r) => r.event)
    const starts = count(events.filter((e) => e._tag === "ExecutionStarted"), (e) => e.execution)
    const finishes = events.flatMap((e) => (e._tag === "ExecutionFinished" ? [e] : []))
    expect([...starts.keys()].sort((a, b) => a - b)).toEqual(all)
    expect([...starts.values()].every((c) => c === 1)).toBe(true)
    expect(finishes.map((e) => e.execution).sort((a, b) => a - b)).toEqual(all)
    const steps = events.flatMap((e) => (e._tag === "StepDone" ? [e.step] : []))
    expect(steps).toEqual(Array.from({ length: config.policyConfig.steps }, (_, k) => k))

    // What the fakes saw: each execution started once on the runner, trained once by the core.
    expect([...seen.starts.values()].every((c) => c === 1)).toBe(true)
    expect(seen.starts.size).toBe(total)
    expect(seen.trained.size).toBe(total)
    expect([...seen.trained.values()].every((c) => c === 1)).toBe(true)
    // Outcomes reached the core as the runner published them (read back after a takeover).
    expect([...seen.evaluations.values()].every((e) => e === "scored")).toBe(true)
    const tokensOf = new Map(finishes.map((e) => [`b${e.batch}-x${e.execution}`, e.tokens]))
    expect(tokensOf).toEqual(seen.tokens)
    // The journal's audit (what `gyre train` reports) agrees.
    const audit = yield* auditRun(system, config.policyConfig.executions_per_step)
    expect(audit).toMatchObject({ recordGaps: [], conflictingRecords: [], executionsLost: 0, trainedTwice: 0, executionsStarted: total, executionsFinished: total })
    return { records, terms: [...new Set(records.map((r) => r.term))] }
  })
