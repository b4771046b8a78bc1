/**
 * `gyre replay` on a recorded run (recorded.ts: the live scheduler with scripted devices on a
 * real nats-server, its store stopped): every entry in order, positions and filters selecting
 * exactly what they say, `--follow` on a live server, `--pace original` keeping the run's own
 * intervals, `--verify` passing on the run and failing,
 * naming the sequence, on a journal with one action altered and on one with a gap.
 */
import { spawn } from "node:child_process"
import { cpSync, mkdtempSync, readFileSync, readdirSync, statSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Context, Effect, Layer, Stream } from "effect"
import { beforeAll, describe, expect, it } from "vitest"
import { openRun, readEntries, readerNats, type Entry, type ReadOptions } from "../../src/replay/read.ts"
import { Nats } from "../../src/runtime/nats.ts"
import { startEmbeddedServer } from "../../src/runtime/nats-server.ts"
import { gyre, gyreCli, jsonLines, recordRun, type Recorded } from "./recorded.ts"

let rec: Recorded

beforeAll(async () => {
  rec = await recordRun("replayed")
}, 60_000)

/** Entries read in-process from the stopped store (through a private server on a copy). */
const read = (options: ReadOptions, run = rec.run) =>
  Effect.runPromise(
    Effect.scoped(
      Effect.gen(function* () {
        const log = yield* openRun(yield* Nats, run)
        return [...(yield* Stream.runCollect(readEntries(log, options)))] as Array<Entry>
      }).pipe(Effect.provide(readerNats({ store: rec.store })))
    )
  )

const treeOf = (dir: string): Array<[string, number, number]> =>
  readdirSync(dir, { recursive: true, encoding: "utf8" })
    .sort()
    .map((f) => {
      const s = statSync(join(dir, f))
      return [f, s.size, s.mtimeMs]
    })

describe("gyre replay", { timeout: 180_000 }, () => {
  it("prints every entry of a stopped store in order, and leaves the store untouched", async () => {
    const before = treeOf(rec.store)
    const r = await gyreCli(["replay", rec.run, "--store", rec.store, "--json"])
    expect(r.code).toBe(0)
    const lines = jsonLines(r.stdout)
    expect(lines.map((l) => [l.seq, l.subject])).toEqual(rec.journal.map((m) => [m.seq, m.subject]))
    const records = lines.filter((l) => l.name === "policy")
    expect(records.map((l) => l.payload)).toEqual(rec.journal.filter((m) => m.subject.endsWith(".sys.policy")).map((m) => m.json))
    expect(records.map((l) => l.type)).toEqual(records.map((l) => l.payload.event._tag))
    const human = await gyreCli(["replay", rec.run, "--store", rec.store])
    expect(human.stdout.trim().split("\n")).toHaveLength(rec.journal.length)
    expect(human.stdout).toMatch(/ExecutionFinished +#\d+ term 1 execution=\d+ batch=\d+ tokens=\d+/)
    expect(treeOf(rec.store)).toEqual(before)
  })

  it("selects exactly what positions and filters say", async () => {
    const seqs = (es: ReadonlyArray<Entry>) => es.map((e) => e.seq)
    const all = rec.journal.map((m) => m.seq)
    expect(seqs(await read({ from: { seq: 10 }, to: { seq: 20 } }))).toEqual(all.filter((s) => s >= 10 && s <= 20))
    expect(seqs(await read({ last: 7 }))).toEqual(all.slice(-7))
    const startedAt = rec.journal.find((m) => m.seq === 30)!
    const byTime = await read({ from: { time: new Date((await read({ from: { seq: 30 }, to: { seq: 30 } }))[0]!.time) } })
    expect(byTime[0]!.seq).toBeLessThanOrEqual(startedAt.seq)
    const records = rec.journal.filter((m) => m.subject.endsWith(".sys.policy"))
    const starts = records.filter((m) => m.json.event._tag === "ExecutionStarted")
    expect(seqs(await read({ filter: { types: ["ExecutionStarted"] } }))).toEqual(starts.map((m) => m.seq))
    expect(seqs(await read({ filter: { types: ["policy"] } }))).toEqual(records.map((m) => m.seq))
    // step:1 starts at the first record of batch 1 and ends at step 1's StepDone.
    const ofStep1 = records.filter((m) => m.json.event.batch === 1 || m.json.event.step === 1)
    const done1 = records.find((m) => m.json.event._tag === "StepDone" && m.json.event.step === 1)!
    expect(seqs(await read({ from: { step: 1 }, to: { step: 1 } }))).toEqual(all.filter((s) => s >= ofStep1[0]!.seq && s <= done1.seq))
    const toScheduler = rec.journal.filter((m) => m.subject === `gyre.${rec.run}.tell.scheduler.main`)
    expect(seqs(await read({ filter: { actor: "scheduler/main" } }))).toEqual(toScheduler.map((m) => m.seq))
    const devices = await read({ filter: { actor: "device" } })
    expect(devices.length).toBeGreaterThan(0)
    expect(devices.every((e) => e.actor?.kind === "device" || e.record?.device?.startsWith("device/"))).toBe(true)
    // One execution: its start and finish records, the runner's answer, the device's training order.
    const x = await read({ filter: { execution: "b1-x5" } })
    expect(x.filter((e) => e.record !== undefined).map((e) => e.record!.event._tag)).toEqual(["ExecutionStarted", "ExecutionFinished"])
    expect(x.some((e) => e.name === "ExecutionEnded")).toBe(true)
    expect(x.every((e) => JSON.stringify(e.payload).includes("b1-x5") || e.record?.event._tag.startsWith("Execution"))).toBe(true)
    expect(seqs(await read({ filter: { types: ["StepDone"], execution: "b1-x5" } }))).toEqual([])
  })

  it("--verify passes on the recorded run", async () => {
    const r = await gyreCli(["replay", rec.run, "--store", rec.store, "--verify", "--json"])
    expect(r.stderr).toBe("")
    expect(r.code).toBe(0)
    const v = JSON.parse(r.stdout)
    expect(v).toMatchObject({ ok: true, integrity: [], divergences: [] })
    expect(v.records).toBe(rec.journal.filter((m) => m.subject.endsWith(".sys.policy")).length)
  })

  it("--verify fails on an altered action, naming the sequence, the event and the field", async () => {
    const r = await gyreCli(["replay", rec.altered.run, "--store", rec.store, "--verify"])
    expect(r.code).toBe(1)
    expect(r.stdout).toContain(`divergence at sequence ${rec.altered.seq}, record #${rec.altered.index} (actions)`)
    expect(r.stdout).toMatch(/\n {2}\[0\]: expected \{"_tag":"\w+".*\}, recorded \(none\)/)
    expect(r.stdout).toMatch(/FAILED: .* 1 divergences/)
    const all = JSON.parse((await gyreCli(["replay", rec.altered.run, "--store", rec.store, "--verify", "--keep-going", "--json"])).stdout)
    expect(all.ok).toBe(false)
    expect(all.divergences[0]).toMatchObject({ seq: rec.altered.seq, index: rec.altered.index, what: "actions", recorded: [] })
  })

  it("--verify fails on a journal with a gap, naming the missing sequence and record", async () => {
    const r = await gyreCli(["replay", rec.gapped.run, "--store", rec.store, "--verify", "--json"])
    expect(r.code).toBe(1)
    const v = JSON.parse(r.stdout)
    expect(v.integrity).toEqual(
      expect.arrayContaining([
        expect.objectContaining({ check: "sequence-gap", seq: rec.gapped.seq + 1, message: expect.stringContaining(`${rec.gapped.seq}..${rec.gapped.seq}`) }),
        expect.objectContaining({ check: "record-gap", message: expect.stringContaining(`records ${rec.gapped.index}..${rec.gapped.index} are missing`) })
      ])
    )
  })

  it("--follow prints new entries of a live run, and ends at the run's run-done (at once on an ended run)", async () => {
    const copy = mkdtempSync(join(tmpdir(), "gyre-replay-live-"))
    cpSync(join(rec.store, "jetstream"), join(copy, "jetstream"), { recursive: true })
    const done = rec.journal.find((m) => m.subject === `gyre.${rec.run}.sys.run-done`)!
    const follow = (url: string) => {
      const child = spawn("node", [gyre, "replay", rec.run, "--follow", "--last", "2", "--json"], { env: { ...process.env, NATS_URL: url } })
      const got = { out: "", exited: new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code))) }
      child.stdout.on("data", (d) => (got.out += String(d)))
      return { child, got }
    }
    const until = async (check: () => boolean) => {
      for (let i = 0; i < 300 && !check(); i++) await new Promise((r) => setTimeout(r, 100))
      return check()
    }
    await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const server = yield* startEmbeddedServer({ storeDir: copy })
          // The run as it ended: following has nothing to wait for.
          const ended = follow(server.url)
          expect(yield* Effect.promise(() => ended.got.exited)).toBe(0)
          expect(jsonLines(ended.got.out).map((l) => l.seq)).toEqual(rec.journal.slice(-2).map((m) => m.seq))
          // The run as it was before its end: new entries are printed as they come, up to run-done.
          const nats = Context.get(yield* Layer.build(Nats.layer({ url: server.url })), Nats)
          yield* Effect.promise(() => nats.jsm.streams.deleteMessage(`GYRE_${rec.run}_JOURNAL`, done.seq))
          const live = follow(server.url)
          const before = rec.journal.filter((m) => m.seq !== done.seq).slice(-2)
          expect(yield* Effect.promise(() => until(() => jsonLines(live.got.out).length >= 2))).toBe(true)
          yield* Effect.promise(() => nats.js.publish(`gyre.${rec.run}.sys.note`, JSON.stringify({ hello: "after" })))
          expect(yield* Effect.promise(() => until(() => live.got.out.includes("note")))).toBe(true)
          yield* Effect.promise(() => nats.js.publish(done.subject, JSON.stringify(done.json)))
          expect(yield* Effect.promise(() => live.got.exited)).toBe(0)
          const lines = jsonLines(live.got.out)
          const last = rec.journal.at(-1)!.seq
          expect(lines.map((l) => l.seq)).toEqual([...before.map((m) => m.seq), last + 1, last + 2])
          expect(lines.map((l) => l.type).slice(-2)).toEqual(["note", "run-done"])
          // Interrupted before the end: exit 0 too.
          yield* Effect.promise(() => nats.jsm.streams.deleteMessage(`GYRE_${rec.run}_JOURNAL`, last + 2))
          const stopped = follow(server.url)
          expect(yield* Effect.promise(() => until(() => jsonLines(stopped.got.out).length >= 2))).toBe(true)
          stopped.child.kill("SIGINT")
          expect(yield* Effect.promise(() => stopped.got.exited)).toBe(0)
        })
      )
    )
  })

  it("--pace original prints each entry as long after the first as the run journaled it", async () => {
    const entries = await read({})
    // A window of at most 1.5 s of the run's own time, with at least 200 ms between its ends.
    const start = entries[0]!
    const window = entries.filter((e) => e.time.getTime() - start.time.getTime() <= 1500)
    const end = window.at(-1)!
    const span = end.time.getTime() - start.time.getTime()
    expect(span).toBeGreaterThanOrEqual(200)
    const arrivals = await new Promise<Array<{ readonly seq: number; readonly at: number }>>((resolve, reject) => {
      const child = spawn("node", [gyre, "replay", rec.run, "--store", rec.store, "--from", String(start.seq), "--to", String(end.seq), "--pace", "original", "--json"])
      const got: Array<{ seq: number; at: number }> = []
      let buffered = ""
      child.stdout.on("data", (d) => {
        const at = performance.now()
        buffered += String(d)
        const lines = buffered.split("\n")
        buffered = lines.pop()!
        for (const l of lines) if (l.trim() !== "") got.push({ seq: JSON.parse(l).seq, at })
      })
      child.on("exit", (code) => (code === 0 ? resolve(got) : reject(new Error(`replay exited ${code}`))))
    })
    expect(arrivals.map((a) => a.seq)).toEqual(window.map((e) => e.seq))
    // Each entry is printed no sooner after the first than it was journaled after it (the print of
    // the first may lag its read by a few ms: 20 ms of slack), and not much later.
    arrivals.forEach((a, i) => {
      const recorded = window[i]!.time.getTime() - start.time.getTime()
      expect(a.at - arrivals[0]!.at).toBeGreaterThanOrEqual(recorded - 20)
      expect(a.at - arrivals[0]!.at).toBeLessThanOrEqual(recorded + 1000)
    })
  })

  it("stops quietly with 0 when its reader goes away (| head)", async () => {
    const r = await new Promise<{ code: number | null; stderr: string; lines: number }>((resolve) => {
      const child = spawn("node", [gyre, "replay", rec.run, "--store", rec.store, "--pace", "original"])
      let stderr = ""
      let lines = 0
      child.stderr.on("data", (d) => (stderr += String(d)))
      child.stdout.on("data", (d) => {
        lines += String(d).split("\n").length - 1
        if (lines > 0) child.stdout.destroy() // the reader goes away after its first line
      })
      child.on("exit", (code) => resolve({ code, stderr, lines }))
    })
    expect(r.lines).toBeGreaterThan(0)
    expect(r.stderr).toBe("")
    expect(r.code).toBe(0)
  })

  it("--export writes the run as JSON lines: records, actions, calls decoded to token ids, outcomes, steps, config", async () => {
    const dir = mkdtempSync(join(tmpdir(), "gyre-replay-export-"))
    const r = await gyreCli(["replay", rec.run, "--store", rec.store, "--export", dir, "--json"])
    expect(r.code).toBe(0)
    const file = (name: string) => jsonLines(readFileSync(join(dir, name), "utf8"))
    const records = rec.journal.filter((m) => m.subject.endsWith(".sys.policy"))
    expect(file("events.jsonl").map((e) => [e.seq, e.index, e.event])).toEqual(records.map((m) => [m.seq, m.json.index, m.json.event]))
    expect(file("actions.jsonl").map((a) => a.action)).toEqual(records.flatMap((m) => m.json.actions))
    expect(file("steps.jsonl").map((s) => s.step)).toEqual([0, 1, 2])
    expect(file("outcomes.jsonl").map((o) => o.execution).sort()).toEqual(rec.outcomes.map((o) => o.execution).sort())
    expect(JSON.parse(readFileSync(join(dir, "config.json"), "utf8")).run).toBe(rec.run)
    // Each call as recorded: its lengths, behaviour log-probs, versions, and its delta suffix at the end of prompt ++ output.
    const calls = file("calls.jsonl")
    expect(calls.map((c) => c.callId).sort()).toEqual(rec.calls.map((c) => c.callId).sort())
    const decode = (b64: string, as: typeof Int32Array | typeof Float32Array) => Array.from(new as(new Uint8Array(Buffer.from(b64, "base64")).buffer))
    for (const record of rec.calls) {
      const c = calls.find((x) => x.callId === record.callId && x.execution === record.execution)!
      expect([c.prompt.length, c.output.length]).toEqual([record.promptLength, record.outputLength])
      expect(c.logprobs).toEqual(decode(record.logprobs, Float32Array))
      expect(c.versions).toEqual(decode(record.versions, Int32Array))
      const suffix = decode(record.suffix, Int32Array)
      const full = [...c.prompt, ...c.output]
      expect(full.slice(full.length - suffix.length)).toEqual(suffix)
    }
    expect(JSON.parse(readFileSync(join(dir, "manifest.json"), "utf8"))).toMatchObject({ format: 1, run: rec.run, calls: rec.calls.length, events: records.length, malformed: 0 })
  })

  it("--what-if replays the recorded executions under another policy and cell count, beside the lower bound", async () => {
    const scenarioFile = join(mkdtempSync(join(tmpdir(), "gyre-what-if-")), "run.json")
    const own = JSON.parse((await gyreCli(["replay", rec.run, "--store", rec.store, "--what-if", "colocate", "--json", "--scenario-out", scenarioFile])).stdout)
    const done = rec.journal.filter((m) => m.subject.endsWith(".sys.policy") && m.json.event._tag === "StepDone").map((m) => m.json.event.at)
    expect(own).toMatchObject({ run: rec.run, policy: "elastic", cells: 2, executions: 12, whatIf: { policy: "colocate", cells: 2 } })
    expect(own.realS).toBe(Math.max(...done))
    expect(own.simulatedS).toBeGreaterThan(0)
    // the costs the simulator was fed, measured from the run (the scripted trainer's update sleeps
    // 20 ms; the step's reduce and publish times are whole Date.now milliseconds, and a CI run read
    // a mean of 19.67 ms: a timer may fire within a millisecond of its due time on that clock)
    expect(own.costs.train_tokens_per_s_per_cell).toBeGreaterThan(1)
    expect(own.costs.step_update_s).toBeGreaterThanOrEqual(0.018)
    expect(own.costs.switch_to_train_s).toBeGreaterThan(0)
    expect(own.whatIf.makespanS).toBeGreaterThan(0)
    // The lower bound holds under every policy the simulator runs on the same cells.
    expect(own.whatIf.lowerBoundS).toBeGreaterThan(0)
    expect(own.whatIf.lowerBoundS).toBeLessThanOrEqual(Math.min(own.simulatedS, own.whatIf.makespanS) + 1e-9)
    // The scenario it wrote is what it simulated: gyre sim on it gives the same makespans and bound.
    const scenario = JSON.parse(readFileSync(scenarioFile, "utf8"))
    expect(scenario).toMatchObject({ cells: 2, slots_per_cell: 2, executions_per_step: 4, steps: 3, max_staleness: 1 })
    expect(scenario.executions).toHaveLength(12)
    expect(scenario.notes[0]).toContain(`run ${rec.run}`)
    const sim = JSON.parse((await gyreCli(["sim", "--scenario", scenarioFile, "--json"])).stdout)
    expect(sim.elastic.makespan_s).toBeCloseTo(own.simulatedS, 2)
    expect(sim.colocate.makespan_s).toBeCloseTo(own.whatIf.makespanS, 2)
    expect(sim.elastic.lower_bound_s).toBeCloseTo(own.whatIf.lowerBoundS, 2)
    expect(own.scenario).toBeUndefined() // the --json line carries the figures, not the executions
    const wider = JSON.parse((await gyreCli(["replay", rec.run, "--store", rec.store, "--what-if", "async", "--cells", "4", "--json"])).stdout)
    expect(wider.whatIf).toMatchObject({ cells: 4, policy: expect.stringMatching(/^async:[123]$/) })
    expect(wider.simulatedS).toBe(own.simulatedS)
    expect(wider.whatIf.lowerBoundS).toBeLessThanOrEqual(wider.whatIf.makespanS + 1e-9)
    expect(wider.whatIf.lowerBoundS).toBeLessThanOrEqual(own.whatIf.lowerBoundS + 1e-9) // more cells never raise it
    const bad = await gyreCli(["replay", rec.run, "--store", rec.store, "--what-if", "fastest"])
    expect(bad.code).toBe(1)
    expect(bad.stderr).toMatch(/unknown policy 'fastest'/)
  })

  it("answers bad flags with one line and exit 2, an unknown run with one line and exit 1", async () => {
    for (const args of [["replay"], ["replay", "x", "--from", "yesterday"], ["replay", "x", "--bogus"], ["replay", "x", "--scenario-out", "s.json"]]) {
      const r = await gyreCli(args)
      expect(r.code, args.join(" ")).toBe(2)
      expect(r.stderr.trim().split("\n"), args.join(" ")).toHaveLength(1)
    }
    const missing = await gyreCli(["replay", "nothing-here", "--store", rec.store])
    expect(missing.code).toBe(1)
    expect(missing.stderr.trim()).toMatch(/^gyre replay: no run 'nothing-here' there \(runs: .*replayed.*\)$/)
    // A --store that is not there is a bad value; without --store or NATS_URL the run's own store is read (here: none).
    const noDir = join(tmpdir(), `gyre-no-store-${process.pid}`)
    const own = `nothing-here-${process.pid}`
    for (const [args, named] of [[["replay", "x", "--store", noDir], noDir], [["replay", own], join(".gyre", "runs", own)], [["runs", "--store", noDir], noDir]] as const) {
      const r = await gyreCli(args, { NATS_URL: "" })
      expect(r.code, args.join(" ")).toBe(2)
      expect(r.stderr.trim().split("\n"), args.join(" ")).toHaveLength(1)
      expect(r.stderr, args.join(" ")).toContain(`gyre ${args[0]}: no store `)
      expect(r.stderr, args.join(" ")).toContain(named)
    }
    // A directory that holds no store: the command fails (exit 1) with one line naming it.
    const notAStore = mkdtempSync(join(tmpdir(), "gyre-not-a-store-"))
    const empty = await gyreCli(["replay", "x", "--store", notAStore])
    expect(empty.code).toBe(1)
    expect(empty.stderr.trim()).toBe(`gyre replay: no jetstream directory in ${notAStore}`)
  })
})
