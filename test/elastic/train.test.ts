/**
 * `gyre train` and `gyre eval` end to end as a user runs them: a real nats-server (embedded), real
 * harness processes of the toy suite, two CPU devices moving between roles under the elastic
 * policy, the live scheduler and the streaming trainer. A random tiny checkpoint keeps it short
 * (learning is measured by `bench:elastic`, not here); what is checked is what the run's journal
 * says: every step done, nothing lost, nothing trained twice, nothing prefilled again, and a final
 * checkpoint that `gyre eval` scores.
 */
import { execFile, execFileSync, spawn, spawnSync } from "node:child_process"
import { existsSync, mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Layer, Stream } from "effect"
import { describe, expect, it } from "vitest"
import { executionName } from "../../src/protocols/run.ts"
import { SCHEDULER_KIND, SchedulerProtocol } from "../../src/protocols/scheduler.ts"
import { readJournal } from "../../src/runtime/journal.ts"
import { readRecords } from "../../src/scheduling/records.ts"
import { Nats } from "../../src/runtime/nats.ts"
import { startEmbeddedServer } from "../../src/runtime/nats-server.ts"
import { ActorSystem } from "../../src/runtime/system.ts"
import { startNodeProcess } from "../runtime/harness.ts"
import { executionStarts } from "../chaos/helpers.ts"

const gyre = new URL("../../bin/gyre.js", import.meta.url).pathname
const lastJson = (out: string) => JSON.parse(out.trim().split("\n").at(-1)!)

interface SwitchCompleted {
  readonly role: string
  readonly result: { readonly generationsMoved: number; readonly contextsMoved: number; readonly bytesMoved: number; readonly reprefillTokens: number }
}

/** The `SwitchCompleted` tells of `run`'s journal in the store at `storeDir`, one per switch (message id). */
const readSwitches = (storeDir: string, run: string): Promise<Array<SwitchCompleted>> =>
  Effect.runPromise(
    Effect.scoped(
      Effect.gen(function* () {
        const system = yield* ActorSystem
        const byId = new Map<string, SwitchCompleted>()
        yield* readJournal(system, { protocols: { [SCHEDULER_KIND]: SchedulerProtocol } }).pipe(
          Stream.runForEach((e) =>
            Effect.sync(() => {
              if (e.via === "tell" && e.name === "SwitchCompleted") byId.set(e.msgId ?? String(e.seq), e.payload as SwitchCompleted)
            })
          )
        )
        return [...byId.values()]
      })
    ).pipe(Effect.provide(ActorSystem.layer({ run }).pipe(Layer.provideMerge(Nats.layer({ storeDir })))))
  )

describe("gyre train", () => {
  it("runs elastic steps to the end and reports them from the journal; gyre eval scores the result", async () => {
    const dir = mkdtempSync(join(tmpdir(), "gyre-train-"))
    execFileSync("node", [gyre, "engine", "init", "--preset", "tiny", "--seed", "3", "--out", join(dir, "init")], { stdio: "ignore" })
    const args = ["train", "--checkpoint", join(dir, "init"), "--steps", "2", "--devices", "2", "--executions-per-step", "4", "--group-size", "2"]
    const more = ["--slots", "2", "--horizon", "3", "--env", "TOY_TOOL_MS=30,TOY_MAX_TOKENS=16", "--heldout", "heldout-0..heldout-1", "--store", join(dir, "store"), "--json"]
    const out = execFileSync("node", [gyre, ...args, ...more], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], timeout: 240_000 })
    const summary = lastJson(out)
    for (const key of ["run", "policy", "steps", "wall_s", "heldout_before", "heldout_after", "heldout_tasks", "heldout_gain", "heldout_gain_ci95", "switches", "reprefill_tokens", "kv_handoff_bytes", "stale_dropped", "executions_lost", "trained_twice", "store", "warm_start_checkpoint", "checkpoint"]) {
      expect(summary, key).toHaveProperty(key)
    }
    expect(summary.policy).toBe("elastic")
    expect(summary.steps).toBe(2)
    // Both held-out figures average the two tasks of --heldout; the gain is paired over them.
    expect(summary.heldout_tasks).toBe(2)
    expect(summary.heldout_gain).toBeCloseTo(summary.heldout_after - summary.heldout_before, 3)
    expect(summary.heldout_gain_ci95).toEqual(expect.any(Number))
    expect(summary.executions_lost).toBe(0)
    expect(summary.trained_twice).toBe(0)
    expect(summary.switches).toBeGreaterThan(0)
    // The switch figures are the devices' own results in the journal, added up. Zero re-prefill is
    // asserted where the switch is controlled (switch.test.ts); here a context refused by a
    // destination that is itself switching is counted, not hidden (known, open).
    const switches = await readSwitches(join(dir, "store"), summary.run)
    expect(switches.length).toBe(summary.switches)
    expect(switches.some((s) => s.role === "training")).toBe(true)
    expect(summary.kv_handoff_bytes).toBe(switches.reduce((n, s) => n + s.result.bytesMoved, 0))
    // The gateway's own re-prefills (full KV pools) come on top of the switches'.
    expect(summary.reprefill_tokens).toBeGreaterThanOrEqual(switches.reduce((n, s) => n + s.result.reprefillTokens, 0))
    for (const s of switches) {
      const moved = s.result.generationsMoved + s.result.contextsMoved
      // A context moved is bytes moved, and the other way round.
      expect(moved > 0, JSON.stringify(s)).toBe(s.result.bytesMoved > 0)
      // Joining rollout moves nothing and loses nothing.
      if (s.role === "rollout") expect(s.result, JSON.stringify(s)).toMatchObject({ generationsMoved: 0, contextsMoved: 0, bytesMoved: 0, reprefillTokens: 0 })
    }
    expect(summary.store).toBe(join(dir, "store"))
    expect(existsSync(join(summary.checkpoint, "model.safetensors"))).toBe(true)
    // The run's HTML report, in its store, named on the summary.
    expect(summary.report).toBe(join(dir, "store", "report.html"))
    expect(existsSync(summary.report)).toBe(true)
    const evaluation = lastJson(execFileSync("node", [gyre, "eval", "--checkpoint", summary.checkpoint, "--tasks", "heldout-0,heldout-1", "--env", "TOY_STEPS=3", "--json"], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] }))
    expect(Object.keys(evaluation.scores)).toEqual(["heldout-0", "heldout-1"])
    // Every task ran and was scored (a 0 from a harness that could not run says so here).
    expect(evaluation.failures).toEqual({})
    const scores = Object.values(evaluation.scores as Record<string, number>)
    for (const score of scores) expect(score >= 0 && score <= 1, String(score)).toBe(true)
    expect(evaluation.mean_score).toBeCloseTo(scores.reduce((a, b) => a + b, 0) / scores.length, 3)
  }, 300_000)

  it("uses the devices of a second node (gyre node --devices) over one NATS", async () => {
    const dir = mkdtempSync(join(tmpdir(), "gyre-train2-"))
    execFileSync("node", [gyre, "engine", "init", "--preset", "tiny", "--seed", "4", "--out", join(dir, "init")], { stdio: "ignore" })
    await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const server = yield* startEmbeddedServer({})
          const run = "two-nodes"
          const other = startNodeProcess(server.url, ["--name", "other", "--run", run, "--devices", "1"])
          yield* Effect.addFinalizer(() => Effect.sync(() => other.child.kill("SIGKILL")))
          const args = ["train", "--run", run, "--checkpoint", join(dir, "init"), "--steps", "2", "--devices", "1", "--executions-per-step", "4", "--group-size", "2", "--slots", "2"]
          const more = ["--horizon", "3", "--env", "TOY_TOOL_MS=30,TOY_MAX_TOKENS=16", "--heldout", "heldout-0", "--json"]
          const out = yield* Effect.promise(
            () =>
              new Promise<string>((resolve, reject) =>
                execFile("node", [gyre, ...args, ...more], { encoding: "utf8", env: { ...process.env, NATS_URL: server.url }, timeout: 240_000 }, (e, stdout) => (e ? reject(e) : resolve(stdout)))
              )
          )
          const summary = lastJson(out)
          expect(summary.steps).toBe(2)
          expect(summary.executions_lost).toBe(0)
          expect(summary.trained_twice).toBe(0)
          expect(summary.store).toBe(server.url)
          expect(summary.devices).toEqual(expect.arrayContaining(["device/other.cpu0"]))
          expect(summary.devices).toHaveLength(2)
          // The other node's device joined the run as a cell and the policy moved it.
          const devices = yield* Effect.promise(() => other.waitFor("ready"))
          expect(devices.types).toContain("device")
          expect(other.stderr()).not.toMatch(/crashed/)
        })
      )
    )
  }, 300_000)

  it("--resume continues a run whose processes were all killed: every step done once, no finished execution run again, nothing lost", async () => {
    const dir = mkdtempSync(join(tmpdir(), "gyre-resume-"))
    const store = join(dir, "store")
    execFileSync("node", [gyre, "engine", "init", "--preset", "tiny", "--seed", "5", "--out", join(dir, "init")], { stdio: "ignore" })
    const shape = ["--devices", "2", "--heldout", "heldout-0", "--store", store]
    const first = ["train", "--run", "rs", "--checkpoint", join(dir, "init"), "--steps", "3", "--executions-per-step", "4", "--group-size", "2", "--slots", "2", "--horizon", "3", "--env", "TOY_TOOL_MS=30,TOY_MAX_TOKENS=16"]
    // the whole run (node, nats-server, harnesses) in one process group, killed after its first step
    const child = spawn("node", [gyre, ...first, ...shape], { detached: true, stdio: ["ignore", "pipe", "ignore"] })
    const exited = new Promise((resolve) => child.once("exit", resolve))
    await new Promise<void>((resolve, reject) => {
      let out = ""
      const timer = setTimeout(() => reject(new Error(`no step line in ${out}`)), 200_000)
      child.stdout!.on("data", (b: Buffer) => {
        out += b.toString()
        if (/^step +0 /m.test(out)) resolve(void clearTimeout(timer))
      })
    })
    process.kill(-child.pid!, "SIGKILL")
    await exited
    const summary = lastJson(execFileSync("node", [gyre, "train", "--resume", "rs", ...shape, "--json"], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], timeout: 240_000 }))
    expect(summary.steps).toBe(3)
    expect(summary.train_scores).toHaveLength(3)
    expect(summary.executions_lost).toBe(0)
    expect(summary.trained_twice).toBe(0)
    expect(existsSync(join(summary.checkpoint, "model.safetensors"))).toBe(true)
    const journal = await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const system = yield* ActorSystem
          const records = yield* readRecords(system)
          return { records, starts: yield* executionStarts(system) }
        })
      ).pipe(Effect.provide(ActorSystem.layer({ run: "rs" }).pipe(Layer.provideMerge(Nats.layer({ storeDir: store })))))
    )
    const terms = new Set(journal.records.map((r) => r.record.term))
    expect(terms.size).toBe(2)
    const firstTerm = Math.min(...terms)
    // executions that finished before the kill were started once; the others at most twice
    const finishedBefore = journal.records.filter((r) => r.record.term === firstTerm && r.record.event._tag === "ExecutionFinished")
    expect(finishedBefore.length).toBeGreaterThan(0)
    for (const r of finishedBefore) {
      const e = r.record.event as { batch: number; execution: number }
      expect(journal.starts.get(executionName(e.batch, e.execution))).toBe(1)
    }
    for (const n of journal.starts.values()) expect(n).toBeLessThanOrEqual(2)
    const steps = journal.records.filter((r) => r.record.event._tag === "StepDone").map((r) => (r.record.event as { step: number }).step)
    expect(steps).toEqual([0, 1, 2])
    // a finished run, and a run the store does not hold, are refused with one line
    for (const run of ["rs", "nothing"]) {
      const r = spawnSync("node", [gyre, "train", "--resume", run, "--store", store], { encoding: "utf8" })
      expect(r.status, run).toBe(2)
      expect(r.stderr.trim().split("\n"), run).toHaveLength(1)
    }
  }, 600_000)

  it("answers a bad flag with one line and exit code 2", () => {
    for (const args of [["train", "--policy", "fastest"], ["train", "--executions-per-step", "5", "--group-size", "2"], ["eval", "--checkpoint", "/nonexistent"], ["eval", "--checkpoint", "x", "--tasks", "heldout-3..train-1"]]) {
      const r = spawnSync("node", [gyre, ...args], { encoding: "utf8" })
      expect(r.status, args.join(" ")).toBe(2)
      expect(r.stderr.trim().split("\n")).toHaveLength(1)
    }
  })
})
