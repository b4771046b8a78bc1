/**
 * `gyre runs`, `gyre status` and `gyre report` on recorded runs: two short runs of the real live
 * scheduler (elastic and colocate) with scripted devices and runner on one real nats-server, and
 * the elastic run's held-out evaluation outcomes. The commands run as child processes with
 * NATS_URL; their numbers are checked against the journal read independently (policy records and
 * step metrics). The report is opened in headless Chromium (Debian's, through playwright-core):
 * no console errors, the charts hold the run's numbers, and a screenshot is kept in
 * test-artifacts/.
 */
import { spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Effect, Exit, Layer, Scope, Stream } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { chromium } from "playwright-core"
import type { PolicyRecord, StepMetrics } from "../../src/protocols/scheduler.ts"
import { runStatus, type RunStatus } from "../../src/replay/status.ts"
import { readJournal } from "../../src/runtime/journal.ts"
import { Nats } from "../../src/runtime/nats.ts"
import { repoRoot } from "../../src/runtime/nats-server.ts"
import { readRecords } from "../../src/scheduling/records.ts"
import { ActorSystem } from "../../src/runtime/system.ts"
import { recordedEvaluation, recordedRun } from "./fixtures.ts"

const gyre = path.join(repoRoot, "bin", "gyre.js")
const CHROMIUM = "/usr/bin/chromium"
const heldOut = [0.25, 0.5, 1, 0.75]

let scope: Scope.Closeable
let nats: Layer.Layer<Nats>
let url = ""
let live: RunStatus
const journal: Record<string, { records: Array<PolicyRecord>; steps: Array<StepMetrics> }> = {}

const run = <A, E>(effect: Effect.Effect<A, E, Nats>) => Effect.runPromise(effect.pipe(Effect.provide(nats)))

/** What the journal says, read without the code under test: the policy records and the step metrics. */
const journalOf = (name: string) =>
  Effect.gen(function* () {
    const system = yield* ActorSystem
    const records = (yield* readRecords(system)).map((s) => s.record)
    const steps: Array<StepMetrics> = []
    yield* readJournal(system).pipe(Stream.runForEach((e) => Effect.sync(() => void (e.via === "event" && e.name === "step" && steps.push(e.payload as StepMetrics)))))
    return { records, steps }
  }).pipe(Effect.provide(ActorSystem.layer({ run: name })))

const gyreCli = (args: ReadonlyArray<string>, cwd = repoRoot) => {
  const r = spawnSync(process.execPath, [gyre, ...args], { cwd, encoding: "utf8", env: { ...process.env, NATS_URL: url }, timeout: 60_000 })
  return { code: r.status, stdout: r.stdout, stderr: r.stderr }
}

beforeAll(async () => {
  scope = await Effect.runPromise(Scope.make())
  nats = await Effect.runPromise(Layer.buildWithScope(Nats.layer({}), scope).pipe(Effect.map((ctx) => Layer.succeedContext(ctx))))
  url = await run(Effect.map(Nats, (n) => n.servers))
  live = await run(recordedRun("rep-elastic", "elastic", Effect.flatMap(ActorSystem, runStatus)))
  await run(recordedRun("rep-colocate", "colocate", Effect.void))
  await run(recordedEvaluation("rep-elastic-heldout-after", heldOut))
  for (const name of ["rep-elastic", "rep-colocate"]) journal[name] = await run(journalOf(name))
}, 120_000)

afterAll(async () => {
  if (scope !== undefined) await Effect.runPromise(Scope.close(scope, Exit.void))
})

const count = (records: ReadonlyArray<PolicyRecord>, tag: string) => records.filter((r) => r.event._tag === tag).length

describe("gyre runs and gyre status", () => {
  it("status of a live run says live and holds counts no larger than the journal's at the end", () => {
    const end = journal["rep-elastic"]!.records
    expect(live.state).toBe("live")
    expect(live.steps.done).toBeGreaterThanOrEqual(1)
    expect(live.executions.finished).toBeLessThanOrEqual(count(end, "ExecutionFinished"))
    expect(live.executions.finished).toBeLessThanOrEqual(live.executions.dispatched)
    expect(live.devices.map((d) => d.device).sort()).toEqual(["device/fakes.0", "device/fakes.1", "device/fakes.2"])
  })

  it("gyre runs --json lists both runs, ended, with their policy and steps", () => {
    const r = gyreCli(["runs", "--json"])
    expect(r.code, r.stderr).toBe(0)
    const runs = JSON.parse(r.stdout) as Array<{ run: string; policy: string; stepsDone: number; stepsPlanned: number; state: string }>
    const of = (name: string) => runs.find((x) => x.run === name)
    for (const [name, policy] of [["rep-elastic", "elastic"], ["rep-colocate", "colocate"]] as const) {
      expect(of(name)).toMatchObject({ policy, stepsDone: count(journal[name]!.records, "StepDone"), stepsPlanned: 3, state: "ended" })
    }
    expect(of("rep-elastic-heldout-after")).toMatchObject({ stepsDone: 0 })
  })

  it("gyre status --json holds the journal's counts, the cells' last activity and the held-out score", () => {
    const r = gyreCli(["status", "rep-elastic", "--json"])
    expect(r.code, r.stderr).toBe(0)
    const s = JSON.parse(r.stdout) as RunStatus
    const { records, steps } = journal["rep-elastic"]!
    const dispatches = records.flatMap((x) => x.actions).filter((a) => a._tag === "Dispatch").length
    expect(s.state).toBe("ended")
    expect(s.records).toBe(records.length)
    expect(s.executions).toEqual({ planned: 12, dispatched: dispatches * 4, running: count(records, "ExecutionStarted") - count(records, "ExecutionFinished"), finished: count(records, "ExecutionFinished") })
    expect(s.steps).toMatchObject({ done: count(records, "StepDone"), planned: 3 })
    expect(s.weightsPublished).toBe(Math.max(0, ...records.flatMap((x) => (x.event._tag === "WeightsPublished" ? [x.event.version] : []))))
    expect(s.lastTrainScore).toBe(steps.at(-1)!.meanScore)
    expect(s.heldOut).toEqual({ run: "rep-elastic-heldout-after", meanScore: heldOut.reduce((a, b) => a + b, 0) / heldOut.length, tasks: heldOut.length })
    const joined = records.flatMap((x) => (x.event._tag === "CellJoined" ? [x.device] : []))
    expect(s.devices.map((d) => d.device)).toEqual(joined)
    expect(s.queues.map((q) => q.actor)).toEqual(expect.arrayContaining(["scheduler/main", "device/fakes.0", "harness-runner/r0"]))
    for (const q of s.queues) expect(q.pending).toBe(0)
  })

  it("gyre status of a run the server does not hold is one line and exit code 1", () => {
    const r = gyreCli(["status", "no-such-run"])
    expect(r.code).toBe(1)
    expect(r.stderr.trim().split("\n")).toHaveLength(1)
    expect(r.stderr).toMatch(/no run 'no-such-run'.*rep-elastic/)
  })
})

describe("gyre report", () => {
  const chromiumThere = fs.existsSync(CHROMIUM)

  it.skipIf(!chromiumThere)("writes one page that Chromium opens with no network and no console error; its charts hold the run's numbers", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gyre-report-"))
    const r = gyreCli(["report", "rep-elastic", "--compare", "rep-colocate"], dir)
    expect(r.code, r.stderr).toBe(0)
    const file = path.join(fs.realpathSync(dir), "rep-elastic.html")
    expect(r.stdout.trim()).toBe(file)
    const html = fs.readFileSync(file, "utf8")
    expect(html).not.toMatch(/(src|href)="(https?:)?\/\//)
    const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ["--no-sandbox"] })
    try {
      const page = await browser.newPage({ viewport: { width: 900, height: 1200 } })
      const problems: Array<string> = []
      page.on("console", (m) => void (m.type() === "error" && problems.push(m.text())))
      page.on("pageerror", (e) => void problems.push(e.message))
      page.on("request", (q) => void (q.url().startsWith("file:") || problems.push(`request ${q.url()}`)))
      await page.goto(`file://${file}`)
      const { records, steps } = journal["rep-elastic"]!
      const num = (sel: string, attr: string) => page.$$eval(sel, (els, a) => els.map((e) => Number(e.getAttribute(a))), attr)
      // Score curve: one point per step, the step's mean score; held-out after at the end.
      expect(await num('#chart-scores circle[data-series^="train"]', "data-y")).toEqual(steps.map((s) => Number(s.meanScore.toFixed(4))))
      expect(await num('#chart-scores circle[data-series^="held-out"]', "data-y")).toEqual([0.625])
      expect(await num("#chart-dedup rect", "data-value")).toEqual(steps.map((s) => Number(s.dedupRatio.toFixed(4))))
      const stale = steps.reduce<Array<number>>((acc, s) => (s.staleness.forEach((n, i) => (acc[i] = (acc[i] ?? 0) + n)), acc), [])
      expect(await num("#chart-staleness rect", "data-value")).toEqual(stale)
      // Step durations: StartStep (its record's time) to StepDone, per step.
      const startAt = new Map(records.flatMap((x) => x.actions.flatMap((a) => (a._tag === "StartStep" ? [[a.step, x.event.at] as const] : []))))
      const doneAt = records.flatMap((x) => (x.event._tag === "StepDone" ? [[x.event.step, x.event.at] as const] : []))
      expect(await num("#chart-step-durations rect", "data-value")).toEqual(doneAt.map(([k, at]) => Number((at - startAt.get(k)!).toFixed(4))))
      // Gantt: every device of the run has contiguous segments from its join to the run's end.
      const end = Math.max(...records.map((x) => x.event.at))
      const segments = await page.$$eval('#chart-timeline rect.segment', (els) =>
        els.map((e) => ({ device: e.getAttribute("data-device")!, activity: e.getAttribute("data-activity")!, from: Number(e.getAttribute("data-from")), to: Number(e.getAttribute("data-to")) }))
      )
      for (const d of ["device/fakes.0", "device/fakes.1", "device/fakes.2"]) {
        const own = segments.filter((s) => s.device === d)
        expect(own.length, d).toBeGreaterThan(1)
        for (let i = 1; i < own.length; i++) expect(own[i]!.from).toBeCloseTo(own[i - 1]!.to, 3)
        expect(own.at(-1)!.to).toBeCloseTo(end, 3)
      }
      const switchesAsked = records.flatMap((x) => x.actions).filter((a) => a._tag === "SwitchRole").length
      expect(segments.filter((s) => s.activity === "switching").length).toBe(switchesAsked)
      expect(segments.some((s) => s.activity === "training")).toBe(true)
      // Side by side: both policies, each with its makespan from its journal.
      const policies = await page.$$eval("#policies tr td:first-child", (els) => els.map((e) => e.textContent))
      expect(policies).toEqual(["elastic", "colocate"])
      const makespans = await num("#chart-makespans rect", "data-value")
      expect(makespans).toEqual(["rep-elastic", "rep-colocate"].map((n) => Number(Math.max(...journal[n]!.records.map((x) => x.event.at)).toFixed(4))))
      fs.mkdirSync(path.join(repoRoot, "test-artifacts"), { recursive: true })
      await page.screenshot({ path: path.join(repoRoot, "test-artifacts", "report.png"), fullPage: true })
      expect(problems).toEqual([])
    } finally {
      await browser.close()
    }
  }, 60_000)

  it("writes --out into directories it makes, and prints the file's path", () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gyre-report-out-"))
    const file = path.join(dir, "nested", "deeper", "run.html")
    const r = gyreCli(["report", "rep-colocate", "--out", file])
    expect(r.code, r.stderr).toBe(0)
    expect(r.stdout.trim()).toBe(file)
    expect(fs.readFileSync(file, "utf8")).toMatch(/^<!doctype html>/i)
  })
})
