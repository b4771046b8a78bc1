/**
 * `runOnRunner` against a real harness runner: an execution longer than one ask's wait is
 * asked again with the same message id and runs once; a reply lost in transport (the answer was
 * given to an earlier ask) is recovered from the runner's recorded answer; with no runner left
 * to ask, the outcome it published on the trajectory stream is used.
 */
import { Effect, Stream } from "effect"
import { describe, expect, it } from "vitest"
import { rlLayout } from "../../src/protocols/layout.ts"
import { runOnRunner } from "../../src/scheduling/dispatcher.ts"
import { readStored } from "../../src/runtime/stream-reader.ts"
import { ActorSystem } from "../../src/runtime/system.ts"
import { withSystem } from "../runtime/harness.ts"
import { runnerRef, startRunner } from "../harness/helpers.ts"
import { runConfig } from "./run.ts"
import { HarnessRunner } from "../../src/protocols/topology.ts"

const plan = (n: number) => ({ execution: `b0-x${n}`, n, batch: 0, task: "t", group: 0 })

/** The journal's copies of the runner's asks. */
const askedCopies = Effect.gen(function* () {
  const system = yield* ActorSystem
  const subject = system.layout.asked(runnerRef.address)
  return yield* readStored(system.nats, system.layout.journalStream, { seq: 1 }, subject).pipe(Stream.runCollect)
})

describe("dispatcher: running an execution on its harness runner", () => {
  it("asks again past the wait with the same message id: one run, one answer, one journal copy", async () => {
    const result = await withSystem("reask", Effect.gen(function* () {
      const system = yield* ActorSystem
      const { log } = yield* startRunner({})
      const config = { ...runConfig("reask"), suite: "behaviours", env: { MODE: "nap", NAP_S: "1.5", ARTIFACT: "0.6" } }
      const run = runOnRunner({ system, config, runners: [HarnessRunner.ref("r1")], reaskMs: 300 })
      const started = Date.now()
      const ran = yield* run(plan(3))
      const wallMs = Date.now() - started
      const status = yield* system.ask(runnerRef, "Status", undefined)
      yield* Effect.sleep("300 millis")
      return { ran, wallMs, status, opened: log.opened.length, copies: (yield* askedCopies).filter((m) => m.headers?.get("Gyre-Request") === "RunExecution").length }
    }))
    expect(result.ran.outcome).toMatchObject({ execution: "b0-x3", evaluation: "scored", score: 0.6 })
    expect(result.wallMs).toBeGreaterThan(1500)
    expect(result.wallMs).toBeLessThan(6000)
    expect(result.status).toMatchObject({ finished: 1, running: 0 })
    expect(result.opened).toBe(1)
    expect(result.copies).toBe(1)
  })

  it("gets the recorded answer when the reply to the first ask was lost, without running again", async () => {
    const result = await withSystem("lostreply", Effect.gen(function* () {
      const system = yield* ActorSystem
      const { log } = yield* startRunner({})
      const config = { ...runConfig("lostreply"), suite: "behaviours", env: { MODE: "ok", ARTIFACT: "0.4" } }
      // The first ask, answered to an asker that is gone: the same id, its reply dropped here.
      const request = { task: { suite: "behaviours", task: "t" }, execution: "b0-x5", timeoutMs: null, keepWorkspace: "never" as const, env: config.env }
      yield* system.ask(runnerRef, "RunExecution", request, { msgId: "run-b0-x5", timeoutMs: 20_000 })
      const ran = yield* runOnRunner({ system, config, runners: [HarnessRunner.ref("r1")], reaskMs: 5000 })(plan(5))
      const status = yield* system.ask(runnerRef, "Status", undefined)
      return { ran, status, opened: log.opened.length }
    }))
    expect(result.ran.outcome).toMatchObject({ execution: "b0-x5", evaluation: "scored", score: 0.4 })
    expect(result.status).toMatchObject({ finished: 1 })
    expect(result.opened).toBe(1)
  })

  it("takes the outcome from the trajectory stream when no runner answers", async () => {
    const result = await withSystem("norunner", Effect.gen(function* () {
      const system = yield* ActorSystem
      const names = rlLayout("norunner")
      const { node } = yield* startRunner({})
      const config = { ...runConfig("norunner"), suite: "behaviours", env: { MODE: "ok", ARTIFACT: "0.9" } }
      const first = yield* runOnRunner({ system, config, runners: [HarnessRunner.ref("r1")], reaskMs: 5000 })(plan(7))
      yield* node.stop("harness-runner", "r1")
      // The runner is gone: asking finds no responder, and the stream has the outcome.
      const again = yield* runOnRunner({ system, config, runners: [HarnessRunner.ref("r1")], reaskMs: 5000 })(plan(7))
      const stored = yield* Effect.promise(() => system.nats.jsm.streams.getMessage(names.trajectoryStream, { last_by_subj: names.outcomes("b0-x7") }))
      return { first, again, stored: stored?.json() }
    }))
    expect(result.first.outcome).toMatchObject({ execution: "b0-x7", score: 0.9 })
    expect(result.again.outcome).toEqual(result.first.outcome)
    expect(result.stored).toEqual(result.first.outcome)
  })
})
