/**
 * The live scheduler on a real nats-server with scripted device and harness-runner actors:
 * a short elastic run to its end, checked from the journal.
 */
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { startNode } from "../../src/runtime/node.ts"
import { ActorSystem } from "../../src/runtime/system.ts"
import { makeScheduler } from "../../src/actors/scheduler.ts"
import { withSystem } from "../runtime/harness.ts"
import { fakeDevice, fakeRunner, observed } from "./fakes.ts"
import { checkJournal, runConfig, runDone, script, trainTasks } from "./run.ts"

describe("live scheduler", () => {
  it("runs a short elastic run on three cells to its end; the journal replays to the same actions and digests", async () => {
    const run = "sched-run"
    const config = runConfig(run)
    const seen = observed()
    const result = await withSystem(run, Effect.gen(function* () {
      const system = yield* ActorSystem
      const fakes = yield* startNode({ name: "fakes", types: [fakeDevice(script, seen), fakeRunner(script, seen)] })
      yield* fakes.spawn("harness-runner", "r0")
      for (let i = 0; i < 3; i++) yield* fakes.spawn("device", `fakes.${i}`)
      const scheduler = makeScheduler({ config, trainTasks, runners: ["harness-runner/r0"], leaseTtlMs: 1500 })
      const node = yield* startNode({ name: "s1", types: [scheduler.type] })
      yield* Effect.forkScoped(scheduler.standBy(node, system))
      const summary = yield* runDone(system)
      const journal = yield* checkJournal(system, config, seen)
      return { summary, journal }
    }))
    const { summary, journal } = result
    expect(summary.steps).toBe(3)
    expect(summary.executions).toBe(12)
    expect(journal.terms).toEqual([1])
    const actions = journal.records.flatMap((r) => r.actions)
    const switches = actions.filter((a) => a._tag === "SwitchRole")
    expect(switches.length).toBeGreaterThan(0)
    expect(summary.switches).toBe(switches.length)
    expect(seen.switches.length).toBe(switches.length)
    // Every published version reached the rollout cells.
    const published = journal.records.flatMap((r) => (r.event._tag === "WeightsPublished" ? [r.event.version] : []))
    expect(published.slice(0, 2)).toEqual([1, 2])
  })
})
