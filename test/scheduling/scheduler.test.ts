/**
 * The live scheduler on a real nats-server with scripted device and harness-runner actors:
 * a short elastic run to its end, checked from the journal; a journal that does not replay
 * is refused.
 */
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { ActorSystem } from "../../src/runtime/system.ts"
import type { PolicyRecord } from "../../src/protocols/scheduler.ts"
import { Book } from "../../src/scheduling/book.ts"
import { policyOf } from "../../src/scheduling/driver.ts"
import { readRecords } from "../../src/scheduling/records.ts"
import { replayRecords } from "../../src/scheduling/takeover.ts"
import { withSystem } from "../runtime/harness.ts"
import { observed } from "./fakes.ts"
import { checkJournal, runConfig, runDone, schedulerOptions, standingBy, startFakes, switchesSettled, trainTasks } from "./run.ts"

describe("live scheduler", () => {
  it("runs a short elastic run on three cells to its end; the journal replays to the same actions and digests", async () => {
    const run = "sched-run"
    const config = runConfig(run)
    const seen = observed()
    const result = await withSystem(run, Effect.gen(function* () {
      const system = yield* ActorSystem
      yield* startFakes(seen)
      yield* standingBy(schedulerOptions(config))
      const summary = yield* runDone(system)
      yield* switchesSettled(system)
      const journal = yield* checkJournal(system, config, seen)
      // A standby refuses a journal that does not replay: a changed action, a changed digest, a gap.
      const stored = yield* readRecords(system)
      const policy = yield* policyOf(config)
      const refused = (records: typeof stored) => replayRecords(policy, config, new Book(config, trainTasks), records, 1).pipe(Effect.flip)
      const change = (i: number, f: (r: PolicyRecord) => PolicyRecord) => stored.map((x, j) => (j === i ? { ...x, record: f(x.record) } : x))
      const acting = stored.findIndex((x) => x.record.actions.length > 0)
      const diverged = [
        yield* refused(change(acting, (r) => ({ ...r, actions: [] }))),
        yield* refused(change(5, (r) => ({ ...r, digest: "0".repeat(64) }))),
        yield* refused(stored.filter((_, j) => j !== 3))
      ]
      return { summary, journal, diverged }
    }))
    const { summary, journal, diverged } = result
    expect(diverged.map((e) => [e._tag, e.index])).toEqual([
      ["JournalDiverged", result.journal.records.findIndex((r) => r.actions.length > 0)],
      ["JournalDiverged", 5],
      ["JournalDiverged", 4]
    ])
    expect(summary.stepsDone).toBe(3)
    expect(summary.executionsFinished).toBe(12)
    expect(journal.terms).toEqual([1])
    const actions = journal.records.flatMap((r) => r.actions)
    const switches = actions.filter((a) => a._tag === "SwitchRole")
    expect(switches.length).toBeGreaterThan(0)
    // The run's end counts the switches completed by then; one may still have been under way.
    expect(summary.switches).toBeGreaterThanOrEqual(switches.length - 1)
    expect(summary.switches).toBeLessThanOrEqual(switches.length)
    expect(seen.switches.length).toBe(switches.length)
    // Every published version reached the rollout cells.
    const published = journal.records.flatMap((r) => (r.event._tag === "WeightsPublished" ? [r.event.version] : []))
    expect(published.slice(0, 2)).toEqual([1, 2])
  })
})
